//! `hub-sidecar tasks` (recent tasks, one line each) and `hub-sidecar show TASK_ID` (one
//! task's story: a timeline of attempts, what failed, what changed, why the loop stopped).
//!
//! Both only read the flight records under `state_dir/tasks` (see [`crate::recorder`]), so
//! they work while the daemon runs and after it stopped, without the hub. Everything in a
//! record came from a task: the text is passed through [`crate::term::printable`] before it
//! reaches the terminal.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::cli::{ConfigArgs, ShowArgs, TasksArgs};
use crate::recorder::story::{self, TaskStory, TaskSummary};

/// The state directory: `--state-dir`, else the one in the configuration.
pub fn state_dir(args: &ConfigArgs) -> anyhow::Result<PathBuf> {
    if let Some(d) = &args.state_dir {
        return Ok(d.clone());
    }
    let cfg = args.load_for_reading().context(
        "reading the configuration to find the state directory; pass --state-dir DIR \
         (e.g. /var/lib/hub-sidecar) or --config FILE",
    )?;
    Ok(cfg.state_dir)
}

/// `hub-sidecar tasks`: the recent tasks from the flight recorder, newest first.
pub async fn run_tasks(args: TasksArgs) -> anyhow::Result<ExitCode> {
    let root = crate::recorder::root(&state_dir(&args.config)?);
    let list = tokio::task::spawn_blocking({
        let root = root.clone();
        move || story::recent(&root, args.limit)
    })
    .await
    .context("reading the task records")?
    .with_context(|| format!("reading the task records in {}", root.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else if list.is_empty() {
        println!(
            "no task records in {}",
            crate::term::printable(&root.display().to_string())
        );
    } else {
        print!("{}", tasks_table(&list));
    }
    Ok(ExitCode::SUCCESS)
}

/// The `tasks` table, control characters escaped.
pub fn tasks_table(list: &[TaskSummary]) -> String {
    crate::term::printable(&tasks_table_raw(list)).into_owned()
}

fn tasks_table_raw(list: &[TaskSummary]) -> String {
    let mut out = format!(
        "{:<19}  {:<8}  {:>9}  {:>8}  {:<10}  {:>9}  TASK\n",
        "STARTED (UTC)", "EXECUTOR", "DURATION", "ATTEMPTS", "STATUS", "COST"
    );
    for t in list {
        let _ = writeln!(
            out,
            "{:<19}  {:<8}  {:>9}  {:>8}  {:<10}  {:>9}  {}",
            story::utc(t.started_at),
            t.executor.as_deref().unwrap_or("-"),
            duration(t.duration_ms),
            t.attempts,
            t.status,
            format!("${:.4}", t.cost_usd),
            t.task_id
        );
    }
    out
}

/// `hub-sidecar show TASK_ID`: one task's story, or its JSON with `--json`.
pub async fn run_show(args: ShowArgs) -> anyhow::Result<ExitCode> {
    let root = crate::recorder::root(&state_dir(&args.config)?);
    let id = args.task_id.clone();
    let story = tokio::task::spawn_blocking({
        let root = root.clone();
        move || TaskStory::load(&root, &id)
    })
    .await
    .context("reading the task record")?
    .with_context(|| {
        format!(
            "no readable record for task {} in {}; `hub-sidecar tasks` lists the recorded ones \
             (old records are removed by retention, see [recorder] in the config)",
            args.task_id,
            root.display()
        )
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&story)?);
    } else {
        print!("{}", render(&story, args.verbose));
    }
    Ok(ExitCode::SUCCESS)
}

fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 120_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60)
    }
}

fn first_line(s: &str, max: usize) -> String {
    let line = s.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    crate::util::truncate_chars(line.trim(), max)
}

/// The readable timeline, control characters escaped.
pub fn render(s: &TaskStory, verbose: bool) -> String {
    crate::term::printable(&render_raw(s, verbose)).into_owned()
}

fn render_raw(s: &TaskStory, verbose: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "task {}  ({}, generation {})",
        s.task_id,
        s.executor.as_deref().unwrap_or("unknown executor"),
        s.generation
    );
    if let Some(d) = s.task["description"].as_str() {
        let _ = writeln!(o, "  {}", first_line(d, 120));
    }
    let _ = writeln!(
        o,
        "  started {} UTC, {} recorded, {} attempt(s), ${:.4}, {} tokens",
        story::utc(s.started_at),
        duration((s.last_at - s.started_at).max(0) as u64),
        s.attempts.len(),
        s.cost_usd,
        s.tokens
    );
    let _ = writeln!(o, "  status: {}", s.status);
    if let Some(c) = &s.containment {
        let level = c["level"].as_str().unwrap_or("?");
        match c["not_enforced"].as_array() {
            Some(missing) if !missing.is_empty() => {
                let missing: Vec<&str> = missing
                    .iter()
                    .filter_map(serde_json::Value::as_str)
                    .collect();
                let _ = writeln!(
                    o,
                    "  containment: {level}, NOT enforced: {}",
                    missing.join("; ")
                );
            }
            _ => {
                let _ = writeln!(o, "  containment: {level}");
            }
        }
    }
    for a in &s.attempts {
        o.push('\n');
        render_attempt(&mut o, a, verbose);
    }
    o.push('\n');
    if let Some(stop) = &s.stop {
        let _ = writeln!(
            o,
            "stopped after attempt {}: {} ({})",
            stop["after_attempt"],
            stop["decision"].as_str().unwrap_or("?"),
            stop["reason"].as_str().unwrap_or("")
        );
    }
    if !s.network.is_empty() {
        let _ = writeln!(o, "network (through the allowlist proxy):");
        for h in &s.network {
            let kib = |k: &str| h[k].as_u64().unwrap_or(0) as f64 / 1024.0;
            let _ = writeln!(
                o,
                "  {} {}  {} connection(s), {:.1} KiB up, {:.1} KiB down",
                if h["allowed"].as_bool() == Some(true) {
                    "allowed"
                } else {
                    "REFUSED"
                },
                h["target"].as_str().unwrap_or("?"),
                h["connections"],
                kib("bytes_up"),
                kib("bytes_down")
            );
            if let Some(n) = h["unreachable"].as_u64() {
                let _ = writeln!(
                    o,
                    "    {n} could not be made: {}",
                    h["last_error"].as_str().unwrap_or("?")
                );
            }
        }
    }
    match (&s.terminal, &s.cancelled) {
        (Some(t), _) => {
            let frame = &t["frame"];
            let what = match t["frame_type"].as_str() {
                Some("task_failed") => format!(
                    "task_failed: {}",
                    first_line(frame["reason"].as_str().unwrap_or(""), 200)
                ),
                other => format!(
                    "{}: {} ({})",
                    other.unwrap_or("?"),
                    frame["result"]["status"].as_str().unwrap_or("?"),
                    frame["result"]["verification_status"]
                        .as_str()
                        .unwrap_or("?")
                ),
            };
            let _ = writeln!(o, "result sent: {what}");
            match &s.acked {
                Some(a) => {
                    let _ = writeln!(
                        o,
                        "acknowledged by the hub at {} UTC",
                        story::utc(a["ts"].as_i64().unwrap_or(0))
                    );
                }
                None => {
                    let _ = writeln!(
                        o,
                        "not acknowledged by the hub (yet): it stays in the outbox until it is"
                    );
                }
            }
        }
        (None, Some(why)) => {
            let _ = writeln!(o, "no result sent: {why}");
        }
        (None, None) => {
            let _ = writeln!(
                o,
                "no result recorded: the task is still running, or the daemon stopped before it ended"
            );
        }
    }
    if s.truncated {
        let _ = writeln!(
            o,
            "note: the record hit recorder.max_task_bytes; some output is left out"
        );
    }
    if s.unreadable_lines > 0 {
        let _ = writeln!(
            o,
            "note: {} unreadable line(s) skipped (a crash mid-write)",
            s.unreadable_lines
        );
    }
    o
}

fn render_attempt(o: &mut String, a: &story::AttemptStory, verbose: bool) {
    let mut head = format!("attempt {}", a.attempt);
    if let Some(t) = a.started_at {
        let _ = write!(head, "  {} UTC", story::utc(t));
    }
    if let Some(e) = &a.execution {
        let _ = write!(
            head,
            "  {}  {} in {}  ${:.4}  {} tokens",
            e["model"].as_str().unwrap_or("-"),
            e["status"].as_str().unwrap_or("?"),
            duration(e["execution_ms"].as_u64().unwrap_or(0)),
            e["cost_usd"].as_f64().unwrap_or(0.0),
            e["tokens_in"].as_u64().unwrap_or(0) + e["tokens_out"].as_u64().unwrap_or(0)
        );
    }
    let _ = writeln!(o, "{head}");
    if let Some(p) = &a.prompt {
        if verbose {
            let _ = writeln!(o, "  prompt:\n{}", indent(p, "    "));
        } else {
            let _ = writeln!(
                o,
                "  prompt: {} ({} lines)",
                first_line(p, 100),
                p.lines().count()
            );
        }
    }
    if let Some(err) = a.execution.as_ref().and_then(|e| e["error"].as_str()) {
        let _ = writeln!(o, "  executor error: {}", first_line(err, 200));
    }
    if verbose && !a.output.is_empty() {
        let _ = writeln!(o, "  output:\n{}", indent(&a.output, "    "));
    }
    if !a.observations.is_empty() {
        let _ = writeln!(o, "  changed: {}", a.observations.join("; "));
    }
    let checks = a
        .report
        .as_ref()
        .and_then(|r| r["checks"].as_array())
        .cloned()
        .unwrap_or_default();
    if let Some(r) = &a.report {
        let _ = writeln!(
            o,
            "  verification: {} ({} of {} passed)",
            r["status"].as_str().unwrap_or("?"),
            r["summary"]["passed"],
            r["summary"]["total"]
        );
    }
    for c in &checks {
        let status = c["status"].as_str().unwrap_or("?");
        let mut line = format!(
            "    {} {} {}: {status}",
            if status == "pass" { "✓" } else { "✗" },
            c["type"].as_str().unwrap_or("?"),
            c["target"].as_str().unwrap_or("")
        );
        if status != "pass" {
            let out = first_line(c["output"].as_str().unwrap_or(""), 160);
            if !out.is_empty() {
                let _ = write!(line, " — {out}");
            }
        }
        let _ = writeln!(o, "{line}");
    }
    if a.report.is_none() {
        // A crash before the loop ended: the check results seen as events still tell.
        for e in a
            .events
            .iter()
            .filter(|e| e["event_type"] == "verification_check_result")
        {
            let _ = writeln!(o, "    {}", e["text"].as_str().unwrap_or(""));
        }
    }
    if let Some(d) = &a.decision {
        let _ = writeln!(
            o,
            "  → {}: {}",
            d["decision"].as_str().unwrap_or("?"),
            d["reason"].as_str().unwrap_or("")
        );
    }
}

fn indent(s: &str, pad: &str) -> String {
    s.lines()
        .map(|l| format!("{pad}{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
