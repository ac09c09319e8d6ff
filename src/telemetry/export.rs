//! The way out of the process: a bounded queue in front of the OTLP exporter, drained by
//! one thread of its own, so that export never blocks, slows or fails a task.
//!
//! The SDK's own batch processor counts what it drops only in its internal log; the
//! operator must see it in `/metrics`. So this processor keeps the same shape (bounded
//! queue, batches, a delay) and counts: a span that finds the queue full, and every span
//! of a batch the collector did not take (down, slow past the timeout, refusing), is
//! added to `hub_sidecar_otel_spans_dropped`, and the first drop is said in the log once.
//! Nothing is retried: a trace with a hole is better than a daemon that hoards spans.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;

/// What the queue and its thread share: the drop count and whether it was said.
#[derive(Debug, Clone)]
pub(super) struct Drops {
    /// `hub_sidecar_otel_spans_dropped`.
    counter: Counter,
    said: Arc<AtomicBool>,
}

impl Drops {
    pub(super) fn new(counter: Counter) -> Drops {
        Drops {
            counter,
            said: Arc::new(AtomicBool::new(false)),
        }
    }

    fn add(&self, n: usize, why: &dyn std::fmt::Display) {
        self.counter.inc_by(n as u64);
        if !self.said.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                dropped = n,
                reason = %why,
                "OpenTelemetry export: spans dropped (said once; hub_sidecar_otel_spans_dropped counts them): check [otel] endpoint and that the collector is up"
            );
        }
    }
}

enum Msg {
    Span(Box<SpanData>),
    /// Export what is queued, then answer.
    Flush(SyncSender<()>),
}

/// How the queue batches.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batching {
    pub max_queue: usize,
    pub max_batch: usize,
    pub delay: Duration,
}

/// The span processor: `on_end` only ever `try_send`s.
#[derive(Debug)]
pub(super) struct Queue {
    tx: Mutex<Option<SyncSender<Msg>>>,
    drops: Drops,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Closed by the export thread as it ends.
    ended: Mutex<mpsc::Receiver<()>>,
}

impl Queue {
    /// Start the export thread around `exporter` (its resource already set).
    pub(super) fn start<E: SpanExporter + 'static>(
        exporter: E,
        batching: Batching,
        drops: Drops,
    ) -> std::io::Result<Queue> {
        let (tx, rx) = mpsc::sync_channel(batching.max_queue);
        let (ending, ended) = mpsc::sync_channel::<()>(0);
        let worker = {
            let drops = drops.clone();
            std::thread::Builder::new()
                .name("otel-export".into())
                .spawn(move || {
                    drain(exporter, rx, batching, drops);
                    drop(ending);
                })?
        };
        Ok(Queue {
            tx: Mutex::new(Some(tx)),
            drops,
            worker: Mutex::new(Some(worker)),
            ended: Mutex::new(ended),
        })
    }

    fn sender(&self) -> Option<SyncSender<Msg>> {
        self.tx.lock().ok().and_then(|t| t.clone())
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let Some(tx) = self.sender() else { return };
        match tx.try_send(Msg::Span(Box::new(span))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.drops.add(1, &"the export queue is full"),
            Err(TrySendError::Disconnected(_)) => self.drops.add(1, &"the exporter stopped"),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        let Some(tx) = self.sender() else {
            return Err(OTelSdkError::AlreadyShutdown);
        };
        let (done, wait) = mpsc::sync_channel(1);
        // Blocking here is the caller's choice (shutdown, off the runtime): the queue may
        // be full, and the flush must come after what it holds.
        tx.send(Msg::Flush(done))
            .map_err(|_| OTelSdkError::AlreadyShutdown)?;
        wait.recv().map_err(|_| OTelSdkError::AlreadyShutdown)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        // Closing the channel ends the thread once it has exported what was queued.
        let tx = self.tx.lock().ok().and_then(|mut t| t.take());
        drop(tx);
        let worker = self.worker.lock().ok().and_then(|mut w| w.take());
        let Some(worker) = worker else {
            return Err(OTelSdkError::AlreadyShutdown);
        };
        let ended = self
            .ended
            .lock()
            .map(|e| e.recv_timeout(timeout))
            .unwrap_or(Err(RecvTimeoutError::Disconnected));
        match ended {
            // Left to end by itself: a collector that hangs must not hold the exit.
            Err(RecvTimeoutError::Timeout) => Err(OTelSdkError::Timeout(timeout)),
            _ => {
                let _ = worker.join();
                Ok(())
            }
        }
    }
}

/// The export thread: batches of up to `max_batch`, sent when full, `delay` after their
/// first span, on a flush, or when the queue closes.
fn drain<E: SpanExporter>(mut exporter: E, rx: mpsc::Receiver<Msg>, b: Batching, drops: Drops) {
    let mut batch: Vec<SpanData> = Vec::new();
    let mut due: Option<Instant> = None;
    loop {
        let msg = match due {
            Some(t) => rx.recv_timeout(t.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match msg {
            Ok(Msg::Span(span)) => {
                batch.push(*span);
                due.get_or_insert_with(|| Instant::now() + b.delay);
                if batch.len() >= b.max_batch {
                    send(&exporter, &mut batch, &drops);
                    due = None;
                }
            }
            Ok(Msg::Flush(done)) => {
                send(&exporter, &mut batch, &drops);
                due = None;
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Timeout) => {
                send(&exporter, &mut batch, &drops);
                due = None;
            }
            Err(RecvTimeoutError::Disconnected) => {
                send(&exporter, &mut batch, &drops);
                let _ = exporter.shutdown();
                return;
            }
        }
    }
}

fn send<E: SpanExporter>(exporter: &E, batch: &mut Vec<SpanData>, drops: &Drops) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::take(batch);
    let n = spans.len();
    // The HTTP client is the blocking one: this thread is the only one that waits on it.
    if let Err(e) = futures_executor::block_on(exporter.export(spans)) {
        drops.add(n, &e);
    }
}
