//! What containment costs per child: `true` spawned through the daemon's one spawn path
//! (`process::run`), unconfined and inside a task sandbox (Landlock ruleset, user + PID
//! namespace with its supervisor, rlimits), and with `[network] mode = "none"` and
//! `"allowlist"` (the task's network namespace, made with its view, joined; with the
//! proxy's listener in it), plus the one-off cost of building a task's sandbox
//! (with the per-repository dependency caches for a task's own children; with the view
//! made on the spot and made ahead, as the daemon does while idle). Prints min /
//! median / p99 / max in microseconds.
//!
//! `cargo run --release --example bench_spawn -- [--runs N]` (or `bash scripts/bench-containment.sh`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hub_sidecar::config::Config;
use hub_sidecar::process::{self, ChildEnv, CommandSpec, Limits};
use hub_sidecar::sandbox::{Grants, Policy, Support};
use tokio_util::sync::CancellationToken;

fn stats(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let pick = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    println!(
        "| {name} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
        v.len(),
        us(v[0]),
        us(pick(0.5)),
        us(pick(0.99)),
        us(v[v.len() - 1])
    );
}

/// `runs` spawns in each of `envs`, interleaved (one in each, then again), so that a busy
/// moment of a shared machine weighs on every row alike.
async fn spawn_times(envs: &[&ChildEnv], ws: &PathBuf, runs: usize) -> Vec<Vec<Duration>> {
    let limits = Limits::default();
    let cancel = CancellationToken::new();
    let mut times = vec![Vec::with_capacity(runs); envs.len()];
    for _ in 0..runs {
        for (env, times) in envs.iter().zip(times.iter_mut()) {
            let spec = CommandSpec::new("/bin/true", ws, (*env).clone());
            let t = Instant::now();
            let out = process::run(&spec, &limits, &cancel, None)
                .await
                .expect("spawn /bin/true");
            times.push(t.elapsed());
            assert!(out.exit.success(), "{:?}", out.exit);
        }
    }
    times
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let runs: usize = std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().expect("temp dir");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("workspace");
    let cfg = Config::for_hub("ws://127.0.0.1:9/ws", &dir.path().join("state"));
    let support = Support::probe();
    let missing = support.missing();
    if !missing.is_empty() {
        eprintln!(
            "bench_spawn: this machine cannot confine: {}",
            missing.join("; ")
        );
        std::process::exit(2);
    }
    let policy = Policy::decide(None, support);
    let base = ChildEnv::from_config(&cfg);
    let grants = Grants {
        write: vec![ws.clone()],
        ..Grants::default()
    };
    let tmp = dir.path().join("state/tmp/t");

    // Warm the page cache and the binary.
    let _ = spawn_times(&[&base], &ws, 20).await;
    let mut builds = Vec::new();
    let mut ahead_builds = Vec::new();
    // The same policy with views made ahead (what the daemon does while idle, issue 45),
    // alternating with the view made on the spot so a busy moment weighs on both.
    let ahead = Policy::decide(None, Support::probe());
    let mut confined = None;
    for _ in 0..50 {
        let t = Instant::now();
        let env = process::confine(&cfg, &policy, &base, &tmp, &grants).expect("confine");
        builds.push(t.elapsed());
        confined = Some(env);
        ahead.prepare_views(&cfg, base.vars());
        assert!(ahead.views_ready() > 0, "no view made ahead");
        let t = Instant::now();
        let env = process::confine(&cfg, &ahead, &base, &tmp, &grants).expect("confine");
        ahead_builds.push(t.elapsed());
        drop(env);
    }
    let confined = confined.expect("built");
    // A task's own children: its repository's caches and, here, no network.
    let mut cfg_net = cfg.clone();
    cfg_net.network.mode = hub_sidecar::config::NetworkMode::None;
    let task_grants = Grants {
        task: true,
        ..grants.clone()
    };
    let mut task_builds = Vec::new();
    let mut no_net = None;
    for _ in 0..50 {
        let t = Instant::now();
        let env = process::confine(&cfg_net, &policy, &base, &tmp, &task_grants).expect("confine");
        task_builds.push(t.elapsed());
        no_net = Some(env);
    }
    let no_net = no_net.expect("built");
    // The default: `[network] mode = "allowlist"`, the proxy's listener in the namespace.
    let mut cfg_proxy = cfg.clone();
    cfg_proxy.network.mode = hub_sidecar::config::NetworkMode::Allowlist;
    let proxied =
        process::confine(&cfg_proxy, &policy, &base, &tmp, &task_grants).expect("confine");
    let mut times = spawn_times(&[&base, &confined, &no_net, &proxied], &ws, runs).await;
    let (allowlist, netns, boxed, plain) = (
        times.pop().expect("four rows"),
        times.pop().expect("four rows"),
        times.pop().expect("four rows"),
        times.pop().expect("four rows"),
    );
    let med = |v: &[Duration]| {
        let mut s = v.to_vec();
        s.sort();
        s[s.len() / 2]
    };
    println!("| what | runs | min µs | median µs | p99 µs | max µs |");
    println!("|---|---|---|---|---|---|");
    stats("spawn + wait `/bin/true`, unconfined", plain.clone());
    stats(
        "spawn + wait `/bin/true`, in the task sandbox",
        boxed.clone(),
    );
    stats(
        "spawn + wait `/bin/true`, in the task sandbox, `[network] mode = \"none\"`",
        netns.clone(),
    );
    stats(
        "spawn + wait `/bin/true`, in the task sandbox, `[network] mode = \"allowlist\"`",
        allowlist.clone(),
    );
    stats("build a task's sandbox (once per task)", builds);
    stats(
        "build a task's sandbox with its view made ahead (once per task)",
        ahead_builds,
    );
    stats(
        "build a task's sandbox with its repository's caches (once per task)",
        task_builds,
    );
    let overhead = med(&boxed).saturating_sub(med(&plain));
    println!(
        "\noverhead per child (median difference): {:.0} µs",
        overhead.as_secs_f64() * 1e6
    );
    let net = med(&netns).saturating_sub(med(&boxed));
    println!(
        "network namespace per child (median difference): {:.0} µs",
        net.as_secs_f64() * 1e6
    );
}
