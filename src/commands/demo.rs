//! The `demo` subcommand: the real daemon against the embedded mock hub, end to end.
//!
//! It starts [`crate::mock_hub`] on a free loopback port, runs [`crate::daemon::run`] against
//! it over a real WebSocket, assigns a sample task and prints the conversation as the hub
//! sees it, then the final report. The task goes to the Claude executor, backed by a
//! **stand-in `claude`** (`examples/stand-in-claude/claude`, a test double that speaks the
//! real stream-json format and gets the task wrong once), so the corrective loop shows:
//! attempt 1 fails a check, attempt 2 is verified.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::cli::DemoArgs;
use crate::config::Config;
use crate::daemon::{self, Shutdown};
use crate::mock_hub::{MockHub, MockHubOptions};
use crate::ops::Ops;
use crate::sandbox::Policy;

/// `println!`, with every control character escaped: the demo prints task data (agent
/// output, check output, file names, reasons) that must not drive the terminal.
macro_rules! say {
    () => {
        println!()
    };
    ($($arg:tt)*) => {
        println!("{}", crate::term::printable(&format!($($arg)*)))
    };
}

/// The stand-in CLI, embedded so the demo works from any directory.
const STAND_IN_CLAUDE: &str = include_str!("../../examples/stand-in-claude/claude");

/// The sample task: write a file whose exact content is checked.
pub fn sample_task() -> Value {
    json!({
        "task_id": "demo-greeting",
        "description": "Create greeting.txt in the workspace containing exactly the line 'Hello, hub!'.",
        "metadata": {},
        "generation": 1,
        "success_criteria": ["greeting.txt exists", "it contains exactly 'Hello, hub!'"],
        "verification_steps": [
            {"type": "file_exists", "target": "greeting.txt", "description": "the file was created"},
            {"type": "command_succeeds", "target": "grep -qx 'Hello, hub!' greeting.txt", "description": "exact content"}
        ],
        "routing_decision": {"effective_tier": "standard", "target_type": "claude", "selected_model": "claude-sonnet-4-5"},
        "max_verification_retries": 2
    })
}

/// Run the demo: the real daemon against an embedded mock hub, one sample task.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let dir = tempfile::Builder::new()
        .prefix("hub-sidecar-demo-")
        .tempdir()
        .context("creating the demo's temporary directory")?;
    let root = dir.path().to_path_buf();
    let workspace = root.join("workspace");
    let bin = root.join("bin");
    std::fs::create_dir_all(&workspace)?;
    std::fs::create_dir_all(&bin)?;
    let claude = bin.join("claude");
    write_executable(&claude, STAND_IN_CLAUDE)?;

    let hub = MockHub::start(MockHubOptions::default())
        .await
        .context("starting the embedded mock hub on 127.0.0.1")?;
    let mut cfg = Config::for_hub(&hub.url(), &root.join("state"));
    cfg.repo_dir = Some(workspace.clone());
    cfg.executor.claude_path = Some(claude);
    cfg.progress.min_interval_ms = 100;

    say!(
        "hub-sidecar demo: the real daemon against an embedded mock hub at {}",
        hub.url()
    );
    say!(
        "workspace {}\n(the `claude` here is a labelled stand-in: examples/stand-in-claude/claude)",
        workspace.display()
    );
    // What every child of the task will run under: the daemon's own probe, in the daemon's
    // process state (the daemon below probes again and its answer is in the result).
    let configured = cfg.containment;
    let policy = tokio::task::spawn_blocking(move || Policy::probe_blocking(configured))
        .await
        .context("probing what containment this kernel allows")?;
    match policy.refusal() {
        None => say!(
            "containment: {} ({})\n",
            policy.level_name(),
            policy.support.describe()
        ),
        Some(why) => {
            // The demo shows the loop; it chooses the weaker level out loud, as an operator
            // would have to in the config, rather than fail on such a machine.
            cfg.containment = Some(crate::sandbox::Containment::BestEffort);
            say!(
                "containment: best-effort, chosen by the demo because this machine cannot confine: {why}\nA daemon with the default config (strict) takes no task here.\n"
            );
        }
    }

    let shutdown = Shutdown::new();
    let daemon = tokio::spawn(daemon::run(cfg, shutdown.clone(), Ops::new()));
    if hub
        .wait_for_type("identify", Duration::from_secs(10))
        .await
        .is_none()
    {
        bail!("the daemon did not identify with the mock hub within 10 s");
    }
    hub.assign(sample_task());

    let mut shown = 0;
    let mut seen_inbound = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let complete = loop {
        let new = hub
            .wait_inbound_after(seen_inbound, Duration::from_secs(5))
            .await;
        seen_inbound += new.len();
        let frames = hub.frames();
        for f in &frames[shown..] {
            print_frame(f.inbound, &f.frame);
        }
        shown = frames.len();
        if let Some(done) = new
            .iter()
            .find(|f| f["type"] == "task_complete" || f["type"] == "task_failed")
        {
            break done.clone();
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the demo task did not finish within 120 s");
        }
    };
    hub.wait_for(|f| f["type"] == "ping", Duration::from_secs(2))
        .await;
    shutdown.drain.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), daemon).await;
    for f in &hub.frames()[shown..] {
        print_frame(f.inbound, &f.frame);
    }
    print_report(&complete);
    let violations = hub.violations();
    say!(
        "\nschema violations recorded by the mock hub: {}",
        violations.len()
    );
    if args.keep {
        let kept = dir.keep();
        say!("kept {}", kept.display());
    }
    let verified = complete["result"]["verification_status"] == "verified";
    Ok(if verified && violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn write_executable(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn short(s: &str, n: usize) -> String {
    let one_line = s.replace('\n', " ⏎ ");
    let cut = crate::util::truncate_chars(&one_line, n);
    if cut.len() < one_line.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

/// One line per frame: `→` sidecar to hub, `←` hub to sidecar.
fn print_frame(from_sidecar: bool, f: &Value) {
    let arrow = if from_sidecar { "→" } else { "←" };
    let ty = f["type"].as_str().unwrap_or("?");
    let detail = match ty {
        "identify" => format!("agent {}", f["agent_id"].as_str().unwrap_or("")),
        "task_assign" => format!(
            "{}: {}",
            f["task_id"].as_str().unwrap_or(""),
            short(f["description"].as_str().unwrap_or(""), 60)
        ),
        "task_progress" => {
            let e = &f["execution_event"];
            if let Some(merged) = e["merged_events"].as_array() {
                // One frame carried several events (coalesced under the hub's budget).
                say!("  {arrow} {ty:<16} {} events in one frame:", merged.len());
                for m in merged {
                    say!("  {:<18} {}", "", event_line(m));
                }
                return;
            }
            event_line(e)
        }
        "task_complete" => format!(
            "{} ({})",
            f["task_id"].as_str().unwrap_or(""),
            f["result"]["verification_status"].as_str().unwrap_or("")
        ),
        "task_failed" => format!(
            "{}: {}",
            f["task_id"].as_str().unwrap_or(""),
            short(f["reason"].as_str().unwrap_or(""), 80)
        ),
        "task_accepted" | "task_recovering" => f["task_id"].as_str().unwrap_or("").to_string(),
        "task_ack" => format!(
            "{} {}",
            f["task_id"].as_str().unwrap_or(""),
            f["status"].as_str().unwrap_or("")
        ),
        "<close>" => {
            say!(
                "  {arrow} {:<16} {} {}",
                "close",
                f["code"],
                f["reason"].as_str().unwrap_or("")
            );
            return;
        }
        "ping" | "pong" | "identified" | "resource_report" => return,
        _ => short(&f.to_string(), 80),
    };
    say!("  {arrow} {ty:<16} {detail}");
}

/// One progress event: its type, the fields that matter for it, its text.
fn event_line(e: &Value) -> String {
    let kind = e["event_type"].as_str().unwrap_or("");
    let extra = match kind {
        "verification_check_result" => format!(
            " {} → {}",
            e["check_type"].as_str().unwrap_or(""),
            e["check_status"].as_str().unwrap_or("")
        ),
        // `attempt` is the retry's number (0: the first run), as the protocol has it; the
        // report's `run_number` is what the "Attempt N" lines below count.
        "verification_retry_start" => {
            format!(" retry {} (attempt {})", e["attempt"], e["run_number"])
        }
        "verification_retry_complete" => format!(
            " retry {} (attempt {}): {}",
            e["attempt"],
            e["run_number"],
            e["status"].as_str().unwrap_or("")
        ),
        "tool_call" => format!(" {}", e["tool_name"].as_str().unwrap_or("")),
        _ => String::new(),
    };
    format!(
        "[{kind}]{extra} {}",
        short(e["text"].as_str().unwrap_or(""), 70)
    )
}

/// The final report, readable.
fn print_report(done: &Value) {
    say!();
    if done["type"] == "task_failed" {
        say!(
            "Result: task_failed: {}",
            done["reason"].as_str().unwrap_or("")
        );
        return;
    }
    let r = &done["result"];
    say!("Result for {}", done["task_id"].as_str().unwrap_or(""));
    say!(
        "  verification_status  {}",
        r["verification_status"].as_str().unwrap_or("")
    );
    say!(
        "  termination_reason   {}",
        r["termination_reason"].as_str().unwrap_or("")
    );
    say!("  attempts             {}", r["verification_attempts"]);
    say!(
        "  containment          {}",
        r["containment"].as_str().unwrap_or("-")
    );
    say!(
        "  model                {}",
        r["model_used"].as_str().unwrap_or("-")
    );
    say!(
        "  tokens in/out        {} / {}",
        r["tokens_in"],
        r["tokens_out"]
    );
    say!(
        "  estimated cost       ${:.4}",
        r["estimated_cost_usd"].as_f64().unwrap_or(0.0)
    );
    say!("  execution            {} ms", r["execution_ms"]);
    for rep in done["verification_history"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let s = &rep["summary"];
        say!(
            "\n  Attempt {}: {}  ({} passed, {} failed, {} errors, {} timed out)",
            rep["run_number"],
            rep["status"].as_str().unwrap_or(""),
            s["passed"],
            s["failed"],
            s["errors"],
            s["timed_out"]
        );
        for c in rep["checks"].as_array().into_iter().flatten() {
            let mark = if c["status"] == "pass" { "✓" } else { "✗" };
            say!(
                "    {mark} {:<17} {:<40} {}",
                c["type"].as_str().unwrap_or(""),
                short(c["target"].as_str().unwrap_or(""), 40),
                c["status"].as_str().unwrap_or("")
            );
        }
        for o in rep["observations"].as_array().into_iter().flatten() {
            say!("    · {}", o.as_str().unwrap_or(""));
        }
    }
}
