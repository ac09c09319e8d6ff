//! The agent's CLI configuration is the task's own (issue 27, class 3): a stand-in `claude`
//! reports what its `CLAUDE_CONFIG_DIR` holds and then plants settings there and in the
//! operator's directory; the next task's agent and the task's own judge must see the
//! operator's template as it was, and the template must be untouched.

use std::path::Path;

use serde_json::{json, Value};

use crate::containment::supported;
use crate::git::{terminal, write_exe};
use crate::harness::Harness;
use crate::util::*;

/// A stand-in `claude` (test double speaking stream-json): appends one line to `seen` with
/// its role (`judge` when called with `--tools`) and the files of its config directory,
/// then plants a hook in that directory and tries to in `template`.
fn stand_in(dir: &Path, seen: &Path, template: &Path) -> std::path::PathBuf {
    let claude = dir.join("claude");
    write_exe(
        &claude,
        &format!(
            r#"#!/bin/sh
# Test double for the Claude Code CLI: reports and poisons its configuration directory.
role=agent
for a in "$@"; do [ "$a" = --tools ] && role=judge; done
[ $role = agent ] && echo hi > hello.txt
cd "$CLAUDE_CONFIG_DIR" || exit 3
echo "$role $(ls -A | sort | tr '\n' ' ')$(cat settings.json)" >> '{seen}'
echo '{{"hooks":"planted"}}' > settings.json
echo planted > CLAUDE.md
echo planted > '{tpl}/CLAUDE.md' 2>/dev/null
echo '{{"type":"system","subtype":"init","cwd":"/w","session_id":"s","tools":[],"model":"m"}}'
echo '{{"type":"result","subtype":"success","is_error":false,"duration_ms":1,"num_turns":1,"result":"{{\"match\": true, \"confidence\": 0.9, \"reason\": \"ok\"}}","session_id":"s","total_cost_usd":0.0,"usage":{{"input_tokens":1,"output_tokens":1}}}}'
"#,
            seen = seen.display(),
            tpl = template.display()
        ),
    );
    claude
}

fn claude_task(id: &str) -> Value {
    json!({
        "task_id": id,
        "description": "Configure yourself",
        "routing_decision": {"effective_tier": "complex", "target_type": "claude",
            "selected_endpoint": null, "selected_model": null, "fallback_used": false,
            "fallback_reason": null, "classification_reason": "test", "estimated_cost_tier": "high"},
        "verification_steps": [{"type": "llm_judge", "target": "anything"}],
        "max_verification_retries": 0
    })
}

#[tokio::test]
async fn nothing_an_agent_writes_in_its_configuration_reaches_a_later_task_or_its_judge() {
    if !supported() {
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let template = dir.join("operator-claude");
    std::fs::create_dir_all(&template).unwrap();
    std::fs::write(template.join("settings.json"), "{}").unwrap();
    std::fs::write(template.join(".credentials.json"), "{\"login\":1}").unwrap();
    let seen = probe(&dir).join("seen");
    let bin_dir = tempfile::tempdir().unwrap();
    let claude = stand_in(bin_dir.path(), &seen, &template);
    let extra = format!(
        "[executor]\nclaude_path = \"{}\"\n[verification]\njudge_backend = \"claude\"\n",
        claude.display()
    );
    let template_env = template.display().to_string();
    let mut h = s
        .start_bin(
            "test-token",
            &extra,
            &[("CLAUDE_CONFIG_DIR", template_env.as_str())],
        )
        .await;
    for id in ["first", "second"] {
        h.assign(claude_task(id));
        let done = terminal(h.hub(), id).await;
        assert_eq!(done["type"], "task_complete", "{done}");
    }
    let lines = std::fs::read_to_string(&seen).unwrap();
    let fresh = ".credentials.json settings.json {}";
    assert_eq!(
        lines.lines().collect::<Vec<_>>(),
        [
            format!("agent {fresh}"),
            format!("judge {fresh}"),
            format!("agent {fresh}"),
            format!("judge {fresh}"),
        ],
        "every run starts from the template alone"
    );
    assert_eq!(
        std::fs::read_to_string(template.join("settings.json")).unwrap(),
        "{}"
    );
    assert!(
        !template.join("CLAUDE.md").exists(),
        "a task wrote the operator's template"
    );
    // The per-task copies go with the task: once its result is sent, and before the next
    // task or the daemon's exit (see `runner::Leftovers`).
    h.bin().signal("TERM");
    h.bin_mut().wait(T).await;
    let tmp = dir.join("tmp");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "per-task directories left: {left:?}");
    h.finish().await;
}
