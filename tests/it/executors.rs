//! The Claude Code CLI and Ollama executors against test doubles that speak the real wire
//! formats: a stand-in `claude` script emitting `stream-json` lines, and a fake Ollama HTTP
//! server answering `/api/chat` with NDJSON streams and tool calls.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hub_sidecar::config::Config;
use hub_sidecar::executor::{Attempt, ExecContext, ExecStatus};
use hub_sidecar::process::ChildEnv;
use hub_sidecar::progress::{EventKind, ProgressEvent, ProgressSink};
use hub_sidecar::task::Task;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// Progress events seen by a test, in order.
type Events = Arc<Mutex<Vec<ProgressEvent>>>;

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
    };
    (ctx, events)
}

fn attempt(prompt: &str) -> Attempt {
    Attempt {
        number: 1,
        prompt: prompt.to_string(),
    }
}

fn kinds(events: &Events, kind: EventKind) -> Vec<ProgressEvent> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.kind == kind)
        .cloned()
        .collect()
}

/// The pid in `marker` is gone (or a zombie) within 1 s.
async fn assert_gone(marker: &Path) {
    let pid: i32 = std::fs::read_to_string(marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for _ in 0..50 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        match stat {
            Err(_) => return,
            Ok(s) if s.split_whitespace().nth(2) == Some("Z") => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
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

    /// Real `claude -p … --output-format stream-json --verbose` lines (shape of Claude Code 1.x/2.x).
    const SUCCESS: &str = r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s-1","tools":["Bash","Read","Write"],"mcp_servers":[],"model":"claude-sonnet-4-5-20250929","permissionMode":"default","apiKeySource":"none"}
{"type":"assistant","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"I'll create the file."},{"type":"tool_use","id":"toolu_01","name":"Write","input":{"file_path":"/w/hello.txt","content":"hi\n"}}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":4,"cache_creation_input_tokens":100,"cache_read_input_tokens":0,"output_tokens":25}},"parent_tool_use_id":null,"session_id":"s-1"}
{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_01","type":"tool_result","content":"File created successfully at: /w/hello.txt"}]},"parent_tool_use_id":null,"session_id":"s-1"}
this line is not json and must be skipped
{"type":"assistant","message":{"id":"msg_02","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Done: hello.txt exists."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":12}},"parent_tool_use_id":null,"session_id":"s-1"}
{"type":"result","subtype":"success","is_error":false,"duration_ms":2400,"duration_api_ms":2300,"num_turns":3,"result":"Done: hello.txt exists.","session_id":"s-1","total_cost_usd":0.0123,"usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":100,"output_tokens":37,"server_tool_use":{"web_search_requests":0},"service_tier":"standard"}}
"#;

    const ERROR: &str = r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s-2","tools":[],"model":"claude-sonnet-4-5-20250929"}
{"type":"result","subtype":"error_during_execution","is_error":true,"duration_ms":10,"duration_api_ms":0,"num_turns":0,"result":"API Error: 500 internal","session_id":"s-2","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0}}
"#;

    /// A stand-in `claude` on a private PATH: a test double speaking the real stream-json
    /// format. It records its argv (NUL-separated) and how often it ran, and behaves per
    /// the `mode` file: ok, fail_once, fail, is_error, hang.
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
            std::fs::write(d.join("error.jsonl"), ERROR).unwrap();
            std::fs::write(d.join("mode"), mode).unwrap();
            std::fs::create_dir(d.join("bin")).unwrap();
            let script = format!(
                r#"#!/bin/sh
# Test double for the Claude Code CLI (real stream-json lines, scripted behaviour).
D='{}'
: > "$D/argv"
for a in "$@"; do printf '%s\0' "$a" >> "$D/argv"; done
n=$(cat "$D/count" 2>/dev/null || echo 0); n=$((n+1)); echo "$n" > "$D/count"
case "$(cat "$D/mode")" in
  ok) cat "$D/success.jsonl" ;;
  fail_once) if [ "$n" -eq 1 ]; then echo "API Error: 529 overloaded" >&2; exit 1; fi; cat "$D/success.jsonl" ;;
  fail) echo "API Error: 529 overloaded" >&2; exit 3 ;;
  is_error) cat "$D/error.jsonl"; exit 1 ;;
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

    #[tokio::test]
    async fn success_parses_tokens_cost_output_and_progress() {
        let s = StandIn::new("ok");
        let (ctx, events) = s.context(task(), |c| {
            c.executor.claude_extra_args = vec!["--permission-mode".into(), "acceptEdits".into()]
        });
        let mut ex = ClaudeExecutor::new(&ctx).unwrap();
        let out = ex.execute(&ctx, &attempt("make hello.txt")).await;
        assert_eq!(out.status, ExecStatus::Succeeded, "{:?}", out.error);
        assert_eq!(out.output, "Done: hello.txt exists.");
        assert_eq!(out.tokens_in, 210, "input + cache creation + cache read");
        assert_eq!(out.tokens_out, 37);
        assert!((out.cost_usd - 0.0123).abs() < 1e-9);
        assert!((out.equivalent_claude_cost_usd - 0.0123).abs() < 1e-9);
        assert_eq!(out.iterations_used, Some(3));
        assert_eq!(
            out.model_used.as_deref(),
            Some("claude-sonnet-4-5-20250929")
        );
        assert_eq!(
            s.argv(),
            [
                "-p",
                "make hello.txt",
                "--output-format",
                "stream-json",
                "--verbose",
                "--model",
                "claude-opus-4-6",
                "--permission-mode",
                "acceptEdits"
            ]
        );
        let tokens = kinds(&events, EventKind::Token);
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens[0].text, "I'll create the file.");
        assert_eq!(tokens[1].tokens_so_far, Some(37));
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
        assert_eq!(s.argv()[6], "claude-haiku-4-5");
    }

    #[tokio::test]
    async fn prompt_reaches_the_cli_verbatim_as_one_argument() {
        let s = StandIn::new("ok");
        let evil = "fix it $(touch pwned) and `touch pwned2`; echo \"$HOME\" 'quoted' > pwned3";
        let (ctx, _) = s.context(json!({"task_id": "t", "description": evil}), |_| {});
        let out = ClaudeExecutor::new(&ctx)
            .unwrap()
            .execute(&ctx, &attempt(evil))
            .await;
        assert_eq!(out.status, ExecStatus::Succeeded);
        let argv = s.argv();
        assert_eq!(argv[0], "-p");
        assert_eq!(argv[1], evil);
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
    async fn a_failed_run_is_retried_then_succeeds() {
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
    async fn all_retries_failing_is_failed_with_exit_and_stderr() {
        let s = StandIn::new("fail");
        let (ctx, _) = s.context(task(), |_| {});
        let out = ClaudeExecutor::new(&ctx)
            .unwrap()
            .execute(&ctx, &attempt("x"))
            .await;
        assert_eq!(out.status, ExecStatus::Failed);
        assert_eq!(s.runs(), 4, "one run and three retries");
        let err = out.error.unwrap();
        assert!(err.contains("exit code 3"), "{err}");
        assert!(err.contains("529 overloaded"), "{err}");
    }

    #[tokio::test]
    async fn an_is_error_result_is_a_failure() {
        let s = StandIn::new("is_error");
        let (ctx, _) = s.context(task(), |c| c.executor.claude_retry_delays_ms = vec![10]);
        let out = ClaudeExecutor::new(&ctx)
            .unwrap()
            .execute(&ctx, &attempt("x"))
            .await;
        assert_eq!(out.status, ExecStatus::Failed);
        assert_eq!(s.runs(), 2);
        let err = out.error.unwrap();
        assert!(
            err.contains("error_during_execution") && err.contains("API Error: 500"),
            "{err}"
        );
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
