//! One task at a time per managed workspace: a lock file holding the owner's pid.

use std::path::{Path, PathBuf};

use super::WorkspaceError;

/// One task at a time per managed workspace: a lock file holding the owner's pid.
#[derive(Debug)]
pub struct WorkspaceLock {
    path: PathBuf,
}

impl WorkspaceLock {
    /// Take the lock, or take over one whose pid is no longer alive (a crashed run).
    pub async fn acquire(path: &Path) -> Result<WorkspaceLock, WorkspaceError> {
        // Written in full to a private file, then hard-linked into place: the link either
        // fails (held) or appears with the pid inside, so nobody ever reads a half-made lock.
        let me = std::process::id();
        let tmp = path.with_extension(format!("lock.{me}.tmp"));
        tokio::fs::write(&tmp, format!("{me}\n"))
            .await
            .map_err(WorkspaceError::io("write lock", &tmp))?;
        let res = Self::link(&tmp, path).await;
        let _ = tokio::fs::remove_file(&tmp).await;
        res
    }

    async fn link(tmp: &Path, path: &Path) -> Result<WorkspaceLock, WorkspaceError> {
        for _ in 0..3 {
            match tokio::fs::hard_link(tmp, path).await {
                Ok(()) => {
                    return Ok(WorkspaceLock {
                        path: path.to_path_buf(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = tokio::fs::read_to_string(path).await.unwrap_or_default();
                    match text.trim().parse::<u32>() {
                        Ok(pid) if pid_alive(pid) => {
                            return Err(WorkspaceError::Busy {
                                pid,
                                lock: path.to_path_buf(),
                            });
                        }
                        // Dead pid, or garbage: nobody holds it.
                        _ => {
                            tracing::warn!(lock = %path.display(), owner = %text.trim(), "taking over a stale workspace lock");
                            let _ = tokio::fs::remove_file(path).await;
                        }
                    }
                }
                Err(e) => return Err(WorkspaceError::io("create lock", path)(e)),
            }
        }
        Err(WorkspaceError::Io {
            action: "take workspace lock",
            path: path.to_path_buf(),
            source: std::io::Error::other(
                "it keeps reappearing after being removed as stale; is another daemon using this state_dir?",
            ),
        })
    }
}

impl Drop for WorkspaceLock {
    fn drop(&mut self) {
        // One unlink; Drop cannot await, and releasing on every path (cancel, panic) matters
        // more than avoiding a single fast syscall on the runtime.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether `pid` names a live process (EPERM counts: it exists, owned by someone else).
#[allow(unsafe_code)]
fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn workspace_lock_is_exclusive_and_a_dead_pid_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.lock");
        let l = WorkspaceLock::acquire(&p).await.unwrap();
        let e = WorkspaceLock::acquire(&p).await.unwrap_err();
        assert!(
            matches!(e, WorkspaceError::Busy { pid, .. } if pid == std::process::id()),
            "{e}"
        );
        assert!(e.to_string().contains("in use by process"), "{e}");
        drop(l);
        assert!(!p.exists());
        // A pid that cannot be alive: beyond pid_max on Linux.
        std::fs::write(&p, "2147483000\n").unwrap();
        let _l = WorkspaceLock::acquire(&p).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap().trim(),
            std::process::id().to_string()
        );
    }
}
