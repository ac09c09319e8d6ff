//! The daemon's HTTP proxy for one task under `[network] mode = "allowlist"`: the task's only
//! way out of its network namespace.
//!
//! Owns the listener on `127.0.0.1:3128` inside the task's network namespace (bound once by
//! the holder of the task's view, see `netns.rs`, checked in `handoff.rs`; the proxy accepts
//! on it directly, a socket keeping its namespace wherever its descriptor goes) and the
//! connections made through it. `HTTP_PROXY`/`HTTPS_PROXY` point the tools there. It
//! speaks `CONNECT host:port` (HTTPS and anything tunnelled: the bytes pass through
//! untouched, no TLS interception) and plain `http://` requests in absolute form. What may
//! pass is decided by `allowlist.rs` — by name and port before anything is resolved, then by
//! the resolved address, which is the one connected to — so a refused target never sees a
//! packet; what passed or was refused is counted in `tally.rs`.
//!
//! Whatever a task does with it, the proxy costs the daemon a bounded share of its
//! descriptors and memory: at most [`descriptors::proxy_connections`] connections of a task
//! at once (one more is answered 503 and closed), a request head of at most 16 KiB that must
//! arrive within [`HEAD_TIMEOUT`], accept loops that pause when the kernel has no descriptor
//! to give, and a bounded tally.
//!
//! The task's listener is served for as long as the [`Lease`] its sandbox holds, from the
//! sandbox's making to its end, whichever children run; dropping it stops accepting and ends
//! the task's connections, so no socket (and no network namespace) of an ended task stays
//! behind. Dropping the [`Proxy`] ends everything of the task.
//!
//! Why a namespace and a proxy rather than Landlock's TCP rules: Landlock (ABI ≥ 4) filters
//! by port only, so a task allowed the proxy's port could reach any host on that port, and it
//! does not cover UDP (DNS) or other socket families without a seccomp filter beside it. A
//! network namespace has no route out at all; the proxy decides by host name, port and address.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::allowlist::{Allowlist, Refusal};
use super::descriptors;
use super::tally::Tally;
pub use super::tally::{HostUse, OTHERS as OTHER_TARGETS};

/// Most bytes of a request head (request line and headers).
const MAX_HEAD: usize = 16 * 1024;
/// A connection that has not sent its whole request head by then is closed: an idle
/// connection holds a descriptor and one of the task's connection slots.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Resolving and connecting to an allowed host, at most.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The first and the longest pause of an accept loop the kernel refuses a descriptor
/// (`EMFILE`, `ENFILE`): the connection waits in the backlog, and retrying at once would
/// spin.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

/// A task's proxy; it stops serving the task's listener when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// The runtime the listeners are served on.
    handle: tokio::runtime::Handle,
    allow: Arc<Allowlist>,
    tally: Tally,
    /// The task's connection slots ([`descriptors::proxy_connections`]): every connection
    /// holds one from accept to close, across all of the task's listeners.
    slots: Arc<Semaphore>,
    /// Listeners served now (the task's one, from its sandbox's making to its end).
    live: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A listener being served (the task's, held by its sandbox); dropping it stops accepting
/// and ends the connections made through it.
#[derive(Debug)]
pub struct Lease {
    _stop: DropGuard,
}

/// Counts a served listener until dropped (at the end of its accept loop, however it ends).
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one listener's connections share.
#[derive(Clone)]
struct Shared {
    allow: Arc<Allowlist>,
    tally: Tally,
    slots: Arc<Semaphore>,
    stop: CancellationToken,
}

impl Proxy {
    /// A proxy letting through what `allow` lets through (see `allowlist.rs`), holding at
    /// most [`descriptors::proxy_connections`] connections at once. Needs a Tokio runtime
    /// (the blocking pool's is fine); listeners are served on it.
    pub fn start(allow: Allowlist) -> io::Result<Proxy> {
        Proxy::with_slots(
            allow,
            descriptors::proxy_connections(descriptors::soft_limit()),
        )
    }

    /// [`Proxy::start`] with `slots` connections at most.
    pub fn with_slots(allow: Allowlist, slots: usize) -> io::Result<Proxy> {
        let handle = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        Ok(Proxy {
            handle,
            allow: Arc::new(allow),
            tally: Tally::default(),
            slots: Arc::new(Semaphore::new(slots)),
            live: Arc::default(),
            stop: CancellationToken::new(),
        })
    }

    /// Serve the task's listener (already checked, see `handoff.rs`) until the returned lease
    /// or the proxy is dropped.
    pub(crate) fn serve(&self, listener: std::net::TcpListener) -> io::Result<Lease> {
        listener.set_nonblocking(true)?;
        let _enter = self.handle.enter();
        let listener = TcpListener::from_std(listener)?;
        let stop = self.stop.child_token();
        self.live.fetch_add(1, Ordering::SeqCst);
        let live = Live(self.live.clone());
        let shared = Shared {
            allow: self.allow.clone(),
            tally: self.tally.clone(),
            slots: self.slots.clone(),
            stop: stop.clone(),
        };
        self.handle.spawn(async move {
            let _live = live;
            accept_loop(listener, shared).await;
        });
        Ok(Lease {
            _stop: stop.drop_guard(),
        })
    }

    /// Every host asked for so far, in order of first use (bounded: see `tally.rs`).
    pub fn hosts(&self) -> Vec<HostUse> {
        self.tally.hosts()
    }

    /// Listeners served now: under a sandbox, the task's one while the sandbox lives (no
    /// longer one per running child: the task's children share its network namespace).
    pub fn listeners(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

/// Accept until stopped. A connection beyond the task's slots is answered 503 and closed
/// unread; when the kernel has no descriptor to give, the loop pauses (doubling up to a
/// second) rather than spin on a listener that stays readable.
async fn accept_loop(listener: TcpListener, shared: Shared) {
    let mut pause = ACCEPT_BACKOFF.0;
    loop {
        let accepted = tokio::select! {
            _ = shared.stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let conn = match accepted {
            Ok((conn, _)) => {
                pause = ACCEPT_BACKOFF.0;
                conn
            }
            Err(e) if out_of_descriptors(&e) => {
                tracing::warn!(error = %e, pause_ms = pause.as_millis() as u64, "task proxy: no descriptor to accept with; pausing");
                tokio::select! {
                    _ = shared.stop.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(ACCEPT_BACKOFF.1);
                continue;
            }
            // The peer gave up before the accept (ECONNABORTED) and the like.
            Err(_) => continue,
        };
        let Ok(slot) = shared.slots.clone().try_acquire_owned() else {
            shared.tally.note_shed();
            let _ = conn.try_write(
                b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 62\r\n\r\nhub-sidecar: too many connections to the proxy from this task\n",
            );
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _slot = slot;
            tokio::select! {
                _ = shared.stop.cancelled() => {}
                _ = serve(conn, &shared.allow, &shared.tally) => {}
            }
        });
    }
}

/// Whether an accept failed for want of descriptors or memory: the kind that retrying at
/// once cannot cure.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// The host of a git remote URL as an allowlist entry, `host:port` with the scheme's port
/// (`https://user@host:port/path`, `ssh://host/path`, `git@host:path`); `None` for a
/// local path.
pub fn remote_host(url: &str) -> Option<String> {
    let url = url.trim();
    let (scheme, rest) = match url.split_once("://") {
        Some(("file", _)) => return None,
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        // scp-like `user@host:path`; a path has no `:` before its first `/`.
        None => match url.split_once(':') {
            Some((before, _)) if !before.contains('/') => ("ssh".to_string(), before),
            _ => return None,
        },
    };
    let default_port = match scheme.as_str() {
        "https" => 443,
        "http" => 80,
        "ssh" | "git+ssh" | "ssh+git" => 22,
        "git" => 9418,
        _ => 0,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = split_host_port(hostport, default_port)?;
    if host.is_empty() {
        return None;
    }
    let host = host.to_ascii_lowercase();
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    Some(match port {
        0 => host,
        p => format!("{host}:{p}"),
    })
}

/// `host` and `port` of `host:port` (`[v6]:port` too).
fn split_host_port(s: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => default_port,
        };
        return Some((h.to_string(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((s.to_string(), default_port)),
    }
}

/// A plain-HTTP request as a proxy forwards it to the origin: the target in origin form
/// (`/path?query`; many servers do not take the absolute form a client sends a proxy),
/// hop-by-hop connection headers dropped and `Connection: close` set, so the next request
/// comes as a new proxy request and has its host checked. Bytes after the head (a body's
/// start) are kept as they are.
fn to_origin(head: &[u8]) -> Vec<u8> {
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(head.len(), |p| p + 4);
    let (top, rest) = head.split_at(end);
    let mut lines = top
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let mut out = Vec::with_capacity(head.len() + 20);
    if let Some(first) = lines.next() {
        let mut words = first.splitn(3, |b| *b == b' ');
        let (method, target, version) = (words.next(), words.next(), words.next());
        let path = target.and_then(|t| t.strip_prefix(b"http://")).map(|rest| {
            match rest.iter().position(|b| *b == b'/' || *b == b'?') {
                Some(i) if rest[i] == b'/' => rest[i..].to_vec(),
                Some(i) => [b"/".as_slice(), &rest[i..]].concat(),
                None => b"/".to_vec(),
            }
        });
        match (method, path, version) {
            (Some(m), Some(p), Some(v)) => {
                out.extend_from_slice(m);
                out.push(b' ');
                out.extend_from_slice(&p);
                out.push(b' ');
                out.extend_from_slice(v);
            }
            _ => out.extend_from_slice(first),
        }
        out.extend_from_slice(b"\r\n");
    }
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(|b| *b == b':').next().unwrap_or(b"");
        let hop = [b"connection".as_slice(), b"proxy-connection", b"keep-alive"]
            .iter()
            .any(|h| name.trim_ascii().eq_ignore_ascii_case(h));
        if !hop {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(rest);
    out
}

/// A response with a plain-text body, closing the connection.
fn reply(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The request head (and any bytes behind it), or `None` when the client closed, sent too
/// much, or did not finish it within [`HEAD_TIMEOUT`].
async fn read_head(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let read = async {
        let mut head = Vec::with_capacity(1024);
        let mut chunk = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            if head.len() > MAX_HEAD {
                return None;
            }
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        Some(head)
    };
    tokio::time::timeout(HEAD_TIMEOUT, read)
        .await
        .ok()
        .flatten()
}

/// Why no address of an allowed name may be connected to.
enum Unresolved {
    /// Every address is this host's own, of this kind, and no entry names the
    /// `host:port` exactly: refused.
    HostOwn(&'static str),
    /// The name did not resolve: unreachable.
    Failed(io::Error),
}

/// Resolve `host` and keep the addresses the allowlist lets the proxy connect to.
async fn resolve(allow: &Allowlist, host: &str, port: u16) -> Result<Vec<SocketAddr>, Unresolved> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(Unresolved::Failed)?
        .collect();
    allow.addresses(host, port, &addrs).map_err(|r| match r {
        Refusal::HostOwn(kind) => Unresolved::HostOwn(kind),
        Refusal::NotListed => Unresolved::Failed(io::Error::new(
            io::ErrorKind::NotFound,
            "the name resolved to no address",
        )),
    })
}

/// Connect to the first of `addrs` that answers.
async fn connect(addrs: &[SocketAddr]) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

async fn serve(mut conn: TcpStream, allow: &Allowlist, tally: &Tally) {
    let _ = conn.set_nodelay(true);
    let Some(head) = read_head(&mut conn).await else {
        return;
    };
    let line = String::from_utf8_lossy(&head[..head.iter().position(|b| *b == b'\r').unwrap_or(0)])
        .into_owned();
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let connect_method = method.eq_ignore_ascii_case("CONNECT");
    let hostport = if connect_method {
        split_host_port(target, 443)
    } else {
        target
            .strip_prefix("http://")
            .map(|rest| rest.split(['/', '?']).next().unwrap_or(rest))
            .and_then(|hp| split_host_port(hp, 80))
    };
    let Some((host, port)) = hostport else {
        let _ = conn
            .write_all(
                b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            )
            .await;
        return;
    };
    let shown = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    if !allow.lets_through(&host, port) {
        tally.note(&shown, false, 0, 0);
        let body = format!(
            "hub-sidecar: {shown} is not in the task's network allowlist; add it to [network] allow in the daemon's config if tasks need it (a bare host allows ports 80 and 443, host:port another port)\n"
        );
        let _ = conn.write_all(&reply("403 Forbidden", &body)).await;
        return;
    }
    let resolved = tokio::time::timeout(CONNECT_TIMEOUT, resolve(allow, &host, port))
        .await
        .unwrap_or_else(|_| {
            Err(Unresolved::Failed(io::Error::new(
                io::ErrorKind::TimedOut,
                "resolving the name timed out",
            )))
        });
    let addrs = match resolved {
        Ok(a) => a,
        Err(Unresolved::HostOwn(kind)) => {
            tally.note(&shown, false, 0, 0);
            let body = format!(
                "hub-sidecar: {shown} is refused: it resolves to a {kind} address of the daemon's host, which tasks reach only where [network] allow names this exact host:port\n"
            );
            let _ = conn.write_all(&reply("403 Forbidden", &body)).await;
            return;
        }
        Err(Unresolved::Failed(e)) => {
            tally.note_unreachable(&shown, &e);
            let body = format!("hub-sidecar: cannot connect to {shown}: {e}\n");
            let _ = conn.write_all(&reply("502 Bad Gateway", &body)).await;
            return;
        }
    };
    let up = tokio::time::timeout(CONNECT_TIMEOUT, connect(&addrs))
        .await
        .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")));
    let mut up = match up {
        Ok(u) => u,
        Err(e) => {
            tally.note_unreachable(&shown, &e);
            let body = format!("hub-sidecar: cannot connect to {shown}: {e}\n");
            let _ = conn.write_all(&reply("502 Bad Gateway", &body)).await;
            return;
        }
    };
    let _ = up.set_nodelay(true);
    let (sent, first) = if connect_method {
        let mut sent = conn
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await;
        // What a client sent after its CONNECT without waiting for the answer (a TLS hello)
        // belongs to the tunnel.
        let end = head
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(head.len(), |p| p + 4);
        let early = &head[end..];
        if sent.is_ok() && !early.is_empty() {
            sent = up.write_all(early).await;
        }
        (sent, early.len() as u64)
    } else {
        let request = to_origin(&head);
        (up.write_all(&request).await, request.len() as u64)
    };
    if sent.is_err() {
        return;
    }
    // Bytes move between the two sockets in the kernel (`splice`), never through our memory.
    let (a, b) = super::splice::bidirectional(&conn, &up).await;
    tally.note(&shown, true, first + a, b);
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
