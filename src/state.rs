//! The crash-safe state: the active task and the outbox of terminal frames not yet
//! acknowledged by the hub, kept in a journal file (`queue.json`).
//!
//! Every change is durable (appended and `fdatasync`ed, see [`journal`]) *before* the hub is
//! told anything that depends on it: a task is on disk before `task_accepted`, a result is in
//! the outbox before it is sent. A file that cannot be parsed is moved aside
//! (`queue.json.corrupt-<ms>`) and a half-written last line is kept aside
//! (`queue.json.torn-<ms>`); both are reported, never silently dropped.
//!
//! Layout: this file holds the types and the async handle ([`StateStore`], all IO on the
//! blocking pool); `state/journal.rs` owns the file format, replay and compaction.

mod journal;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::hub::proto::Outbound;
use crate::task::Task;
use journal::Journal;

/// Bumped when the file's shape changes incompatibly. 1 was one JSON document rewritten per
/// change (still read, and upgraded); 2 is the journal.
pub const STATE_VERSION: u32 = 2;

/// The whole state as one value: what a version-1 file held, and what [`read_state`] and
/// [`StateStore::save`] exchange. The daemon itself never holds all outbox frames at once.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PersistedState {
    /// Format version ([`STATE_VERSION`] when written now).
    pub version: u32,
    /// The one task this daemon works on, if any.
    pub active: Option<ActiveTask>,
    /// Terminal frames waiting for the hub's `task_ack`, oldest first.
    pub outbox: Vec<OutboxEntry>,
}

/// The task this daemon has accepted and not yet finished.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ActiveTask {
    /// The task as the hub assigned it.
    pub task: Task,
    /// Where it is in its life.
    pub phase: Phase,
    /// Wall clock, ms since the epoch, when it was accepted.
    pub accepted_at: i64,
    /// The task's trace (W3C `traceparent` of its root span) when OpenTelemetry export is
    /// on: kept here so a restarted daemon continues the same trace (`telemetry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// The name of its private directories when they were made ahead of it (see
    /// `workspace::dirs_name`); `None`: named after its id. Kept so that a restarted daemon
    /// keeps them for the task and finds them again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirs: Option<String>,
}

/// Where an active task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Persisted and acknowledged; work running.
    Running,
    /// Found on disk at start (or kept at a forced stop): ask the hub with `task_recovering`.
    Recovering,
}

/// A terminal frame (`task_complete`, `task_failed`, …) kept until the hub acknowledges it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutboxEntry {
    /// The task the frame is about.
    pub task_id: String,
    /// The frame, sent again as is after a reconnect.
    pub frame: Outbound,
    /// Wall clock, ms since the epoch: expiry counts from here.
    pub created_at: i64,
}

/// An outbox entry without its frame: what stays in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMeta {
    /// Unique within the file, increasing: the order entries were added.
    pub seq: u64,
    /// The task the frame is about.
    pub task_id: String,
    /// Wall clock, ms since the epoch: expiry counts from here.
    pub created_at: i64,
}

/// Why state could not be read or written. Callers branch: a write failure means "do not
/// accept tasks", a corrupt file means "start empty but keep the evidence".
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A change could not be made durable: the daemon must not accept tasks.
    #[error("cannot write state file {path}: {source}; check that the state directory exists, is writable and the disk is not full")]
    Write {
        /// The journal file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The file exists but could not be read.
    #[error("cannot read state file {path}: {source}")]
    Read {
        /// The journal file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
}

/// What [`StateStore::load`] found.
#[derive(Debug)]
pub struct Loaded {
    /// The task that was active when the daemon stopped, if any.
    pub active: Option<ActiveTask>,
    /// Outbox entries, oldest first (frames stay on disk: [`StateStore::entry`]).
    pub outbox: Vec<OutboxMeta>,
    /// Set when the file was corrupt: where it was moved, and the parse error.
    pub corrupt: Option<(PathBuf, String)>,
    /// Set when the last line was half-written (a crash mid-append): where those bytes were
    /// kept, and how many. The state is what the complete lines say.
    pub torn: Option<(PathBuf, u64)>,
    /// The file was in the version-1 format and has been rewritten as a journal.
    pub upgraded: bool,
}

/// Handle to the state journal. Clones share one open journal; all IO runs on the blocking
/// pool, one change at a time.
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
    journal: Arc<Mutex<Journal>>,
}

impl StateStore {
    /// A handle for `path`; nothing is read until [`StateStore::load`].
    pub fn new(path: impl Into<PathBuf>) -> StateStore {
        let path = path.into();
        StateStore {
            journal: Arc::new(Mutex::new(Journal::empty(path.clone()))),
            path,
        }
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Open and replay the journal; a missing file is an empty state, a corrupt one is moved
    /// aside, a torn tail is kept aside and cut off.
    pub async fn load(&self) -> Result<Loaded, StateError> {
        let path = self.path.clone();
        let (j, report) = tokio::task::spawn_blocking(move || Journal::load(path.clone()))
            .await
            .expect("state load task panicked")
            .map_err(|source| StateError::Read {
                path: self.path.clone(),
                source,
            })?;
        let loaded = Loaded {
            active: j.active().cloned(),
            outbox: j.outbox(),
            corrupt: report.corrupt,
            torn: report.torn,
            upgraded: report.upgraded,
        };
        *self.journal.lock().expect("state journal lock") = j;
        Ok(loaded)
    }

    /// Run `f` on the journal on the blocking pool.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Journal) -> T + Send + 'static,
    ) -> T {
        let j = self.journal.clone();
        tokio::task::spawn_blocking(move || f(&mut j.lock().expect("state journal lock")))
            .await
            .expect("state journal task panicked")
    }

    fn write_err(&self, source: std::io::Error) -> StateError {
        StateError::Write {
            path: self.path.clone(),
            source,
        }
    }

    /// Record the active task (or none). Returns once it is on disk. On error the change is
    /// still held in memory and written with the next change that succeeds.
    pub async fn set_active(&self, active: Option<ActiveTask>) -> Result<(), StateError> {
        self.with(move |j| j.set_active(active))
            .await
            .map_err(|e| self.write_err(e))
    }

    /// Add a terminal frame to the outbox, and with `active: Some(..)` also record the active
    /// task, in one durable write (the frame's line first: a crash in between keeps both the
    /// task and its result, never neither). The entry exists (and can be sent) even when the
    /// write failed; the error says it is not durable.
    pub async fn push(
        &self,
        entry: OutboxEntry,
        active: Option<Option<ActiveTask>>,
    ) -> (OutboxMeta, Result<(), StateError>) {
        let (meta, res) = self.with(move |j| j.push(entry, active)).await;
        (meta, res.map_err(|e| self.write_err(e)))
    }

    /// Remove outbox entries by sequence number.
    pub async fn remove(&self, seqs: Vec<u64>) -> Result<(), StateError> {
        self.with(move |j| j.remove(&seqs))
            .await
            .map_err(|e| self.write_err(e))
    }

    /// The full outbox entry for `seq` (its frame read back from disk); `None` if gone.
    pub async fn entry(&self, seq: u64) -> Result<Option<OutboxEntry>, StateError> {
        self.with(move |j| j.entry(seq))
            .await
            .map_err(|source| StateError::Read {
                path: self.path.clone(),
                source,
            })
    }

    /// Replace the whole state and write it durably (seeding a state, tools, tests).
    pub async fn save(&self, state: &PersistedState) -> Result<(), StateError> {
        let state = state.clone();
        self.with(move |j| j.replace(state))
            .await
            .map_err(|e| self.write_err(e))
    }
}

/// Read the whole state at `path` without changing the file (a torn tail is ignored). For
/// tests and inspection; the daemon uses [`StateStore`].
pub fn read_state(path: &Path) -> std::io::Result<PersistedState> {
    journal::read_only(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str) -> Task {
        Task::from_value(serde_json::json!({"task_id": id, "generation": 3})).unwrap()
    }

    fn active(id: &str) -> Option<ActiveTask> {
        Some(ActiveTask {
            task: task(id),
            phase: Phase::Running,
            accepted_at: 1,
            trace: None,
            dirs: None,
        })
    }

    fn entry(id: &str, text: &str) -> OutboxEntry {
        OutboxEntry {
            task_id: id.into(),
            frame: Outbound::task_failed(id, 2, text),
            created_at: 5,
        }
    }

    /// Open the journal again as a restarted daemon would.
    impl StateStore {
        async fn push_one(&self, e: OutboxEntry) -> (OutboxMeta, Result<(), StateError>) {
            self.push(e, None).await
        }
    }

    async fn reopen(path: &Path) -> (StateStore, Loaded) {
        let store = StateStore::new(path);
        let loaded = store.load().await.unwrap();
        (store, loaded)
    }

    #[tokio::test]
    async fn changes_survive_a_reopen_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/queue.json");
        let (store, empty) = reopen(&path).await;
        assert!(empty.active.is_none() && empty.outbox.is_empty() && empty.corrupt.is_none());
        store.set_active(active("t1")).await.unwrap();
        let (a, r) = store.push_one(entry("t0", "x")).await;
        r.unwrap();
        let (b, r) = store.push_one(entry("t2", "y")).await;
        r.unwrap();
        store.remove(vec![a.seq]).await.unwrap();
        let (store2, loaded) = reopen(&path).await;
        assert_eq!(loaded.active, active("t1"));
        assert_eq!(loaded.outbox, vec![b.clone()]);
        assert_eq!(store2.entry(b.seq).await.unwrap(), Some(entry("t2", "y")));
        assert_eq!(store2.entry(a.seq).await.unwrap(), None);
        assert!(!dir.path().join("sub/queue.json.tmp").exists());
        // The first write creates the file (header + active); then one line per change.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2 + 3, "{text}");
    }

    #[tokio::test]
    async fn save_and_read_state_exchange_a_whole_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queue.json");
        let st = PersistedState {
            version: STATE_VERSION,
            active: active("t1"),
            outbox: vec![entry("t0", "x"), entry("t9", "z")],
        };
        StateStore::new(&path).save(&st).await.unwrap();
        assert_eq!(read_state(&path).unwrap(), st);
    }

    #[tokio::test]
    async fn corrupt_file_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queue.json");
        std::fs::write(&path, b"{not json").unwrap();
        let loaded = StateStore::new(&path).load().await.unwrap();
        let (aside, err) = loaded.corrupt.unwrap();
        assert!(aside.to_string_lossy().contains("queue.json.corrupt-"));
        assert_eq!(std::fs::read(&aside).unwrap(), b"{not json");
        assert!(!err.is_empty());
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn a_bad_line_in_the_middle_is_corruption_not_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queue.json");
        let (store, _) = reopen(&path).await;
        store.set_active(active("t1")).await.unwrap();
        store.set_active(None).await.unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap();
        let second = text.find('\n').unwrap() + 1;
        text.replace_range(second..second + 3, "@@@");
        std::fs::write(&path, &text).unwrap();
        let (_, loaded) = reopen(&path).await;
        let (aside, err) = loaded.corrupt.expect("reported as corrupt");
        assert!(err.contains("more lines after it"), "{err}");
        assert_eq!(std::fs::read_to_string(aside).unwrap(), text);
        assert!(loaded.active.is_none() && loaded.torn.is_none());
    }

    #[tokio::test]
    async fn a_torn_last_line_is_kept_aside_and_cut_and_the_rest_is_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queue.json");
        let (store, _) = reopen(&path).await;
        store.set_active(active("t1")).await.unwrap();
        let (meta, r) = store.push_one(entry("t0", "kept")).await;
        r.unwrap();
        drop(store);
        // A crash in the middle of the next append: half a line, no newline.
        let good = std::fs::read(&path).unwrap();
        let torn = br#"{"op":"push","seq":9,"entry":{"task_id":"t5","fr"#;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, torn).unwrap();
        drop(f);
        let (store, loaded) = reopen(&path).await;
        let (aside, n) = loaded.torn.expect("torn tail reported");
        assert_eq!(n, torn.len() as u64);
        assert_eq!(std::fs::read(&aside).unwrap(), torn);
        assert!(loaded.corrupt.is_none());
        assert_eq!(loaded.active, active("t1"));
        assert_eq!(loaded.outbox, vec![meta.clone()]);
        assert_eq!(std::fs::read(&path).unwrap(), good, "tail not cut off");
        // Appends go on after the good part.
        store.remove(vec![meta.seq]).await.unwrap();
        let (_, again) = reopen(&path).await;
        assert!(again.outbox.is_empty() && again.torn.is_none());
    }

    #[tokio::test]
    async fn an_empty_file_is_an_empty_state_and_gets_a_header_on_the_first_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queue.json");
        std::fs::write(&path, b"").unwrap();
        let (store, loaded) = reopen(&path).await;
        assert!(loaded.active.is_none() && loaded.corrupt.is_none() && loaded.torn.is_none());
        store.set_active(active("t1")).await.unwrap();
        let (_, again) = reopen(&path).await;
        assert!(again.corrupt.is_none(), "{:?}", again.corrupt);
        assert_eq!(again.active, active("t1"));
    }

    #[tokio::test]
    async fn a_version_1_file_is_read_and_rewritten_as_a_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queue.json");
        let v1 = PersistedState {
            version: 1,
            active: active("old"),
            outbox: vec![entry("o1", "from v1")],
        };
        std::fs::write(&path, serde_json::to_vec_pretty(&v1).unwrap()).unwrap();
        let (store, loaded) = reopen(&path).await;
        assert!(loaded.upgraded && loaded.corrupt.is_none());
        assert_eq!(loaded.active, active("old"));
        let seq = loaded.outbox[0].seq;
        assert_eq!(
            store.entry(seq).await.unwrap(),
            Some(entry("o1", "from v1"))
        );
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with(r#"{"op":"header","version":2}"#));
    }

    #[tokio::test]
    async fn dead_lines_are_compacted_so_the_file_stays_proportional_to_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queue.json");
        let (store, _) = reopen(&path).await;
        let (keep, r) = store.push_one(entry("keep", &"k".repeat(1000))).await;
        r.unwrap();
        for i in 0..300 {
            let (m, r) = store
                .push_one(entry(&format!("t{i}"), &"x".repeat(1000)))
                .await;
            r.unwrap();
            store.remove(vec![m.seq]).await.unwrap();
        }
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len < 200 * 1024, "journal grew to {len} bytes");
        let (store, loaded) = reopen(&path).await;
        assert_eq!(loaded.outbox, vec![keep.clone()]);
        assert_eq!(
            store.entry(keep.seq).await.unwrap(),
            Some(entry("keep", &"k".repeat(1000)))
        );
    }

    #[tokio::test]
    async fn unwritable_dir_is_a_write_error_and_the_state_is_written_once_it_is_fixed() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("d");
        std::fs::write(&blocker, b"").unwrap();
        // A path *under a regular file* can never be created, even as root.
        let path = blocker.join("queue.json");
        let (store, _) = reopen(&path).await;
        let err = store.set_active(active("t1")).await.unwrap_err();
        assert!(matches!(err, StateError::Write { .. }));
        assert!(err.to_string().contains("writable"));
        let (meta, r) = store.push_one(entry("t0", "held in memory")).await;
        assert!(r.is_err());
        // Still sendable from memory.
        assert_eq!(
            store.entry(meta.seq).await.unwrap(),
            Some(entry("t0", "held in memory"))
        );
        std::fs::remove_file(&blocker).unwrap();
        store.set_active(None).await.unwrap();
        let (_, loaded) = reopen(&path).await;
        assert_eq!(loaded.outbox, vec![meta]);
    }

    #[tokio::test]
    async fn a_journal_deleted_under_the_daemon_is_written_again_in_full() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queue.json");
        let (store, _) = reopen(&path).await;
        let (meta, r) = store.push_one(entry("t0", "survives")).await;
        r.unwrap();
        std::fs::remove_file(&path).unwrap();
        store.set_active(active("t1")).await.unwrap();
        let st = read_state(&path).unwrap();
        assert_eq!(st.active, active("t1"));
        assert_eq!(st.outbox, vec![entry("t0", "survives")]);
        assert_eq!(reopen(&path).await.1.outbox, vec![meta]);
    }
}
