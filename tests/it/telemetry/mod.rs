//! Every task as an OpenTelemetry trace (issue 46), seen from a real OTLP/HTTP endpoint on
//! loopback that decodes what the daemon sends with the official protobuf schema
//! ([`collector`]): the span tree of a task that fails a check and is corrected, the same
//! trace continued by a daemon killed and restarted mid-task, `TRACEPARENT` for the task's
//! children, and a collector that is down or refusing costing the task nothing but drops.

mod collector;

use std::path::Path;

use hub_sidecar::mock_hub::sample_shell_task;
use serde_json::json;

use crate::harness::Harness;
use crate::loop_spec::{prompts, recording_stand_in, restart_stand_in};
use crate::util::*;
use collector::{Collector, Got};

/// A credential the daemon knows (`secrets`), put where spans would carry it.
const SECRET: &str = "sekrit-otel-9f3a2c";

fn stand_in_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stand-in-claude")
}

/// The only span named `name` under `parent` with `attempt` = `n`.
fn attempt_child<'a>(spans: &'a [Got], name: &str, parent: &str, n: u32) -> Vec<&'a Got> {
    spans
        .iter()
        .filter(|s| s.name == name && s.parent == parent)
        .filter(|s| s.attr("hub_sidecar.attempt") == Some(&n.to_string()))
        .collect()
}

#[tokio::test]
async fn a_task_that_fails_a_check_and_is_corrected_is_one_trace_from_assignment_to_ack() {
    let otlp = Collector::start().await;
    let s = Harness::setup().await;
    let log = probe(s.dir()).join("prompts.log");
    let (mut c, _ws) = s.cfg_with_workspace();
    c.executor.claude_path = Some(recording_stand_in(&probe(s.dir()), &log));
    c.sandbox.read_paths.push(stand_in_dir());
    c.secrets = vec![SECRET.into()];
    c.otel.endpoint = Some(otlp.url.clone());
    c.otel.batch_delay_ms = 20;
    let h = s.start(c).await;
    let mut task = hub_sidecar::commands::demo::sample_task();
    task["verification_steps"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "command_succeeds", "target": format!("echo {SECRET}")}));
    h.assign(task);
    let done = h.completed("demo-greeting").await;
    assert_eq!(done["result"]["verification_status"], "verified", "{done}");
    let deliver = otlp.wait_for("deliver", |_| true).await;
    h.finish().await;
    let spans = otlp.spans();

    let roots = otlp.named("task");
    assert_eq!(roots.len(), 1, "{spans:#?}");
    let root = &roots[0];
    assert_eq!(root.parent, "", "the task span is the root");
    assert!(
        spans.iter().all(|s| s.trace_id == root.trace_id),
        "one trace: {spans:#?}"
    );
    for (k, v) in [
        ("hub_sidecar.task_id", "demo-greeting"),
        ("hub_sidecar.generation", "1"),
        ("hub_sidecar.executor", "claude"),
        ("hub_sidecar.verification_status", "verified"),
        ("hub_sidecar.termination_reason", "verified"),
        ("hub_sidecar.outcome", "task_complete"),
    ] {
        assert_eq!(root.attr(k), Some(v), "{k} on {root:#?}");
    }
    assert_eq!(root.resource["service.name"], "hub-sidecar");
    assert_eq!(root.resource["service.instance.id"], "sidecar-test");

    // Two attempts under the root; the second opened with the corrective prompt.
    let attempts: Vec<&Got> = spans
        .iter()
        .filter(|s| s.name == "attempt" && s.parent == root.span_id)
        .collect();
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    let attempt = |n: u32| {
        *attempts
            .iter()
            .find(|a| a.attr("hub_sidecar.attempt") == Some(&n.to_string()))
            .unwrap_or_else(|| panic!("no attempt {n}: {attempts:#?}"))
    };
    let (a1, a2) = (attempt(1), attempt(2));
    assert!(a1.end_ns <= a2.start_ns, "attempt 1 ends before 2 starts");
    let (event, fields) = &a2.events[0];
    assert_eq!(event, "corrective_prompt");
    assert!(
        fields["hub_sidecar.prompt"].starts_with("VERIFICATION RETRY 1/2"),
        "{fields:?}"
    );

    // Each attempt's execution: the GenAI conventions and the cost.
    for a in [a1, a2] {
        let n: u32 = a.attr("hub_sidecar.attempt").unwrap().parse().unwrap();
        let exec = attempt_child(&spans, "execute", &a.span_id, n);
        assert_eq!(exec.len(), 1, "attempt {n}: {spans:#?}");
        let e = exec[0];
        assert_eq!(e.attr("gen_ai.system"), Some("anthropic"));
        assert!(e.attr("gen_ai.request.model").is_some(), "{e:#?}");
        assert_eq!(e.attr("gen_ai.usage.input_tokens"), Some("850"));
        assert_eq!(e.attr("gen_ai.usage.output_tokens"), Some("40"));
        assert!(
            e.attr("hub_sidecar.cost_usd")
                .unwrap()
                .parse::<f64>()
                .unwrap()
                > 0.0
        );
        // The stand-in writes greeting.txt with the Write tool: a tool call on the run.
        assert!(
            e.events
                .iter()
                .any(|(name, f)| name == "tool_call"
                    && f["hub_sidecar.tool_call"].starts_with("Write")),
            "{e:#?}"
        );
    }

    // The checks: attempt 1 failed the exact-content check, attempt 2 passed them all.
    let checks1 = attempt_child(&spans, "check", &a1.span_id, 1);
    let checks2 = attempt_child(&spans, "check", &a2.span_id, 2);
    assert_eq!((checks1.len(), checks2.len()), (3, 3), "{spans:#?}");
    let failed: Vec<&&Got> = checks1
        .iter()
        .filter(|c| c.attr("hub_sidecar.check.status") == Some("fail"))
        .collect();
    assert_eq!(failed.len(), 1, "{checks1:#?}");
    assert_eq!(
        failed[0].attr("hub_sidecar.check.target"),
        Some("grep -qx 'Hello, hub!' greeting.txt")
    );
    assert_eq!(
        failed[0].attr("hub_sidecar.check.type"),
        Some("command_succeeds")
    );
    assert!(failed[0].error.is_some(), "a failed check is an error span");
    assert!(checks2
        .iter()
        .all(|c| c.attr("hub_sidecar.check.status") == Some("pass")));
    assert!(checks1
        .iter()
        .all(|c| c.attr("hub_sidecar.check.duration_ms").is_some()));

    // Delivery: from the stored result to the hub's `task_ack`.
    assert_eq!(deliver.parent, root.span_id);
    assert!(
        deliver.attr("hub_sidecar.ack_status").is_some(),
        "{deliver:#?}"
    );

    // Redaction: the credential never leaves in an attribute or an event.
    let mut values = Vec::new();
    for s in &spans {
        values.extend(s.attrs.values().cloned());
        for (_, f) in &s.events {
            values.extend(f.values().cloned());
        }
    }
    assert!(
        values.iter().all(|v| !v.contains(SECRET)),
        "a credential in a span"
    );
    assert!(values.iter().any(|v| v == "echo [REDACTED]"), "{values:?}");
}

#[tokio::test]
async fn a_daemon_killed_mid_task_and_restarted_continues_the_same_trace() {
    let otlp = Collector::start().await;
    let s = Harness::setup().await;
    let ws = s.dir().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let log = probe(s.dir()).join("prompts.log");
    let claude = restart_stand_in(&probe(s.dir()), &log);
    let extra = format!(
        "repo_dir = \"{}\"\n[executor]\nclaude_path = \"{}\"\nkill_grace_ms = 500\n[otel]\nendpoint = \"{}\"\nbatch_delay_ms = 20\n",
        ws.display(),
        claude.display(),
        otlp.url,
    );
    let mut h = s.start_bin("test-token", &extra, &[]).await;
    h.assign(hub_sidecar::commands::demo::sample_task());
    h.accepted("demo-greeting").await;
    assert!(
        wait_until(|| prompts(&log).len() == 2, T).await,
        "the corrective run never started"
    );
    // Attempt 1 ended (its span is exported as attempt 2 starts) before the kill.
    let first_life = otlp
        .wait_for("attempt", |s| s.attr("hub_sidecar.attempt") == Some("1"))
        .await;
    let kept = hub_sidecar::state::read_state(&h.dir().join("queue.json"))
        .unwrap()
        .active
        .and_then(|a| a.trace)
        .expect("the trace is kept with the task on disk");
    assert!(
        kept.contains(&first_life.trace_id),
        "{kept} vs {first_life:#?}"
    );
    h.stop().await;
    h.bin_mut().kill9().await;
    h.restart().await.unwrap();
    h.start_bin_again(&[]);
    let done = h.completed("demo-greeting").await;
    assert_eq!(done["result"]["resumed_at"], 2, "{done}");
    let root = otlp.wait_for("task", |_| true).await;
    h.finish().await;

    assert_eq!(
        root.trace_id, first_life.trace_id,
        "the same trace after the restart"
    );
    assert_eq!(
        first_life.parent, root.span_id,
        "attempt 1 hangs under the root"
    );
    assert!(
        kept.contains(&root.span_id),
        "the root's id was kept: {kept}"
    );
    // The root spans both lives: it began when the task was first accepted.
    assert!(root.start_ns <= first_life.start_ns);
    let spans = otlp.spans();
    assert!(
        spans.iter().all(|s| s.trace_id == root.trace_id),
        "{spans:#?}"
    );
    // Attempt 1's checks, reported by the second life, hang under the span the first
    // life exported.
    let checks1 = attempt_child(&spans, "check", &first_life.span_id, 1);
    assert_eq!(checks1.len(), 2, "{spans:#?}");
    let a2 = attempt_child(&spans, "attempt", &root.span_id, 2);
    assert_eq!(a2.len(), 1, "{spans:#?}");
    assert_eq!(attempt_child(&spans, "check", &a2[0].span_id, 2).len(), 2);
}

#[tokio::test]
async fn a_task_s_children_get_traceparent_when_the_operator_allows_it() {
    let otlp = Collector::start().await;
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.otel.endpoint = Some(otlp.url.clone());
    c.otel.batch_delay_ms = 20;
    c.otel.propagate_to_children = true;
    let h = s.start(c).await;
    h.assign(sample_shell_task("tp", "printf 'tp=%s' \"$TRACEPARENT\""));
    let done = h.completed("tp").await;
    let root = otlp.wait_for("task", |_| true).await;
    h.finish().await;
    let out = done["result"]["output"].as_str().unwrap();
    assert!(
        out.contains(&format!("tp=00-{}-{}-01", root.trace_id, root.span_id)),
        "{out}"
    );
}

#[tokio::test]
async fn a_collector_that_is_down_or_refusing_costs_the_task_nothing_but_counted_drops() {
    // Down: a loopback port nothing listens on.
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_url = format!("http://{}", down.local_addr().unwrap());
    drop(down);
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.otel.endpoint = Some(down_url);
    c.otel.batch_delay_ms = 20;
    let h = s.start(c).await;
    h.assign(sample_shell_task("unheard", "echo fine"));
    let done = h.completed("unheard").await;
    assert!(done["result"]["output"].as_str().unwrap().contains("fine"));
    let dropped = || h.ops().metrics().otel_spans_dropped.get();
    assert!(wait_until(|| dropped() > 0, T).await, "drops not counted");
    assert!(h
        .ops()
        .metrics()
        .encode()
        .contains("hub_sidecar_otel_spans_dropped_total"));
    h.finish().await;

    // Refusing: up, answering 503 to every export.
    let otlp = Collector::start().await;
    otlp.refuse();
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.otel.endpoint = Some(otlp.url.clone());
    c.otel.batch_delay_ms = 20;
    let h = s.start(c).await;
    h.assign(sample_shell_task("refused", "echo fine"));
    h.completed("refused").await;
    let dropped = || h.ops().metrics().otel_spans_dropped.get();
    assert!(wait_until(|| dropped() > 0, T).await, "drops not counted");
    assert!(otlp.requests() > 0, "the collector was asked");
    assert!(otlp.spans().is_empty());
    h.finish().await;
}

#[tokio::test]
async fn the_judge_carries_the_genai_conventions_and_publish_says_what_was_pushed() {
    use crate::fakes::{FakeOllama, Reply};
    use crate::git::{base_cfg, shell_task, Remote};
    let verdict = Reply::Ndjson(vec![json!({
        "model": "judge-m", "done": true, "prompt_eval_count": 321, "eval_count": 17,
        "message": {"role": "assistant",
                    "content": "{\"match\": true, \"confidence\": 0.97, \"reason\": \"written\"}"}
    })]);
    let fake = FakeOllama::start(vec![verdict]).await;
    let otlp = Collector::start().await;
    let s = Harness::setup().await;
    let remote = Remote::new();
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(s.dir().join("no-gh-here"));
    c.ollama_url = Some(format!("http://{}", fake.endpoint()));
    c.verification.judge_model = Some("judge-m".into());
    c.otel.endpoint = Some(otlp.url.clone());
    c.otel.batch_delay_ms = 20;
    let h = s.start(c).await;
    let mut t = shell_task(
        "judged-push",
        "echo hello > hello.txt",
        &remote.url(),
        "Add a greeting file",
    );
    t["verification_steps"] = json!([{"type": "llm_judge", "target": "hello.txt says hello"}]);
    h.assign(t);
    let done = h.completed("judged-push").await;
    assert_eq!(done["result"]["pushed"], true, "{done}");
    let root = otlp.wait_for("task", |_| true).await;
    h.finish().await;
    let spans = otlp.spans();

    let a1 = attempt_child(&spans, "attempt", &root.span_id, 1);
    assert_eq!(a1.len(), 1, "{spans:#?}");
    let judge = attempt_child(&spans, "judge", &a1[0].span_id, 1);
    assert_eq!(judge.len(), 1, "{spans:#?}");
    let j = judge[0];
    for (k, v) in [
        ("gen_ai.system", "ollama"),
        ("gen_ai.request.model", "judge-m"),
        ("gen_ai.usage.input_tokens", "321"),
        ("gen_ai.usage.output_tokens", "17"),
        ("hub_sidecar.check.type", "llm_judge"),
        ("hub_sidecar.check.status", "pass"),
    ] {
        assert_eq!(j.attr(k), Some(v), "{k} on {j:#?}");
    }
    // A shell execution calls no model: no GenAI attributes on it.
    let exec = attempt_child(&spans, "execute", &a1[0].span_id, 1);
    assert_eq!(exec.len(), 1, "{spans:#?}");
    assert_eq!(exec[0].attr("gen_ai.system"), None);
    assert_eq!(exec[0].attr("hub_sidecar.executor"), Some("shell"));

    let publish: Vec<&Got> = spans.iter().filter(|s| s.name == "publish").collect();
    assert_eq!(publish.len(), 1, "{spans:#?}");
    let p = publish[0];
    assert_eq!(p.parent, root.span_id);
    assert_eq!(p.attr("hub_sidecar.publish.pushed"), Some("true"));
    assert_eq!(p.attr("hub_sidecar.publish.refused"), Some("false"));
    assert_eq!(
        p.attr("hub_sidecar.publish.branch"),
        done["result"]["branch"].as_str()
    );
    assert_eq!(
        p.attr("hub_sidecar.publish.commit"),
        done["result"]["commit"].as_str()
    );
    assert_eq!(
        root.attr("hub_sidecar.repository"),
        Some(remote.url().as_str())
    );
}
