//! The same read-only routes as [`super::http`] (`/status`, `/healthz`, `/metrics`) on a
//! unix socket in the state directory, `state_dir/status.sock`, mode 0600: always on, and
//! only the service user can open it. `hub-sidecar status` tries it first, so it works
//! without `metrics_addr`.
//!
//! A task's children run as the service user too, and Landlock does not govern `connect()`
//! to a path socket, so the mode alone would let a task read the daemon's status. Every
//! connection is therefore admitted on its peer's credentials (`SO_PEERCRED`, see
//! [`admit`]): the service user or root, in the daemon's own user namespace. A confined
//! task's process is in a user namespace of its own and is refused. (With containment
//! off, or best-effort without namespaces, a task is not told apart from the operator.)

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Ops;

/// The socket's file name in the state directory.
pub const SOCKET_FILE: &str = "status.sock";

/// Where the daemon with state directory `state_dir` listens.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_FILE)
}

/// Bind `path` (replacing a stale socket left by a crash), restrict it to the owner, and
/// serve on a tracked task until `cancel`; the socket file is removed on the way out.
pub async fn start(
    path: PathBuf,
    ops: Ops,
    cancel: CancellationToken,
    tracker: &TaskTracker,
) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .with_context(|| format!("creating the state directory {}", dir.display()))?;
    }
    // A socket file outlives a crashed daemon; one daemon per state directory owns it.
    match tokio::fs::remove_file(&path).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e)
                .with_context(|| format!("removing the stale status socket {}", path.display()))
        }
        _ => {}
    }
    let listener = UnixListener::bind(&path).with_context(|| {
        format!(
            "cannot create the status socket {}; check that the state directory is writable",
            path.display()
        )
    })?;
    tokio::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .await
        .with_context(|| {
            format!(
                "restricting the status socket {} to its owner",
                path.display()
            )
        })?;
    tracker.spawn(serve(listener, path, ops, cancel));
    Ok(())
}

async fn serve(listener: UnixListener, path: PathBuf, ops: Ops, cancel: CancellationToken) {
    let conns = TaskTracker::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match admit(&stream) {
                    Ok(()) => {
                        conns.spawn(super::http::handle(stream, ops.clone()));
                    }
                    // Closed unanswered: a refused peer learns nothing, not even why.
                    Err(why) => tracing::warn!(reason = %why, "status socket: peer refused"),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "status socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    conns.close();
    conns.wait().await;
    let _ = tokio::fs::remove_file(&path).await;
}

/// Why a peer of the status socket is refused.
#[derive(Debug, thiserror::Error)]
pub enum PeerRefused {
    /// The kernel did not say who the peer is.
    #[error("cannot read the peer's credentials: {0}")]
    Credentials(std::io::Error),
    /// Another user (the socket's mode already keeps everyone but root out).
    #[error("peer uid {0} is neither the daemon's user nor root")]
    User(u32),
    /// No pid to look the peer's namespace up by.
    #[error("the peer's pid is unknown")]
    NoPid,
    /// The peer's user namespace could not be read (it may be gone).
    #[error("cannot read the user namespace of pid {pid}: {source}")]
    Namespace {
        /// The peer's pid.
        pid: i32,
        /// Why.
        source: std::io::Error,
    },
    /// The peer runs in another user namespace: a confined task.
    #[error("pid {pid} is in another user namespace ({theirs}, the daemon's is {ours}): a sandboxed process")]
    Sandboxed {
        /// The peer's pid.
        pid: i32,
        /// Its user namespace.
        theirs: String,
        /// The daemon's.
        ours: String,
    },
}

/// Admit `stream`'s peer: the daemon's user (or root) in the daemon's user namespace.
pub fn admit(stream: &tokio::net::UnixStream) -> Result<(), PeerRefused> {
    let cred = stream.peer_cred().map_err(PeerRefused::Credentials)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let me = unsafe { libc::geteuid() };
    if cred.uid() != me && cred.uid() != 0 {
        return Err(PeerRefused::User(cred.uid()));
    }
    let pid = cred.pid().filter(|p| *p > 0).ok_or(PeerRefused::NoPid)?;
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/user"));
    let theirs = ns(&pid.to_string()).map_err(|source| PeerRefused::Namespace { pid, source })?;
    let ours = ns("self").map_err(|source| PeerRefused::Namespace { pid, source })?;
    if theirs != ours {
        return Err(PeerRefused::Sandboxed {
            pid,
            theirs: theirs.display().to_string(),
            ours: ours.display().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn serves_status_to_the_owner_only_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path());
        std::fs::write(&p, "stale").unwrap();
        let ops = Ops::new();
        ops.set_active_task(Some("t-1"));
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        start(p.clone(), ops, cancel.clone(), &tracker)
            .await
            .unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mut s = tokio::net::UnixStream::connect(&p).await.unwrap();
        s.write_all(b"GET /status HTTP/1.1\r\n\r\n").await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.contains("\"active_task\":\"t-1\""), "{out}");
        cancel.cancel();
        tracker.close();
        tokio::time::timeout(Duration::from_secs(5), tracker.wait())
            .await
            .unwrap();
        assert!(!p.exists(), "the socket file is removed on stop");
    }
}
