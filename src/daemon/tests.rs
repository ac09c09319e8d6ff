//! The daemon's timers on paused tokio time: the drain timeout, the kill grace of a forced
//! stop, the outbox flush on the way out, the wait for an answer to `task_recovering`, and
//! an unanswered result sent again. The daemon runs against an in-memory link (the test
//! plays the link: it feeds [`LinkEvent`]s and reads the [`OutFrame`]s), with real state on
//! disk in a temp dir; a running task is a stand-in runner future, so no process runs.
//!
//! With the clock paused, tokio jumps it to the next timer whenever every task waits, so a
//! 30-minute drain timeout takes no wall time and fires exactly when it is due. Disk writes
//! go through `spawn_blocking`, during which the clock does not jump (which is also why
//! the flight recorder, a long-lived blocking writer, is off here).
//!
//! The link's own timers (ping interval, pong timeout, reconnect backoff) wait on a real
//! socket and are covered by the integration tests (`tests/it/daemon.rs`, `faults/`).

use std::future::Future;
use std::path::PathBuf;

use super::*;
use crate::hub::link::OutFrame;
use crate::hub::proto::ReportAction;
use crate::runner::{Finished, Leftovers, TaskOutcome};
use crate::sandbox::Containment;
use crate::state::{read_state, OutboxEntry};
use crate::util::now_ms;

/// The test's side of the daemon: the link it plays and the state file.
struct Rig {
    events: mpsc::Sender<LinkEvent>,
    out: mpsc::Receiver<OutFrame>,
    shutdown: Shutdown,
    state_file: PathBuf,
    _dir: tempfile::TempDir,
}

/// What the state file holds before the daemon starts.
#[derive(Default)]
struct Seed {
    active: Option<ActiveTask>,
    outbox: Vec<OutboxEntry>,
}

fn task(task_id: &str) -> Task {
    serde_json::from_value(serde_json::json!({"task_id": task_id, "generation": 3}))
        .expect("a minimal task")
}

fn active(task_id: &str, phase: Phase) -> ActiveTask {
    ActiveTask {
        task: task(task_id),
        phase,
        accepted_at: now_ms(),
        trace: None,
        dirs: None,
    }
}

fn failed_entry(task_id: &str) -> OutboxEntry {
    OutboxEntry {
        task_id: task_id.into(),
        frame: Outbound::task_failed(task_id, 3, "left over"),
        created_at: now_ms(),
    }
}

/// A daemon over `seed`, not yet running, and the rig to drive it.
async fn daemon(seed: Seed, tweak: impl FnOnce(&mut Config)) -> (Daemon, Rig) {
    daemon_probed(seed, tweak, |cfg| {
        ProbeStage::Running(crate::sandbox::Probing::start(cfg.containment))
    })
    .await
}

/// [`daemon`] with the containment probe `probe` makes.
async fn daemon_probed(
    seed: Seed,
    tweak: impl FnOnce(&mut Config),
    probe: impl FnOnce(&Config) -> ProbeStage,
) -> (Daemon, Rig) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = Config::for_hub("ws://127.0.0.1:9", dir.path());
    // No namespace probe: nothing here spawns a process.
    cfg.containment = Some(Containment::Off);
    // The recorder's writer is a long-lived `spawn_blocking` task, and the paused clock never
    // jumps while one runs.
    cfg.recorder.enabled = false;
    tweak(&mut cfg);
    let seeded = StateStore::new(cfg.state_file());
    seeded.load().await.expect("empty state");
    for entry in seed.outbox {
        seeded.push(entry, None).await.1.expect("seed the outbox");
    }
    seeded.set_active(seed.active).await.expect("seed the task");
    let cfg = Arc::new(cfg);
    let state = load_state(&cfg).await.expect("load the seeded state");
    let budget = Arc::new(RateBudget::from_config(&cfg.progress));
    let (link, out) = link::channel();
    let (events, ev_rx) = mpsc::channel(16);
    let shutdown = Shutdown::new();
    let state_file = cfg.state_file();
    let link = super::Link {
        handle: link,
        events: ev_rx,
        announce: tokio::sync::watch::channel(None).0,
        budget,
    };
    let probe = probe(&cfg);
    let redactor = Arc::new(ChildEnv::from_config(&cfg).redactor(&cfg).await);
    let (d, _writer) = Daemon::new(
        cfg,
        shutdown.clone(),
        Ops::new(),
        link,
        state,
        probe,
        redactor,
    )
    .await;
    let rig = Rig {
        events,
        out,
        shutdown,
        state_file,
        _dir: dir,
    };
    (d, rig)
}

/// A runner that works until cancelled (or, `deaf`, ignores the cancel and works forever).
fn stand_in_runner(d: &mut Daemon, task_id: &str, deaf: bool) -> CancellationToken {
    let cancel = CancellationToken::new();
    let seen = cancel.clone();
    let handle = tokio::spawn(async move {
        if deaf {
            std::future::pending::<()>().await;
        }
        seen.cancelled().await;
        Finished {
            outcome: TaskOutcome::Cancelled,
            leftovers: Leftovers::nothing(),
        }
    });
    d.active = Some(active(task_id, Phase::Running));
    d.running = Some(Running {
        task_id: task_id.into(),
        cancel: cancel.clone(),
        handle,
        dropped: false,
        fence: crate::process::Fence::new(),
        sink: crate::progress::ProgressSink::new(1024),
        paused_at: None,
    });
    cancel
}

/// Run the daemon's loop in its own task; the daemon comes back with the exit reason.
fn start(mut d: Daemon) -> JoinHandle<(ExitReason, Daemon)> {
    tokio::spawn(async move {
        let reason = d.run().await;
        (reason, d)
    })
}

/// Has `fut` finished within `limit` of paused time?
async fn done_within(limit: Duration, fut: &mut (impl Future + Unpin)) -> bool {
    tokio::time::timeout(limit, fut).await.is_ok()
}

impl Rig {
    async fn identified(&self) {
        self.events
            .send(LinkEvent::Identified {
                epoch: 1,
                announced: "idle".into(),
            })
            .await
            .expect("the daemon hears the link");
    }

    /// The next frame the daemon gives the link.
    async fn next_out(&mut self) -> OutFrame {
        self.out.recv().await.expect("the daemon is running")
    }

    /// The next outbox frame (sent with a barrier ping behind it), skipping the
    /// `task_accepted` that precedes it after an identify.
    async fn next_result(&mut self) -> OutFrame {
        loop {
            let f = self.next_out().await;
            if f.barrier.is_some() {
                return f;
            }
        }
    }

    fn active_on_disk(&self) -> Option<ActiveTask> {
        read_state(&self.state_file).expect("state file").active
    }

    fn outbox_on_disk(&self) -> usize {
        read_state(&self.state_file)
            .expect("state file")
            .outbox
            .len()
    }
}

#[tokio::test(start_paused = true)]
async fn a_drain_gives_the_task_until_drain_timeout_then_cancels_it_and_keeps_it() {
    let (mut d, rig) = daemon(Seed::default(), |c| c.drain_timeout_secs = 30).await;
    let cancel = stand_in_runner(&mut d, "long", false);
    let mut run = start(d);
    let t0 = Instant::now();
    rig.shutdown.drain.cancel();
    assert!(
        !done_within(Duration::from_secs(29), &mut run).await,
        "stopped before the drain timeout"
    );
    assert!(!cancel.is_cancelled(), "the task was cancelled early");
    let (reason, d) = run.await.expect("daemon task");
    assert_eq!(reason, ExitReason::Aborted);
    assert_eq!(t0.elapsed(), Duration::from_secs(30));
    assert!(cancel.is_cancelled());
    assert_eq!(
        d.active.map(|a| a.phase),
        Some(Phase::Recovering),
        "kept for task_recovering"
    );
    assert_eq!(
        rig.active_on_disk().map(|a| a.phase),
        Some(Phase::Recovering)
    );
}

#[tokio::test(start_paused = true)]
async fn a_forced_stop_waits_out_the_kill_grace_for_a_runner_deaf_to_its_cancel() {
    let (mut d, rig) = daemon(Seed::default(), |c| c.executor.kill_grace_ms = 4_000).await;
    let cancel = stand_in_runner(&mut d, "deaf", true);
    let mut run = start(d);
    let t0 = Instant::now();
    rig.shutdown.abort.cancel();
    // The grace plus 2 s for the runner to report, then the runner is dropped.
    assert!(!done_within(Duration::from_millis(5_999), &mut run).await);
    let (reason, _) = run.await.expect("daemon task");
    assert_eq!(reason, ExitReason::Aborted);
    assert_eq!(t0.elapsed(), Duration::from_secs(6));
    assert!(cancel.is_cancelled());
    assert_eq!(
        rig.active_on_disk().map(|a| a.phase),
        Some(Phase::Recovering)
    );
}

#[tokio::test(start_paused = true)]
async fn an_immediate_stop_cuts_the_kill_grace_short() {
    let (mut d, rig) = daemon(Seed::default(), |c| c.executor.kill_grace_ms = 60_000).await;
    stand_in_runner(&mut d, "deaf", true);
    let run = start(d);
    let t0 = Instant::now();
    rig.shutdown.abort.cancel();
    rig.shutdown.immediate.cancel();
    let (reason, _) = run.await.expect("daemon task");
    assert_eq!(reason, ExitReason::Interrupted);
    assert_eq!(t0.elapsed(), Duration::ZERO, "waited for the grace");
    assert_eq!(
        rig.active_on_disk().map(|a| a.phase),
        Some(Phase::Recovering)
    );
}

#[tokio::test(start_paused = true)]
async fn a_drain_waits_at_most_outbox_flush_for_an_unanswered_result_and_keeps_it() {
    let seed = Seed {
        outbox: vec![failed_entry("unanswered")],
        ..Seed::default()
    };
    let (d, mut rig) = daemon(seed, |_| {}).await;
    let mut run = start(d);
    rig.identified().await;
    let sent = rig.next_result().await;
    assert_eq!(sent.barrier.as_deref(), Some("unanswered"));
    let t0 = Instant::now();
    rig.shutdown.drain.cancel();
    assert!(!done_within(OUTBOX_FLUSH - Duration::from_millis(1), &mut run).await);
    let (reason, _) = run.await.expect("daemon task");
    assert_eq!(reason, ExitReason::Drained);
    assert_eq!(t0.elapsed(), OUTBOX_FLUSH);
    assert_eq!(
        rig.outbox_on_disk(),
        1,
        "the result stays for the next start"
    );
}

#[tokio::test(start_paused = true)]
async fn a_drain_ends_as_soon_as_the_last_result_is_acknowledged() {
    let seed = Seed {
        outbox: vec![failed_entry("answered")],
        ..Seed::default()
    };
    let (d, mut rig) = daemon(seed, |_| {}).await;
    let run = start(d);
    rig.identified().await;
    rig.next_result().await;
    let t0 = Instant::now();
    rig.shutdown.drain.cancel();
    tokio::time::sleep(Duration::from_secs(3)).await;
    rig.events
        .send(LinkEvent::Frame(Inbound::TaskAck {
            task_id: "answered".into(),
            status: Some("received".into()),
        }))
        .await
        .unwrap();
    let (reason, _) = run.await.expect("daemon task");
    assert_eq!(reason, ExitReason::Drained);
    assert_eq!(t0.elapsed(), Duration::from_secs(3));
    assert_eq!(rig.outbox_on_disk(), 0);
}

/// A daemon started with `task_id` unfinished on disk (generation 3), identified, and its
/// `task_recovering` read.
async fn recovering(task_id: &str) -> (JoinHandle<(ExitReason, Daemon)>, Rig) {
    let seed = Seed {
        active: Some(active(task_id, Phase::Running)),
        ..Seed::default()
    };
    let (d, mut rig) = daemon(seed, |_| {}).await;
    let run = start(d);
    rig.identified().await;
    let asked = rig.next_out().await;
    assert!(
        matches!(&asked.frame, Outbound::TaskRecovering { task_id: t, generation: 3 } if t == task_id),
        "{asked:?}"
    );
    (run, rig)
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_task_recovering_is_given_up_after_a_minute() {
    // Drained a second either side of the deadline (at the deadline itself, which of the two
    // the loop sees first would be up to the scheduler).
    let second = Duration::from_secs(1);
    for (wait, kept) in [
        (RECOVERY_ANSWER - second, true),
        (RECOVERY_ANSWER + second, false),
    ] {
        let (run, rig) = recovering("crashed").await;
        tokio::time::sleep(wait).await;
        rig.shutdown.drain.cancel();
        let (reason, d) = run.await.expect("daemon task");
        assert_eq!(reason, ExitReason::Drained);
        assert_eq!(d.active.is_some(), kept, "after {wait:?}");
        assert_eq!(
            rig.active_on_disk().is_some(),
            kept,
            "on disk after {wait:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_result_the_hub_let_pass_is_sent_again_once_its_wait_is_over() {
    let seed = Seed {
        outbox: vec![failed_entry("dropped")],
        ..Seed::default()
    };
    let (d, mut rig) = daemon(seed, |_| {}).await;
    let run = start(d);
    rig.identified().await;
    rig.next_result().await;
    // The barrier's pong came back but no answer to the frame: the hub dropped it.
    let mut waits = Vec::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        rig.events
            .send(LinkEvent::Barrier {
                task_id: "dropped".into(),
            })
            .await
            .unwrap();
        let again = rig.next_result().await;
        assert_eq!(again.barrier.as_deref(), Some("dropped"));
        waits.push(t0.elapsed());
    }
    // Longer each time (the outbox's rule), and never sooner.
    assert_eq!(waits, [1, 2, 4].map(Duration::from_secs), "re-send waits");
    rig.shutdown.immediate.cancel();
    run.await.expect("daemon task");
}

#[tokio::test(start_paused = true)]
async fn wait_unless_immediate_waits_at_most_its_limit_and_not_at_all_once_cancelled() {
    let immediate = CancellationToken::new();
    let t0 = Instant::now();
    let quick = tokio::time::sleep(Duration::from_secs(1));
    assert!(
        wait_unless_immediate(&immediate, Duration::from_secs(5), quick)
            .await
            .is_some()
    );
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    let slow = std::future::pending::<()>();
    assert!(
        wait_unless_immediate(&immediate, Duration::from_secs(5), slow)
            .await
            .is_none()
    );
    assert_eq!(t0.elapsed(), Duration::from_secs(6));
    immediate.cancel();
    let slow = std::future::pending::<()>();
    assert!(
        wait_unless_immediate(&immediate, Duration::from_secs(5), slow)
            .await
            .is_none()
    );
    assert_eq!(t0.elapsed(), Duration::from_secs(6));
}

/// Feed the daemon one hub frame.
impl Rig {
    async fn hub_says(&self, frame: Inbound) {
        self.events
            .send(LinkEvent::Frame(frame))
            .await
            .expect("the daemon hears the link");
    }
}

#[tokio::test(start_paused = true)]
async fn a_continue_at_a_generation_never_accepted_drops_the_task_and_asks_whose_it_is() {
    // On disk at generation 3; the hub reclaimed it (4) and gave it to another agent (5).
    let (run, mut rig) = recovering("moved-on").await;
    rig.hub_says(Inbound::TaskContinue {
        task_id: "moved-on".into(),
        generation: Some(5),
    })
    .await;
    // Not `task_accepted`, nothing run: the question, at the hub's generation.
    let report = rig.next_out().await;
    assert!(
        matches!(&report.frame, Outbound::StateReport { task_id, generation: 5, status, .. }
            if task_id == "moved-on" && status == "dropped"),
        "{report:?}"
    );
    assert!(rig.active_on_disk().is_none(), "dropped from the disk too");
    // Another agent has it: nothing more is said about it.
    rig.hub_says(Inbound::StateReportAck {
        task_id: "moved-on".into(),
        action: ReportAction::Abort,
    })
    .await;
    rig.shutdown.drain.cancel();
    let (reason, d) = run.await.expect("daemon task");
    assert_eq!(reason, ExitReason::Drained);
    assert!(d.running.is_none() && d.active.is_none());
    assert!(d.outbox.is_empty(), "no result for a task that never ran");
    let mut rest = rig.out;
    while let Ok(f) = rest.try_recv() {
        assert!(
            !matches!(
                f.frame,
                Outbound::TaskAccepted { .. }
                    | Outbound::TaskComplete { .. }
                    | Outbound::TaskFailed { .. }
            ),
            "sent for a dropped task: {f:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_abort_for_the_generation_reported_spares_the_task_assigned_here_again_since() {
    let (mut d, mut rig) = daemon(Seed::default(), |_| {}).await;
    let cancel = stand_in_runner(&mut d, "kept", false);
    let run = start(d);
    // After the reconnect: the running task is accepted again and reported at generation 3.
    rig.identified().await;
    loop {
        let f = rig.next_out().await;
        if let Outbound::StateReport { generation, .. } = f.frame {
            assert_eq!(generation, 3);
            break;
        }
    }
    // The hub gave it to this agent again (generation 5) before it read the report, so it
    // answers the report of generation 3 with `abort`.
    let mut again = task("kept");
    again.generation = 5;
    rig.hub_says(Inbound::TaskAssign(Box::new(again))).await;
    rig.hub_says(Inbound::StateReportAck {
        task_id: "kept".into(),
        action: ReportAction::Abort,
    })
    .await;
    // The same assignment once more: its `task_accepted` shows the abort was handled.
    let mut once_more = task("kept");
    once_more.generation = 5;
    rig.hub_says(Inbound::TaskAssign(Box::new(once_more))).await;
    let mut accepted = 0;
    while accepted < 2 {
        let f = rig.next_out().await;
        assert!(!matches!(f.frame, Outbound::TaskFailed { .. }), "{f:?}");
        if matches!(f.frame, Outbound::TaskAccepted { .. }) {
            accepted += 1;
        }
    }
    assert!(
        !cancel.is_cancelled(),
        "the task assigned again was stopped"
    );
    assert_eq!(rig.active_on_disk().map(|a| a.task.generation), Some(5));
    rig.shutdown.immediate.cancel();
    run.await.expect("daemon task");
}

#[tokio::test(start_paused = true)]
async fn a_task_paused_by_a_dropped_link_is_killed_at_fence_timeout_and_not_before() {
    let (mut d, mut rig) = daemon(Seed::default(), |c| c.fence_timeout_secs = 600).await;
    let cancel = stand_in_runner(&mut d, "cut", false);
    let fence = d.running.as_ref().expect("running").fence.clone();
    let run = start(d);
    rig.identified().await;
    rig.events
        .send(LinkEvent::Disconnected {
            reason: "cut".into(),
        })
        .await
        .expect("the daemon hears the link");
    let t0 = Instant::now();
    while !fence.is_paused() {
        tokio::task::yield_now().await;
    }
    // The link comes back and the question goes out; the hub never answers it.
    rig.events
        .send(LinkEvent::Identified {
            epoch: 2,
            announced: "idle".into(),
        })
        .await
        .unwrap();
    loop {
        let f = rig.next_out().await;
        assert!(
            !matches!(&f.frame, Outbound::TaskAccepted { task_id } if task_id == "cut" && f.epoch == 2),
            "a paused task accepted before the hub's answer: {f:?}"
        );
        if let Outbound::StateReport { status, .. } = &f.frame {
            if status == "paused" {
                break;
            }
        }
    }
    assert!(!cancel.is_cancelled(), "killed on the drop itself");
    cancel.cancelled().await;
    assert_eq!(t0.elapsed(), Duration::from_secs(600));
    assert_eq!(
        rig.active_on_disk().map(|a| a.task.task_id),
        None,
        "the slot was not freed"
    );
    rig.shutdown.immediate.cancel();
    run.await.expect("daemon task");
}

#[tokio::test(start_paused = true)]
async fn continue_at_our_generation_resumes_a_paused_task_and_accepts_it_again() {
    let (mut d, mut rig) = daemon(Seed::default(), |_| {}).await;
    let cancel = stand_in_runner(&mut d, "kept", false);
    let fence = d.running.as_ref().expect("running").fence.clone();
    let run = start(d);
    rig.events
        .send(LinkEvent::Disconnected {
            reason: "hub killed".into(),
        })
        .await
        .unwrap();
    rig.identified().await;
    loop {
        if let Outbound::StateReport { generation, .. } = rig.next_out().await.frame {
            assert_eq!(generation, 3);
            break;
        }
    }
    assert!(fence.is_paused());
    rig.hub_says(Inbound::StateReportAck {
        task_id: "kept".into(),
        action: ReportAction::Continue,
    })
    .await;
    loop {
        if let Outbound::TaskAccepted { task_id } = rig.next_out().await.frame {
            assert_eq!(task_id, "kept");
            break;
        }
    }
    assert!(!fence.is_paused(), "not resumed");
    assert!(!cancel.is_cancelled());
    rig.shutdown.immediate.cancel();
    run.await.expect("daemon task");
}

/// The probe answers after the first `identify` (figure 1): an assignment that arrives
/// before its answer waits for it and is then taken, never refused for want of an answer
/// (a `task_failed` would cost the hub a retry of the task).
#[tokio::test(start_paused = true)]
async fn an_assignment_before_the_probe_answers_waits_for_the_answer() {
    let (answer, answered) = tokio::sync::oneshot::channel();
    let (d, mut rig) = daemon_probed(
        Seed::default(),
        // Strict, the default: until the probe answers, a machine that cannot confine.
        |c| c.containment = None,
        |cfg| {
            ProbeStage::Running(crate::sandbox::Probing::answered_by(
                cfg.containment,
                answered,
            ))
        },
    )
    .await;
    let run = start(d);
    rig.identified().await;
    rig.hub_says(Inbound::TaskAssign(Box::new(task("early"))))
        .await;
    assert!(
        tokio::time::timeout(Duration::from_secs(60), rig.out.recv())
            .await
            .is_err(),
        "the assignment was answered before the probe was"
    );
    // The probe finds a machine that confines (a stand-in: nothing runs the task for real
    // before the test stops the daemon).
    let full = crate::sandbox::Support {
        landlock_abi: 6,
        namespaces: Ok(()),
        refused: Default::default(),
    };
    let _ = answer.send(crate::sandbox::Policy::decide(None, full));
    let first = rig.next_out().await;
    assert_eq!(
        first.frame,
        Outbound::TaskAccepted {
            task_id: "early".into()
        },
        "{first:?}"
    );
    rig.shutdown.immediate.cancel();
    let _ = run.await;
}
