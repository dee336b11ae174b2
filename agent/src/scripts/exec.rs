//! Carrying a plan out: the checks that refuse it before anything runs, then
//! the scripts, layer by layer.
//!
//! - **Before anything runs:** the plan's order ([`super::plan`]), every
//!   script's content present and matching the plan's sha256, every slug a
//!   plain file name. Any failure refuses the whole run: no script starts,
//!   no file is written.
//! - **Each layer** runs its scripts at the same time, at most
//!   [`Options::parallel`] at once (the node's CPUs), each in a process
//!   group of its own. A failed or timed-out script lets the rest of its
//!   layer finish and stops the layers after it (their scripts are
//!   `not_run`).
//! - **A script gets** its params (the plan's JSON) on standard input and in
//!   the file named by `MPROV_PARAMS`, and `MPROV_HOST`, `MPROV_IMAGE`,
//!   `MPROV_GROUPS` (comma-separated) and `MPROV_SCRIPT` (its slug), in an
//!   otherwise clean environment (`PATH`, `HOME`, `LC_ALL`). A `#!` line
//!   picks its interpreter, else `/bin/sh`.
//! - **Its timeout** (the plan's, else
//!   [`mprov_api::scripts::DEFAULT_TIMEOUT_SECONDS`]): at it, the whole
//!   process group gets SIGTERM, then SIGKILL after [`Options::grace`], and
//!   the script is `timed_out`.
//! - **Its output:** standard output and error through one pipe, so
//!   interleaved as written; only the last
//!   [`mprov_api::scripts::MAX_OUTPUT_TAIL`] bytes are kept.
//! - **Post-boot** ([`Options::nologin`]): `/etc/nologin` under the root
//!   exists while the scripts run and is removed afterwards on every path
//!   ([`Nologin`] removes it on drop), unless it was there before.
//! - **Image-gen** ([`Target::Image`]): each script runs `chroot`ed into the
//!   image's root, with `/proc`, `/sys` and `/dev` mounted where the root has
//!   those folders, as the image builder has always run recipe scripts.

use std::collections::BTreeMap;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mprov_api::scripts::{
    DEFAULT_TIMEOUT_SECONDS, MAX_OUTPUT_TAIL, PlannedScript, RunOutcome, RunReport, ScriptMode,
    ScriptPlan, ScriptResult, ScriptStatus,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use sha2::{Digest as _, Sha256};

use super::plan::{self, Layers};

/// The `PATH` scripts get.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How often a running script is looked at (exit, timeout, cancel).
const TICK: Duration = Duration::from_millis(20);
/// How long a script's output may stay open after it exited (a process it
/// left behind holding it) before the tail is taken as it is.
const DRAIN: Duration = Duration::from_secs(1);

/// Where the scripts run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// On this system. `root` is where `etc/nologin` goes (`/`; a test's
    /// folder in tests) and `work` the folder the scripts and their params
    /// files are written to for the run (made private, emptied after).
    Local {
        /// The root holding `etc/`.
        root: PathBuf,
        /// Where the run's files go.
        work: PathBuf,
    },
    /// `chroot`ed into an image's root; the run's files go to its `/tmp`.
    Image(PathBuf),
}

/// How to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where.
    pub target: Target,
    /// Post-boot: hold `/etc/nologin` while scripts run.
    pub nologin: bool,
    /// The most scripts at once (at least 1).
    pub parallel: usize,
    /// Between SIGTERM and SIGKILL at a timeout.
    pub grace: Duration,
    /// More environment for every script (the image builder's
    /// `MPROV_IMAGE_SLUG` and `MPROV_IMAGE_VERSION`).
    pub env: Vec<(String, String)>,
}

impl Options {
    /// The node's CPUs as [`Options::parallel`], a 5 s grace.
    pub fn new(target: Target, nologin: bool) -> Options {
        Options {
            target,
            nologin,
            parallel: std::thread::available_parallelism().map_or(1, usize::from),
            grace: Duration::from_secs(5),
            env: Vec::new(),
        }
    }
}

/// What happened to a script, as it happens (for the log).
#[derive(Debug)]
pub enum Event<'a> {
    /// A layer starts.
    Layer {
        /// Its number, from 0.
        n: usize,
        /// Its scripts.
        slugs: Vec<&'a str>,
    },
    /// A script ended.
    Ended(&'a ScriptResult),
    /// A warning of the plan.
    Warning(&'a str),
}

/// Why the run could not be carried out at all (not a script's failure).
#[derive(Debug, thiserror::Error)]
#[error("{what} {}", path.display())]
pub struct ExecError {
    what: &'static str,
    path: PathBuf,
    #[source]
    err: io::Error,
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ExecError + use<> {
    let path = path.to_path_buf();
    move |err| ExecError { what, path, err }
}

/// The checks before anything runs: the order, the contents against their
/// checksums, the slugs as file names. The layers, or what is wrong.
pub fn check<'a>(
    plan: &'a ScriptPlan,
    contents: &BTreeMap<String, Vec<u8>>,
) -> Result<Layers<'a>, Vec<String>> {
    let layers = plan::plan(plan).map_err(|r| vec![r.to_string()])?;
    let mut problems = Vec::new();
    for script in layers.scripts() {
        if !is_file_name(&script.slug) {
            problems.push(format!(
                "script {:?}: its slug is not a plain name",
                script.slug
            ));
            continue;
        }
        match contents.get(&script.slug) {
            None => problems.push(format!("script {}: no content", script.slug)),
            Some(bytes) => {
                let got = hex::encode(Sha256::digest(bytes));
                if !got.eq_ignore_ascii_case(script.sha256.trim()) {
                    problems.push(format!(
                        "script {}: its content has sha256 {got}, the plan lists {}",
                        script.slug, script.sha256
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(layers)
    } else {
        Err(problems)
    }
}

/// A slug usable as a file name and a URL path segment: ASCII letters,
/// digits, `.`, `_` and `-`, not `.` or `..`.
pub fn is_file_name(slug: &str) -> bool {
    !slug.is_empty()
        && slug != "."
        && slug != ".."
        && slug
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The image a report names: an image-gen run's; a post-boot report names
/// none (the node's certificate says whose it is, and the control service
/// refuses one that names an image).
fn report_image(plan: &ScriptPlan) -> Option<String> {
    match plan.mode {
        ScriptMode::ImageGen => plan.image.clone(),
        ScriptMode::PostBoot => None,
    }
}

/// A report for a plan that did not run: every script `not_run`.
pub fn refused(plan: &ScriptPlan, detail: String) -> RunReport {
    RunReport {
        mode: plan.mode,
        image: report_image(plan),
        run_request: plan.run_request,
        outcome: RunOutcome::Refused,
        detail,
        results: plan.scripts.iter().map(|s| not_run(&s.slug)).collect(),
    }
}

fn not_run(slug: &str) -> ScriptResult {
    ScriptResult {
        slug: slug.to_owned(),
        status: ScriptStatus::NotRun,
        exit_code: None,
        duration_ms: 0,
        output_tail: String::new(),
    }
}

/// Checks and runs `plan` with the scripts' `contents` (by slug). A refused
/// or failed run is a report, not an error; an error means the run's own
/// files or `/etc/nologin` could not be written (nothing ran then, or the
/// scripts already started finish first).
pub fn execute(
    plan: &ScriptPlan,
    contents: &BTreeMap<String, Vec<u8>>,
    options: &Options,
    cancel: &AtomicBool,
    observe: &(dyn Fn(&Event<'_>) + Sync),
) -> Result<RunReport, ExecError> {
    let layers = match check(plan, contents) {
        Ok(layers) => layers,
        Err(problems) => {
            return Ok(refused(
                plan,
                format!("refused before anything ran: {}", problems.join("; ")),
            ));
        }
    };
    for warning in &layers.warnings {
        observe(&Event::Warning(warning));
    }
    let params = serde_json::to_vec(&plan.params).unwrap_or_default();
    let (work, inside, mounts) = match &options.target {
        Target::Local { work, .. } => {
            let dir = private_dir(work)?;
            let inside = dir.path().to_path_buf();
            (dir, inside, None)
        }
        Target::Image(root) => {
            let tmp = root.join("tmp");
            if !tmp.is_dir() {
                std::fs::create_dir_all(&tmp).map_err(io_err("creating", &tmp))?;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))
                    .map_err(io_err("setting the mode of", &tmp))?;
            }
            let dir = private_dir(&tmp)?;
            let name = dir.path().file_name().unwrap_or_default().to_owned();
            let mounts = Mounts::new(root)?;
            (dir, Path::new("/tmp").join(name), Some(mounts))
        }
    };
    let _nologin = match (&options.target, options.nologin) {
        (Target::Local { root, .. }, true) => Some(Nologin::hold(root)?),
        (Target::Image(root), true) => Some(Nologin::hold(root)?),
        (_, false) => None,
    };
    let context = Context {
        plan,
        options,
        params: &params,
        work: work.path(),
        inside: &inside,
        cancel,
    };
    let mut results = Vec::new();
    let mut stopped = false;
    for (n, layer) in layers.layers.iter().enumerate() {
        if stopped || cancel.load(Ordering::SeqCst) {
            results.extend(layer.iter().map(|s| not_run(&s.slug)));
            stopped = true;
            continue;
        }
        observe(&Event::Layer {
            n,
            slugs: layer.iter().map(|s| s.slug.as_str()).collect(),
        });
        let ran = run_layer(layer, contents, &context, observe);
        stopped = ran.iter().any(|r| r.status != ScriptStatus::Success);
        results.extend(ran);
    }
    drop(mounts);
    let bad: Vec<String> = results
        .iter()
        .filter_map(|r| match r.status {
            ScriptStatus::Failed => Some(match r.exit_code {
                Some(code) => format!("{} failed (exit {code})", r.slug),
                None => format!("{} failed (killed by a signal)", r.slug),
            }),
            ScriptStatus::TimedOut => Some(format!("{} timed out", r.slug)),
            ScriptStatus::NotRun | ScriptStatus::Success => None,
        })
        .collect();
    let mut detail = if bad.is_empty() && !stopped {
        format!("{} scripts succeeded", results.len())
    } else if bad.is_empty() {
        "cancelled".to_owned()
    } else {
        let later = results
            .iter()
            .filter(|r| r.status == ScriptStatus::NotRun)
            .count();
        format!("{}; {later} later scripts not run", bad.join(", "))
    };
    for warning in &layers.warnings {
        detail.push_str(&format!("; warning: {warning}"));
    }
    Ok(RunReport {
        mode: plan.mode,
        image: report_image(plan),
        run_request: plan.run_request,
        outcome: if stopped {
            RunOutcome::Failed
        } else {
            RunOutcome::Success
        },
        detail,
        results,
    })
}

/// A fresh private folder (0700) for the run's files under `base`, removed
/// on drop.
fn private_dir(base: &Path) -> Result<tempfile::TempDir, ExecError> {
    std::fs::create_dir_all(base).map_err(io_err("creating", base))?;
    let dir = tempfile::Builder::new()
        .prefix(".mprov-scripts-")
        .tempdir_in(base)
        .map_err(io_err("making a folder in", base))?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
        .map_err(io_err("setting the mode of", dir.path()))?;
    Ok(dir)
}

/// `etc/nologin` under a root while scripts run: made by [`Nologin::hold`],
/// removed on drop, so on every way out of the run. One that was there
/// before (an admin's) is left alone.
#[derive(Debug)]
pub struct Nologin {
    path: Option<PathBuf>,
}

impl Nologin {
    /// Makes `<root>/etc/nologin`, unless it exists.
    pub fn hold(root: &Path) -> Result<Nologin, ExecError> {
        let path = root.join("etc/nologin");
        if path.exists() {
            return Ok(Nologin { path: None });
        }
        std::fs::write(&path, "mProv is running this node's post-boot scripts.\n")
            .map_err(io_err("writing", &path))?;
        Ok(Nologin { path: Some(path) })
    }
}

impl Drop for Nologin {
    fn drop(&mut self) {
        if let Some(path) = &self.path
            && let Err(err) = std::fs::remove_file(path)
            && err.kind() != io::ErrorKind::NotFound
        {
            eprintln!("mprov-agent: warning: removing {}: {err}", path.display());
        }
    }
}

/// What every script of a run shares.
struct Context<'a> {
    plan: &'a ScriptPlan,
    options: &'a Options,
    params: &'a [u8],
    /// The run's folder, as this process sees it.
    work: &'a Path,
    /// The same folder as the scripts see it (inside the chroot).
    inside: &'a Path,
    cancel: &'a AtomicBool,
}

/// Runs one layer, at most `parallel` at once; its results by slug.
fn run_layer(
    layer: &[&PlannedScript],
    contents: &BTreeMap<String, Vec<u8>>,
    context: &Context<'_>,
    observe: &(dyn Fn(&Event<'_>) + Sync),
) -> Vec<ScriptResult> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<ScriptResult>>> = Mutex::new(vec![None; layer.len()]);
    let workers = context.options.parallel.clamp(1, layer.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(script) = layer.get(i) else { break };
                    let content = contents.get(&script.slug).map_or(&[][..], Vec::as_slice);
                    let result = run_one(script, content, context);
                    observe(&Event::Ended(&result));
                    if let Ok(mut results) = results.lock() {
                        results[i] = Some(result);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .zip(layer)
        .map(|(r, s)| r.unwrap_or_else(|| not_run(&s.slug)))
        .collect()
}

/// Runs one script to its end or its timeout.
fn run_one(script: &PlannedScript, content: &[u8], context: &Context<'_>) -> ScriptResult {
    let started = Instant::now();
    let failed = |why: String| ScriptResult {
        slug: script.slug.clone(),
        status: ScriptStatus::Failed,
        exit_code: None,
        duration_ms: started.elapsed().as_millis().try_into().unwrap_or(u64::MAX),
        output_tail: why,
    };
    let file = context.work.join(&script.slug);
    let params_name = format!("{}.params.json", script.slug);
    let params = context.work.join(&params_name);
    if let Err(err) =
        write_mode(&file, content, 0o700).and_then(|()| write_mode(&params, context.params, 0o600))
    {
        return failed(format!("mprov-agent: writing the script's files: {err}"));
    }
    let mut cmd = match &context.options.target {
        Target::Local { .. } => Command::new(if content.starts_with(b"#!") {
            file.clone()
        } else {
            PathBuf::from("/bin/sh")
        }),
        Target::Image(root) => {
            let mut cmd = Command::new("chroot");
            cmd.arg(root);
            if !content.starts_with(b"#!") {
                cmd.arg("/bin/sh");
            }
            cmd
        }
    };
    let inside_file = context.inside.join(&script.slug);
    match &context.options.target {
        Target::Local { .. } if content.starts_with(b"#!") => {}
        _ => {
            cmd.arg(&inside_file);
        }
    }
    let plan = context.plan;
    cmd.env_clear()
        .env("PATH", PATH)
        .env("HOME", "/root")
        .env("LC_ALL", "C")
        .env("MPROV_PARAMS", context.inside.join(&params_name))
        .env("MPROV_HOST", plan.host.as_deref().unwrap_or_default())
        .env("MPROV_IMAGE", plan.image.as_deref().unwrap_or_default())
        .env("MPROV_GROUPS", plan.groups.join(","))
        .env("MPROV_SCRIPT", &script.slug)
        .current_dir("/")
        .process_group(0)
        .stdin(Stdio::piped());
    cmd.envs(context.options.env.iter().map(|(k, v)| (k, v)));
    if matches!(context.options.target, Target::Image(_)) {
        cmd.env("DEBIAN_FRONTEND", "noninteractive");
    }
    let (reader, writer) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(err) => return failed(format!("mprov-agent: making a pipe: {err}")),
    };
    match writer.try_clone() {
        Ok(copy) => {
            cmd.stdout(copy).stderr(writer);
        }
        Err(err) => return failed(format!("mprov-agent: making a pipe: {err}")),
    }
    let spawned = cmd.spawn();
    // The command holds the pipe's writing ends: drop them, or the output
    // never ends.
    drop(cmd);
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => return failed(format!("mprov-agent: starting the script: {err}")),
    };
    let pgid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    if let Some(mut stdin) = child.stdin.take() {
        let params = context.params.to_vec();
        // On its own thread: a script that never reads its input must not
        // block us (the pipe holds 64 KiB).
        std::thread::spawn(move || {
            let _ = stdin.write_all(&params);
        });
    }
    let tail = Arc::new(Mutex::new(Tail::default()));
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    {
        let tail = Arc::clone(&tail);
        let mut reader = reader;
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if let Ok(mut tail) = tail.lock() {
                            tail.push(&buf[..n]);
                        }
                    }
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = done_tx.send(());
        });
    }
    let timeout = Duration::from_secs(script.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS));
    let deadline = started + timeout;
    let mut killed = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) => {}
            Err(err) => break Err(err),
        }
        let cancelled = context.cancel.load(Ordering::SeqCst);
        if Instant::now() >= deadline || cancelled {
            killed = Some(if cancelled { "cancelled" } else { "timed out" });
            break stop_group(&mut child, pgid, context.options.grace);
        }
        std::thread::sleep(TICK);
    };
    let drained = done_rx.recv_timeout(DRAIN).is_ok();
    let mut output = tail.lock().map(|t| t.text()).unwrap_or_default();
    let note = |output: &mut String, line: &str| {
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str(line);
        output.push('\n');
    };
    if !drained {
        note(
            &mut output,
            "(mprov-agent: the script left a process holding its output)",
        );
    }
    let duration_ms = started.elapsed().as_millis().try_into().unwrap_or(u64::MAX);
    let status = match status {
        Ok(status) => status,
        Err(err) => {
            return failed(format!(
                "{output}mprov-agent: waiting for the script: {err}"
            ));
        }
    };
    let (status, exit_code) = match (killed, status.code()) {
        (Some("timed out"), _) => {
            note(
                &mut output,
                &format!(
                    "(mprov-agent: timed out after {} s; its process group was killed)",
                    timeout.as_secs()
                ),
            );
            (ScriptStatus::TimedOut, None)
        }
        (Some(why), _) => {
            note(&mut output, &format!("(mprov-agent: {why})"));
            (ScriptStatus::Failed, None)
        }
        (None, Some(0)) => (ScriptStatus::Success, Some(0)),
        (None, Some(code)) => (ScriptStatus::Failed, Some(code)),
        (None, None) => {
            note(
                &mut output,
                &format!(
                    "(mprov-agent: killed by signal {})",
                    status.signal().unwrap_or_default()
                ),
            );
            (ScriptStatus::Failed, None)
        }
    };
    ScriptResult {
        slug: script.slug.clone(),
        status,
        exit_code,
        duration_ms,
        output_tail: trim_tail(output),
    }
}

/// SIGTERM to the whole group, SIGKILL after `grace` (to the whole group
/// again, for the children that outlived or ignored it), then the leader
/// reaped.
fn stop_group(
    child: &mut std::process::Child,
    pgid: Pid,
    grace: Duration,
) -> io::Result<std::process::ExitStatus> {
    let _ = killpg(pgid, Signal::SIGTERM);
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if child.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(TICK);
    }
    let _ = killpg(pgid, Signal::SIGKILL);
    child.wait()
}

fn write_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(bytes)
}

/// The last [`MAX_OUTPUT_TAIL`] bytes of a stream, in bounded memory.
#[derive(Debug, Default)]
struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        // Trimmed in batches, so each byte is moved at most once or twice.
        if self.buf.len() > 2 * MAX_OUTPUT_TAIL {
            let cut = self.buf.len() - MAX_OUTPUT_TAIL;
            self.buf.drain(..cut);
        }
    }

    fn text(&self) -> String {
        let start = self.buf.len().saturating_sub(MAX_OUTPUT_TAIL);
        String::from_utf8_lossy(&self.buf[start..]).into_owned()
    }
}

/// At most [`MAX_OUTPUT_TAIL`] bytes, cut at a character boundary.
fn trim_tail(text: String) -> String {
    if text.len() <= MAX_OUTPUT_TAIL {
        return text;
    }
    let mut start = text.len() - MAX_OUTPUT_TAIL;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

/// `/proc`, `/sys` and `/dev` mounted inside an image's root while its
/// scripts run (where the root has those folders, and only as root);
/// unmounted lazily on drop, should a script leave a process behind.
#[derive(Debug)]
struct Mounts {
    mounted: Vec<PathBuf>,
}

impl Mounts {
    fn new(root: &Path) -> Result<Mounts, ExecError> {
        let mut mounts = Mounts {
            mounted: Vec::new(),
        };
        if !nix::unistd::geteuid().is_root() {
            return Ok(mounts);
        }
        let plan: [(&str, &[&str]); 3] = [
            ("proc", &["-t", "proc", "proc"]),
            ("sys", &["-t", "sysfs", "sysfs"]),
            ("dev", &["--bind", "/dev"]),
        ];
        for (dir, args) in plan {
            let target = root.join(dir);
            if !target.is_dir() || target.is_symlink() {
                continue;
            }
            let output = Command::new("mount")
                .args(args)
                .arg(&target)
                .stdin(Stdio::null())
                .output()
                .map_err(io_err("mounting", &target))?;
            if !output.status.success() {
                return Err(ExecError {
                    what: "mounting",
                    path: target,
                    err: io::Error::other(String::from_utf8_lossy(&output.stderr).into_owned()),
                });
            }
            mounts.mounted.push(target);
        }
        Ok(mounts)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for target in self.mounted.iter().rev() {
            let status = Command::new("umount")
                .arg("-l")
                .arg(target)
                .stdin(Stdio::null())
                .status();
            if !status.is_ok_and(|s| s.success()) {
                eprintln!(
                    "mprov-agent: warning: could not unmount {}",
                    target.display()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
