//! The daemon's file descriptors, so that nothing a task does with the proxy starves the
//! daemon of them: the hub link, `/healthz`, the status socket, the recorder and the
//! children's pipes always find one.
//!
//! - At start the soft `RLIMIT_NOFILE` is raised to the hard limit ([`raise_limit`]; the
//!   units set `LimitNOFILE=` so the hard limit is ample). Children confined by a sandbox
//!   get `[sandbox] max_open_files` instead.
//! - The proxy holds at most [`proxy_connections`] connections of a task at once, computed
//!   from the soft limit so that [`RESERVE`] descriptors always stay for everything else;
//!   a connection beyond it is answered 503 and closed at once.

/// Descriptors kept for the daemon's own work, beyond what the proxy may hold.
pub const RESERVE: u64 = 256;
/// Most connections a task's proxy holds at once, however high the limit.
pub const MAX_PROXY_CONNECTIONS: usize = 256;
/// Descriptors one proxied connection holds at most: the task's socket, the host's, and a
/// pipe (two descriptors) for each direction of the splice.
const PER_CONNECTION: u64 = 6;
/// A proxy gets at least this many connections, even under a tiny limit.
const MIN_PROXY_CONNECTIONS: usize = 4;

/// The soft `RLIMIT_NOFILE` now.
pub fn soft_limit() -> u64 {
    getrlimit().map_or(1024, |l| l.rlim_cur)
}

fn getrlimit() -> Option<libc::rlimit> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one struct we own.
    #[allow(unsafe_code)]
    let r = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) };
    (r == 0).then_some(l)
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit: the daemon's start. Returns the soft
/// limit before and after (equal when nothing changed or the kernel refused).
pub fn raise_limit() -> (u64, u64) {
    let Some(l) = getrlimit() else {
        return (1024, 1024);
    };
    if l.rlim_cur >= l.rlim_max {
        return (l.rlim_cur, l.rlim_cur);
    }
    let raised = libc::rlimit {
        rlim_cur: l.rlim_max,
        rlim_max: l.rlim_max,
    };
    // SAFETY: setrlimit reads one struct we own.
    #[allow(unsafe_code)]
    let r = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
    if r != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), soft = l.rlim_cur, hard = l.rlim_max, "cannot raise the open-files limit");
        return (l.rlim_cur, l.rlim_cur);
    }
    (l.rlim_cur, l.rlim_max)
}

/// The connections a task's proxy may hold at once under a soft limit of `limit`
/// descriptors: [`MAX_PROXY_CONNECTIONS`], or what leaves [`RESERVE`] free.
pub fn proxy_connections(limit: u64) -> usize {
    let spare = limit.saturating_sub(RESERVE) / PER_CONNECTION;
    usize::try_from(spare)
        .unwrap_or(usize::MAX)
        .clamp(MIN_PROXY_CONNECTIONS, MAX_PROXY_CONNECTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_leaves_the_reserve_free_under_any_limit() {
        assert_eq!(proxy_connections(1024), (1024 - 256) / 6);
        assert!(proxy_connections(1024) as u64 * PER_CONNECTION + RESERVE <= 1024);
        assert_eq!(proxy_connections(1 << 20), MAX_PROXY_CONNECTIONS);
        assert_eq!(proxy_connections(100), MIN_PROXY_CONNECTIONS);
    }
}
