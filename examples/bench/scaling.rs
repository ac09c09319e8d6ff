//! Figure 13: work that grows with what changed, not with the workspace.
//!
//! Four workspace shapes at 1,000 / 10,000 / 100,000 files, each a fresh daemon (so its
//! `VmHWM` is this row's peak) running one task with a check that fails, so the workspace is
//! observed before and after every attempt:
//!
//! - `git`: a repository with N untracked files (aged an hour, as a checkout from earlier is)
//!   and a task that changes 2 of them (one edited, one new);
//! - `creates`: a repository in which the task creates N files;
//! - `no git`: a plain directory of N files (aged) and a task that changes 2;
//! - `corrective`: a Claude task (a stand-in script, not Claude) whose first attempt creates
//!   N files; the second attempt is given the corrective prompt listing them.
//!
//! The workspace is the daemon's `repo_dir` (no `origin`, so no git workflow). CPU is the
//! daemon's own `utime + stime` over the task, per attempt, with its waited-for children
//! (git, the task's shell) beside it.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hub_sidecar::mock_hub::sample_shell_task;
use serde_json::json;

use crate::harness::*;
use crate::Opts;

/// The shapes of figure 13, in table order.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Git,
    Creates,
    NoGit,
    Corrective,
}

impl Shape {
    fn label(self, n: usize) -> String {
        let n = group(n);
        match self {
            Shape::Git => format!("13a. git workspace, {n} untracked files, 2 changed"),
            Shape::Creates => format!("13b. a task that creates {n} files (git)"),
            Shape::NoGit => format!("13c. workspace without git, {n} files, 2 changed"),
            Shape::Corrective => format!("13d. corrective prompt after {n} changed files"),
        }
    }
}

fn group(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `git ARGS` in `cwd` with a fixed identity; panics with git's stderr when it fails.
fn git(cwd: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "bench: git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// N small files in directories of 1,000, modified an hour ago.
fn files(ws: &Path, n: usize) {
    let old = SystemTime::now() - Duration::from_secs(3600);
    for i in 0..n {
        let sub = ws.join(format!("d{:03}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&sub).expect("fixture dir");
        }
        let p = sub.join(format!("f{:04}.txt", i % 1000));
        std::fs::write(&p, format!("{i}\n")).expect("fixture file");
        let f = std::fs::File::options()
            .write(true)
            .open(&p)
            .expect("fixture file");
        f.set_modified(old).expect("fixture mtime");
    }
}

/// A shell line that creates `n` empty files in directories of 1,000 under `gen/`.
fn create_script(n: usize) -> String {
    format!(
        "i=0; while [ $i -lt {dirs} ]; do mkdir -p gen/$i && (cd gen/$i && seq -f 'f%04g' 1 {per} | xargs touch); i=$((i+1)); done",
        dirs = n.div_ceil(1000),
        per = n.min(1000)
    )
}

/// The stand-in `claude` for the corrective shape: creates `n` files on the first prompt,
/// edits one on a corrective prompt (recording that prompt's size), and answers in
/// `stream-json` like the real CLI.
fn stand_in(dir: &Path, n: usize) -> PathBuf {
    let path = dir.join("claude");
    let script = format!(
        r#"#!/bin/sh
# Bench stand-in for the Claude Code CLI (not Claude): see examples/bench/scaling.rs.
prompt=$(cat)
case "$prompt" in
  *"VERIFICATION RETRY"*) printf '%s' "$prompt" | wc -c > '{log}'; echo again >> gen-note.txt ;;
  *) {create} ;;
esac
printf '%s\n' '{{"type":"system","subtype":"init","session_id":"bench","model":"claude-sonnet-4-5","cwd":".","permissionMode":"acceptEdits","apiKeySource":"ANTHROPIC_API_KEY","tools":[]}}'
printf '%s\n' '{{"type":"result","subtype":"success","is_error":false,"duration_ms":1,"num_turns":1,"result":"done","session_id":"bench","total_cost_usd":0.0,"usage":{{"input_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}},"modelUsage":{{}},"permission_denials":[],"terminal_reason":"completed"}}'
"#,
        log = dir.join("corrective-prompt-bytes").display(),
        create = create_script(n),
    );
    std::fs::write(&path, script).expect("stand-in");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// One row: fixture, fresh daemon, one task, peak and CPU.
async fn one(o: &Opts, shape: Shape, n: usize) -> Row {
    let fixture = tempfile::tempdir().expect("temp dir");
    let ws = fixture.path().join("ws");
    std::fs::create_dir(&ws).expect("ws");
    let tools = fixture.path().join("tools");
    std::fs::create_dir(&tools).expect("tools");
    match shape {
        Shape::Git => {
            git(&ws, &["init", "-q"]);
            std::fs::write(ws.join("tracked.txt"), "t\n").expect("tracked");
            git(&ws, &["add", "tracked.txt"]);
            git(&ws, &["commit", "-qm", "init"]);
            files(&ws, n);
        }
        Shape::Creates | Shape::Corrective => {
            git(&ws, &["init", "-q"]);
            git(&ws, &["commit", "-q", "--allow-empty", "-m", "init"]);
        }
        Shape::NoGit => files(&ws, n),
    }
    let two_changes = "printf 'changed\\n' > d000/f0007.txt; printf 'new\\n' > new.txt";
    let check = json!([{"type": "file_exists", "target": "never.txt"}]);
    let (task, extra) = match shape {
        Shape::Git | Shape::NoGit | Shape::Creates => {
            let cmd = match shape {
                Shape::Creates => create_script(n),
                _ => two_changes.to_string(),
            };
            let mut t = sample_shell_task(&format!("scale-{n}"), &cmd);
            t["metadata"]["timeout_ms"] = json!(600_000);
            t["verification_steps"] = check;
            (t, String::new())
        }
        Shape::Corrective => {
            let claude = stand_in(&tools, n);
            let t = json!({
                "task_id": format!("scale-{n}"),
                "description": "Create the files the check wants.",
                "metadata": {"timeout_ms": 600_000},
                "generation": 1,
                "file_hints": [],
                "success_criteria": ["never.txt exists"],
                "verification_steps": check,
                "routing_decision": {"effective_tier": "complex", "target_type": "claude",
                                     "selected_model": "claude-sonnet-4-5"},
                "max_verification_retries": 1
            });
            let extra = format!(
                "[executor]\nclaude_path = \"{}\"\n[sandbox]\nread_paths = [\"{}\"]\nwrite_paths = [\"{}\"]\n",
                claude.display(),
                tools.display(),
                tools.display()
            );
            (t, extra)
        }
    };
    let hub = hub_unlimited().await;
    let config = format!("repo_dir = \"{}\"\n{UNTHROTTLED}{extra}", ws.display());
    let d = Daemon::start(o, &hub, &config, &[]);
    identified(&hub).await;
    let idle_kb = d.status_kb("VmHWM");
    let (cpu0, kids0) = (d.cpu_ticks(), d.child_cpu_ticks());
    hub.assign(task);
    let done = hub
        .wait_for(
            |f| type_of(f) == "task_complete" || type_of(f) == "task_failed",
            Duration::from_secs(900),
        )
        .await;
    let peak_kb = d.status_kb("VmHWM");
    let (cpu1, kids1) = (d.cpu_ticks(), d.child_cpu_ticks());
    d.stop().await;
    let Some(done) = done else {
        return Row::new(
            &shape.label(n),
            "≤ 16 MB",
            "—",
            "no result within 900 s".into(),
            Some(false),
        );
    };
    let result = &done["result"];
    let attempts = result["verification_attempts"].as_u64().unwrap_or(1).max(1);
    let tick_ms = 1000.0 / clk_tck();
    let cpu_ms = (cpu1 - cpu0) as f64 * tick_ms / attempts as f64;
    let kids_ms = (kids1.saturating_sub(kids0)) as f64 * tick_ms / attempts as f64;
    let prompt = std::fs::read_to_string(tools.join("corrective-prompt-bytes"))
        .ok()
        .map(|b| format!("; corrective prompt {} B", b.trim()))
        .unwrap_or_default();
    let peak = peak_kb as f64 / 1024.0;
    Row::new(
        &shape.label(n),
        "≤ 16 MB",
        "—",
        format!(
            "{peak:.1} MB peak (identified {:.1}); daemon CPU {cpu_ms:.0} ms per attempt (its children — git, the task — {kids_ms:.0} ms); {attempts} attempt(s){prompt}",
            idle_kb as f64 / 1024.0,
        ),
        Some(peak <= 16.0),
    )
}

/// Figure 13: every shape at every size. `BENCH_13_SHAPES` (letters of the rows, e.g. `d`)
/// and `BENCH_13_SIZES` (e.g. `100000`) narrow it to the rows being worked on.
pub(crate) async fn scaling(o: &Opts, sizes: &[usize]) -> Vec<Row> {
    let shapes = std::env::var("BENCH_13_SHAPES").unwrap_or_else(|_| "abcd".into());
    let only: Vec<usize> = std::env::var("BENCH_13_SIZES")
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_default();
    let mut rows = Vec::new();
    for (letter, shape) in
        ('a'..).zip([Shape::Git, Shape::Creates, Shape::NoGit, Shape::Corrective])
    {
        if !shapes.contains(letter) {
            continue;
        }
        for &n in sizes.iter().filter(|n| only.is_empty() || only.contains(n)) {
            eprintln!("bench: 13 {shape:?} {n}");
            rows.push(one(o, shape, n).await);
        }
    }
    rows
}
