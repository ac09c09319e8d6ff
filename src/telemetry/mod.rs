//! Every task as an OpenTelemetry trace, exported over OTLP/HTTP (protobuf) to whatever
//! collector the operator points `[otel]` or the standard `OTEL_EXPORTER_OTLP_*` variables
//! at. Off by default; when off, nothing of the SDK or the exporter is built and every call
//! here returns at its first line.
//!
//! # Layout
//!
//! - this file: [`Telemetry`], the daemon-wide handle: turning export on from the config
//!   and the environment, the trace each task keeps on disk ([`Telemetry::new_trace`],
//!   [`Telemetry::resume`]) and the delivery span that ends with `task_ack`.
//! - [`task`]: [`TaskTrace`], one task's spans, fed by the runner at the points where it
//!   writes the flight record.
//! - `export.rs`: the bounded queue and the export thread; what it drops is counted.
//!
//! # The trace of a task
//!
//! `task` (root: task id, generation, executor, repository, verification status,
//! termination reason) ← `attempt N` ← `execute` (GenAI attributes, tool calls as events)
//! and one `check` span per check (`llm_judge` checks carry GenAI attributes too);
//! `publish` and `deliver` (result stored → `task_ack`) hang off the root. Every span is
//! built whole when what it measures has ended, with the times it began and ended, so no
//! half-open span outlives a crash. The root's ids are chosen when the task is accepted and
//! kept with the task in the state file (`ActiveTask::trace`, a W3C `traceparent`); a
//! daemon restarted mid-task continues the same trace, and attempt spans have ids derived
//! from the trace id and the attempt number, so an attempt ended before the restart is the
//! parent of checks reported after it.
//!
//! # Guarantees
//!
//! - Every string attribute and event value goes through the task's redactor.
//! - Export never blocks or slows a task: spans are queued with `try_send` on a bounded
//!   queue; a full queue or a collector that is down, slow or refusing costs dropped spans,
//!   counted in `/metrics` (`hub_sidecar_otel_spans_dropped`) and said in the log once.

mod export;
pub mod task;

pub use task::TaskTrace;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    SamplingDecision, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, ShouldSample};
use opentelemetry_sdk::Resource;
use prometheus_client::metrics::counter::Counter;

use crate::config::{Config, OtelConfig};
use crate::redact::Redactor;
use crate::task::Task;

/// Results waiting for `task_ack` whose delivery span is still open; past it the oldest
/// is forgotten (the outbox bounds them too, this only bounds memory).
const MAX_DELIVERIES: usize = 1024;

/// The daemon-wide handle. Cheap to clone; a disabled one does nothing.
#[derive(Clone, Default)]
pub struct Telemetry {
    inner: Option<Arc<Shared>>,
}

struct Shared {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// Decides, from the trace id alone, whether a task is traced.
    ratio: Sampler,
    propagate: bool,
    /// Who answers `llm_judge` checks, and with which model (the judge span's GenAI
    /// attributes).
    judge_backend: crate::config::JudgeBackend,
    judge_model: Option<String>,
    /// Traces of tasks about to run, by task id: put by the daemon (from the state file),
    /// taken by the runner.
    resumed: Mutex<HashMap<String, Root>>,
    /// Results stored and not yet acknowledged: the delivery span's parent and start.
    deliveries: Mutex<HashMap<String, (Root, SystemTime)>>,
}

/// The root span of a task's trace: its ids and when the task was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Root {
    trace_id: TraceId,
    span_id: SpanId,
    started: SystemTime,
}

/// Where spans go and how, resolved from `[otel]` and the standard variables.
struct Resolved {
    /// `[otel] endpoint` + `/v1/traces`; `None`: the exporter reads the `OTEL_*` variables.
    endpoint: Option<String>,
    ratio: f64,
}

impl Telemetry {
    /// Export nothing (offline commands, tests of other parts, `[otel]` off).
    pub fn disabled() -> Telemetry {
        Telemetry { inner: None }
    }

    /// Turn export on when `[otel]` or the environment asks for it (see [`OtelConfig`]),
    /// counting dropped spans into `dropped`. When off, this reads a few variables and
    /// returns: nothing of the exporter is built. Building it (the HTTP client reads the
    /// system's root certificates) runs on the blocking pool. It cannot stop the daemon: a
    /// failure is logged and export stays off.
    pub async fn start(cfg: &Arc<Config>, dropped: Counter) -> Telemetry {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let Some(resolved) = resolve(&cfg.otel, &env) else {
            return Telemetry::disabled();
        };
        let cfg = cfg.clone();
        let built = tokio::task::spawn_blocking(move || {
            let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
            let t = build(&cfg, &resolved, &env, dropped);
            (t, resolved)
        })
        .await;
        match built {
            Ok((Ok(t), resolved)) => {
                tracing::info!(
                    endpoint = resolved
                        .endpoint
                        .as_deref()
                        .unwrap_or("from OTEL_EXPORTER_OTLP_*"),
                    sample_ratio = resolved.ratio,
                    "OpenTelemetry export of task traces on"
                );
                t
            }
            Ok((Err(e), _)) => {
                tracing::error!(error = %e, "OpenTelemetry export not started (tasks run untraced): fix [otel] or the OTEL_EXPORTER_OTLP_* variables");
                Telemetry::disabled()
            }
            Err(e) => {
                tracing::error!(error = %e, "OpenTelemetry export not started (tasks run untraced)");
                Telemetry::disabled()
            }
        }
    }

    /// Whether spans are exported.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// A new trace for a task being accepted, as the `traceparent` kept with it on disk;
    /// `None` when export is off (nothing is kept, nothing costs).
    pub fn new_trace(&self) -> Option<String> {
        let s = self.inner.as_ref()?;
        let trace_id = TraceId::from(fastrand::u128(1..));
        let span_id = SpanId::from(fastrand::u64(1..));
        Some(traceparent(trace_id, span_id, s.sampled(trace_id)))
    }

    /// The task `task_id` is about to run under the trace kept on disk (`traceparent`,
    /// accepted at `accepted_at_ms`): its runner continues that trace.
    pub fn resume(&self, task_id: &str, traceparent: Option<&str>, accepted_at_ms: i64) {
        let Some(s) = &self.inner else { return };
        let Some((trace_id, span_id)) = traceparent.and_then(parse_traceparent) else {
            return;
        };
        let started = UNIX_EPOCH + Duration::from_millis(accepted_at_ms.max(0) as u64);
        if let Ok(mut m) = s.resumed.lock() {
            m.insert(
                task_id.to_string(),
                Root {
                    trace_id,
                    span_id,
                    started,
                },
            );
        }
    }

    /// The spans of `task`, run by `executor`, its strings scrubbed by `redactor`: the
    /// trace the daemon put aside for it ([`Telemetry::resume`]), else a new one. A task
    /// the sampler leaves out gets a disabled trace.
    pub fn task(&self, task: &Task, executor: Option<&str>, redactor: Arc<Redactor>) -> TaskTrace {
        let Some(s) = &self.inner else {
            return TaskTrace::disabled();
        };
        let root = s
            .resumed
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&task.task_id))
            .unwrap_or_else(|| Root {
                trace_id: TraceId::from(fastrand::u128(1..)),
                span_id: SpanId::from(fastrand::u64(1..)),
                started: SystemTime::now(),
            });
        if !s.sampled(root.trace_id) {
            return TaskTrace::disabled();
        }
        TaskTrace::new(s.clone(), root, task, executor, redactor)
    }

    /// The hub acknowledged `task_id`'s result (`task_ack`): its delivery span ends.
    pub fn acked(&self, task_id: &str, status: Option<&str>) {
        let Some(s) = &self.inner else { return };
        let Some((root, started)) = s.deliveries.lock().ok().and_then(|mut m| m.remove(task_id))
        else {
            return;
        };
        let mut attrs = vec![KeyValue::new("hub_sidecar.task_id", task_id.to_string())];
        if let Some(st) = status {
            attrs.push(KeyValue::new("hub_sidecar.ack_status", st.to_string()));
        }
        s.emit(
            "deliver",
            root.context(true),
            Span {
                id: None,
                start: started,
                end: SystemTime::now(),
                attrs,
                events: Vec::new(),
                error: None,
            },
        );
    }

    /// Export what is queued and stop the export thread (at most `timeout`). Blocking:
    /// the daemon calls it on the blocking pool as it exits.
    pub fn shutdown(&self, timeout: Duration) {
        if let Some(s) = &self.inner {
            if let Err(e) = s.provider.shutdown_with_timeout(timeout) {
                tracing::warn!(error = %e, "OpenTelemetry export: not every span was sent before exit");
            }
        }
    }
}

impl Shared {
    fn sampled(&self, trace_id: TraceId) -> bool {
        let r = self
            .ratio
            .should_sample(None, trace_id, "task", &SpanKind::Internal, &[], &[]);
        r.decision == SamplingDecision::RecordAndSample
    }

    /// Build one finished span under `parent` and hand it to the queue.
    fn emit(&self, name: &'static str, parent: Context, span: Span) {
        let mut b = self
            .tracer
            .span_builder(name)
            .with_start_time(span.start)
            .with_attributes(span.attrs)
            .with_events(span.events);
        if let Some(id) = span.id {
            b = b.with_span_id(id);
        }
        if let Some(msg) = span.error {
            b = b.with_status(opentelemetry::trace::Status::error(msg));
        }
        let mut built = self.tracer.build_with_context(b, &parent);
        opentelemetry::trace::Span::end_with_timestamp(&mut built, span.end);
    }

    /// The task's root span, built whole (no parent: the sampler decides from the trace id,
    /// as it did for the task's other spans).
    fn emit_root(&self, root: Root, attrs: Vec<KeyValue>, error: Option<String>) {
        let mut b = self
            .tracer
            .span_builder("task")
            .with_trace_id(root.trace_id)
            .with_span_id(root.span_id)
            .with_start_time(root.started)
            .with_attributes(attrs);
        if let Some(msg) = error {
            b = b.with_status(opentelemetry::trace::Status::error(msg));
        }
        let mut built = self.tracer.build_with_context(b, &Context::new());
        opentelemetry::trace::Span::end_with_timestamp(&mut built, SystemTime::now());
    }

    /// The result is stored: its delivery span runs until `task_ack`.
    fn delivering(&self, task_id: &str, root: Root) {
        if let Ok(mut m) = self.deliveries.lock() {
            if m.len() >= MAX_DELIVERIES {
                m.clear();
            }
            m.insert(task_id.to_string(), (root, SystemTime::now()));
        }
    }
}

/// One finished span's contents.
struct Span {
    /// A chosen id (attempts: derived, so both lives of a task agree); else a random one.
    id: Option<SpanId>,
    start: SystemTime,
    end: SystemTime,
    attrs: Vec<KeyValue>,
    events: Vec<opentelemetry::trace::Event>,
    /// Set: the span's status is an error with this message.
    error: Option<String>,
}

impl Root {
    /// The context of a span under the span `span_id` of this trace.
    fn context_of(&self, span_id: SpanId, sampled: bool) -> Context {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        Context::new().with_remote_span_context(SpanContext::new(
            self.trace_id,
            span_id,
            flags,
            false,
            TraceState::default(),
        ))
    }

    fn context(&self, sampled: bool) -> Context {
        self.context_of(self.span_id, sampled)
    }
}

/// W3C trace context: `00-<trace id>-<parent id>-<flags>`.
fn traceparent(trace_id: TraceId, span_id: SpanId, sampled: bool) -> String {
    format!(
        "00-{trace_id}-{span_id}-{}",
        if sampled { "01" } else { "00" }
    )
}

fn parse_traceparent(s: &str) -> Option<(TraceId, SpanId)> {
    let mut parts = s.trim().split('-');
    let (_version, trace, span) = (parts.next()?, parts.next()?, parts.next()?);
    let trace_id = TraceId::from_hex(trace)
        .ok()
        .filter(|t| *t != TraceId::INVALID)?;
    let span_id = SpanId::from_hex(span)
        .ok()
        .filter(|s| *s != SpanId::INVALID)?;
    Some((trace_id, span_id))
}

/// On or off, where to, and what share: `[otel]` first, then the standard variables.
fn resolve(cfg: &OtelConfig, env: &dyn Fn(&str) -> Option<String>) -> Option<Resolved> {
    let sdk_disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let env_endpoint = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
        .is_some();
    let on = match cfg.enabled {
        Some(on) => on,
        None => !sdk_disabled && (cfg.endpoint.is_some() || env_endpoint),
    };
    if !on {
        return None;
    }
    let endpoint = cfg
        .endpoint
        .as_deref()
        .map(|e| format!("{}/v1/traces", e.trim_end_matches('/')))
        .or_else(|| (!env_endpoint).then(|| "http://localhost:4318/v1/traces".to_string()));
    let ratio = cfg.sample_ratio.unwrap_or_else(|| env_ratio(env));
    Some(Resolved { endpoint, ratio })
}

/// `OTEL_TRACES_SAMPLER` (`always_on`, `always_off`, `traceidratio`,
/// `parentbased_traceidratio` …) with `OTEL_TRACES_SAMPLER_ARG`; anything else: every task.
fn env_ratio(env: &dyn Fn(&str) -> Option<String>) -> f64 {
    let arg = || {
        env("OTEL_TRACES_SAMPLER_ARG")
            .and_then(|a| a.trim().parse::<f64>().ok())
            .filter(|r| (0.0..=1.0).contains(r))
            .unwrap_or(1.0)
    };
    match env("OTEL_TRACES_SAMPLER").as_deref().map(str::trim) {
        Some("always_off" | "parentbased_always_off") => 0.0,
        Some("traceidratio" | "parentbased_traceidratio") => arg(),
        _ => 1.0,
    }
}

fn build(
    cfg: &Config,
    r: &Resolved,
    env: &dyn Fn(&str) -> Option<String>,
    dropped: Counter,
) -> anyhow::Result<Telemetry> {
    let o = &cfg.otel;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_timeout(Duration::from_millis(o.timeout_ms))
        .with_headers(o.headers.clone().into_iter().collect());
    if let Some(e) = &r.endpoint {
        exporter = exporter.with_endpoint(e.clone());
    }
    let mut exporter = exporter.build()?;
    let mut resource = Resource::builder().with_attributes([
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("service.instance.id", cfg.agent_id.clone()),
    ]);
    // `OTEL_SERVICE_NAME` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) wins.
    let named = env("OTEL_SERVICE_NAME").is_some()
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name("hub-sidecar");
    }
    let resource = resource.build();
    opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
    let queue = export::Queue::start(
        exporter,
        export::Batching {
            max_queue: o.max_queue,
            max_batch: o.max_batch,
            delay: Duration::from_millis(o.batch_delay_ms),
        },
        export::Drops::new(dropped),
    )?;
    let ratio = Sampler::TraceIdRatioBased(r.ratio);
    let provider = SdkTracerProvider::builder()
        .with_span_processor(queue)
        .with_sampler(Sampler::ParentBased(Box::new(ratio.clone())))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("hub-sidecar");
    Ok(Telemetry {
        inner: Some(Arc::new(Shared {
            provider,
            tracer,
            ratio,
            propagate: o.propagate_to_children,
            judge_backend: cfg.verification.judge_backend,
            judge_model: cfg.verification.judge_model.clone(),
            resumed: Mutex::new(HashMap::new()),
            deliveries: Mutex::new(HashMap::new()),
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn off_unless_the_config_or_a_standard_endpoint_variable_asks() {
        let cfg = OtelConfig::default();
        assert!(resolve(&cfg, &env_of(&[])).is_none(), "off by default");
        let r = resolve(
            &cfg,
            &env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]),
        )
        .expect("the standard variable turns it on");
        assert_eq!(r.endpoint, None, "the exporter reads the variable itself");
        let off = OtelConfig {
            enabled: Some(false),
            ..OtelConfig::default()
        };
        assert!(resolve(
            &off,
            &env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c")])
        )
        .is_none());
        assert!(resolve(
            &cfg,
            &env_of(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                ("OTEL_SDK_DISABLED", "true")
            ])
        )
        .is_none());
        let configured = OtelConfig {
            endpoint: Some("http://collector:4318/".into()),
            ..OtelConfig::default()
        };
        let r = resolve(
            &configured,
            &env_of(&[
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ]),
        )
        .unwrap();
        assert_eq!(
            r.endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(r.ratio, 0.25);
    }

    #[test]
    fn a_traceparent_round_trips_and_a_bad_one_is_ignored() {
        let (t, s) = (TraceId::from(0xabc_u128), SpanId::from(0x12_u64));
        let tp = traceparent(t, s, true);
        assert_eq!(
            tp,
            "00-00000000000000000000000000000abc-0000000000000012-01"
        );
        assert_eq!(parse_traceparent(&tp), Some((t, s)));
        assert_eq!(parse_traceparent("00-zz-12-01"), None);
        assert_eq!(
            parse_traceparent("00-00000000000000000000000000000000-0000000000000012-01"),
            None
        );
    }
}
