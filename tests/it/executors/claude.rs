//! The Claude Code CLI executor against a stand-in `claude` script that prints the real
//! `stream-json` lines.

use super::*;

use hub_sidecar::executor::claude::{ClaudeExecutor, LocateError};

/// Lines as Claude Code 2.1.x prints them for `-p --output-format stream-json --verbose`
/// (recorded against a fake Messages API): one `assistant` event per content block, all
/// sharing the message id and its start-of-message usage; the result's `modelUsage` has
/// the full figures.
const SUCCESS: &str = r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s-1","tools":["Bash","Read","Write"],"mcp_servers":[],"model":"claude-sonnet-4-5-20250929","permissionMode":"acceptEdits","apiKeySource":"ANTHROPIC_API_KEY"}
{"type":"assistant","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"I'll create the file."}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":4,"cache_creation_input_tokens":100,"cache_read_input_tokens":0,"output_tokens":1}},"parent_tool_use_id":null,"session_id":"s-1"}
{"type":"assistant","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"tool_use","id":"toolu_01","name":"Write","input":{"file_path":"/w/hello.txt","content":"hi\n"}}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":4,"cache_creation_input_tokens":100,"cache_read_input_tokens":0,"output_tokens":1}},"parent_tool_use_id":null,"session_id":"s-1"}
{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_01","type":"tool_result","content":"File created successfully at: /w/hello.txt"}]},"parent_tool_use_id":null,"session_id":"s-1"}
this line is not json and must be skipped
{"type":"assistant","message":{"id":"msg_02","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Done: hello.txt exists."}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":1}},"parent_tool_use_id":null,"session_id":"s-1"}
{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"duration_ms":2400,"duration_api_ms":2300,"num_turns":2,"result":"Done: hello.txt exists.","session_id":"s-1","total_cost_usd":0.0123,"usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":100,"output_tokens":37,"server_tool_use":{"web_search_requests":0},"service_tier":"standard"},"modelUsage":{"claude-sonnet-4-5-20250929":{"inputTokens":10,"outputTokens":37,"cacheReadInputTokens":100,"cacheCreationInputTokens":100,"webSearchRequests":0,"costUSD":0.0123,"contextWindow":200000,"maxOutputTokens":64000}},"permission_denials":[],"terminal_reason":"completed"}
"#;

/// A 529 as the CLI reports it after its own retries (`api_retry` events), exit 1.
const OVERLOADED: &str = r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s-2","tools":[],"model":"claude-sonnet-4-5-20250929","apiKeySource":"ANTHROPIC_API_KEY"}
{"type":"system","subtype":"api_retry","attempt":1,"max_retries":2,"retry_delay_ms":527.9,"error_status":529,"error":"overloaded","session_id":"s-2"}
{"type":"system","subtype":"api_retry","attempt":2,"max_retries":2,"retry_delay_ms":1130.9,"error_status":529,"error":"overloaded","session_id":"s-2"}
{"type":"assistant","message":{"id":"9090d3d6","container":null,"model":"<synthetic>","role":"assistant","stop_reason":"stop_sequence","stop_sequence":"","type":"message","usage":{"input_tokens":0,"output_tokens":0},"content":[{"type":"text","text":"API Error: 529 Overloaded. This is a server-side issue, usually temporary — try again in a moment."}]},"parent_tool_use_id":null,"session_id":"s-2","error":"server_error","request_id":"req_1"}
{"type":"result","subtype":"success","is_error":true,"api_error_status":529,"duration_ms":2382,"duration_api_ms":0,"num_turns":1,"result":"API Error: 529 Overloaded. This is a server-side issue, usually temporary — try again in a moment.","stop_reason":"stop_sequence","session_id":"s-2","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0},"modelUsage":{},"permission_denials":[]}
"#;

/// The default permission mode denying the agent's only write: still `success`, exit 0.
const DENIED: &str = r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s-3","tools":["Write"],"model":"claude-sonnet-4-5-20250929","permissionMode":"default","apiKeySource":"none"}
{"type":"assistant","message":{"id":"msg_fake1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"tool_use","id":"toolu_w1","name":"Write","input":{"file_path":"/w/hello.txt","content":"hi\n"}}],"stop_reason":null,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}},"parent_tool_use_id":null,"session_id":"s-3"}
{"type":"user","message":{"role":"user","content":[{"type":"tool_result","content":"Claude requested permissions to write to /w/hello.txt, but you haven't granted it yet.","is_error":true,"tool_use_id":"toolu_w1"}]},"parent_tool_use_id":null,"session_id":"s-3"}
{"type":"assistant","message":{"id":"msg_fake2","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"All done."}],"stop_reason":null,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}},"parent_tool_use_id":null,"session_id":"s-3"}
{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"num_turns":2,"result":"All done.","session_id":"s-3","total_cost_usd":0.0035,"usage":{"input_tokens":200,"output_tokens":100},"modelUsage":{"claude-sonnet-4-5-20250929":{"inputTokens":200,"outputTokens":100,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.0035}},"permission_denials":[{"tool_name":"Write","tool_use_id":"toolu_w1","tool_input":{"file_path":"/w/hello.txt","content":"hi\n"}}],"terminal_reason":"completed"}
"#;

/// A stand-in `claude` on a private PATH: a test double speaking the real stream-json
/// format. It records its argv (NUL-separated), its stdin (the prompt) and how often it
/// ran, and behaves per the `mode` file: ok, fail_once, fail, overloaded, denied, linger
/// (result, then never exits), silent (init, then nothing), slow_tool (2 s of silence
/// between a tool_use and its result), hang.
struct StandIn {
    dir: tempfile::TempDir,
    workspace: tempfile::TempDir,
}

impl StandIn {
    fn new(mode: &str) -> StandIn {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("success.jsonl"), SUCCESS).unwrap();
        std::fs::write(d.join("overloaded.jsonl"), OVERLOADED).unwrap();
        std::fs::write(d.join("denied.jsonl"), DENIED).unwrap();
        std::fs::write(d.join("mode"), mode).unwrap();
        std::fs::create_dir(d.join("bin")).unwrap();
        let script = format!(
            r#"#!/bin/sh
# Test double for the Claude Code CLI (real stream-json lines, scripted behaviour).
D='{}'
: > "$D/argv"
for a in "$@"; do printf '%s\0' "$a" >> "$D/argv"; done
cat > "$D/stdin"
printf '%s' "$CLAUDE_CODE_MAX_RETRIES" > "$D/max_retries"
n=$(cat "$D/count" 2>/dev/null || echo 0); n=$((n+1)); echo "$n" > "$D/count"
case "$(cat "$D/mode")" in
  ok) cat "$D/success.jsonl" ;;
  fail_once) if [ "$n" -eq 1 ]; then echo "Segmentation fault" >&2; exit 139; fi; cat "$D/success.jsonl" ;;
  fail) echo "Segmentation fault" >&2; exit 3 ;;
  overloaded) cat "$D/overloaded.jsonl"; exit 1 ;;
  denied) cat "$D/denied.jsonl" ;;
  linger) cat "$D/success.jsonl"; sleep 30 & echo $! > "$D/pid"; wait ;;
  silent) head -1 "$D/success.jsonl"; sleep 30 & echo $! > "$D/pid"; wait ;;
  slow_tool) head -3 "$D/success.jsonl"; sleep 2; tail -n +4 "$D/success.jsonl" ;;
  hang) sleep 30 & echo $! > "$D/pid"; wait ;;
esac
"#,
            d.display()
        );
        let bin = d.join("bin/claude");
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        StandIn {
            dir,
            workspace: tempfile::tempdir().unwrap(),
        }
    }

    fn env(&self) -> ChildEnv {
        let mut env = ChildEnv::inherit();
        let path = std::env::var("PATH").unwrap_or_default();
        env.set(
            "PATH",
            &format!("{}:{path}", self.dir.path().join("bin").display()),
        );
        env
    }

    fn argv(&self) -> Vec<String> {
        let raw = std::fs::read_to_string(self.dir.path().join("argv")).unwrap();
        raw.split('\0')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    fn stdin(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdin")).unwrap()
    }

    fn runs(&self) -> u32 {
        std::fs::read_to_string(self.dir.path().join("count"))
            .map(|s| s.trim().parse().unwrap())
            .unwrap_or(0)
    }

    fn context(&self, task: Value, cfg: impl FnOnce(&mut Config)) -> (ExecContext, Events) {
        context(task, self.workspace.path(), self.env(), cfg)
    }
}

fn task() -> Value {
    json!({"task_id": "t-claude", "description": "make hello.txt",
               "routing_decision": {"target_type": "claude", "selected_model": "claude-opus-4-6"}})
}

/// The value following `flag` in `argv`.
fn flag_value<'a>(argv: &'a [String], flag: &str) -> &'a str {
    let i = argv
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} missing in {argv:?}"));
    &argv[i + 1]
}

#[tokio::test]
async fn success_parses_tokens_cost_output_and_progress() {
    let s = StandIn::new("ok");
    let (ctx, events) = s.context(task(), |_| {});
    let mut ex = ClaudeExecutor::new(&ctx).unwrap();
    let out = ex.execute(&ctx, &attempt("make hello.txt")).await;
    assert_eq!(out.status, ExecStatus::Succeeded, "{:?}", out.error);
    assert_eq!(out.output, "Done: hello.txt exists.");
    assert_eq!(out.tokens_in, 210, "input + cache creation + cache read");
    assert_eq!(out.tokens_out, 37);
    assert!((out.cost_usd - 0.0123).abs() < 1e-9);
    assert!((out.equivalent_claude_cost_usd - 0.0123).abs() < 1e-9);
    assert!(!out.cost_is_estimate, "an API key's cost is spend");
    assert_eq!(
        out.iterations_used,
        Some(2),
        "two message ids, three events"
    );
    assert_eq!(
        out.model_used.as_deref(),
        Some("claude-sonnet-4-5-20250929")
    );
    let argv = s.argv();
    assert_eq!(
        &argv[..4],
        ["-p", "--output-format", "stream-json", "--verbose"]
    );
    assert_eq!(flag_value(&argv, "--model"), "claude-opus-4-6");
    assert_eq!(flag_value(&argv, "--permission-mode"), "acceptEdits");
    assert_eq!(flag_value(&argv, "--setting-sources"), "user");
    assert!(argv.contains(&"--strict-mcp-config".to_string()));
    assert!(argv.contains(&"--no-session-persistence".to_string()));
    assert_eq!(s.stdin(), "make hello.txt");
    let tokens = kinds(&events, EventKind::Token);
    assert_eq!(tokens.len(), 2);
    assert_eq!(tokens[0].text, "I'll create the file.");
    assert_eq!(tokens[1].tokens_so_far, Some(2));
    let tools = kinds(&events, EventKind::ToolCall);
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].fields["tool_name"], "Write");
    assert_eq!(tools[0].fields["args_summary"], "/w/hello.txt");
    assert_eq!(
        tools[0].fields["result_summary"],
        "File created successfully at: /w/hello.txt"
    );
    assert_eq!(tools[0].fields["iteration"], 1);
}

#[tokio::test]
async fn non_claude_selected_model_falls_back_to_the_configured_one() {
    let s = StandIn::new("ok");
    let t = json!({"task_id": "t", "routing_decision": {"target_type": "claude", "selected_model": "qwen3:8b"}});
    let (ctx, _) = s.context(t, |c| c.executor.claude_model = "claude-haiku-4-5".into());
    let out = ClaudeExecutor::new(&ctx)
        .unwrap()
        .execute(&ctx, &attempt("x"))
        .await;
    assert_eq!(out.status, ExecStatus::Succeeded);
    assert_eq!(flag_value(&s.argv(), "--model"), "claude-haiku-4-5");
}

#[tokio::test]
async fn the_prompt_goes_verbatim_on_stdin_never_in_argv() {
    let s = StandIn::new("ok");
    let evil = "fix it $(touch pwned) and `touch pwned2`; echo \"$HOME\" 'quoted' > pwned3 --model evil --dangerously-skip-permissions";
    // Over the 128 KiB a single argv element may have (E2BIG).
    let big = format!("{evil}\n{}", "x".repeat(200 * 1024));
    let (ctx, _) = s.context(json!({"task_id": "t", "description": evil}), |_| {});
    let out = ClaudeExecutor::new(&ctx)
        .unwrap()
        .execute(&ctx, &attempt(&big))
        .await;
    assert_eq!(out.status, ExecStatus::Succeeded, "{:?}", out.error);
    assert_eq!(s.stdin(), big);
    let argv = s.argv();
    assert!(
        !argv
            .iter()
            .any(|a| a.contains("pwned") || a.contains("dangerously")),
        "{argv:?}"
    );
    assert_eq!(flag_value(&argv, "--model"), "claude-sonnet-4-5");
    for dir in [s.workspace.path(), s.dir.path()] {
        for f in ["pwned", "pwned2", "pwned3"] {
            assert!(
                !dir.join(f).exists(),
                "{f} was created: the prompt went through a shell"
            );
        }
    }
}

#[tokio::test]
async fn missing_cli_is_a_clear_error() {
    let empty = tempfile::tempdir().unwrap();
    let mut env = ChildEnv::inherit();
    env.set("PATH", &empty.path().display().to_string());
    let (ctx, _) = context(task(), empty.path(), env, |_| {});
    let err = ClaudeExecutor::new(&ctx)
        .err()
        .expect("claude must not be found");
    assert!(matches!(err, LocateError::NotOnPath(_)), "{err:?}");
    let err = err.to_string();
    assert!(
        err.contains("npm install -g @anthropic-ai/claude-code"),
        "{err}"
    );
    assert!(err.contains("executor.claude_path"), "{err}");

    let (ctx, _) = context(task(), empty.path(), ChildEnv::inherit(), |c| {
        c.executor.claude_path = Some(PathBuf::from("/nonexistent/claude"))
    });
    let err = ClaudeExecutor::new(&ctx).err().expect("bad claude_path");
    assert!(matches!(err, LocateError::BadPath(_)), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/claude"), "{err}");
}

#[tokio::test]
async fn a_crashed_run_is_retried_then_succeeds() {
    let s = StandIn::new("fail_once");
    let (ctx, events) = s.context(task(), |_| {});
    let out = ClaudeExecutor::new(&ctx)
        .unwrap()
        .execute(&ctx, &attempt("x"))
        .await;
    assert_eq!(out.status, ExecStatus::Succeeded, "{:?}", out.error);
    assert_eq!(s.runs(), 2);
    assert_eq!(out.tokens_out, 37);
    assert!(
        !kinds(&events, EventKind::Error).is_empty(),
        "the retry is reported"
    );
}

#[tokio::test]
async fn all_retries_crashing_is_failed_with_exit_and_stderr() {
    let s = StandIn::new("fail");
    let (ctx, _) = s.context(task(), |_| {});
    let out = ClaudeExecutor::new(&ctx)
        .unwrap()
        .execute(&ctx, &attempt("x"))
        .await;
    assert_eq!(out.status, ExecStatus::Failed);
    assert_eq!(s.runs(), 4, "one run and three retries");
    let err = out.error.unwrap();
    assert!(err.contains("Segmentation fault"), "{err}");
    assert!(err.contains("gave up after 4 tries"), "{err}");
}

#[tokio::test]
async fn an_api_error_the_cli_already_retried_fails_at_once_naming_its_class() {
    let s = StandIn::new("overloaded");
    let (ctx, events) = s.context(task(), |c| c.executor.claude_retry_delays_ms = vec![10]);
    let out = ClaudeExecutor::new(&ctx)
        .unwrap()
        .execute(&ctx, &attempt("x"))
        .await;
    assert_eq!(out.status, ExecStatus::Failed);
    assert_eq!(s.runs(), 1, "one retry layer only: the CLI's");
    let err = out.error.unwrap();
    assert!(
        err.contains("overloaded") && err.contains("529 Overloaded"),
        "{err}"
    );
    let retries = kinds(&events, EventKind::Error);
    assert_eq!(retries.len(), 2, "each api_retry is reported as progress");
    let bound = std::fs::read_to_string(s.dir.path().join("max_retries")).unwrap();
    assert_eq!(bound, "4", "the CLI's own retries are bounded");
}

#[tokio::test]
async fn a_run_whose_only_write_was_denied_is_not_a_success() {
    let s = StandIn::new("denied");
    let (ctx, events) = s.context(task(), |_| {});
    let out = ClaudeExecutor::new(&ctx)
        .unwrap()
        .execute(&ctx, &attempt("x"))
        .await;
    assert_eq!(out.status, ExecStatus::Failed);
    assert_eq!(s.runs(), 1);
    let err = out.error.unwrap();
    assert!(
        err.contains("Write(/w/hello.txt)") && err.contains("claude_allowed_tools"),
        "{err}"
    );
    assert_eq!(out.permission_denials, ["Write(/w/hello.txt)"]);
    // apiKeySource "none" is a subscription login: the cost is an estimate.
    assert!(out.cost_is_estimate);
    assert!(kinds(&events, EventKind::Status)
        .iter()
        .any(|e| e.text.contains("estimate")));
}

#[tokio::test]
async fn a_cli_lingering_after_its_result_is_stopped_and_the_run_succeeds() {
    let s = StandIn::new("linger");
    let (ctx, _) = s.context(task(), |c| {
        c.executor.claude_result_grace_ms = 100;
        c.executor.trivial_timeout_secs = 20;
        c.executor.standard_timeout_secs = 20;
    });
    let out = ClaudeExecutor::new(&ctx)
        .unwrap()
        .execute(&ctx, &attempt("x"))
        .await;
    assert_eq!(out.status, ExecStatus::Succeeded, "{:?}", out.error);
    assert_eq!(out.output, "Done: hello.txt exists.");
    assert_eq!(s.runs(), 1);
    assert_gone(&s.dir.path().join("pid")).await;
}

#[tokio::test]
async fn a_silent_stream_is_killed_by_the_watchdog() {
    let s = StandIn::new("silent");
    let (ctx, _) = s.context(task(), |c| c.executor.claude_idle_timeout_secs = 1);
    let out = ClaudeExecutor::new(&ctx)
        .unwrap()
        .execute(&ctx, &attempt("x"))
        .await;
    assert_eq!(out.status, ExecStatus::Failed);
    assert_eq!(s.runs(), 1);
    let err = out.error.unwrap();
    assert!(err.contains("printed nothing for 1 s"), "{err}");
    assert_gone(&s.dir.path().join("pid")).await;
}

#[tokio::test]
async fn silence_while_a_tool_runs_is_not_idleness() {
    // init, text, tool_use … 2 s of silence (the tool working) … result.
    let s = StandIn::new("slow_tool");
    let (ctx, _) = s.context(task(), |c| c.executor.claude_idle_timeout_secs = 1);
    let out = ClaudeExecutor::new(&ctx)
        .unwrap()
        .execute(&ctx, &attempt("x"))
        .await;
    assert_eq!(out.status, ExecStatus::Succeeded, "{:?}", out.error);
    assert_eq!(out.output, "Done: hello.txt exists.");
}

#[tokio::test]
async fn timeout_kills_the_process_group() {
    let s = StandIn::new("hang");
    let t = json!({"task_id": "t", "complexity": {"effective_tier": "trivial"},
                       "routing_decision": {"target_type": "claude"}});
    let (ctx, _) = s.context(t, |c| c.executor.trivial_timeout_secs = 1);
    let started = Instant::now();
    let out = ClaudeExecutor::new(&ctx)
        .unwrap()
        .execute(&ctx, &attempt("x"))
        .await;
    assert_eq!(out.status, ExecStatus::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(s.runs(), 1, "a timeout is not retried");
    assert_gone(&s.dir.path().join("pid")).await;
}

#[tokio::test]
async fn cancellation_stops_within_a_second_and_leaves_no_process() {
    let s = StandIn::new("hang");
    let (ctx, _) = s.context(task(), |_| {});
    let mut ex = ClaudeExecutor::new(&ctx).unwrap();
    let run_ctx = ctx.clone();
    let handle = tokio::spawn(async move { ex.execute(&run_ctx, &attempt("x")).await });
    wait_for_file(&s.dir.path().join("pid")).await;
    let cancelled_at = Instant::now();
    ctx.cancel.cancel();
    let out = tokio::time::timeout(Duration::from_secs(1), handle)
        .await
        .expect("cancel took over 1 s")
        .unwrap();
    assert!(cancelled_at.elapsed() < Duration::from_secs(1));
    assert_eq!(out.status, ExecStatus::Cancelled);
    assert_eq!(s.runs(), 1, "a cancelled run is not retried");
    assert_gone(&s.dir.path().join("pid")).await;
}
