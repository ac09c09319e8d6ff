//! Test doubles shared by the integration tests: a fake Ollama HTTP server that speaks the
//! real `/api/chat` formats (NDJSON streaming and single JSON replies) from a script.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Read one HTTP/1.1 request from `sock`: its head (request line and headers) and its
/// body parsed as JSON (`Null` when it is not). `None` when the peer went away first.
pub(crate) async fn read_request(sock: &mut TcpStream) -> Option<(String, Value)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16384];
    let head_end = loop {
        match sock.read(&mut tmp).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        match sock.read(&mut tmp).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
    let body = serde_json::from_slice(&buf[head_end..head_end + len]).unwrap_or(Value::Null);
    Some((head, body))
}

/// One scripted answer of the fake Ollama.
pub(crate) enum Reply {
    Status(u16, String),
    /// `application/x-ndjson` lines, as `/api/chat` streams them.
    Ndjson(Vec<Value>),
    /// Hold the connection without answering (timeouts, cancellation).
    Hang,
}

/// A test double for Ollama's HTTP API on 127.0.0.1:0: minimal HTTP/1.1, one request per
/// connection, answers `/api/chat` from a script (a queue) and records request bodies.
pub(crate) struct FakeOllama {
    pub addr: std::net::SocketAddr,
    pub requests: Arc<Mutex<Vec<Value>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeOllama {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeOllama {
    pub(crate) async fn start(replies: Vec<Reply>) -> FakeOllama {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests: Arc<Mutex<Vec<Value>>> = Arc::default();
        let script = Arc::new(Mutex::new(VecDeque::from(replies)));
        let recorded = requests.clone();
        let server = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((sock, _)) = listener.accept().await {
                conns.spawn(handle(sock, script.clone(), recorded.clone()));
            }
        });
        FakeOllama {
            addr,
            requests,
            server,
        }
    }

    /// `host:port`, as the hub's routing decision names it.
    pub(crate) fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    pub(crate) fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

async fn handle(
    mut sock: TcpStream,
    script: Arc<Mutex<VecDeque<Reply>>>,
    requests: Arc<Mutex<Vec<Value>>>,
) {
    let Some((head, body)) = read_request(&mut sock).await else {
        return;
    };
    let head = head.to_ascii_lowercase();
    assert!(
        head.starts_with("post /api/chat "),
        "unexpected request: {head}"
    );
    requests.lock().unwrap().push(body);
    let reply = script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or(Reply::Status(500, "fake ollama: script exhausted".into()));
    let (status, ctype, body) = match reply {
        Reply::Status(code, body) => (code, "text/plain", body),
        Reply::Ndjson(lines) => {
            let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
            (200, "application/x-ndjson", body)
        }
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(120)).await;
            return;
        }
    };
    let resp = format!(
        "HTTP/1.1 {status} Scripted\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = sock.write_all(resp.as_bytes()).await;
    let _ = sock.shutdown().await;
}

impl FakeOllama {
    /// A fake whose every `/api/chat` answer (up to `n`) is one non-streamed assistant
    /// message with `content` — what `stream: false` calls (judge, tool rounds) get.
    pub(crate) async fn answering(content: &str, n: usize) -> FakeOllama {
        let line = json!({"model": "m", "message": {"role": "assistant", "content": content}, "done": true});
        FakeOllama::start((0..n).map(|_| Reply::Ndjson(vec![line.clone()])).collect()).await
    }
}

pub(crate) const MODEL: &str = "qwen3:8b";

pub(crate) fn chunk(content: &str) -> Value {
    json!({"model": MODEL, "created_at": "2025-06-01T10:00:00.000Z",
           "message": {"role": "assistant", "content": content}, "done": false})
}

pub(crate) fn done_line(message: Value, prompt_eval_count: u64, eval_count: u64) -> Value {
    json!({"model": MODEL, "created_at": "2025-06-01T10:00:01.000Z", "message": message,
           "done": true, "done_reason": "stop", "total_duration": 5_000_000_000u64,
           "load_duration": 1_000_000u64, "prompt_eval_count": prompt_eval_count,
           "prompt_eval_duration": 100_000_000u64, "eval_count": eval_count,
           "eval_duration": 900_000_000u64})
}

/// A streamed reply: one line per piece, then the `done` line with the counts.
pub(crate) fn streamed(pieces: &[&str], tokens_in: u64, tokens_out: u64) -> Reply {
    let mut lines: Vec<Value> = pieces.iter().map(|p| chunk(p)).collect();
    lines.push(done_line(
        json!({"role": "assistant", "content": ""}),
        tokens_in,
        tokens_out,
    ));
    Reply::Ndjson(lines)
}

/// A non-streamed reply that calls tools (`stream: false`: one complete line).
pub(crate) fn tool_calls(calls: &[(&str, Value)]) -> Reply {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(name, args)| json!({"function": {"name": name, "arguments": args}}))
        .collect();
    Reply::Ndjson(vec![done_line(
        json!({"role": "assistant", "content": "", "tool_calls": calls}),
        100,
        10,
    )])
}

pub(crate) fn answer(text: &str) -> Reply {
    Reply::Ndjson(vec![done_line(
        json!({"role": "assistant", "content": text}),
        50,
        5,
    )])
}
