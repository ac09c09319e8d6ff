//! What a task's child does between `clone` and `exec` (`launch.rs` makes it): limits,
//! namespaces (the task's user, IPC and mount namespaces joined, see `view.rs` and `ipc.rs`,
//! and for `[network] mode = "none"` or `"allowlist"` the task's network namespace, see
//! `netns.rs`; a PID namespace of its own), a fresh session keyring, `no_new_privs`, the
//! Landlock domain and the refusal of the key calls (`keyring.rs`).
//!
//! It runs in the daemon's memory (see `launch.rs`), so it only makes system calls on data
//! prepared by the parent (no allocation, no locks): async-signal-safe by construction.
//!
//! With a PID namespace the child makes one more. The first stays outside the new namespace
//! as a tiny supervisor: it closes every descriptor, waits for the second (PID 1 of the
//! namespace, which execs the command) and exits with its status. When the command ends,
//! the kernel kills everything left in the namespace, so a `setsid()` or a double fork
//! cannot outlive it; when the supervisor is killed (timeout, cancel, the daemon dying), the
//! namespace's init gets SIGKILL through `PR_SET_PDEATHSIG`, and with it the whole tree.
//! The supervisor never enters the Landlock domain, so the confined command cannot ptrace
//! it (Landlock forbids tracing a less-restricted process), and it shares the daemon's
//! memory, which is non-dumpable, so that memory stays closed to other processes too.

#![allow(unsafe_code)]

use std::io;

/// Everything the child needs, prepared by the parent before `fork`.
#[derive(Debug, Clone)]
pub(crate) struct ChildPlan {
    /// `(resource, limit)`: soft and hard limit both set to `min(limit, current hard)`.
    pub rlimits: Vec<(libc::__rlimit_resource_t, libc::rlim_t)>,
    /// Join the task's user and mount namespaces (its view of the host's trees, in which
    /// its host sockets are hidden: see `view.rs`), then a PID namespace of its own.
    pub namespaces: Option<Join>,
    /// Also join the task's network namespace ([`Join::net`]), with only a loopback
    /// interface (up) and, under `allowlist`, the proxy's listener, which the daemon
    /// serves: the command reaches no other host and none of the host's loopback services.
    pub own_network: bool,
    /// A Landlock ruleset to enforce (the parent keeps it open; `restrict_self` never
    /// consumes it, so one ruleset serves every child of a task).
    pub landlock_fd: Option<i32>,
}

/// What a child joins: the descriptors of the task's user, mount and IPC namespaces and
/// its network namespace, which its view (`view.rs`) keeps open.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Join {
    pub user: libc::c_int,
    pub mnt: libc::c_int,
    pub ipc: libc::c_int,
    /// -1 when the view has none (the children keep the host's network).
    pub net: libc::c_int,
}

/// Contents written to `/proc/self/{uid_map,gid_map}`: the caller's own ids, mapped to
/// themselves, so files keep their owner and nothing else is mapped.
#[derive(Debug, Clone)]
pub(crate) struct IdMaps {
    pub uid_map: Vec<u8>,
    pub gid_map: Vec<u8>,
}

impl IdMaps {
    /// The maps for the current process's effective ids.
    pub(crate) fn current() -> IdMaps {
        // SAFETY: geteuid/getegid cannot fail and have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        IdMaps {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
        }
    }
}

impl ChildPlan {
    /// The resource limits. In the child, before anything else of the plan.
    ///
    /// # Safety
    ///
    /// Only in a child made by `launch.rs`, between `clone` and `exec`.
    pub(super) unsafe fn limit(&self) -> io::Result<()> {
        for &(res, want) in &self.rlimits {
            let mut cur = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(res, &mut cur) != 0 {
                return Err(io::Error::last_os_error());
            }
            let v = want.min(cur.rlim_max);
            let new = libc::rlimit {
                rlim_cur: v,
                rlim_max: v,
            };
            if libc::setrlimit(res, &new) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Join the task's user, IPC and mount namespaces (and its network namespace when
    /// `own_network`), then enter `cwd` through its view. The PID namespace is made after
    /// (see `launch.rs`).
    ///
    /// # Safety
    ///
    /// Only in a child made by `launch.rs` (single-threaded, its own `fs`), before `exec`;
    /// `cwd` is a NUL-terminated path.
    pub(super) unsafe fn join(&self, join: &Join, cwd: *const libc::c_char) -> io::Result<()> {
        // Of the namespace owner's uid, alone in its thread group and with a `fs` of its
        // own: all capabilities in the task's user namespace, which the mount namespace and
        // the PID namespace made next need. The IPC namespace after the user namespace: it
        // belongs to one nested in the task's, whose owner a child is (see `ipc.rs`). The
        // network namespace belongs to the task's. A child that should have one and finds
        // none fails rather than keep the host's.
        if self.own_network && join.net < 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // Joining a mount namespace moves to its root: the working directory is entered by
        // its path through the task's view, so `..` from it never names the host's tree.
        // One that the view does not show fails the spawn.
        if libc::setns(join.user, libc::CLONE_NEWUSER) != 0
            || (self.own_network && libc::setns(join.net, libc::CLONE_NEWNET) != 0)
            || libc::setns(join.ipc, libc::CLONE_NEWIPC) != 0
            || libc::setns(join.mnt, libc::CLONE_NEWNS) != 0
            || libc::setns(join.ipc, libc::CLONE_NEWIPC) != 0
            || libc::chdir(cwd) != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// A fresh session keyring, `no_new_privs`, the Landlock domain, the key calls
    /// refused: in the process that execs the command (the namespace's PID 1, with one).
    ///
    /// # Safety
    ///
    /// Only in a child made by `launch.rs`, between `clone` and `exec`.
    pub(super) unsafe fn confine(&self) -> io::Result<()> {
        super::keyring::join_fresh_session()?;
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(fd) = self.landlock_fd {
            if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        super::keyring::refuse_key_calls()
    }
}

/// Most descriptors [`send_fds`] sends at once.
pub(super) const MAX_SEND_FDS: usize = 5;

/// Send `fds` (at most [`MAX_SEND_FDS`]) over the unix socket `to` (`SCM_RIGHTS`, with one
/// byte of data as stream and seqpacket sockets need), from buffers on the stack.
///
/// # Safety
///
/// Async-signal-safe (no allocation); `to` and `fds` must be open descriptors.
pub(super) unsafe fn send_fds(to: libc::c_int, fds: &[libc::c_int]) -> io::Result<()> {
    if fds.is_empty() || fds.len() > MAX_SEND_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let len = std::mem::size_of_val(fds) as u32;
    // Room for the control message, aligned as `cmsghdr` wants.
    let mut control = [0u64; 6];
    const _: () = assert!(
        unsafe { libc::CMSG_SPACE((MAX_SEND_FDS * std::mem::size_of::<libc::c_int>()) as u32) }
            as usize
            <= 48
    );
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = libc::CMSG_SPACE(len) as _;
    let c = libc::CMSG_FIRSTHDR(&msg);
    (*c).cmsg_level = libc::SOL_SOCKET;
    (*c).cmsg_type = libc::SCM_RIGHTS;
    (*c).cmsg_len = libc::CMSG_LEN(len) as _;
    std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
    loop {
        if libc::sendmsg(to, &msg, libc::MSG_NOSIGNAL) == 1 {
            return Ok(());
        }
        if *libc::__errno_location() != libc::EINTR {
            return Err(io::Error::last_os_error());
        }
    }
}

/// The supervisor: hold nothing, wait for the namespace's init, exit as it did. Every
/// signal stays blocked (as `launch.rs` made it): the group's SIGTERM is for the command,
/// and only SIGKILL ends the supervisor early.
///
/// # Safety
///
/// Only in the supervisor `launch.rs` makes, once its PID 1 has exec'd.
pub(super) unsafe fn supervise(child: libc::pid_t, alive: libc::c_int) -> ! {
    // No output pipe, no error channel, no inherited descriptor stays open here (but the
    // `alive` pipe): the daemon sees EOF on the command's output when the command closes it.
    let alive = alive as u32;
    if alive > 0 {
        libc::syscall(libc::SYS_close_range, 0u32, alive - 1, 0u32);
    }
    libc::syscall(libc::SYS_close_range, alive + 1, u32::MAX, 0u32);
    let mut status: libc::c_int = 0;
    loop {
        // Any child: the namespace's init cannot finish dying until every process of the
        // namespace has been reaped.
        let r = libc::waitpid(-1, &mut status, 0);
        if r == child {
            break;
        }
        if r > 0 {
            continue;
        }
        if r < 0 && *libc::__errno_location() != libc::EINTR {
            libc::_exit(127);
        }
    }
    if libc::WIFEXITED(status) {
        libc::_exit(libc::WEXITSTATUS(status));
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // Die of the same signal, so the daemon reports "killed by signal N" as without
        // the namespace.
        let mut one: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut one);
        libc::sigaddset(&mut one, sig);
        libc::signal(sig, libc::SIG_DFL);
        libc::kill(libc::getpid(), sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
        libc::_exit(128 + sig);
    }
    libc::_exit(127)
}
