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
    parse(&body, target)
}

/// The snapshot in an HTTP answer `body` from `target`.
fn parse(body: &[u8], target: &Target) -> anyhow::Result<StatusSnapshot> {
    let text = String::from_utf8_lossy(body);
    let (head, json) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("the answer from {target} is not HTTP (the daemon closed the connection unanswered: it refuses peers it cannot identify, see its log)"))?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200"),
        "the daemon at {target} answered {}: an older hub-sidecar without /status?",
        head.lines().next().unwrap_or("")
    );
    serde_json::from_str(json)
        .with_context(|| format!("the status from {target} is not valid JSON"))
}

/// What a daemon on a state directory's socket answered, for `check`, which must tell
/// "no daemon here" (probe the hub itself) from "a daemon that would not answer" (it must
/// not probe: identifying as the daemon's agent would take its connection over).
#[derive(Debug)]
pub enum Asked {
    /// No socket, or nothing listening on it (a stale file left by a crash).
    NoDaemon,
    /// The daemon's status.
    Answered(Box<StatusSnapshot>),
    /// Something listens but did not answer: why.
    NoAnswer(anyhow::Error),
}

/// Ask the daemon on the unix socket `path`, if one listens there.
pub async fn ask_socket(path: &std::path::Path) -> Asked {
    use std::io::ErrorKind;
    let target = Target::Socket(path.to_path_buf());
    let stream = match tokio::net::UnixStream::connect(path).await {
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {
            return Asked::NoDaemon
        }
        Err(e) => {
            return Asked::NoAnswer(anyhow::anyhow!("cannot connect to {target}: {e}"));
        }
        Ok(s) => s,
    };
    let answered = match tokio::time::timeout(ANSWER, exchange(stream)).await {
        Err(_) => Err(anyhow::anyhow!(
            "the daemon at {target} did not answer within {ANSWER:?}"
        )),
        Ok(Err(e)) => Err(anyhow::anyhow!("reading the answer from {target}: {e}")),
        Ok(Ok(body)) => parse(&body, &target),
    };
    match answered {
        Ok(snap) => Asked::Answered(Box::new(snap)),
        Err(e) => Asked::NoAnswer(e),
    }
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

/// The daemon's hub link in one line: connected since when (UTC) and for how long, the
/// last frame and pong; or not connected.
pub fn link(s: &StatusSnapshot) -> String {
    if !s.identified {
        return "not connected (reconnecting)".to_string();
    }
    let since = match (s.connected_since_ms, s.connected_for_ms) {
        (Some(at), Some(for_ms)) => format!(" since {} ({})", utc(at), secs(Some(for_ms))),
        _ => String::new(),
    };
    let frame = match s.last_frame_age_ms {
        Some(ms) => format!("last frame {} ago, ", secs(Some(ms))),
        None => String::new(),
    };
    format!(
        "connected{since}, {frame}last pong {} ago",
        secs(s.last_pong_age_ms)
    )
}

/// `ms` since the epoch as `YYYY-MM-DD HH:MM:SS UTC` (the civil-from-days algorithm of
/// H. Hinnant's date library; no time-zone database needed for UTC).
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

/// The readable status.
pub fn render(s: &StatusSnapshot) -> String {
    let mut o = String::new();
    o.push_str(&format!("hub:    {}\n", link(s)));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_renders_civil_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_852_212_345), "2026-11-28 07:50:12 UTC");
    }
}
