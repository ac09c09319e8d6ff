//! Test helpers: configs pointing at a mock hub, the daemon in-process or as the real
//! binary, waiting on conditions, and the one gate for tests that need something this
//! machine may not have. The process table is [`crate::procfs`]'s.
//!
//! # Gating a test: [`require`] (no silent skips)
//!
//! A test that needs a kernel feature, a tool or root gates on **one call**, its first line:
//!
//! ```ignore
//! if !require("python3", missing_tool("python3")) { return; }
//! if !require("confine", crate::containment::cannot_confine()) { return; }
//! if !require("root", missing_root()) { return; }
//! ```
//!
//! `require(requirement, missing)`: `missing` is `None` when the requirement holds here,
//! else why not (it goes into the message). When it is missing:
//!
//! - if `requirement` is listed in `HUB_SIDECAR_REQUIRE` (comma-separated; `.ci/run` sets
//!   it to everything it installs), the test **fails**, naming the requirement and why;
//! - else the skip is printed and appended as one line `test<TAB>requirement<TAB>reason` to
//!   the file `HUB_SIDECAR_SKIPS` names (`scripts/test.sh`, `scripts/test-unprivileged.sh`
//!   and `.ci/run` set it and print the list at the end), and `require` returns `false`.
//!
//! The requirement is one of [`REQUIREMENTS`] (a name outside it panics: a typo must not
//! turn a gate into a skip CI never asks for). Tool requirements are named after the
//! program; the probes are [`missing_tool`] (on `PATH` and runs `--version`),
//! [`missing_root`] and [`missing_unprivileged`]. Helpers that gate several tests
//! (`containment::supported()`, `caches::can_run`, `real_claude()`) call `require`
//! themselves, so their call sites stay `if !supported() { return; }`.
//!
//! Converting an old gate (`eprintln!("skipped: …"); return;`) is one line: keep the
//! condition, name the requirement, pass the reason as `missing`. The unit tests under
//! `src/` have the same gate in `hub_sidecar::util::require` (`#[cfg(test)]`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use hub_sidecar::config::Config;
use hub_sidecar::daemon::{self, ExitReason, Shutdown};
use hub_sidecar::mock_hub::MockHub;
use hub_sidecar::ops::Ops;
use hub_sidecar::progress::{EventKind, ProgressEvent};
use tokio::task::JoinHandle;

pub(crate) use crate::procfs::procs_with_arg;

/// Generous bound for anything that should happen "soon" on a loaded 2-core CI box.
pub(crate) const T: Duration = Duration::from_secs(15);

/// A config for `hub` with fast timers, state in `dir`.
pub(crate) fn cfg(hub: &MockHub, dir: &Path) -> Config {
    let mut c = Config::for_hub(&hub.url(), dir);
    c.ping_interval_secs = 1;
    c.pong_timeout_secs = 3;
    c.reconnect_min_ms = 50;
    c.reconnect_max_ms = 400;
    c.resource_report_interval_secs = 3600;
    c.progress.min_interval_ms = 200;
    c.executor.kill_grace_ms = 1000;
    c.sandbox.write_paths.push(probe(dir));
    c
}

/// `dir/probe`: where a test's task may leave markers for the test to see. Tasks are
/// confined to their workspace; the test configs add this one directory to
/// `sandbox.write_paths` (the state directory itself stays closed to them).
pub(crate) fn probe(dir: &Path) -> PathBuf {
    let p = dir.join("probe");
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// [`cfg`] with a fixed `repo_dir` workspace (`dir/ws`), for tests that look at the files a
/// task left: a per-task temp workspace is removed once the result exists.
pub(crate) fn cfg_with_workspace(hub: &MockHub, dir: &Path) -> (Config, PathBuf) {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let mut c = cfg(hub, dir);
    c.repo_dir = Some(ws.clone());
    (c, ws)
}

/// The daemon running in this test's runtime.
pub(crate) struct InProc {
    pub shutdown: Shutdown,
    pub ops: Ops,
    pub handle: JoinHandle<anyhow::Result<ExitReason>>,
}

pub(crate) fn spawn(cfg: Config) -> InProc {
    let shutdown = Shutdown::new();
    let ops = Ops::new();
    let handle = tokio::spawn(daemon::run(cfg, shutdown.clone(), ops.clone()));
    InProc {
        shutdown,
        ops,
        handle,
    }
}

impl InProc {
    /// Drain-stop and wait for the exit reason.
    pub(crate) async fn stop(self) -> ExitReason {
        self.shutdown.drain.cancel();
        tokio::time::timeout(T, self.handle)
            .await
            .expect("daemon did not stop in time")
            .expect("daemon task panicked")
            .expect("daemon returned an error")
    }
}

pub(crate) fn assert_no_violations(hub: &MockHub) {
    let v = hub.violations();
    assert!(
        v.is_empty(),
        "the mock hub recorded schema violations: {v:#?}"
    );
}

/// Poll a condition that has no event to wait on (files, the process table).
pub(crate) async fn wait_until(mut cond: impl FnMut() -> bool, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A unique `sleep` duration so a test can find exactly its own sleeps in the process table.
pub(crate) fn unique_sleep() -> String {
    format!("{}.{:03}", 30 + fastrand::u32(0..60), fastrand::u32(1..999))
}

/// The real `hub-sidecar` binary with a config file in a temp dir.
/// What runs in the daemon's process between `fork` and `exec` ([`Bin::start_with_hook`]).
pub(crate) type PreExec = Box<dyn FnMut() -> std::io::Result<()> + Send + Sync>;

pub(crate) struct Bin {
    pub child: tokio::process::Child,
    pub dir: PathBuf,
    pub log: PathBuf,
    pub config: PathBuf,
}

/// Write a TOML config for `hub` into `dir`.
pub(crate) fn write_config(hub: &MockHub, dir: &Path, token: &str, extra: &str) -> PathBuf {
    write_agent_config(hub, dir, "sidecar-test", token, extra, &probe(dir))
}

/// [`write_config`] for one agent of several: its id and token, its state in `dir`, and
/// `shared` (a directory outside every agent's workspace) writable by its tasks.
pub(crate) fn write_agent_config(
    hub: &MockHub,
    dir: &Path,
    agent: &str,
    token: &str,
    extra: &str,
    shared: &Path,
) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("hub-sidecar.toml");
    let text = format!(
        "agent_id = \"{agent}\"\ntoken = \"{token}\"\nhub_url = \"{}\"\nstate_dir = \"{}\"\nping_interval_secs = 1\npong_timeout_secs = 3\nreconnect_min_ms = 50\nreconnect_max_ms = 400\nresource_report_interval_secs = 3600\n{extra}\n[sandbox]\nwrite_paths = [\"{}\"]\n",
        hub.url(),
        dir.display(),
        shared.display()
    );
    std::fs::write(&path, text).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path
}

impl Bin {
    /// Start the binary with `config`, logging to `dir/daemon-N.log`.
    pub(crate) fn start(dir: &Path, config: &Path, envs: &[(&str, &str)]) -> Bin {
        Bin::start_with_open_files(dir, config, envs, None)
    }

    /// [`Bin::start`] with the daemon's `RLIMIT_NOFILE` (soft and hard) set to
    /// `open_files`: a host whose limit is low (systemd's default soft limit is 1,024).
    pub(crate) fn start_with_open_files(
        dir: &Path,
        config: &Path,
        envs: &[(&str, &str)],
        open_files: Option<u64>,
    ) -> Bin {
        let hook = open_files.map(|n| -> PreExec {
            Box::new(move || {
                let l = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                // SAFETY: setrlimit is async-signal-safe and reads one struct we own.
                #[allow(unsafe_code)]
                if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        });
        Bin::start_with_hook(dir, config, envs, hook)
    }

    /// [`Bin::start`] with `hook` run in the daemon's process before it execs (only
    /// async-signal-safe calls): a host state the daemon starts in.
    pub(crate) fn start_with_hook(
        dir: &Path,
        config: &Path,
        envs: &[(&str, &str)],
        hook: Option<PreExec>,
    ) -> Bin {
        let n = std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
        let log = dir.join(format!("daemon-{n}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_hub-sidecar"));
        cmd.arg("run")
            .arg("--config")
            .arg(config)
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        if let Some(hook) = hook {
            // SAFETY: the hook's contract: async-signal-safe calls only.
            #[allow(unsafe_code)]
            unsafe {
                cmd.pre_exec(hook);
            }
        }
        Bin {
            child: cmd.spawn().expect("spawn hub-sidecar"),
            dir: dir.to_path_buf(),
            log,
            config: config.to_path_buf(),
        }
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    pub(crate) fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    pub(crate) async fn kill9(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// Wait for exit; the exit code.
    pub(crate) async fn wait(&mut self, timeout: Duration) -> Option<i32> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(s)) => s.code(),
            _ => None,
        }
    }

    pub(crate) fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Progress events recorded by a `ProgressSink::with_observer` in module-level tests.
pub(crate) type Events = std::sync::Arc<std::sync::Mutex<Vec<ProgressEvent>>>;

/// The recorded events of one kind.
pub(crate) fn kinds(events: &Events, kind: EventKind) -> Vec<ProgressEvent> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.kind == kind)
        .cloned()
        .collect()
}

/// Every requirement a test may gate on, and what it means. `HUB_SIDECAR_REQUIRE` names
/// some of these; the unprivileged run drops what a non-root user without a toolchain cannot
/// have (`scripts/test-unprivileged.sh`).
pub(crate) const REQUIREMENTS: &[(&str, &str)] = &[
    (
        "confine",
        "the kernel confines tasks: Landlock and user namespaces (Support::probe)",
    ),
    (
        "root",
        "the tests run as root (boot systemd, chown to another user)",
    ),
    ("unprivileged", "the tests run as a user other than root"),
    ("claude", "the real Claude Code CLI on PATH"),
    (
        "valgrind",
        "valgrind, for the link-order test (callgrind on the release binary)",
    ),
    (
        "deb",
        "a package built by `cargo deb` in target/debian, and dpkg-deb",
    ),
    ("lintian", "lintian on PATH"),
    ("promtool", "promtool (Debian's prometheus package) on PATH"),
    (
        "mmdebstrap",
        "mmdebstrap on PATH, or a cached Debian root under target/debian-root",
    ),
    (
        "systemd",
        "systemd (/lib/systemd/systemd) and systemd-analyze",
    ),
    (
        "unshare",
        "util-linux's unshare and nsenter, coreutils' chroot",
    ),
    ("rustc", "a Rust toolchain (rustc, cargo) this user can run"),
    ("cargo", "cargo on PATH"),
    ("python3", "python3 on PATH"),
    ("venv", "python3 with venv and ensurepip"),
    ("perl", "/usr/bin/perl"),
    ("curl", "curl on PATH"),
    ("git", "git on PATH"),
    ("tar", "tar on PATH"),
    ("go", "go on PATH"),
    ("node", "node on PATH"),
    ("npm", "npm on PATH"),
    ("pnpm", "pnpm on PATH"),
    ("yarn", "yarn 1 on PATH"),
    ("uv", "uv on PATH"),
    (
        "route",
        "a route off this host (a non-loopback address of its own)",
    ),
];

/// The gate of every test that needs something this machine may lack (module doc):
/// `true` when `missing` is `None`; a failure when `requirement` is in
/// `HUB_SIDECAR_REQUIRE`; else a recorded skip and `false`.
#[track_caller]
pub(crate) fn require(requirement: &str, missing: Option<String>) -> bool {
    assert!(
        REQUIREMENTS.iter().any(|(r, _)| *r == requirement),
        "`{requirement}` is not a known requirement: add it to util::REQUIREMENTS"
    );
    let Some(why) = missing else {
        return true;
    };
    let test = current_test();
    if required().iter().any(|r| r == requirement) {
        panic!(
            "{test} needs `{requirement}`, which HUB_SIDECAR_REQUIRE says this machine has, but: {why}"
        );
    }
    record_skip(&test, requirement, &why);
    false
}

/// The requirements `HUB_SIDECAR_REQUIRE` names.
pub(crate) fn required() -> Vec<String> {
    std::env::var("HUB_SIDECAR_REQUIRE")
        .unwrap_or_default()
        .split(',')
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
        .collect()
}

/// The running test's name: libtest runs each test on a thread named after it.
fn current_test() -> String {
    match std::thread::current().name() {
        Some(n) if n != "main" => n.to_string(),
        _ => "(a test on the main thread)".to_string(),
    }
}

/// Print the skip and append it to the `HUB_SIDECAR_SKIPS` list: one line, one `write`
/// (O_APPEND), so lines from parallel tests and both runs never interleave.
fn record_skip(test: &str, requirement: &str, why: &str) {
    let why = why.replace(['\n', '\t'], " ");
    eprintln!("SKIPPED {test}: needs `{requirement}`: {why}");
    let Some(list) = std::env::var_os("HUB_SIDECAR_SKIPS") else {
        return;
    };
    use std::io::Write;
    let line = format!("{test}\t{requirement}\t{why}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&list)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    // A skip that cannot be listed must not pass quietly.
    if let Err(e) = written {
        panic!(
            "{test} skipped (needs `{requirement}`: {why}) and cannot list it in {}: {e}",
            Path::new(&list).display()
        );
    }
}

/// Why `program` cannot be run here (not on `PATH`, or `--version` fails), if it cannot.
pub(crate) fn missing_tool(program: &str) -> Option<String> {
    // Go alone has no `--version`.
    let arg = if program == "go" {
        "version"
    } else {
        "--version"
    };
    match std::process::Command::new(program).arg(arg).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`{program} {arg}` failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!(
            "cannot run `{program}`: {e} (not installed, or not on PATH for this user)"
        )),
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::geteuid()
    }
}

/// Why this is not root, if it is not.
pub(crate) fn missing_root() -> Option<String> {
    (euid() != 0).then(|| format!("runs as uid {}, not root", euid()))
}

/// Why this is root, if it is.
pub(crate) fn missing_unprivileged() -> Option<String> {
    (euid() == 0).then(|| "runs as root".to_string())
}

/// The unprivileged run (`scripts/test-unprivileged.sh`, which requires `unprivileged`) is
/// what it says: without root's power to read every process's files. Run as root by
/// mistake, it would hide what the service user meets.
#[test]
fn the_unprivileged_run_cannot_read_what_only_root_can() {
    if !require("unprivileged", missing_unprivileged()) {
        return;
    }
    let read = std::fs::read("/proc/1/environ");
    assert!(
        read.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied),
        "/proc/1/environ is readable ({read:?}): this run has root's powers"
    );
}

#[test]
fn the_required_list_names_only_known_requirements() {
    for r in required() {
        assert!(
            REQUIREMENTS.iter().any(|(k, _)| *k == r),
            "HUB_SIDECAR_REQUIRE names `{r}`, which no test gates on; known: {:?}",
            REQUIREMENTS.iter().map(|(k, _)| k).collect::<Vec<_>>()
        );
    }
}

/// The requirements `.ci/run` declares are the ones REQUIREMENTS lists, minus none: a
/// requirement CI does not declare is one whose tests may skip in CI unseen.
#[test]
fn ci_requires_every_requirement() {
    let ci =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/run")).unwrap();
    let line = ci
        .lines()
        .find_map(|l| l.strip_prefix("export HUB_SIDECAR_REQUIRE="))
        .expect(".ci/run exports HUB_SIDECAR_REQUIRE");
    let declared: Vec<&str> = line.trim_matches('"').split(',').collect();
    for (r, what) in REQUIREMENTS {
        assert!(
            declared.contains(r),
            ".ci/run does not require `{r}` ({what}): its tests would skip in CI"
        );
    }
}
