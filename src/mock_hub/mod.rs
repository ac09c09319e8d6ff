//! An in-process AgentCom hub on loopback for integration tests, the `demo` subcommand and
//! benchmarks.
//!
//! It owns a real WebSocket server on `127.0.0.1:0` that behaves like the hub described in
//! PROTOCOL.md: identify and auth, ping/pong, per-type schema validation with the violation
//! cut-off, the per-agent token-bucket rate limiter, a task table with generations, recovery
//! answers, reclaim-on-disconnect, the idle timeout, and "hub crash" via [`MockHub::stop`] /
//! [`MockHub::restart`]. Every frame in both directions is recorded so tests can assert on
//! what the sidecar actually put on the wire.
//!
//! # Layout
//!
//! - [`schema`]: the validator, over raw `serde_json::Value` (independent of our own wire
//!   types, so it catches our serialisation bugs).
//! - this file: the server (accept loop, one task per connection), the shared state behind one
//!   std mutex that is never held across an `.await`, and the test-facing handle.
//!
//! # Deviations from the real hub
//!
//! - Violations close the socket with 1008 but do not start a cooldown by themselves; tests
//!   arm it explicitly with [`MockHub::set_cooldown`].
//! - `task_failed` always re-queues (`retried`); there is no retry budget / dead letter.
//! - Chat traffic (`message`, `channel_*`, …) is validated and answered minimally, never routed.

pub mod schema;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch, Notify};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

/// Violations inside [`VIOLATION_WINDOW`] that make the hub close the socket.
const MAX_VIOLATIONS: usize = 10;
const VIOLATION_WINDOW: Duration = Duration::from_secs(60);
/// The limiter warns once fewer than this share of a bucket's capacity remains.
const WARN_SHARE: f64 = 0.2;

/// How the mock hub behaves. `Default` mirrors the real hub's defaults.
#[derive(Debug, Clone)]
pub struct MockHubOptions {
    /// Accepted `(agent_id, token)` pairs.
    pub agents: Vec<(String, String)>,
    /// Emulate the hub's per-agent token-bucket limiter.
    pub rate_limit: bool,
    /// Normal tier bucket size (lifecycle and any other known type).
    pub normal_capacity: u32,
    /// Normal tier refill per minute.
    pub normal_per_minute: u32,
    /// Light tier bucket size (`ping`, `status`, listings).
    pub light_capacity: u32,
    /// Light tier refill per minute.
    pub light_per_minute: u32,
    /// Heavy tier bucket size (`identify` on an identified socket).
    pub heavy_capacity: u32,
    /// Heavy tier refill per minute.
    pub heavy_per_minute: u32,
    /// Close a socket that sent nothing for this long with code 1002 (the hub's web server
    /// idle timeout). `None` disables it.
    pub idle_timeout: Option<Duration>,
    /// Loopback port to listen on; 0 (the default, and what tests use) picks a free one.
    pub port: u16,
}

impl Default for MockHubOptions {
    fn default() -> Self {
        Self {
            agents: vec![("sidecar-test".into(), "test-token".into())],
            rate_limit: true,
            normal_capacity: 60,
            normal_per_minute: 60,
            light_capacity: 120,
            light_per_minute: 120,
            heavy_capacity: 10,
            heavy_per_minute: 10,
            idle_timeout: Some(Duration::from_secs(60)),
            port: 0,
        }
    }
}

/// One frame seen on the wire.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Connection id (unique across restarts, starting at 1).
    pub conn: u64,
    /// When it was received or sent.
    pub at: Instant,
    /// `true` when the sidecar sent it.
    pub inbound: bool,
    /// The decoded frame; non-JSON text is stored as `Value::String`, binary as a
    /// `"<binary N bytes>"` string, a close frame (either direction) as
    /// `{"type":"<close>","code":N,"reason":S}` (1005 when the frame had no code).
    pub frame: Value,
}

/// A frame the hub's validator rejected (or that would crash the real hub).
#[derive(Debug, Clone)]
pub struct Violation {
    /// Connection id.
    pub conn: u64,
    /// The offending frame (as in [`Recorded::frame`]).
    pub frame: Value,
    /// Human-readable errors, one per field.
    pub errors: Vec<String>,
}

/// The hub's answer to `task_recovering`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryAnswer {
    /// `task_continue`: the task stays with the agent.
    Continue,
    /// `task_reassign`: the hub re-queues it; the sidecar drops it.
    Reassign,
}

/// Where a task stands in the mock's task table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MockTaskState {
    /// Sent to an agent, not yet accepted.
    Assigned,
    /// The agent sent `task_accepted`.
    Accepted,
    /// Back in the queue (disconnect, `task_failed`, `task_reassign`).
    Queued,
    /// `task_complete` was accepted.
    Complete,
}

/// One row of the mock's task table.
#[derive(Debug, Clone)]
pub struct MockTask {
    /// Task id.
    pub task_id: String,
    /// Current generation; bumped on every re-queue.
    pub generation: u64,
    /// Agent it was last assigned to.
    pub agent: String,
    /// Current state.
    pub state: MockTaskState,
}

impl MockTask {
    fn in_flight(&self) -> bool {
        matches!(
            self.state,
            MockTaskState::Assigned | MockTaskState::Accepted
        )
    }
}

/// Limiter tiers, as the hub names them on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Tier {
    Light,
    Normal,
    Heavy,
}

impl Tier {
    fn of(ty: &str) -> Tier {
        match ty {
            "identify" => Tier::Heavy,
            "ping" | "status" | "list_agents" | "list_channels" | "channel_history" => Tier::Light,
            _ => Tier::Normal,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Tier::Light => "light",
            Tier::Normal => "normal",
            Tier::Heavy => "heavy",
        }
    }
}

/// A token bucket with lazy continuous refill (like the hub's ETS buckets).
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

enum Verdict {
    Allow,
    Warn { remaining: u64, capacity: u64 },
    Deny { retry_after_ms: u64 },
}

/// What a connection task sends; pushes from the test go through this too, so every outbound
/// frame is recorded in one place, in send order.
#[derive(Debug)]
enum Outbound {
    Json(Value),
    Text(String),
    Binary(Vec<u8>),
    Close(u16, String),
}

#[derive(Debug)]
struct ConnEntry {
    tx: mpsc::UnboundedSender<Outbound>,
    /// Set once `identify` succeeded.
    agent: Option<String>,
}

/// Everything mutable, behind one std mutex (never held across an `.await`).
#[derive(Default)]
struct State {
    frames: Vec<Recorded>,
    violations: Vec<Violation>,
    tasks: HashMap<String, MockTask>,
    conns: HashMap<u64, ConnEntry>,
    /// Keyed by agent so they survive reconnects, like the hub's ETS table.
    buckets: HashMap<(String, Tier), Bucket>,
    cooldown: Option<(Instant, Duration)>,
    recovery: HashMap<String, RecoveryAnswer>,
    state_report_actions: HashMap<String, String>,
    ack_terminal_off: bool,
    /// Tasks whose terminal frames are swallowed (see [`MockHub::set_ignore_terminal`]).
    ignore_terminal: std::collections::HashSet<String>,
    rate_limited: u64,
    acked_terminal: HashMap<String, u32>,
}

struct Inner {
    opts: MockHubOptions,
    addr: SocketAddr,
    state: Mutex<State>,
    /// Woken on every inbound frame (for `wait_for*`).
    inbound: Notify,
    running: AtomicBool,
    /// Cancelled when the last `MockHub` handle is dropped.
    root: CancellationToken,
    /// Cancelled by `stop()`; a fresh child of `root` per run.
    run: Mutex<CancellationToken>,
    tracker: TaskTracker,
    next_conn: AtomicU64,
    connections_total: AtomicU64,
    stall: watch::Sender<bool>,
    /// While stopped: the port, bound but not listening, so connects are refused (like a
    /// dead hub) and no other test's server can take the port before `restart()`.
    port_hold: Mutex<Option<TcpSocket>>,
}

/// Handle to a running mock hub. Cheap to clone; dropping the last clone stops everything.
#[derive(Clone)]
pub struct MockHub {
    inner: Arc<Inner>,
    /// Only handles hold this (never the server tasks), so the last handle dropped cancels
    /// the root token and the server tasks wind down.
    _guard: Arc<DropGuard>,
}

impl MockHub {
    /// Starts a hub on `127.0.0.1:opts.port` (0: a free port).
    pub async fn start(opts: MockHubOptions) -> std::io::Result<MockHub> {
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], opts.port)))?;
        let addr = listener.local_addr()?;
        let root = CancellationToken::new();
        let inner = Arc::new(Inner {
            opts,
            addr,
            state: Mutex::new(State::default()),
            inbound: Notify::new(),
            running: AtomicBool::new(false),
            run: Mutex::new(root.child_token()),
            root: root.clone(),
            tracker: TaskTracker::new(),
            next_conn: AtomicU64::new(1),
            port_hold: Mutex::new(None),
            connections_total: AtomicU64::new(0),
            stall: watch::Sender::new(false),
        });
        inner.launch(listener);
        Ok(MockHub {
            inner,
            _guard: Arc::new(root.drop_guard()),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// `ws://127.0.0.1:PORT/ws`.
    pub fn url(&self) -> String {
        format!("ws://{}/ws", self.inner.addr)
    }

    /// Simulates a hub crash: closes the listener and drops every socket without a close
    /// frame. The task table, limiter buckets and records are kept (the hub's table is on
    /// disk), so nothing is re-queued.
    pub async fn stop(&self) {
        self.inner.running.store(false, Ordering::SeqCst);
        let run = self.inner.run_token();
        run.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        self.inner.tracker.reopen();
        self.inner.lock().conns.clear();
        let hold = TcpSocket::new_v4().and_then(|sock| {
            sock.set_reuseaddr(true)?;
            sock.bind(self.inner.addr)?;
            Ok(sock)
        });
        *self
            .inner
            .port_hold
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = hold.ok();
    }

    /// Binds the same port again and serves. Retries briefly while the port is still busy.
    /// Like a restarted hub, the limiter starts with full buckets (the real one keeps them in
    /// memory); the task table survives.
    pub async fn restart(&self) -> std::io::Result<()> {
        if self.is_running() {
            return Ok(());
        }
        self.inner.lock().buckets.clear();
        let mut attempt = 0;
        let listener = loop {
            match bind(self.inner.addr) {
                Ok(l) => break l,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && attempt < 50 => {
                    attempt += 1;
                    // The kernel gives no event for "port freed"; a short retry is the only way.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        };
        // Listening now: the placeholder that kept the port ours can go.
        self.inner
            .port_hold
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        *self.inner.run.lock().unwrap_or_else(|p| p.into_inner()) = self.inner.root.child_token();
        self.inner.launch(listener);
        Ok(())
    }

    /// Whether the listener is up.
    pub fn is_running(&self) -> bool {
        self.inner.running.load(Ordering::SeqCst)
    }

    /// WebSocket connections accepted since start (across restarts).
    pub fn connections_total(&self) -> u64 {
        self.inner.connections_total.load(Ordering::SeqCst)
    }

    /// Whether an identified socket is open now.
    pub fn connected(&self) -> bool {
        self.inner.lock().conns.values().any(|c| c.agent.is_some())
    }

    /// Sends a JSON text frame to every identified socket; `false` if there is none.
    pub fn push(&self, frame: Value) -> bool {
        self.inner.push_identified(|| Outbound::Json(frame.clone()))
    }

    /// Sends raw text (garbage tests).
    pub fn push_text(&self, text: &str) -> bool {
        self.inner
            .push_identified(|| Outbound::Text(text.to_string()))
    }

    /// Sends a binary frame.
    pub fn push_binary(&self, bytes: Vec<u8>) -> bool {
        self.inner
            .push_identified(|| Outbound::Binary(bytes.clone()))
    }

    /// Closes the identified socket(s) with a close frame. The hub counts this as a
    /// disconnect, so the agent's in-flight tasks are re-queued.
    pub fn close_current(&self, code: u16, reason: &str) -> bool {
        self.inner
            .push_identified(|| Outbound::Close(code, reason.to_string()))
    }

    /// Registers `task` in the task table (generation from the value, else the table's, else
    /// 1), fills `type` and `assigned_at`, pushes it and returns the frame sent. The task is
    /// assigned to the identified agent (or the first configured one when none is connected).
    /// To re-assign a re-queued task at its new generation, pass a value without
    /// `generation` (or use [`MockTask::generation`]).
    pub fn assign(&self, task: Value) -> Value {
        let mut frame = match task {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        let (task_id, generation) = {
            let mut st = self.inner.lock();
            let task_id = match frame.get("task_id").and_then(Value::as_str) {
                Some(id) => id.to_string(),
                None => format!("task-mock-{}", st.tasks.len() + 1),
            };
            let generation = frame
                .get("generation")
                .and_then(Value::as_u64)
                .or_else(|| st.tasks.get(&task_id).map(|t| t.generation))
                .unwrap_or(1);
            let agent = st
                .conns
                .values()
                .find_map(|c| c.agent.clone())
                .or_else(|| self.inner.opts.agents.first().map(|a| a.0.clone()))
                .unwrap_or_default();
            st.tasks.insert(
                task_id.clone(),
                MockTask {
                    task_id: task_id.clone(),
                    generation,
                    agent: agent.clone(),
                    state: MockTaskState::Assigned,
                },
            );
            (task_id, generation)
        };
        frame.insert("type".into(), json!("task_assign"));
        frame.insert("task_id".into(), json!(task_id));
        frame.insert("generation".into(), json!(generation));
        if matches!(frame.get("assigned_at"), None | Some(Value::Null)) {
            frame.insert("assigned_at".into(), json!(now_ms()));
        }
        let frame = Value::Object(frame);
        self.push(frame.clone());
        frame
    }

    /// Answers the next identify(s) with close 1008 "cooldown active: retry in Ns" until
    /// `secs` have elapsed since this call.
    pub fn set_cooldown(&self, secs: u64) {
        self.inner.lock().cooldown = Some((Instant::now(), Duration::from_secs(secs)));
    }

    /// Forces the answer to `task_recovering` for `task_id`. Default: continue if the task
    /// is in flight with that agent, else reassign.
    pub fn set_recovery_answer(&self, task_id: &str, a: RecoveryAnswer) {
        self.inner.lock().recovery.insert(task_id.to_string(), a);
    }

    /// Sets the `action` of `state_report_ack` for `task_id` (default `continue`).
    pub fn set_state_report_action(&self, task_id: &str, action: &str) {
        self.inner
            .lock()
            .state_report_actions
            .insert(task_id.to_string(), action.to_string());
    }

    /// Stops (or resumes) reading from sockets, like a stuck hub: frames pile up in TCP
    /// buffers and the idle timeout is suspended.
    pub fn set_stall(&self, stalled: bool) {
        self.inner.stall.send_replace(stalled);
    }

    /// `false`: `task_complete` / `task_failed` are swallowed as if lost (recorded, not
    /// processed, no reply). Default `true`.
    pub fn set_ack_terminal(&self, ack: bool) {
        self.inner.lock().ack_terminal_off = !ack;
    }

    /// Swallow `task_complete` / `task_failed` for this one task (recorded, no reply), as a
    /// hub that never answers one frame; other tasks are answered as usual.
    pub fn set_ignore_terminal(&self, task_id: &str) {
        self.inner
            .lock()
            .ignore_terminal
            .insert(task_id.to_string());
    }

    /// Every frame, both directions, in order.
    pub fn frames(&self) -> Vec<Recorded> {
        self.inner.lock().frames.clone()
    }

    /// Frames the sidecar sent.
    pub fn received(&self) -> Vec<Value> {
        let st = self.inner.lock();
        st.frames
            .iter()
            .filter(|r| r.inbound)
            .map(|r| r.frame.clone())
            .collect()
    }

    /// Frames of type `ty` the sidecar sent.
    pub fn received_of(&self, ty: &str) -> Vec<Value> {
        let st = self.inner.lock();
        st.frames
            .iter()
            .filter(|r| r.inbound && type_of(&r.frame) == Some(ty))
            .map(|r| r.frame.clone())
            .collect()
    }

    /// Frames the hub validator rejected.
    pub fn violations(&self) -> Vec<Violation> {
        self.inner.lock().violations.clone()
    }

    /// `rate_limited` answers sent.
    pub fn rate_limited_count(&self) -> u64 {
        self.inner.lock().rate_limited
    }

    /// How many terminal `task_ack`s (complete/retried/dead_letter/failed) were sent for it.
    pub fn acked_terminal(&self, task_id: &str) -> u32 {
        self.inner
            .lock()
            .acked_terminal
            .get(task_id)
            .copied()
            .unwrap_or(0)
    }

    /// A snapshot of the task table.
    pub fn tasks(&self) -> Vec<MockTask> {
        self.inner.lock().tasks.values().cloned().collect()
    }

    /// One row of the task table.
    pub fn task(&self, task_id: &str) -> Option<MockTask> {
        self.inner.lock().tasks.get(task_id).cloned()
    }

    /// Waits for an inbound frame matching `pred` (already-received frames count).
    pub async fn wait_for(
        &self,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Option<Value> {
        self.wait_until(timeout, |st| {
            st.frames
                .iter()
                .find(|r| r.inbound && pred(&r.frame))
                .map(|r| r.frame.clone())
        })
        .await
    }

    /// Inbound frames after the first `seen`, waiting until there is at least one; empty on
    /// timeout. For displays that follow the conversation as it happens.
    pub async fn wait_inbound_after(&self, seen: usize, timeout: Duration) -> Vec<Value> {
        self.wait_until(timeout, |st| {
            let new: Vec<Value> = st
                .frames
                .iter()
                .filter(|r| r.inbound)
                .skip(seen)
                .map(|r| r.frame.clone())
                .collect();
            (!new.is_empty()).then_some(new)
        })
        .await
        .unwrap_or_default()
    }

    /// First inbound frame of type `ty`.
    pub async fn wait_for_type(&self, ty: &str, timeout: Duration) -> Option<Value> {
        self.wait_for_nth(ty, 1, timeout).await
    }

    /// The `n`-th (1-based) inbound frame of type `ty`.
    pub async fn wait_for_nth(&self, ty: &str, n: usize, timeout: Duration) -> Option<Value> {
        self.wait_until(timeout, |st| {
            st.frames
                .iter()
                .filter(|r| r.inbound && type_of(&r.frame) == Some(ty))
                .nth(n.saturating_sub(1))
                .map(|r| r.frame.clone())
        })
        .await
    }

    async fn wait_until<T>(
        &self,
        timeout: Duration,
        find: impl Fn(&State) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Register interest before looking, so a frame arriving in between still wakes us.
            let notified = self.inner.inbound.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(found) = find(&self.inner.lock()) {
                return Some(found);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return find(&self.inner.lock());
            }
        }
    }
}

/// A realistic `task_assign` body for the shell executor (`target_type: "sidecar"`).
pub fn sample_shell_task(task_id: &str, cmd: &str) -> Value {
    json!({
        "task_id": task_id,
        "description": format!("Run a shell command: {cmd}"),
        "metadata": {"shell_command": cmd, "timeout_ms": 60_000},
        "generation": 1,
        "repo": null,
        "branch": null,
        "file_hints": [],
        "success_criteria": [],
        "verification_steps": [],
        "complexity": {"effective_tier": "trivial", "source": "explicit", "explicit_tier": "trivial",
                       "inferred": {"tier": "trivial", "confidence": 0.9}},
        "routing_decision": {"effective_tier": "trivial", "target_type": "sidecar",
            "selected_endpoint": null, "selected_model": null, "fallback_used": false,
            "fallback_reason": null, "classification_reason": "shell command in metadata",
            "estimated_cost_tier": "free"},
        "skip_verification": false,
        "verification_timeout_ms": null,
        "max_verification_retries": 0
    })
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let sock = TcpSocket::new_v4()?;
    // Lets restart() rebind the port while old sockets linger in TIME_WAIT.
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    sock.listen(128)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn type_of(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not wedge the hub for the others.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run_token(&self) -> CancellationToken {
        self.run.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn launch(self: &Arc<Self>, listener: TcpListener) {
        self.running.store(true, Ordering::SeqCst);
        let run = self.run_token();
        let inner = Arc::clone(self);
        self.tracker.spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = run.cancelled() => break,
                    r = listener.accept() => match r {
                        Ok((s, _)) => {
                            // Like the hub (Cowboy/ranch set `nodelay` by default): without
                            // it Nagle holds a small frame back until the peer's delayed ACK,
                            // ~40 ms, and every round trip on loopback measures that instead.
                            let _ = s.set_nodelay(true);
                            s
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "mock hub accept failed");
                            continue;
                        }
                    },
                };
                let conn_inner = Arc::clone(&inner);
                let conn_run = run.clone();
                inner
                    .tracker
                    .spawn(async move { conn_inner.serve(stream, conn_run).await });
            }
        });
    }

    fn push_identified(&self, make: impl Fn() -> Outbound) -> bool {
        let st = self.lock();
        let mut sent = false;
        for c in st.conns.values().filter(|c| c.agent.is_some()) {
            sent |= c.tx.send(make()).is_ok();
        }
        sent
    }

    fn record(&self, conn: u64, inbound: bool, frame: Value) {
        let mut st = self.lock();
        if !inbound {
            // Counters for the observing API are derived from what was really sent.
            match type_of(&frame) {
                Some("rate_limited") => st.rate_limited += 1,
                Some("task_ack")
                    if matches!(
                        frame.get("status").and_then(Value::as_str),
                        Some("complete" | "retried" | "dead_letter" | "failed")
                    ) =>
                {
                    if let Some(id) = frame.get("task_id").and_then(Value::as_str) {
                        *st.acked_terminal.entry(id.to_string()).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
        st.frames.push(Recorded {
            conn,
            at: Instant::now(),
            inbound,
            frame,
        });
        drop(st);
        if inbound {
            self.inbound.notify_waiters();
        }
    }

    fn violation(&self, conn: u64, frame: Value, errors: Vec<String>) {
        tracing::warn!(conn, ?errors, "mock hub: protocol violation");
        self.lock().violations.push(Violation {
            conn,
            frame,
            errors,
        });
    }

    /// One connection: handshake, then read/dispatch until close, idle timeout or stop.
    async fn serve(self: Arc<Self>, stream: TcpStream, run: CancellationToken) {
        let ws = tokio::select! {
            _ = run.cancelled() => return,
            r = tokio_tungstenite::accept_async(stream) => match r {
                Ok(ws) => ws,
                Err(e) => {
                    tracing::debug!(error = %e, "mock hub handshake failed");
                    return;
                }
            },
        };
        let id = self.next_conn.fetch_add(1, Ordering::SeqCst);
        self.connections_total.fetch_add(1, Ordering::SeqCst);
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.lock().conns.insert(id, ConnEntry { tx, agent: None });

        let (mut sink, mut stream) = ws.split();
        let mut conn = Conn {
            id,
            agent: None,
            violations: VecDeque::new(),
        };
        let mut stall = self.stall.subscribe();
        let mut stalled = *stall.borrow_and_update();
        let idle = self.opts.idle_timeout;
        // Far future when disabled; the branch is also guarded.
        let far = Duration::from_secs(86_400 * 365);
        let sleep = tokio::time::sleep(idle.unwrap_or(far));
        tokio::pin!(sleep);

        let stopped = loop {
            let out: Vec<Outbound>;
            let mut end = End::Keep;
            tokio::select! {
                _ = run.cancelled() => break true,
                _ = stall.changed() => {
                    stalled = *stall.borrow_and_update();
                    if !stalled {
                        sleep.as_mut().reset(tokio::time::Instant::now() + idle.unwrap_or(far));
                    }
                    continue;
                }
                _ = &mut sleep, if idle.is_some() && !stalled => {
                    out = vec![Outbound::Close(1002, "idle timeout".into())];
                    end = End::Close;
                }
                o = rx.recv() => match o {
                    Some(o) => {
                        if matches!(o, Outbound::Close(..)) { end = End::Close; }
                        out = vec![o];
                    }
                    // Our entry left the table (stop()): nothing more will come.
                    None => break true,
                },
                m = stream.next(), if !stalled => {
                    sleep.as_mut().reset(tokio::time::Instant::now() + idle.unwrap_or(far));
                    match m {
                        None | Some(Err(_)) => break false,
                        Some(Ok(Message::Close(cf))) => {
                            // Recorded so tests can check the sidecar closes cleanly (1000).
                            let (code, reason) = cf
                                .map(|c| (u16::from(c.code), c.reason.to_string()))
                                .unwrap_or((1005, String::new()));
                            self.record(id, true, json!({"type": "<close>", "code": code, "reason": reason}));
                            // Flush tungstenite's queued close reply: a clean handshake.
                            let _ = sink.flush().await;
                            break false;
                        }
                        Some(Ok(Message::Text(t))) => {
                            let (o, e) = self.handle_text(&mut conn, t.as_str());
                            out = o;
                            end = e;
                        }
                        Some(Ok(Message::Binary(b))) => {
                            let frame = json!(format!("<binary {} bytes>", b.len()));
                            self.record(id, true, frame.clone());
                            self.violation(id, frame, vec!["binary frame: the hub's socket process crashes".into()]);
                            break false;
                        }
                        // Ping/pong/raw frames: tungstenite answers pings itself.
                        Some(Ok(_)) => continue,
                    }
                }
            }
            let mut failed = false;
            for o in out {
                if self.send(&mut sink, id, o).await.is_err() {
                    failed = true;
                    break;
                }
            }
            if failed {
                break false;
            }
            match end {
                End::Keep => {}
                End::Close => {
                    let _ = sink.flush().await;
                    break false;
                }
                // The real hub crashes here: no close frame, just a dropped TCP stream.
                End::Drop => break false,
            }
        };

        let mut st = self.lock();
        st.conns.remove(&id);
        // A disconnect while the hub runs makes it reclaim the agent's tasks; a crash
        // (stop) keeps its on-disk table as is.
        if !stopped && !self.root.is_cancelled() {
            if let Some(agent) = conn.agent {
                for t in st.tasks.values_mut() {
                    if t.agent == agent && t.in_flight() {
                        t.generation += 1;
                        t.state = MockTaskState::Queued;
                    }
                }
            }
        }
    }

    async fn send<S>(&self, sink: &mut S, conn: u64, o: Outbound) -> Result<(), ()>
    where
        S: futures_util::Sink<Message> + Unpin,
    {
        let msg = match o {
            Outbound::Json(v) => {
                let text = v.to_string();
                self.record(conn, false, v);
                Message::text(text)
            }
            Outbound::Text(t) => {
                self.record(conn, false, Value::String(t.clone()));
                Message::text(t)
            }
            Outbound::Binary(b) => {
                self.record(conn, false, json!(format!("<binary {} bytes>", b.len())));
                Message::binary(b)
            }
            Outbound::Close(code, reason) => {
                self.record(
                    conn,
                    false,
                    json!({"type": "<close>", "code": code, "reason": reason}),
                );
                Message::Close(Some(CloseFrame {
                    code: CloseCode::from(code),
                    reason: reason.into(),
                }))
            }
        };
        sink.send(msg).await.map_err(|_| ())
    }

    /// Handles one text frame: returns the frames to send and what to do with the socket.
    ///
    /// The frame is recorded (and waiters woken) only *after* it was handled, so a test that
    /// saw `identify` arrive can push to the now-identified socket, and one that saw
    /// `task_complete` arrive sees the task table already updated.
    fn handle_text(&self, conn: &mut Conn, text: &str) -> (Vec<Outbound>, End) {
        let id = conn.id;
        let Ok(frame) = serde_json::from_str::<Value>(text) else {
            let raw = Value::String(text.to_string());
            self.violation(id, raw.clone(), vec!["invalid_json".into()]);
            self.record(id, true, raw);
            return (vec![error("invalid_json")], End::Keep);
        };
        let handled = self.handle_json(conn, frame.clone());
        self.record(id, true, frame);
        handled
    }

    fn handle_json(&self, conn: &mut Conn, frame: Value) -> (Vec<Outbound>, End) {
        let id = conn.id;
        if !frame.is_object() {
            self.violation(
                id,
                frame,
                vec!["message: not a JSON object (the hub's socket process crashes)".into()],
            );
            return (vec![], End::Drop);
        }
        let ty = match schema::validate(&frame) {
            Ok(ty) => ty.to_string(),
            Err(errs) => {
                self.violation(
                    id,
                    frame.clone(),
                    errs.iter().map(|e| e.to_string()).collect(),
                );
                let reply = Outbound::Json(json!({
                    "type": "error",
                    "error": "validation_failed",
                    "message_type": frame.get("type"),
                    "errors": errs.iter().map(schema::FieldError::to_json).collect::<Vec<_>>(),
                }));
                let now = Instant::now();
                conn.violations.push_back(now);
                while conn
                    .violations
                    .front()
                    .is_some_and(|t| now.duration_since(*t) > VIOLATION_WINDOW)
                {
                    conn.violations.pop_front();
                }
                if conn.violations.len() >= MAX_VIOLATIONS {
                    return (
                        vec![
                            reply,
                            Outbound::Close(1008, "too many validation errors".into()),
                        ],
                        End::Close,
                    );
                }
                return (vec![reply], End::Keep);
            }
        };

        let Some(agent) = conn.agent.clone() else {
            // Like the hub: no limiter before identify (there is no agent to key it on).
            if ty == "identify" {
                return self.identify(conn, &frame);
            }
            return (vec![error("not_identified")], End::Keep);
        };

        let mut out = Vec::new();
        if self.opts.rate_limit {
            match self.check_rate(&agent, Tier::of(&ty)) {
                Verdict::Allow => {}
                Verdict::Warn {
                    remaining,
                    capacity,
                } => out.push(Outbound::Json(json!({
                    "type": "rate_limit_warning", "tier": Tier::of(&ty).name(),
                    "remaining": remaining, "capacity": capacity,
                }))),
                Verdict::Deny { retry_after_ms } => {
                    // The frame is dropped unprocessed: the sender must re-send it.
                    return (
                        vec![Outbound::Json(json!({
                            "type": "rate_limited", "retry_after_ms": retry_after_ms,
                            "tier": Tier::of(&ty).name(),
                        }))],
                        End::Keep,
                    );
                }
            }
        }
        if ty == "identify" {
            let (mut o, end) = self.identify(conn, &frame);
            out.append(&mut o);
            return (out, end);
        }
        if let Some(reply) = self.dispatch(&agent, &ty, &frame) {
            out.push(Outbound::Json(reply));
        }
        (out, End::Keep)
    }

    fn identify(&self, conn: &mut Conn, frame: &Value) -> (Vec<Outbound>, End) {
        let agent_id = frame["agent_id"].as_str().unwrap_or_default();
        let token = frame["token"].as_str().unwrap_or_default();
        let mut st = self.lock();
        if let Some((since, len)) = st.cooldown {
            let left = len.saturating_sub(since.elapsed());
            if !left.is_zero() {
                let secs = left.as_millis().div_ceil(1000);
                return (
                    vec![Outbound::Close(
                        1008,
                        format!("cooldown active: retry in {secs}s"),
                    )],
                    End::Close,
                );
            }
            st.cooldown = None;
        }
        match self.opts.agents.iter().find(|(_, t)| t == token) {
            Some((owner, _)) if owner == agent_id => {
                conn.agent = Some(agent_id.to_string());
                if let Some(c) = st.conns.get_mut(&conn.id) {
                    c.agent = Some(agent_id.to_string());
                }
                (
                    vec![Outbound::Json(
                        json!({"type": "identified", "agent_id": agent_id}),
                    )],
                    End::Keep,
                )
            }
            Some(_) => (vec![error("token_agent_mismatch")], End::Keep),
            None => (vec![error("invalid_token")], End::Keep),
        }
    }

    fn check_rate(&self, agent: &str, tier: Tier) -> Verdict {
        let o = &self.opts;
        let (cap, per_min) = match tier {
            Tier::Light => (o.light_capacity, o.light_per_minute),
            Tier::Normal => (o.normal_capacity, o.normal_per_minute),
            Tier::Heavy => (o.heavy_capacity, o.heavy_per_minute),
        };
        let cap = f64::from(cap);
        let per_ms = f64::from(per_min) / 60_000.0;
        let now = Instant::now();
        let mut st = self.lock();
        let b = st
            .buckets
            .entry((agent.to_string(), tier))
            .or_insert(Bucket {
                tokens: cap,
                last: now,
            });
        let elapsed = now.duration_since(b.last).as_secs_f64() * 1000.0;
        b.tokens = (b.tokens + elapsed * per_ms).min(cap);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            if b.tokens < cap * WARN_SHARE {
                Verdict::Warn {
                    remaining: b.tokens.floor() as u64,
                    capacity: cap as u64,
                }
            } else {
                Verdict::Allow
            }
        } else {
            let ms = if per_ms > 0.0 {
                ((1.0 - b.tokens) / per_ms).ceil() as u64
            } else {
                60_000
            };
            Verdict::Deny {
                retry_after_ms: ms.div_ceil(1000).max(1) * 1000,
            }
        }
    }

    /// Answers one valid frame from an identified agent.
    fn dispatch(&self, agent: &str, ty: &str, f: &Value) -> Option<Value> {
        let task_id = f.get("task_id").and_then(Value::as_str).unwrap_or_default();
        let mut st = self.lock();
        match ty {
            "ping" => Some(json!({"type": "pong", "timestamp": now_ms()})),
            "task_accepted" => {
                if let Some(t) = st.tasks.get_mut(task_id) {
                    if t.agent == agent && t.state == MockTaskState::Assigned {
                        t.state = MockTaskState::Accepted;
                    }
                }
                Some(json!({"type": "task_ack", "task_id": task_id, "status": "accepted"}))
            }
            "task_complete" | "task_failed" => {
                if st.ack_terminal_off || st.ignore_terminal.contains(task_id) {
                    return None;
                }
                let complete = ty == "task_complete";
                let generation = f["generation"].as_u64();
                let verdict = match st.tasks.get_mut(task_id) {
                    None => Err("not_found".to_string()),
                    Some(t) if !t.in_flight() => {
                        Err(format!("invalid_state {:?}", t.state).to_lowercase())
                    }
                    Some(t) if t.agent != agent => Err("not_assigned_to_agent".into()),
                    Some(t) if generation != Some(t.generation) => Err("stale_generation".into()),
                    Some(t) => {
                        if complete {
                            t.state = MockTaskState::Complete;
                        } else {
                            t.generation += 1;
                            t.state = MockTaskState::Queued;
                        }
                        Ok(())
                    }
                };
                Some(match (verdict, complete) {
                    (Ok(()), true) => {
                        json!({"type": "task_ack", "task_id": task_id, "status": "complete"})
                    }
                    (Ok(()), false) => {
                        json!({"type": "task_ack", "task_id": task_id, "status": "retried"})
                    }
                    (Err(r), true) => {
                        json!({"type": "error", "error": format!("task_complete_failed: {r}")})
                    }
                    (Err(r), false) => {
                        json!({"type": "error", "error": format!("task_fail_failed: {r}")})
                    }
                })
            }
            "task_recovering" => {
                let forced = st.recovery.get(task_id).copied();
                let ours = st
                    .tasks
                    .get(task_id)
                    .is_some_and(|t| t.agent == agent && t.in_flight());
                let answer = forced.unwrap_or(if ours {
                    RecoveryAnswer::Continue
                } else {
                    RecoveryAnswer::Reassign
                });
                match (answer, st.tasks.get_mut(task_id)) {
                    (RecoveryAnswer::Continue, Some(t)) => {
                        if !t.in_flight() || t.agent != agent {
                            // Forced continue of a task that was reclaimed: hand it back.
                            t.agent = agent.to_string();
                            t.state = MockTaskState::Assigned;
                        }
                        Some(json!({"type": "task_continue", "task_id": task_id,
                                    "generation": t.generation}))
                    }
                    (RecoveryAnswer::Continue, None) => {
                        Some(json!({"type": "task_continue", "task_id": task_id, "generation": 1}))
                    }
                    (RecoveryAnswer::Reassign, t) => {
                        if let Some(t) = t.filter(|t| t.in_flight()) {
                            t.generation += 1;
                            t.state = MockTaskState::Queued;
                        }
                        Some(json!({"type": "task_reassign", "task_id": task_id}))
                    }
                }
            }
            "state_report" => {
                let action = st
                    .state_report_actions
                    .get(task_id)
                    .cloned()
                    .unwrap_or_else(|| "continue".into());
                Some(json!({"type": "state_report_ack", "task_id": task_id, "action": action}))
            }
            "status" => Some(json!({"type": "status_updated"})),
            "list_agents" => Some(json!({"type": "agents", "agents": []})),
            "list_channels" => Some(json!({"type": "channels", "channels": []})),
            "message" => Some(json!({"type": "message_sent", "id": format!("msg-{}", now_ms())})),
            // task_progress, resource_report, ollama_report, wake_result, channel_*: no reply.
            _ => None,
        }
    }
}

/// Per-connection state owned by its task.
struct Conn {
    id: u64,
    agent: Option<String>,
    /// Times of recent violations, for the 10-in-60-s cut-off.
    violations: VecDeque<Instant>,
}

/// What happens to the socket after a frame's replies are sent.
enum End {
    Keep,
    /// Replies included a close frame; drop the socket afterwards.
    Close,
    /// Drop without a close frame (the hub's process crashed).
    Drop,
}

fn error(e: &str) -> Outbound {
    Outbound::Json(json!({"type": "error", "error": e}))
}

#[cfg(test)]
mod tests;
