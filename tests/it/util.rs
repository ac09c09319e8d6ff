//! Test helpers: configs pointing at a mock hub, the daemon in-process or as the real
//! binary, waiting on conditions. The process table is [`crate::procfs`]'s.

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
