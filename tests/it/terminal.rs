//! The operator's terminal (issue 27, class 4): a task never gets a controlling terminal,
//! and nothing it prints or names reaches the operator's terminal as a control sequence.

use serde_json::json;

use hub_sidecar::mock_hub::sample_shell_task;

use crate::git::terminal;
use crate::harness::Harness;

/// The binary with `args`: exit code, stdout then stderr.
async fn cli(args: &[&str]) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hub-sidecar"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("HUB_SIDECAR_CONFIG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A task's output, description and file names carry escape sequences (clear screen, a
/// window title, a CSI in C1 form, a bidi override, a carriage return): `show -v` and
/// `tasks` print every one of them escaped.
#[tokio::test]
async fn show_and_tasks_print_a_tasks_control_characters_escaped() {
    let s = Harness::setup().await;
    let state = s.dir().to_path_buf();
    let (c, _ws) = s.cfg_with_workspace();
    let h = s.start(c).await;
    let mut t = sample_shell_task(
        "esc",
        "printf 'out\\033[2J\\033]0;owned\\007\\r\\302\\233\\342\\200\\256x\\n'; \
         touch \"$(printf 'f\\033[31mred')\" \"$(printf 'g\\342\\200\\256h')\"",
    );
    t["description"] = json!("Describe \u{1b}[1A\u{1b}[2Kcleanly");
    t["verification_steps"] =
        json!([{"type": "command_succeeds", "target": "printf '\\033[5mfail'; false"}]);
    t["max_verification_retries"] = json!(0);
    h.assign(t);
    terminal(h.hub(), "esc").await;
    let record = state.join("tasks/esc/record.jsonl");
    let acked = || {
        std::fs::read_to_string(&record)
            .unwrap_or_default()
            .contains("\"kind\":\"acked\"")
    };
    assert!(crate::util::wait_until(acked, crate::util::T).await);
    let state_arg = state.to_str().unwrap();
    let (code, story) = cli(&["show", "esc", "-v", "--state-dir", state_arg]).await;
    assert_eq!(code, Some(0), "{story}");
    let (code, table) = cli(&["tasks", "--state-dir", state_arg]).await;
    assert_eq!(code, Some(0), "{table}");
    assert!(
        story.contains("\\x1b[2J") && story.contains("\\x1b[31mred"),
        "{story}"
    );
    assert!(story.contains("\\u{202e}"), "{story}");
    for text in [&story, &table] {
        let raw: Vec<char> = text
            .chars()
            .filter(|c| (c.is_control() && *c != '\n') || ('\u{202a}'..='\u{202e}').contains(c))
            .collect();
        assert!(raw.is_empty(), "raw control characters {raw:?} in:\n{text}");
    }
    h.finish().await;
}
