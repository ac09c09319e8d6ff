//! The task's network namespace (`[network] mode = "none"` or `"allowlist"`): made once per
//! task by the holder of its view (`view.rs`, `premade.rs`: so ahead of the task when the
//! view is made ahead), owned by the task's user namespace, with `lo` up and, when the
//! sandbox proxies, the proxy's listener on `127.0.0.1:`[`PROXY_PORT`] bound once in it.
//! The holder sends both descriptors to the daemon with the other namespaces; every child
//! with `own_network` joins the namespace (`child.rs`), and the daemon serves the one
//! listener for the sandbox's life (`handoff.rs` checks it, `proxy.rs` accepts on it).
//!
//! One namespace per task, not per child: making a network namespace, bringing its `lo`
//! up, binding and handing a listener over cost about 0.5 ms a child (BENCHMARKS.md,
//! issue 45). The children of one task share it, as they share the task's workspace: a
//! listener one child opens is reachable from its siblings, never from another task's
//! children (a view, and so its namespace, serves one task). The daemon holds the proxy's
//! address for the task's life, so no child can bind it in the proxy's stead (EADDRINUSE),
//! and the daemon serves only the listener the holder sent, before anything of the task ran.
//!
//! Holder-side code runs in a copy of a multi-threaded process that never execs: only raw
//! system calls on data prepared before the fork. Hence `unsafe` here.

#![allow(unsafe_code)]

use std::io;

/// The port the proxy listens on inside a task's network namespace (the namespace is the
/// task's own, so a fixed port cannot collide with another task's).
pub(crate) const PROXY_PORT: u16 = 3128;

/// What network a view's holder makes for the task, decided before the fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NetPlan {
    /// None: the children keep the host's network (`mode = "open"`, the daemon's own git).
    Host,
    /// A namespace of the task's own with only `lo`, up (`mode = "none"`).
    Cut,
    /// That namespace with the proxy's listener in it (`mode = "allowlist"`).
    Proxied,
}

impl NetPlan {
    /// The plan for children with `own_network`, proxied or not.
    pub(crate) fn new(own_network: bool, proxied: bool) -> NetPlan {
        match (own_network, proxied) {
            (false, _) => NetPlan::Host,
            (true, false) => NetPlan::Cut,
            (true, true) => NetPlan::Proxied,
        }
    }

    /// The flag the holder adds to its `unshare`.
    pub(super) fn clone_flag(self) -> libc::c_int {
        if self == NetPlan::Host {
            0
        } else {
            libc::CLONE_NEWNET
        }
    }

    /// How many descriptors the holder sends for it: the namespace, then the listener.
    pub(super) fn fds(self) -> usize {
        match self {
            NetPlan::Host => 0,
            NetPlan::Cut => 1,
            NetPlan::Proxied => 2,
        }
    }

    /// Whether a view made with `self` has everything `want` needs (the rest of it is
    /// closed when the view is taken: see `TaskView::narrow`).
    pub(super) fn covers(self, want: NetPlan) -> bool {
        self.fds() >= want.fds()
    }
}

/// In a holder that has unshared [`NetPlan::clone_flag`] and mapped its ids (so it holds
/// every capability in the user namespace that owns the new network namespace): `lo` up
/// and, for [`NetPlan::Proxied`], the proxy's listener bound. Returns the listener (-1
/// without). The namespace's own descriptor is opened with the others (`view::enter`).
///
/// # Safety
///
/// Only in a holder (single-threaded, between `fork` and `_exit`).
pub(super) unsafe fn set_up(plan: NetPlan) -> io::Result<libc::c_int> {
    if plan == NetPlan::Host {
        return Ok(-1);
    }
    loopback_up()?;
    if plan == NetPlan::Cut {
        return Ok(-1);
    }
    // Listening before any child exists: a child's first connection cannot race it.
    proxy_listener()
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

/// A TCP listener on `127.0.0.1:PROXY_PORT` in the task's network namespace. No
/// `SO_REUSEADDR` / `SO_REUSEPORT`: nothing else in the namespace can bind the address
/// while the daemon holds it.
unsafe fn proxy_listener() -> io::Result<libc::c_int> {
    let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut addr: libc::sockaddr_in = std::mem::zeroed();
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_port = PROXY_PORT.to_be();
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
