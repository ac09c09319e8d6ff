//! The hub link: one WebSocket, owned by one task.
//!
//! The link connects, identifies, keeps the socket alive with pings whatever the rest of the
//! daemon is doing, detects a dead link (no pong in time, a write that cannot complete),
//! reconnects with jittered backoff, honours the hub's cooldowns, and enforces the outgoing
//! rate budget. It knows nothing about tasks: it forwards inbound frames to the daemon as
//! [`LinkEvent`]s and sends what the daemon gives it through [`LinkHandle`].
//!
//! Frames are stamped with the connection *epoch* the daemon last saw identified; a frame
//! meant for a connection that has since died is dropped instead of being sent on the next
//! one. The daemon re-sends what matters (the outbox) after each `Identified`, so nothing is
//! lost and nothing is sent twice.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, watch, Notify};

use super::link_handle::HURRIED_RECONNECT;
pub use super::link_handle::{channel, LinkEvent, LinkHandle, OutFrame, Steering};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::hub::backoff::{cooldown_from_reason, Backoff};
use crate::hub::budget::RateBudget;
use crate::hub::proto::{HubErrorKind, Inbound, Outbound, RateTier, Secret};
use crate::hub::resources::ResourceSampler;
use crate::ops::Ops;

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// A write that takes longer than this means the hub stopped reading.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `identify` may take to be answered.
const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a connection ended, and what that means for the next attempt.
#[derive(Debug)]
enum End {
    /// Shutdown: closed with 1000.
    Shutdown,
    /// The hub said wait at least this long.
    Cooldown(Duration, String),
    /// The hub refused our credentials: retrying fast cannot help.
    Auth(String),
    /// Anything else: reconnect with backoff.
    Lost(String),
    /// The daemon asked for a fresh connection ([`LinkHandle::reconnect`]): at once.
    Resync,
}

/// Run the link until `cancel`. On cancel the socket is closed with code 1000.
///
/// `steering.status` is the agent status `identify` announces: `idle` from the start (the containment
/// probe answers after the first `identify`; the daemon corrects the hub with a `status`
/// frame when it must), then `idle` or "not accepting tasks: …" as the daemon decides; `None`
/// waits for a value. Each connection announces the value current at its identify.
///
/// `first_attempt` fires once the first connection has identified, or failed to: what the
/// daemon waits for before it starts its containment probe, so that nothing but the
/// connection runs on the way to the first `identify` (spawn → identified, BENCHMARKS.md
/// figure 1).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    cfg: Arc<Config>,
    budget: Arc<RateBudget>,
    events: mpsc::Sender<LinkEvent>,
    mut out: mpsc::Receiver<OutFrame>,
    ops: Ops,
    steering: Steering,
    first_attempt: tokio::sync::oneshot::Sender<()>,
    cancel: CancellationToken,
) {
    let mut first_attempt = Some(first_attempt);
    let Steering {
        mut status,
        resync,
        hurry,
    } = steering;
    let mut backoff = Backoff::new(
        Duration::from_millis(cfg.reconnect_min_ms),
        Duration::from_millis(cfg.reconnect_max_ms),
    );
    let connector = match tls_connector(&cfg) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot set up TLS for the hub link; wss:// will fail");
            None
        }
    };
    if cfg.hub_url.scheme() == "ws" && !is_loopback_url(cfg.hub_url.as_str()) {
        tracing::warn!(hub_url = %cfg.hub_url, "hub link is unencrypted ws:// to a non-loopback host; the token crosses the network in clear text: use wss://");
    }
    let mut sampler = ResourceSampler::new(cfg.ollama_url.clone());
    let mut epoch = 0u64;
    loop {
        if cancel.is_cancelled() {
            return;
        }
        ops.link_state(false);
        let connected = connect(&cfg, connector.clone()).await;
        let end = match connected {
            Err(e) => {
                first_attempt.take().map(|tx| tx.send(()));
                End::Lost(e.to_string())
            }
            Ok(ws) => {
                let announcing = announced(&mut status, &cancel).await;
                let identified = identify(&cfg, ws, &announcing, &cancel).await;
                first_attempt.take().map(|tx| tx.send(()));
                match identified {
                    Err(end) => end,
                    Ok(ws) => {
                        epoch += 1;
                        backoff.reset();
                        tracing::info!(epoch, hub = %cfg.hub_url, "identified with the hub");
                        ops.link_state(true);
                        ops.pong();
                        let identified = LinkEvent::Identified {
                            epoch,
                            announced: announcing,
                        };
                        if events.send(identified).await.is_err() {
                            return;
                        }
                        let mut conn = Connection {
                            cfg: &cfg,
                            budget: &budget,
                            events: &events,
                            ops: &ops,
                            epoch,
                            held: VecDeque::new(),
                            barriers: VecDeque::new(),
                            pings_sent: 0,
                            pongs: 0,
                            assigned: None,
                        };
                        let end = conn
                            .serve(ws, &mut out, &mut sampler, &resync, &cancel)
                            .await;
                        ops.link_state(false);
                        let reason = format!("{end:?}");
                        let _ = events.send(LinkEvent::Disconnected { reason }).await;
                        end
                    }
                }
            }
        };
        let delay = match end {
            End::Shutdown => return,
            End::Cooldown(d, reason) => {
                let d = d.max(backoff.next_delay());
                tracing::warn!(wait_secs = d.as_secs(), reason = %reason, "hub imposed a cooldown on this agent; waiting before the next identify");
                d
            }
            End::Auth(err) => {
                let d = backoff.auth_delay();
                tracing::error!(error = %err, wait_secs = d.as_secs(), agent_id = %cfg.agent_id, "the hub rejected this agent's token; fix `token`/`agent_id` in the config. Retrying at the maximum backoff");
                d
            }
            End::Resync => {
                tracing::info!("reconnecting at the daemon's request");
                Duration::ZERO
            }
            End::Lost(reason) if hurry.load(Ordering::Acquire) => {
                tracing::warn!(reason = %reason, retry_in_ms = HURRIED_RECONNECT.as_millis() as u64, "hub link lost with a task paused; reconnecting");
                HURRIED_RECONNECT
            }
            End::Lost(reason) => {
                let d = backoff.next_delay();
                tracing::warn!(reason = %reason, retry_in_ms = d.as_millis() as u64, "hub link lost; reconnecting");
                d
            }
        };
        ops.reconnect();
        // Frames queued for the dead connection are stale: drop them while we wait.
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = &mut sleep => break,
                f = out.recv() => if f.is_none() { return },
            }
        }
    }
}

/// One connect + `identify` round trip, then a clean close (1000): what `hub-sidecar check`
/// reports as "hub reachable, token accepted". The error says which step failed.
pub async fn probe(cfg: &Config) -> Result<(), ProbeError> {
    let connector = tls_connector(cfg).map_err(ProbeError::Tls)?;
    let ws = connect(cfg, connector).await?;
    match identify(cfg, ws, "idle", &CancellationToken::new()).await {
        Ok(mut ws) => {
            let close = CloseFrame {
                code: CloseCode::Normal,
                reason: "hub-sidecar check".into(),
            };
            let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(Some(close))).await;
            Ok(())
        }
        Err(End::Auth(code)) => Err(ProbeError::Auth {
            agent_id: cfg.agent_id.clone(),
            code,
        }),
        Err(End::Cooldown(_, reason)) => Err(ProbeError::Cooldown(reason)),
        Err(End::Lost(e)) => Err(ProbeError::Lost(e)),
        Err(End::Shutdown | End::Resync) => Err(ProbeError::Cancelled),
    }
}

/// Why [`probe`] failed: the hub refused us, asked us to wait, or could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// `ca_file` or the TLS set-up is wrong.
    #[error("{0:#}")]
    Tls(anyhow::Error),
    /// No WebSocket to the hub.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The hub refused the token (`invalid_token`, `token_agent_mismatch`).
    #[error("the hub refused the token for agent {agent_id}: {code}")]
    Auth {
        /// The agent that identified.
        agent_id: String,
        /// The hub's error code.
        code: String,
    },
    /// The hub is in a cooldown for this agent.
    #[error("the hub asked to wait: {0}")]
    Cooldown(String),
    /// The link broke during `identify`.
    #[error("{0}")]
    Lost(String),
    /// The probe was cancelled.
    #[error("cancelled")]
    Cancelled,
}

/// Why the WebSocket to the hub could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The TCP, TLS or WebSocket handshake failed.
    #[error("connect to {url} failed: {source}")]
    Failed {
        /// `hub_url`.
        url: String,
        /// What failed.
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },
    /// No handshake within the connect timeout.
    #[error("connect to {url} timed out")]
    TimedOut {
        /// `hub_url`.
        url: String,
    },
}

/// Whether `url`'s host is a loopback address (or `localhost`): plain `ws://` is fine there.
pub use crate::util::is_loopback_url;

/// TLS settings for `wss://`: system roots plus `ca_file`, certificates always verified.
fn tls_connector(cfg: &Config) -> anyhow::Result<Option<Connector>> {
    use anyhow::Context;
    if cfg.hub_url.scheme() != "wss" {
        return Ok(None);
    }
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = &cfg.ca_file {
        let pem =
            std::fs::read(path).with_context(|| format!("reading ca_file {}", path.display()))?;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.with_context(|| format!("parsing ca_file {}", path.display()))?;
            roots
                .add(cert)
                .with_context(|| format!("adding a certificate from {}", path.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(Connector::Rustls(Arc::new(config))))
}

async fn connect(cfg: &Config, connector: Option<Connector>) -> Result<Ws, ConnectError> {
    let ws_cfg = WebSocketConfig::default()
        .max_message_size(Some(cfg.max_frame_bytes))
        .max_frame_size(Some(cfg.max_frame_bytes));
    let fut = tokio_tungstenite::connect_async_tls_with_config(
        cfg.hub_url.as_str(),
        Some(ws_cfg),
        true,
        connector,
    );
    match tokio::time::timeout(Duration::from_secs(15), fut).await {
        Ok(Ok((ws, _))) => Ok(ws),
        Ok(Err(e)) => Err(ConnectError::Failed {
            url: cfg.hub_url.to_string(),
            source: Box::new(e),
        }),
        Err(_) => Err(ConnectError::TimedOut {
            url: cfg.hub_url.to_string(),
        }),
    }
}

/// The status to announce: waits (cancellably) until the daemon has published one.
async fn announced(
    status: &mut watch::Receiver<Option<String>>,
    cancel: &CancellationToken,
) -> String {
    let known = tokio::select! {
        s = status.wait_for(Option::is_some) => s.ok().and_then(|s| s.clone()),
        _ = cancel.cancelled() => None,
    };
    known.unwrap_or_else(|| "idle".into())
}

/// Send `identify` announcing `status`, and wait for the verdict.
async fn identify(
    cfg: &Config,
    mut ws: Ws,
    status: &str,
    cancel: &CancellationToken,
) -> Result<Ws, End> {
    let frame = Outbound::Identify {
        agent_id: cfg.agent_id.clone(),
        token: Secret(cfg.token.clone()),
        name: cfg.name.clone().unwrap_or_else(|| cfg.agent_id.clone()),
        status: crate::util::truncate_chars(status, 256),
        capabilities: cfg.capabilities.clone(),
        client_type: "sidecar".into(),
        ollama_url: cfg.ollama_url.clone(),
    };
    if let Err(e) = ws.send(Message::text(frame.to_text())).await {
        return Err(End::Lost(format!("sending identify failed: {e}")));
    }
    let deadline = tokio::time::sleep(IDENTIFY_TIMEOUT);
    tokio::pin!(deadline);
    loop {
        let msg = tokio::select! {
            _ = cancel.cancelled() => {
                let _ = ws.close(None).await;
                return Err(End::Shutdown);
            }
            _ = &mut deadline => return Err(End::Lost("no answer to identify".into())),
            m = ws.next() => m,
        };
        match msg {
            Some(Ok(Message::Text(t))) => match Inbound::parse(&t) {
                Ok(Inbound::Identified { .. }) => return Ok(ws),
                Ok(Inbound::Error { error, .. }) if error.kind() == HubErrorKind::Auth => {
                    let _ = ws.close(None).await;
                    return Err(End::Auth(error.into()));
                }
                Ok(other) => tracing::debug!(frame = ?other, "frame before identified ignored"),
                Err(e) => tracing::debug!(error = %e, "unparseable frame before identified"),
            },
            Some(Ok(Message::Close(cf))) => return Err(close_end(cf)),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(End::Lost(format!("hub link error: {e}"))),
            None => return Err(End::Lost("hub closed the socket during identify".into())),
        }
    }
}

fn close_end(cf: Option<CloseFrame>) -> End {
    match cf {
        Some(cf) if cf.code == CloseCode::Policy => {
            let reason = cf.reason.to_string();
            // "too many validation errors" names no time: the hub's cooldown starts at 30 s.
            let wait = cooldown_from_reason(&reason).unwrap_or(Duration::from_secs(30));
            End::Cooldown(wait, reason)
        }
        Some(cf) => End::Lost(format!(
            "hub closed the socket: {} {}",
            u16::from(cf.code),
            cf.reason
        )),
        None => End::Lost("hub closed the socket".into()),
    }
}

/// One identified connection.
struct Connection<'a> {
    cfg: &'a Config,
    budget: &'a RateBudget,
    events: &'a mpsc::Sender<LinkEvent>,
    ops: &'a Ops,
    epoch: u64,
    /// Lifecycle frames waiting for a budget token, in order.
    held: VecDeque<OutFrame>,
    /// (ping number, task id): report the task when that ping's pong arrives.
    barriers: VecDeque<(u64, String)>,
    pings_sent: u64,
    pongs: u64,
    /// The last `task_assign` read on this connection and when its text came off the
    /// socket: the start of the daemon's own share of the task's turnaround (see
    /// [`TURNAROUND`]).
    assigned: Option<(String, Instant)>,
}

/// The tracing target of one debug line per answer to a `task_assign` (`task_accepted`,
/// then `task_complete` or `task_failed`): microseconds from the assignment's text read off
/// the socket to the answer written to it. The part of a hub's round trip the daemon
/// controls, without the network and the hub; `RUST_LOG=info,hub_sidecar::turnaround=debug`
/// shows it (the benchmark reads it, BENCHMARKS.md figure 3g). The runner adds a line as
/// the task passes each phase (`phase=prepared`, `executed`, `verified`, `stored`): their
/// timestamps say where the time between the two answers goes.
pub const TURNAROUND: &str = "hub_sidecar::turnaround";

impl Connection<'_> {
    async fn serve(
        &mut self,
        ws: Ws,
        out: &mut mpsc::Receiver<OutFrame>,
        sampler: &mut ResourceSampler,
        resync: &Notify,
        cancel: &CancellationToken,
    ) -> End {
        let (mut sink, mut stream) = ws.split();
        let ping_every = self.cfg.ping_interval();
        let mut ping_tick = tokio::time::interval_at(Instant::now() + ping_every, ping_every);
        ping_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let report_every = Duration::from_secs(self.cfg.resource_report_interval_secs.max(1));
        // The first report soon after identify (dashboards want it), then every interval.
        let first_report = report_every.min(Duration::from_secs(5));
        let mut report_tick = tokio::time::interval_at(Instant::now() + first_report, report_every);
        report_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut unanswered_since: Option<Instant> = None;
        let far = Duration::from_secs(86_400);
        loop {
            let pong_deadline = unanswered_since
                .map(|t| t + self.cfg.pong_timeout())
                .unwrap_or_else(|| Instant::now() + far);
            let held_wait = if self.held.is_empty() {
                far
            } else {
                self.budget.try_lifecycle_wait()
            };
            tokio::select! {
                _ = cancel.cancelled() => {
                    let close = CloseFrame { code: CloseCode::Normal, reason: "sidecar shutting down".into() };
                    let _ = tokio::time::timeout(Duration::from_secs(2), sink.send(Message::Close(Some(close)))).await;
                    return End::Shutdown;
                }
                _ = resync.notified() => {
                    let close = CloseFrame { code: CloseCode::Normal, reason: "sidecar reconnecting".into() };
                    let _ = tokio::time::timeout(Duration::from_secs(2), sink.send(Message::Close(Some(close)))).await;
                    return End::Resync;
                }
                msg = stream.next() => match msg {
                    Some(Ok(Message::Text(t))) => {
                        let arrived = Instant::now();
                        self.ops.frame_in();
                        match Inbound::parse(&t) {
                            Ok(Inbound::Pong { .. }) => {
                                self.pongs += 1;
                                self.ops.pong();
                                if self.pongs >= self.pings_sent {
                                    unanswered_since = None;
                                }
                                while self.barriers.front().is_some_and(|(n, _)| *n <= self.pongs) {
                                    let (_, task_id) = self.barriers.pop_front().expect("front checked");
                                    let _ = self.events.send(LinkEvent::Barrier { task_id }).await;
                                }
                            }
                            Ok(Inbound::RateLimitWarning { tier, remaining, .. }) => {
                                if tier == Some(RateTier::Normal) {
                                    self.budget.on_warning(remaining);
                                }
                            }
                            Ok(Inbound::RateLimited { retry_after_ms, tier }) => {
                                tracing::warn!(tier = ?tier, retry_after_ms, "hub rate-limited a frame");
                                self.ops.rate_limited();
                                if tier != Some(RateTier::Light) {
                                    self.budget.on_rate_limited(Duration::from_millis(retry_after_ms));
                                }
                                let _ = self.events.send(LinkEvent::Frame(Inbound::RateLimited { retry_after_ms, tier })).await;
                            }
                            Ok(Inbound::Other) => tracing::debug!(frame = %crate::util::truncate_chars(&t, 200), "hub frame ignored"),
                            Ok(frame) => {
                                if let Inbound::TaskAssign(task) = &frame {
                                    self.assigned = Some((task.task_id.clone(), arrived));
                                }
                                if self.events.send(LinkEvent::Frame(frame)).await.is_err() {
                                    return End::Shutdown;
                                }
                            }
                            Err(e) => tracing::warn!(error = %e, frame = %crate::util::truncate_chars(&t, 200), "unusable hub frame ignored"),
                        }
                    }
                    Some(Ok(Message::Binary(b))) => tracing::warn!(bytes = b.len(), "binary frame from hub ignored"),
                    Some(Ok(Message::Close(cf))) => return close_end(cf),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return End::Lost(format!("hub link error: {e}")),
                    None => return End::Lost("hub closed the socket".into()),
                },
                f = out.recv() => {
                    let Some(f) = f else { return End::Shutdown };
                    if f.epoch != self.epoch {
                        tracing::debug!(frame = f.frame.kind(), "frame for an older connection dropped");
                        continue;
                    }
                    let is_progress = matches!(f.frame, Outbound::TaskProgress { .. });
                    if is_progress || f.frame.tier() != RateTier::Normal {
                        // Progress frames took their token in the pump.
                        if let Err(e) = self.write(&mut sink, f).await { return e; }
                    } else {
                        self.held.push_back(f);
                        if let Err(e) = self.flush_held(&mut sink).await { return e; }
                    }
                }
                _ = tokio::time::sleep(held_wait) => {
                    if let Err(e) = self.flush_held(&mut sink).await { return e; }
                }
                _ = ping_tick.tick() => {
                    if let Err(e) = self.ping(&mut sink).await { return e; }
                    unanswered_since.get_or_insert_with(Instant::now);
                }
                _ = tokio::time::sleep_until(pong_deadline) => {
                    return End::Lost(format!("no pong within {} s: dead link", self.cfg.pong_timeout_secs));
                }
                _ = report_tick.tick() => {
                    // Resource reports share the "normal" budget; never from the reserve.
                    if self.budget.try_progress().is_ok() {
                        let report = sampler.report().await;
                        if let Err(e) = self.write(&mut sink, OutFrame { frame: report, epoch: self.epoch, barrier: None }).await { return e; }
                    }
                }
            }
        }
    }

    /// Send held lifecycle frames while the budget allows.
    async fn flush_held<S>(&mut self, sink: &mut S) -> Result<(), End>
    where
        S: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
    {
        while !self.held.is_empty() {
            if self.budget.try_lifecycle().is_err() {
                return Ok(());
            }
            let f = self.held.pop_front().expect("non-empty");
            self.write(sink, f).await?;
        }
        Ok(())
    }

    async fn ping<S>(&mut self, sink: &mut S) -> Result<(), End>
    where
        S: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
    {
        self.pings_sent += 1;
        self.send_text(sink, Outbound::Ping.to_text(), "ping").await
    }

    async fn write<S>(&mut self, sink: &mut S, f: OutFrame) -> Result<(), End>
    where
        S: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
    {
        let kind = f.frame.kind();
        self.send_text(sink, f.frame.to_text(), kind).await?;
        self.turnaround(&f.frame);
        if let Some(task_id) = f.barrier {
            self.ping(sink).await?;
            self.barriers.push_back((self.pings_sent, task_id));
        }
        Ok(())
    }

    /// `frame` was just written: when it answers the last `task_assign`, log how long the
    /// daemon took (see [`TURNAROUND`]).
    fn turnaround(&self, frame: &Outbound) {
        let task_id = match frame {
            Outbound::TaskAccepted { task_id }
            | Outbound::TaskComplete { task_id, .. }
            | Outbound::TaskFailed { task_id, .. } => task_id,
            _ => return,
        };
        if let Some((assigned, at)) = &self.assigned {
            if assigned == task_id {
                tracing::debug!(target: TURNAROUND, task_id = %task_id, frame = frame.kind(), micros = at.elapsed().as_micros() as u64, "answered task_assign");
            }
        }
    }

    async fn send_text<S>(
        &mut self,
        sink: &mut S,
        text: String,
        kind: &'static str,
    ) -> Result<(), End>
    where
        S: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
    {
        match tokio::time::timeout(WRITE_TIMEOUT, sink.send(Message::text(text))).await {
            Ok(Ok(())) => {
                self.ops.frame_out(kind);
                tracing::trace!(frame = kind, "sent");
                Ok(())
            }
            Ok(Err(e)) => Err(End::Lost(format!("writing {kind} failed: {e}"))),
            Err(_) => Err(End::Lost(format!(
                "writing {kind} did not complete in {} s: the hub stopped reading",
                WRITE_TIMEOUT.as_secs()
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
