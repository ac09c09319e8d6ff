//! The daemon's HTTP proxy for one task under `[network] mode = "allowlist"`: the task's only
//! way out of its network namespace.
//!
//! Owns the listeners on `127.0.0.1:3128` inside the task's children's network namespaces
//! (each child binds one there and hands it to the daemon, see `handoff.rs`; the proxy accepts
//! on it directly, a socket keeping its namespace wherever its descriptor goes), the allowlist
//! check and the per-host tally of what was allowed or refused. `HTTP_PROXY`/`HTTPS_PROXY`
//! point the tools there. It speaks `CONNECT host:port` (HTTPS and anything tunnelled: the
//! bytes pass through untouched, no TLS interception) and plain `http://` requests in absolute
//! form; the host is checked before anything is connected, so a refused host never sees a
//! packet.
//!
//! A child's listener is served for as long as the [`Lease`] the spawn path holds while the
//! child's process tree runs; dropping it stops accepting and ends the child's connections,
//! so no socket (and no network namespace) of an ended child stays behind. Dropping the
//! [`Proxy`] ends everything of the task.
//!
//! Why a namespace and a proxy rather than Landlock's TCP rules: Landlock (ABI ≥ 4) filters
//! by port only, so a task allowed the proxy's port could reach any host on that port, and it
//! does not cover UDP (DNS) or other socket families without a seccomp filter beside it. A
//! network namespace has no route out at all; the proxy decides by host name.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::{CancellationToken, DropGuard};

/// Most bytes of a request head (request line and headers).
const MAX_HEAD: usize = 16 * 1024;

/// One host's use through the proxy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HostUse {
    /// `host:port` as asked for.
    pub target: String,
    /// Whether the allowlist let it through.
    pub allowed: bool,
    /// Connections made (or refused).
    pub connections: u64,
    /// Bytes from the task to the host.
    pub bytes_up: u64,
    /// Bytes from the host to the task.
    pub bytes_down: u64,
    /// Connections to an allowed host that could not be made (the proxy answered 502).
    #[serde(skip_serializing_if = "is_zero")]
    pub unreachable: u64,
    /// Why the last of those failed (the connect error), for the task's infrastructure error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

type Tally = Arc<Mutex<Vec<HostUse>>>;

/// A task's proxy; it stops serving every child's listener when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// The runtime the listeners are served on.
    handle: tokio::runtime::Handle,
    allow: Arc<Vec<String>>,
    tally: Tally,
    /// Children's listeners served now.
    live: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One child's listener being served; dropping it stops accepting and ends the child's
/// connections.
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

impl Proxy {
    /// A proxy serving `allow` (host names; `*.example.com` or `.example.com` for a domain and
    /// its subdomains). Needs a Tokio runtime (the blocking pool's is fine); listeners are
    /// served on it.
    pub fn start(allow: Vec<String>) -> io::Result<Proxy> {
        let handle = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        Ok(Proxy {
            handle,
            allow: Arc::new(allow),
            tally: Arc::default(),
            live: Arc::default(),
            stop: CancellationToken::new(),
        })
    }

    /// Serve a child's listener (already checked, see `handoff.rs`) until the returned lease
    /// or the proxy is dropped.
    pub(crate) fn serve(&self, listener: std::net::TcpListener) -> io::Result<Lease> {
        listener.set_nonblocking(true)?;
        let _enter = self.handle.enter();
        let listener = TcpListener::from_std(listener)?;
        let stop = self.stop.child_token();
        self.live.fetch_add(1, Ordering::SeqCst);
        let live = Live(self.live.clone());
        let (allow, tally, s) = (self.allow.clone(), self.tally.clone(), stop.clone());
        self.handle.spawn(async move {
            let _live = live;
            loop {
                let conn = tokio::select! {
                    _ = s.cancelled() => break,
                    c = listener.accept() => c,
                };
                let Ok((conn, _)) = conn else { continue };
                let (allow, t, s) = (allow.clone(), tally.clone(), s.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = s.cancelled() => {}
                        _ = serve(conn, &allow, &t) => {}
                    }
                });
            }
        });
        Ok(Lease {
            _stop: stop.drop_guard(),
        })
    }

    /// Every host asked for so far, in order of first use.
    pub fn hosts(&self) -> Vec<HostUse> {
        self.tally.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Children's listeners served now: one per running child of the task.
    pub fn listeners(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

/// Whether `host` is on `allow`.
pub fn allowed(host: &str, allow: &[String]) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    allow.iter().any(|a| {
        let a = a.to_ascii_lowercase();
        match a.strip_prefix("*.").or_else(|| a.strip_prefix('.')) {
            Some(domain) => host == domain || host.ends_with(&format!(".{domain}")),
            None => host == a,
        }
    })
}

/// The host of a git remote URL (`https://user@host:port/path`, `ssh://host/path`,
/// `git@host:path`), for the allowlist; `None` for a local path.
pub fn remote_host(url: &str) -> Option<String> {
    let url = url.trim();
    let rest = match url.split_once("://") {
        Some(("file", _)) => return None,
        Some((_, rest)) => rest,
        // scp-like `user@host:path`; a path has no `:` before its first `/`.
        None => match url.split_once(':') {
            Some((before, _)) if !before.contains('/') => before,
            _ => return None,
        },
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, _) = split_host_port(hostport, 0)?;
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

fn note(tally: &Tally, target: &str, allowed: bool, up: u64, down: u64) {
    let Ok(mut t) = tally.lock() else { return };
    match t
        .iter_mut()
        .find(|h| h.target == target && h.allowed == allowed)
    {
        Some(h) => {
            h.connections += 1;
            h.bytes_up += up;
            h.bytes_down += down;
        }
        None => t.push(HostUse {
            target: target.to_string(),
            allowed,
            connections: 1,
            bytes_up: up,
            bytes_down: down,
            unreachable: 0,
            last_error: None,
        }),
    }
}

/// An allowed host that could not be reached: counted as a connection, and why it failed.
fn note_unreachable(tally: &Tally, target: &str, error: &std::io::Error) {
    note(tally, target, true, 0, 0);
    let Ok(mut t) = tally.lock() else { return };
    if let Some(h) = t.iter_mut().find(|h| h.target == target && h.allowed) {
        h.unreachable += 1;
        h.last_error = Some(error.to_string());
    }
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

async fn serve(mut conn: TcpStream, allow: &[String], tally: &Tally) {
    let _ = conn.set_nodelay(true);
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head[..head.iter().position(|b| *b == b'\r').unwrap_or(0)])
        .into_owned();
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let connect = method.eq_ignore_ascii_case("CONNECT");
    let hostport = if connect {
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
    let shown = format!("{host}:{port}");
    if !allowed(&host, allow) {
        note(tally, &shown, false, 0, 0);
        let body = format!(
            "hub-sidecar: {host} is not in the task's network allowlist; add it to [network] allow in the daemon's config if tasks need it\n"
        );
        let reply = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = conn.write_all(reply.as_bytes()).await;
        return;
    }
    let mut up = match TcpStream::connect((host.as_str(), port)).await {
        Ok(u) => u,
        Err(e) => {
            note_unreachable(tally, &shown, &e);
            let body = format!("hub-sidecar: cannot connect to {shown}: {e}\n");
            let reply = format!(
                "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(reply.as_bytes()).await;
            return;
        }
    };
    let _ = up.set_nodelay(true);
    let (sent, first) = if connect {
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
    note(tally, &shown, true, first + a, b);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tunnel carries what the client sent right behind its CONNECT, both ways to each
    /// half-close, counts the bytes, and stops with its lease.
    #[tokio::test]
    async fn a_tunnel_carries_early_bytes_and_half_closes_and_counts_them() {
        // Upstream: echoes everything, then closes when the client has.
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = echo.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            s.write_all(&got).await.unwrap();
        });
        let proxy = Proxy::start(vec!["127.0.0.1".into()]).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let lease = proxy.serve(listener).unwrap();
        assert_eq!(proxy.listeners(), 1);

        let mut c = TcpStream::connect(at).await.unwrap();
        let early = vec![7u8; 300_000];
        let mut req = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").into_bytes();
        req.extend_from_slice(&early[..100]);
        c.write_all(&req).await.unwrap();
        c.write_all(&early[100..]).await.unwrap();
        c.shutdown().await.unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).await.unwrap();
        let answer = b"HTTP/1.1 200 Connection established\r\n\r\n";
        assert!(back.starts_with(answer));
        let echoed = &back[answer.len()..];
        assert!(
            echoed == early,
            "{} of {} bytes came back",
            echoed.len(),
            early.len()
        );
        let target = format!("127.0.0.1:{port}");
        let counted = || {
            proxy
                .hosts()
                .first()
                .map(|h| (h.target.clone(), h.bytes_up, h.bytes_down))
        };
        for _ in 0..500 {
            if counted().is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(counted(), Some((target, 300_000, 300_000)));
        drop(lease);
        for _ in 0..500 {
            if proxy.listeners() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(proxy.listeners(), 0);
    }

    #[test]
    fn a_plain_request_reaches_the_origin_in_origin_form_and_closes() {
        let head = b"POST http://api.example:8080/v1/messages?beta=1 HTTP/1.1\r\nHost: api.example:8080\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(
            String::from_utf8(to_origin(head)).unwrap(),
            "POST /v1/messages?beta=1 HTTP/1.1\r\nHost: api.example:8080\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        );
        let bare = b"GET http://h.example HTTP/1.1\r\nHost: h.example\r\n\r\n";
        assert!(String::from_utf8(to_origin(bare))
            .unwrap()
            .starts_with("GET / HTTP/1.1\r\n"));
    }

    #[test]
    fn hosts_match_exactly_or_by_domain() {
        let allow = vec!["crates.io".to_string(), "*.npmjs.org".to_string()];
        assert!(allowed("crates.io", &allow));
        assert!(allowed("CRATES.IO.", &allow));
        assert!(!allowed("static.crates.io", &allow));
        assert!(!allowed("evilcrates.io", &allow));
        assert!(allowed("registry.npmjs.org", &allow));
        assert!(allowed("npmjs.org", &allow));
        assert!(!allowed("npmjs.org.evil.test", &allow));
    }

    #[test]
    fn a_remotes_host_is_found_in_every_url_form_git_takes() {
        for (url, host) in [
            (
                "https://user:pw@Git.Example.test:8443/org/repo.git",
                Some("git.example.test"),
            ),
            (
                "ssh://git@git.example.test/org/repo",
                Some("git.example.test"),
            ),
            (
                "git@git.example.test:org/repo.git",
                Some("git.example.test"),
            ),
            ("/srv/git/repo.git", None),
            ("file:///srv/git/repo.git", None),
        ] {
            assert_eq!(remote_host(url).as_deref(), host, "{url}");
        }
    }

    #[test]
    fn host_and_port_are_split_for_names_and_v6() {
        assert_eq!(
            split_host_port("a.test:8443", 443),
            Some(("a.test".into(), 8443))
        );
        assert_eq!(split_host_port("a.test", 80), Some(("a.test".into(), 80)));
        assert_eq!(split_host_port("[::1]:81", 80), Some(("::1".into(), 81)));
        assert_eq!(split_host_port("a.test:x", 80), None);
    }
}
