//! A fluent harness for the daemon-against-the-hub tests, so a test reads like the protocol:
//!
//! ```ignore
//! let h = Harness::start().await;             // mock hub, temp dir, daemon, identified
//! h.assign(sample_shell_task("t1", "echo hi"));
//! let done = h.terminal("t1").await;          // task_complete or task_failed for t1
//! h.finish().await;                           // drain-stop, then the schema-violation check
//! ```
//!
//! Two phases when a test needs its temp dir or hub before the daemon starts (a stand-in
//! program, a config tweak): [`Harness::setup`] gives a [`Setup`] (hub + dir), whose
//! [`Setup::start`] / [`Setup::start_bin`] start the daemon in-process or as the real binary.
//!
//! The violation check cannot be forgotten: [`Harness::finish`] runs it, and so does `Drop`
//! for a harness that was never finished (unless the test is already panicking).

#![allow(dead_code)]

use std::ops::Deref;
use std::path::{Path, PathBuf};

use hub_sidecar::config::Config;
use hub_sidecar::daemon::{ExitReason, Shutdown};
use hub_sidecar::mock_hub::{MockHub, MockHubOptions};
use hub_sidecar::ops::Ops;
use serde_json::Value;
use tempfile::TempDir;

use crate::util::{self, assert_no_violations, Bin, InProc, T};

/// A mock hub and a temp dir, before the daemon starts.
pub(crate) struct Setup {
    pub hub: MockHub,
    pub dir: TempDir,
}

impl Setup {
    /// A hub with the real hub's default options.
    pub(crate) async fn new() -> Setup {
        Setup::with_hub(MockHubOptions::default()).await
    }

    pub(crate) async fn with_hub(opts: MockHubOptions) -> Setup {
        Setup {
            hub: MockHub::start(opts).await.expect("start the mock hub"),
            dir: tempfile::tempdir().expect("create a temp dir"),
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The test config ([`util::cfg`]): fast timers, state in the temp dir.
    pub(crate) fn cfg(&self) -> Config {
        util::cfg(&self.hub, self.dir.path())
    }

    /// [`util::cfg_with_workspace`]: the config and its fixed workspace `dir/ws`.
    pub(crate) fn cfg_with_workspace(&self) -> (Config, PathBuf) {
        util::cfg_with_workspace(&self.hub, self.dir.path())
    }

    /// Run the daemon in this test's runtime with `cfg`; returns once it identified.
    pub(crate) async fn start(self, cfg: Config) -> Harness {
        let h = self.start_unidentified(cfg);
        h.identified().await;
        h
    }

    /// Like [`Setup::start`] without waiting for `identify` (a test of what comes first,
    /// or a daemon that must not get that far).
    pub(crate) fn start_unidentified(self, cfg: Config) -> Harness {
        Harness {
            daemon: Daemon::InProc(util::spawn(cfg)),
            setup: self,
            finished: false,
        }
    }

    /// Run the real binary with a TOML config ([`util::write_config`] with `token` and
    /// `extra` lines) and `envs`; returns once it identified.
    pub(crate) async fn start_bin(
        self,
        token: &str,
        extra: &str,
        envs: &[(&str, &str)],
    ) -> Harness {
        util::write_config(&self.hub, self.dir.path(), token, extra);
        self.start_bin_written(envs).await
    }

    /// Like [`Setup::start_bin`] with the config already written (by [`util::write_config`],
    /// then amended by the test, e.g. more `[sandbox]` lines appended).
    pub(crate) async fn start_bin_written(self, envs: &[(&str, &str)]) -> Harness {
        self.start_bin_with_open_files(envs, None).await
    }

    /// Like [`Setup::start_bin_written`] with the daemon's open-files limit set to
    /// `open_files` ([`Bin::start_with_open_files`]).
    pub(crate) async fn start_bin_with_open_files(
        self,
        envs: &[(&str, &str)],
        open_files: Option<u64>,
    ) -> Harness {
        let config = self.dir.path().join("hub-sidecar.toml");
        let bin = Bin::start_with_open_files(self.dir.path(), &config, envs, open_files);
        let h = Harness {
            daemon: Daemon::Bin(Box::new(bin)),
            setup: self,
            finished: false,
        };
        h.identified().await;
        h
    }
}

enum Daemon {
    InProc(InProc),
    Bin(Box<Bin>),
    Stopped,
}

/// The daemon running against the mock hub. Derefs to the [`MockHub`] for the hub's knobs
/// and recordings (`h.received_of(..)`, `h.set_cooldown(..)`, …).
pub(crate) struct Harness {
    setup: Setup,
    daemon: Daemon,
    finished: bool,
}

impl Deref for Harness {
    type Target = MockHub;
    fn deref(&self) -> &MockHub {
        &self.setup.hub
    }
}

impl Harness {
    /// A default hub, a temp dir and the daemon with the test config, identified.
    pub(crate) async fn start() -> Harness {
        let s = Setup::new().await;
        let cfg = s.cfg();
        s.start(cfg).await
    }

    /// The first phase only: hub and dir, for tests that prepare before the daemon starts.
    pub(crate) async fn setup() -> Setup {
        Setup::new().await
    }

    pub(crate) fn hub(&self) -> &MockHub {
        &self.setup.hub
    }

    /// The temp dir: state, config, probes.
    pub(crate) fn dir(&self) -> &Path {
        self.setup.dir.path()
    }

    /// [`util::probe`] of the temp dir: where tasks may leave markers.
    pub(crate) fn probe(&self) -> PathBuf {
        util::probe(self.dir())
    }

    /// The in-process daemon's metrics and health.
    pub(crate) fn ops(&self) -> &Ops {
        match &self.daemon {
            Daemon::InProc(d) => &d.ops,
            _ => panic!("ops() needs the in-process daemon (Setup::start)"),
        }
    }

    /// The binary daemon ([`Setup::start_bin`]): its pid, signals, logs.
    pub(crate) fn bin(&self) -> &Bin {
        match &self.daemon {
            Daemon::Bin(b) => b,
            _ => panic!("bin() needs the binary daemon (Setup::start_bin)"),
        }
    }

    /// The binary daemon, to wait for or kill it.
    pub(crate) fn bin_mut(&mut self) -> &mut Bin {
        match &mut self.daemon {
            Daemon::Bin(b) => b,
            _ => panic!("bin_mut() needs the binary daemon (Setup::start_bin)"),
        }
    }

    /// Waits for the daemon's first `identify`.
    pub(crate) async fn identified(&self) -> Value {
        self.hub()
            .wait_for_type("identify", T)
            .await
            .expect("the daemon never identified to the hub")
    }

    /// Waits for the `n`-th (1-based) `identify`: the daemon reconnected `n - 1` times.
    pub(crate) async fn identified_nth(&self, n: usize) -> Value {
        self.hub()
            .wait_for_nth("identify", n, T)
            .await
            .unwrap_or_else(|| panic!("identify #{n} never arrived"))
    }

    /// Waits for the first inbound frame of type `ty` about `task_id`.
    pub(crate) async fn frame(&self, ty: &str, task_id: &str) -> Value {
        self.hub()
            .wait_for(|f| f["type"] == ty && f["task_id"] == task_id, T)
            .await
            .unwrap_or_else(|| panic!("no {ty} for {task_id} arrived"))
    }

    /// Waits for `task_accepted` for `task_id`.
    pub(crate) async fn accepted(&self, task_id: &str) -> Value {
        self.frame("task_accepted", task_id).await
    }

    /// Waits for the terminal frame (`task_complete` or `task_failed`) for `task_id`.
    pub(crate) async fn terminal(&self, task_id: &str) -> Value {
        self.hub()
            .wait_for(
                |f| {
                    (f["type"] == "task_complete" || f["type"] == "task_failed")
                        && f["task_id"] == task_id
                },
                T,
            )
            .await
            .unwrap_or_else(|| panic!("no terminal frame for {task_id} arrived"))
    }

    /// Waits for `task_complete` for `task_id` (a `task_failed` instead fails the test
    /// with its reason).
    pub(crate) async fn completed(&self, task_id: &str) -> Value {
        let done = self.terminal(task_id).await;
        assert_eq!(
            done["type"], "task_complete",
            "{task_id} failed instead of completing: {done:#}"
        );
        done
    }

    /// Waits for `task_failed` for `task_id` (a `task_complete` instead fails the test).
    pub(crate) async fn failed(&self, task_id: &str) -> Value {
        let done = self.terminal(task_id).await;
        assert_eq!(
            done["type"], "task_failed",
            "{task_id} completed but should have failed: {done:#}"
        );
        done
    }

    /// Drain-stop the in-process daemon and return why it stopped; the harness stays for
    /// assertions on what it left behind (then [`Harness::finish`] or drop).
    pub(crate) async fn stop_daemon(&mut self) -> ExitReason {
        match std::mem::replace(&mut self.daemon, Daemon::Stopped) {
            Daemon::InProc(d) => d.stop().await,
            _ => panic!("stop_daemon() needs the running in-process daemon"),
        }
    }

    /// The binary daemon's config file ([`Setup::start_bin`]).
    pub(crate) fn config_path(&self) -> PathBuf {
        self.dir().join("hub-sidecar.toml")
    }

    /// Start the binary again with the same config (the previous process must have
    /// exited or been killed); does not wait for its identify.
    pub(crate) fn start_bin_again(&mut self, envs: &[(&str, &str)]) {
        if let Daemon::Bin(b) = &mut self.daemon {
            assert!(
                b.child.try_wait().ok().flatten().is_some(),
                "start_bin_again() while the previous binary still runs"
            );
        }
        self.daemon = Daemon::Bin(Box::new(Bin::start(self.dir(), &self.config_path(), envs)));
    }

    /// The in-process daemon's stop tokens, for tests of the stop stages themselves.
    pub(crate) fn shutdown(&self) -> &Shutdown {
        match &self.daemon {
            Daemon::InProc(d) => &d.shutdown,
            _ => panic!("shutdown() needs the in-process daemon (Setup::start)"),
        }
    }

    /// Wait (unbounded: wrap it in a timeout) for the in-process daemon to return after a
    /// stop the test requested through [`Harness::shutdown`].
    pub(crate) async fn exited(&mut self) -> ExitReason {
        match std::mem::replace(&mut self.daemon, Daemon::Stopped) {
            Daemon::InProc(d) => d
                .handle
                .await
                .expect("daemon task panicked")
                .expect("daemon returned an error"),
            _ => panic!("exited() needs the running in-process daemon"),
        }
    }

    /// Start the daemon again in-process with `cfg` (the previous one must be stopped) and
    /// wait for its `n`-th identify overall.
    pub(crate) async fn restart_daemon(&mut self, cfg: Config, nth_identify: usize) {
        assert!(
            matches!(self.daemon, Daemon::Stopped),
            "restart_daemon() while a daemon still runs"
        );
        self.daemon = Daemon::InProc(util::spawn(cfg));
        self.identified_nth(nth_identify).await;
    }

    /// Stop the daemon if it still runs (in-process: drain; binary: SIGTERM and exit code 0),
    /// then check that the hub recorded no schema violation.
    pub(crate) async fn finish(mut self) {
        match std::mem::replace(&mut self.daemon, Daemon::Stopped) {
            Daemon::InProc(d) => {
                d.stop().await;
            }
            Daemon::Bin(mut b) => {
                if b.child.try_wait().ok().flatten().is_none() {
                    b.signal("TERM");
                    assert_eq!(b.wait(T).await, Some(0), "exit code after SIGTERM");
                }
            }
            Daemon::Stopped => {}
        }
        self.finished = true;
        assert_no_violations(self.hub());
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // A test that returns early (or never calls finish) still gets the check; a test
        // that is already failing keeps its own message.
        if !self.finished && !std::thread::panicking() {
            assert_no_violations(self.hub());
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::SinkExt;
    use hub_sidecar::mock_hub::sample_shell_task;
    use tokio_tungstenite::tungstenite::Message;

    use super::*;
    use crate::util::wait_until;

    /// A second client that sends the hub a binary frame: a schema violation on record.
    async fn provoke_a_violation(h: &Harness) {
        let (mut ws, _) = tokio_tungstenite::connect_async(h.url())
            .await
            .expect("connect a raw client to the mock hub");
        ws.send(Message::Binary(vec![1, 2, 3].into()))
            .await
            .expect("send a binary frame");
        assert!(wait_until(|| !h.violations().is_empty(), T).await);
    }

    #[tokio::test]
    async fn a_task_goes_from_assign_to_its_terminal_frame() {
        let h = Harness::start().await;
        h.assign(sample_shell_task("h1", "echo harnessed"));
        assert_eq!(h.accepted("h1").await["task_id"], "h1");
        let done = h.completed("h1").await;
        assert!(done["result"]["output"]
            .as_str()
            .unwrap()
            .contains("harnessed"));
        h.finish().await;
    }

    #[tokio::test]
    #[should_panic(expected = "schema violations")]
    async fn finish_fails_on_a_schema_violation() {
        let h = Harness::start().await;
        provoke_a_violation(&h).await;
        h.finish().await;
    }

    #[tokio::test]
    #[should_panic(expected = "schema violations")]
    async fn a_harness_dropped_unfinished_still_checks_for_violations() {
        let h = Harness::start().await;
        provoke_a_violation(&h).await;
        drop(h);
    }
}
