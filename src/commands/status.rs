//! `hub-sidecar status`: ask the running daemon for the link state, the current task and
//! attempt with their elapsed time, and today's spend against the daily budget; then list the
//! dependency caches in its state directory.
//!
//! It asks `GET /status` on the daemon's unix socket `state_dir/status.sock` (mode 0600:
//! run it as the service user), else on its loopback HTTP endpoint (`metrics_addr`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::cli::{ConfigArgs, StatusArgs};
use crate::ops::StatusSnapshot;

/// How long the daemon may take to answer.
const ANSWER: Duration = Duration::from_secs(5);

/// Where the daemon answers.
#[derive(Debug, Clone)]
pub enum Target {
    /// The daemon's unix socket in the state directory.
    Socket(PathBuf),
    /// The daemon's operations HTTP listener.
    Http(SocketAddr),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Socket(p) => write!(f, "{}", p.display()),
            Target::Http(a) => write!(f, "http://{a}"),
        }
    }
}

/// `--metrics-addr` when given; else the state directory's socket when it exists; else the
/// configured `metrics_addr`.
fn target(args: &ConfigArgs) -> anyhow::Result<Target> {
    if let Some(a) = args.metrics_addr.as_deref() {
        let addr = a
            .parse::<SocketAddr>()
            .with_context(|| format!("--metrics-addr {a} is not an address like 127.0.0.1:9464"))?;
        return Ok(Target::Http(addr));
    }
    let (state_dir, metrics_addr) = match &args.state_dir {
        Some(d) => (d.clone(), None),
        None => {
            let cfg = args.load().context(
                "reading the configuration to find the daemon; or pass --state-dir DIR or \
                 --metrics-addr ADDR",
            )?;
            (cfg.state_dir, cfg.metrics_addr)
        }
    };
    let sock = crate::ops::socket::path(&state_dir);
    match (sock.exists(), metrics_addr) {
        (true, _) | (false, None) => Ok(Target::Socket(sock)),
        (false, Some(addr)) => Ok(Target::Http(addr)),
    }
}

/// `hub-sidecar status`: ask the running daemon for its link, task, attempt and spend.
pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let snap = fetch(&target(&args.config)?).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&snap)?);
    } else {
        print!("{}", render(&snap));
        print!("{}", caches(&args.config).await);
    }
    Ok(ExitCode::SUCCESS)
}

/// The per-repository dependency caches: read from the state directory, not asked of the
/// daemon (walking them is not the daemon's work).
async fn caches(args: &ConfigArgs) -> String {
    let mut cfg = args.load().unwrap_or_default();
    if let Some(d) = &args.state_dir {
        cfg.state_dir = d.clone();
    }
    tokio::task::spawn_blocking(move || crate::sandbox::caches::describe(&cfg))
        .await
        .unwrap_or_default()
}

/// `GET /status` from the daemon at `target`.
pub async fn fetch(target: &Target) -> anyhow::Result<StatusSnapshot> {
    let body = tokio::time::timeout(ANSWER, async {
        match target {
            Target::Socket(p) => exchange(tokio::net::UnixStream::connect(p).await?).await,
            Target::Http(a) => exchange(tokio::net::TcpStream::connect(a).await?).await,
        }
    })
    .await
    .with_context(|| format!("the daemon at {target} did not answer within {ANSWER:?}"))?
    .with_context(|| {
        format!(
            "cannot reach the daemon at {target}: is it running (with this state directory or \
             metrics_addr)? The socket is only open to the service user: try sudo -u hub-sidecar"
        )
    })?;
    let text = String::from_utf8_lossy(&body);
    let (head, json) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("the answer from {target} is not HTTP"))?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200"),
        "the daemon at {target} answered {}: an older hub-sidecar without /status?",
        head.lines().next().unwrap_or("")
    );
    serde_json::from_str(json)
        .with_context(|| format!("the status from {target} is not valid JSON"))
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> std::io::Result<Vec<u8>> {
    s.write_all(b"GET /status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    Ok(out)
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
    if let Some(why) = &s.not_accepting {
        o.push_str(&format!("tasks:  NOT accepting: {why}\n"));
    }
    if let Some(level) = &s.containment {
        o.push_str(&format!("containment: {level}\n"));
    }
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
