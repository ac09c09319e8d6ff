//! The hub link: everything about the one WebSocket to the AgentCom hub.
//!
//! # Layout
//!
//! - [`proto`]: the wire types, one enum per direction.
//! - [`link`]: connect, identify, heartbeat, reconnect; owns the socket.
//! - `link_handle`: the daemon's side of the link (events, frames, steering), re-exported
//!   from [`link`].
//! - [`backoff`]: exponential backoff with full jitter.
//! - [`budget`]: a mirror of the hub's "normal" token bucket shared by progress and lifecycle frames.
//! - [`resources`]: the periodic `resource_report` (CPU, RAM, Ollama VRAM).

pub mod backoff;
pub mod budget;
pub mod link;
mod link_handle;
pub mod proto;
pub mod resources;
