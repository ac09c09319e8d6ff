//! `cargo run --example mock_hub -- --task FILE [--port N] [--agent ID --token T]`
//!
//! Push one task to a sidecar by hand. Starts the **mock hub** (`hub_sidecar::mock_hub`, a
//! test double of the AgentCom hub that validates every frame) on 127.0.0.1, prints its
//! URL, waits for a sidecar to identify, assigns the task, prints every frame as it arrives
//! and then the result, and exits 0 iff the task was verified and no frame broke the hub's
//! schemas.
//!
//! Point a sidecar at it (same machine): `hub_url = "ws://127.0.0.1:PORT/ws"` with the
//! agent id and token given here (defaults `sidecar-test` / `test-token`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use hub_sidecar::mock_hub::{MockHub, MockHubOptions};
use serde_json::Value;

struct Args {
    task: PathBuf,
    port: u16,
    agent: String,
    token: String,
    wait_secs: u64,
}

const USAGE: &str = "usage: cargo run --example mock_hub -- --task FILE [--port N] [--agent ID] [--token T] [--wait-secs S]\n\
  Starts a mock AgentCom hub on 127.0.0.1:N (default: a free port), waits for a sidecar\n\
  to identify as ID with token T (default sidecar-test / test-token), assigns the task in\n\
  FILE and prints the conversation and the result. --wait-secs bounds the whole run (default 3600).";

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        task: PathBuf::new(),
        port: 0,
        agent: "sidecar-test".into(),
        token: "test-token".into(),
        wait_secs: 3600,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--task" => a.task = PathBuf::from(value()?),
            "--port" => a.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--agent" => a.agent = value()?,
            "--token" => a.token = value()?,
            "--wait-secs" => {
                a.wait_secs = value()?.parse().map_err(|e| format!("--wait-secs: {e}"))?
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.task.as_os_str().is_empty() {
        return Err("--task FILE is required".into());
    }
    Ok(a)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("mock_hub: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mock_hub: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, String> {
    let text = tokio::fs::read_to_string(&args.task)
        .await
        .map_err(|e| format!("reading {}: {e}", args.task.display()))?;
    let task: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not JSON: {e}", args.task.display()))?;
    let task_id = task["task_id"]
        .as_str()
        .ok_or(format!("{} has no string task_id", args.task.display()))?
        .to_string();
    let hub = MockHub::start(MockHubOptions {
        agents: vec![(args.agent.clone(), args.token.clone())],
        port: args.port,
        ..MockHubOptions::default()
    })
    .await
    .map_err(|e| format!("cannot listen on 127.0.0.1:{}: {e}", args.port))?;
    // The URL on stdout first, alone on its line, so scripts can read it.
    println!("{}", hub.url());
    eprintln!(
        "mock hub (a test double of the AgentCom hub) listening; waiting for agent {} to identify",
        args.agent
    );
    let total = Duration::from_secs(args.wait_secs);
    if hub.wait_for_type("identify", total).await.is_none() {
        return Err(format!("no sidecar identified within {total:?}"));
    }
    hub.assign(task);
    eprintln!("assigned {task_id}");
    let deadline = tokio::time::Instant::now() + total;
    let mut shown = 0;
    let result = loop {
        let frames = hub.frames();
        for f in &frames[shown..] {
            let arrow = if f.inbound { "→" } else { "←" };
            let ty = f.frame["type"].as_str().unwrap_or("?");
            if !matches!(ty, "ping" | "pong") {
                let mut frame = f.frame.clone();
                if frame.get("token").is_some() {
                    frame["token"] = Value::from("***");
                }
                println!("{arrow} {frame}");
            }
        }
        shown = frames.len();
        if let Some(done) = frames.iter().find(|f| {
            f.inbound
                && f.frame["task_id"] == task_id.as_str()
                && matches!(
                    f.frame["type"].as_str(),
                    Some("task_complete" | "task_failed")
                )
        }) {
            break done.frame.clone();
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{task_id} did not finish within {total:?}"));
        }
        hub.wait_inbound_after(hub.received().len(), Duration::from_secs(5))
            .await;
    };
    let verified =
        result["type"] == "task_complete" && result["result"]["verification_status"] == "verified";
    let violations = hub.violations();
    eprintln!(
        "\nresult: {} ({}), schema violations: {}",
        result["type"].as_str().unwrap_or("?"),
        result["result"]["verification_status"]
            .as_str()
            .or(result["reason"].as_str())
            .unwrap_or(""),
        violations.len()
    );
    for v in &violations {
        eprintln!("  violation: {:?}", v.errors);
    }
    Ok(if verified && violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
