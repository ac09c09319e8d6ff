//! Benchmark driver: how light and fast the real `hub-sidecar` binary is.
//!
//! It builds nothing. It runs the **release binary** (`target/release/hub-sidecar`, or
//! `--bin PATH`) as a child process with a TOML config in a temp dir, against an in-process
//! [`MockHub`] on `127.0.0.1:0`, and measures the figures listed in `BENCHMARKS.md`. Every
//! time is taken from the mock's own [`Recorded::at`] stamps where the wire is involved (the
//! instant the hub sent `task_assign` and the instant it read the answer), so the driver's
//! scheduling does not leak into the numbers.
//!
//! ```sh
//! cargo build --release --bins --examples
//! target/release/examples/bench [--quick] [--out FILE] [--bin PATH]
//! ```
//!
//! `--quick` shortens the long runs (fewer tasks, 10 s instead of 60 s of idle CPU). The
//! results table goes to stdout and, with `--out`, to FILE (markdown).
//!
//! # Layout
//!
//! - [`Daemon`]: one child process with its config, temp dir and `/proc` readers.
//! - one `async fn` per figure, each returning [`Row`]s for the table.
//! - [`Stats`]: median / p99 over a sample.
//!
//! This is a benchmark, not a test: it reports, it does not assert. A figure that misses its
//! target is printed as `MISS`, and the run goes on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions, Recorded};
use serde_json::{json, Value};

/// Bound for anything that should happen "soon"; a run that exceeds it is reported as broken.
const T: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
struct Opts {
    quick: bool,
    /// Run the selected figures this many times and show min / median / max (`--repeat 3`).
    repeat: usize,
    /// Run only these figures (`--only 3,4`); empty: all.
    only: Vec<u32>,
    out: Option<PathBuf>,
    bin: PathBuf,
}

fn parse_args() -> Opts {
    let mut o = Opts {
        quick: false,
        repeat: 1,
        only: Vec::new(),
        out: None,
        bin: PathBuf::from("target/release/hub-sidecar"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--repeat" => {
                o.repeat = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n >= 1)
                    .unwrap_or(1)
            }
            "--out" => o.out = args.next().map(PathBuf::from),
            "--only" => {
                o.only = args
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|n| n.trim().parse().ok())
                    .collect()
            }
            "--bin" => o.bin = args.next().map(PathBuf::from).unwrap_or(o.bin),
            "-h" | "--help" => {
                println!(
                    "usage: bench [--quick] [--repeat N] [--only 1,2,..] [--out FILE] [--bin PATH]"
                );
                std::process::exit(0);
            }
            other => {
                eprintln!("bench: unknown argument {other}; try --help");
                std::process::exit(2);
            }
        }
    }
    o
}

/// One line of the results table.
#[derive(Clone)]
struct Row {
    figure: String,
    target: String,
    node: String,
    measured: String,
    /// `None` when the figure has no pass/fail target (context numbers).
    ok: Option<bool>,
}

impl Row {
    fn new(figure: &str, target: &str, node: &str, measured: String, ok: Option<bool>) -> Row {
        Row {
            figure: figure.into(),
            target: target.into(),
            node: node.into(),
            measured,
            ok,
        }
    }
}

/// Order statistics over a sample of durations, in milliseconds.
struct Stats(Vec<f64>);

impl Stats {
    fn new(mut v: Vec<f64>) -> Stats {
        v.sort_by(f64::total_cmp);
        Stats(v)
    }
    /// Nearest-rank percentile, `q` in 0..=1.
    fn p(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let i = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len()) - 1;
        self.0[i]
    }
    fn median(&self) -> f64 {
        self.p(0.5)
    }
    fn max(&self) -> f64 {
        self.0.last().copied().unwrap_or(f64::NAN)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn epoch_ms_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0
}

fn type_of(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

/// The instant of the first recorded frame matching direction, type and (optionally) task id.
fn at_of(frames: &[Recorded], inbound: bool, ty: &str, task_id: Option<&str>) -> Option<Instant> {
    frames
        .iter()
        .find(|r| {
            r.inbound == inbound
                && type_of(&r.frame) == ty
                && task_id.is_none_or(|id| r.frame["task_id"] == id)
        })
        .map(|r| r.at)
}

/// The real binary running against `hub`, in its own temp dir.
struct Daemon {
    child: tokio::process::Child,
    /// Kept so the dir lives as long as the daemon.
    dir: tempfile::TempDir,
    /// When `spawn()` was called.
    spawned: Instant,
}

impl Daemon {
    /// Writes a config (`extra` appended verbatim, e.g. a `[progress]` table) and starts the
    /// binary. `envs` are added to its environment.
    fn start(opts: &Opts, hub: &MockHub, extra: &str, envs: &[(&str, &str)]) -> Daemon {
        Daemon::start_in(opts, hub, extra, envs, None)
    }

    /// [`Daemon::start`] with its state dir under `base` (default: the system temp dir).
    fn start_in(
        opts: &Opts,
        hub: &MockHub,
        extra: &str,
        envs: &[(&str, &str)],
        base: Option<&Path>,
    ) -> Daemon {
        let dir = match base {
            Some(b) => tempfile::tempdir_in(b),
            None => tempfile::tempdir(),
        }
        .expect("temp dir");
        Daemon::start_with(opts, hub, extra, envs, dir)
    }

    /// [`Daemon::start`] with `dir` (prepared by the caller, e.g. a state file seeded) as its
    /// state dir.
    fn start_with(
        opts: &Opts,
        hub: &MockHub,
        extra: &str,
        envs: &[(&str, &str)],
        dir: tempfile::TempDir,
    ) -> Daemon {
        let config = dir.path().join("hub-sidecar.toml");
        // Top-level keys must come before any table in `extra`.
        let text = format!(
            "agent_id = \"sidecar-test\"\ntoken = \"test-token\"\nhub_url = \"{}\"\nstate_dir = \"{}\"\n{extra}\n",
            hub.url(),
            dir.path().display()
        );
        std::fs::write(&config, text).expect("write config");
        set_mode_600(&config);
        let log = std::fs::File::create(dir.path().join("daemon.log")).expect("log file");
        let mut cmd = tokio::process::Command::new(&opts.bin);
        cmd.arg("run")
            .arg("--config")
            .arg(&config)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let spawned = Instant::now();
        let child = cmd.spawn().unwrap_or_else(|e| {
            eprintln!(
                "bench: cannot start {}: {e}; build it with `cargo build --release --bins`",
                opts.bin.display()
            );
            std::process::exit(1)
        });
        Daemon {
            child,
            dir,
            spawned,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("daemon still running")
    }

    /// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`, …).
    fn status_kb(&self, field: &str) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Resident kB split by what backs it (`/proc/<pid>/smaps`): the executable's own
    /// file pages, shared libraries, and anonymous memory (heap, stacks, arenas).
    fn rss_split(&self) -> (u64, u64, u64) {
        let s = std::fs::read_to_string(format!("/proc/{}/smaps", self.pid())).unwrap_or_default();
        let (mut exe, mut libs, mut anon) = (0, 0, 0);
        let mut bucket = 2;
        for line in s.lines() {
            let mut parts = line.split_whitespace();
            let first = parts.next().unwrap_or("");
            if first.contains('-') && !first.ends_with(':') {
                // A mapping header: `addr perms offset dev inode [path]`.
                let path = parts.nth(4).unwrap_or("");
                bucket = if path.ends_with("hub-sidecar") {
                    0
                } else if path.starts_with('/') {
                    1
                } else {
                    2
                };
            } else if first == "Rss:" {
                let kb: u64 = parts.next().and_then(|k| k.parse().ok()).unwrap_or(0);
                match bucket {
                    0 => exe += kb,
                    1 => libs += kb,
                    _ => anon += kb,
                }
            }
        }
        (exe, libs, anon)
    }

    /// utime + stime in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
    fn cpu_ticks(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        // Fields after the command name, which may contain spaces, start after the last ')'.
        let rest: Vec<&str> = s
            .rsplit_once(')')
            .map(|(_, r)| r)
            .unwrap_or("")
            .split_whitespace()
            .collect();
        // rest[0] is field 3 (state), so field N is rest[N - 3].
        let field = |n: usize| rest.get(n - 3).and_then(|x| x.parse::<u64>().ok());
        field(14).unwrap_or(0) + field(15).unwrap_or(0)
    }

    /// SIGTERM (drain) and wait; SIGKILL if it does not go within 5 s.
    async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

fn set_mode_600(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
}

/// Waits until the hub has answered `identify`: a `task_assign` pushed before that goes to
/// no socket and is lost.
async fn identified(hub: &MockHub) {
    let deadline = Instant::now() + T;
    // The mock wakes waiters on inbound frames only; its answer has no event, so poll.
    while !hub.connected() {
        assert!(Instant::now() < deadline, "the daemon never identified");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The mock hub with the real hub's defaults (limiter on).
async fn hub_default() -> MockHub {
    MockHub::start(MockHubOptions::default())
        .await
        .expect("mock hub")
}

/// The mock hub with its limiter off, for throughput runs that would otherwise measure the
/// hub's 60-frames-a-minute budget instead of the daemon.
async fn hub_unlimited() -> MockHub {
    MockHub::start(MockHubOptions {
        rate_limit: false,
        ..Default::default()
    })
    .await
    .expect("mock hub")
}

/// Config for runs that must not be throttled by the daemon's own progress bucket either;
/// resource reports are pushed out of the window so they do not interleave.
const UNTHROTTLED: &str = "resource_report_interval_secs = 3600\n[progress]\ncapacity = 100000\nrefill_per_minute = 100000\nreserve = 12\n";

/// Clock ticks per second, for `/proc/<pid>/stat`.
fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

// ---------------------------------------------------------------------------------------

/// Figure 1: spawn → `identify` received, median of 10 cold-ish starts (each its own hub and
/// state dir; the binary's pages are in the page cache after the first).
async fn spawn_to_identify(o: &Opts) -> Vec<Row> {
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
async fn idle(o: &Opts, envs: &[(&str, &str)], label: &str, idle_secs: u64) -> Vec<Row> {
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
        "≤ 6 MB",
        "53 MB",
        format!(
            "{:.1} MB: anon {:.1} + file {:.1} (executable {:.1}, libs {:.1}); {threads} threads",
            mb(rss),
            mb(anon),
            mb(file),
            mb(exe),
            mb(libs)
        ),
        Some(rss <= 6 * 1024),
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

/// Figure 3: `task_assign` → `task_accepted` and → `task_complete` over `n` sequential
/// `true` tasks, plus the cost of one `state::write_atomic` on the same file system. `base`
/// is where the state dir goes: the disk (the real figure) or tmpfs (the daemon's own share,
/// with the fsyncs made free).
async fn latency(o: &Opts, n: usize, base: &Path, label: &str) -> Vec<Row> {
    let hub = hub_unlimited().await;
    let d = Daemon::start_in(o, &hub, UNTHROTTLED, &[], Some(base));
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
    d.stop().await;

    let (fsync, floor) = fsync_cost(200, base).await;
    let acc = Stats::new(accepted);
    let done = Stats::new(complete);
    vec![
        Row::new(
            &format!("3a. task_assign → task_accepted, p50 ({n} × `true`; {label})"),
            "≤ 1.5 ms",
            "2.9 ms",
            format!("{:.2} ms", acc.median()),
            Some(acc.median() <= 1.5),
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
            &format!("3d. one state change (journal append + fdatasync), 200 × ({label})"),
            "—",
            "— (no fsync)",
            format!("p50 {:.2} ms, p99 {:.2} ms", fsync.median(), fsync.p(0.99)),
            None,
        ),
        Row::new(
            &format!("3e. floor: bare 1 KB append + fdatasync, 200 × ({label})"),
            "—",
            "—",
            format!("p50 {:.2} ms, p99 {:.2} ms", floor.median(), floor.p(0.99)),
            None,
        ),
    ]
}

/// A short pause between sequential tasks, so the fsync the daemon does when the hub acks
/// the previous result is not counted in the next task's accept latency. A real hub would
/// not assign within 10 ms of a result either (it runs its scheduler in between).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// One durable state change as the daemon makes it (`StateStore::set_active` of an active
/// task: a journal append + `fdatasync`), `n` times, in a temp dir under `base`; and the
/// physical floor beside it: a bare 1 KB append + `fdatasync` on the same file system.
async fn fsync_cost(n: usize, base: &Path) -> (Stats, Stats) {
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
        });
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
async fn backlog(o: &Opts, n: usize) -> Vec<Row> {
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

/// Figure 10: `seq 1 20000000` (~150 MB of output) through the shell executor with default
/// settings (hub limiter off so the hub's budget is not what is measured): the daemon's peak
/// RSS and assign → complete wall time, against `seq` alone writing into a pipe. Median of
/// `runs` (min–max beside it).
async fn big_output(o: &Opts, runs: usize) -> Vec<Row> {
    let cmd = "seq 1 20000000";
    let mut walls = Vec::new();
    let mut peaks = Vec::new();
    let mut alone = Vec::new();
    for r in 0..runs {
        let t = Instant::now();
        let ok = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{cmd} | cat >/dev/null"))
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "seq alone failed");
        alone.push(ms(t.elapsed()));
        let hub = hub_unlimited().await;
        let d = Daemon::start(o, &hub, UNTHROTTLED, &[]);
        identified(&hub).await;
        let id = format!("big-{r}");
        hub.assign(sample_shell_task(&id, cmd));
        hub.wait_for_type("task_complete", T * 4)
            .await
            .expect("big output: task_complete");
        let frames = hub.frames();
        let a = at_of(&frames, false, "task_assign", Some(&id)).expect("assign");
        let c = at_of(&frames, true, "task_complete", Some(&id)).expect("complete");
        walls.push(ms(c - a));
        peaks.push(d.status_kb("VmHWM") as f64 / 1024.0);
        d.stop().await;
    }
    let (w, p, a) = (Stats::new(walls), Stats::new(peaks), Stats::new(alone));
    vec![Row::new(
        &format!("10. `{cmd}` (~150 MB output), median of {runs}"),
        "peak RSS ≤ 8 MB, wall ≤ 1.5 × seq alone",
        "—",
        format!(
            "peak RSS {:.1} MB ({:.1}–{:.1}); wall {:.0} ms ({:.0}–{:.0}) vs seq | cat {:.0} ms ({:.0}–{:.0}): {:.2}×",
            p.median(),
            p.p(0.0),
            p.max(),
            w.median(),
            w.p(0.0),
            w.max(),
            a.median(),
            a.p(0.0),
            a.max(),
            w.median() / a.median()
        ),
        Some(p.median() <= 8.0 && w.median() <= 1.5 * a.median()),
    )]
}

/// Figure 11: 10 idle daemons side by side (one hub each), 5 s after all identified: the
/// sum of their PSS (`/proc/<pid>/smaps_rollup`, shared pages split between sharers) over 10
/// is what one more agent costs the host; private memory is what only that agent holds.
async fn side_by_side(o: &Opts, n: usize) -> Vec<Row> {
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
    for d in &daemons {
        pss += field(d.pid(), "Pss");
        private += field(d.pid(), "Private_Clean") + field(d.pid(), "Private_Dirty");
        rss += field(d.pid(), "Rss");
    }
    for d in daemons {
        d.stop().await;
    }
    let per = |kb: u64| kb as f64 / 1024.0 / n as f64;
    vec![Row::new(
        &format!("11. {n} idle daemons side by side: memory per agent"),
        "—",
        "—",
        format!(
            "PSS {:.2} MB each (private {:.2} MB; RSS {:.1} MB each, mostly shared code)",
            per(pss),
            per(private),
            per(rss)
        ),
        None,
    )]
}

/// Figure 4: `seq 1 200000` with the hub's limiter on and default daemon settings.
async fn flood(o: &Opts) -> Vec<Row> {
    let hub = hub_default().await;
    let d = Daemon::start(o, &hub, "resource_report_interval_secs = 3600\n", &[]);
    identified(&hub).await;
    let hwm_before = d.status_kb("VmHWM");
    hub.assign(sample_shell_task("flood", "seq 1 200000"));
    let Some(done) = hub.wait_for_type("task_complete", T).await else {
        let log = d.dir.path().join("daemon.log");
        let seen: Vec<String> = hub
            .received()
            .iter()
            .map(|f| type_of(f).to_string())
            .collect();
        panic!(
            "flood: no task_complete in {T:?}; the hub received {seen:?} ({} rate_limited); daemon log:\n{}",
            hub.rate_limited_count(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
    };
    let hwm = d.status_kb("VmHWM");
    let frames = hub.frames();
    let assigned = at_of(&frames, false, "task_assign", Some("flood")).expect("assign");
    let accepted = at_of(&frames, true, "task_accepted", Some("flood")).expect("accepted");
    let completed = at_of(&frames, true, "task_complete", Some("flood")).expect("complete");
    let wall = ms(completed - assigned);
    let to_accept = ms(accepted - assigned);
    let progress: Vec<&Recorded> = frames
        .iter()
        .filter(|r| r.inbound && type_of(&r.frame) == "task_progress")
        .collect();
    let bytes: usize = progress.iter().map(|r| r.frame.to_string().len()).sum();
    let out = done["result"]["output"].as_str().unwrap_or("");
    let intact = out.starts_with("1\n2\n") && out.trim_end().ends_with("200000");
    let limited = hub.rate_limited_count();
    d.stop().await;
    vec![
        Row::new(
            "4a. `seq 1 200000`: assign → task_complete wall",
            "≤ 100 ms",
            "90 ms",
            format!(
                "{wall:.1} ms (assign → accepted {to_accept:.1} ms; {} progress frames, {bytes} B; result.output {} B)",
                progress.len(),
                out.len()
            ),
            Some(wall <= 100.0),
        ),
        Row::new(
            "4b. `seq 1 200000`: peak RSS (VmHWM)",
            "≤ 15 MB",
            "63 MB",
            format!(
                "{:.1} MB (before the task {:.1} MB)",
                hwm as f64 / 1024.0,
                hwm_before as f64 / 1024.0
            ),
            Some(hwm <= 15 * 1024),
        ),
        Row::new(
            "4c. `seq 1 200000`: rate_limited, output head/tail",
            "0, intact",
            "—",
            format!(
                "{limited} rate_limited, output {}",
                if intact { "intact" } else { "BROKEN" }
            ),
            Some(limited == 0 && intact),
        ),
    ]
}

/// Figure 5: a task printing a line every 10 ms for 2 s, then a second task right after its
/// result; limiter on.
async fn trickle(o: &Opts) -> Vec<Row> {
    let hub = hub_default().await;
    let d = Daemon::start(o, &hub, "resource_report_interval_secs = 3600\n", &[]);
    identified(&hub).await;
    hub.assign(sample_shell_task(
        "trickle-1",
        "i=0; while [ $i -lt 200 ]; do i=$((i+1)); echo line $i; sleep 0.01; done",
    ));
    hub.wait_for(
        |f| type_of(f) == "task_complete" && f["task_id"] == "trickle-1",
        T,
    )
    .await
    .expect("first result");
    hub.assign(sample_shell_task("trickle-2", "echo second"));
    hub.wait_for(
        |f| type_of(f) == "task_complete" && f["task_id"] == "trickle-2",
        T,
    )
    .await
    .expect("second result");
    // Both results must also be acknowledged (not dropped by the limiter and re-sent).
    let deadline = Instant::now() + T;
    while (hub.acked_terminal("trickle-1") == 0 || hub.acked_terminal("trickle-2") == 0)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let acked = hub.acked_terminal("trickle-1") == 1 && hub.acked_terminal("trickle-2") == 1;
    let progress = hub.received_of("task_progress").len();
    let limited = hub.rate_limited_count();
    let frames = hub.frames();
    let first = ms(
        at_of(&frames, true, "task_complete", Some("trickle-1")).expect("complete")
            - at_of(&frames, false, "task_assign", Some("trickle-1")).expect("assign"),
    );
    d.stop().await;
    vec![Row::new(
        "5. trickle 10 ms × 2 s, then a second task",
        "0 dropped, both results",
        "loses the result",
        format!(
            "{limited} rate_limited, both results {} (first task {first:.0} ms, {progress} progress frames)",
            if acked { "acked" } else { "NOT acked" }
        ),
        Some(limited == 0 && acked),
    )]
}

/// Live, non-zombie processes with an argument containing `needle`.
fn procs_matching(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if !cmd
            .split(|b| *b == 0)
            .any(|a| a.windows(needle.len()).any(|w| w == needle.as_bytes()))
        {
            continue;
        }
        // A zombie has exited already; it only waits to be reaped.
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.rsplit(')').next().unwrap_or("").split_whitespace().next() == Some("Z"))
            .unwrap_or(true);
        if !zombie {
            out.push(pid);
        }
    }
    out
}

/// Figure 6: a `sleep 60` check under `verification_timeout_ms: 2000`: deadline → the whole
/// tree (the `sh` and its `sleep`) gone.
async fn check_timeout(o: &Opts) -> Vec<Row> {
    let hub = hub_unlimited().await;
    let d = Daemon::start(o, &hub, UNTHROTTLED, &[]);
    identified(&hub).await;
    let mut samples = Vec::new();
    for run in 0..3 {
        // A unique duration finds exactly this run's processes; `; true` keeps `sh` alive as
        // the parent, so there is a tree to kill, not a single exec'd `sleep`.
        let arg = format!("60.{}{run}", std::process::id());
        let mut task = sample_shell_task(&format!("timeout-{run}"), "true");
        task["verification_steps"] =
            json!([{"type": "command_succeeds", "target": format!("sleep {arg}; true")}]);
        task["verification_timeout_ms"] = json!(2000);
        hub.assign(task);
        let deadline = Instant::now() + T;
        while procs_matching(&arg).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Poll tight around the expected deadline: /proc has no event for "process gone".
        while !procs_matching(&arg).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let gone = epoch_ms_f64();
        let done = hub
            .wait_for(
                |f| type_of(f) == "task_complete" && f["task_id"] == format!("timeout-{run}"),
                T,
            )
            .await
            .expect("task_complete");
        let report = &done["verification_report"];
        let started = report["started_at"].as_f64().unwrap_or(f64::NAN);
        // started_at has millisecond resolution: ±1 ms.
        samples.push(gone - (started + 2000.0));
        settle().await;
    }
    d.stop().await;
    let s = Stats::new(samples);
    vec![Row::new(
        "6. check deadline → process tree gone (3 runs)",
        "≤ 200 ms",
        "—",
        format!("median {:.1} ms, max {:.1} ms", s.median(), s.max()),
        Some(s.max() <= 200.0),
    )]
}

/// Figure 7: verification engine overhead with 4 `true` checks: from the report
/// (`duration_ms` − Σ check `duration_ms`, ms resolution) and from the wire (round trip with
/// 4 checks − without, minus 4 bare spawns measured here).
async fn verify_overhead(o: &Opts, n: usize) -> Vec<Row> {
    let hub = hub_unlimited().await;
    let d = Daemon::start(o, &hub, UNTHROTTLED, &[]);
    identified(&hub).await;
    let mut count = 0;
    let mut run = |id: String, checks: usize| {
        let mut task = sample_shell_task(&id, "true");
        task["verification_steps"] = Value::Array(vec![
            json!({"type": "command_succeeds", "target": "true"});
            checks
        ]);
        count += 1;
        (hub.assign(task), count)
    };
    let mut residue = Vec::new();
    let mut with = Vec::new();
    let mut without = Vec::new();
    for i in 0..n {
        for checks in [0usize, 4] {
            let (_, nth) = run(format!("v{checks}-{i}"), checks);
            let done = hub
                .wait_for_nth("task_complete", nth, T)
                .await
                .expect("task_complete");
            settle().await;
            if checks == 4 {
                let r = &done["verification_report"];
                let sum: f64 = r["checks"]
                    .as_array()
                    .map(|c| c.iter().filter_map(|c| c["duration_ms"].as_f64()).sum())
                    .unwrap_or(0.0);
                residue.push(r["duration_ms"].as_f64().unwrap_or(f64::NAN) - sum);
            }
        }
    }
    let frames = hub.frames();
    for i in 0..n {
        for (checks, v) in [(0, &mut without), (4, &mut with)] {
            let id = format!("v{checks}-{i}");
            let a = at_of(&frames, false, "task_assign", Some(&id)).unwrap();
            let c = at_of(&frames, true, "task_complete", Some(&id)).unwrap();
            v.push(ms(c - a));
        }
    }
    d.stop().await;
    let spawn = spawn_cost(50).await;
    let (with, without, residue) = (Stats::new(with), Stats::new(without), Stats::new(residue));
    let per_check = (with.median() - without.median()) / 4.0;
    vec![
        Row::new(
            &format!("7a. verification engine beyond the commands, 4 × `true` (p50 of {n})"),
            "≤ 5 ms",
            "—",
            format!(
                "{:.0} ms report `duration_ms` − Σ checks' `duration_ms` (max {:.0})",
                residue.median(),
                residue.max()
            ),
            Some(residue.median() <= 5.0),
        ),
        Row::new(
            "7b. cost per `command_succeeds` check, from the wire",
            "—",
            "—",
            format!(
                "{per_check:.2} ms/check (round trip +{:.2} ms with 4 checks than with none; a bare `sh -c true` spawn+reap from the driver {:.2} ms)",
                with.median() - without.median(),
                spawn.median()
            ),
            None,
        ),
    ]
}

/// What one `sh -c true` costs to spawn and reap from a tokio runtime, set up like the
/// daemon's checks (own process group, explicit environment and working directory, piped
/// output): the floor under any command check.
async fn spawn_cost(n: usize) -> Stats {
    let cwd = std::env::temp_dir();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let st = tokio::process::Command::new("sh")
            .arg("-c")
            .arg("true")
            .current_dir(&cwd)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .await
            .expect("sh");
        assert!(st.status.success());
        v.push(ms(t.elapsed()));
    }
    Stats::new(v)
}

/// The first number in a measured text: the figure's headline value ("7.3 MB: …" → 7.3).
fn headline(measured: &str) -> Option<f64> {
    let start = measured.find(|c: char| c.is_ascii_digit())?;
    let num: String = measured[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse().ok()
}

/// One row per figure from repeated runs: the median run's text and verdict, with the
/// headline's min / median / max over the runs appended when there was more than one.
fn merge_runs(runs: Vec<Vec<Row>>) -> Vec<Row> {
    let n = runs.len();
    let mut first = runs.first().cloned().unwrap_or_default();
    if n < 2 {
        return first;
    }
    for row in &mut first {
        let mut same: Vec<&Row> = runs
            .iter()
            .filter_map(|r| r.iter().find(|x| x.figure == row.figure))
            .collect();
        let mut values: Vec<f64> = same.iter().filter_map(|r| headline(&r.measured)).collect();
        if values.len() != same.len() {
            continue;
        }
        values.sort_by(f64::total_cmp);
        same.sort_by(|a, b| {
            headline(&a.measured)
                .unwrap_or(0.0)
                .total_cmp(&headline(&b.measured).unwrap_or(0.0))
        });
        let median = same[same.len() / 2];
        row.measured = format!(
            "{} [{} runs: min {} / median {} / max {}]",
            median.measured,
            values.len(),
            values[0],
            values[values.len() / 2],
            values[values.len() - 1]
        );
        row.ok = median.ok;
    }
    first
}

fn table(rows: &[Row]) -> String {
    let mut s =
        String::from("| figure | target | Node sidecar | hub-sidecar | |\n|---|---|---|---|---|\n");
    for r in rows {
        let verdict = match r.ok {
            Some(true) => "ok",
            Some(false) => "MISS",
            None => "",
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {verdict} |\n",
            r.figure, r.target, r.node, r.measured
        ));
    }
    s
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = parse_args();
    let started = Instant::now();
    let (tasks, idle_secs, overhead_runs) = if o.quick {
        (200, 10, 10)
    } else {
        (1000, 60, 30)
    };
    let run = |n: u32| o.only.is_empty() || o.only.contains(&n);
    let mut runs: Vec<Vec<Row>> = Vec::new();
    for _ in 0..o.repeat {
        let mut rows = Vec::new();
        if run(1) {
            eprintln!("bench: 1 spawn → identify");
            rows.extend(spawn_to_identify(&o).await);
        }
        if run(2) || run(8) {
            eprintln!("bench: 2, 8 idle RSS and CPU ({idle_secs} s)");
            rows.extend(idle(&o, &[], "", if run(8) { idle_secs } else { 0 }).await);
            rows.extend(idle(&o, &[("MALLOC_ARENA_MAX", "2")], " (MALLOC_ARENA_MAX=2)", 0).await);
        }
        if run(3) {
            eprintln!("bench: 3 latency ({tasks} tasks, state on disk, then on tmpfs)");
            rows.extend(latency(&o, tasks, &std::env::temp_dir(), "state on disk").await);
            if Path::new("/dev/shm").is_dir() {
                rows.extend(latency(&o, tasks, Path::new("/dev/shm"), "state on tmpfs").await);
            }
        }
        if run(4) {
            eprintln!("bench: 4 progress flood");
            rows.extend(flood(&o).await);
        }
        if run(5) {
            eprintln!("bench: 5 trickle");
            rows.extend(trickle(&o).await);
        }
        if run(6) {
            eprintln!("bench: 6 check timeout");
            rows.extend(check_timeout(&o).await);
        }
        if run(7) {
            eprintln!("bench: 7 verification overhead");
            rows.extend(verify_overhead(&o, overhead_runs).await);
        }
        if run(10) {
            eprintln!("bench: 10 seq 1 20000000 through the shell executor");
            rows.extend(big_output(&o, 3).await);
        }
        if run(11) {
            eprintln!("bench: 11 ten daemons side by side");
            rows.extend(side_by_side(&o, 10).await);
        }
        if run(9) {
            eprintln!("bench: 9 backlog of 1000 × 64 KB results");
            rows.extend(backlog(&o, 1000).await);
        }
        runs.push(rows);
    }
    let mut rows = merge_runs(runs);
    // Figure 8 was measured with figure 2; keep the table in figure order.
    rows.sort_by_key(|r| {
        let n: String = r.figure.chars().take_while(char::is_ascii_digit).collect();
        n.parse::<u32>().unwrap_or(99)
    });

    let text = format!(
        "{}\nDriver wall time: {:.0} s{}.\n",
        table(&rows),
        started.elapsed().as_secs_f64(),
        if o.quick { " (--quick)" } else { "" }
    );
    println!("{text}");
    if let Some(out) = &o.out {
        if let Err(e) = std::fs::write(out, &text) {
            eprintln!("bench: cannot write {}: {e}", out.display());
            std::process::exit(1);
        }
    }
}
