//! A real OTLP/HTTP trace endpoint on loopback: HTTP/1.1 `POST /v1/traces`, the body
//! decoded as `ExportTraceServiceRequest` with the official protobuf schema
//! (`opentelemetry-proto`'s generated types), every span kept for the test to look at.
//! It can refuse (HTTP 503) to stand for a collector that is up but not taking spans.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// One span as received, with the attributes of the resource it came with.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: BTreeMap<String, String>,
    /// Each event's name and attributes.
    pub events: Vec<(String, BTreeMap<String, String>)>,
    /// The status message when the span's status is an error.
    pub error: Option<String>,
    pub resource: BTreeMap<String, String>,
}

impl Got {
    pub(crate) fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).map(String::as_str)
    }
}

/// The endpoint and what it received.
pub(crate) struct Collector {
    /// `http://127.0.0.1:<port>`: what `[otel] endpoint` is set to.
    pub url: String,
    spans: Arc<Mutex<Vec<Got>>>,
    refuse: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Collector {
    pub(crate) async fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let refuse = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let (spans, refuse, requests) = (spans.clone(), refuse.clone(), requests.clone());
            async move {
                loop {
                    let Ok((conn, _)) = listener.accept().await else {
                        return;
                    };
                    let (spans, refuse, requests) =
                        (spans.clone(), refuse.clone(), requests.clone());
                    tokio::spawn(async move {
                        let _ = serve(conn, spans, refuse, requests).await;
                    });
                }
            }
        });
        Collector {
            url,
            spans,
            refuse,
            requests,
            task,
        }
    }

    /// Answer every export with HTTP 503 from now on.
    pub(crate) fn refuse(&self) {
        self.refuse.store(true, Ordering::SeqCst);
    }

    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub(crate) fn spans(&self) -> Vec<Got> {
        self.spans.lock().unwrap().clone()
    }

    pub(crate) fn named(&self, name: &str) -> Vec<Got> {
        self.spans()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }

    /// Wait until a span named `name` satisfying `pred` has arrived.
    pub(crate) async fn wait_for(&self, name: &str, pred: impl Fn(&Got) -> bool) -> Got {
        let mut found = None;
        let arrived = crate::util::wait_until(
            || {
                found = self.named(name).into_iter().find(|s| pred(s));
                found.is_some()
            },
            crate::util::T,
        )
        .await;
        assert!(arrived, "no `{name}` span arrived; got {:#?}", self.spans());
        found.unwrap()
    }
}

/// One keep-alive connection: requests until the client closes it.
async fn serve(
    conn: tokio::net::TcpStream,
    spans: Arc<Mutex<Vec<Got>>>,
    refuse: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let (r, mut w) = conn.into_split();
    let mut r = BufReader::new(r);
    loop {
        let mut request_line = String::new();
        if r.read_line(&mut request_line).await? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            r.read_line(&mut line).await?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        r.read_exact(&mut body).await?;
        requests.fetch_add(1, Ordering::SeqCst);
        let ok = request_line.starts_with("POST /v1/traces ");
        if refuse.load(Ordering::SeqCst) || !ok {
            w.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
                .await?;
            continue;
        }
        let req = ExportTraceServiceRequest::decode(body.as_slice())
            .expect("the body is an OTLP ExportTraceServiceRequest");
        let mut got = Vec::new();
        for rs in req.resource_spans {
            let resource = rs
                .resource
                .map(|r| attrs(&r.attributes))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Got {
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent: hex(&s.parent_span_id),
                        start_ns: s.start_time_unix_nano,
                        end_ns: s.end_time_unix_nano,
                        attrs: attrs(&s.attributes),
                        events: s
                            .events
                            .iter()
                            .map(|e| (e.name.clone(), attrs(&e.attributes)))
                            .collect(),
                        // STATUS_CODE_ERROR = 2
                        error: s.status.filter(|st| st.code == 2).map(|st| st.message),
                        resource: resource.clone(),
                    });
                }
            }
        }
        spans.lock().unwrap().extend(got);
        // An empty ExportTraceServiceResponse: every span accepted.
        w.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        )
        .await?;
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Any::StringValue(s)) => s.clone(),
                Some(Any::IntValue(i)) => i.to_string(),
                Some(Any::DoubleValue(d)) => d.to_string(),
                Some(Any::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}
