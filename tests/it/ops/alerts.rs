//! The Prometheus rules shipped in `config/prometheus/`: their `promtool` unit tests pass,
//! every alert has one, and every metric they name is one the daemon serves.

use super::health::http_get;
use super::*;

fn rules_dir() -> PathBuf {
    repo().join("config/prometheus")
}

/// The names after `key:` in a YAML file's lines (`- alert: X`, `alertname: X`).
fn names_after(text: &str, key: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().trim_start_matches("- ").strip_prefix(key))
        .map(|n| n.trim().to_string())
        .collect()
}

/// Every `hub_sidecar_*` metric an expression in the rules names (recording rules'
/// `hub_sidecar:*` names are the rules' own).
fn metrics_named(rules: &str) -> std::collections::BTreeSet<String> {
    let re = regex::Regex::new(r"\bhub_sidecar_[a-z0-9_]+").unwrap();
    re.find_iter(rules)
        .map(|m| m.as_str().to_string())
        .collect()
}

#[test]
fn the_alert_rules_pass_promtool_and_every_alert_has_a_unit_test() {
    let rules = std::fs::read_to_string(rules_dir().join("alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(rules_dir().join("alerts_test.yml")).unwrap();
    let alerts = names_after(&rules, "alert:");
    assert!(alerts.len() >= 9, "{alerts:?}");
    let tested = names_after(&tests, "alertname:");
    for a in &alerts {
        assert!(tested.contains(a), "{a} has no case in alerts_test.yml");
    }
    if !require("promtool", missing_tool("promtool")) {
        return;
    }
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["test", "rules", "alerts_test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(&args)
            .current_dir(rules_dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The daemon's own `/metrics` after a verified task in a repository workspace: every
/// metric the rules name is there (a renamed metric would leave an alert that never fires),
/// and the new gauges carry the recorder's and caches' usage against their bounds.
#[tokio::test]
async fn every_metric_the_rules_name_is_in_the_daemons_metrics() {
    let rules = std::fs::read_to_string(rules_dir().join("alerts.yml")).unwrap();
    let named = metrics_named(&rules);
    assert!(named.contains("hub_sidecar_accepting_tasks"), "{named:?}");
    // `up` is Prometheus's own, per scrape target.
    assert!(rules.contains("up{job=\"hub-sidecar\"} == 0"));

    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut c, _ws) = cfg_with_workspace(&hub, dir.path());
    let confines = crate::containment::cannot_confine().is_none();
    if !confines {
        // Tasks still run, so the task families appear; no repository cache is made.
        c.containment = Some(hub_sidecar::config::Containment::BestEffort);
    }
    c.caches.max_size_mb = 64;
    let server = MetricsServer::start().await;
    let (ops, addr) = (server.ops.clone(), server.addr);
    let shutdown = hub_sidecar::daemon::Shutdown::new();
    let daemon = tokio::spawn(hub_sidecar::daemon::run(c, shutdown.clone(), ops.clone()));
    hub.wait_for_type("identify", T).await.unwrap();
    let mut task = sample_shell_task("alerted", "echo cached > \"$XDG_CACHE_HOME/m\"; echo done");
    task["verification_steps"] = json!([{"type": "command_succeeds", "target": "true"}]);
    hub.assign(task);
    let done = hub.wait_for_type("task_complete", T).await.unwrap();
    assert_eq!(done["result"]["verification_status"], "verified", "{done}");
    assert!(wait_until(|| hub.acked_terminal("alerted") == 1, T).await);

    // Retention runs when the task's record is done, on the recorder's thread.
    let mut text = String::new();
    let counted = wait_until(
        || {
            text = ops.metrics().encode();
            text.contains("hub_sidecar_recorder_records 1")
        },
        T,
    )
    .await;
    assert!(counted, "{text}");
    let (code, _, text) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    let served = |name: &str| {
        text.lines().any(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
    };
    let missing: Vec<&String> = named.iter().filter(|n| !served(n)).collect();
    assert!(
        missing.is_empty(),
        "named by alerts.yml, not served: {missing:?}\n{text}"
    );

    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    assert_eq!(value("hub_sidecar_recorder_max_records"), 500.0);
    assert!(value("hub_sidecar_recorder_bytes") > 0.0, "{text}");
    assert!(
        value("hub_sidecar_recorder_max_bytes") >= 16.0 * 1024.0 * 1024.0,
        "{text}"
    );
    assert_eq!(
        value("hub_sidecar_caches_max_bytes"),
        64.0 * 1024.0 * 1024.0
    );
    if confines {
        assert!(value("hub_sidecar_caches_bytes") > 0.0, "{text}");
        assert!(
            text.contains(
                "hub_sidecar_accepting_tasks{containment=\"strict\",reason=\"\",missing=\"\"} 1"
            ),
            "{text}"
        );
    } else {
        eprintln!("this machine cannot confine tasks: the caches' usage is not checked");
    }

    shutdown.drain.cancel();
    tokio::time::timeout(T, daemon)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    server.stop().await;
    assert_no_violations(&hub);
}
