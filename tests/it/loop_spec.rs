//! The verification loop as the specification (`002_…`) asks, seen from the hub: the
//! frames the daemon sends for a task that fails its checks and is corrected — the retry's
//! announcement and its one `attempt` number, the budget said in the result, reports that
//! agree with the result, the judge's tokens, the plan made once and carried, the Ollama chat
//! kept across a retry, and a restart that continues with the corrective prompt.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::fakes::{answer, tool_calls, FakeOllama, Reply};
use crate::harness::Harness;
use crate::util::*;

/// Every `execution_event` the hub received for `task_id`, in order: a frame's own event, or
/// the events merged into it (`merged_events`), each with the events folded into it.
fn hub_events(h: &Harness, task_id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for f in h.received_of("task_progress") {
        if f["task_id"] != task_id {
            continue;
        }
        let ev = &f["execution_event"];
        let list: Vec<Value> = match ev["merged_events"].as_array() {
            Some(m) => m.clone(),
            None => vec![ev.clone()],
        };
        for e in list {
            for folded in e["folded_events"].as_array().into_iter().flatten() {
                out.push(folded.clone());
            }
            out.push(e);
        }
    }
    out
}

fn of_type<'a>(events: &'a [Value], ty: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event_type"] == ty).collect()
}

/// The demo's stand-in `claude` (a test double speaking the pinned CLI's stream-json; wrong
/// once, then right), wrapped so each prompt it gets is appended to `log`.
pub(crate) fn recording_stand_in(dir: &Path, log: &Path) -> PathBuf {
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stand-in-claude/claude");
    let path = dir.join("claude");
    let script = format!(
        "#!/bin/sh\n# Test double: records the prompt (stdin), then runs the stand-in claude on it.\np=$(cat)\nprintf '%s\\n=====\\n' \"$p\" >> '{}'\nprintf '%s' \"$p\" | exec '{}' \"$@\"\n",
        log.display(),
        real.display()
    );
    write_script(&path, &script);
    path
}

fn write_script(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

pub(crate) fn prompts(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .split("\n=====\n")
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// The demo task (greeting.txt, wrong once) through the daemon with the stand-in `claude`;
/// `edit` shapes the task, `tweak` the config. Returns the hub's terminal frame, the events
/// the hub saw and the prompts the CLI got.
async fn greeting(
    edit: impl FnOnce(&mut Value),
    tweak: impl FnOnce(&mut hub_sidecar::config::Config),
) -> (Value, Vec<Value>, Vec<String>) {
    let (done, events, prompts, _) = greeting_frames(edit, tweak).await;
    (done, events, prompts)
}

/// [`greeting`], with the task's `execution_event`s as the hub received them, one per frame.
async fn greeting_frames(
    edit: impl FnOnce(&mut Value),
    tweak: impl FnOnce(&mut hub_sidecar::config::Config),
) -> (Value, Vec<Value>, Vec<String>, Vec<Value>) {
    let s = Harness::setup().await;
    let log = probe(s.dir()).join("prompts.log");
    let (mut c, _ws) = s.cfg_with_workspace();
    c.executor.claude_path = Some(recording_stand_in(&probe(s.dir()), &log));
    c.sandbox
        .read_paths
        .push(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stand-in-claude"));
    tweak(&mut c);
    let h = s.start(c).await;
    let mut task = hub_sidecar::commands::demo::sample_task();
    edit(&mut task);
    h.assign(task);
    let done = h.terminal("demo-greeting").await;
    let events = hub_events(&h, "demo-greeting");
    let frames = h
        .received_of("task_progress")
        .into_iter()
        .filter(|f| f["task_id"] == "demo-greeting")
        .map(|f| f["execution_event"].clone())
        .collect();
    let prompts = prompts(&log);
    h.finish().await;
    (done, events, prompts, frames)
}

#[tokio::test]
async fn a_retry_is_announced_with_its_failing_checks_one_attempt_number_and_its_budget() {
    // The task asks for 5; the operator lowered the ceiling to 3, and that is said.
    let (done, events, _) = greeting(
        |t| t["max_verification_retries"] = json!(5),
        |c| c.verification.retry_ceiling = 3,
    )
    .await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified");
    assert_eq!(r["max_verification_retries"], 3);
    assert_eq!(
        r["retry_budget"],
        json!({"max_retries": 3, "requested": 5, "requested_from": "task",
               "operator_ceiling": 3, "limited_by": "retry_ceiling",
               "note": "the task asked for 5; this sidecar's operator ceiling verification.retry_ceiling = 3 lowers it"})
    );
    let said = of_type(&events, "status");
    assert!(
        said.iter().any(|e| e["text"]
            .as_str()
            .unwrap()
            .starts_with("retry budget: 3 corrective retries (the task asked for 5;")),
        "{said:?}"
    );
    let starts = of_type(&events, "verification_retry_start");
    assert_eq!(starts.len(), 1, "{events:?}");
    let start = starts[0];
    assert_eq!(
        start["text"],
        "Verification retry 1/3: fixing 1 failed check"
    );
    assert_eq!(
        (
            &start["attempt"],
            &start["run_number"],
            &start["max_retries"],
            &start["failed"]
        ),
        (&json!(1), &json!(2), &json!(3), &json!(1))
    );
    assert_eq!(start["limited_by"], "retry_ceiling");
    // The three events of the retry pair up on one number.
    let of_retry: Vec<&Value> = events.iter().filter(|e| e["run_number"] == 2).collect();
    let kinds: Vec<&str> = of_retry
        .iter()
        .map(|e| e["event_type"].as_str().unwrap())
        .filter(|k| k.starts_with("verification_"))
        .collect();
    assert_eq!(
        kinds,
        [
            "verification_retry_start",
            "verification_check_result",
            "verification_check_result",
            "verification_retry_complete"
        ]
    );
    assert!(of_retry.iter().all(|e| e["attempt"] == 1), "{of_retry:?}");
    let complete = of_type(&events, "verification_retry_complete");
    assert_eq!(complete[0]["attempt"], 0, "the first run is no retry");
    assert_eq!(
        complete[1]["text"],
        "Retry 1/3 complete: 2 passed, 0 failed (pass)"
    );
}

/// Issue 44: each verdict, retry start and check result reaches the hub as a frame whose
/// `event_type` and fields are its own (a verdict and the next start, milliseconds apart,
/// used to share one frame led by the start). Everything else rides along.
#[tokio::test]
async fn every_verdict_retry_start_and_check_result_reaches_the_hub_as_its_own_frame() {
    let (done, events, _, frames) = greeting_frames(|_| {}, |_| {}).await;
    assert_eq!(done["result"]["verification_status"], "verified", "{done}");
    let typed = |e: &Value| {
        e["event_type"]
            .as_str()
            .is_some_and(|t| t.starts_with("verification_"))
    };
    let heads: Vec<&str> = frames
        .iter()
        .filter(|f| typed(f))
        .map(|f| f["event_type"].as_str().unwrap())
        .collect();
    // Two runs (wrong once, then right), two checks each: every event its own frame.
    assert_eq!(
        heads,
        [
            "verification_check_result",
            "verification_check_result",
            "verification_retry_complete",
            "verification_retry_start",
            "verification_check_result",
            "verification_check_result",
            "verification_retry_complete"
        ],
        "{frames:#?}"
    );
    assert_eq!(
        heads.len(),
        events.iter().filter(|e| typed(e)).count(),
        "no verification event arrives merged behind another"
    );
    for f in frames.iter().filter(|f| typed(f)) {
        let merged = f["merged_events"].as_array().cloned().unwrap_or_default();
        let typed_inside = merged.iter().filter(|e| typed(e)).count();
        assert!(
            typed_inside <= 1,
            "two verification events in one frame: {f:#}"
        );
    }
    let verdict = frames
        .iter()
        .find(|f| f["event_type"] == "verification_retry_complete")
        .unwrap();
    assert_eq!(
        (
            &verdict["run_number"],
            &verdict["status"],
            &verdict["failed"]
        ),
        (&json!(1), &json!("fail"), &json!(1)),
        "the first run's verdict, in its own fields"
    );
}

#[tokio::test]
async fn default_max_retries_applies_to_a_task_that_carries_no_number_and_says_so() {
    let (done, events, prompts) = greeting(
        |t| {
            t.as_object_mut()
                .unwrap()
                .remove("max_verification_retries");
        },
        |c| c.verification.default_max_retries = 1,
    )
    .await;
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified", "{done}");
    assert_eq!(r["verification_attempts"], 2);
    assert_eq!(prompts.len(), 2);
    assert_eq!(r["retry_budget"]["requested_from"], "config_default");
    assert_eq!(r["retry_budget"]["max_retries"], 1);
    assert!(r["retry_budget"].get("limited_by").is_none(), "{r}");
    assert_eq!(
        of_type(&events, "verification_retry_start")[0]["text"],
        "Verification retry 1/1: fixing 1 failed check"
    );
}

#[tokio::test]
async fn claude_is_asked_for_a_plan_once_and_every_retry_is_given_it() {
    let (done, events, prompts) = greeting(|_| {}, |_| {}).await;
    assert_eq!(done["result"]["verification_status"], "verified", "{done}");
    assert_eq!(prompts.len(), 2);
    // The first prompt asks for the specification's shape.
    assert!(
        prompts[0].contains("PLAN\nGoal: <what the task asks for")
            && prompts[0].contains("1. <action> -> verify: <how you will confirm"),
        "{}",
        prompts[0]
    );
    // The plan was found, said, and returned in the result.
    let plan = &done["result"]["plan"];
    assert_eq!(plan["goal"], "greeting.txt holds exactly Hello, hub!");
    assert_eq!(plan["made_on_attempt"], 1);
    assert_eq!(
        plan["steps"][1],
        json!({"action": "Put the greeting in it", "verify": "grep -qx on its one line"})
    );
    assert!(of_type(&events, "status")
        .iter()
        .any(|e| e["text"] == "plan: greeting.txt holds exactly Hello, hub! (2 step(s), 2 with how it will be verified)"));
    // The retry is given the plan and told not to plan again.
    let fix = &prompts[1];
    assert!(fix.starts_with("VERIFICATION RETRY 1/2: fixing 1 failed check(s)."));
    assert!(
        fix.contains("YOUR PLAN (made on attempt 1; keep to it, do not plan again")
            && fix.contains("1. Write greeting.txt -> verify: the file exists"),
        "{fix}"
    );
    assert!(!fix.contains("Before you change anything"), "{fix}");
}

#[tokio::test]
async fn a_flaky_pass_leaves_the_report_saying_fail_beside_partial_pass() {
    let h = Harness::start().await;
    h.assign(json!({
        "task_id": "flaky", "description": "count", "generation": 1,
        "metadata": {"shell_command": "echo work > work.txt"},
        "routing_decision": {"target_type": "sidecar"},
        "verification_steps": [{"type": "command_succeeds",
            "target": "n=$(cat counter 2>/dev/null || echo 0); echo $((n+1)) > counter; [ \"$n\" -ge 1 ]"}]
    }));
    let done = h.completed("flaky").await;
    let r = &done["result"];
    assert_eq!(r["verification_status"], "partial_pass");
    assert_eq!(r["termination_reason"], "flaky");
    // A hub reading the report must not read success.
    let report = &done["verification_report"];
    assert_eq!(report["status"], "fail", "{report}");
    assert_eq!(report["checks"][0]["status"], "fail");
    assert_eq!(report["checks"][0]["flaky"], true);
    assert_eq!(report["summary"]["passed"], 0);
    assert_eq!(done["verification_history"][0]["status"], "fail");
    h.finish().await;
}

#[tokio::test]
async fn the_judge_s_tokens_reach_the_result_and_a_transient_failure_is_retried() {
    let verdict = Reply::Ndjson(vec![json!({
        "model": "judge-m", "done": true, "prompt_eval_count": 321, "eval_count": 17,
        "message": {"role": "assistant",
                    "content": "{\"match\": true, \"confidence\": 0.97, \"reason\": \"written\"}"}
    })]);
    let fake = FakeOllama::start(vec![Reply::Status(503, "loading model".into()), verdict]).await;
    let s = Harness::setup().await;
    let (mut c, _ws) = s.cfg_with_workspace();
    c.ollama_url = Some(format!("http://{}", fake.endpoint()));
    c.verification.judge_model = Some("judge-m".into());
    let h = s.start(c).await;
    h.assign(json!({
        "task_id": "judged", "description": "write hello.txt", "generation": 1,
        "metadata": {"shell_command": "echo hello > hello.txt"},
        "routing_decision": {"target_type": "sidecar"},
        "verification_steps": [{"type": "llm_judge", "target": "hello.txt says hello"}]
    }));
    let done = h.completed("judged").await;
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified", "{done}");
    assert_eq!(fake.requests().len(), 2, "the 503 was retried once");
    assert_eq!(
        (&r["tokens_in"], &r["tokens_out"]),
        (&json!(321), &json!(17))
    );
    assert_eq!(done["tokens_used"], 338);
    let check = &done["verification_report"]["checks"][0];
    assert_eq!(
        (&check["tokens_in"], &check["tokens_out"]),
        (&json!(321), &json!(17))
    );
    h.finish().await;
}

#[tokio::test]
async fn an_ollama_retry_continues_the_kept_chat_with_a_short_corrective_turn() {
    let ollama = FakeOllama::start(vec![
        tool_calls(&[("write_file", json!({"path": "done.txt", "content": "nope\n"}))]),
        answer("PLAN\nGoal: done.txt says done\nSteps:\n1. write it -> verify: grep done\n\nWrote done.txt."),
        tool_calls(&[("write_file", json!({"path": "done.txt", "content": "done\n"}))]),
        answer("Fixed done.txt."),
    ])
    .await;
    let s = Harness::setup().await;
    let (c, _ws) = s.cfg_with_workspace();
    let h = s.start(c).await;
    h.assign(json!({
        "task_id": "kept-chat", "description": "Write done.txt saying done.", "generation": 1,
        "max_verification_retries": 1,
        "routing_decision": {"target_type": "ollama", "effective_tier": "standard",
                             "selected_endpoint": ollama.endpoint(), "selected_model": "qwen3:8b"},
        "verification_steps": [{"type": "command_succeeds", "target": "grep -qx done done.txt"}]
    }));
    let done = h.completed("kept-chat").await;
    assert_eq!(done["result"]["verification_status"], "verified", "{done}");
    let reqs = ollama.requests();
    assert_eq!(reqs.len(), 4);
    let first = reqs[1]["messages"].as_array().unwrap().clone();
    let retry = reqs[2]["messages"].as_array().unwrap();
    // Everything of attempt 1 is still there: the task, the tool transcript, the answer.
    assert_eq!(&retry[..first.len()], &first[..]);
    assert_eq!(retry[first.len()]["role"], "assistant");
    assert!(retry[first.len()]["content"]
        .as_str()
        .unwrap()
        .contains("Wrote done.txt."));
    // Then one short corrective turn: what failed, not another copy of the task.
    assert_eq!(retry.len(), first.len() + 2);
    let turn = retry.last().unwrap()["content"].as_str().unwrap();
    assert!(
        turn.starts_with("VERIFICATION RETRY 1/1: fixing 1 failed check(s)."),
        "{turn}"
    );
    assert!(turn.contains("grep -qx done done.txt"), "{turn}");
    assert!(
        !turn.contains("ORIGINAL TASK") && !turn.contains("Write done.txt saying done."),
        "{turn}"
    );
    // The plan the loop stored rides along whole (the chat's copy may be summarised).
    assert!(
        turn.contains("YOUR PLAN (made on attempt 1")
            && turn.contains("Goal: done.txt says done\nSteps:\n1. write it -> verify: grep done"),
        "{turn}"
    );
    // The flight record shows what the model was sent: the turn, not the full prompt.
    let record = hub_sidecar::recorder::root(h.dir())
        .join(hub_sidecar::recorder::dir_name("kept-chat"))
        .join("record.jsonl");
    let second_prompt = || {
        std::fs::read_to_string(&record)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["kind"] == "attempt_start" && v["attempt"] == 2)
            .map(|v| v["prompt"].as_str().unwrap_or_default().to_string())
    };
    assert!(wait_until(|| second_prompt().is_some(), T).await);
    assert_eq!(second_prompt().unwrap(), turn);
    h.finish().await;
}

/// A stand-in `claude` (the pinned CLI's stream-json) for a task killed mid-retry: run 1
/// writes the wrong greeting; run 2 (the first corrective one) hangs until the daemon is
/// killed; run 3 (after the restart) writes the right one. Every prompt goes to `log`.
pub(crate) fn restart_stand_in(dir: &Path, log: &Path) -> PathBuf {
    // A copy next to the wrapper: the probe directory is readable by the task's sandbox.
    let real = dir.join("stand-in-claude");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stand-in-claude/claude"),
        &real,
    )
    .unwrap();
    let count = dir.join("runs");
    let script = format!(
        "#!/bin/sh\n# Test double: counts its runs and records each prompt; run 2 hangs.\np=$(cat)\nprintf '%s\\n=====\\n' \"$p\" >> '{log}'\necho run >> '{count}'\nif [ \"$(wc -l < '{count}')\" -eq 2 ]; then exec sleep 20; fi\nprintf '%s' \"$p\" | exec '{real}' \"$@\"\n",
        log = log.display(),
        count = count.display(),
        real = real.display()
    );
    let path = dir.join("claude");
    write_script(&path, &script);
    path
}

#[tokio::test]
async fn after_a_restart_task_continue_resumes_with_the_corrective_prompt_and_the_earlier_reports()
{
    let s = Harness::setup().await;
    let ws = s.dir().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let log = probe(s.dir()).join("prompts.log");
    let claude = restart_stand_in(&probe(s.dir()), &log);
    let extra = format!(
        "repo_dir = \"{}\"\n[executor]\nclaude_path = \"{}\"\nkill_grace_ms = 500\n",
        ws.display(),
        claude.display(),
    );
    let mut h = s.start_bin("test-token", &extra, &[]).await;

    h.assign(hub_sidecar::commands::demo::sample_task());
    h.accepted("demo-greeting").await;
    assert!(
        wait_until(|| prompts(&log).len() == 2, T).await,
        "the corrective run never started"
    );
    // The hub dies too (its task table kept), so on restart it answers `task_continue` at
    // the generation on disk: the task's own, resumed.
    h.stop().await;
    h.bin_mut().kill9().await;
    h.restart().await.unwrap();
    h.start_bin_again(&[]);
    let done = h.completed("demo-greeting").await;

    let p = prompts(&log);
    assert_eq!(p.len(), 3, "{p:?}");
    assert!(p[1].starts_with("VERIFICATION RETRY 1/2"), "{}", p[1]);
    // The resumed attempt is the same retry, not the first prompt again.
    assert!(p[2].starts_with("VERIFICATION RETRY 1/2"), "{}", p[2]);
    assert!(p[2].contains("YOUR PLAN (made on attempt 1"), "{}", p[2]);
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified", "{done}");
    assert_eq!(r["resumed_at"], 2);
    // The first life's report and tokens are in the result.
    assert_eq!(r["verification_attempts"], 2);
    let runs: Vec<&Value> = done["verification_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["run_number"])
        .collect();
    assert_eq!(runs, [&json!(1), &json!(2)]);
    assert_eq!(done["verification_history"][0]["status"], "fail");
    assert_eq!(done["tokens_used"], 2 * (850 + 40), "both lives' tokens");
    assert!((r["estimated_cost_usd"].as_f64().unwrap() - 0.0062).abs() < 1e-9);
    h.finish().await;
}

/// The daemon is killed after attempt 1 has spent (claude reported $0.0031 and 890 tokens)
/// and before its verdict (its check is still running). What was spent was written when it
/// was spent, so the task resumed by `task_continue` counts it: in the result (both lives'
/// dollars and tokens) and under the per-task cap ($0.005), which stops the task before a
/// third claude run that would have passed it.
#[tokio::test]
async fn a_restart_between_spend_and_verdict_keeps_the_money_in_the_result_and_the_cap() {
    let s = Harness::setup().await;
    let ws = s.dir().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let log = probe(s.dir()).join("prompts.log");
    // A copy of the stand-in in the probe directory, which the task's sandbox may read.
    let real = probe(s.dir()).join("stand-in-claude");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stand-in-claude/claude"),
        &real,
    )
    .unwrap();
    let claude = probe(s.dir()).join("claude");
    write_script(
        &claude,
        &format!(
            "#!/bin/sh\n# Test double: records each prompt, then runs the stand-in claude on it.\np=$(cat)\nprintf '%s\\n=====\\n' \"$p\" >> '{}'\nprintf '%s' \"$p\" | exec '{}' \"$@\"\n",
            log.display(),
            real.display()
        ),
    );
    let extra = format!(
        "repo_dir = \"{}\"\n[executor]\nclaude_path = \"{}\"\nkill_grace_ms = 500\n[verification]\nmax_cost_usd_per_task = 0.005\n",
        ws.display(),
        claude.display(),
    );
    let mut h = s.start_bin("test-token", &extra, &[]).await;
    let mut task = hub_sidecar::commands::demo::sample_task();
    // The first run of the check (in the first life) hangs until the daemon is killed.
    task["verification_steps"] = json!([{"type": "command_succeeds",
        "target": "if [ ! -e .checked ]; then touch .checked; sleep 30; fi; grep -qx 'Hello, hub!' greeting.txt"}]);
    h.assign(task);
    h.accepted("demo-greeting").await;
    assert!(
        wait_until(|| ws.join(".checked").exists(), T).await,
        "the check never started"
    );
    // The hub dies too (its task table kept), so on restart it answers `task_continue` at
    // the generation on disk: the task's own, resumed.
    h.stop().await;
    h.bin_mut().kill9().await;
    h.restart().await.unwrap();
    h.start_bin_again(&[]);
    let done = h.completed("demo-greeting").await;

    // Life 1: attempt 1 (spent, no verdict). Life 2: attempt 1 again, then the cap.
    assert_eq!(prompts(&log).len(), 2, "no third claude run past the cap");
    let r = &done["result"];
    assert_eq!(r["termination_reason"], "budget_exhausted", "{done}");
    assert_eq!(r["verification_status"], "partial_pass");
    assert_eq!(r["resumed_at"], 1);
    assert!(
        (r["estimated_cost_usd"].as_f64().unwrap() - 0.0062).abs() < 1e-9,
        "both lives' dollars: {r}"
    );
    assert_eq!(done["tokens_used"], 2 * (850 + 40), "both lives' tokens");
    assert_eq!(
        (&r["tokens_in"], &r["tokens_out"]),
        (&json!(1700), &json!(80))
    );
    h.finish().await;
}
