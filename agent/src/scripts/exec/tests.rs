//! The executor on real shell scripts in a scratch folder. Ordering facts are
//! shown by the files the scripts write, never by elapsed time.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use mprov_api::scripts::{
    MAX_OUTPUT_TAIL, PlannedScript, RunOutcome, ScriptMode, ScriptPlan, ScriptStatus,
};
use sha2::{Digest as _, Sha256};

use super::*;

struct Case {
    dir: tempfile::TempDir,
    plan: ScriptPlan,
    contents: BTreeMap<String, Vec<u8>>,
}

impl Case {
    fn new() -> Case {
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["root/etc", "work", "out"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        Case {
            dir,
            plan: ScriptPlan {
                mode: ScriptMode::PostBoot,
                host: Some("n01".into()),
                image: Some("compute".into()),
                groups: vec!["rack1".into(), "gpu".into()],
                params: serde_json::json!({"ntp": "10.0.0.1"}),
                scripts: vec![],
                disabled: vec![],
                run_request: 7,
            },
            contents: BTreeMap::new(),
        }
    }

    fn out(&self) -> std::path::PathBuf {
        self.dir.path().join("out")
    }

    fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("root")
    }

    /// A script; `$OUT` in `body` is the folder for the scripts' marker files.
    fn script(&mut self, slug: &str, deps: &[&str], timeout: Option<u64>, body: &str) {
        let content = body
            .replace("$OUT", &self.out().display().to_string())
            .replace("$ROOT", &self.root().display().to_string());
        self.plan.scripts.push(PlannedScript {
            slug: slug.into(),
            version: 1,
            sha256: hex::encode(Sha256::digest(content.as_bytes())),
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            timeout_seconds: timeout,
            layer: "system".into(),
        });
        self.contents.insert(slug.into(), content.into_bytes());
    }

    fn options(&self) -> Options {
        Options {
            target: Target::Local {
                root: self.root(),
                work: self.dir.path().join("work"),
            },
            nologin: true,
            parallel: 2,
            grace: Duration::from_millis(200),
            env: vec![],
        }
    }

    fn run(&self) -> RunReport {
        execute(
            &self.plan,
            &self.contents,
            &self.options(),
            &AtomicBool::new(false),
            &|_| {},
        )
        .expect("runs")
    }

    fn marker(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.out().join(name)).ok()
    }

    fn markers(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.out())
            .expect("out")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn result<'r>(&self, report: &'r RunReport, slug: &str) -> &'r ScriptResult {
        report
            .results
            .iter()
            .find(|r| r.slug == slug)
            .unwrap_or_else(|| panic!("no result for {slug}"))
    }
}

/// Waits (bounded) for the other script's start marker, then records
/// whether it saw it.
fn meet(me: &str, other: &str) -> String {
    format!(
        "touch $OUT/{me}.started\n\
         i=0\n\
         while [ ! -e $OUT/{other}.started ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done\n\
         if [ -e $OUT/{other}.started ]; then echo yes > $OUT/{me}.saw-{other}; fi\n\
         touch $OUT/{me}.finished\n"
    )
}

#[test]
fn a_layer_runs_at_once_and_the_next_after_it() {
    let mut case = Case::new();
    case.script("a", &[], None, &meet("a", "b"));
    case.script("b", &[], None, &meet("b", "a"));
    case.script(
        "c",
        &["a", "b"],
        None,
        "if [ -e $OUT/a.finished ] && [ -e $OUT/b.finished ]; then touch $OUT/c.after-both; fi\n\
         echo \"$MPROV_HOST $MPROV_IMAGE $MPROV_GROUPS $MPROV_SCRIPT\" > $OUT/c.env\n\
         cat > $OUT/c.stdin\n\
         cat \"$MPROV_PARAMS\" > $OUT/c.file\n\
         if [ -e $ROOT/etc/nologin ]; then touch $OUT/c.nologin; fi\n\
         echo to-out; echo to-err >&2; echo to-out-again\n",
    );
    let report = case.run();
    assert_eq!(report.outcome, RunOutcome::Success, "{report:?}");
    // Each of a and b saw the other's start marker before writing its own
    // finish marker: each started before the other finished, so both ran
    // at once (run one after the other, the first would have given up
    // waiting and left no `saw` marker).
    for (me, other) in [("a", "b"), ("b", "a")] {
        assert!(case.marker(&format!("{me}.saw-{other}")).is_some(), "{me}");
    }
    assert!(case.marker("c.after-both").is_some());
    assert_eq!(
        case.marker("c.env").as_deref(),
        Some("n01 compute rack1,gpu c\n")
    );
    let params = r#"{"ntp":"10.0.0.1"}"#;
    assert_eq!(case.marker("c.stdin").as_deref(), Some(params));
    assert_eq!(case.marker("c.file").as_deref(), Some(params));
    assert!(case.marker("c.nologin").is_some(), "nologin during the run");
    assert!(!case.root().join("etc/nologin").exists(), "nologin after");
    let order: Vec<&str> = report.results.iter().map(|r| r.slug.as_str()).collect();
    assert_eq!(order, ["a", "b", "c"]);
    let c = case.result(&report, "c");
    assert_eq!(c.output_tail, "to-out\nto-err\nto-out-again\n");
    assert_eq!(c.exit_code, Some(0));
    assert_eq!(report.run_request, 7);
    // The run's files are gone.
    let work = std::fs::read_dir(case.dir.path().join("work")).expect("work");
    assert_eq!(work.count(), 0);
}

#[test]
fn a_failure_lets_its_layer_finish_and_stops_the_next() {
    let mut case = Case::new();
    case.script(
        "bad",
        &[],
        None,
        "touch $OUT/bad.ran\necho going wrong\necho oops >&2\nexit 3\n",
    );
    case.script("good", &[], None, "sleep 0.3\ntouch $OUT/good.ran\n");
    case.script("later", &["bad"], None, "touch $OUT/later.ran\n");
    case.script(
        "much-later",
        &["later", "good"],
        None,
        "touch $OUT/much-later.ran\n",
    );
    let report = case.run();
    assert_eq!(report.outcome, RunOutcome::Failed);
    let bad = case.result(&report, "bad");
    assert_eq!(bad.status, ScriptStatus::Failed);
    assert_eq!(bad.exit_code, Some(3));
    assert_eq!(bad.output_tail, "going wrong\noops\n");
    assert_eq!(case.result(&report, "good").status, ScriptStatus::Success);
    for slug in ["later", "much-later"] {
        assert_eq!(case.result(&report, slug).status, ScriptStatus::NotRun);
    }
    assert_eq!(case.markers(), ["bad.ran", "good.ran"]);
    assert!(
        report.detail.contains("bad failed (exit 3)"),
        "{}",
        report.detail
    );
    assert!(
        !case.root().join("etc/nologin").exists(),
        "nologin after a failure"
    );
}

#[test]
fn a_hung_script_is_killed_with_its_children() {
    // Be the reaper of orphans, so the killed `sleep` (reparented to us)
    // can be reaped here and its death seen, not merely its absence.
    nix::sys::prctl::set_child_subreaper(true).expect("subreaper");
    let mut case = Case::new();
    // TERM ignored (and so ignored by the child too): only SIGKILL to the
    // group ends them.
    case.script(
        "hung",
        &[],
        Some(1),
        "trap '' TERM\nsleep 1000 &\necho $! > $OUT/child.pid\necho waiting\nwhile :; do sleep 0.1; done\n",
    );
    case.script("after", &["hung"], None, "touch $OUT/after.ran\n");
    let report = case.run();
    assert_eq!(report.outcome, RunOutcome::Failed);
    let hung = case.result(&report, "hung");
    assert_eq!(hung.status, ScriptStatus::TimedOut);
    assert_eq!(hung.exit_code, None);
    assert!(
        hung.output_tail.starts_with("waiting\n"),
        "{}",
        hung.output_tail
    );
    assert!(hung.output_tail.contains("timed out after 1 s"));
    assert_eq!(case.result(&report, "after").status, ScriptStatus::NotRun);
    let pid: i32 = case
        .marker("child.pid")
        .expect("child pid")
        .trim()
        .parse()
        .expect("pid");
    let pid = nix::unistd::Pid::from_raw(pid);
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let mut status = WaitStatus::StillAlive;
    for _ in 0..200 {
        status = waitpid(pid, Some(WaitPidFlag::WNOHANG)).expect("our orphan");
        if status != WaitStatus::StillAlive {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        status,
        WaitStatus::Signaled(pid, nix::sys::signal::Signal::SIGKILL, false)
    );
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
}

#[test]
fn refusals_run_nothing_and_name_the_scripts() {
    /// What is refused: its scripts, the disabled slugs, what the refusal
    /// must say.
    type Refused<'a> = (
        &'a str,
        &'a [(&'a str, &'a [&'a str])],
        &'a [&'a str],
        &'a [&'a str],
    );
    let cases: [Refused<'_>; 3] = [
        (
            "cycle",
            &[("a", &["b"]), ("b", &["a"]), ("c", &[])],
            &[],
            &["scripts a, b depend on each other in a cycle"],
        ),
        (
            "missing",
            &[("a", &["gone"]), ("c", &[])],
            &[],
            &["script a depends on gone, which is not in the plan"],
        ),
        (
            "disabled",
            &[("a", &["off"]), ("c", &[])],
            &["off"],
            &["script a depends on off, which is disabled"],
        ),
    ];
    for (what, scripts, disabled, names) in cases {
        let mut case = Case::new();
        for (slug, deps) in scripts {
            case.script(slug, deps, None, &format!("touch $OUT/{slug}.ran\n"));
        }
        case.plan.disabled = disabled.iter().map(|d| d.to_string()).collect();
        let report = case.run();
        assert_eq!(report.outcome, RunOutcome::Refused, "{what}");
        for name in names {
            assert!(report.detail.contains(name), "{what}: {}", report.detail);
        }
        assert!(
            report
                .results
                .iter()
                .all(|r| r.status == ScriptStatus::NotRun)
        );
        assert!(case.markers().is_empty(), "{what}: {:?}", case.markers());
        assert!(!case.root().join("etc/nologin").exists(), "{what}");
    }
    // A content that does not match its checksum.
    let mut case = Case::new();
    case.script("a", &[], None, "touch $OUT/a.ran\n");
    case.script("b", &[], None, "touch $OUT/b.ran\n");
    case.contents
        .insert("b".into(), b"touch $OUT/evil\n".to_vec());
    let report = case.run();
    assert_eq!(report.outcome, RunOutcome::Refused);
    assert!(
        report.detail.contains("script b: its content has sha256"),
        "{}",
        report.detail
    );
    assert!(case.markers().is_empty());
    // A slug that is not a plain name (it becomes a file and a URL path).
    let mut case = Case::new();
    case.script("a", &[], None, "touch $OUT/a.ran\n");
    case.script("../up", &[], None, "touch $OUT/up.ran\n");
    let report = case.run();
    assert_eq!(report.outcome, RunOutcome::Refused);
    assert!(
        report
            .detail
            .contains("\"../up\": its slug is not a plain name"),
        "{}",
        report.detail
    );
    assert!(case.markers().is_empty());
}

#[test]
fn only_the_output_tail_is_kept() {
    let mut case = Case::new();
    case.script(
        "loud",
        &[],
        None,
        "i=0; while [ $i -lt 3000 ]; do echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done\necho END\n",
    );
    let report = case.run();
    let loud = case.result(&report, "loud");
    assert_eq!(loud.status, ScriptStatus::Success);
    assert!(loud.output_tail.len() <= MAX_OUTPUT_TAIL);
    assert!(loud.output_tail.len() > MAX_OUTPUT_TAIL - 100);
    assert!(
        loud.output_tail
            .ends_with("line-2999-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\nEND\n")
    );
}

#[test]
fn nologin_of_an_admin_is_left_alone() {
    let mut case = Case::new();
    std::fs::write(case.root().join("etc/nologin"), "maintenance\n").expect("write");
    case.script("a", &[], None, "exit 1\n");
    let report = case.run();
    assert_eq!(report.outcome, RunOutcome::Failed);
    assert_eq!(
        std::fs::read_to_string(case.root().join("etc/nologin")).expect("kept"),
        "maintenance\n"
    );
}

#[test]
fn image_gen_scripts_run_chrooted_in_the_root() {
    // Never skipped: `cargo xtask test` runs as root and installs
    // busybox-static.
    assert!(
        nix::unistd::geteuid().is_root(),
        "chroot needs root: run the tests as root (cargo xtask test does)"
    );
    assert!(
        Path::new("/usr/bin/busybox").exists(),
        "no /usr/bin/busybox: install the Debian package busybox-static"
    );
    let mut case = Case::new();
    let root = case.root();
    std::fs::create_dir_all(root.join("bin")).expect("bin");
    std::fs::copy("/usr/bin/busybox", root.join("bin/busybox")).expect("busybox");
    for tool in ["sh", "cat", "echo", "touch"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(tool)).expect("link");
    }
    case.plan.mode = ScriptMode::ImageGen;
    case.script(
        "inside",
        &[],
        None,
        "echo \"$MPROV_SCRIPT $MPROV_IMAGE\" > /made\ncat \"$MPROV_PARAMS\" >> /made\n",
    );
    case.script(
        "after",
        &["inside"],
        None,
        "#!/bin/sh\ncat /made > /after\n",
    );
    let mut options = case.options();
    options.target = Target::Image(root.clone());
    options.nologin = false;
    let report = execute(
        &case.plan,
        &case.contents,
        &options,
        &AtomicBool::new(false),
        &|_| {},
    )
    .expect("runs");
    assert_eq!(report.outcome, RunOutcome::Success, "{report:?}");
    let made = "inside compute\n{\"ntp\":\"10.0.0.1\"}";
    assert_eq!(
        std::fs::read_to_string(root.join("made")).expect("made"),
        made
    );
    assert_eq!(
        std::fs::read_to_string(root.join("after")).expect("after"),
        made
    );
    // The run's files left the image's /tmp.
    assert_eq!(std::fs::read_dir(root.join("tmp")).expect("tmp").count(), 0);
}

#[test]
fn tails_are_cut_at_characters() {
    let mut tail = Tail::default();
    for _ in 0..5 {
        tail.push(&[b'x'; MAX_OUTPUT_TAIL]);
    }
    tail.push("é".repeat(10).as_bytes());
    let text = trim_tail(tail.text());
    assert!(text.len() <= MAX_OUTPUT_TAIL);
    assert!(text.ends_with(&"é".repeat(10)));
}

#[test]
fn a_cancelled_run_kills_its_scripts_and_runs_nothing_more() {
    let mut case = Case::new();
    case.script(
        "long",
        &[],
        None,
        "touch $OUT/long.started\nwhile :; do sleep 0.1; done\n",
    );
    case.script("next", &["long"], None, "touch $OUT/next.ran\n");
    let cancel = AtomicBool::new(false);
    let started = case.out().join("long.started");
    let report = std::thread::scope(|scope| {
        scope.spawn(|| {
            // As SIGTERM does: once the script is running (bounded wait).
            for _ in 0..400 {
                if started.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            cancel.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        execute(
            &case.plan,
            &case.contents,
            &case.options(),
            &cancel,
            &|_| {},
        )
        .expect("runs")
    });
    assert_eq!(report.outcome, RunOutcome::Failed);
    let long = case.result(&report, "long");
    assert_eq!(long.status, ScriptStatus::Failed);
    assert!(
        long.output_tail.contains("cancelled"),
        "{}",
        long.output_tail
    );
    assert_eq!(case.result(&report, "next").status, ScriptStatus::NotRun);
    assert_eq!(case.markers(), ["long.started"]);
    assert!(!case.root().join("etc/nologin").exists());
}
