//! A task's own IPC namespace: SysV shared memory, message queues and semaphores and POSIX
//! message queues that no other task and not the host can name, bounded, and gone with the
//! task (the kernel destroys every object of an IPC namespace with it).
//!
//! The view's holder (`view.rs`) makes it after the task's user and mount namespaces, and
//! every child joins it (`child.rs`). Made as the task's own user namespace would make it,
//! its limits (`kernel.shmmax`, `shmall`, `msgmni`, `sem`, which are per IPC namespace)
//! could not be written by a service user: the kernel lets only the
//! namespace owner's root write them, and a task's user namespace maps the service user to
//! itself, not to root. So the holder first enters one more user namespace, nested in the
//! task's, mapping its own id to root, and makes the IPC namespace there: its root is the
//! holder's own id, it writes the limits, and each child, the owner of that nested
//! namespace's parent, may join the IPC namespace from the task's user namespace (the
//! kernel grants the owner of a user namespace every capability in it). The children never
//! enter the nested namespace; writing the limits back is closed to them by Landlock
//! (`/proc` is read-only to them).
//!
//! They are written through `/proc/sys/kernel`, which must be writable in the daemon's mount
//! namespace: systemd's `ProtectKernelTunables=` makes all of `/proc/sys` read-only, so the
//! shipped units give `/proc/sys/kernel` back (`ReadWritePaths=`; the service user still
//! cannot write the host's own tunables, which are root's). Where it stays read-only the
//! holder fails, and with it the task's sandbox: strict refuses work and says why.
//!
//! Why bounds: a shared-memory segment is not the memory of any process (`RLIMIT_DATA`
//! never counts a shared mapping, and a segment needs no mapping to exist), so without
//! them a task holds as much as the host's defaults allow (on 64-bit: all of it).
//!
//! The holder never execs: only raw system calls on data prepared before the fork, as in
//! the rest of the holder. Hence `unsafe` here.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;

/// Most message queues a task's IPC namespace holds (the host's default is 32,000): with
/// the default 16 KiB a queue (`kernel.msgmnb`), at most 512 KiB of message text and the
/// headers of at most 16,384 empty messages a queue.
pub(crate) const MAX_QUEUES: u64 = 32;

/// `kernel.sem` in a task's namespace: at most 250 semaphores a set, 32,000 in all, 100
/// operations a call, 128 sets (the host's default lets 32,000 sets of 32,000 each).
pub(crate) const SEM: &str = "250 32000 100 128";

/// What the holder writes, prepared before the fork.
#[derive(Debug, Clone)]
pub(crate) struct IpcPlan {
    /// The nested user namespace's maps: the holder's ids as root.
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// `(path under /proc/sys, value)`, written in the new IPC namespace.
    limits: Vec<(CString, Vec<u8>)>,
}

impl IpcPlan {
    /// The plan for tasks whose processes may each have `max_memory_mb` MiB (0: no limit).
    /// A task's shared memory in all is bounded by the same figure: it never holds more in
    /// segments than one of its processes may hold privately.
    pub(crate) fn new(max_memory_mb: u64) -> IpcPlan {
        // SAFETY: geteuid, getegid and sysconf cannot fail in a way that matters here and
        // have no preconditions.
        let (uid, gid, page) = unsafe {
            (
                libc::geteuid(),
                libc::getegid(),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let page = u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096);
        let mut limits = vec![
            ("kernel/msgmni", MAX_QUEUES.to_string()),
            ("kernel/sem", SEM.to_string()),
        ];
        if max_memory_mb > 0 {
            let bytes = max_memory_mb.saturating_mul(1024 * 1024);
            limits.push(("kernel/shmmax", bytes.to_string()));
            limits.push(("kernel/shmall", (bytes / page).max(1).to_string()));
        }
        IpcPlan {
            uid_map: format!("0 {uid} 1\n").into_bytes(),
            gid_map: format!("0 {gid} 1\n").into_bytes(),
            limits: limits
                .into_iter()
                .filter_map(|(name, value)| {
                    let path = CString::new(format!("/proc/sys/{name}")).ok()?;
                    Some((path, format!("{value}\n").into_bytes()))
                })
                .collect(),
        }
    }
}

/// In the holder, after the task's view is made: the nested user namespace, the IPC
/// namespace in it, its limits written; a descriptor of the IPC namespace.
///
/// # Safety
///
/// Only in the holder (single-threaded, between `fork` and `_exit`); `plan` was prepared
/// before the fork.
pub(super) unsafe fn make(plan: &IpcPlan) -> io::Result<libc::c_int> {
    if libc::unshare(libc::CLONE_NEWUSER) != 0 {
        return Err(io::Error::last_os_error());
    }
    // Dumpable for the map writes, as for the task's own maps (see `view.rs`).
    if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    let mapped = write_proc(c"/proc/self/setgroups", b"deny")
        .and_then(|()| write_proc(c"/proc/self/gid_map", &plan.gid_map))
        .and_then(|()| write_proc(c"/proc/self/uid_map", &plan.uid_map));
    if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    mapped?;
    if libc::unshare(libc::CLONE_NEWIPC) != 0 {
        return Err(io::Error::last_os_error());
    }
    for (path, value) in &plan.limits {
        write_proc(path, value)?;
    }
    let fd = libc::open(
        c"/proc/self/ns/ipc".as_ptr(),
        libc::O_RDONLY | libc::O_CLOEXEC,
    );
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Write `data` to the `/proc` file `path` in one call.
pub(super) unsafe fn write_proc(path: &CStr, data: &[u8]) -> io::Result<()> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = libc::write(fd, data.as_ptr().cast(), data.len());
    let err = io::Error::last_os_error();
    libc::close(fd);
    if n != data.len() as isize {
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_memory_of_a_task_is_bounded_by_its_memory_limit() {
        let plan = IpcPlan::new(192);
        let get = |name: &str| {
            plan.limits
                .iter()
                .find(|(p, _)| p.to_bytes() == format!("/proc/sys/{name}").as_bytes())
                .map(|(_, v)| String::from_utf8_lossy(v).trim().to_string())
        };
        assert_eq!(get("kernel/shmmax").as_deref(), Some("201326592"));
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        let all = (192 * 1024 * 1024 / page).to_string();
        assert_eq!(get("kernel/shmall"), Some(all));
        assert_eq!(get("kernel/msgmni").as_deref(), Some("32"));
        // No memory limit: the other bounds still hold, shared memory keeps the host's.
        let open = IpcPlan::new(0);
        assert!(open
            .limits
            .iter()
            .all(|(p, _)| !p.to_bytes().starts_with(b"/proc/sys/kernel/shm")));
        assert_eq!(open.limits.len(), 2);
    }
}
