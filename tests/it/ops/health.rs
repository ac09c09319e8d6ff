//! Health as others see it: systemd notify datagrams (ready, watchdog, stopping), `/healthz`
//! and `/metrics` in-process and from the binary.

use super::*;

/// Start the binary the way systemd does for `Type=notify` with `WatchdogSec=`: `exec`
/// keeps the PID, so `WATCHDOG_PID` can name it.
fn start_notified(dir: &Path, config: &Path, socket: &Path) -> tokio::process::Child {
    let log = std::fs::File::create(dir.join("notify-daemon.log")).unwrap();
    tokio::process::Command::new("sh")
        .arg("-c")
        .arg("WATCHDOG_PID=$$; export WATCHDOG_PID; exec \"$0\" run --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_hub-sidecar"))
        .arg(config)
        .env("NOTIFY_SOCKET", socket)
        .env("WATCHDOG_USEC", "400000")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The next datagram that contains `needle`, and everything received before it.
async fn recv_until(sock: &tokio::net::UnixDatagram, needle: &str, seen: &mut Vec<String>) {
    let deadline = tokio::time::Instant::now() + T;
    let mut buf = vec![0u8; 4096];
    loop {
        let n = tokio::time::timeout_at(deadline, sock.recv(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {needle:?} datagram; got {seen:?}"))
            .unwrap();
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        let hit = msg.lines().any(|l| l == needle);
        seen.push(msg);
        if hit {
            return;
        }
    }
}

#[tokio::test]
async fn systemd_gets_ready_then_watchdog_while_connected_then_stopping() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("notify.sock");
    let sock = tokio::net::UnixDatagram::bind(&socket).unwrap();
    let config = write_config(&hub, dir.path(), "test-token", "");
    let mut child = start_notified(dir.path(), &config, &socket);
    let mut seen = Vec::new();
    recv_until(&sock, "READY=1", &mut seen).await;
    assert!(
        !hub.received_of("identify").is_empty(),
        "READY=1 before the hub saw identify"
    );
    recv_until(&sock, "WATCHDOG=1", &mut seen).await;
    recv_until(&sock, "WATCHDOG=1", &mut seen).await;
    assert!(
        seen.iter().any(|m| m.contains("STATUS=connected")),
        "{seen:?}"
    );

    // Hub gone: pongs stop, so after two ping intervals the watchdog is no longer fed.
    hub.stop().await;
    let mut buf = vec![0u8; 4096];
    let deadline = tokio::time::Instant::now() + T;
    let mut last_fed = tokio::time::Instant::now();
    let starved = loop {
        let now = tokio::time::Instant::now();
        if now - last_fed >= Duration::from_millis(1500) {
            break true; // 1.5 s (several watchdog periods) without WATCHDOG=1
        }
        if now > deadline {
            break false;
        }
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(100), sock.recv(&mut buf)).await {
            let msg = String::from_utf8_lossy(&buf[..r.unwrap()]).into_owned();
            if msg.lines().any(|l| l == "WATCHDOG=1") {
                last_fed = tokio::time::Instant::now();
            }
        }
    };
    assert!(starved, "watchdog still fed with the hub down");

    hub.restart().await.unwrap();
    recv_until(&sock, "WATCHDOG=1", &mut seen).await;
    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    recv_until(&sock, "STOPPING=1", &mut seen).await;
    let status = tokio::time::timeout(T, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_no_violations(&hub);
}

/// `GET path` over a fresh connection: status code and body.
pub(super) async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    tokio::time::timeout(T, s.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, head.to_string(), body.to_string())
}

#[tokio::test]
async fn healthz_turns_200_after_identify_and_metrics_count_a_verified_task() {
    let hub = MockHub::start(MockHubOptions {
        agents: vec![("sidecar-test".into(), "tok-METRICS-91c4e2".into())],
        ..MockHubOptions::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(&hub, dir.path());
    c.token = "tok-METRICS-91c4e2".into();
    let server = MetricsServer::start().await;
    let (ops, addr) = (server.ops.clone(), server.addr);
    // Before the daemon runs: not identified.
    let (code, _, body) = http_get(addr, "/healthz").await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["identified"],
        false
    );

    let shutdown = hub_sidecar::daemon::Shutdown::new();
    let daemon = tokio::spawn(hub_sidecar::daemon::run(c, shutdown.clone(), ops.clone()));
    hub.wait_for_type("identify", T).await.unwrap();
    let mut last = (0, String::new());
    let deadline = tokio::time::Instant::now() + T;
    while tokio::time::Instant::now() < deadline {
        let (code, _, body) = http_get(addr, "/healthz").await;
        last = (code, body);
        if code == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last.0, 200, "{}", last.1);
    assert_eq!(
        serde_json::from_str::<Value>(&last.1).unwrap()["identified"],
        true
    );

    let mut metered = sample_shell_task("metered", "echo tok-METRICS-91c4e2; echo done");
    metered["verification_steps"] = json!([{"type": "command_succeeds", "target": "true"}]);
    hub.assign(metered);
    hub.wait_for_type("task_complete", T).await.unwrap();
    assert!(wait_until(|| hub.acked_terminal("metered") == 1, T).await);
    let (code, head, text) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        head.contains("Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{head}"
    );
    assert!(text.contains("# TYPE hub_sidecar_tasks counter"), "{text}");
    assert!(
        text.contains("# TYPE hub_sidecar_hub_connected gauge"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.contains("hub_sidecar_tasks_total{outcome=\"verified\"} 1"),
        "{text}"
    );
    assert!(text.contains("hub_sidecar_hub_connected 1"), "{text}");
    assert!(text.contains("hub_sidecar_check_seconds_count 1"), "{text}");
    assert!(
        text.contains("hub_sidecar_verification_attempts_count 1"),
        "{text}"
    );
    // Every sample line is `name{labels} value`: parses as exposition text.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "bad sample line {line:?}");
    }
    assert!(!text.contains("tok-METRICS-91c4e2"), "token in /metrics");
    let (code, _, _) = http_get(addr, "/nope").await;
    assert_eq!(code, 404);

    shutdown.drain.cancel();
    tokio::time::timeout(T, daemon)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    server.stop().await;
    assert_no_violations(&hub);
}

#[tokio::test]
async fn the_binary_serves_metrics_on_metrics_addr_and_reports_the_bound_port() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        &hub,
        dir.path(),
        "test-token",
        "metrics_addr = \"127.0.0.1:0\"",
    );
    let mut bin = Bin::start(dir.path(), &config, &[]);
    wait_log(&bin, "serving /healthz and /metrics").await;
    let logs = bin.logs();
    let addr: std::net::SocketAddr = logs
        .lines()
        .find(|l| l.contains("serving /healthz"))
        .and_then(|l| l.split("addr=").nth(1))
        .and_then(|a| a.split_whitespace().next())
        .unwrap_or_else(|| panic!("no addr= in {logs}"))
        .parse()
        .unwrap();
    hub.wait_for_type("ping", T).await.unwrap();
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let (code, _, _) = http_get(addr, "/healthz").await;
        if code == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never healthy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, _, text) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(text.contains("hub_sidecar_frames_in_total"), "{text}");
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    // Stopped with the daemon.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// Issue 43: trees an earlier run set aside (a task's tree over its removal's budget) are
/// reported at start, in `/metrics` and `/healthz`, and never walked again.
#[tokio::test]
async fn the_binary_reports_trees_set_aside_by_an_earlier_run_and_leaves_them() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let aside = dir.path().join("tmp/.set-aside");
    for name in ["t1.1700000000.0000abcd", "t2.1700000001.0000beef"] {
        std::fs::create_dir_all(aside.join(name).join("nest")).unwrap();
    }
    let config = write_config(
        &hub,
        dir.path(),
        "test-token",
        "metrics_addr = \"127.0.0.1:0\"",
    );
    let mut bin = Bin::start(dir.path(), &config, &[]);
    wait_log(&bin, "serving /healthz and /metrics").await;
    let logs = bin.logs();
    let addr: std::net::SocketAddr = logs
        .lines()
        .find(|l| l.contains("serving /healthz"))
        .and_then(|l| l.split("addr=").nth(1))
        .and_then(|a| a.split_whitespace().next())
        .unwrap_or_else(|| panic!("no addr= in {logs}"))
        .parse()
        .unwrap();
    // The sweep runs beside the link: poll until it has reported.
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let (code, _, text) = http_get(addr, "/metrics").await;
        assert_eq!(code, 200);
        if text.contains("hub_sidecar_trees_set_aside 2\n") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never reported: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, _, body) = http_get(addr, "/healthz").await;
    let health: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["trees_set_aside"], 2, "{body}");
    assert!(aside.join("t1.1700000000.0000abcd/nest").exists());
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
}
