//! Logging: one set-up for every service, timestamps in the install's time
//! zone (UTC until [`set_time_zone`] is called).

use std::sync::OnceLock;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

/// The log timestamps' time zone, set once the configuration is read.
static TIME_ZONE: OnceLock<jiff::tz::TimeZone> = OnceLock::new();

/// Logs to standard error (systemd's journal keeps it), filtered by `filter`
/// (`info`, `mprov_dhcp=debug,info`...). A filter that does not parse is
/// reported and `info` is used: a typo must not silence the log.
pub fn init(wanted: &str) {
    let (filter, bad) = match tracing_subscriber::EnvFilter::try_new(wanted) {
        Ok(f) => (f, None),
        Err(e) => (tracing_subscriber::EnvFilter::new("info"), Some(e)),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_timer(Timer)
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

struct Timer;

impl FormatTime for Timer {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        let tz = TIME_ZONE.get().cloned().unwrap_or(jiff::tz::TimeZone::UTC);
        let now = jiff::Timestamp::now().to_zoned_datetime(tz);
        write!(w, "{}", now.strftime("%Y-%m-%dT%H:%M:%S%.3f%:z"))
    }
}
