//! What `[network] mode = "allowlist"` costs: building a task's sandbox with its proxy, a
//! confined child's spawn joining the task's network namespace, whose one proxy listener the
//! daemon serves (against `open` and `none`, interleaved), and the throughput of a 100 MB download by
//! `curl` inside the task sandbox, straight (`mode = "open"`) and through the daemon's proxy
//! (`mode = "allowlist"`), from a loopback server.
//!
//! `cargo run --release --example bench_net -- [--runs N] [--no-spawn]` (or `bash scripts/bench-net.sh`).

use std::path::Path;
use std::time::{Duration, Instant};

use hub_sidecar::config::{Config, NetworkMode};
use hub_sidecar::process::{self, ChildEnv, CommandSpec, Limits};
use hub_sidecar::sandbox::{Grants, Policy, Support};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const SIZE: usize = 100 * 1024 * 1024;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A loopback server answering every request with `SIZE` bytes.
async fn serve() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let body = vec![b'x'; 1024 * 1024];
        while let Ok((mut s, _)) = l.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let h = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\nConnection: close\r\n\r\n"
                );
                if s.write_all(h.as_bytes()).await.is_err() {
                    return;
                }
                for _ in 0..SIZE / body.len() {
                    if s.write_all(&body).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Wall time of the child (spawn to reaping) and its stdout.
async fn run_out(env: &ChildEnv, ws: &Path, program: &str, args: &[&str]) -> (Duration, String) {
    let spec = CommandSpec::new(program, ws, env.clone()).args(args.iter().copied());
    let limits = Limits {
        timeout: Some(Duration::from_secs(120)),
        ..Limits::default()
    };
    let t = Instant::now();
    let out = process::run(&spec, &limits, &CancellationToken::new(), None)
        .await
        .expect("spawn");
    let took = t.elapsed();
    assert!(out.exit.success(), "{:?}: {}", out.exit, out.combined());
    (took, out.stdout)
}

async fn run(env: &ChildEnv, ws: &Path, program: &str, args: &[&str]) -> Duration {
    run_out(env, ws, program, args).await.0
}

/// CPU time (user + system) so far of this process (`RUSAGE_SELF`: the server's and the
/// proxy's) or of its reaped children (`RUSAGE_CHILDREN`: curl, reaped by its supervisor).
#[allow(unsafe_code)]
fn cpu(who: libc::c_int) -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// One download's figures.
struct Download {
    /// The child's wall time, spawn to reaping.
    wall: Duration,
    /// curl's own `time_total`: connect (through the proxy when there is one) to the last byte.
    own: Duration,
    /// This process's CPU time over it: the server's, and the proxy's when there is one.
    cpu: Duration,
    /// curl's CPU time.
    curl_cpu: Duration,
}

async fn download(env: &ChildEnv, ws: &Path, args: &[&str]) -> Download {
    let args: Vec<&str> = ["-w", "%{time_total}"]
        .iter()
        .chain(args)
        .copied()
        .collect();
    let (ours, theirs) = (cpu(libc::RUSAGE_SELF), cpu(libc::RUSAGE_CHILDREN));
    let (wall, out) = run_out(env, ws, "curl", &args).await;
    let (ours, theirs) = (
        cpu(libc::RUSAGE_SELF) - ours,
        cpu(libc::RUSAGE_CHILDREN) - theirs,
    );
    let own: f64 = out.trim().parse().expect("curl's time_total");
    Download {
        wall,
        own: Duration::from_secs_f64(own),
        cpu: ours,
        curl_cpu: theirs,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let support = Support::probe();
    if !support.missing().is_empty() {
        eprintln!(
            "bench_net: this machine cannot confine: {:?}",
            support.missing()
        );
        std::process::exit(2);
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("workspace");
    let policy = Policy::decide(None, support);
    let grants = Grants {
        write: vec![ws.clone()],
        task: true,
        ..Grants::default()
    };
    let tmp = dir.path().join("state/tmp/t");
    let mut open_cfg = Config::for_hub("ws://127.0.0.1:9/ws", &dir.path().join("state"));
    open_cfg.network.mode = NetworkMode::Open;
    let mut none_cfg = open_cfg.clone();
    none_cfg.network.mode = NetworkMode::None;
    let mut allow_cfg = open_cfg.clone();
    allow_cfg.network.mode = NetworkMode::Allowlist;
    allow_cfg.network.allow = vec!["127.0.0.1".into()];
    let mut base = ChildEnv::from_config(&open_cfg);
    // The server is on loopback, which NO_PROXY would otherwise send around the proxy.
    base.set("NO_PROXY", "");

    let build = |cfg: &Config| {
        let mut times = Vec::new();
        let mut env = None;
        for _ in 0..30 {
            let t = Instant::now();
            let e = process::confine(cfg, &policy, &base, &tmp, &grants).expect("confine");
            times.push(t.elapsed());
            env = Some(e);
        }
        (median(times), env.expect("built"))
    };
    let (open_build, open_env) = build(&open_cfg);
    let (_, none_env) = build(&none_cfg);
    let (allow_build, mut allow_env) = build(&allow_cfg);
    allow_env.set("NO_PROXY", "");
    allow_env.set("no_proxy", "");

    let mut spawn_open = Vec::new();
    let mut spawn_none = Vec::new();
    let mut spawn_allow = Vec::new();
    let spawns = if std::env::args().any(|a| a == "--no-spawn") {
        1
    } else {
        200
    };
    for _ in 0..spawns {
        spawn_open.push(run(&open_env, &ws, "/bin/true", &[]).await);
        spawn_none.push(run(&none_env, &ws, "/bin/true", &[]).await);
        spawn_allow.push(run(&allow_env, &ws, "/bin/true", &[]).await);
    }

    let port = serve().await;
    let url = format!("http://127.0.0.1:{port}/big");
    let curl = ["-sS", "-o", "/dev/null", url.as_str()];
    let direct_url = url.clone();
    let direct = [
        "-sS",
        "--noproxy",
        "*",
        "-o",
        "/dev/null",
        direct_url.as_str(),
    ];
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        d.push(download(&open_env, &ws, &direct).await);
        p.push(download(&allow_env, &ws, &curl).await);
    }
    // The same at a link speed a registry download sees (curl's own rate limit, 50 MB/s).
    let limited = ["--limit-rate", "50M"];
    let (mut dl, mut pl) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let a: Vec<&str> = direct.iter().chain(&limited).copied().collect();
        dl.push(download(&open_env, &ws, &a).await.own);
        let b: Vec<&str> = curl.iter().chain(&limited).copied().collect();
        pl.push(download(&allow_env, &ws, &b).await.own);
    }
    let mbps = |t: Duration| SIZE as f64 / (1024.0 * 1024.0) / t.as_secs_f64();
    let pick = |v: &[Download], f: fn(&Download) -> Duration| median(v.iter().map(f).collect());
    let (dm, pm) = (pick(&d, |x| x.wall), pick(&p, |x| x.wall));
    let (dc, pc) = (pick(&d, |x| x.own), pick(&p, |x| x.own));
    let (dcpu, pcpu) = (pick(&d, |x| x.cpu), pick(&p, |x| x.cpu));
    let (dcurl, pcurl) = (pick(&d, |x| x.curl_cpu), pick(&p, |x| x.curl_cpu));
    // Each proxied run against the direct one just before it: the machine's load drifts
    // less within a pair than over the whole series.
    let mut pairs: Vec<f64> = d
        .iter()
        .zip(&p)
        .map(|(d, p)| d.wall.as_secs_f64() / p.wall.as_secs_f64())
        .collect();
    pairs.sort_by(f64::total_cmp);
    let paired = 100.0 * pairs[pairs.len() / 2];
    println!("| what | median |");
    println!("|---|---|");
    println!(
        "| build a task's sandbox, `open` | {:.0} µs |",
        open_build.as_secs_f64() * 1e6
    );
    println!(
        "| build a task's sandbox, `allowlist` (starts its proxy) | {:.0} µs |",
        allow_build.as_secs_f64() * 1e6
    );
    println!(
        "| spawn + wait `/bin/true`, `open` | {:.0} µs |",
        median(spawn_open).as_secs_f64() * 1e6
    );
    println!(
        "| spawn + wait `/bin/true`, `none` (own netns, `lo` up) | {:.0} µs |",
        median(spawn_none).as_secs_f64() * 1e6
    );
    println!(
        "| spawn + wait `/bin/true`, `allowlist` (own netns, `lo` up, listener handed to the proxy) | {:.0} µs |",
        median(spawn_allow).as_secs_f64() * 1e6
    );
    for (what, w, c) in [
        ("direct (`open`)", dm, dc),
        ("through the proxy (`allowlist`)", pm, pc),
    ] {
        println!(
            "| curl 100 MB, {what}, {runs} runs: child's wall time / curl's own | {:.0} ms, {:.0} MiB/s / {:.0} ms, {:.0} MiB/s |",
            w.as_secs_f64() * 1e3,
            mbps(w),
            c.as_secs_f64() * 1e3,
            mbps(c)
        );
    }
    println!(
        "| CPU of the server (direct) / the server and the proxy (`allowlist`) per download | {:.0} ms / {:.0} ms |",
        dcpu.as_secs_f64() * 1e3,
        pcpu.as_secs_f64() * 1e3
    );
    println!(
        "| CPU of curl per download, direct / through the proxy | {:.0} ms / {:.0} ms |",
        dcurl.as_secs_f64() * 1e3,
        pcurl.as_secs_f64() * 1e3
    );
    let (dlm, plm) = (median(dl), median(pl));
    println!(
        "| curl 100 MB at 50 MB/s, direct, 3 runs | {:.0} ms, {:.0} MiB/s |",
        dlm.as_secs_f64() * 1e3,
        mbps(dlm)
    );
    println!(
        "| curl 100 MB at 50 MB/s, through the proxy, 3 runs | {:.0} ms, {:.0} MiB/s |",
        plm.as_secs_f64() * 1e3,
        mbps(plm)
    );
    println!(
        "\nthroughput through the proxy: {:.0} % of direct at loopback speed (median of pairs {paired:.0} %, by curl's own time {:.0} %), {:.0} % at 50 MB/s",
        100.0 * mbps(pm) / mbps(dm),
        100.0 * mbps(pc) / mbps(dc),
        100.0 * mbps(plm) / mbps(dlm)
    );
}
