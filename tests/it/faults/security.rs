//! Security: the token never reaches children, secrets are redacted from everything the hub
//! receives, config permissions, plaintext `ws://` and TLS verification, no shell
//! interpretation of task data.

use super::*;

#[tokio::test]
async fn children_never_see_the_token_or_denied_variables() {
    const TOKEN: &str = "tok-ENV-4b1d9e77";
    let hub = MockHub::start(MockHubOptions {
        agents: vec![("sidecar-test".into(), TOKEN.into())],
        ..MockHubOptions::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        &hub,
        dir.path(),
        TOKEN,
        "[env]\ndeny = [\"MY_DENIED\"]\nallow = [\"HARMLESS_VAR\", \"MY_DENIED\", \"CARRIES_TOKEN\"]\n",
    );
    let mut bin = Bin::start(
        dir.path(),
        &config,
        &[
            ("HUB_SIDECAR_TOKEN", TOKEN),
            ("MY_DENIED", "denied-value"),
            ("CARRIES_TOKEN", &format!("x-{TOKEN}-y")),
            ("HARMLESS_VAR", "harmless-value"),
            ("GH_TOKEN", "gh-token-value"),
            ("UNLISTED_VAR", "unlisted-value"),
        ],
    );
    hub.wait_for_type("identify", T).await.unwrap();
    let env_file = probe(dir.path()).join("child-env.txt");
    hub.assign(sample_shell_task(
        "env",
        &format!("env > {}", env_file.display()),
    ));
    hub.wait_for_type("task_complete", T).await.unwrap();
    let env = std::fs::read_to_string(&env_file).unwrap();
    assert!(
        env.contains("HARMLESS_VAR=harmless-value"),
        "filter too strict:\n{env}"
    );
    assert!(env.contains("PATH="));
    // Allowed names pass, but deny and secret values win; unlisted names never pass.
    for bad in [
        "HUB_SIDECAR_",
        TOKEN,
        "MY_DENIED",
        "CARRIES_TOKEN",
        "GH_TOKEN",
        "UNLISTED_VAR",
    ] {
        assert!(
            !env.contains(bad),
            "child environment contains {bad}:\n{env}"
        );
    }
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    assert!(!bin.logs().contains(TOKEN));
    assert_no_violations(&hub);

    // The allow list: only those names (plus PATH & co.) pass.
    let mut c = hub_sidecar::config::Config::for_hub("ws://127.0.0.1:1/ws", dir.path());
    c.token = TOKEN.into();
    c.env.allow = vec!["KEEP_ME".into()];
    let vars = [
        ("KEEP_ME", "1"),
        ("PATH", "/bin"),
        ("OTHER", "2"),
        ("HUB_SIDECAR_TOKEN", TOKEN),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let env = hub_sidecar::process::ChildEnv::filter(vars, &c);
    let names: Vec<&str> = env.vars().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["KEEP_ME", "PATH"]);
}

#[tokio::test]
async fn secrets_are_redacted_in_every_form_from_everything_the_hub_receives() {
    use base64::Engine;
    const TOKEN: &str = "tok/UNIQUE+7f3a=9xyz";
    const SECRET: &str = "s3cr3t-extra-value";
    let s = Setup::with_hub(MockHubOptions {
        agents: vec![("sidecar-test".into(), TOKEN.into())],
        ..MockHubOptions::default()
    })
    .await;
    let mut c = s.cfg();
    c.token = TOKEN.into();
    c.secrets = vec![SECRET.into(), "short".into()];
    c.progress.min_interval_ms = 50;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let url = "tok%2FUNIQUE%2B7f3a%3D9xyz";
    let forms = [
        TOKEN.to_string(),
        b64(TOKEN),
        b64(TOKEN).trim_end_matches('=').to_string(),
        url.to_string(),
        SECRET.to_string(),
        b64(SECRET),
    ];
    let h = s.start(c).await;
    let echo_all: String = forms.iter().map(|f| format!("echo '{f}'; ")).collect();
    // Output (progress + result), a check's output (report), and a failure reason.
    let mut t = sample_shell_task("leaky", &format!("{echo_all} sleep 0.5; echo short"));
    t["verification_steps"] =
        json!([{"type": "command_succeeds", "target": format!("echo '{TOKEN}' '{SECRET}'")}]);
    h.assign(t);
    let done = h.wait_for_type("task_complete", T).await.unwrap();
    h.assign(sample_shell_task(
        "leaky-fail",
        &format!("{echo_all} echo '{TOKEN}' >&2; exit 3"),
    ));
    let failed = h.wait_for_type("task_failed", T).await.unwrap();
    let sent: Vec<Value> = h
        .received()
        .into_iter()
        .filter(|f| f["type"] != "identify")
        .collect();
    let all: String = sent
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    for f in &forms {
        assert!(!all.contains(f.as_str()), "`{f}` reached the hub:\n{all}");
    }
    assert!(done["result"]["output"]
        .as_str()
        .unwrap()
        .contains("[REDACTED]"));
    assert!(
        done["result"]["output"].as_str().unwrap().contains("short"),
        "short values are not secrets"
    );
    assert!(done["verification_report"]["checks"][0]["output"]
        .as_str()
        .unwrap()
        .contains("[REDACTED]"));
    assert!(
        failed["reason"].as_str().unwrap().contains("[REDACTED]"),
        "{failed}"
    );
    assert!(
        sent.iter()
            .any(|f| f["type"] == "task_progress" && f.to_string().contains("[REDACTED]")),
        "no progress frame carried the (redacted) output"
    );
    let metrics = h.ops().metrics().encode();
    assert!(!metrics.contains(TOKEN) && !metrics.contains(SECRET));
    h.finish().await;
}

#[tokio::test]
async fn a_config_readable_by_others_is_warned_about_with_the_fix() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&hub, dir.path(), "test-token", "");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bin = Bin::start(dir.path(), &config, &[]);
    hub.wait_for_type("identify", T).await.unwrap();
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    let logs = bin.logs();
    assert!(
        logs.contains(&config.display().to_string()) && logs.contains("chmod 600"),
        "no permission warning:\n{logs}"
    );
    assert!(!logs.contains("test-token"));
}

#[test]
fn plaintext_ws_is_loopback_only_by_address_not_by_prefix() {
    use hub_sidecar::hub::link::is_loopback_url;
    for ok in [
        "ws://127.0.0.1:4000/ws",
        "ws://127.1.2.3/ws",
        "ws://localhost:4000/ws",
        "ws://LOCALHOST/ws",
        "ws://[::1]:4000/ws",
        "ws://localhost",
    ] {
        assert!(is_loopback_url(ok), "{ok}");
    }
    for bad in [
        "ws://10.255.255.1:4000/ws",
        "ws://hub.invalid:4000/ws",
        "ws://127.0.0.1.evil.example:4000/ws",
        "ws://127.example/ws",
        "ws://localhost.evil.example/ws",
        "ws://user@10.0.0.1/ws",
        "ws://[::2]/ws",
    ] {
        assert!(!is_loopback_url(bad), "{bad}");
    }
}

#[tokio::test]
async fn plaintext_ws_to_a_remote_host_is_warned_about_at_startup() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    // A host that is not a loopback address yet needs no lookup and sends no packet off this
    // machine (the network rules here forbid that, DNS included): 0.0.0.0 reaches this host,
    // and nothing listens on port 1.
    let config = write_config(
        &hub,
        dir.path(),
        "test-token",
        "hub_url = \"ws://0.0.0.0:1/ws\"\n",
    );
    // write_config wrote the mock's URL; TOML forbids a duplicate key, so drop that line.
    let text = std::fs::read_to_string(&config).unwrap();
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with(&format!("hub_url = \"{}\"", hub.url())))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&config, text).unwrap();
    let mut bin = Bin::start(dir.path(), &config, &[]);
    let log = bin.log.clone();
    assert!(
        wait_until(
            || std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("unencrypted ws://"),
            T
        )
        .await,
        "no warning:\n{}",
        bin.logs()
    );
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    assert_eq!(hub.connections_total(), 0);
}

#[tokio::test]
async fn wss_verifies_the_certificate_and_trusts_ca_file() {
    let hub = hub().await;
    let (port, failures) = crate::loopback::tls_front(hub.addr()).await;
    let url = format!("wss://127.0.0.1:{port}/ws");
    // Without ca_file: the test CA is unknown, the handshake is refused, nothing identifies.
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(&hub, dir.path());
    c.hub_url = url.parse().unwrap();
    let d = spawn(c);
    assert!(
        wait_until(|| failures.load(Ordering::SeqCst) >= 2, T).await,
        "the daemon never tried (or the handshake did not fail)"
    );
    assert_eq!(
        hub.connections_total(),
        0,
        "connected through an untrusted certificate"
    );
    assert!(hub.received_of("identify").is_empty());
    d.stop().await;
    // With ca_file: identified over TLS, and a task goes through.
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(&hub, dir.path());
    c.hub_url = url.parse().unwrap();
    c.ca_file = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures/ca.pem"));
    let d = spawn(c);
    hub.wait_for_type("identify", T)
        .await
        .expect("identify over wss");
    hub.assign(sample_shell_task("over-tls", "echo tls"));
    hub.wait_for_type("task_complete", T)
        .await
        .expect("task over wss");
    d.stop().await;
    assert_no_violations(&hub);
}

#[tokio::test]
async fn shell_metacharacters_in_task_data_are_never_interpreted() {
    let s = Harness::setup().await;
    let (c, ws) = s.cfg_with_workspace();
    let h = s.start(c).await;
    let m = |n: &str| h.dir().join(n).display().to_string();
    let inj = |n: &str| {
        format!(
            "$(touch {a}) `touch {b}`; touch {c} && touch {d} | touch {e}\n touch {f}",
            a = m(&format!("{n}-1")),
            b = m(&format!("{n}-2")),
            c = m(&format!("{n}-3")),
            d = m(&format!("{n}-4")),
            e = m(&format!("{n}-5")),
            f = m(&format!("{n}-6")),
        )
    };
    let mut t = sample_shell_task("meta", "echo only-this-runs > ran.txt");
    t["description"] = json!(inj("desc"));
    t["file_hints"] = json!([{"path": inj("hint"), "reason": inj("reason")}]);
    t["success_criteria"] = json!([inj("crit")]);
    t["routing_decision"]["selected_model"] = json!(inj("model"));
    t["branch"] = json!(inj("branch"));
    t["repo"] = Value::Null;
    h.assign(t);
    let done = h.wait_for_type("task_complete", T).await.unwrap();
    assert_eq!(done["result"]["verification_status"], "verified");
    let planted: Vec<String> = std::fs::read_dir(h.dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            ["desc", "hint", "reason", "crit", "model", "branch"]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .collect();
    assert!(
        planted.is_empty(),
        "task data was interpreted by a shell: {planted:?}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("ran.txt")).unwrap(),
        "only-this-runs\n"
    );
    h.finish().await;
}

/// After a crash the task on disk is `Recovering`. A hub that re-queued it on the disconnect
/// may assign it straight back when the daemon re-identifies, before it answers
/// `task_recovering`: that assignment is the answer, not a second task ("sidecar_busy" would
/// cost the hub a retry of its own task and a wasted run).
#[tokio::test]
async fn a_recovering_task_assigned_again_is_run_not_refused_as_busy() {
    use hub_sidecar::state::{ActiveTask, PersistedState, Phase, StateStore, STATE_VERSION};
    let s = Harness::setup().await;
    let mut task = sample_shell_task("rec", "echo recovered-run");
    let crashed = hub_sidecar::task::Task::from_value(task.clone()).unwrap();
    StateStore::new(s.dir().join("queue.json"))
        .save(&PersistedState {
            version: STATE_VERSION,
            active: Some(ActiveTask {
                task: crashed,
                phase: Phase::Running,
                accepted_at: 1,
                trace: None,
                dirs: None,
            }),
            outbox: vec![],
        })
        .await
        .unwrap();
    let cfg = s.cfg();
    let h = s.start(cfg).await;
    // The hub's scheduler hands the re-queued task (generation 2) back at once.
    task["generation"] = json!(2);
    h.assign(task);
    let done = h
        .wait_for(
            |f| {
                f["task_id"] == "rec"
                    && (f["type"] == "task_complete" || f["type"] == "task_failed")
            },
            T,
        )
        .await
        .expect("a result");
    assert_eq!(done["type"], "task_complete", "{}", dump(h.hub(), "rec"));
    assert_eq!(done["generation"], 2);
    assert!(wait_until(|| h.acked_terminal("rec") == 1, T).await);
    settle(h.hub()).await;
    assert_eq!(h.acked_terminal("rec"), 1);
    assert_eq!(
        terminal_count(h.hub(), "rec"),
        1,
        "{}",
        dump(h.hub(), "rec")
    );
    h.finish().await;
}

/// A hub that answers `rate_limited` with an absurd `retry_after_ms` (a bug, a unit mix-up)
/// must not freeze every result for good: the pause is capped, and the hub can say it again.
#[tokio::test(start_paused = true)]
async fn an_absurd_retry_after_pauses_lifecycle_frames_for_a_bounded_time() {
    use hub_sidecar::hub::budget::RateBudget;
    let b = RateBudget::new(60, 60, 12);
    b.on_rate_limited(Duration::from_millis(u64::MAX));
    assert!(b.try_lifecycle().is_err());
    tokio::time::advance(Duration::from_secs(62)).await;
    assert!(
        b.try_lifecycle().is_ok(),
        "still paused a minute after the hub's rate_limited: results would never be sent"
    );
}

/// SIGTERM while the hub is down and a result is unacknowledged: the drain gives up on the
/// outbox after its flush budget, exits cleanly, and the next start delivers the result.
#[tokio::test]
async fn a_drain_during_a_hub_outage_keeps_the_result_for_the_next_start() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&hub, dir.path(), "test-token", "");
    let state = dir.path().join("queue.json");
    let mut bin = Bin::start(dir.path(), &config, &[]);
    hub.wait_for_type("identify", T).await.unwrap();
    hub.set_ack_terminal(false);
    hub.assign(sample_shell_task("drained", "echo drained-result"));
    hub.wait_for_type("task_complete", T).await.unwrap();
    hub.stop().await;
    let t0 = Instant::now();
    bin.signal("TERM");
    assert_eq!(bin.wait(T * 2).await, Some(0), "drain did not end");
    eprintln!("drain with the hub down ended after {:?}", t0.elapsed());
    assert!(
        outbox_has(&state_json(&state), "drained"),
        "result not kept on disk"
    );
    hub.set_ack_terminal(true);
    hub.restart().await.unwrap();
    let mut bin = Bin::start(dir.path(), &config, &[]);
    assert!(
        wait_until(|| hub.acked_terminal("drained") == 1, T).await,
        "{}",
        dump(&hub, "drained")
    );
    assert!(wait_until(|| !outbox_has(&state_json(&state), "drained"), T).await);
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    assert_no_violations(&hub);
}

/// Progress is cut (bounded memory) and sent in pieces: neither may leave a large fragment
/// of a secret behind — a token split across two frames is whole again on the hub's screen,
/// and a cut through a token leaves most of it readable.
#[tokio::test]
async fn no_secret_fragment_leaks_through_progress_cuts_and_frame_boundaries() {
    const TOKEN: &str = "tok-UNIQUE-7f3a9c2e";
    let s = Setup::with_hub(MockHubOptions {
        agents: vec![("sidecar-test".into(), TOKEN.into())],
        ..MockHubOptions::default()
    })
    .await;
    let mut c = s.cfg();
    c.token = TOKEN.into();
    c.progress.min_interval_ms = 50;
    c.progress.max_text_bytes = 256;
    let h = s.start(c).await;
    // A token split across two writes a second apart (two progress frames), then bursts
    // of lines carrying the token that overflow the 256-byte progress buffer, cut anywhere.
    let cmd = format!(
        "printf 'xx tok-UNIQUE'; sleep 1; printf -- '-7f3a9c2e yy\\n'; sleep 0.3; \
         for n in 1 2 3 4 5 6; do for i in $(seq 1 $((n * 37))); do echo \"pad$i {TOKEN}\"; done; sleep 0.2; done"
    );
    h.assign(sample_shell_task("fragments", &cmd));
    h.wait_for_type("task_complete", T).await.unwrap();
    let texts: Vec<String> = h
        .received_of("task_progress")
        .iter()
        .map(|f| {
            f["execution_event"]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    // Any 8 consecutive characters of the token is a leak.
    let fragments: Vec<&str> = (0..=TOKEN.len() - 8).map(|i| &TOKEN[i..i + 8]).collect();
    for (i, t) in texts.iter().enumerate() {
        for f in &fragments {
            assert!(
                !t.contains(f),
                "progress frame {i} carries `{f}` of the token: {t:?}"
            );
        }
    }
    h.finish().await;
}
