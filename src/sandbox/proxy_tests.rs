//! The proxy against real sockets on loopback: tunnels, refusals, slots, timeouts.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

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
    let proxy = Proxy::start(Allowlist::new([format!("127.0.0.1:{port}")])).unwrap();
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
fn a_remotes_host_is_found_in_every_url_form_git_takes() {
    for (url, host) in [
        (
            "https://user:pw@Git.Example.test:8443/org/repo.git",
            Some("git.example.test:8443"),
        ),
        (
            "ssh://git@git.example.test/org/repo",
            Some("git.example.test:22"),
        ),
        (
            "git@git.example.test:org/repo.git",
            Some("git.example.test:22"),
        ),
        ("http://[::1]/r.git", Some("[::1]:80")),
        ("https://h.test/r.git", Some("h.test:443")),
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

/// An HTTP server on `127.0.0.1` answering `ok` to every request; counts its connections.
async fn counting_server() -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            h.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    (port, hits)
}

/// A proxy allowing `allow`, serving one listener on loopback; its address.
fn proxy_at(allow: Allowlist, slots: usize) -> (Proxy, Lease, SocketAddr) {
    let proxy = Proxy::with_slots(allow, slots).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    let lease = proxy.serve(listener).unwrap();
    (proxy, lease, at)
}

/// Send `request` through the proxy at `at`; the whole answer (bounded wait: a proxy that
/// never answers fails the test instead of hanging it).
async fn ask(at: SocketAddr, request: &str) -> String {
    let mut c = TcpStream::connect(at).await.unwrap();
    c.write_all(request.as_bytes()).await.unwrap();
    let mut back = Vec::new();
    let read = tokio::time::timeout(CONNECT_TIMEOUT * 2, c.read_to_end(&mut back)).await;
    assert!(read.is_ok(), "no answer to {request:?}");
    String::from_utf8_lossy(&back).into_owned()
}

/// Every spelling of the host's loopback (and its link-local range, and a name that
/// resolves to the host itself), allowed by name on every port, is refused once resolved:
/// nothing is connected. Only an entry naming the exact `host:port` reaches it.
#[tokio::test]
async fn every_spelling_of_the_hosts_own_addresses_is_refused_unless_named_exactly() {
    let (port, hits) = counting_server().await;
    let mut spellings: Vec<String> = [
        "127.0.0.1",
        "127.3.2.1",
        "localhost",
        "LOCALHOST",
        "[::1]",
        "0.0.0.0",
        "0",
        "[::]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "2130706433",
        "0x7f000001",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "127.1",
        "169.254.169.254",
        "[fe80::1]",
    ]
    .map(String::from)
    .to_vec();
    // This host's own name, where it resolves to one of its addresses.
    let me = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let me = me.trim();
    let resolves_home = tokio::net::lookup_host((me, port))
        .await
        .map(|mut a| a.any(|a| super::super::allowlist::host_own(a.ip()).is_some()))
        .unwrap_or(false);
    if resolves_home {
        spellings.push(me.to_string());
    } else {
        eprintln!("not tried: the host name {me:?} does not resolve to this host");
    }
    for host in &spellings {
        // Let through by name on every port: the address decides.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let named = if bare.contains(':') {
            format!("[{bare}]:*")
        } else {
            format!("{bare}:*")
        };
        let (_p, _l, at) = proxy_at(Allowlist::new([named, bare.to_string()]), 8);
        for request in [
            format!("GET http://{host}:{port}/x HTTP/1.1\r\nHost: h\r\n\r\n"),
            format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n"),
        ] {
            let answer = ask(at, &request).await;
            assert!(
                answer.starts_with("HTTP/1.1 403") && answer.contains("exact host:port"),
                "{host}: {answer}"
            );
        }
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "a refused target was connected"
    );
    // Named exactly, the operator's choice: through, on that port only.
    for host in ["127.0.0.1", "localhost"] {
        let (_p, _l, at) = proxy_at(Allowlist::new([format!("{host}:{port}")]), 8);
        let answer = ask(at, &format!("GET http://{host}:{port}/x HTTP/1.1\r\n\r\n")).await;
        assert!(answer.ends_with("ok"), "{host}: {answer}");
        let other = ask(
            at,
            &format!("GET http://{host}:{}/x HTTP/1.1\r\n\r\n", port ^ 1),
        )
        .await;
        assert!(other.starts_with("HTTP/1.1 403"), "{host}: {other}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

/// A task holds at most its slots of connections: one more is answered 503 at once and
/// closed (and counted), while the ones it holds stay served.
#[tokio::test]
async fn connections_beyond_the_tasks_slots_are_shed_at_once() {
    let (port, _hits) = counting_server().await;
    let (proxy, _l, at) = proxy_at(Allowlist::new([format!("127.0.0.1:{port}")]), 3);
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(TcpStream::connect(at).await.unwrap());
    }
    // The proxy has taken the three (each holds a slot) once the fourth is shed.
    let mut shed = String::new();
    for _ in 0..100 {
        shed = ask(at, "GET / HTTP/1.1\r\n\r\n").await;
        if shed.starts_with("HTTP/1.1 503") {
            break;
        }
    }
    assert!(shed.starts_with("HTTP/1.1 503"), "{shed}");
    let others = proxy.hosts();
    assert!(
        others
            .iter()
            .any(|h| h.target == OTHER_TARGETS && h.connections >= 1),
        "{others:?}"
    );
    // A slot freed is a slot to use.
    drop(idle.pop());
    let mut answer = String::new();
    for _ in 0..100 {
        answer = ask(
            at,
            &format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n"),
        )
        .await;
        if answer.ends_with("ok") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(answer.ends_with("ok"), "{answer}");
}

/// A connection that never finishes its request head is closed after [`HEAD_TIMEOUT`]
/// (and its slot given back).
#[tokio::test(start_paused = true)]
async fn a_connection_that_never_sends_its_head_is_closed() {
    let (_p, _l, at) = proxy_at(Allowlist::default(), 1);
    let mut c = TcpStream::connect(at).await.unwrap();
    c.write_all(b"CONNECT a.test:443 HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut back = Vec::new();
    let closed = tokio::time::timeout(HEAD_TIMEOUT * 6, c.read_to_end(&mut back)).await;
    assert!(matches!(closed, Ok(Ok(0))), "still open: {closed:?}");
}
