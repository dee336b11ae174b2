//! The real `mprov-control serve`'s log, written to a file: no colour
//! escapes, each line stamped and tagged `[E]`, `[W]`, `[I]` or `[D]` with
//! its module; and when `JOURNAL_STREAM` names that file (as systemd sets
//! it for journald's stream), each line starts with its syslog priority
//! instead of a stamp, so `journalctl -p warning` keeps warnings and errors
//! only. journald itself does not run in the test container: the
//! priorities are read from the stream.

use std::os::unix::fs::MetadataExt;

use crate::common::on_sqlite;
use crate::process::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_has_no_colour_and_journald_priorities_when_asked() {
    on_sqlite(|dir, _| {
        let url = format!("sqlite://{}/var/db/mprov.sqlite3?mode=rwc", dir.display());
        let log = Server::start(dir, &url, 1, &[]).stop();
        check(&log, false);
        // The file serve-2.log is created again (truncated, the same inode)
        // as the service's standard error.
        let file = dir.join("serve-2.log");
        std::fs::File::create(&file).unwrap();
        let meta = std::fs::metadata(&file).unwrap();
        let stream = format!("{}:{}", meta.dev(), meta.ino());
        let log = Server::start(dir, &url, 2, &[("JOURNAL_STREAM", &stream)]).stop();
        check(&log, true);
    })
    .await;
}

/// Every line: `<N>` and a tag of that priority (journald), or a stamp and
/// a tag; then `module: `. No escape byte anywhere.
fn check(log: &str, journald: bool) {
    assert!(!log.contains('\x1b'), "colour in a file: {log:?}");
    assert!(log.lines().count() >= 2, "{log}");
    for line in log.lines() {
        let rest = if journald {
            let (priority, rest) = line
                .strip_prefix('<')
                .and_then(|l| l.split_once('>'))
                .unwrap_or_else(|| panic!("no priority: {line:?}"));
            let expected = match rest.get(..3) {
                Some("[E]") => "3",
                Some("[W]") => "4",
                Some("[I]") => "6",
                Some("[D]") => "7",
                _ => panic!("no tag after the priority: {line:?}"),
            };
            assert_eq!(priority, expected, "{line:?}");
            rest
        } else {
            assert!(!line.starts_with('<'), "a priority off journald: {line:?}");
            let (stamp, rest) = line.split_once(' ').unwrap();
            assert!(stamp.len() >= 23 && stamp.as_bytes()[4] == b'-', "{line:?}");
            rest
        };
        let tag = &rest[..3];
        assert!(["[E]", "[W]", "[I]", "[D]"].contains(&tag), "{line:?}");
        assert!(rest[4..].contains(": "), "no module: {line:?}");
    }
}
