//! `hub-sidecar status`: ask the running daemon, over its loopback HTTP endpoint
//! (`metrics_addr`, route `/status`), for the link state, the current task and attempt with
//! their elapsed time, and today's spend against the daily budget.
//!
//! Read-only and unauthenticated like `/healthz`: the endpoint should stay on loopback.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cli::ConfigArgs;
use crate::ops::StatusSnapshot;

/// `status` flags.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Print the daemon's JSON answer as is.
    #[arg(long)]
    pub json: bool,
}

/// How long the daemon may take to answer.
const ANSWER: Duration = Duration::from_secs(5);

pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let addr = match args.config.metrics_addr.as_deref() {
        Some(a) => a
            .parse::<SocketAddr>()
            .with_context(|| format!("--metrics-addr {a} is not an address like 127.0.0.1:9464"))?,
        None => args
            .config
            .load()
            .context("reading the configuration to find metrics_addr; or pass --metrics-addr")?
            .metrics_addr
            .context(
                "the daemon serves its status on metrics_addr, which is not set in the \
                 configuration; set metrics_addr = \"127.0.0.1:9464\" and restart it",
            )?,
    };
    let snap = fetch(addr).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&snap)?);
    } else {
        print!("{}", render(&snap));
    }
    Ok(ExitCode::SUCCESS)
}

/// `GET /status` from the daemon at `addr`.
pub async fn fetch(addr: SocketAddr) -> anyhow::Result<StatusSnapshot> {
    let body = tokio::time::timeout(ANSWER, async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"GET /status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    })
    .await
    .with_context(|| format!("the daemon at {addr} did not answer within {ANSWER:?}"))?
    .with_context(|| {
        format!("cannot reach the daemon at {addr}: is it running with this metrics_addr?")
    })?;
    let text = String::from_utf8_lossy(&body);
    let (head, json) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("the answer from {addr} is not HTTP"))?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200"),
        "the daemon at {addr} answered {}: an older hub-sidecar without /status?",
        head.lines().next().unwrap_or("")
    );
    serde_json::from_str(json).with_context(|| format!("the status from {addr} is not valid JSON"))
}

fn secs(ms: Option<u64>) -> String {
    match ms {
        Some(ms) if ms >= 60_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        Some(ms) => format!("{:.1} s", ms as f64 / 1000.0),
        None => "-".into(),
    }
}

/// The readable status.
pub fn render(s: &StatusSnapshot) -> String {
    let mut o = String::new();
    o.push_str(&if s.identified {
        format!(
            "hub:    connected (last pong {} ago)\n",
            secs(s.last_pong_age_ms)
        )
    } else {
        "hub:    not connected (reconnecting)\n".to_string()
    });
    o.push_str(&match &s.active_task {
        Some(t) => format!(
            "task:   {t}, running for {}{}\n",
            secs(s.task_elapsed_ms),
            match s.attempt {
                Some(a) => format!(", attempt {a} for {}", secs(s.attempt_elapsed_ms)),
                None => String::new(),
            }
        ),
        None => "task:   idle\n".to_string(),
    });
    o.push_str(&match s.daily_budget_usd {
        Some(b) => format!(
            "spend:  ${:.4} today of ${b:.2} daily budget ({:.0}%)\n",
            s.spent_today_usd,
            if b > 0.0 {
                100.0 * s.spent_today_usd / b
            } else {
                100.0
            }
        ),
        None => format!(
            "spend:  ${:.4} today (no daily budget set)\n",
            s.spent_today_usd
        ),
    });
    o
}
