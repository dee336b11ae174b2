//! The booted node's long-running agent (`mprov-agent node`, the image's
//! `mprov-agent` unit): runs the post-boot scripts once (the script-runner
//! reports `ready` only when every one succeeded), then loops:
//!
//! - **Scripts again without a reboot:** every `--poll` (jittered by up to
//!   a tenth either way) it reads its plan and runs it again when the plan's
//!   `run_request` is above the one it last ran (`mash systems run-scripts`
//!   bumps it). A run that failed is not retried on its own: the next
//!   request is. The last request run is kept in the work folder (`/run`,
//!   so a reboot forgets it and runs the scripts again, an agent restart
//!   does not).
//! - **The node keeps its identity:** when a third of its certificate's
//!   validity is left ([`renew_at`]), it renews through
//!   [`mprov_api::enroll::RENEW_PATH`] with a new key, with a doubling wait
//!   between failed attempts (never longer than a tenth of what is left).
//!   The old key and certificate stay until the new pair is written
//!   (staged beside them, then renamed into place; the key 0600). A renewal
//!   that keeps failing is a warning in the journal on each attempt, and,
//!   once half of the renewal window has gone, a `failed` boot event
//!   naming the expiry (once per failing streak).
//! - **Every wait is bounded and ends at SIGTERM** ([`Stop`]); a script
//!   running then is killed with its process group and reported.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mprov_api::boot::BootPhase;
use mprov_api::enroll::{Enrolled, RENEW_PATH, Renewal};
use mprov_api::scripts::ScriptMode;

use crate::enroll::{self, CA_FILE, CERT_FILE, Control, EnrollError, Identity, KEY_FILE};
use crate::scripts::{self, exec};

/// The default wait between two looks at the plan.
pub const DEFAULT_POLL: Duration = Duration::from_secs(60);
/// The file in the work folder naming the last `run_request` run.
const LAST_RUN_FILE: &str = "last-run-request";
/// The first wait after a failed renewal; it doubles.
const RENEW_BACKOFF: Duration = Duration::from_secs(10);

/// The process's stop flag, set by SIGTERM and SIGINT once
/// [`Stop::install`] ran (signal-hook's flag: the handler only stores to an
/// atomic).
#[derive(Debug, Clone)]
pub struct Stop {
    flag: Arc<AtomicBool>,
}

impl Stop {
    /// Installs the handlers.
    pub fn install() -> std::io::Result<Stop> {
        let flag = Arc::new(AtomicBool::new(false));
        for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::flag::register(signal, Arc::clone(&flag))?;
        }
        Ok(Stop { flag })
    }

    /// The flag.
    pub fn flag(&self) -> &AtomicBool {
        &self.flag
    }

    /// Whether a signal came.
    pub fn stopped(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Sleeps `wait`, or less when a signal came; true if one did.
    pub fn sleep(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        while !self.stopped() {
            let now = Instant::now();
            if now >= until {
                return false;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(200)));
        }
        true
    }
}

/// How the node agent runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The root holding `etc/mprov/` and `etc/nologin`.
    pub root: PathBuf,
    /// Where the runs' files go.
    pub work: PathBuf,
    /// Between two looks at the plan.
    pub poll: Duration,
}

/// When to renew a certificate valid from `not_before` to `not_after`
/// (Unix seconds): when a third of its validity is left.
pub fn renew_at(not_before: i64, not_after: i64) -> i64 {
    not_after - (not_after - not_before).max(0) / 3
}

/// When a failing renewal is reported on the timeline: half-way through the
/// renewal window.
pub fn warn_at(not_before: i64, not_after: i64) -> i64 {
    not_after - (not_after - not_before).max(0) / 6
}

/// The wait after the `failures`-th failed renewal in a row: doubling from
/// 10 s, at most a tenth of the `left` validity (seconds) and
/// at least a second.
pub fn renew_backoff(failures: u32, left: i64) -> Duration {
    let doubled = RENEW_BACKOFF.saturating_mul(1u32 << failures.min(16));
    let cap = Duration::from_secs(u64::try_from(left / 10).unwrap_or(0));
    doubled.min(cap).max(Duration::from_secs(1))
}

/// When a certificate's validity really began: its `not_before`, or, since
/// the control service backdates that (an hour, for clocks behind its own),
/// when the node wrote it, if later. Renewal counts from there, so that a
/// short-lived certificate is not renewed at once.
pub fn issued(not_before: i64, written: Option<i64>) -> i64 {
    written.map_or(not_before, |w| w.max(not_before))
}

/// When the certificate file under `root` was written, Unix seconds.
fn written(root: &Path) -> Option<i64> {
    let modified = std::fs::metadata(root.join(enroll::CERT_FILE))
        .and_then(|m| m.modified())
        .ok()?;
    let secs = modified.duration_since(UNIX_EPOCH).ok()?.as_secs();
    i64::try_from(secs).ok()
}

/// A certificate's validity, Unix seconds, from its PEM.
pub fn validity(cert_pem: &str) -> Option<(i64, i64)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// `wait` give or take a tenth.
fn jittered(wait: Duration) -> Duration {
    let mut byte = [0u8; 2];
    let r = getrandom::fill(&mut byte).map_or(0x8000, |()| u16::from_le_bytes(byte));
    // r/65535 in [0, 1]: 0.9 .. 1.1 of the wait.
    wait.mul_f64(0.9 + 0.2 * f64::from(r) / 65535.0)
}

fn log(line: &str) {
    eprintln!("mprov-agent: {line}");
}

/// Renews the node's certificate: a new key and CSR, `POST RENEW_PATH`
/// with the current certificate, then the new pair written in place of the
/// old (staged, then renamed: the old pair is whole until the new one is).
pub fn renew(control: &Control, root: &Path) -> Result<Identity, EnrollError> {
    let (key_pem, csr) = enroll::key_and_csr()?;
    let body = control.post_json(RENEW_PATH, &Renewal { csr }, "renewing the certificate")?;
    let enrolled: Enrolled = serde_json::from_slice(&body).map_err(|err| EnrollError::Io {
        what: "reading the renewal's reply from",
        path: RENEW_PATH.to_owned(),
        err: std::io::Error::other(err),
    })?;
    let identity = Identity {
        key_pem,
        cert_pem: enrolled.certificate,
        ca_pem: enrolled.ca,
    };
    write_renewed(root, &identity)?;
    Ok(identity)
}

/// The new pair beside the old (`.new`, whole and synced), then renamed
/// over it key first, certificate last; the CA certificate likewise.
fn write_renewed(root: &Path, identity: &Identity) -> Result<(), EnrollError> {
    let files = [
        (KEY_FILE, identity.key_pem.as_str(), 0o600),
        (CERT_FILE, identity.cert_pem.as_str(), 0o644),
        (CA_FILE, identity.ca_pem.as_str(), 0o644),
    ];
    let staged = |file: &str| root.join(format!("{file}.new"));
    for (file, contents, mode) in files {
        let path = staged(file);
        let text = format!("{}\n", contents.trim_end());
        mprov_process::write_atomic(&path, text.as_bytes(), mode).map_err(|err| {
            EnrollError::Io {
                what: "writing",
                path: path.display().to_string(),
                err,
            }
        })?;
    }
    for (file, _, _) in files {
        let (from, to) = (staged(file), root.join(file));
        std::fs::rename(&from, &to).map_err(|err| EnrollError::Io {
            what: "renaming into place",
            path: to.display().to_string(),
            err,
        })?;
    }
    Ok(())
}

/// The renewal's state between two turns of the loop.
#[derive(Debug, Default)]
struct Renewing {
    failures: u32,
    next_try: Option<i64>,
    warned: bool,
}

/// Runs the node agent until SIGTERM. Errors before the first run (no
/// identity) are retried; the function returns only when stopped.
pub fn run(settings: &Settings, stop: &Stop) {
    let options = exec::Options::new(
        exec::Target::Local {
            root: settings.root.clone(),
            work: settings.work.clone(),
        },
        true,
    );
    // Kept in the work folder (/run: gone at reboot), so an agent restarted
    // by systemd does not run the same request again.
    let last_file = settings.work.join(LAST_RUN_FILE);
    let mut last_run: Option<i64> = std::fs::read_to_string(&last_file)
        .ok()
        .and_then(|text| text.trim().parse().ok());
    let mut renewing = Renewing::default();
    let mut failures = 0u32;
    let mut started = false;
    while !stop.stopped() {
        let session = enroll::read_identity(&settings.root)
            .and_then(|(identity, url)| Ok((Control::new(&url, &identity)?, identity)));
        let (control, identity) = match session {
            Ok(session) => session,
            Err(err) => {
                log(&format!(
                    "reading the identity: {}",
                    mprov_process::chain(&err)
                ));
                failures += 1;
                started_once(&mut started);
                stop.sleep(renew_backoff(failures, 600));
                continue;
            }
        };
        let mut wake = now() + i64::try_from(jittered(settings.poll).as_secs()).unwrap_or(60);
        let valid =
            validity(&identity.cert_pem).map(|(nb, na)| (issued(nb, written(&settings.root)), na));
        if let Some((nb, na)) = valid {
            let t = now();
            if t >= renew_at(nb, na) && renewing.next_try.is_none_or(|next| t >= next) {
                match renew(&control, &settings.root) {
                    Ok(new) => {
                        log("renewed the node's certificate");
                        renewing = Renewing::default();
                        if let Some((_, new_after)) = validity(&new.cert_pem) {
                            log(&format!("the new certificate is valid until {new_after}"));
                        }
                        // Start the next turn with the new identity.
                        continue;
                    }
                    Err(err) => {
                        let chain = mprov_process::chain(&err);
                        renewing.failures += 1;
                        let backoff = renew_backoff(renewing.failures, na - t);
                        renewing.next_try =
                            Some(t + i64::try_from(backoff.as_secs()).unwrap_or(60));
                        log(&format!(
                            "warning: renewing the certificate (attempt {}): {chain}; it expires at {na} (Unix time), next try in {} s",
                            renewing.failures,
                            backoff.as_secs()
                        ));
                        if t >= warn_at(nb, na) && !renewing.warned {
                            let detail = format!(
                                "certificate renewal keeps failing ({} attempts): {chain}; the certificate expires at {na} (Unix time)",
                                renewing.failures
                            );
                            renewing.warned = control.report(BootPhase::Failed, &detail).is_ok();
                        }
                    }
                }
            }
            if let Some(next) = renewing.next_try {
                wake = wake.min(next);
            } else {
                wake = wake.min(renew_at(nb, na).max(t + 1));
            }
        }
        match scripts::fetch_plan(&control, ScriptMode::PostBoot, None) {
            Ok(plan) if last_run.is_none_or(|last| plan.run_request > last) => {
                failures = 0;
                match scripts::run(&control, &plan, &options, stop.flag(), &|l| log(l)) {
                    Ok(report) => {
                        log(&format!(
                            "run {}: {:?}: {}",
                            plan.run_request, report.outcome, report.detail
                        ));
                        if stop.stopped() {
                            // Cut short by SIGTERM: the request is not done,
                            // so the next start runs it again.
                            break;
                        }
                        last_run = Some(plan.run_request);
                        let written = std::fs::create_dir_all(&settings.work).and_then(|()| {
                            mprov_process::write_atomic(
                                &last_file,
                                format!("{}\n", plan.run_request).as_bytes(),
                                0o600,
                            )
                        });
                        if let Err(err) = written {
                            log(&format!("warning: writing {}: {err}", last_file.display()));
                        }
                    }
                    Err(err) => {
                        // Not reported (or not fetched): try the same request
                        // again after a wait.
                        log(&format!(
                            "running the scripts: {}",
                            mprov_process::chain(&err)
                        ));
                        failures += 1;
                        wake = wake.min(now() + backoff_secs(failures, settings.poll));
                    }
                }
            }
            Ok(_) => failures = 0,
            Err(err) => {
                log(&mprov_process::chain(&err).to_string());
                failures += 1;
                wake = wake.min(now() + backoff_secs(failures, settings.poll));
            }
        }
        started_once(&mut started);
        let wait = u64::try_from(wake - now()).unwrap_or(0).max(1);
        if stop.sleep(Duration::from_secs(wait)) {
            break;
        }
    }
    log("stopped");
}

/// Tells systemd (under `Type=notify`) that the first turn is over: the
/// post-boot scripts ran, or could not be run, so that units ordered after
/// the agent (and `multi-user.target`) start only then. Without systemd,
/// nothing happens.
fn started_once(started: &mut bool) {
    if !*started {
        *started = true;
        if let Err(err) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
            log(&format!("warning: telling systemd the agent is up: {err}"));
        }
    }
}

fn backoff_secs(failures: u32, poll: Duration) -> i64 {
    let wait = Duration::from_secs(2)
        .saturating_mul(1u32 << failures.min(16))
        .min(poll);
    i64::try_from(wait.as_secs()).unwrap_or(60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_starts_at_a_third_left() {
        assert_eq!(renew_at(0, 300), 200);
        assert_eq!(warn_at(0, 300), 250);
        assert_eq!(renew_at(1000, 1000 + 30 * 86400), 1000 + 20 * 86400);
        // Backdated an hour, written at 5000, valid 300 s from then: the
        // renewal counts from when it was written.
        let nb = issued(5000 - 3600, Some(5000));
        assert_eq!(renew_at(nb, 5300), 5200);
        assert_eq!(issued(5000, None), 5000);
        assert_eq!(issued(5000, Some(10)), 5000);
    }

    #[test]
    fn renewal_backoff_doubles_within_what_is_left() {
        assert_eq!(renew_backoff(1, 86400), Duration::from_secs(20));
        assert_eq!(renew_backoff(2, 86400), Duration::from_secs(40));
        assert_eq!(renew_backoff(30, 86400), Duration::from_secs(8640));
        assert_eq!(renew_backoff(3, 100), Duration::from_secs(10));
        assert_eq!(renew_backoff(3, -5), Duration::from_secs(1));
    }

    #[test]
    fn a_certificate_s_validity_is_read() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["n01".to_owned()]).expect("params");
        params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        params.not_after = rcgen::date_time_ymd(2026, 1, 31);
        let cert = params.self_signed(&key).expect("cert");
        let (nb, na) = validity(&cert.pem()).expect("parses");
        assert_eq!(na - nb, 30 * 86400);
        assert_eq!(validity("junk"), None);
    }

    #[test]
    fn a_renewed_pair_replaces_the_old_whole() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let old = Identity {
            key_pem: "OLDKEY".into(),
            cert_pem: "OLDCERT".into(),
            ca_pem: "CA".into(),
        };
        enroll::write_identity(dir.path(), &old, "https://ctl").expect("writes");
        let new = Identity {
            key_pem: "NEWKEY".into(),
            cert_pem: "NEWCERT".into(),
            ca_pem: "CA".into(),
        };
        write_renewed(dir.path(), &new).expect("renews");
        let (back, url) = enroll::read_identity(dir.path()).expect("reads");
        assert_eq!(back.key_pem, "NEWKEY\n");
        assert_eq!(back.cert_pem, "NEWCERT\n");
        assert_eq!(url, "https://ctl");
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let left: Vec<_> = std::fs::read_dir(dir.path().join("etc/mprov"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left.len(), 4, "no staged files left: {left:?}");
    }
}
