//! The code that runs in a forked child between `fork` and `exec`: limits, namespaces
//! (user, PID and, for `[network] mode = "none"`, network), `no_new_privs` and the Landlock
//! domain.
//!
//! It runs in a copy of a multi-threaded process, so it only makes raw system calls on data
//! prepared by the parent (no allocation, no locks): async-signal-safe by construction.
//!
//! With a PID namespace the child forks once more. The first child stays outside the new
//! namespace as a tiny supervisor: it closes every descriptor, waits for the second child
//! (PID 1 of the namespace, which execs the command) and exits with its status. When the
//! command ends, the kernel kills everything left in the namespace, so a `setsid()` or a
//! double fork cannot outlive it; when the supervisor is killed (timeout, cancel, the daemon
//! dying), the namespace's init gets SIGKILL through `PR_SET_PDEATHSIG`, and with it the
//! whole tree. The supervisor never enters the Landlock domain, so the confined command
//! cannot ptrace it (Landlock forbids tracing a less-restricted process), and it inherits
//! the daemon's non-dumpable flag, so its memory stays closed to other processes too.

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;

/// Everything the child needs, prepared by the parent before `fork`.
#[derive(Debug, Clone)]
pub(crate) struct ChildPlan {
    /// `(resource, limit)`: soft and hard limit both set to `min(limit, current hard)`.
    pub rlimits: Vec<(libc::__rlimit_resource_t, libc::rlim_t)>,
    /// New user + PID namespace with these `uid_map` / `gid_map` contents.
    pub namespaces: Option<IdMaps>,
    /// Also a network namespace of its own, with only a loopback interface (up): the
    /// command reaches no other host and none of the host's loopback services.
    pub own_network: bool,
    /// With `own_network`: relay `127.0.0.1:`[`RELAY_PORT`] inside the namespace to this unix
    /// socket (the daemon's proxy), the children's only way out.
    pub relay_to: Option<UnixPath>,
    /// A Landlock ruleset to enforce (the parent keeps it open; `restrict_self` never
    /// consumes it, so one ruleset serves every child of a task).
    pub landlock_fd: Option<i32>,
}

/// The port the relay listens on inside a task's network namespace (each task has its
/// own namespace, so a fixed port cannot collide).
pub(crate) const RELAY_PORT: u16 = 3128;

/// A unix socket path as `sockaddr_un` wants it, prepared before the fork.
#[derive(Debug, Clone)]
pub(crate) struct UnixPath {
    bytes: [u8; 107],
    len: usize,
}

impl UnixPath {
    /// `None` when the path is too long for `sockaddr_un` (107 bytes).
    pub(crate) fn new(path: &std::path::Path) -> Option<UnixPath> {
        use std::os::unix::ffi::OsStrExt;
        let b = path.as_os_str().as_bytes();
        if b.len() >= 107 || b.contains(&0) {
            return None;
        }
        let mut bytes = [0u8; 107];
        bytes[..b.len()].copy_from_slice(b);
        Some(UnixPath {
            bytes,
            len: b.len(),
        })
    }
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
    /// Apply the plan to the calling (freshly forked) process. Only for `pre_exec`.
    ///
    /// # Safety
    ///
    /// Must run in a single-threaded child between `fork` and `exec`.
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
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
        if let Some(maps) = &self.namespaces {
            enter_namespaces(maps, self.own_network, self.relay_to.as_ref())?;
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(fd) = self.landlock_fd {
            if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// New user and PID namespaces (and a network namespace when `own_network`); returns in the
/// namespace's PID 1 (see the module docs).
unsafe fn enter_namespaces(
    maps: &IdMaps,
    own_network: bool,
    relay_to: Option<&UnixPath>,
) -> io::Result<()> {
    let net = if own_network { libc::CLONE_NEWNET } else { 0 };
    if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID | net) != 0 {
        return Err(io::Error::last_os_error());
    }
    // The daemon is non-dumpable (`protect_daemon`), and so is this fork of it: the kernel
    // then makes `/proc/self/*` belong to root, and a service user cannot open its own id
    // maps (EACCES; root can, which is why only a deployment saw it). Dumpable just for the
    // three writes, as container runtimes do, then closed again before anything else runs:
    // nothing of the task exists yet, and confined processes of earlier tasks cannot trace
    // us (Landlock forbids tracing a less-restricted process; they are in other namespaces).
    if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    let mapped = write_maps(maps);
    if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    mapped?;
    let mut listener = -1;
    if own_network {
        // As the new user namespace's owner we hold CAP_NET_ADMIN over its network namespace.
        loopback_up()?;
        if relay_to.is_some() {
            // Listening before the command exists: its first connection cannot race us.
            listener = relay_listener()?;
        }
    }
    // A pipe whose write end only the supervisor keeps: when it reads as hung up, the
    // supervisor is gone (pids are useless for this: the supervisor is outside the new
    // namespace and its pid means nothing inside).
    let mut alive = [0 as libc::c_int; 2];
    if libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
        return Err(io::Error::last_os_error());
    }
    let pid = libc::fork();
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid > 0 {
        if let (Some(to), true) = (relay_to, listener >= 0) {
            // Forked after the command's init, so it lives in the task's PID namespace and
            // dies with it.
            let r = libc::fork();
            if r == 0 {
                relay(listener, to);
            }
            libc::close(listener);
        }
        supervise(pid, alive[1]);
    }
    libc::close(alive[1]);
    if listener >= 0 {
        libc::close(listener);
    }
    // PID 1 of the new namespace. If the supervisor dies, so do we (and so the namespace).
    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    // The supervisor may have died before the line above, unnoticed: check once.
    let mut pfd = libc::pollfd {
        fd: alive[0],
        events: libc::POLLIN,
        revents: 0,
    };
    if libc::poll(&mut pfd, 1, 0) != 0 {
        libc::_exit(137);
    }
    // alive[0] is close-on-exec: the command never sees it.
    Ok(())
}

/// Bring `lo` up in a fresh network namespace (it starts down): tools that talk to
/// themselves over 127.0.0.1 (test servers, language servers) keep working.
unsafe fn loopback_up() -> io::Result<()> {
    let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut req: libc::ifreq = std::mem::zeroed();
    req.ifr_name[0] = b'l' as libc::c_char;
    req.ifr_name[1] = b'o' as libc::c_char;
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    let r = libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req);
    let err = io::Error::last_os_error();
    libc::close(fd);
    if r != 0 {
        return Err(err);
    }
    Ok(())
}

/// A TCP listener on `127.0.0.1:RELAY_PORT` in the task's network namespace.
unsafe fn relay_listener() -> io::Result<libc::c_int> {
    let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut addr: libc::sockaddr_in = std::mem::zeroed();
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_port = RELAY_PORT.to_be();
    addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    if libc::bind(fd, (&addr as *const libc::sockaddr_in).cast(), len) != 0
        || libc::listen(fd, 128) != 0
    {
        let err = io::Error::last_os_error();
        libc::close(fd);
        return Err(err);
    }
    Ok(fd)
}

/// The relay: every connection to the listener is piped, by a child of its own, to the
/// daemon's proxy socket. Holds nothing else open. Never returns.
unsafe fn relay(listener: libc::c_int, to: &UnixPath) -> ! {
    let l = listener as u32;
    if l > 0 {
        libc::syscall(libc::SYS_close_range, 0u32, l - 1, 0u32);
    }
    libc::syscall(libc::SYS_close_range, l + 1, u32::MAX, 0u32);
    // Connection children are reaped by the kernel.
    libc::signal(libc::SIGCHLD, libc::SIG_IGN);
    let mut addr: libc::sockaddr_un = std::mem::zeroed();
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(&to.bytes[..to.len]) {
        *d = *s as libc::c_char;
    }
    loop {
        let c = libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        );
        if c < 0 {
            match *libc::__errno_location() {
                libc::EINTR | libc::ECONNABORTED | libc::EMFILE | libc::ENFILE => continue,
                _ => libc::_exit(1),
            }
        }
        let pid = libc::fork();
        if pid == 0 {
            libc::close(listener);
            let u = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if u < 0 || libc::connect(u, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                libc::_exit(1);
            }
            pump(c, u);
            libc::_exit(0);
        }
        libc::close(c);
    }
}

/// Copy both ways between `a` and `b` until both directions are done, passing on each
/// half-close.
unsafe fn pump(a: libc::c_int, b: libc::c_int) {
    let mut buf = [0u8; 64 * 1024];
    let mut open = [true, true];
    while open[0] || open[1] {
        let mut fds = [
            libc::pollfd {
                fd: if open[0] { a } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if open[1] { b } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if libc::poll(fds.as_mut_ptr(), 2, -1) < 0 {
            if *libc::__errno_location() == libc::EINTR {
                continue;
            }
            return;
        }
        for (i, (from, to)) in [(a, b), (b, a)].into_iter().enumerate() {
            if !open[i] || fds[i].revents == 0 {
                continue;
            }
            let n = libc::read(from, buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                open[i] = false;
                libc::shutdown(to, libc::SHUT_WR);
                continue;
            }
            let mut done = 0usize;
            while done < n as usize {
                let w = libc::write(to, buf[done..].as_ptr().cast(), n as usize - done);
                if w <= 0 {
                    if w < 0 && *libc::__errno_location() == libc::EINTR {
                        continue;
                    }
                    return;
                }
                done += w as usize;
            }
        }
    }
}

/// Map the caller's own ids into its new user namespace.
unsafe fn write_maps(maps: &IdMaps) -> io::Result<()> {
    write_proc(c"/proc/self/setgroups", b"deny")?;
    write_proc(c"/proc/self/gid_map", &maps.gid_map)?;
    write_proc(c"/proc/self/uid_map", &maps.uid_map)
}

/// The supervisor: hold nothing, wait for the namespace's init, exit as it did.
unsafe fn supervise(child: libc::pid_t, alive: libc::c_int) -> ! {
    // Dies with the daemon's spawning thread, which lives as long as the runtime.
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    // No output pipe, no error channel, no inherited descriptor stays open here (but the
    // `alive` pipe): the daemon sees EOF on the command's output when the command closes it.
    let alive = alive as u32;
    if alive > 0 {
        libc::syscall(libc::SYS_close_range, 0u32, alive - 1, 0u32);
    }
    libc::syscall(libc::SYS_close_range, alive + 1, u32::MAX, 0u32);
    let mut status: libc::c_int = 0;
    loop {
        // Any child: the relay (when there is one) is ours too, and the namespace's init
        // cannot finish dying until every process of the namespace has been reaped.
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
        libc::signal(sig, libc::SIG_DFL);
        libc::kill(libc::getpid(), sig);
        libc::_exit(128 + sig);
    }
    libc::_exit(127)
}

unsafe fn write_proc(path: &CStr, data: &[u8]) -> io::Result<()> {
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
