//! Progress bars for the long steps (packing, unpacking, applying layers).
//!
//! indicatif's stderr target draws nothing when stderr is not a terminal, so
//! logs and CI output stay clean without a flag; `enabled = false` (the CLI's
//! `--quiet`) hides them on a terminal too.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar counting `total` bytes, labelled `label`.
pub(crate) fn bytes_bar(total: u64, label: &str, enabled: bool) -> ProgressBar {
    let target = if enabled {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    // The template is a constant, so this cannot fail at run time; fall back
    // to the default style rather than panic if it ever did.
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:>10} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(label.to_string());
    bar
}
