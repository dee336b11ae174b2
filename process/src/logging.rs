//! Logging: one set-up for every service (the control service and the job
//! server), on standard error.
//!
//! Each line is `[stamp ][E|W|I|D] module: message`: the level as the
//! seed's one-letter tag, the module the event came from (its target,
//! without the `mprov_` prefix), and a timestamp in the install's time zone
//! (UTC until [`set_time_zone`] is called). Stamps are optional
//! ([`init_with`]); by default a line is stamped unless standard error is
//! journald's, which stamps lines itself.
//!
//! Standard error is journald's when `JOURNAL_STREAM` (set by systemd)
//! names its device and inode. Then every line starts with its syslog
//! priority, `<3>` error, `<4>` warning, `<6>` info, `<7>` debug: that is
//! how journald's stream protocol takes a priority per line (sd-daemon(3)),
//! so `journalctl -p warning` shows warnings and errors only. Colour
//! escapes are written only to a terminal (and never with `NO_COLOR`).

use std::fmt;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The log timestamps' time zone, set once the configuration is read.
static TIME_ZONE: OnceLock<jiff::tz::TimeZone> = OnceLock::new();

/// [`init_with`] with stamps unless journald's stream takes the lines.
pub fn init(filter: &str) {
    init_with(filter, None);
}

/// Logs to standard error, filtered by `filter` (`info`, `warn`,
/// `mprov_dhcp=debug,info`...), with timestamps if `timestamps` says so
/// (`None`: unless the output is journald's). A filter that does not parse
/// is reported and `info` is used: a typo must not silence the log.
pub fn init_with(wanted: &str, timestamps: Option<bool>) {
    let (filter, bad) = match tracing_subscriber::EnvFilter::try_new(wanted) {
        Ok(f) => (f, None),
        Err(e) => (tracing_subscriber::EnvFilter::new("info"), Some(e)),
    };
    let journald = stderr_is_journald();
    let format = Format {
        journald,
        timestamps: timestamps.unwrap_or(!journald),
    };
    let ansi = !journald
        && std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .event_format(format)
        .with_writer(std::io::stderr)
        .init();
    if let Some(e) = bad {
        tracing::warn!("the log filter {wanted:?} is not valid ({e}); logging at info");
    }
}

/// Sets the time zone of the timestamps from now on; the first call wins.
pub fn set_time_zone(tz: jiff::tz::TimeZone) {
    let _ = TIME_ZONE.set(tz);
}

/// Whether standard error is journald's stream: `JOURNAL_STREAM` names it.
pub fn stderr_is_journald() -> bool {
    stderr_is_journal(std::env::var("JOURNAL_STREAM").ok().as_deref())
}

/// Whether standard error is the stream `journal_stream` names
/// (`JOURNAL_STREAM`'s `device:inode`, in decimal).
fn stderr_is_journal(journal_stream: Option<&str>) -> bool {
    let Some((dev, ino)) = journal_stream.and_then(|s| s.trim().split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    std::fs::File::from(fd)
        .metadata()
        .is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// The syslog priority journald takes from a line's `<N>` prefix.
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// The seed's one-letter tag, and its colour on a terminal.
fn tag(level: Level) -> (&'static str, &'static str) {
    match level {
        Level::ERROR => ("[E]", "\x1b[31m"),
        Level::WARN => ("[W]", "\x1b[33m"),
        Level::INFO => ("[I]", "\x1b[32m"),
        Level::DEBUG | Level::TRACE => ("[D]", "\x1b[34m"),
    }
}

/// An event's module: its target without our crates' `mprov_` prefix
/// (`mprov_dhcp::server` → `dhcp::server`).
fn module(target: &str) -> &str {
    target.strip_prefix("mprov_").unwrap_or(target)
}

/// The line format: see the module comment.
struct Format {
    journald: bool,
    timestamps: bool,
}

impl<S, N> FormatEvent<S, N> for Format
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let level = *meta.level();
        // The whole event first, so that with journald every line of a
        // message that spans several gets the priority prefix.
        let mut text = String::new();
        let mut w = Writer::new(&mut text);
        if self.timestamps {
            Timer.format_time(&mut w)?;
            w.write_char(' ')?;
        }
        let (tag, colour) = tag(level);
        if writer.has_ansi_escapes() {
            write!(w, "{colour}{tag}\x1b[0m ")?;
        } else {
            write!(w, "{tag} ")?;
        }
        write!(w, "{}: ", module(meta.target()))?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                write!(w, "{}", span.name())?;
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    write!(w, "{{{fields}}}")?;
                }
                w.write_str(": ")?;
            }
        }
        ctx.field_format().format_fields(w.by_ref(), event)?;
        for line in text.split('\n') {
            if self.journald {
                write!(writer, "<{}>", priority(level))?;
            }
            writer.write_str(line)?;
            writer.write_char('\n')?;
        }
        Ok(())
    }
}

struct Timer;

impl FormatTime for Timer {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let tz = TIME_ZONE.get().cloned().unwrap_or(jiff::tz::TimeZone::UTC);
        let now = jiff::Timestamp::now().to_zoned_datetime(tz);
        write!(w, "{}", now.strftime("%Y-%m-%dT%H:%M:%S%.3f%:z"))
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    use tracing::Level;

    #[test]
    fn tags_and_priorities_follow_the_level() {
        let check = |level, tag, priority| {
            assert_eq!(super::tag(level).0, tag);
            assert_eq!(super::priority(level), priority);
        };
        check(Level::ERROR, "[E]", 3);
        check(Level::WARN, "[W]", 4);
        check(Level::INFO, "[I]", 6);
        check(Level::DEBUG, "[D]", 7);
        assert_eq!(super::module("mprov_dhcp::server"), "dhcp::server");
        assert_eq!(super::module("hyper::proto"), "hyper::proto");
    }

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(!super::stderr_is_journal(None));
        assert!(!super::stderr_is_journal(Some("garbage")));
        assert!(!super::stderr_is_journal(Some("1:2")));
        let fd = std::io::stderr().as_fd().try_clone_to_owned().unwrap();
        let m = std::fs::File::from(fd).metadata().unwrap();
        let ours = format!("{}:{}", m.dev(), m.ino());
        assert!(super::stderr_is_journal(Some(&ours)));
        let other = format!("{}:{}", m.dev(), m.ino() + 1);
        assert!(!super::stderr_is_journal(Some(&other)));
    }
}
