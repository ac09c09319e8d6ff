//! Git and the task's work: every git and gh call the daemon makes.
//!
//! # Layout
//!
//! - [`GitRunner`] (`runner.rs`): argv only, a timeout, its own process group,
//!   `GIT_TERMINAL_PROMPT=0` and no askpass program, so a missing credential fails fast
//!   instead of waiting for a human.
//! - [`harden`]: what keeps git from running a program the repository names.
//! - [`locate`]: the git directory found the way git finds it, or refused.
//! - `refusal.rs`: why the daemon runs no git in a work tree ([`harden::Refusal`]).
//! - [`url`]: repository URLs, their credentials, the names derived from them.
//! - [`branch`]: the task branch `<agent>/<slug-of-description>-<id>` from the base.
//! - `objects.rs`: raw git objects (`cat-file --batch`, the tree format) fed to the scan.
//! - [`secrets`]: before the push, refuse one that carries a credential: every object it
//!   sends, enumerated against the remote's tips.
//! - [`publish`]: after verification, commit, push (`--force-with-lease`), open a pull
//!   request with `gh`, and ask the hub to classify the change's risk.

pub mod branch;
pub mod harden;
pub mod locate;
mod objects;
pub mod publish;
mod refusal;
mod runner;
pub mod secrets;
pub mod url;

pub use runner::{home_dir, GitError, GitRunner};
