//! Tests for the mock hub, driven by a raw tokio-tungstenite client (not the sidecar), so
//! they pin down the mock's own behaviour.

use super::*;
use tokio_tungstenite::{connect_async, MaybeTlsStream, WebSocketStream};

pub(super) type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub(super) const T: Duration = Duration::from_secs(5);

async fn hub() -> MockHub {
    MockHub::start(MockHubOptions::default()).await.unwrap()
}

pub(super) async fn connect(hub: &MockHub) -> Client {
    connect_async(hub.url()).await.unwrap().0
}

pub(super) async fn send(c: &mut Client, v: Value) {
    c.send(Message::text(v.to_string())).await.unwrap();
}

/// Next text frame as JSON (skipping control frames); `None` on close/EOF/error.
pub(super) async fn recv(c: &mut Client) -> Option<Value> {
    loop {
        match tokio::time::timeout(T, c.next()).await.ok()?? {
            Ok(Message::Text(t)) => return Some(serde_json::from_str(t.as_str()).unwrap()),
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => continue,
            _ => return None,
        }
    }
}

/// Reads until the server ends the connection; returns the close frame if one came.
async fn recv_close(c: &mut Client) -> Option<CloseFrame> {
    loop {
        match tokio::time::timeout(T, c.next())
            .await
            .expect("no close in time")
        {
            Some(Ok(Message::Close(f))) => return f,
            Some(Ok(_)) => continue,
            None | Some(Err(_)) => return None,
        }
    }
}

async fn identified(hub: &MockHub) -> Client {
    identified_as(hub, "sidecar-test", "test-token").await
}

pub(super) async fn identified_as(hub: &MockHub, agent: &str, token: &str) -> Client {
    let mut c = connect(hub).await;
    send(
        &mut c,
        json!({"type":"identify","agent_id":agent,"token":token,"client_type":"sidecar"}),
    )
    .await;
    assert_eq!(recv(&mut c).await.unwrap()["type"], "identified");
    c
}

#[tokio::test]
async fn identify_ok_and_auth_errors() {
    let hub = MockHub::start(MockHubOptions {
        agents: vec![
            ("sidecar-test".into(), "test-token".into()),
            ("other".into(), "other-token".into()),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(hub.url().starts_with("ws://127.0.0.1:") && hub.url().ends_with("/ws"));

    let mut c = connect(&hub).await;
    send(&mut c, json!({"type":"ping"})).await;
    assert_eq!(recv(&mut c).await.unwrap()["error"], "not_identified");
    send(
        &mut c,
        json!({"type":"identify","agent_id":"sidecar-test","token":"nope"}),
    )
    .await;
    assert_eq!(recv(&mut c).await.unwrap()["error"], "invalid_token");
    send(
        &mut c,
        json!({"type":"identify","agent_id":"sidecar-test","token":"other-token"}),
    )
    .await;
    assert_eq!(recv(&mut c).await.unwrap()["error"], "token_agent_mismatch");
    assert!(!hub.connected());
    send(
        &mut c,
        json!({"type":"identify","agent_id":"sidecar-test","token":"test-token"}),
    )
    .await;
    let r = recv(&mut c).await.unwrap();
    assert_eq!(r, json!({"type":"identified","agent_id":"sidecar-test"}));
    assert!(hub.connected());
    assert_eq!(hub.connections_total(), 1);
    assert!(hub.violations().is_empty());
}

#[tokio::test]
async fn ping_gets_pong() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    send(&mut c, json!({"type":"ping","protocol_version":1})).await;
    let pong = recv(&mut c).await.unwrap();
    assert_eq!(pong["type"], "pong");
    assert!(pong["timestamp"].as_u64().unwrap() > 1_600_000_000_000);
    // Both directions are recorded, in order.
    let kinds: Vec<_> = hub
        .frames()
        .iter()
        .map(|r| {
            (
                r.inbound,
                r.frame["type"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (true, "identify".into()),
            (false, "identified".into()),
            (true, "ping".into()),
            (false, "pong".into())
        ]
    );
}

#[tokio::test]
async fn unknown_type_and_bad_fields_are_violations() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    send(&mut c, json!({"type":"task_rejected","task_id":"t1"})).await;
    let r = recv(&mut c).await.unwrap();
    assert_eq!(r["error"], "validation_failed");
    assert_eq!(r["message_type"], "task_rejected");
    assert_eq!(r["errors"][0]["error"], "unknown_message_type");
    send(&mut c, json!({"type":"task_complete","task_id":"t1"})).await;
    let r = recv(&mut c).await.unwrap();
    assert_eq!(r["errors"][0]["field"], "generation");
    send(&mut c, Value::String("x".into())).await; // a JSON string is not an object...
    assert!(recv(&mut c).await.is_none()); // ...and kills the socket
    let v = hub.violations();
    assert_eq!(v.len(), 3);
    assert!(v[0].errors[0].contains("unknown_message_type"));
}

#[tokio::test]
async fn invalid_json_gets_error() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    c.send(Message::text("{not json")).await.unwrap();
    assert_eq!(recv(&mut c).await.unwrap()["error"], "invalid_json");
    assert_eq!(hub.violations()[0].frame, json!("{not json"));
}

#[tokio::test]
async fn array_frame_drops_connection_without_close_frame() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    send(&mut c, json!([{"type":"ping"}])).await;
    assert!(
        recv_close(&mut c).await.is_none(),
        "no close frame expected"
    );
    assert_eq!(hub.violations().len(), 1);
    assert!(!hub.connected());
}

#[tokio::test]
async fn binary_frame_drops_connection() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    c.send(Message::binary(vec![1, 2, 3])).await.unwrap();
    assert!(recv_close(&mut c).await.is_none());
    assert_eq!(hub.violations().len(), 1);
}

#[tokio::test]
async fn ten_violations_close_with_1008() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    for _ in 0..MAX_VIOLATIONS {
        send(&mut c, json!({"type":"agent_restarting"})).await;
    }
    let close = recv_close(&mut c).await.expect("close frame");
    assert_eq!(u16::from(close.code), 1008);
    assert_eq!(close.reason.as_str(), "too many validation errors");
}

#[tokio::test]
async fn rate_limiter_warns_then_denies_and_drops_the_frame() {
    let hub = MockHub::start(MockHubOptions {
        normal_capacity: 5,
        normal_per_minute: 5,
        ..Default::default()
    })
    .await
    .unwrap();
    hub.assign(sample_shell_task("t1", "true"));
    let mut c = identified(&hub).await;
    for _ in 0..5 {
        send(&mut c, json!({"type":"task_progress","task_id":"t1"})).await;
    }
    // 5 tokens: the 5th leaves 0 < 20% of 5 (1), so one warning alone (progress has no reply).
    let w = recv(&mut c).await.unwrap();
    assert_eq!(
        w,
        json!({"type":"rate_limit_warning","tier":"normal","remaining":0,"capacity":5})
    );
    send(
        &mut c,
        json!({"type":"task_complete","task_id":"t1","generation":1}),
    )
    .await;
    let r = recv(&mut c).await.unwrap();
    assert_eq!(r["type"], "rate_limited");
    assert_eq!(r["tier"], "normal");
    assert_eq!(r["retry_after_ms"].as_u64().unwrap() % 1000, 0);
    assert!(r["retry_after_ms"].as_u64().unwrap() >= 11_000);
    assert_eq!(hub.rate_limited_count(), 1);
    // Dropped: not processed.
    assert_eq!(hub.task("t1").unwrap().state, MockTaskState::Assigned);
    assert_eq!(hub.acked_terminal("t1"), 0);
    // Light tier is separate.
    send(&mut c, json!({"type":"ping"})).await;
    assert_eq!(recv(&mut c).await.unwrap()["type"], "pong");
    // Buckets persist across reconnects of the same agent.
    drop(c);
    let mut c = identified(&hub).await;
    send(&mut c, json!({"type":"task_accepted","task_id":"t1"})).await;
    assert_eq!(recv(&mut c).await.unwrap()["type"], "rate_limited");
}

#[tokio::test]
async fn default_limiter_denies_the_61st_normal_frame() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    for _ in 0..61 {
        send(&mut c, json!({"type":"task_progress","task_id":"x"})).await;
    }
    let mut seen = Vec::new();
    while let Some(f) = recv(&mut c).await {
        let last = f["type"] == "rate_limited";
        seen.push(f);
        if last {
            break;
        }
    }
    // Warnings for remaining 11..0 (< 12 = 20% of 60), then the denial.
    assert_eq!(seen.len(), 13, "{seen:?}");
    assert_eq!(seen[0]["remaining"], 11);
    assert_eq!(hub.rate_limited_count(), 1);
}

#[tokio::test]
async fn task_lifecycle_and_generations() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    let sent = hub.assign(sample_shell_task("t1", "echo hi"));
    let got = recv(&mut c).await.unwrap();
    assert_eq!(got, sent);
    assert_eq!(got["type"], "task_assign");
    assert_eq!(got["routing_decision"]["target_type"], "sidecar");
    assert!(got["assigned_at"].is_u64());

    send(&mut c, json!({"type":"task_accepted","task_id":"t1"})).await;
    assert_eq!(
        recv(&mut c).await.unwrap(),
        json!({"type":"task_ack","task_id":"t1","status":"accepted"})
    );
    send(
        &mut c,
        json!({"type":"task_complete","task_id":"t1","generation":2}),
    )
    .await;
    assert_eq!(
        recv(&mut c).await.unwrap()["error"],
        "task_complete_failed: stale_generation"
    );
    send(
        &mut c,
        json!({"type":"task_complete","task_id":"t1","generation":1,"result":{"status":"success"}}),
    )
    .await;
    assert_eq!(
        recv(&mut c).await.unwrap(),
        json!({"type":"task_ack","task_id":"t1","status":"complete"})
    );
    assert_eq!(hub.acked_terminal("t1"), 1);
    send(
        &mut c,
        json!({"type":"task_complete","task_id":"t1","generation":1}),
    )
    .await;
    assert!(recv(&mut c).await.unwrap()["error"]
        .as_str()
        .unwrap()
        .starts_with("task_complete_failed: "));

    hub.assign(sample_shell_task("t2", "false"));
    recv(&mut c).await.unwrap();
    send(
        &mut c,
        json!({"type":"task_failed","task_id":"t2","generation":1,"reason":"boom"}),
    )
    .await;
    assert_eq!(recv(&mut c).await.unwrap()["status"], "retried");
    let t2 = hub.task("t2").unwrap();
    assert_eq!((t2.generation, t2.state), (2, MockTaskState::Queued));
    send(
        &mut c,
        json!({"type":"task_failed","task_id":"nope","generation":1}),
    )
    .await;
    assert_eq!(
        recv(&mut c).await.unwrap()["error"],
        "task_fail_failed: not_found"
    );
}

#[tokio::test]
async fn recovery_state_report_and_swallowed_terminal() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    hub.assign(sample_shell_task("t1", "true"));
    recv(&mut c).await.unwrap();
    send(&mut c, json!({"type":"task_recovering","task_id":"t1"})).await;
    assert_eq!(
        recv(&mut c).await.unwrap(),
        json!({"type":"task_continue","task_id":"t1","generation":1})
    );
    send(&mut c, json!({"type":"task_recovering","task_id":"ghost"})).await;
    assert_eq!(recv(&mut c).await.unwrap()["type"], "task_reassign");
    hub.set_state_report_action("t1", "abort");
    send(
        &mut c,
        json!({"type":"state_report","task_id":"t1","status":"running","generation":1}),
    )
    .await;
    assert_eq!(
        recv(&mut c).await.unwrap(),
        json!({"type":"state_report_ack","task_id":"t1","action":"abort"})
    );
    hub.set_ack_terminal(false);
    send(
        &mut c,
        json!({"type":"task_complete","task_id":"t1","generation":1}),
    )
    .await;
    send(&mut c, json!({"type":"ping"})).await;
    assert_eq!(recv(&mut c).await.unwrap()["type"], "pong"); // nothing before the pong
    assert_eq!(hub.task("t1").unwrap().state, MockTaskState::Assigned);
}

#[tokio::test]
async fn client_disconnect_requeues_but_hub_crash_keeps_the_task() {
    let hub = hub().await;
    let addr = hub.addr();

    // Crash: the task survives as assigned, same generation.
    let mut c = identified(&hub).await;
    hub.assign(sample_shell_task("t1", "true"));
    recv(&mut c).await.unwrap();
    hub.stop().await;
    assert!(!hub.is_running());
    assert!(
        recv_close(&mut c).await.is_none(),
        "crash sends no close frame"
    );
    assert!(connect_async(hub.url()).await.is_err());
    hub.restart().await.unwrap();
    assert!(hub.is_running());
    assert_eq!(hub.addr(), addr);
    let mut c = identified(&hub).await;
    assert_eq!(hub.task("t1").unwrap().generation, 1);
    // The new state machine starts `assigned` on it: only `task_accepted` makes it `working`,
    // so that the result ends it (see `fsm_tests` for what happens without).
    send(&mut c, json!({"type":"task_accepted","task_id":"t1"})).await;
    assert_eq!(recv(&mut c).await.unwrap()["status"], "accepted");
    send(
        &mut c,
        json!({"type":"task_complete","task_id":"t1","generation":1}),
    )
    .await;
    assert_eq!(recv(&mut c).await.unwrap()["status"], "complete");

    // Client disconnect: the in-flight task goes back to the queue with generation + 1.
    hub.assign(sample_shell_task("t2", "true"));
    recv(&mut c).await.unwrap();
    c.close(None).await.unwrap();
    // The hub requeues before it lets go of the socket, so the end of the stream orders it.
    recv_close(&mut c).await;
    let mut c = identified(&hub).await;
    send(
        &mut c,
        json!({"type":"task_complete","task_id":"t2","generation":1}),
    )
    .await;
    assert_eq!(
        recv(&mut c).await.unwrap()["error"],
        "task_complete_failed: invalid_state"
    );
    let t2 = hub.task("t2").unwrap();
    assert_eq!((t2.generation, t2.state), (2, MockTaskState::Queued));
    assert_eq!(hub.connections_total(), 3);
}

#[tokio::test]
async fn idle_socket_is_closed_with_1002_and_cooldown_refuses_identify() {
    let hub = MockHub::start(MockHubOptions {
        idle_timeout: Some(Duration::from_millis(200)),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut c = identified(&hub).await;
    let close = recv_close(&mut c).await.expect("close frame");
    assert_eq!(u16::from(close.code), 1002);

    hub.set_cooldown(30);
    let mut c = connect(&hub).await;
    send(
        &mut c,
        json!({"type":"identify","agent_id":"sidecar-test","token":"test-token"}),
    )
    .await;
    let close = recv_close(&mut c).await.expect("close frame");
    assert_eq!(u16::from(close.code), 1008);
    assert_eq!(close.reason.as_str(), "cooldown active: retry in 30s");
}

#[tokio::test]
async fn pushes_and_close_current() {
    let hub = hub().await;
    assert!(!hub.push(json!({"type":"restart_sidecar"})));
    let mut c = identified(&hub).await;
    assert!(hub.push_text("garbage"));
    assert_eq!(
        tokio::time::timeout(T, c.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap(),
        Message::text("garbage")
    );
    assert!(hub.push_binary(vec![9]));
    assert_eq!(
        tokio::time::timeout(T, c.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap(),
        Message::binary(vec![9])
    );
    assert!(hub.close_current(4000, "bye"));
    let close = recv_close(&mut c).await.unwrap();
    assert_eq!(
        (u16::from(close.code), close.reason.as_str()),
        (4000, "bye")
    );
}

#[tokio::test]
async fn wait_for_sees_past_and_future_frames() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    // Already received counts.
    let f = hub.wait_for_type("identify", T).await.unwrap();
    assert_eq!(f["agent_id"], "sidecar-test");
    assert!(hub
        .wait_for_type("task_accepted", Duration::from_millis(50))
        .await
        .is_none());
    let waiter = {
        let hub = hub.clone();
        tokio::spawn(async move { hub.wait_for_nth("ping", 2, T).await })
    };
    let pred_waiter = {
        let hub = hub.clone();
        tokio::spawn(async move {
            hub.wait_for(|f| f["type"] == "task_progress" && f["progress"] == 50, T)
                .await
        })
    };
    send(&mut c, json!({"type":"ping"})).await;
    send(
        &mut c,
        json!({"type":"task_progress","task_id":"t","progress":50}),
    )
    .await;
    send(&mut c, json!({"type":"ping","n":2})).await;
    assert_eq!(waiter.await.unwrap().unwrap()["n"], 2);
    assert_eq!(pred_waiter.await.unwrap().unwrap()["progress"], 50);
    assert_eq!(hub.received_of("ping").len(), 2);
    assert_eq!(hub.received().len(), 4);
}

#[tokio::test]
async fn stall_stops_reading_until_resumed() {
    let hub = hub().await;
    let mut c = identified(&hub).await;
    hub.set_stall(true);
    send(&mut c, json!({"type":"ping"})).await;
    assert!(hub
        .wait_for_type("ping", Duration::from_millis(100))
        .await
        .is_none());
    hub.set_stall(false);
    assert!(hub.wait_for_type("ping", T).await.is_some());
    assert_eq!(recv(&mut c).await.unwrap()["type"], "pong");
}

#[tokio::test]
async fn dropping_the_last_handle_shuts_the_server_down() {
    let hub = hub().await;
    let url = hub.url();
    let mut c = identified(&hub).await;
    let tracker = hub.inner.tracker.clone();
    drop(hub);
    assert!(recv_close(&mut c).await.is_none());
    tokio::time::timeout(T, async {
        tracker.close();
        tracker.wait().await
    })
    .await
    .unwrap();
    assert!(connect_async(url).await.is_err());
}

#[test]
fn handle_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + Clone + 'static>() {}
    assert_send_sync::<MockHub>();
}
