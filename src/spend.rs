//! The spend ledger: what this daemon spent today and what each running task has spent, kept
//! on disk so a restart cannot forget money already gone.
//!
//! Owns `spend.json` in the state directory: today's UTC day and total, and per task its
//! spend and the last attempt started. The cost caps of the verification loop
//! (`max_cost_usd_per_task`, `max_cost_usd_per_day`) read it before every execution, and
//! `task_continue` (which runs the task again) resumes the attempt count and the task's spend
//! from it; a fresh `task_assign` forgets the task's record (the daemon calls
//! [`SpendLedger::finish_task`]) but never the day's total. Every change is written atomically (temp file, fsync, rename, fsync of the
//! directory) off the runtime threads. A corrupt file is kept aside as `spend.json.corrupt`
//! and reported, never silently replaced — but the ledger then starts from zero, so the log
//! line says so.
//!
//! A ledger without a path ([`SpendLedger::in_memory`]) is for offline commands and tests.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Entries of tasks not touched for this long are dropped (a task dropped by the hub never
/// finishes here, so its entry would otherwise stay forever).
const STALE_TASK_MS: i64 = 7 * 86_400_000;

/// What one execution or judge call used, recorded the moment it is known
/// ([`SpendLedger::charge`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens.
    pub tokens_in: u64,
    /// Output tokens.
    pub tokens_out: u64,
    /// USD on the reference Claude model.
    pub equivalent_claude_cost_usd: f64,
    /// Execution wall time.
    pub execution_ms: u64,
    /// Executions (0 for a judge call).
    pub executions: u32,
}

impl Usage {
    /// Add `other` to these totals.
    pub fn add(&mut self, other: &Usage) {
        self.tokens_in += other.tokens_in;
        self.tokens_out += other.tokens_out;
        self.equivalent_claude_cost_usd += other.equivalent_claude_cost_usd;
        self.execution_ms += other.execution_ms;
        self.executions += other.executions;
    }

    /// Nothing a restart would miss if it were not written (no tokens, no reference cost).
    fn is_free(&self) -> bool {
        self.tokens_in == 0 && self.tokens_out == 0 && self.equivalent_claude_cost_usd == 0.0
    }
}

/// One task's record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskSpend {
    /// USD spent on the task so far, over all its executions and judge calls.
    pub spent_usd: f64,
    /// Tokens, reference cost, wall time and executions so far, over all its executions
    /// and judge calls: written with the dollars, the moment they are known, so a restart
    /// at any point of an attempt keeps them.
    #[serde(default)]
    pub used: Usage,
    /// The last attempt that ran to its verdict (1-based; 0 = none yet). An attempt cut
    /// short by a restart is not counted: it runs again (what it spent stays counted).
    pub attempt: u32,
    /// When the entry last changed (ms since the epoch), for expiry.
    pub updated_ms: i64,
    /// What the verification loop needs to go on after a restart (its earlier reports,
    /// tokens, plan and last output), in the loop's own shape
    /// (`verify::retry_loop::Carry`); the ledger only keeps it with the attempt it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carry: Option<serde_json::Value>,
}

/// The file's content.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Ledger {
    /// UTC day number (days since the epoch) `spent_today_usd` belongs to.
    day: i64,
    spent_today_usd: f64,
    tasks: BTreeMap<String, TaskSpend>,
}

impl Ledger {
    /// Start a new day's total when the UTC day changed.
    fn roll(&mut self, now_ms: i64) {
        let day = now_ms.div_euclid(86_400_000);
        if self.day != day {
            self.day = day;
            self.spent_today_usd = 0.0;
        }
    }
}

/// The daemon-wide ledger; share one `Arc<SpendLedger>` between tasks.
#[derive(Debug)]
pub struct SpendLedger {
    path: Option<PathBuf>,
    /// A tokio mutex: it is held across the (off-thread) write so writes land in order.
    inner: tokio::sync::Mutex<Ledger>,
    /// Today's total as last seen, for readers that cannot wait (`/status`): f64 bits.
    last_today: std::sync::atomic::AtomicU64,
}

impl SpendLedger {
    /// A ledger that is never written (offline commands, tests).
    pub fn in_memory() -> SpendLedger {
        SpendLedger {
            path: None,
            inner: tokio::sync::Mutex::new(Ledger::default()),
            last_today: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The ledger in `path` (absent: empty). A file that cannot be parsed is moved aside
    /// and reported; an unreadable one is reported and the ledger starts empty.
    pub async fn open(path: PathBuf) -> SpendLedger {
        let p = path.clone();
        let ledger = tokio::task::spawn_blocking(move || load(&p))
            .await
            .unwrap_or_default();
        let today = ledger.spent_today_usd;
        SpendLedger {
            path: Some(path),
            inner: tokio::sync::Mutex::new(ledger),
            last_today: std::sync::atomic::AtomicU64::new(today.to_bits()),
        }
    }

    /// Today's spend without waiting: exact when the ledger is free, else the total as of
    /// the last change (for status displays, never for a cap).
    pub fn spent_today_now(&self) -> f64 {
        if let Ok(mut g) = self.inner.try_lock() {
            g.roll(crate::util::now_ms());
            return g.spent_today_usd;
        }
        f64::from_bits(self.last_today.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Today's spend (UTC day) over all tasks.
    pub async fn spent_today(&self) -> f64 {
        let mut g = self.inner.lock().await;
        g.roll(crate::util::now_ms());
        g.spent_today_usd
    }

    /// The record of `task_id`, if it has one (a task that ran before a restart).
    pub async fn task(&self, task_id: &str) -> Option<TaskSpend> {
        self.inner.lock().await.tasks.get(task_id).cloned()
    }

    /// Record that attempt `attempt` of `task_id` ran to its verdict, with what the loop
    /// carries into the next one and its totals so far (`used`: everything charged, and any
    /// free execution too), written in the same atomic update, so a restart never sees an
    /// attempt count without its reports.
    pub async fn complete_attempt(
        &self,
        task_id: &str,
        attempt: u32,
        carry: Option<serde_json::Value>,
        used: Usage,
    ) {
        let mut g = self.inner.lock().await;
        let now = crate::util::now_ms();
        let t = g.tasks.entry(task_id.to_string()).or_default();
        t.attempt = attempt;
        t.used = used;
        t.updated_ms = now;
        t.carry = carry;
        self.persist(&g).await;
    }

    /// Add `usd` (negative and non-finite values count as 0) to today's total and to
    /// `task_id`'s spend; returns today's new total.
    pub async fn add(&self, task_id: &str, usd: f64) -> f64 {
        self.charge(task_id, usd, &Usage::default()).await
    }

    /// Record what one execution or judge call of `task_id` spent: `usd` (negative and
    /// non-finite values count as 0) on today's total and the task's, and its `used` tokens,
    /// time and executions on the task's totals, in one atomic write; returns today's new
    /// total. Nothing spent is nothing to write (no dollars, no tokens: a shell command);
    /// each write is a temp file, two fsyncs and a rename. Such a free execution is counted
    /// in memory and written with the next write (the attempt's verdict at the latest).
    pub async fn charge(&self, task_id: &str, usd: f64, used: &Usage) -> f64 {
        let usd = if usd.is_finite() { usd.max(0.0) } else { 0.0 };
        let mut g = self.inner.lock().await;
        let now = crate::util::now_ms();
        g.roll(now);
        if usd == 0.0 && used.is_free() {
            if let Some(t) = g.tasks.get_mut(task_id) {
                t.used.add(used);
            }
            return g.spent_today_usd;
        }
        g.spent_today_usd += usd;
        let t = g.tasks.entry(task_id.to_string()).or_default();
        t.spent_usd += usd;
        t.used.add(used);
        t.updated_ms = now;
        let today = g.spent_today_usd;
        self.last_today
            .store(today.to_bits(), std::sync::atomic::Ordering::Relaxed);
        self.persist(&g).await;
        today
    }

    /// Forget `task_id` (it reached its end); today's total keeps what it spent.
    pub async fn finish_task(&self, task_id: &str) {
        let mut g = self.inner.lock().await;
        let now = crate::util::now_ms();
        let before = g.tasks.len();
        g.tasks.remove(task_id);
        g.tasks.retain(|_, t| now - t.updated_ms < STALE_TASK_MS);
        if g.tasks.len() != before {
            self.persist(&g).await;
        }
    }

    /// Write the ledger; a failure is logged (the in-memory total still holds the caps for
    /// this run of the daemon).
    async fn persist(&self, ledger: &Ledger) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let bytes = serde_json::to_vec_pretty(ledger).expect("the ledger serializes");
        let p = path.clone();
        let r = tokio::task::spawn_blocking(move || write_atomic(&p, &bytes)).await;
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(path = %path.display(), error = %e,
                "cannot write the spend ledger: a restart would forget today's spend; check that the state directory is writable"),
            Err(e) => tracing::error!(error = %e, "spend ledger writer panicked"),
        }
    }
}

fn load(path: &Path) -> Ledger {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ledger::default(),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e,
                "cannot read the spend ledger: today's spend starts from 0; fix its permissions");
            return Ledger::default();
        }
    };
    match serde_json::from_slice::<Ledger>(&bytes) {
        Ok(l) => l,
        Err(e) => {
            let mut aside = path.as_os_str().to_os_string();
            aside.push(".corrupt");
            let moved = std::fs::rename(path, &aside);
            tracing::error!(path = %path.display(), aside = ?aside, moved = moved.is_ok(), error = %e,
                "the spend ledger is corrupt: kept aside, today's spend starts from 0");
            Ledger::default()
        }
    }
}

/// temp file in the same directory → write → fsync → rename over → fsync the directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spend_and_attempts_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spend.json");
        let l = SpendLedger::open(path.clone()).await;
        assert_eq!(l.spent_today().await, 0.0);
        l.complete_attempt("t1", 2, None, Usage::default()).await;
        assert_eq!(l.add("t1", 0.5).await, 0.5);
        assert_eq!(l.add("t2", 0.25).await, 0.75);
        assert_eq!(l.add("t2", -3.0).await, 0.75);
        assert_eq!(l.add("t2", f64::NAN).await, 0.75);
        drop(l);
        let l = SpendLedger::open(path.clone()).await;
        assert_eq!(l.spent_today().await, 0.75);
        let t = l.task("t1").await.unwrap();
        assert_eq!((t.spent_usd, t.attempt), (0.5, 2));
        l.finish_task("t1").await;
        drop(l);
        let l = SpendLedger::open(path).await;
        assert_eq!(l.task("t1").await, None);
        assert_eq!(
            l.spent_today().await,
            0.75,
            "a finished task's spend stays in the day"
        );
    }

    /// Tokens and executions are written with the dollars, when spent: a ledger reopened
    /// between a charge and the attempt's verdict has them (an Ollama run, which costs no
    /// dollars, too).
    #[tokio::test]
    async fn tokens_and_executions_are_written_when_spent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spend.json");
        let l = SpendLedger::open(path.clone()).await;
        let run = Usage {
            tokens_in: 850,
            tokens_out: 40,
            equivalent_claude_cost_usd: 0.0031,
            execution_ms: 1200,
            executions: 1,
        };
        l.charge("t", 0.0031, &run).await;
        l.charge("ollama", 0.0, &run).await;
        l.charge(
            "ollama",
            0.0,
            &Usage {
                executions: 1,
                ..Usage::default()
            },
        )
        .await;
        drop(l);
        let l = SpendLedger::open(path).await;
        let t = l.task("t").await.unwrap();
        assert_eq!((t.spent_usd, t.attempt, t.used), (0.0031, 0, run));
        let o = l.task("ollama").await.unwrap();
        assert_eq!(
            (o.spent_usd, o.used.tokens_in, o.used.executions),
            (0.0, 850, 1)
        );
    }

    #[tokio::test]
    async fn spending_nothing_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spend.json");
        let l = SpendLedger::open(path.clone()).await;
        assert_eq!(l.add("shell", 0.0).await, 0.0);
        l.finish_task("shell").await;
        assert!(!path.exists(), "a task that spent nothing wrote the ledger");
        assert_eq!(l.add("llm", 0.5).await, 0.5);
        assert!(path.exists());
    }

    #[tokio::test]
    async fn a_corrupt_ledger_is_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spend.json");
        std::fs::write(&path, "{not json").unwrap();
        let l = SpendLedger::open(path.clone()).await;
        assert_eq!(l.spent_today().await, 0.0);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("spend.json.corrupt")).unwrap(),
            "{not json"
        );
    }

    #[test]
    fn a_new_day_starts_from_zero() {
        let mut l = Ledger {
            day: 1,
            spent_today_usd: 5.0,
            tasks: BTreeMap::new(),
        };
        l.roll(86_400_000 + 5);
        assert_eq!(l.spent_today_usd, 5.0);
        l.roll(2 * 86_400_000);
        assert_eq!((l.day, l.spent_today_usd), (2, 0.0));
    }
}
