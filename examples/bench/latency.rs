//! Figures about durable state: accept and round-trip latency with the state on disk and on
//! tmpfs (3, with the `fdatasync` floor beside it) and draining a large outbox backlog (9).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use hub_sidecar::mock_hub::{sample_shell_task, MockHub};
use serde_json::json;

use crate::harness::*;
use crate::Opts;

/// Figure 3: `task_assign` → `task_accepted` and → `task_complete` over `n` sequential
/// `true` tasks, plus the cost of one `state::write_atomic` on the same file system. `base`
/// is where the state dir goes: the disk (the real figure) or tmpfs (the daemon's own share,
/// with the fsyncs made free).
pub(crate) async fn latency(o: &Opts, n: usize, base: &Path, label: &str) -> Vec<Row> {
    flush_writeback().await;
    let hub = hub_unlimited().await;
    // The daemon's own turnaround lines (`hub_sidecar::turnaround`, row 3g).
    let log = [("RUST_LOG", "info,hub_sidecar::turnaround=debug")];
    let d = Daemon::start_in(o, &hub, UNTHROTTLED, &log, Some(base));
    identified(&hub).await;
    // Warm-up: the first task pays for lazily initialised pieces (first fork, regex, …).
    for i in 0..5 {
        hub.assign(sample_shell_task(&format!("warm-{i}"), "true"));
        hub.wait_for_nth("task_complete", i + 1, T)
            .await
            .expect("warm-up task_complete");
        settle().await;
    }
    for i in 0..n {
        hub.assign(sample_shell_task(&format!("lat-{i}"), "true"));
        hub.wait_for_nth("task_complete", i + 6, T)
            .await
            .expect("task_complete");
        settle().await;
    }
    let frames = hub.frames();
    let mut assign: HashMap<String, Instant> = HashMap::new();
    let mut accepted = Vec::new();
    let mut complete = Vec::new();
    for r in &frames {
        let id = r.frame["task_id"].as_str().unwrap_or("");
        if !id.starts_with("lat-") {
            continue;
        }
        match (r.inbound, type_of(&r.frame)) {
            (false, "task_assign") => {
                assign.insert(id.to_string(), r.at);
            }
            (true, "task_accepted") => accepted.push(ms(r.at - assign[id])),
            (true, "task_complete") => complete.push(ms(r.at - assign[id])),
            _ => {}
        }
    }
    let progress = frames
        .iter()
        .filter(|r| r.inbound && type_of(&r.frame) == "task_progress")
        .count();
    let log = std::fs::read_to_string(d.dir.path().join("daemon.log")).unwrap_or_default();
    let (own_accept, own_complete) = (
        turnaround(&log, "task_accepted"),
        turnaround(&log, "task_complete"),
    );
    let phases = phases(&log);
    d.stop().await;

    let (fsync, floor) = fsync_cost(200, base).await;
    let acc = Stats::new(accepted);
    let done = Stats::new(complete);
    vec![
        Row::new(
            &format!("3a. task_assign → task_accepted, p50 ({n} × `true`; {label})"),
            "≤ 0.3 ms (issue 15)",
            "2.9 ms",
            format!("{:.2} ms", acc.median()),
            Some(acc.median() <= 0.3),
        ),
        Row::new(
            &format!("3b. task_assign → task_accepted, p99 ({label})"),
            "≤ 4 ms",
            "—",
            format!("{:.2} ms (max {:.2})", acc.p(0.99), acc.max()),
            Some(acc.p(0.99) <= 4.0),
        ),
        Row::new(
            &format!("3c. task_assign → task_complete, p50 ({label})"),
            "≤ 4 ms",
            "8.4 ms",
            format!(
                "{:.2} ms (p99 {:.2}; {progress} progress frames)",
                done.median(),
                done.p(0.99)
            ),
            Some(done.median() <= 4.0),
        ),
        Row::new(
            &format!("3g. the daemon's own share: task_assign read → answer written, p50, in the daemon ({label})"),
            "—",
            "—",
            format!(
                "→ task_accepted {:.2} ms (p99 {:.2}), → task_complete {:.2} ms (p99 {:.2}); {} tasks; phases, p50 ms: {phases}",
                own_accept.median(),
                own_accept.p(0.99),
                own_complete.median(),
                own_complete.p(0.99),
                own_complete.len()
            ),
            None,
        ),
        Row::new(
            &format!("3d. one state change (journal append + fdatasync), 200 × ({label})"),
            "—",
            "— (no fsync)",
            format!("{:.2} ms p50, p99 {:.2} ms", fsync.median(), fsync.p(0.99)),
            None,
        ),
        Row::new(
            &format!("3e. floor: bare 1 KB append + fdatasync, 200 × ({label})"),
            "—",
            "—",
            format!("{:.2} ms p50, p99 {:.2} ms", floor.median(), floor.p(0.99)),
            None,
        ),
    ]
}

/// The daemon's own turnaround for `frame` (ms) of the measured tasks (`lat-…`), from its
/// `hub_sidecar::turnaround` debug lines: `… answered task_assign task_id=lat-7
/// frame="task_complete" micros=1234`.
fn turnaround(log: &str, frame: &str) -> Stats {
    let want = format!("frame=\"{frame}\"");
    Stats::new(
        log.lines()
            .filter(|l| l.contains("answered task_assign") && l.contains(&want))
            .filter(|l| l.contains("task_id=lat-"))
            .filter_map(|l| {
                let v = l.split("micros=").nth(1)?;
                v.split_whitespace().next()?.parse::<f64>().ok()
            })
            .map(|us| us / 1000.0)
            .collect(),
    )
}

/// Where the daemon's time between reading a task's assignment and answering it goes: the
/// median gap between consecutive lines the daemon logs for each task (the
/// `hub_sidecar::turnaround` phases, see `hub_sidecar::hub::link::TURNAROUND`), in ms.
fn phases(log: &str) -> String {
    const MARKS: [(&str, &str); 6] = [
        ("task assigned", "assigned"),
        ("phase=\"prepared\"", "prepared"),
        ("phase=\"executed\"", "executed"),
        ("phase=\"verified\"", "verified"),
        ("phase=\"stored\"", "stored"),
        ("frame=\"task_complete\"", "written"),
    ];
    // Seconds since midnight from the line's RFC 3339 timestamp (`…T02:50:36.299935Z`).
    let secs = |l: &str| -> Option<f64> {
        let t = l
            .split_whitespace()
            .next()?
            .split('T')
            .nth(1)?
            .trim_end_matches('Z');
        let mut f = t.split(':');
        let (h, m, s) = (f.next()?, f.next()?, f.next()?);
        Some(
            h.parse::<f64>().ok()? * 3600.0
                + m.parse::<f64>().ok()? * 60.0
                + s.parse::<f64>().ok()?,
        )
    };
    let mut at: HashMap<(String, usize), f64> = HashMap::new();
    for l in log.lines() {
        let Some(id) = l
            .split("task_id=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
        else {
            continue;
        };
        if !id.starts_with("lat-") {
            continue;
        }
        if let (Some(i), Some(t)) = (MARKS.iter().position(|(m, _)| l.contains(m)), secs(l)) {
            at.insert((id.to_string(), i), t);
        }
    }
    let ids: std::collections::HashSet<&String> = at.keys().map(|(id, _)| id).collect();
    (1..MARKS.len())
        .map(|i| {
            let gaps = ids
                .iter()
                .filter_map(|id| {
                    let a = at.get(&((*id).clone(), i - 1))?;
                    let b = at.get(&((*id).clone(), i))?;
                    Some((b - a) * 1000.0)
                })
                .collect();
            format!("→ {} {:.2}", MARKS[i].1, Stats::new(gaps).median())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One durable state change as the daemon makes it (`StateStore::set_active` of an active
/// task: a journal append + `fdatasync`), `n` times, in a temp dir under `base`; and the
/// physical floor beside it: a bare 1 KB append + `fdatasync` on the same file system.
pub(crate) async fn fsync_cost(n: usize, base: &Path) -> (Stats, Stats) {
    use hub_sidecar::state::{ActiveTask, Phase, StateStore};
    let dir = tempfile::tempdir_in(base).expect("temp dir");
    let store = StateStore::new(dir.path().join("queue.json"));
    store.load().await.expect("load");
    let task =
        hub_sidecar::task::Task::from_value(sample_shell_task("fsync", "true")).expect("task");
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let active = (i % 2 == 0).then(|| ActiveTask {
            task: task.clone(),
            phase: Phase::Running,
            accepted_at: 0,
            trace: None,
            dirs: None,
        });
        // From idle, as an accept's write is (see `ws_floor`).
        settle().await;
        let t = Instant::now();
        store.set_active(active).await.expect("journal append");
        v.push(ms(t.elapsed()));
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.path().join("floor"))
        .expect("floor file");
    let line = [b'x'; 1024];
    let mut floor = Vec::with_capacity(n);
    for _ in 0..n {
        settle().await;
        let t = Instant::now();
        std::io::Write::write_all(&mut f, &line).expect("write");
        f.sync_data().expect("fdatasync");
        floor.push(ms(t.elapsed()));
    }
    (Stats::new(v), Stats::new(floor))
}

/// Figure 9: a backlog of `n` results of 64 KB each, left on disk by an earlier run (a long
/// hub outage), delivered to a hub with its rate limit off: the daemon's own cost. The hub
/// does not know these tasks and refuses each for good (`task_complete_failed`), which is one
/// answer per frame like an ack. Reported: spawn → identify with the backlog on disk, first
/// frame → last frame received, the state file's size before and after, and peak RSS.
pub(crate) async fn backlog(o: &Opts, n: usize) -> Vec<Row> {
    use hub_sidecar::hub::proto::Outbound;
    use hub_sidecar::state::{OutboxEntry, PersistedState, StateStore, STATE_VERSION};
    let hub = hub_unlimited().await;
    let base = std::env::temp_dir();
    let seed_dir = tempfile::tempdir_in(&base).expect("temp dir");
    let output = "x".repeat(64 * 1024);
    let outbox = (0..n)
        .map(|i| {
            let id = format!("backlog-{i}");
            OutboxEntry {
                frame: Outbound::TaskComplete {
                    task_id: id.clone(),
                    generation: 1,
                    result: json!({"output": output, "verification_status": "verified"}),
                    tokens_used: 0,
                    verification_report: None,
                    verification_history: Vec::new(),
                },
                task_id: id,
                created_at: epoch_ms_f64() as i64,
            }
        })
        .collect();
    let seeded = seed_dir.path().join("queue.json");
    let s0 = Instant::now();
    StateStore::new(&seeded)
        .save(&PersistedState {
            version: STATE_VERSION,
            active: None,
            outbox,
        })
        .await
        .expect("seed the backlog");
    let seed_ms = ms(s0.elapsed());
    let size_before = std::fs::metadata(&seeded).map(|m| m.len()).unwrap_or(0);
    let d = Daemon::start_with(o, &hub, UNTHROTTLED, &[], seed_dir);
    identified(&hub).await;
    let ticks0 = d.cpu_ticks();
    let deadline = Instant::now() + T * 4;
    let terminal = |hub: &MockHub| hub.received_of("task_complete").len();
    while terminal(&hub) < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let frames = hub.frames();
    let id_at = at_of(&frames, true, "identify", None).expect("identify");
    let sent: Vec<Instant> = frames
        .iter()
        .filter(|r| r.inbound && type_of(&r.frame) == "task_complete")
        .map(|r| r.at)
        .collect();
    let hwm = d.status_kb("VmHWM");
    let cpu_ms = (d.cpu_ticks() - ticks0) as f64 * 1000.0 / clk_tck();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let size_after = std::fs::metadata(d.dir.path().join("queue.json"))
        .map(|m| m.len())
        .unwrap_or(0);
    let startup = ms(id_at.saturating_duration_since(d.spawned));
    d.stop().await;
    let drain = match (sent.first(), sent.last()) {
        (Some(a), Some(b)) => ms(*b - *a),
        _ => f64::NAN,
    };
    let mb = |b: u64| b as f64 / 1_048_576.0;
    vec![Row::new(
        &format!("9. backlog of {n} × 64 KB results drained (hub limiter off)"),
        "≤ 2 s, ≤ 20 MB",
        "—",
        format!(
            "{1:.0} ms for {0} of {n} (daemon CPU {2:.0} ms); peak RSS {3:.1} MB; spawn → identify {4:.1} ms with the backlog on disk; state file {5:.1} MB → {6:.2} MB (seeding it: {7:.0} ms)",
            sent.len(),
            drain,
            cpu_ms,
            hwm as f64 / 1024.0,
            startup,
            mb(size_before),
            mb(size_after),
            seed_ms
        ),
        Some(sent.len() == n && drain <= 2000.0 && hwm <= 20 * 1024),
    )]
}

/// Row 3f, the physical floor of 3a: a loopback WebSocket round trip through the same mock
/// hub (a bare client's `ping` → the mock's `pong`, `n` times after identify), timed by the
/// client, each after the same 10 ms pause 3a leaves between tasks. 3a minus this (and minus
/// 3e on disk) is what the daemon itself adds to an accept.
pub(crate) async fn ws_floor(n: usize) -> Vec<Row> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let hub = hub_unlimited().await;
    // `TCP_NODELAY` on, as the daemon's socket has it.
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(hub.url(), None, true)
        .await
        .expect("connect to the mock hub");
    let identify = json!({"type": "identify", "agent_id": "sidecar-test", "token": "test-token"});
    ws.send(Message::text(identify.to_string()))
        .await
        .expect("identify");
    let mut rtt = Vec::with_capacity(n);
    for i in 0..n + 5 {
        // The same pause as between 3a's tasks: a round trip that starts from idle (cold
        // CPU, sleeping threads on both ends) costs ~2× one in a tight loop on this VM.
        settle().await;
        let t = Instant::now();
        ws.send(Message::text(r#"{"type":"ping"}"#))
            .await
            .expect("ping");
        loop {
            let m = ws.next().await.expect("socket open").expect("frame");
            if m.to_text().is_ok_and(|t| t.contains("\"pong\"")) {
                break;
            }
        }
        // The first five warm up (allocations, the identify's answer).
        if i >= 5 {
            rtt.push(ms(t.elapsed()));
        }
    }
    let s = Stats::new(rtt);
    vec![Row::new(
        &format!(
            "3f. floor: loopback WebSocket round trip through the mock hub (ping → pong), {n} ×"
        ),
        "—",
        "—",
        format!("{:.2} ms p50, p99 {:.2} ms", s.median(), s.p(0.99)),
        None,
    )]
}

/// Row 3h: the floor under 3g's `executed` phase, outside the daemon. `sh -c true` spawned
/// and reaped `n` times by `unshare` with no namespace (the same extra exec), and again in
/// new user, PID and network namespaces (`unshare -Unp --fork`, as a confined task gets
/// them). The difference is what the kernel charges for the namespaces alone; the first
/// figure what a process that execs `sh` costs on this machine. `None` where `unshare`
/// cannot make the namespaces (not installed, or user namespaces off).
pub(crate) async fn spawn_floor(n: usize) -> Option<Row> {
    let time = |args: &'static [&'static str]| async move {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n + 5 {
            settle().await;
            let t = Instant::now();
            let ok = tokio::process::Command::new("unshare")
                .args(args)
                .args(["sh", "-c", "true"])
                .status()
                .await
                .is_ok_and(|s| s.success());
            if !ok {
                return None;
            }
            v.push(ms(t.elapsed()));
        }
        // The first five warm up (the page cache, the dynamic loader's files).
        Some(Stats::new(v.split_off(5)))
    };
    let bare = time(&[]).await?;
    let ns = time(&["-U", "-n", "-p", "--fork"]).await?;
    Some(Row::new(
        &format!("3h. floor: `sh -c true` spawned and reaped, {n} × (by `unshare`, without and with new user + PID + network namespaces)"),
        "—",
        "—",
        format!(
            "{:.2} ms p50 without, {:.2} ms with (namespaces +{:.2} ms)",
            bare.median(),
            ns.median(),
            ns.median() - bare.median()
        ),
        None,
    ))
}
