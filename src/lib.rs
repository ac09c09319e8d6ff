//! hub-sidecar: a worker daemon for an AgentCom hub.
//!
//! It keeps one WebSocket to the hub, takes one task at a time, persists it before
//! acknowledging, runs it through an executor (shell, Claude Code CLI or Ollama), verifies
//! the result with the task's checks inside a bounded corrective-retry loop, and reports
//! the outcome without ever losing it.
//!
//! # Layout
//!
//! - [`cli`]: the command line's clap types; [`logging`]: the scrubbed log on stderr.
//! - [`config`]: layered configuration (defaults < file < env < flags): raw, then validated once.
//! - [`hub`]: the hub link: wire types ([`hub::proto`]), connection, heartbeat, backoff,
//!   the outgoing rate budget and resource reports.
//! - [`task`]: the task model parsed from `task_assign`, executor choice.
//! - [`state`]: the crash-safe state journal: active task and the outbox of terminal frames.
//! - [`outbox`]: which unacknowledged result to send next (newest first, bound, expiry).
//! - [`daemon`]: the lifecycle actor tying link, state and runner together.
//! - [`runner`]: runs one task: workspace, executor + verification loop, git → result frame.
//! - [`workspace`]: where a task runs: managed clones, `repo_dir`, per-task dirs, locks.
//! - [`git`]: every git and gh call: the runner, URLs, the task branch, commit/push/PR, risk.
//! - [`executor`]: the executors, one file each, behind one seam.
//! - [`plan`]: the task's plan, asked for once, found in the first attempt, carried forward
//!   (the executors keep the text it is found in, the loop carries it).
//! - [`verify`]: checks, reports, workspace observations, the judge and the retry loop.
//! - [`progress`]: progress events and their coalescing under the hub's budget.
//! - [`process`]: the one spawn path: process groups, capped capture, group kill, sandbox.
//! - [`sandbox`]: containment of what tasks run: Landlock, namespaces, limits.
//! - [`spend`]: the spend ledger on disk: today's spend, each task's spend and attempts.
//! - [`redact`]: secret scrubbing for everything that leaves the process.
//! - [`recorder`]: the per-task flight record on disk and reading it back (`tasks`, `show`).
//! - [`telemetry`]: every task as an OpenTelemetry trace, exported over OTLP (`[otel]`).
//! - [`cost`]: model prices for estimated and equivalent costs.
//! - [`ops`]: systemd notify, health and metrics.
//! - [`mock_hub`]: an in-process hub that validates frames like the real one (tests, demo).
//! - [`commands`]: every subcommand (`run`, `demo`, `check`, `run-task`, `verify`, `tasks`,
//!   `show`, `status`) and the dispatch to them.
//! - [`term`]: the live progress line for terminal work.
//! - [`util`]: time, truncation and URL helpers (the `url` crate, percent-encoding).

pub mod cli;
pub mod commands;
pub mod config;
pub mod cost;
pub mod daemon;
pub mod executor;
pub mod git;
pub mod hub;
pub mod logging;
pub mod mock_hub;
pub mod ops;
pub mod outbox;
pub mod plan;
pub mod process;
pub mod progress;
pub mod recorder;
pub mod redact;
pub mod runner;
pub mod sandbox;
pub mod spend;
pub mod state;
pub mod task;
pub mod telemetry;
pub mod term;
pub mod util;
pub mod verify;
pub mod workspace;
