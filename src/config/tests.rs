//! Loading the configuration: precedence, formats, defaults, and the errors that name a key.

use std::path::{Path, PathBuf};

use super::*;

fn layers(file: Option<PathBuf>, env: &[(&str, &str)], flags: &[(&str, &str)]) -> Layers {
    Layers {
        file,
        env: env
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        flags: flags
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
    }
}

#[test]
fn precedence_is_flags_over_env_over_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(
        &f,
        "agent_id = \"file\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\nping_interval_secs = 20\n[executor]\nclaude_model = \"m\"\n",
    )
    .unwrap();
    let c = Config::load(&layers(Some(f.clone()), &[], &[])).unwrap();
    assert_eq!(c.agent_id, "file");
    assert_eq!(c.ping_interval_secs, 20);
    assert_eq!(c.executor.claude_model, "m");
    let c = Config::load(&layers(
        Some(f.clone()),
        &[
            ("HUB_SIDECAR_AGENT_ID", "env"),
            ("HUB_SIDECAR_EXECUTOR__CLAUDE_MODEL", "e"),
        ],
        &[],
    ))
    .unwrap();
    assert_eq!(c.agent_id, "env");
    assert_eq!(c.executor.claude_model, "e");
    let c = Config::load(&layers(
        Some(f),
        &[("HUB_SIDECAR_AGENT_ID", "env")],
        &[("agent_id", "flag")],
    ))
    .unwrap();
    assert_eq!(c.agent_id, "flag");
}

#[test]
fn node_config_json_is_accepted_and_numeric_token_stays_a_string() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("config.json");
    std::fs::write(
        &f,
        r#"{"agent_id":"a","token":"x","hub_url":"ws://h:4000/ws","capabilities":["code"],"wake_command":"echo","repo_dir":"/tmp"}"#,
    )
    .unwrap();
    let c = Config::load(&layers(Some(f), &[("HUB_SIDECAR_TOKEN", "12345")], &[])).unwrap();
    assert_eq!(c.token, "12345");
    assert_eq!(c.capabilities, vec!["code"]);
    assert!(c.unknown.contains_key("wake_command"));
}

#[test]
fn missing_key_names_key_and_file_and_never_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(&f, "agent_id = \"a\"\ntoken = \"tok-UNIQUE-99\"\n").unwrap();
    let e = Config::load(&layers(Some(f.clone()), &[], &[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("hub_url"), "{e}");
    assert!(e.contains(&f.display().to_string()), "{e}");
    assert!(!e.contains("tok-UNIQUE-99"));
    let e = Config::load(&layers(Some(f), &[], &[("hub_url", "http://x")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("ws://"), "{e}");
}

#[test]
fn hub_api_url_is_derived_from_hub_url_unless_set() {
    let mut c = Config::for_hub("wss://hub.example:4000/ws?x=1", Path::new("/tmp"));
    assert_eq!(c.hub_api_url(), "https://hub.example:4000");
    c.hub_url = "ws://127.0.0.1:4000/ws".parse().unwrap();
    assert_eq!(c.hub_api_url(), "http://127.0.0.1:4000");
    c.git.hub_api_url = Some("http://api:9/".into());
    assert_eq!(c.hub_api_url(), "http://api:9");
    assert!(c.git.enabled && !c.git.push_drafts);
    assert_eq!(c.git.clone_timeout_secs, 300);
}

#[test]
fn example_config_loads_and_documents_the_git_section() {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/hub-sidecar.example.toml");
    let c = Config::load(&layers(Some(f.clone()), &[], &[])).unwrap();
    assert!(c.unknown.is_empty(), "{:?}", c.unknown.keys());
    let text = std::fs::read_to_string(f).unwrap();
    for key in [
        "enabled",
        "author_name",
        "author_email",
        "push_drafts",
        "reviewer",
        "clone_timeout_secs",
        "command_timeout_secs",
        "gh_path",
        "hub_api_url",
    ] {
        assert!(
            text.contains(&format!("{key} =")),
            "[git] {key} undocumented"
        );
    }
    assert_eq!(c.hub_api_url(), "https://hub.example.internal:4000");
}

#[test]
fn debug_hides_token() {
    let c = Config::for_hub("ws://x/ws", Path::new("/tmp"));
    assert!(!format!("{c:?}").contains("test-token"));
}

#[test]
fn a_bypass_permission_mode_in_claude_extra_args_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    for extra in [
        r#"["--dangerously-skip-permissions"]"#,
        r#"["--allow-dangerously-skip-permissions"]"#,
        r#"["--permission-mode", "bypassPermissions"]"#,
        r#"["--permission-mode=bypassPermissions"]"#,
    ] {
        std::fs::write(
            &f,
            format!("agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\n[executor]\nclaude_extra_args = {extra}\n"),
        )
        .unwrap();
        let e = Config::load(&layers(Some(f.clone()), &[], &[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("claude_extra_args") && e.contains("claude_allowed_tools"),
            "{e}"
        );
    }
    std::fs::write(
        &f,
        "agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\n[executor]\nclaude_extra_args = [\"--permission-mode\", \"plan\"]\n",
    )
    .unwrap();
    assert!(Config::load(&layers(Some(f), &[], &[])).is_ok());
}

#[test]
fn a_zero_refill_rate_is_refused_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(
        &f,
        "agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\n[progress]\nrefill_per_minute = 0\n",
    )
    .unwrap();
    let e = Config::load(&layers(Some(f), &[], &[]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("progress.refill_per_minute") && e.contains("at least 1"),
        "{e}"
    );
}

#[test]
fn log_level_is_not_a_config_key_and_is_reported_as_unknown() {
    // The log level is set before any config is read: `--log-level` or RUST_LOG.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(
        &f,
        "agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\nlog_level = \"debug\"\n",
    )
    .unwrap();
    let c = Config::load(&layers(Some(f), &[], &[])).unwrap();
    assert!(
        c.unknown.contains_key("log_level"),
        "{:?}",
        c.unknown.keys()
    );
}

/// A file with the required keys and `extra` after them.
fn file_with(dir: &Path, extra: &str) -> PathBuf {
    let f = dir.join("c.toml");
    std::fs::write(
        &f,
        format!("agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\n{extra}"),
    )
    .unwrap();
    f
}

#[test]
fn a_wrongly_typed_value_is_reported_with_its_dotted_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = file_with(
        dir.path(),
        "[executor]\nclaude_model = \"m\"\nclaude_max_turns = \"many\"\n",
    );
    let e = Config::load(&layers(Some(f.clone()), &[], &[])).unwrap_err();
    match &e {
        ConfigError::WrongType { key, origin, .. } => {
            assert_eq!(key, "executor.claude_max_turns");
            assert!(origin.contains(&f.display().to_string()), "{origin}");
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
    let f = file_with(dir.path(), "executor = 3\n");
    let e = Config::load(&layers(Some(f), &[], &[])).unwrap_err();
    assert!(
        matches!(&e, ConfigError::WrongType { key, .. } if key == "executor"),
        "{e:?}"
    );
    assert!(e.to_string().contains("must be a table"), "{e}");
}

#[test]
fn a_wrongly_typed_token_is_named_without_its_value() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(
        &f,
        "agent_id = \"a\"\ntoken = 98765432\nhub_url = \"ws://h/ws\"\n",
    )
    .unwrap();
    let e = Config::load(&layers(Some(f), &[], &[])).unwrap_err();
    assert!(
        matches!(&e, ConfigError::WrongType { key, .. } if key == "token"),
        "{e:?}"
    );
    assert!(!e.to_string().contains("98765432"), "{e}");
}

#[test]
fn unknown_keys_inside_a_section_are_collected_with_their_section() {
    let dir = tempfile::tempdir().unwrap();
    let f = file_with(dir.path(), "[executor]\nclaude_modle = \"typo\"\n");
    let c = Config::load(&layers(Some(f), &[], &[])).unwrap();
    assert!(
        c.unknown.contains_key("executor.claude_modle"),
        "{:?}",
        c.unknown.keys()
    );
    assert_eq!(
        c.executor.claude_model,
        ExecutorConfig::default().claude_model
    );
}

#[test]
fn unset_keys_take_the_defaults_and_set_ones_keep_their_neighbours_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let f = file_with(dir.path(), "[git]\npush_drafts = true\n");
    let c = Config::load(&layers(Some(f), &[], &[])).unwrap();
    let d = Config::default();
    assert!(c.git.push_drafts);
    assert_eq!(c.git.clone_timeout_secs, d.git.clone_timeout_secs);
    assert_eq!(c.ping_interval_secs, d.ping_interval_secs);
    assert_eq!(c.recorder.max_tasks, d.recorder.max_tasks);
    assert!(c.unknown.is_empty(), "{:?}", c.unknown.keys());
}

#[test]
fn hub_sidecar_config_names_the_file_and_is_not_an_unknown_key() {
    // clap reads HUB_SIDECAR_CONFIG for --config; the config layer must not warn about it.
    let dir = tempfile::tempdir().unwrap();
    let f = file_with(dir.path(), "");
    let env = [("HUB_SIDECAR_CONFIG", f.to_str().unwrap())];
    let c = Config::load(&layers(Some(f.clone()), &env, &[])).unwrap();
    assert!(c.unknown.is_empty(), "{:?}", c.unknown.keys());
}

#[test]
fn urls_are_parsed_once_at_load_and_a_bad_one_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let with_hub = |hub: &str, extra: &str| {
        let f = dir.path().join("u.toml");
        std::fs::write(
            &f,
            format!("agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"{hub}\"\n{extra}"),
        )
        .unwrap();
        Config::load(&layers(Some(f), &[], &[]))
    };
    for bad in [
        "ws://remote hub:4000/ws",
        "http://hub/ws",
        "ws://",
        "hub:4000",
    ] {
        let e = with_hub(bad, "").unwrap_err();
        assert!(
            matches!(&e, ConfigError::BadUrl { key, .. } if key == "hub_url"),
            "{bad}: {e:?}"
        );
        assert!(e.to_string().contains("wss://hub.example:4000/ws"), "{e}");
    }
    let c = with_hub("WSS://[::1]:4000/ws", "").unwrap();
    assert_eq!(c.hub_url.scheme(), "wss");
    assert_eq!(c.hub_api_url(), "https://[::1]:4000");
    let e = with_hub("ws://h/ws", "[git]\nhub_api_url = \"ftp://h\"\n").unwrap_err();
    assert!(
        matches!(&e, ConfigError::BadUrl { key, .. } if key == "git.hub_api_url"),
        "{e:?}"
    );
}

#[test]
fn judge_backend_is_parsed_at_load_and_an_unknown_one_is_refused_there() {
    let dir = tempfile::tempdir().unwrap();
    for (written, backend) in [
        ("claude", JudgeBackend::Claude),
        ("Ollama", JudgeBackend::Ollama),
        ("", JudgeBackend::Ollama),
    ] {
        let f = file_with(
            dir.path(),
            &format!("[verification]\njudge_backend = \"{written}\"\n"),
        );
        let c = Config::load(&layers(Some(f), &[], &[])).unwrap();
        assert_eq!(c.verification.judge_backend, backend, "{written}");
        // Naming a backend is configuring a judge (success criteria get judged).
        assert!(c.verification.judge_configured, "{written}");
    }
    let f = file_with(dir.path(), "");
    let c = Config::load(&layers(Some(f), &[], &[])).unwrap();
    assert!(
        !c.verification.judge_configured,
        "no judge unless one is named"
    );
    let f = file_with(dir.path(), "[verification]\njudge_backend = \"gpt\"\n");
    let e = Config::load(&layers(Some(f), &[], &[])).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "verification.judge_backend"),
        "{e:?}"
    );
    assert!(e.to_string().contains("\"claude\""), "{e}");
}

#[test]
fn numbers_outside_their_range_are_refused_with_the_key_and_the_range() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, key) in [
        ("pong_timeout_secs = 0\n", "pong_timeout_secs"),
        ("ping_interval_secs = 55\n", "ping_interval_secs"),
        (
            "[verification]\ndefault_max_retries = 6\n",
            "verification.default_max_retries",
        ),
        (
            "[verification]\njudge_min_confidence = 85\n",
            "verification.judge_min_confidence",
        ),
        (
            "[verification]\nmax_cost_usd_per_task = -1.0\n",
            "verification.max_cost_usd_per_task",
        ),
        (
            "[verification]\nmax_cost_usd_per_day = -0.5\n",
            "verification.max_cost_usd_per_day",
        ),
    ] {
        let f = file_with(dir.path(), extra);
        let e = Config::load(&layers(Some(f), &[], &[])).unwrap_err();
        assert!(
            matches!(&e, ConfigError::OutOfRange { key: k, .. } if k == key),
            "{extra}: {e:?}"
        );
        assert!(e.to_string().contains("must be"), "{e}");
    }
    let f = file_with(
        dir.path(),
        "[verification]\ndefault_max_retries = 5\njudge_min_confidence = 1.0\nmax_cost_usd_per_day = 0\n",
    );
    assert!(Config::load(&layers(Some(f), &[], &[])).is_ok());
}

#[test]
fn an_unreadable_or_unparsable_file_is_named_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent.toml");
    let e = Config::load(&layers(Some(absent.clone()), &[], &[])).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Read { path, .. } if *path == absent),
        "{e:?}"
    );
    assert!(e.to_string().contains("--config"), "{e}");
    for (name, text, format) in [
        ("bad.toml", "agent_id = \n", "TOML"),
        ("bad.json", "{\"agent_id\": ", "JSON"),
        ("list.json", "[1, 2]", "JSON"),
    ] {
        let f = dir.path().join(name);
        std::fs::write(&f, text).unwrap();
        let e = Config::load(&layers(Some(f.clone()), &[], &[])).unwrap_err();
        match &e {
            ConfigError::Parse {
                path, format: got, ..
            } => {
                assert_eq!(path, &f);
                assert_eq!(*got, format, "{name}");
            }
            other => panic!("{name}: expected Parse, got {other:?}"),
        }
        assert!(e.to_string().contains(&f.display().to_string()), "{e}");
    }
}

#[test]
fn ollama_url_is_checked_at_load_but_kept_as_written() {
    let dir = tempfile::tempdir().unwrap();
    for ok in [
        "http://127.0.0.1:11434",
        "https://gpu.example/",
        "gpu-box:11434",
        "",
    ] {
        let f = file_with(dir.path(), &format!("ollama_url = \"{ok}\"\n"));
        let c = Config::load(&layers(Some(f), &[], &[])).unwrap();
        assert_eq!(c.ollama_url.as_deref(), Some(ok).filter(|u| !u.is_empty()));
    }
    for bad in ["ftp://gpu:11434", "http://gpu box:11434", "gpu box:11434"] {
        let f = file_with(dir.path(), &format!("ollama_url = \"{bad}\"\n"));
        let e = Config::load(&layers(Some(f), &[], &[])).unwrap_err();
        assert!(
            matches!(&e, ConfigError::BadUrl { key, .. } if key == "ollama_url"),
            "{bad}: {e:?}"
        );
    }
}

#[test]
fn a_warm_cache_path_that_could_leave_the_clone_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let with_hub = |hub: &str, extra: &str| {
        let f = dir.path().join("u.toml");
        std::fs::write(
            &f,
            format!("agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"{hub}\"\n{extra}"),
        )
        .unwrap();
        Config::load(&layers(Some(f), &[], &[]))
    };
    let c = with_hub(
        "ws://h/ws",
        "[git]\nwarm_cache = [\"target/\", \"./node_modules\"]\n",
    )
    .unwrap();
    assert_eq!(c.git.warm_cache, ["target/", "./node_modules"]);
    for bad in ["../up", "/abs", ".git/hooks", "*", "a/./b"] {
        let e = with_hub("ws://h/ws", &format!("[git]\nwarm_cache = [\"{bad}\"]\n")).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Invalid { key, .. } if key == "git.warm_cache"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn a_socket_grant_names_one_socket_file_by_its_absolute_path() {
    let dir = tempfile::tempdir().unwrap();
    let f = file_with(
        dir.path(),
        "[sandbox]\nsockets = [\"/run/docker.sock\", \"/var/run/user.sock\"]\n",
    );
    let c = Config::load(&layers(Some(f), &[], &[])).unwrap();
    assert_eq!(
        c.sandbox.sockets,
        [
            PathBuf::from("/run/docker.sock"),
            PathBuf::from("/var/run/user.sock")
        ]
    );
    let a_dir = dir.path().display().to_string();
    for bad in ["run/docker.sock", "/run/../etc/x.sock", "/", "/run", &a_dir] {
        let f = file_with(dir.path(), &format!("[sandbox]\nsockets = [\"{bad}\"]\n"));
        let e = Config::load(&layers(Some(f), &[], &[])).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Invalid { key, .. } if key == "sandbox.sockets"),
            "{bad}: {e}"
        );
        assert!(e.to_string().contains("/run/docker.sock"), "says how: {e}");
    }
}
