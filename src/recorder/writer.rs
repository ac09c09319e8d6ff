//! The recorder's writer thread: the only code that touches the record files. Appends each
//! line to its task's file and applies retention (count and bytes, oldest first) from an
//! index of the records kept, read from the disk once, when the first task writes.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::config::RecorderConfig;
use crate::ops::gauge_value;
use crate::ops::metrics::RecorderGauges;

use super::{sizing, Msg, RECORD_FILE};

/// How many record files the writer keeps open at most (one task runs at a time).
const OPEN_FILES: usize = 4;

/// Owns the files: appends lines, applies retention. Runs on a blocking thread.
pub(super) struct Writer {
    root: PathBuf,
    max_tasks: usize,
    max_total_bytes: u64,
    /// With a byte bound left unset: the config, and when the bounds were last sized to the
    /// host ([`sizing`]; again after a task once [`sizing::RESIZE_EVERY`] has passed).
    sizing: Option<(RecorderConfig, Option<std::time::Instant>)>,
    /// Shared with every [`TaskRecord`]: updated when the budget is sized.
    max_task_bytes: Arc<AtomicU64>,
    /// Records still being written: never removed by retention.
    open: HashSet<String>,
    /// The files of records being written, kept open so a line costs one `write` (it was a
    /// `mkdir`, `stat`, `open`, `write` and `close`). Closed when the task is done; at most
    /// [`OPEN_FILES`], should a `Done` have been lost to a full channel.
    files: HashMap<String, std::fs::File>,
    /// Every record on disk: last write and bytes. Read from the disk once (when the first task writes) and kept
    /// up to date by [`Writer::append`], so retention after each task costs no directory
    /// walk: with hundreds of records kept, a walk per task was ~2,000 syscalls each time.
    index: HashMap<String, Record>,
    warned: bool,
    /// Where the usage and bounds are reported after each retention pass (`/metrics`).
    gauges: Option<RecorderGauges>,
}

impl Writer {
    /// The writer of records under `root` with `cfg`'s bounds. `max_task_bytes` is shared
    /// with every task record: the writer updates it when it sizes the bounds to the host.
    pub(super) fn new(
        root: PathBuf,
        cfg: &RecorderConfig,
        max_task_bytes: Arc<AtomicU64>,
        gauges: Option<RecorderGauges>,
    ) -> Writer {
        Writer {
            root,
            max_tasks: cfg.max_tasks,
            max_total_bytes: cfg.max_total_bytes.unwrap_or(u64::MAX),
            sizing: (cfg.max_total_bytes.is_none() || cfg.max_task_bytes.is_none())
                .then(|| (cfg.clone(), None)),
            max_task_bytes,
            open: HashSet::new(),
            files: HashMap::new(),
            index: HashMap::new(),
            warned: false,
            gauges,
        }
    }

    pub(super) fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        // The records already on disk are scanned (and pruned) when the first task writes,
        // not at start: start-up has the hub to reach on two cores, and nothing grows the
        // records before a task runs.
        let mut scanned = false;
        while let Some(msg) = rx.blocking_recv() {
            if !std::mem::replace(&mut scanned, true) {
                self.scan();
            }
            match msg {
                Msg::Line { dir, line, sync } => {
                    self.append(&dir, &line, true, sync);
                    self.open.insert(dir);
                }
                Msg::LineIfExists { dir, line } => self.append(&dir, &line, false, true),
                Msg::Done { dir } => {
                    self.open.remove(&dir);
                    self.files.remove(&dir);
                    self.prune();
                }
            }
        }
    }

    /// Index the records a previous run left, then apply the retention to them.
    fn scan(&mut self) {
        match scan(&self.root) {
            Ok(records) => self.index = records.into_iter().map(|r| (r.name.clone(), r)).collect(),
            Err(e) => {
                tracing::warn!(root = %self.root.display(), error = %e, "flight recorder cannot read its records; retention starts from what this run writes")
            }
        }
        self.prune();
    }

    /// Append `line` to `dir`'s record. A record being written (`create`) keeps its file
    /// open until its task is done; a line for a finished record (an acknowledgement) is
    /// written only where that record still exists.
    fn append(&mut self, dir: &str, line: &[u8], create: bool, sync: bool) {
        let path = self.root.join(dir).join(RECORD_FILE);
        if !create && !self.files.contains_key(dir) && !path.exists() {
            return;
        }
        let res = (|| -> std::io::Result<()> {
            let mut once;
            let f = match self.files.get_mut(dir) {
                Some(f) => f,
                None if create => {
                    std::fs::create_dir_all(self.root.join(dir))?;
                    let f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)?;
                    if self.files.len() >= OPEN_FILES {
                        self.files.clear();
                    }
                    self.files.entry(dir.to_string()).or_insert(f)
                }
                None => {
                    once = std::fs::OpenOptions::new().append(true).open(&path)?;
                    &mut once
                }
            };
            f.write_all(line)?;
            if sync {
                f.sync_data()?;
            }
            Ok(())
        })();
        if res.is_ok() {
            let r = self.index.entry(dir.to_string()).or_insert_with(|| Record {
                name: dir.to_string(),
                written: std::time::SystemTime::UNIX_EPOCH,
                bytes: 0,
            });
            r.written = std::time::SystemTime::now();
            r.bytes += line.len() as u64;
        }
        if let Err(e) = res {
            if !std::mem::replace(&mut self.warned, true) {
                tracing::warn!(path = %path.display(), error = %e, "flight recorder cannot write; check the state directory's permissions and free space");
            }
        }
    }

    /// Size the unset bounds to the host, when that is due.
    fn resize(&mut self) {
        let Some((cfg, last)) = &mut self.sizing else {
            return;
        };
        if last.is_some_and(|t| t.elapsed() < sizing::RESIZE_EVERY) {
            return;
        }
        *last = Some(std::time::Instant::now());
        let state_dir = self.root.parent().unwrap_or(&self.root);
        let budget = sizing::resolve(cfg, state_dir);
        if budget.total != self.max_total_bytes {
            tracing::debug!(
                max_total_bytes = budget.total,
                max_task_bytes = budget.per_task,
                "flight recorder budget sized to the host"
            );
        }
        self.max_total_bytes = budget.total;
        self.max_task_bytes
            .store(budget.per_task, Ordering::Relaxed);
    }

    fn prune(&mut self) {
        self.resize();
        let records: Vec<Record> = self.index.values().cloned().collect();
        let doomed = over_retention(records, self.max_tasks, self.max_total_bytes, &self.open);
        let mut removed = 0;
        for name in doomed {
            self.index.remove(&name);
            match std::fs::remove_dir_all(self.root.join(&name)) {
                Ok(()) => removed += 1,
                // Removed by someone else: already what retention wanted.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(root = %self.root.display(), record = %name, error = %e, "flight recorder retention failed");
                    return;
                }
            }
        }
        if removed > 0 {
            tracing::debug!(
                removed,
                "flight recorder retention removed old task records"
            );
        }
        self.report();
    }

    /// The usage and bounds into the gauges, when there are any.
    fn report(&self) {
        let Some(g) = &self.gauges else { return };
        g.bytes
            .set(gauge_value(self.index.values().map(|r| r.bytes).sum()));
        g.records.set(gauge_value(self.index.len() as u64));
        g.max_bytes.set(gauge_value(self.max_total_bytes));
        g.max_records.set(gauge_value(self.max_tasks as u64));
    }
}

/// One task record on disk, as retention sees it.
#[derive(Debug, Clone)]
pub(super) struct Record {
    name: String,
    /// The last write to any of its files.
    written: std::time::SystemTime,
    bytes: u64,
}

/// Every task record under `root`, with its last write and size.
pub(super) fn scan(root: &Path) -> std::io::Result<Vec<Record>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut records = Vec::new();
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        if !meta.is_dir() {
            continue;
        }
        // Age is the last write to the record's files (the directory's own time changes
        // when a file is created, not when one is appended to).
        let (mut bytes, mut newest) = (0u64, None);
        for f in std::fs::read_dir(e.path())?.flatten() {
            if let Ok(m) = f.metadata() {
                bytes += m.len();
                newest = newest.max(m.modified().ok());
            }
        }
        records.push(Record {
            name: e.file_name().to_string_lossy().into_owned(),
            written: newest.unwrap_or_else(|| meta.modified().unwrap_or(std::time::UNIX_EPOCH)),
            bytes,
        });
    }
    Ok(records)
}

/// The records to remove, oldest first, so that at most `max_tasks` remain and they total at
/// most `max_total_bytes`; records in `keep` always stay.
pub(super) fn over_retention(
    mut records: Vec<Record>,
    max_tasks: usize,
    max_total_bytes: u64,
    keep: &HashSet<String>,
) -> Vec<String> {
    // Newest first; ties broken by name so the order is stable.
    records.sort_by(|a, b| b.written.cmp(&a.written).then_with(|| b.name.cmp(&a.name)));
    let mut doomed = Vec::new();
    let (mut count, mut total, mut full) = (0usize, 0u64, false);
    for r in records {
        // Once one record does not fit, every older one goes too: oldest first, no gaps.
        full = full || count >= max_tasks || total + r.bytes > max_total_bytes;
        if keep.contains(&r.name) || !full {
            count += 1;
            total += r.bytes;
            continue;
        }
        doomed.push(r.name);
    }
    doomed
}
