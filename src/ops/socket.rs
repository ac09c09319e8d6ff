//! The same read-only routes as [`super::http`] (`/status`, `/healthz`, `/metrics`) on a
//! unix socket in the state directory, `state_dir/status.sock`, mode 0600: always on, and
//! only the service user can open it. `hub-sidecar status` tries it first, so it works
//! without `metrics_addr`.

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
                Ok((stream, _)) => {
                    conns.spawn(super::http::handle(stream, ops.clone()));
                }
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
