//! How much disk the flight recorder may use when the config does not say: one agent's
//! share of a host-wide budget, sized to the disk that holds the records.
//!
//! - **The host budget** is 1 % of the file system holding the state directory (its size,
//!   `statvfs`, not its free space, so the figure does not move with other files), at least
//!   256 MiB and at most 16 GiB.
//! - **The agents of a host** are the daemons whose state directories sit side by side: the
//!   template unit gives each instance `/var/lib/hub-sidecar/NAME`. A directory next to this
//!   agent's that holds a state file (`queue.json`) is another agent; each agent counts
//!   itself.
//! - **One agent's share** is the host budget divided by the agents, between 16 MiB and the
//!   256 MiB every agent had before. `max_task_bytes`, when unset, is 4 MiB or a quarter of
//!   the share if that is less, so a handful of the largest records always fit.
//! - **When**: at start, and again after a task at most every [`RESIZE_EVERY`], so agents
//!   added later shrink everyone's share without a restart.
//!
//! Explicit `[recorder] max_total_bytes` / `max_task_bytes` always win. docs/operations.md ("Many agents
//! on one host") has the arithmetic for a 50-agent host.

use std::path::Path;
use std::time::Duration;

use crate::config::RecorderConfig;

const MIB: u64 = 1024 * 1024;
/// The host budget: this fraction of the file system (1 / 100)…
const HOST_FRACTION: u64 = 100;
/// …but at least this much (a small disk still keeps some history)…
const HOST_MIN: u64 = 256 * MIB;
/// …and at most this much (a huge disk does not make records more useful).
const HOST_MAX: u64 = 16 * 1024 * MIB;
/// One agent's share: at least this much (four of the largest records)…
const SHARE_MIN: u64 = 16 * MIB;
/// …and at most the fixed default every agent had before.
const SHARE_MAX: u64 = 256 * MIB;
/// Output and events one task's record keeps, unless the share is small.
const TASK_MAX: u64 = 4 * MIB;
/// The state file whose presence makes a directory another agent's.
const AGENT_MARK: &str = "queue.json";

/// How often a sized budget is counted again (after a task, never during one).
pub const RESIZE_EVERY: Duration = Duration::from_secs(600);

/// The recorder's bounds in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Most bytes all of this agent's records may take together.
    pub total: u64,
    /// Most bytes of streamed output and events one task's record keeps.
    pub per_task: u64,
}

/// The bounds for an agent whose state directory is `state_dir`: the configured ones, or
/// its share of the host (see the module docs). Blocking: a `statvfs` and a listing of the
/// directory that holds `state_dir`.
pub fn resolve(cfg: &RecorderConfig, state_dir: &Path) -> Budget {
    let share = match cfg.max_total_bytes {
        Some(total) => total,
        None => share_of_host(fs_size(state_dir), agents_beside(state_dir)),
    };
    Budget {
        total: share,
        per_task: cfg.max_task_bytes.unwrap_or_else(|| task_bound(share)),
    }
}

/// One agent's share when `agents` agents keep records on a file system of `fs_bytes`
/// (`None`: its size is unknown, and the host budget is its minimum).
pub fn share_of_host(fs_bytes: Option<u64>, agents: usize) -> u64 {
    let host = fs_bytes.map_or(HOST_MIN, |b| (b / HOST_FRACTION).clamp(HOST_MIN, HOST_MAX));
    (host / agents.max(1) as u64).clamp(SHARE_MIN, SHARE_MAX)
}

/// The per-task bound that goes with a share of `total`: a quarter of it, at most 4 MiB.
pub fn task_bound(total: u64) -> u64 {
    (total / 4).min(TASK_MAX)
}

/// Size of the file system holding `dir`, in bytes.
fn fs_size(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    // The state directory may not exist yet on a first start: its parent is on the same
    // file system in every layout that matters here.
    let dir = dir.ancestors().find(|d| d.exists())?;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes one struct we own and reads a NUL-terminated path we own.
    #[allow(unsafe_code)]
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c.as_ptr(), &mut st) == 0).then_some(st)
    }?;
    Some((st.f_blocks as u64).saturating_mul(st.f_frsize as u64))
}

/// This agent and the agents whose state directories are its siblings.
fn agents_beside(state_dir: &Path) -> usize {
    let Some(parent) = state_dir.parent() else {
        return 1;
    };
    let me = state_dir.file_name();
    let others = std::fs::read_dir(parent)
        .map(|rd| {
            rd.flatten()
                .filter(|e| Some(e.file_name().as_os_str()) != me)
                .filter(|e| e.path().join(AGENT_MARK).is_file())
                .count()
        })
        .unwrap_or(0);
    1 + others
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1024 * MIB;

    #[test]
    fn one_agent_keeps_the_old_default_and_many_share_one_percent_of_the_disk() {
        // A 256 GiB disk: the host budget is 1 % of it, 2.56 GiB.
        let disk = Some(256 * GIB);
        assert_eq!(
            share_of_host(disk, 1),
            256 * MIB,
            "capped at the old default"
        );
        assert_eq!(share_of_host(disk, 10), 256 * MIB);
        // 50 agents: 2.56 GiB / 50 = 52.4 MiB each, 2.56 GiB for the host (was 12.5 GiB).
        let each = share_of_host(disk, 50);
        assert_eq!(each, 256 * GIB / 100 / 50);
        assert!(each * 50 <= 256 * GIB / 100);
        // A small disk still gives each agent a useful record history, and a huge one does
        // not give a few agents more than before.
        assert_eq!(share_of_host(Some(10 * GIB), 50), SHARE_MIN);
        assert_eq!(share_of_host(Some(100 * GIB), 1), 256 * MIB);
        assert_eq!(share_of_host(Some(4096 * GIB), 50), 256 * MIB);
        assert_eq!(share_of_host(Some(4096 * GIB), 100), 16 * GIB / 100);
        assert_eq!(share_of_host(None, 1), 256 * MIB);
        assert_eq!(share_of_host(None, 0), 256 * MIB);
    }

    #[test]
    fn the_task_bound_is_a_quarter_of_a_small_share() {
        assert_eq!(task_bound(256 * MIB), 4 * MIB);
        assert_eq!(task_bound(SHARE_MIN), 4 * MIB);
        assert_eq!(task_bound(8 * MIB), 2 * MIB);
    }

    #[test]
    fn siblings_with_a_state_file_are_agents_and_configured_bounds_win() {
        let host = tempfile::tempdir().unwrap();
        let me = host.path().join("worker-01");
        std::fs::create_dir_all(&me).unwrap();
        std::fs::write(me.join(AGENT_MARK), "").unwrap();
        // A sibling directory without a state file (another service's) is not an agent.
        std::fs::create_dir_all(host.path().join("other-service")).unwrap();
        assert_eq!(agents_beside(&me), 1);
        for n in 2..=4 {
            let d = host.path().join(format!("worker-0{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(AGENT_MARK), "").unwrap();
        }
        assert_eq!(agents_beside(&me), 4);
        // A state directory that does not exist yet counts too (first start).
        assert_eq!(agents_beside(&host.path().join("worker-05")), 5);

        let sized = resolve(&RecorderConfig::default(), &me);
        assert_eq!(
            sized.total,
            share_of_host(fs_size(host.path()), 4),
            "{sized:?}"
        );
        assert_eq!(sized.per_task, task_bound(sized.total));
        let set = RecorderConfig {
            max_total_bytes: Some(5 * MIB),
            max_task_bytes: Some(MIB),
            ..RecorderConfig::default()
        };
        assert_eq!(
            resolve(&set, &me),
            Budget {
                total: 5 * MIB,
                per_task: MIB
            }
        );
        let only_total = RecorderConfig {
            max_total_bytes: Some(8 * MIB),
            ..RecorderConfig::default()
        };
        assert_eq!(resolve(&only_total, &me).per_task, 2 * MIB);
    }
}
