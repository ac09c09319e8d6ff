//! `[otel]`: OpenTelemetry export of one trace per task (see [`crate::telemetry`]). As
//! written ([`RawOtel`]) and validated ([`OtelConfig`]). Every key has a standard
//! `OTEL_*` variable beside it; the resolution (config first, then the variable) happens
//! where the exporter is built, so the config stays plain data.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::ConfigError;

/// `[otel]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawOtel {
    pub enabled: Option<bool>,
    pub endpoint: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub sample_ratio: Option<f64>,
    pub propagate_to_children: Option<bool>,
    pub max_queue: Option<usize>,
    pub max_batch: Option<usize>,
    pub batch_delay_ms: Option<u64>,
    pub timeout_ms: Option<u64>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[otel]`: where and how task traces are exported. Off unless `enabled = true`, an
/// `endpoint`, or `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` says
/// where to send them.
#[derive(Debug, Clone, PartialEq)]
pub struct OtelConfig {
    /// `true` exports (to `endpoint`, else the `OTEL_EXPORTER_OTLP_*` endpoint, else
    /// `http://localhost:4318`); `false` never does, whatever the environment says; unset:
    /// on when an endpoint is configured or in the environment.
    pub enabled: Option<bool>,
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); `/v1/traces` is added.
    pub endpoint: Option<String>,
    /// Headers sent with every export (an API key: `x-honeycomb-team`, `authorization`).
    /// Their values are secrets: redacted like the hub token.
    pub headers: BTreeMap<String, String>,
    /// Share of tasks traced, 0..=1, decided from the trace id (a task is traced whole or
    /// not at all). Unset: `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, else 1.
    pub sample_ratio: Option<f64>,
    /// Give a task's children `TRACEPARENT` (W3C trace context) so what they export joins
    /// the task's trace.
    pub propagate_to_children: bool,
    /// Finished spans waiting for export; past it they are dropped and counted.
    pub max_queue: usize,
    /// Most spans in one export request.
    pub max_batch: usize,
    /// A batch goes out at the latest this long after its first span.
    pub batch_delay_ms: u64,
    /// One export request gives up after this long.
    pub timeout_ms: u64,
}

impl Default for OtelConfig {
    fn default() -> Self {
        OtelConfig {
            enabled: None,
            endpoint: None,
            headers: BTreeMap::new(),
            sample_ratio: None,
            propagate_to_children: false,
            max_queue: 2048,
            max_batch: 512,
            batch_delay_ms: 5_000,
            timeout_ms: 10_000,
        }
    }
}

/// Defaults filled in and checked: a ratio outside 0..=1, a zero queue or batch, or an
/// endpoint that is not an http(s) URL stops the daemon with the key's name.
pub(super) fn otel(r: RawOtel, origin: &str) -> Result<OtelConfig, ConfigError> {
    let d = OtelConfig::default();
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        key: format!("otel.{key}"),
        origin: origin.to_string(),
        message,
    };
    if let Some(ratio) = r.sample_ratio {
        if !(0.0..=1.0).contains(&ratio) {
            return Err(invalid(
                "sample_ratio",
                format!("{ratio} is not a share between 0 and 1"),
            ));
        }
    }
    let endpoint = r.endpoint.filter(|e| !e.trim().is_empty());
    if let Some(e) = &endpoint {
        match url::Url::parse(e) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            _ => {
                return Err(invalid(
                    "endpoint",
                    format!("{e:?} is not an http:// or https:// URL (e.g. http://localhost:4318)"),
                ))
            }
        }
    }
    let cfg = OtelConfig {
        enabled: r.enabled,
        endpoint,
        headers: r.headers.unwrap_or_default(),
        sample_ratio: r.sample_ratio,
        propagate_to_children: r.propagate_to_children.unwrap_or(d.propagate_to_children),
        max_queue: r.max_queue.unwrap_or(d.max_queue),
        max_batch: r.max_batch.unwrap_or(d.max_batch),
        batch_delay_ms: r.batch_delay_ms.unwrap_or(d.batch_delay_ms),
        timeout_ms: r.timeout_ms.unwrap_or(d.timeout_ms),
    };
    for (key, v) in [("max_queue", cfg.max_queue), ("max_batch", cfg.max_batch)] {
        if v == 0 {
            return Err(invalid(key, "must be at least 1".into()));
        }
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_outside_zero_to_one_and_a_non_http_endpoint_are_refused_by_name() {
        let bad_ratio = RawOtel {
            sample_ratio: Some(1.5),
            ..RawOtel::default()
        };
        let e = otel(bad_ratio, "test").unwrap_err().to_string();
        assert!(e.contains("otel.sample_ratio"), "{e}");
        let bad_url = RawOtel {
            endpoint: Some("collector:4318".into()),
            ..RawOtel::default()
        };
        let e = otel(bad_url, "test").unwrap_err().to_string();
        assert!(e.contains("otel.endpoint"), "{e}");
        let unset = otel(RawOtel::default(), "test").unwrap();
        assert_eq!(unset, OtelConfig::default());
    }
}
