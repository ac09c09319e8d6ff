//! Integration tests: the real daemon (in-process `daemon::run` or the real binary) against
//! the mock hub over a real loopback WebSocket, and the engines it drives. One test crate,
//! one link step.

mod daemon;
mod e2e;
mod executors;
mod fakes;
mod faults;
mod git;
mod ops;
mod outbox;
mod util;
mod verify;
