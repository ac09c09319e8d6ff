//! An in-process AgentCom hub on loopback for integration tests, the `demo` subcommand and
//! benchmarks.
//!
//! It owns a real WebSocket server on `127.0.0.1:0` that behaves like the hub described in
//! PROTOCOL.md: identify and auth, ping/pong, per-type schema validation with the violation
//! cut-off, the per-agent token-bucket rate limiter, a task table with generations, recovery
//! answers and state-report reconciliation as the hub (4718a58) gives them, the hub's
//! per-agent state machine (`AgentFSM`: reclaim on disconnect, the acceptance timer, one task
//! held whatever id a result names), results fenced by generation only, retries and the dead
//! letter, the idle timeout, "hub crash" via [`MockHub::stop`] / [`MockHub::restart`], and,
//! for tasks handed in with [`MockHub::submit`], the hub's event-driven scheduler across
//! several agents (with a knob for its double assignment). Every frame in both directions is recorded so tests can assert on what the
//! sidecar actually put on the wire.
//!
//! # Layout
//!
//! - [`schema`]: the validator, over raw `serde_json::Value` (independent of our own wire
//!   types, so it catches our serialisation bugs).
//! - this file: the options and recorded types, and the shared state (`Inner`, `State`) behind
//!   one std mutex that is never held across an `.await`.
//! - `handle`: the test-facing [`MockHub`] API (start/stop/restart, pushes, knobs, waits).
//! - `server`: the accept loop, one task per connection, the handshake and identification.
//! - `state`: the scripted hub: recording, the rate limiter and the answer to each frame.
//! - `fsm`: the per-agent state machine, the reclaim it makes and the socket registry.
//! - `scheduler`: submitted tasks to agents whose machine is idle, on the real triggers, and
//!   the acceptance timers.
//!
//! # What it models of the real hub's task handling (4718a58)
//!
//! - **Reclaim on disconnect**, as `AgentFSM` does it: the agent's state machine watches the
//!   connection that identified; when that one closes (while the hub runs) the task the
//!   machine holds goes back to the queue at generation + 1. A second connection that
//!   identifies as the agent replaces the machine (nothing reclaimed), so *its* close
//!   reclaims the task the agent still runs on the first, and the first connection, left
//!   without a machine, gets no more work and its close reclaims nothing.
//! - **The state machine** (`fsm`): one task held, `idle` → `assigned` (push) → `working`
//!   (`task_accepted` for that task) → `idle`. A result the table takes (any task id, at the
//!   right generation) ends whatever it holds, but only from `working`; otherwise it is
//!   logged `fsm_unexpected_event` and the machine stays put.
//! - **The acceptance timer**: armed on every push to an idle machine and whenever a machine
//!   starts `assigned` at identify (for the first task the table shows assigned to the agent,
//!   accepted before or not, e.g. after a hub restart). When it fires the machine reclaims
//!   that task from whoever holds it now (`fsm_reclaim_failed` if it is no longer assigned)
//!   and goes idle, flagged `unresponsive`, without telling the scheduler.
//! - **Re-creation at identify** (how a sidecar can bring the hub's view back in step): every
//!   `identify`, on a new or the same connection, stops the agent's machine (no reclaim) and
//!   starts a new one from the task table: `assigned` on the first task assigned to the agent,
//!   with a fresh timer (so a task still running there must be accepted again), else `idle`
//!   (and `agent_joined` makes the scheduler look at once). Identifying again on the same
//!   socket is allowed (one heavy-tier token of 10 a minute). If the table shows two tasks
//!   assigned to the agent (a double assignment neither run nor refused), the machine takes
//!   one of them in table order, not necessarily the one running: `task_accepted` for the
//!   other is then logged and ignored, and the timer reclaims the one it took.
//! - **The scheduler** is event-driven: it assigns only after a trigger (task submitted,
//!   retried, reclaimed or completed; agent joined or gone idle through a result), never on
//!   a timer or an ordinary frame. Its pushes go to the agent's registered connection (the
//!   first of its connections that identified and is still open; none: the task stays
//!   assigned, unpushed). The double assignment happens on demand
//!   ([`MockHub::race_next_assignment`]).
//! - **Results** are fenced by the generation only, whoever sends them, and the state machine
//!   told is the sender's. Every `task_failed` taken counts toward `max_retries`
//!   ([`MockHubOptions::max_retries`], default 3, `sidecar_busy` included); the last one
//!   dead-letters the task (out of the table: `not_found` afterwards).
//!
//! # Deviations from the real hub, and why
//!
//! - The double assignment needs two scheduling triggers inside the socket's cast latency;
//!   here every cast lands before the next frame is handled, so it happens only when a test
//!   arms it: tests must be reproducible, and a race left to chance is not.
//! - Triggers arriving between two passes are coalesced into one pass. A pass never assigns
//!   an agent twice, so this only saves passes; the extra passes matter only for the race
//!   above, which the knob provides.
//! - Tasks given out with [`MockHub::assign`] / [`MockHub::assign_to`] are the test's to
//!   schedule: they go out at the table's generation (no + 1) and, once re-queued, wait for
//!   the test. Their push and cast are the scheduler's. Only [`MockHub::submit`]ted tasks are
//!   scheduled by the hub, in submission order (the hub: priority, then age), with no
//!   capability, routing, paused-repo or dependency filter (tests submit plain shell tasks).
//! - Agents are matched in agent-id order and a new machine picks its first assigned task by
//!   task id; the hub uses its registry's and its DETS table's order (unspecified). Fixed
//!   here so runs repeat.
//! - Agents with recent rate-limit violations are not skipped by the scheduler (the hub's
//!   `RateLimiter.rate_limited?`): the fleet tests lift the limits; the limiter itself is
//!   tested on its own.
//! - No stuck-assignment sweep (30 s, for tasks untouched 10 min), overdue sweep
//!   (`complete_by`) or TTL sweep: their periods are far beyond any test.
//! - [`MockTaskState::Accepted`] is the mock's marker for "the assignee accepted it"; the
//!   hub's table has no such status (both are `assigned`). [`MockTask::agent`] keeps the last
//!   assignee after a re-queue (the hub clears it), for tests to see who had it.
//! - [`MockHub::stop`] is a hub killed outright: the table is kept, every in-memory process
//!   (sockets, state machines, registry) dies. A graceful hub shutdown (which reclaims) is
//!   not modelled.
//! - Violations close the socket with 1008 but do not start a cooldown by themselves; tests
//!   arm it explicitly with [`MockHub::set_cooldown`]. Limiter buckets start full after a
//!   restart.
//! - No `task_cancelled`, `blocked` state or HTTP API; chat traffic (`message`,
//!   `channel_*`, …) is validated and answered minimally, never routed.

mod fsm;
mod handle;
mod scheduler;
pub mod schema;
mod server;
mod state;

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

use fsm::Fsm;
pub use fsm::{AgentFsm, FsmState, HubEvent};
use server::bind;

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
    /// The AgentFSM's acceptance timer: armed when an assignment is pushed and when a
    /// machine starts `assigned` at identify; without `task_accepted` for the task it holds
    /// by then, the machine reclaims it (generation + 1) and goes idle. The real hub: 60 s.
    pub acceptance_timeout: Duration,
    /// `task_failed` answers before a task is dead-lettered (`TaskQueue`'s default, 3; a
    /// [`MockHub::submit`]ted body may carry its own `max_retries`). Every `task_failed` the
    /// table accepts counts, `sidecar_busy` included.
    pub max_retries: u32,
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
            acceptance_timeout: Duration::from_secs(60),
            max_retries: 3,
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

/// The hub's answer to `task_recovering`, when a test forces one (by default the mock answers
/// as the hub does: `task_continue` with the current generation while the task is assigned,
/// to whichever agent; else `task_reassign`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryAnswer {
    /// `task_continue` with the table's generation; a task no longer in flight is handed
    /// to the asking agent first.
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
    /// Failed `max_retries` times: out of the task table for good (the hub moves it to its
    /// dead-letter table; results and recovery for it get `not_found` answers).
    DeadLetter,
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
    /// `task_failed` answers the table accepted for it (the hub's `retry_count`).
    pub retries: u32,
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
    /// Tasks the hub schedules itself ([`MockHub::submit`]), in submission order, with
    /// the `task_assign` body each assignment is made from.
    submitted: Vec<(String, Value)>,
    /// Per-task `max_retries` from a submitted body (else the option's).
    max_retries: HashMap<String, u32>,
    /// The per-agent state machines (`AgentFSM`), keyed by agent.
    fsms: HashMap<String, Fsm>,
    /// `AgentRegistry`: the connection the scheduler's pushes for an agent go to.
    registry: HashMap<String, u64>,
    /// What the hub logged about tasks and agents, in order.
    hub_log: Vec<HubEvent>,
    /// A scheduling trigger happened since the last pass (the real triggers only).
    sched_pending: bool,
    /// Agents whose next assignment reaches their machine only after one more scheduling
    /// pass ([`MockHub::race_next_assignment`]).
    race: std::collections::HashSet<String>,
}

struct Inner {
    opts: MockHubOptions,
    addr: SocketAddr,
    state: Mutex<State>,
    /// Woken on every inbound frame (for `wait_for*`).
    inbound: Notify,
    /// Wakes the scheduler: a frame came in, an agent came or went, a task was submitted.
    /// It assigns only after a real trigger (`State::sched_pending`).
    schedule: Notify,
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn type_of(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

#[cfg(test)]
mod fsm_tests;
#[cfg(test)]
mod tests;
