//! The crash-safe state file (`queue.json`): the active task and the outbox of terminal
//! frames not yet acknowledged by the hub.
//!
//! Every change is written atomically (temp file, fsync, rename, fsync of the directory)
//! *before* the hub is told anything that depends on it: a task is on disk before
//! `task_accepted`, a result is in the outbox before it is sent. A file that cannot be
//! parsed is moved aside (`queue.json.corrupt-<ms>`) and reported, never silently replaced.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::hub::proto::Outbound;
use crate::task::Task;

/// Bumped when the file's shape changes incompatibly.
pub const STATE_VERSION: u32 = 1;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PersistedState {
    pub version: u32,
    /// The one task this daemon works on, if any.
    pub active: Option<ActiveTask>,
    /// Terminal frames waiting for the hub's `task_ack`, oldest first.
    pub outbox: Vec<OutboxEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ActiveTask {
    pub task: Task,
    pub phase: Phase,
    pub accepted_at: i64,
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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutboxEntry {
    pub task_id: String,
    pub frame: Outbound,
    pub created_at: i64,
}

/// Why state could not be read or written. Callers branch: a write failure means "do not
/// accept tasks", a corrupt file means "start empty but keep the evidence".
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot write state file {path}: {source}; check that the state directory exists, is writable and the disk is not full")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read state file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What [`StateStore::load`] found.
#[derive(Debug)]
pub struct Loaded {
    pub state: PersistedState,
    /// Set when the file was corrupt: where it was moved, and the parse error.
    pub corrupt: Option<(PathBuf, String)>,
}

/// Reads and writes the state file. All IO runs on the blocking pool.
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
}

impl StateStore {
    pub fn new(path: impl Into<PathBuf>) -> StateStore {
        StateStore { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Load the state; a missing file is an empty state, a corrupt one is moved aside.
    pub async fn load(&self) -> Result<Loaded, StateError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || load_blocking(&path))
            .await
            .expect("state load task panicked")
    }

    /// Write the state durably. Returns only after the data and the rename are on disk.
    pub async fn save(&self, state: &PersistedState) -> Result<(), StateError> {
        let bytes = serde_json::to_vec_pretty(state).expect("state always serializes");
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            write_atomic(&path, &bytes).map_err(|source| StateError::Write { path, source })
        })
        .await
        .expect("state save task panicked")
    }
}

fn load_blocking(path: &Path) -> Result<Loaded, StateError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Loaded {
                state: PersistedState {
                    version: STATE_VERSION,
                    ..Default::default()
                },
                corrupt: None,
            })
        }
        // No file can exist at a path under a regular file (ENOTDIR) or that is a directory
        // (EISDIR): there is no state to load. Start empty; the first save fails and the
        // daemon refuses tasks with `state_not_persistable` instead of refusing to run.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::EISDIR)) => {
            return Ok(Loaded {
                state: PersistedState {
                    version: STATE_VERSION,
                    ..Default::default()
                },
                corrupt: None,
            })
        }
        Err(source) => {
            return Err(StateError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    match serde_json::from_slice::<PersistedState>(&bytes) {
        Ok(state) => Ok(Loaded {
            state,
            corrupt: None,
        }),
        Err(e) => {
            let aside = PathBuf::from(format!(
                "{}.corrupt-{}",
                path.display(),
                crate::util::now_ms()
            ));
            std::fs::rename(path, &aside).map_err(|source| StateError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            Ok(Loaded {
                state: PersistedState {
                    version: STATE_VERSION,
                    ..Default::default()
                },
                corrupt: Some((aside, e.to_string())),
            })
        }
    }
}

/// temp file in the same directory → write → fsync → rename over → fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
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

    fn task(id: &str) -> Task {
        Task::from_value(serde_json::json!({"task_id": id, "generation": 3})).unwrap()
    }

    #[tokio::test]
    async fn roundtrip_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("sub/queue.json"));
        let empty = store.load().await.unwrap();
        assert!(empty.state.active.is_none() && empty.corrupt.is_none());
        let st = PersistedState {
            version: STATE_VERSION,
            active: Some(ActiveTask {
                task: task("t1"),
                phase: Phase::Running,
                accepted_at: 1,
            }),
            outbox: vec![OutboxEntry {
                task_id: "t0".into(),
                frame: Outbound::task_failed("t0", 2, "x"),
                created_at: 5,
            }],
        };
        store.save(&st).await.unwrap();
        assert_eq!(store.load().await.unwrap().state, st);
        assert!(!dir.path().join("sub/queue.json.tmp").exists());
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
    async fn unwritable_dir_is_a_write_error() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"").unwrap();
        // A path *under a regular file* can never be created, even as root.
        let store = StateStore::new(blocker.join("queue.json"));
        let err = store.save(&PersistedState::default()).await.unwrap_err();
        assert!(matches!(err, StateError::Write { .. }));
        assert!(err.to_string().contains("writable"));
    }
}
