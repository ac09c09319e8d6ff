//! The Ollama executor, plain and agentic, against the fake Ollama HTTP server.

use super::*;

use crate::fakes::{answer, streamed, tool_calls, FakeOllama, Reply, MODEL};
use hub_sidecar::executor::ollama::OllamaExecutor;
use hub_sidecar::executor::ExecutorError;

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
        matches!(err, ExecutorError::InsecureOllama { .. }),
        "{err:?}"
    );
    let err = err.to_string();
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
        (out.equivalent_claude_cost_usd - hub_sidecar::cost::equivalent_claude_cost(12, 3)).abs()
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
        prompt: "THE FULL CORRECTIVE PROMPT, restating the task".into(),
        followup: Some("now fix it".into()),
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
    // The retry continues the kept chat: the first prompt, the model's own answer, and a
    // short corrective turn — never another copy of the task in a fresh conversation.
    assert_eq!(
        reqs[1]["messages"],
        json!([{"role": "user", "content": "say hello"},
               {"role": "assistant", "content": "Hello, world"},
               {"role": "user", "content": "now fix it"}])
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

/// `f00.txt` … `f19.txt` in `ws`, 16 KiB each (five times a 16,384-token window in all);
/// their content.
fn twenty_big_files(ws: &std::path::Path) -> String {
    let big: String = (0..16 * 1024 / 64)
        .map(|i| format!("{i:05} the quick brown fox jumps over the lazy dog, again.....\n"))
        .collect();
    for i in 0..20 {
        std::fs::write(ws.join(format!("f{i:02}.txt")), &big).unwrap();
    }
    big
}

/// Twenty iterations, each reading a different 16 KiB file: 320 KiB of tool results, about
/// five times a 16,384-token window. Every request stays under `num_ctx` (by the executor's
/// own conservative estimate, and by far by a 4-characters-a-token one), and every request
/// still carries the system prompt, the task and the newest tool result whole.
#[tokio::test]
async fn a_20_iteration_run_stays_under_num_ctx_by_summarising_older_turns() {
    let ws = tempfile::tempdir().unwrap();
    let big = twenty_big_files(ws.path());
    let mut replies = Vec::new();
    for i in 0..20 {
        replies.push(tool_calls(&[(
            "read_file",
            json!({"path": format!("f{i:02}.txt")}),
        )]));
    }
    let server = FakeOllama::start(replies).await;
    let task = json!({"task_id": "t-ctx", "description": "THE-TASK: summarise the files",
        "routing_decision": {"target_type": "ollama", "effective_tier": "complex",
                             "selected_endpoint": server.endpoint(), "selected_model": MODEL}});
    let (out, events) = run(&server, task, ws.path(), |_| {}).await;
    assert_eq!(out.termination_reason.as_deref(), Some("max_iterations"));
    assert_eq!(out.iterations_used, Some(20));
    let reqs = server.requests();
    assert_eq!(reqs.len(), 20);
    let num_ctx = 16_384usize;
    for (i, r) in reqs.iter().enumerate() {
        let msgs = r["messages"].as_array().unwrap();
        let chars: usize = msgs.iter().map(|m| m.to_string().len()).sum();
        assert!(chars / 4 < num_ctx, "request {i}: {chars} chars");
        assert_eq!(msgs[0]["role"], "system", "request {i}");
        assert_eq!(msgs[1]["content"], "do it", "request {i}: the task stays");
        if i > 0 {
            // The newest tool result is whole.
            let last = msgs.last().unwrap();
            assert_eq!(last["role"], "tool");
            assert_eq!(
                last["content"].as_str().unwrap().len(),
                big.len(),
                "request {i}"
            );
        }
    }
    let last = reqs[19]["messages"].as_array().unwrap();
    assert!(last.iter().any(|m| m["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("[summarised") || c.contains("were folded"))));
    assert!(kinds(&events, EventKind::Status)
        .iter()
        .any(|e| e.text.starts_with("context: ") && e.text.contains("num_ctx 16384")));
}

/// A plan in the shape the first prompt asks for, 5 steps, over 500 characters.
const PLAN: &str = "PLAN\nGoal: summarise every file of the workspace into SUMMARY.md, one line per file\nSteps:\n1. List the workspace -> verify: list_directory shows the twenty f*.txt files\n2. Read each file in turn -> verify: read_file returned its content without an error\n3. Write one line per file into SUMMARY.md -> verify: SUMMARY.md has twenty lines\n4. Re-read SUMMARY.md -> verify: every line names its file and says what it holds\n5. Finish with a short summary -> verify: the answer lists SUMMARY.md as the change";

/// The model's plan arrives with its first tool call; then 19 more rounds of 16 KiB tool
/// results push the chat five times over the window. The context fitting summarises and
/// folds the older turns, but never the plan (nor the task): the last request holds both
/// whole.
#[tokio::test]
async fn the_plan_and_the_task_stay_whole_through_20_iterations() {
    let ws = tempfile::tempdir().unwrap();
    twenty_big_files(ws.path());
    let mut replies = Vec::new();
    for i in 0..20 {
        let call = json!({"function": {"name": "read_file",
                                       "arguments": {"path": format!("f{i:02}.txt")}}});
        let content = if i == 0 { PLAN } else { "" };
        replies.push(Reply::Ndjson(vec![crate::fakes::done_line(
            json!({"role": "assistant", "content": content, "tool_calls": [call]}),
            100,
            10,
        )]));
    }
    let server = FakeOllama::start(replies).await;
    let statement = format!("THE-TASK: summarise the files. {}", "Detail. ".repeat(60));
    let task = json!({"task_id": "t-plan", "description": "x",
        "routing_decision": {"target_type": "ollama", "effective_tier": "complex",
                             "selected_endpoint": server.endpoint(), "selected_model": MODEL}});
    let (ctx, _events) = context(task, ws.path(), ChildEnv::inherit(), |_| {});
    let mut ex = OllamaExecutor::new(&ctx).unwrap();
    let out = ex.execute(&ctx, &attempt(&statement)).await;
    assert_eq!(out.iterations_used, Some(20), "{:?}", out.error);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 20);
    let last = reqs[19]["messages"].as_array().unwrap();
    let whole = |text: &str| last.iter().any(|m| m["content"] == text);
    assert!(whole(PLAN), "the plan was shortened: {last:#?}");
    assert!(whole(&statement), "the task was shortened");
    // The chat was cut to fit all the same: older turns were summarised or folded.
    assert!(last.iter().any(|m| m["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("[summarised") || c.contains("were folded"))));
    let chars: usize = last.iter().map(|m| m.to_string().len()).sum();
    assert!(chars / 4 < 16_384, "{chars} chars");
}

/// A corrective retry continues the chat with a short turn that carries the plan the loop
/// stored, whole: the model does not have to find it in a history that may be summarised.
#[tokio::test]
async fn an_ollama_retry_carries_the_stored_plan_in_its_corrective_turn() {
    let ws = tempfile::tempdir().unwrap();
    let write = |text: &str| {
        json!({"function": {"name": "write_file",
        "arguments": {"path": "out.txt", "content": text}}})
    };
    let server = FakeOllama::start(vec![
        Reply::Ndjson(vec![crate::fakes::done_line(
            json!({"role": "assistant", "content": PLAN, "tool_calls": [write("wrong\n")]}),
            100,
            10,
        )]),
        answer("done"),
        tool_calls(&[(
            "write_file",
            json!({"path": "out.txt", "content": "right\n"}),
        )]),
        answer("fixed"),
    ])
    .await;
    let task = json!({"task_id": "t-retry-plan", "description": "write out.txt",
        "max_verification_retries": 1,
        "verification_steps": [{"type": "command_succeeds", "target": "grep -q right out.txt"}],
        "routing_decision": {"target_type": "ollama", "effective_tier": "standard",
                             "selected_endpoint": server.endpoint(), "selected_model": MODEL}});
    let (ctx, _events) = context(task, ws.path(), ChildEnv::inherit(), |_| {});
    let mut exec = hub_sidecar::executor::Executor::for_task(&ctx).unwrap();
    let out = hub_sidecar::verify::retry_loop::run(&mut exec, &ctx).await;
    assert_eq!(
        out.termination_reason, "verified",
        "{:?}",
        out.last_exec.error
    );
    assert_eq!(out.executions, 2);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 4);
    let msgs = reqs[2]["messages"].as_array().unwrap();
    let turn = msgs.last().unwrap();
    assert_eq!(turn["role"], "user");
    let turn = turn["content"].as_str().unwrap();
    assert!(turn.starts_with("VERIFICATION RETRY 1/1"), "{turn}");
    assert!(turn.contains("YOUR PLAN (made on attempt 1"), "{turn}");
    let plan = out.plan.expect("the loop stored the plan");
    assert_eq!(plan.steps.len(), 5);
    assert!(turn.contains(&plan.render()), "the plan, whole: {turn}");
    assert!(
        !turn.contains("ORIGINAL TASK"),
        "a short turn: the chat has the task"
    );
}
