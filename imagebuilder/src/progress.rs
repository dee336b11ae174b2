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

/// Where a build reports its steps as lines of text, for a caller without a
/// terminal (the job server copies them into the job's output). Cheap to
/// clone; called from the building thread.
#[derive(Clone)]
pub struct Steps(std::sync::Arc<dyn Fn(&str) + Send + Sync>);

impl Steps {
    /// Reports each line to `sink`.
    pub fn new(sink: impl Fn(&str) + Send + Sync + 'static) -> Steps {
        Steps(std::sync::Arc::new(sink))
    }

    /// Reports one line.
    pub fn line(&self, line: &str) {
        (self.0)(line);
    }
}

impl std::fmt::Debug for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Steps(..)")
    }
}

/// Reports every tenth of `total` bytes done as a line, when there is a sink.
#[derive(Debug)]
pub(crate) struct Tenths<'a> {
    steps: Option<&'a Steps>,
    label: &'static str,
    total: u64,
    done: u64,
    reported: u64,
}

impl<'a> Tenths<'a> {
    pub(crate) fn new(steps: Option<&'a Steps>, label: &'static str, total: u64) -> Self {
        Tenths {
            steps,
            label,
            total,
            done: 0,
            reported: 0,
        }
    }

    /// Counts `n` more bytes done.
    pub(crate) fn add(&mut self, n: u64) {
        self.done += n;
        let Some(steps) = self.steps else { return };
        if self.total == 0 {
            return;
        }
        let tenth = (self.done.min(self.total) * 10 / self.total).min(10);
        if tenth > self.reported {
            self.reported = tenth;
            steps.line(&format!(
                "{}: {}% ({} of {} MiB)",
                self.label,
                tenth * 10,
                self.done >> 20,
                self.total >> 20
            ));
        }
    }
}
