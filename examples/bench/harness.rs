//! What every figure shares: the daemon under test as a child process ([`Daemon`]), the mock
//! hubs, order statistics ([`Stats`]), and the results table ([`Row`], [`merge_runs`],
//! [`table`]).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hub_sidecar::mock_hub::{MockHub, MockHubOptions, Recorded};
use serde_json::Value;

use crate::Opts;

/// Bound for anything that should happen "soon"; a run that exceeds it is reported as broken.
pub(crate) const T: Duration = Duration::from_secs(30);

/// One line of the results table.
#[derive(Clone)]
pub(crate) struct Row {
    pub figure: String,
    pub target: String,
    pub node: String,
    pub measured: String,
    /// `None` when the figure has no pass/fail target (context numbers).
    pub ok: Option<bool>,
}

impl Row {
    pub(crate) fn new(
        figure: &str,
        target: &str,
        node: &str,
        measured: String,
        ok: Option<bool>,
    ) -> Row {
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
pub(crate) struct Stats(Vec<f64>);

impl Stats {
    pub(crate) fn new(mut v: Vec<f64>) -> Stats {
        v.sort_by(f64::total_cmp);
        Stats(v)
    }
    /// Nearest-rank percentile, `q` in 0..=1.
    pub(crate) fn p(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let i = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len()) - 1;
        self.0[i]
    }
    pub(crate) fn median(&self) -> f64 {
        self.p(0.5)
    }
    pub(crate) fn max(&self) -> f64 {
        self.0.last().copied().unwrap_or(f64::NAN)
    }
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(crate) fn epoch_ms_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0
}

pub(crate) fn type_of(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

/// The instant of the first recorded frame matching direction, type and (optionally) task id.
pub(crate) fn at_of(
    frames: &[Recorded],
    inbound: bool,
    ty: &str,
    task_id: Option<&str>,
) -> Option<Instant> {
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
pub(crate) struct Daemon {
    pub child: tokio::process::Child,
    /// Kept so the dir lives as long as the daemon.
    pub dir: tempfile::TempDir,
    /// When `spawn()` was called.
    pub spawned: Instant,
}

impl Daemon {
    /// Writes a config (`extra` appended verbatim, e.g. a `[progress]` table) and starts the
    /// binary. `envs` are added to its environment.
    pub(crate) fn start(opts: &Opts, hub: &MockHub, extra: &str, envs: &[(&str, &str)]) -> Daemon {
        Daemon::start_in(opts, hub, extra, envs, None)
    }

    /// [`Daemon::start`] with its state dir under `base` (default: the system temp dir).
    pub(crate) fn start_in(
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
    pub(crate) fn start_with(
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

    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("daemon still running")
    }

    /// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`, …).
    pub(crate) fn status_kb(&self, field: &str) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Await `fut` while sampling `RssAnon` and `RssFile` every `every` (`VmHWM` has no
    /// anonymous/file split): its output and the two peaks seen, in kB.
    pub(crate) async fn sampling_split<F: std::future::Future>(
        &self,
        every: Duration,
        fut: F,
    ) -> (F::Output, u64, u64) {
        let (mut anon_max, mut file_max) = (0, 0);
        tokio::pin!(fut);
        loop {
            anon_max = anon_max.max(self.status_kb("RssAnon"));
            file_max = file_max.max(self.status_kb("RssFile"));
            tokio::select! {
                out = &mut fut => return (out, anon_max, file_max),
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    /// Resident kB split by what backs it (`/proc/<pid>/smaps`): the executable's own
    /// file pages, shared libraries, and anonymous memory (heap, stacks, arenas).
    pub(crate) fn rss_split(&self) -> (u64, u64, u64) {
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
    pub(crate) fn cpu_ticks(&self) -> u64 {
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

    /// cutime + cstime in clock ticks (fields 16 and 17): the children the daemon waited for.
    pub(crate) fn child_cpu_ticks(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        let rest: Vec<&str> = s
            .rsplit_once(')')
            .map(|(_, r)| r)
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let field = |n: usize| rest.get(n - 3).and_then(|x| x.parse::<u64>().ok());
        field(16).unwrap_or(0) + field(17).unwrap_or(0)
    }

    /// SIGTERM (drain) and wait; SIGKILL if it does not go within 5 s.
    pub(crate) async fn stop(mut self) {
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

pub(crate) fn set_mode_600(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
}

/// Waits until the hub has answered `identify`: a `task_assign` pushed before that goes to
/// no socket and is lost.
pub(crate) async fn identified(hub: &MockHub) {
    let deadline = Instant::now() + T;
    // The mock wakes waiters on inbound frames only; its answer has no event, so poll. It
    // marks the socket identified a moment before it records the frame: wait for both, or a
    // figure reading the frames right after may not find `identify` yet.
    let recorded = || at_of(&hub.frames(), true, "identify", None).is_some();
    while !(hub.connected() && recorded()) {
        assert!(Instant::now() < deadline, "the daemon never identified");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The mock hub with the real hub's defaults (limiter on).
pub(crate) async fn hub_default() -> MockHub {
    MockHub::start(MockHubOptions::default())
        .await
        .expect("mock hub")
}

/// The mock hub with its limiter off, for throughput runs that would otherwise measure the
/// hub's 60-frames-a-minute budget instead of the daemon.
pub(crate) async fn hub_unlimited() -> MockHub {
    MockHub::start(MockHubOptions {
        rate_limit: false,
        ..Default::default()
    })
    .await
    .expect("mock hub")
}

/// Config for runs that must not be throttled by the daemon's own progress bucket either;
/// resource reports are pushed out of the window so they do not interleave.
pub(crate) const UNTHROTTLED: &str = "resource_report_interval_secs = 3600\n[progress]\ncapacity = 100000\nrefill_per_minute = 100000\nreserve = 12\n";

/// Clock ticks per second, for `/proc/<pid>/stat`.
pub(crate) fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// A short pause between sequential tasks, so the fsync the daemon does when the hub acks
/// the previous result is not counted in the next task's accept latency. A real hub would
/// not assign within 10 ms of a result either (it runs its scheduler in between).
pub(crate) async fn settle() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Live, non-zombie processes with an argument containing `needle`.
pub(crate) fn procs_matching(needle: &str) -> Vec<u32> {
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

/// The first number in a measured text: the figure's headline value ("7.3 MB: …" → 7.3).
pub(crate) fn headline(measured: &str) -> Option<f64> {
    let start = measured.find(|c: char| c.is_ascii_digit())?;
    let num: String = measured[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse().ok()
}

/// One row per figure from repeated runs: the median run's text and verdict, with the
/// headline's min / median / max over the runs appended when there was more than one.
pub(crate) fn merge_runs(runs: Vec<Vec<Row>>) -> Vec<Row> {
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
        // The whole row is the median run's: a Node column measured in the same run (figure
        // 14) belongs beside that run's figure, not the first run's.
        row.node = median.node.clone();
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

pub(crate) fn table(rows: &[Row]) -> String {
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

/// Write the binary's pages to disk and drop them from the page cache (this file only), so
/// the figures see it as a host does after a reboot, read back by the kernel's readahead.
/// Right after a build or a copy the file's pages are the ones the writer left (large
/// folios), which map in bigger pieces: idle RSS read ~0.6 MB higher until they were
/// evicted (issue 30). Pages still mapped by a running process stay; none runs yet.
pub(crate) fn drop_from_page_cache(bin: &Path) {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(bin) else {
        return;
    };
    let _ = f.sync_all();
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open.
    #[allow(unsafe_code)]
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        eprintln!(
            "bench: cannot drop {} from the page cache (error {r})",
            bin.display()
        );
    }
}

/// How many of the functions `scripts/link-order.txt` names the binary at `bin` has (`nm`),
/// and how many it names: a profile goes stale as the code and dependencies change.
pub(crate) fn link_order_coverage(bin: &Path) -> Option<(usize, usize)> {
    let order = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/link-order.txt"
    ))
    .ok()?;
    let out = std::process::Command::new("nm")
        .arg("--defined-only")
        .arg(bin)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let symbols: std::collections::HashSet<&str> = std::str::from_utf8(&out.stdout)
        .ok()?
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    let listed: Vec<&str> = order.lines().filter(|l| !l.is_empty()).collect();
    let found = listed.iter().filter(|s| symbols.contains(*s)).count();
    Some((found, listed.len()))
}

/// Flush the earlier figures' writes before a figure that times `fdatasync`s (3, 14): a
/// repeat runs them after figures 13 and 15 of the pass before (thousands of files, a 64 MiB
/// push), whose writeback would otherwise land in the daemon's own durable writes.
pub(crate) async fn flush_writeback() {
    let _ = tokio::task::spawn_blocking(|| std::process::Command::new("sync").status()).await;
}
