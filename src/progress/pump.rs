//! Sending one task's progress under the hub's budget: a [`Pump`] turns what the task's
//! [`ProgressSink`] merged into at most one `task_progress` frame per budget token, a
//! heartbeat frame when the task is quiet, and at the end either one last frame or the last
//! batch handed back for the terminal frame to carry.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::hub::budget::RateBudget;
use crate::hub::proto::Outbound;
use crate::redact::Redactor;

use super::{ProgressEvent, ProgressSink};

/// Where the pump sends its frames (the hub link, or a test's channel).
pub trait FrameSender: Send + Sync {
    /// Queue one `task_progress` frame; the budget was already taken for it.
    fn send_progress(&self, frame: Outbound);
}

/// Turns one task's pending progress into `task_progress` frames under the budget.
pub struct Pump {
    /// The task's sink, which executors and checks emit into.
    pub sink: ProgressSink,
    /// The task the frames are about.
    pub task_id: String,
    /// The hub's "normal" bucket, shared with lifecycle frames (whose reserve it keeps).
    pub budget: Arc<RateBudget>,
    /// Where frames go: the hub link, or a test's channel.
    pub out: Arc<dyn FrameSender>,
    /// Scrubs secrets from every event before it leaves.
    pub redactor: Arc<Redactor>,
    /// At most one frame per this interval.
    pub min_interval: Duration,
    /// A frame at least this often, even when nothing happened.
    pub heartbeat: Duration,
    /// Cancelled when the task is taken away (the hub cancelled it, an abort, a forced
    /// stop). The hub deletes a cancelled task, so progress still pending for it would only
    /// spend budget: it is discarded instead of flushed.
    pub dropped: CancellationToken,
    /// The task's fence as its watch (`true`: closed), when it has one: while closed,
    /// pending progress is held here, not sent, and goes out once it opens. Closed before
    /// `task_accepted` is sent (the task is being prepared beside the durable write of its
    /// assignment) and while the hub link is down (the task may not be ours any more).
    pub held: Option<watch::Receiver<bool>>,
}

impl Pump {
    /// Run until `cancel`. Returns the last batch when the budget had no room for it (the
    /// runner puts it in the terminal frame, so it is never lost).
    pub async fn run(self, cancel: CancellationToken) -> Option<Value> {
        let Pump {
            sink,
            task_id,
            budget,
            out,
            redactor,
            min_interval,
            heartbeat,
            dropped,
            mut held,
        } = self;
        let send = |mut event: Value| {
            redactor.scrub_value(&mut event);
            out.send_progress(Outbound::TaskProgress {
                task_id: task_id.clone(),
                progress: None,
                execution_event: Some(event),
            });
        };
        let mut last_sent = tokio::time::Instant::now();
        'run: loop {
            // An own-frame event still waiting (several arrived within one interval) is
            // sent next without waiting for another change.
            if !sink.own_frame_pending() {
                let beat = tokio::time::sleep_until(last_sent + heartbeat);
                tokio::select! {
                    _ = cancel.cancelled() => break 'run,
                    _ = sink.changed() => {}
                    _ = beat => {
                        sink.emit(ProgressEvent::status("still working"));
                    }
                }
            }
            // Let events accumulate: one frame per interval at most.
            tokio::select! {
                _ = cancel.cancelled() => break 'run,
                _ = tokio::time::sleep_until(last_sent + min_interval) => {}
            }
            // Held behind a closed fence before the budget is asked: a token is taken when
            // its frame can leave, not minutes before.
            if let Some(rx) = held.as_mut() {
                tokio::select! {
                    _ = cancel.cancelled() => break 'run,
                    // A fence gone with its task holds nothing back any more.
                    _ = rx.wait_for(|closed| !closed) => {}
                }
            }
            loop {
                match budget.try_progress() {
                    Ok(()) => break,
                    Err(wait) => tokio::select! {
                        _ = cancel.cancelled() => break 'run,
                        _ = tokio::time::sleep(wait) => {}
                    },
                }
            }
            if let Some(event) = sink.take_event() {
                send(event);
                last_sent = tokio::time::Instant::now();
            }
        }
        if dropped.is_cancelled() {
            let discarded = sink.take_merged().is_some();
            tracing::debug!(task_id = %task_id, discarded, "task dropped: pending progress discarded");
            return None;
        }
        // The task ended: what is still pending (often the verdict's events) goes out now,
        // ahead of the terminal frame, each own-frame event in a frame of its own, while
        // the budget above the reserve allows. The rest is handed back as one merged
        // event, for the terminal frame to carry: waiting for the budget would hold up the
        // result, and sending past the reserve would starve the lifecycle frames.
        while sink.pending() {
            if budget.try_progress().is_err() {
                tracing::info!(task_id = %task_id, "the task's last progress batch goes with its result: no budget above the reserve");
                return sink.take_merged();
            }
            match sink.take_event() {
                Some(event) => send(event),
                None => break,
            }
        }
        None
    }
}

/// The hub link is where a task's progress frames go in the daemon.
impl FrameSender for crate::hub::link::LinkHandle {
    fn send_progress(&self, frame: Outbound) {
        self.send(frame);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::EventKind;
    use std::sync::Mutex;

    struct Frames(Mutex<Vec<Outbound>>);

    impl FrameSender for Frames {
        fn send_progress(&self, frame: Outbound) {
            self.0.lock().unwrap().push(frame);
        }
    }

    /// A pump from `sink` into `out` as the tests start it: a budget of 60 with no reserve,
    /// an hour between frames and between heartbeats, never dropped, nothing held. Each
    /// test changes the fields it is about.
    fn pump_into(sink: &ProgressSink, out: &Arc<Frames>) -> Pump {
        Pump {
            sink: sink.clone(),
            task_id: "t".into(),
            budget: Arc::new(RateBudget::new(60, 60, 0)),
            out: out.clone(),
            redactor: Arc::new(Redactor::new(Vec::new())),
            min_interval: Duration::from_secs(3600),
            heartbeat: Duration::from_secs(3600),
            dropped: CancellationToken::new(),
            held: None,
        }
    }

    /// [`pump_into`] behind a closed fence (a task not yet accepted), quick to send once it
    /// opens; the fence's sender (`false` opens it).
    fn held_pump(
        sink: &ProgressSink,
        out: &Arc<Frames>,
    ) -> (tokio::sync::watch::Sender<bool>, Pump) {
        let (fence, held) = tokio::sync::watch::channel(true);
        let pump = Pump {
            min_interval: Duration::from_millis(10),
            held: Some(held),
            ..pump_into(sink, out)
        };
        (fence, pump)
    }

    async fn pump_until_stopped(dropped: bool) -> usize {
        let sink = ProgressSink::new(8192);
        let frames = Arc::new(Frames(Mutex::new(Vec::new())));
        let task_cancel = CancellationToken::new();
        let stop = task_cancel.child_token();
        let pump = Pump {
            dropped: task_cancel.clone(),
            ..pump_into(&sink, &frames)
        };
        sink.emit(ProgressEvent::status("queued before the end"));
        if dropped {
            task_cancel.cancel();
        } else {
            stop.cancel();
        }
        pump.run(stop).await;
        let n = frames.0.lock().unwrap().len();
        n
    }

    /// Behind a closed fence (the assignment not yet durable and acknowledged, or the link
    /// down) progress is held, not sent and not lost: it leaves once the fence opens.
    #[tokio::test(start_paused = true)]
    async fn progress_behind_a_closed_fence_is_held_then_sent_when_it_opens() {
        let sink = ProgressSink::new(8192);
        let frames = Arc::new(Frames(Mutex::new(Vec::new())));
        let (fence, pump) = held_pump(&sink, &frames);
        let stop = CancellationToken::new();
        let running = tokio::spawn(pump.run(stop.clone()));
        sink.emit(ProgressEvent::status("task accepted"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            frames.0.lock().unwrap().is_empty(),
            "sent behind a closed fence"
        );
        fence.send_replace(false);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let sent = frames.0.lock().unwrap().len();
        assert_eq!(sent, 1, "not sent once the fence opened");
        stop.cancel();
        running.await.unwrap();
    }

    /// A pump held behind a closed fence takes no token of the hub's budget while it waits:
    /// a token is spent when its frame can leave (the fence may stay closed for minutes).
    #[tokio::test(start_paused = true)]
    async fn a_held_pump_takes_no_budget_token_while_the_fence_is_closed() {
        let sink = ProgressSink::new(8192);
        let frames = Arc::new(Frames(Mutex::new(Vec::new())));
        let (_fence, pump) = held_pump(&sink, &frames);
        // One token and no refill: whoever takes it has it.
        let budget = Arc::new(RateBudget::new(1, 0, 0));
        let stop = CancellationToken::new();
        let pump = Pump {
            budget: budget.clone(),
            ..pump
        };
        let running = tokio::spawn(pump.run(stop.clone()));
        sink.emit(ProgressEvent::status("task accepted"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            budget.try_progress().is_ok(),
            "the held pump took the budget's token"
        );
        stop.cancel();
        running.await.unwrap();
    }

    #[tokio::test]
    async fn a_dropped_task_pending_progress_is_discarded_a_finished_one_flushed() {
        assert_eq!(pump_until_stopped(false).await, 1);
        assert_eq!(pump_until_stopped(true).await, 0);
    }

    #[tokio::test]
    async fn the_last_batch_is_handed_back_when_the_budget_has_no_room() {
        let budget = Arc::new(RateBudget::new(2, 60, 1));
        let sink = ProgressSink::new(8192);
        let out = Arc::new(Frames(Mutex::new(Vec::new())));
        let pump = |budget: Arc<RateBudget>| Pump {
            budget,
            ..pump_into(&sink, &out)
        };
        // Room: sent as a frame, nothing handed back.
        sink.emit(ProgressEvent::new(EventKind::Status, "first"));
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert_eq!(pump(budget.clone()).run(cancel).await, None);
        assert_eq!(out.0.lock().unwrap().len(), 1);
        // At the reserve: handed back whole, fields included.
        assert!(budget.try_progress().is_err(), "at the reserve now");
        sink.emit(
            ProgressEvent::new(EventKind::VerificationRetryComplete, "verdict").with("attempt", 1),
        );
        let cancel = CancellationToken::new();
        cancel.cancel();
        let back = pump(budget)
            .run(cancel)
            .await
            .expect("handed back, not dropped");
        assert_eq!(back["event_type"], "verification_retry_complete");
        assert_eq!(back["attempt"], 1);
        assert_eq!(out.0.lock().unwrap().len(), 1);
    }

    /// Own-frame events queued together leave as frames of their own, one per interval,
    /// without another event to wake the pump; and at the end, each while the budget has
    /// room, the rest merged for the terminal frame.
    #[tokio::test(start_paused = true)]
    async fn queued_own_frame_events_each_get_a_frame() {
        let sink = ProgressSink::new(8192);
        let out = Arc::new(Frames(Mutex::new(Vec::new())));
        let pump = |budget: Arc<RateBudget>| Pump {
            budget,
            min_interval: Duration::from_secs(1),
            ..pump_into(&sink, &out)
        };
        let verdicts = |n: u32| {
            for k in 1..=n {
                sink.emit(
                    ProgressEvent::new(EventKind::VerificationRetryComplete, format!("v{k}"))
                        .with("run_number", k),
                );
            }
        };
        let sent = || -> Vec<Value> {
            out.0
                .lock()
                .unwrap()
                .iter()
                .map(|f| match f {
                    Outbound::TaskProgress {
                        execution_event: Some(e),
                        ..
                    } => e.clone(),
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let cancel = CancellationToken::new();
        let running = tokio::spawn(pump(Arc::new(RateBudget::new(60, 60, 0))).run(cancel.clone()));
        verdicts(3);
        // Paused time: each sleep lets the pump's interval pass.
        for _ in 0..10 {
            if sent().len() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let runs: Vec<Value> = sent().iter().map(|e| e["run_number"].clone()).collect();
        assert_eq!(runs, [1, 2, 3], "one frame each");
        cancel.cancel();
        assert_eq!(running.await.unwrap(), None);

        // At the end: room for two frames above the reserve, the third is handed back.
        let budget = Arc::new(RateBudget::new(3, 60, 1));
        out.0.lock().unwrap().clear();
        verdicts(3);
        let cancel = CancellationToken::new();
        cancel.cancel();
        let back = pump(budget)
            .run(cancel)
            .await
            .expect("the rest handed back");
        let runs: Vec<Value> = sent().iter().map(|e| e["run_number"].clone()).collect();
        assert_eq!(runs, [1, 2]);
        assert_eq!(back["run_number"], 3);
    }
}
