//! A fake of the Anthropic Messages API on 127.0.0.1:0, for driving the **real** Claude Code
//! CLI (`ANTHROPIC_BASE_URL`) through its own code paths: SSE streams as `/v1/messages`
//! sends them (`message_start`, `content_block_*`, `message_delta`, `message_stop`), and error
//! bodies (`{"type":"error","error":{"type","message"}}`) with their HTTP status.
//!
//! Minimal HTTP/1.1: one request per connection (`Connection: close`), bodies by
//! `Content-Length`. Every request is recorded (method, path, JSON body).

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// How the fake answers `POST /v1/messages`.
#[derive(Clone)]
pub(crate) enum Script {
    /// Every call fails with this status, error type and message.
    Error(u16, &'static str, &'static str),
    /// First turn: a text block and a `Write` of `content` to `file_path`; after the tool
    /// result: "All done.".
    Write { file_path: String, content: String },
    /// Always "All done.".
    Done,
    /// Always this text.
    Text(&'static str),
}

pub(crate) struct FakeAnthropic {
    pub addr: std::net::SocketAddr,
    requests: Arc<Mutex<Vec<(String, Value)>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAnthropic {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeAnthropic {
    pub(crate) async fn start(script: Script) -> FakeAnthropic {
        FakeAnthropic::start_at("127.0.0.1", script).await
    }

    /// [`FakeAnthropic::start`] on another loopback address (`127.0.0.2`: not the
    /// `127.0.0.1` that `NO_PROXY` names, so a client under a proxy goes through it).
    pub(crate) async fn start_at(ip: &str, script: Script) -> FakeAnthropic {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
        let recorded = requests.clone();
        let server = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((sock, _)) = listener.accept().await {
                conns.spawn(handle(sock, script.clone(), recorded.clone()));
            }
        });
        FakeAnthropic {
            addr,
            requests,
            server,
        }
    }

    /// `ANTHROPIC_BASE_URL` for this fake.
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `(request line, body)` of every request so far.
    pub(crate) fn requests(&self) -> Vec<(String, Value)> {
        self.requests.lock().unwrap().clone()
    }
}

async fn handle(mut sock: TcpStream, script: Script, requests: Arc<Mutex<Vec<(String, Value)>>>) {
    let Some((head, body)) = crate::fakes::read_request(&mut sock).await else {
        return;
    };
    let request_line = head.lines().next().unwrap_or_default().to_string();
    requests
        .lock()
        .unwrap()
        .push((request_line.clone(), body.clone()));
    let (status, ctype, payload) = answer(&request_line, &body, &script);
    let resp = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nrequest-id: req_fake\r\nConnection: close\r\n\r\n",
        payload.len()
    );
    let _ = sock.write_all(resp.as_bytes()).await;
    let _ = sock.write_all(payload.as_bytes()).await;
    let _ = sock.shutdown().await;
}

fn answer(request_line: &str, body: &Value, script: &Script) -> (u16, &'static str, String) {
    if !request_line.starts_with("POST /v1/messages") {
        return (404, "application/json", "{}".into());
    }
    if request_line.contains("count_tokens") {
        return (
            200,
            "application/json",
            json!({"input_tokens": 10}).to_string(),
        );
    }
    if let Script::Error(status, kind, message) = script {
        let e = json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"});
        return (*status, "application/json", e.to_string());
    }
    let tool_result_came = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_array())
        .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result"));
    let has_write = body["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["name"] == "Write"));
    let blocks = match script {
        Script::Write { file_path, content } if !tool_result_came && has_write => vec![
            json!({"type": "text", "text": "Writing the file."}),
            json!({"type": "tool_use", "id": "toolu_w1", "name": "Write",
                   "input": {"file_path": file_path, "content": content}}),
        ],
        Script::Text(t) => vec![json!({"type": "text", "text": t})],
        _ => vec![json!({"type": "text", "text": "All done."})],
    };
    let stop = if blocks.len() > 1 {
        "tool_use"
    } else {
        "end_turn"
    };
    // One id per API call, as the real API gives (the CLI's turns are counted by it).
    let id = format!(
        "msg_fake_{}",
        body["messages"].as_array().map_or(0, Vec::len)
    );
    let message = |content: Value| {
        json!({"id": id, "type": "message", "role": "assistant",
               "model": "claude-sonnet-4-5-20250929", "content": content,
               "stop_reason": Value::Null, "stop_sequence": Value::Null,
               "usage": {"input_tokens": 100, "cache_creation_input_tokens": 0,
                         "cache_read_input_tokens": 0, "output_tokens": 1}})
    };
    if body["stream"] != true {
        // Side requests (titles, summaries) are not streamed.
        let mut m = message(json!([{"type": "text", "text": "ok"}]));
        m["stop_reason"] = json!("end_turn");
        return (200, "application/json", m.to_string());
    }
    let mut events = vec![json!({"type": "message_start", "message": message(json!([]))})];
    for (i, b) in blocks.iter().enumerate() {
        if b["type"] == "text" {
            events.push(json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}));
            events.push(json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": b["text"]}}));
        } else {
            events.push(json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}}));
            events.push(json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": b["input"].to_string()}}));
        }
        events.push(json!({"type": "content_block_stop", "index": i}));
    }
    events.push(json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": Value::Null}, "usage": {"output_tokens": 50}}));
    events.push(json!({"type": "message_stop"}));
    let sse: String = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect();
    (200, "text/event-stream", sse)
}
