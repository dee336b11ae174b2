//! Time stamps in the one form the database stores and the API shows: RFC
//! 3339 UTC to the second (`2026-01-31T12:00:00Z`), so text order is time
//! order on every engine.

/// A time in the stored form: RFC 3339 UTC to the second, so text order is time order.
pub fn format_ts(ts: jiff::Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Now, in the stored form.
pub fn now() -> String {
    format_ts(jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_form_is_utc_to_the_second() {
        let ts: jiff::Timestamp = "2026-01-31T12:34:56.789+02:00".parse().unwrap();
        assert_eq!(format_ts(ts), "2026-01-31T10:34:56Z");
    }

    #[test]
    fn now_is_in_the_stored_form() {
        let n = now();
        assert_eq!(n.len(), "2026-01-31T10:34:56Z".len());
        assert!(n.ends_with('Z'));
        assert_eq!(format_ts(n.parse().unwrap()), n);
    }
}
