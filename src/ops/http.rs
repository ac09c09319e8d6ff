//! `/healthz` and `/metrics`: a tiny HTTP/1.1 responder on tokio.
//!
//! Owns the listener and one short-lived task per connection. Two read-only routes do not
//! justify an HTTP server stack, so this reads one request head (bounded size and time),
//! writes one response and closes the connection (`Connection: close`): no keep-alive, no
//! bodies, nothing to get wrong. Off unless `metrics_addr` is set.
//!
//! - `GET /healthz`: 200 and [`super::HealthSnapshot`] as JSON while identified with the
//!   hub, 503 with the same JSON otherwise.
//! - `GET /metrics`: the Prometheus/OpenMetrics text exposition.
//! - `GET /status`: [`super::StatusSnapshot`] as JSON (link, current task and attempt with
//!   elapsed time, today's spend against the daily budget), for `hub-sidecar status`.
//! - anything else: 404 (405 for methods other than GET/HEAD).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Ops;

/// The content type Prometheus expects for the OpenMetrics text `prometheus-client` writes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Largest request head read; scrapers send a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;
/// A client that has not sent its request head by then is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Bind `addr` for [`serve`]. Warns when the address is not loopback: the endpoints need
/// no token, so anyone who can reach the port can read them.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(addr).await.with_context(|| {
        format!(
            "cannot serve /healthz and /metrics on metrics_addr {addr}: the address is in use \
             or not available on this host; pick another metrics_addr or unset it"
        )
    })?;
    if !addr.ip().is_loopback() {
        tracing::warn!(metrics_addr = %addr, "health and metrics are served on a non-loopback address without authentication; prefer 127.0.0.1 and a scraper on this host");
    }
    Ok(listener)
}

/// Serve until `cancel`, then wait for the connections in flight (each is bounded by
/// [`READ_TIMEOUT`]).
pub async fn serve(listener: TcpListener, ops: Ops, cancel: CancellationToken) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(addr = %addr, "serving /healthz and /metrics");
    }
    let conns = TaskTracker::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(handle(stream, ops.clone()));
                }
                Err(e) => {
                    // Usually EMFILE: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    conns.close();
    conns.wait().await;
}

/// One request, one response (over TCP, or the unix socket of [`super::socket`]).
pub(crate) async fn handle<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, ops: Ops) {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(Some(head))) => head,
        _ => return,
    };
    let resp = respond(&head, &ops);
    let _ = tokio::time::timeout(READ_TIMEOUT, async {
        stream.write_all(&resp).await?;
        stream.shutdown().await
    })
    .await;
}

/// Read up to the blank line ending the request head; `None` if the client sent too much
/// or closed early.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
    }
}

/// The full response bytes for a request head.
pub fn respond(head: &str, ops: &Ops) -> Vec<u8> {
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n".to_string(),
        )
    } else {
        match path {
            "/healthz" => {
                let snap = ops.snapshot();
                let status = if snap.identified {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let body = serde_json::to_string(&snap).expect("snapshot serializes") + "\n";
                (status, "application/json", body)
            }
            "/metrics" => ("200 OK", METRICS_CONTENT_TYPE, ops.metrics().encode()),
            "/status" => {
                let body = serde_json::to_string(&ops.status_snapshot())
                    .expect("status serializes")
                    + "\n";
                ("200 OK", "application/json", body)
            }
            _ => (
                "404 Not Found",
                "text/plain; charset=utf-8",
                "not found: try /healthz, /metrics or /status\n".to_string(),
            ),
        }
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// Bind `addr` and serve on a tracked task until `cancel`; the bound address (useful with
/// port 0).
pub async fn start(
    addr: SocketAddr,
    ops: Ops,
    cancel: CancellationToken,
    tracker: &TaskTracker,
) -> anyhow::Result<SocketAddr> {
    let listener = bind(addr).await?;
    let local = listener
        .local_addr()
        .context("reading the metrics address")?;
    tracker.spawn(serve(listener, ops, cancel));
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(head: &str, ops: &Ops) -> String {
        String::from_utf8(respond(head, ops)).unwrap()
    }

    #[test]
    fn healthz_is_503_until_identified_then_200() {
        let ops = Ops::new();
        let r = text("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", &ops);
        assert!(r.starts_with("HTTP/1.1 503 "), "{r}");
        assert!(r.contains("\"identified\":false"), "{r}");
        ops.link_state(true);
        let r = text("GET /healthz?verbose=1 HTTP/1.1\r\n\r\n", &ops);
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        assert!(r.contains("application/json"));
    }

    #[test]
    fn metrics_has_the_openmetrics_type_and_length() {
        let ops = Ops::new();
        let r = text("GET /metrics HTTP/1.0\r\n\r\n", &ops);
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(METRICS_CONTENT_TYPE));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        assert!(body.ends_with("# EOF\n"));
    }

    #[test]
    fn other_paths_and_methods_are_refused() {
        let ops = Ops::new();
        assert!(text("GET / HTTP/1.1\r\n\r\n", &ops).starts_with("HTTP/1.1 404"));
        assert!(text("POST /metrics HTTP/1.1\r\n\r\n", &ops).starts_with("HTTP/1.1 405"));
        assert!(text("garbage\r\n\r\n", &ops).starts_with("HTTP/1.1 405"));
        let head = text("HEAD /metrics HTTP/1.1\r\n\r\n", &ops);
        assert!(head.ends_with("\r\n\r\n"), "HEAD has no body");
    }

    #[tokio::test]
    async fn serves_over_tcp_and_stops_on_cancel() {
        let ops = Ops::new();
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let addr = start(
            "127.0.0.1:0".parse().unwrap(),
            ops.clone(),
            cancel.clone(),
            &tracker,
        )
        .await
        .unwrap();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.contains("# TYPE hub_sidecar_hub_connected gauge"));
        cancel.cancel();
        tracker.close();
        tokio::time::timeout(Duration::from_secs(5), tracker.wait())
            .await
            .expect("server stops on cancel");
    }

    #[tokio::test]
    async fn a_taken_port_is_a_clear_error() {
        let held = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = bind(held.local_addr().unwrap()).await.unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("metrics_addr"), "{msg}");
    }
}
