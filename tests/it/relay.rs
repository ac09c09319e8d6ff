//! A TCP relay between a sidecar and the mock hub that a test can cut: the network between
//! them, as an operator's flaky link behaves.
//!
//! - [`Relay::cut`]: every connection through it is closed on both sides (the hub sees the
//!   agent go, the sidecar sees EOF), and new connections are refused until
//!   [`Relay::heal`];
//! - [`Relay::blackhole`]: the connections stay open but nothing gets through either way
//!   (bytes are read and dropped): a silent link that only a missing pong reveals. New
//!   connections are held the same way. [`Relay::heal`] closes the blackholed connections
//!   (their byte streams lost data, a WebSocket cannot go on over them) and lets new ones
//!   through.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How the relay treats traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pass,
    Cut,
    Blackhole,
}

/// A relay on `127.0.0.1:0` to one upstream address.
pub(crate) struct Relay {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Cancelled to close every connection open now; replaced by a fresh one after.
    conns: std::sync::Mutex<CancellationToken>,
    accepted: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Relay {
    /// A relay forwarding to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> Arc<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Arc::new(Relay {
            addr: listener.local_addr().unwrap(),
            mode: watch::channel(Mode::Pass).0,
            conns: std::sync::Mutex::new(CancellationToken::new()),
            accepted: Arc::new(AtomicU64::new(0)),
            stop: CancellationToken::new(),
        });
        let r = relay.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = r.stop.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((down, _)) = accepted else { continue };
                if *r.mode.borrow() == Mode::Cut {
                    // Refused: closed at once.
                    drop(down);
                    continue;
                }
                r.accepted.fetch_add(1, Ordering::Relaxed);
                let cancel = r.conns.lock().unwrap().child_token();
                let mode = r.mode.subscribe();
                tokio::spawn(pipe(down, upstream, mode, cancel));
            }
        });
        relay
    }

    /// `hub_url` with its host and port replaced by the relay's.
    pub(crate) fn url_for(&self, hub_url: &str) -> String {
        let rest = hub_url.split_once("://").map_or(hub_url, |(_, r)| r);
        let path = rest.find('/').map_or("", |i| &rest[i..]);
        format!("ws://{}{path}", self.addr)
    }

    /// Close every connection on both sides and refuse new ones until [`Relay::heal`].
    pub(crate) fn cut(&self) {
        self.mode.send_replace(Mode::Cut);
        self.close_all();
    }

    /// Let nothing through, either way, on any connection, without closing them.
    pub(crate) fn blackhole(&self) {
        self.mode.send_replace(Mode::Blackhole);
    }

    /// Traffic passes again; connections that were blackholed are closed.
    pub(crate) fn heal(&self) {
        if *self.mode.borrow() == Mode::Blackhole {
            self.close_all();
        }
        self.mode.send_replace(Mode::Pass);
    }

    /// Connections accepted so far (refused ones not counted).
    pub(crate) fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    fn close_all(&self) {
        let mut conns = self.conns.lock().unwrap();
        conns.cancel();
        *conns = CancellationToken::new();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.cancel();
        self.close_all();
    }
}

/// One connection: bytes both ways while the mode is `Pass`, dropped while `Blackhole`;
/// both sockets closed on `cancel`.
async fn pipe(
    down: TcpStream,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
    cancel: CancellationToken,
) {
    let Ok(up) = TcpStream::connect(upstream).await else {
        return;
    };
    let (dr, dw) = down.into_split();
    let (ur, uw) = up.into_split();
    let one_way = |mut from: tokio::net::tcp::OwnedReadHalf,
                   mut to: tokio::net::tcp::OwnedWriteHalf,
                   mode: watch::Receiver<Mode>| async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if *mode.borrow() == Mode::Pass && to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let a = one_way(dr, uw, mode.clone());
    let b = one_way(ur, dw, mode);
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = a => {}
        _ = b => {}
    }
    // Dropping the halves closes both sockets.
}
