//! The Prometheus registry (`prometheus-client`): one struct, registered once.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The `type` label of `hub_sidecar_frames_out`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    /// The frame's wire type, e.g. `task_progress`.
    pub r#type: String,
}

/// The `outcome` label of `hub_sidecar_tasks`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// How the task ended, e.g. `verified`, `partial_pass`, `execution_failed`.
    pub outcome: String,
}

/// The `containment` label of `hub_sidecar_tasks_started`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainmentLabel {
    /// The level the task's children ran under: `strict`, `best-effort` or `off`.
    pub containment: String,
}

/// The labels of `hub_sidecar_accepting_tasks`: why tasks are refused, for an alert to say.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AcceptingLabels {
    /// The containment level configured: `strict`, `best-effort` or `off`.
    pub containment: String,
    /// Empty while tasks are taken; else the refusal's code, e.g. `containment_unavailable`.
    pub reason: String,
    /// The confinement layers this machine lacks, comma-separated (`landlock`,
    /// `namespaces`); empty when none is.
    pub missing: String,
}

/// The flight recorder's usage and bounds, handed to its writer thread (which sets them after
/// each retention pass).
#[derive(Clone, Debug, Default)]
pub struct RecorderGauges {
    /// Bytes the records take.
    pub bytes: Gauge,
    /// The byte bound in force.
    pub max_bytes: Gauge,
    /// Records kept.
    pub records: Gauge,
    /// The count bound.
    pub max_records: Gauge,
}

/// Every metric `/metrics` serves, each named `hub_sidecar_<field>`.
pub struct Metrics {
    registry: Registry,
    /// 1 while identified with the hub.
    pub connected: Gauge,
    /// Reconnect attempts since start.
    pub reconnects: Counter,
    /// Frames received from the hub.
    pub frames_in: Counter,
    /// Frames sent to the hub, by type.
    pub frames_out: Family<TypeLabel, Counter>,
    /// `rate_limited` answers: the hub dropped one of our frames.
    pub rate_limited: Counter,
    /// Tasks finished, by outcome.
    pub tasks: Family<OutcomeLabel, Counter>,
    /// 1 while the daemon takes tasks; 0 while it refuses them, the labels saying why. One
    /// series at a time (the labels of the last decision).
    pub accepting_tasks: Family<AcceptingLabels, Gauge>,
    /// Tasks whose children started, by the containment level they ran under.
    pub tasks_started: Family<ContainmentLabel, Counter>,
    /// Verification attempts per task.
    pub verification_attempts: Histogram,
    /// Executor run time per attempt.
    pub execution_seconds: Histogram,
    /// Run time of each verification check.
    pub check_seconds: Histogram,
    /// LLM tokens used, in and out.
    pub tokens: Counter,
    /// Estimated LLM cost in USD.
    pub cost_usd: Counter<f64, AtomicU64>,
    /// Bytes the flight records take now, and the bound retention keeps them under.
    pub recorder_bytes: Gauge,
    /// `[recorder] max_total_bytes`, or the share sized to the host when unset.
    pub recorder_max_bytes: Gauge,
    /// Flight records kept now, and `[recorder] max_tasks`.
    pub recorder_records: Gauge,
    /// `[recorder] max_tasks`.
    pub recorder_max_records: Gauge,
    /// Bytes the per-repository dependency caches take, as counted when a task last
    /// prepared one (after removing the least recently used past the bound).
    pub caches_bytes: Gauge,
    /// `[caches] max_size_mb` in bytes; 0: no bound (then `caches_bytes` is not counted).
    pub caches_max_bytes: Gauge,
    /// Task-trace spans the OpenTelemetry export dropped: queue full, or the collector
    /// down, slow or refusing (`telemetry`).
    pub otel_spans_dropped: Counter,
    /// Trees tasks left that could not be removed within their budget and sit in the
    /// state directory's `.set-aside` directories: counted at start, plus each set aside
    /// since (an operator deletes them by hand; a restart counts again).
    pub trees_set_aside: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("hub_sidecar");
        let m = Metrics {
            connected: Gauge::default(),
            reconnects: Counter::default(),
            frames_in: Counter::default(),
            frames_out: Family::default(),
            rate_limited: Counter::default(),
            tasks: Family::default(),
            accepting_tasks: Family::default(),
            tasks_started: Family::default(),
            verification_attempts: Histogram::new([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            execution_seconds: Histogram::new([0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 1800.0]),
            check_seconds: Histogram::new([0.01, 0.1, 1.0, 10.0, 60.0, 120.0]),
            tokens: Counter::default(),
            cost_usd: Counter::default(),
            recorder_bytes: Gauge::default(),
            recorder_max_bytes: Gauge::default(),
            recorder_records: Gauge::default(),
            recorder_max_records: Gauge::default(),
            caches_bytes: Gauge::default(),
            caches_max_bytes: Gauge::default(),
            otel_spans_dropped: Counter::default(),
            trees_set_aside: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "hub_connected",
            "1 while identified with the hub",
            m.connected.clone(),
        );
        registry.register("reconnects", "Hub reconnect attempts", m.reconnects.clone());
        registry.register(
            "frames_in",
            "Frames received from the hub",
            m.frames_in.clone(),
        );
        registry.register(
            "frames_out",
            "Frames sent to the hub, by type",
            m.frames_out.clone(),
        );
        registry.register(
            "rate_limited",
            "rate_limited answers from the hub",
            m.rate_limited.clone(),
        );
        registry.register("tasks", "Tasks finished, by outcome", m.tasks.clone());
        registry.register(
            "accepting_tasks",
            "1 while tasks are taken, 0 while they are refused; reason and missing say why",
            m.accepting_tasks.clone(),
        );
        registry.register(
            "tasks_started",
            "Tasks whose children started, by containment level",
            m.tasks_started.clone(),
        );
        registry.register(
            "verification_attempts",
            "Verification attempts per task",
            m.verification_attempts.clone(),
        );
        registry.register(
            "execution_seconds",
            "Executor run time per attempt",
            m.execution_seconds.clone(),
        );
        registry.register(
            "check_seconds",
            "Verification check run time",
            m.check_seconds.clone(),
        );
        registry.register("tokens", "LLM tokens used (in + out)", m.tokens.clone());
        registry.register("cost_usd", "Estimated LLM cost in USD", m.cost_usd.clone());
        registry.register(
            "otel_spans_dropped",
            "Task-trace spans the OpenTelemetry export dropped (queue full, collector down, slow or refusing)",
            m.otel_spans_dropped.clone(),
        );
        for (name, help, gauge) in [
            (
                "recorder_bytes",
                "Bytes the flight records take",
                &m.recorder_bytes,
            ),
            (
                "recorder_max_bytes",
                "The flight records' byte bound (max_total_bytes, or the host share)",
                &m.recorder_max_bytes,
            ),
            (
                "recorder_records",
                "Flight records kept",
                &m.recorder_records,
            ),
            (
                "recorder_max_records",
                "The flight records' count bound (max_tasks)",
                &m.recorder_max_records,
            ),
            (
                "caches_bytes",
                "Bytes the dependency caches take, counted when a task last prepared one",
                &m.caches_bytes,
            ),
            (
                "caches_max_bytes",
                "The dependency caches' bound ([caches] max_size_mb); 0: none",
                &m.caches_max_bytes,
            ),
            (
                "trees_set_aside",
                "Trees tasks left that could not be removed, set aside in the state directory (delete by hand)",
                &m.trees_set_aside,
            ),
        ] {
            registry.register(name, help, gauge.clone());
        }
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Count one frame of type `kind` sent.
    pub fn frame_out(&self, kind: &str) {
        self.frames_out
            .get_or_create(&TypeLabel {
                r#type: kind.to_string(),
            })
            .inc();
    }

    /// Count one task finished with `outcome`.
    pub fn task_finished(&self, outcome: &str) {
        self.tasks
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Count one task started under containment `level`.
    pub fn task_started(&self, level: &str) {
        self.tasks_started
            .get_or_create(&ContainmentLabel {
                containment: level.to_string(),
            })
            .inc();
    }

    /// The recorder's gauges, for its writer.
    pub fn recorder_gauges(&self) -> RecorderGauges {
        RecorderGauges {
            bytes: self.recorder_bytes.clone(),
            max_bytes: self.recorder_max_bytes.clone(),
            records: self.recorder_records.clone(),
            max_records: self.recorder_max_records.clone(),
        }
    }

    /// Tasks are taken (`refusal` is `None`) or refused, under `containment`: the one
    /// `accepting_tasks` series, labelled with the refusal's code (what its message starts
    /// with, before the first `:`) and the `missing` layers.
    pub fn set_accepting(&self, containment: &str, refusal: Option<&str>, missing: &str) {
        let labels = AcceptingLabels {
            containment: containment.to_string(),
            reason: refusal
                .map(|r| r.split(':').next().unwrap_or(r).trim().to_string())
                .unwrap_or_default(),
            missing: if refusal.is_some() {
                missing.to_string()
            } else {
                String::new()
            },
        };
        self.accepting_tasks.clear();
        self.accepting_tasks
            .get_or_create(&labels)
            .set(i64::from(refusal.is_none()));
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_registered_metrics() {
        let m = Metrics::default();
        m.frame_out("ping");
        m.task_finished("verified");
        let text = m.encode();
        assert!(
            text.contains("hub_sidecar_frames_out_total{type=\"ping\"} 1"),
            "{text}"
        );
        assert!(text.contains("hub_sidecar_tasks_total{outcome=\"verified\"} 1"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn accepting_tasks_keeps_one_series_labelled_with_why() {
        let m = Metrics::default();
        m.set_accepting(
            "strict",
            Some("containment_unavailable: containment is strict but …"),
            "landlock,namespaces",
        );
        let text = m.encode();
        assert!(
            text.contains(
                "hub_sidecar_accepting_tasks{containment=\"strict\",reason=\"containment_unavailable\",missing=\"landlock,namespaces\"} 0"
            ),
            "{text}"
        );
        m.set_accepting("strict", None, "landlock");
        let text = m.encode();
        assert!(
            text.contains(
                "hub_sidecar_accepting_tasks{containment=\"strict\",reason=\"\",missing=\"\"} 1"
            ),
            "{text}"
        );
        assert_eq!(
            text.matches("hub_sidecar_accepting_tasks{").count(),
            1,
            "{text}"
        );
    }
}
