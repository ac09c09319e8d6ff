//! Integration tests: the real daemon (in-process `daemon::run` or the real binary) against
//! the mock hub over a real loopback WebSocket, and the engines it drives. One test crate,
//! one link step.

// Tests and their helpers may unwrap: a panic is how a test fails. The library may not
// (`clippy::unwrap_used` in Cargo.toml).
#![allow(clippy::unwrap_used)]

mod agent_config;
mod caches;
mod containment;
mod daemon;
mod deep_trees;
mod denials;
mod e2e;
mod executors;
mod fake_anthropic;
mod fakes;
mod faults;
mod fencing;
mod fleet;
mod git;
mod harness;
mod hub_fidelity;
mod hub_restart;
mod kernel_channels;
mod leaks;
mod link_order;
mod loop_spec;
mod loopback;
mod made_ahead;
mod manifest;
mod network;
mod ops;
mod outbox;
mod package;
mod procfs;
mod proxy_limits;
mod readiness;
mod real_claude;
mod recorder;
mod recovery;
mod relay;
mod seccomp;
mod service_user;
mod sockets;
mod structure;
mod systemd_unit;
mod task_netns;
mod telemetry;
mod terminal;
mod util;
mod verify;
mod warm_cache;
