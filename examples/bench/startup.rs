//! Figures about the daemon at rest: spawn → identify (1), idle memory and CPU (2, 8), and
//! many daemons side by side on one host (11).

use std::time::{Duration, Instant};

use crate::harness::*;
use crate::Opts;

/// Figure 1: spawn → `identify` received, median of 10 cold-ish starts (each its own hub and
/// state dir; the binary's pages are in the page cache after the first).
pub(crate) async fn spawn_to_identify(o: &Opts) -> Vec<Row> {
    let mut samples = Vec::new();
    let mut answered = Vec::new();
    for _ in 0..10 {
        let hub = hub_default().await;
        let d = Daemon::start(o, &hub, "", &[]);
        identified(&hub).await;
        let frames = hub.frames();
        let id_at = at_of(&frames, true, "identify", None).expect("identify recorded");
        samples.push(ms(id_at.saturating_duration_since(d.spawned)));
        if let Some(ok) = at_of(&frames, false, "identified", None) {
            answered.push(ms(ok.saturating_duration_since(d.spawned)));
        }
        d.stop().await;
    }
    let s = Stats::new(samples);
    let i = Stats::new(answered);
    vec![Row::new(
        "1. spawn → identify received (median of 10)",
        "≤ 20 ms",
        "~200 ms",
        format!(
            "{:.1} ms (min {:.1}, max {:.1}; → identified {:.1} ms)",
            s.median(),
            s.p(0.0),
            s.max(),
            i.median()
        ),
        Some(s.median() <= 20.0),
    )]
}

/// Figures 2 and 8: idle RSS 5 s after `identified`, then CPU over `idle_secs` while idle and
/// connected (default config: 30 s pings and resource reports are part of being idle).
pub(crate) async fn idle(o: &Opts, envs: &[(&str, &str)], label: &str, idle_secs: u64) -> Vec<Row> {
    let hub = hub_default().await;
    let d = Daemon::start(o, &hub, "", envs);
    identified(&hub).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss = d.status_kb("VmRSS");
    let anon = d.status_kb("RssAnon");
    let file = d.status_kb("RssFile");
    let threads = d.status_kb("Threads");
    let (exe, libs, _) = d.rss_split();
    let mb = |kb: u64| kb as f64 / 1024.0;
    let mut rows = vec![Row::new(
        &format!("2. idle RSS 5 s after identified{label}"),
        "≤ 5 MB (goal 4)",
        "53 MB",
        format!(
            "{:.1} MB: anon {:.1} + file {:.1} (executable {:.1}, libs {:.1}); {threads} threads",
            mb(rss),
            mb(anon),
            mb(file),
            mb(exe),
            mb(libs)
        ),
        Some(rss <= 5 * 1024),
    )];
    if idle_secs > 0 {
        let t0 = d.cpu_ticks();
        let w0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let ticks = d.cpu_ticks() - t0;
        let wall = w0.elapsed().as_secs_f64();
        let cpu_s = ticks as f64 / clk_tck();
        let pct = 100.0 * cpu_s / wall;
        rows.push(Row::new(
            &format!("8. CPU idle and connected over {idle_secs} s"),
            "rounds to 0 %",
            "—",
            format!("{pct:.3} % ({ticks} ticks = {:.0} ms CPU)", cpu_s * 1000.0),
            Some(pct < 0.5),
        ));
    }
    d.stop().await;
    rows
}

/// Figure 11: 10 idle daemons side by side (one hub each), 5 s after all identified: the
/// sum of their PSS (`/proc/<pid>/smaps_rollup`, shared pages split between sharers) over 10
/// is what one more agent costs the host; private memory is what only that agent holds. The
/// daemon's children (the holders of the views made ahead) are counted with it.
pub(crate) async fn side_by_side(o: &Opts, n: usize) -> Vec<Row> {
    let mut hubs = Vec::new();
    let mut daemons = Vec::new();
    for _ in 0..n {
        let hub = hub_default().await;
        daemons.push(Daemon::start(o, &hub, "", &[]));
        hubs.push(hub);
    }
    for hub in &hubs {
        identified(hub).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let field = |pid: u32, name: &str| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let (mut pss, mut private, mut rss) = (0u64, 0u64, 0u64);
    let (mut holders, mut holders_pss) = (0usize, 0u64);
    for d in &daemons {
        pss += field(d.pid(), "Pss");
        private += field(d.pid(), "Private_Clean") + field(d.pid(), "Private_Dirty");
        rss += field(d.pid(), "Rss");
        // The views made ahead for the next task (issue 45) wait in processes of their own,
        // forked from the daemon: pages they share with it are split with them, so their
        // PSS belongs to the agent's cost too.
        for h in children_of(d.pid()) {
            holders += 1;
            holders_pss += field(h, "Pss");
            private += field(h, "Private_Clean") + field(h, "Private_Dirty");
        }
    }
    pss += holders_pss;
    for d in daemons {
        d.stop().await;
    }
    let per = |kb: u64| kb as f64 / 1024.0 / n as f64;
    vec![Row::new(
        &format!("11. {n} idle daemons side by side: memory per agent"),
        "—",
        "—",
        format!(
            "PSS {:.2} MB each (private {:.2} MB; RSS {:.1} MB each, mostly shared code; with {:.1} waiting view holders each, PSS {:.2} MB of it)",
            per(pss),
            per(private),
            per(rss),
            holders as f64 / n as f64,
            per(holders_pss)
        ),
        None,
    )]
}

/// The processes whose parent is `pid` (every thread's children).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}
