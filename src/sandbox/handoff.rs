//! The daemon's side of a task's proxy listener (`[network] mode = "allowlist"`): how the
//! descriptors a view's holder sends arrive (a seqpacket pair, see `view.rs` and
//! `premade.rs`), and the checks on the listener among them before the proxy serves it.
//!
//! The holder binds `127.0.0.1:3128` inside the task's network namespace once, before any
//! child of the task exists (see `netns.rs`), and sends the listener with the namespaces;
//! the sandbox serves it for its life (see [`super::Sandbox`]). No process of the task ever
//! holds a channel to the daemon (no socket file, no inherited descriptor), and what the
//! daemon takes is checked anyway: a listening TCP socket on `127.0.0.1:3128` in a network
//! namespace other than the daemon's, or nothing.

#![allow(unsafe_code)]

use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::netns::PROXY_PORT;

/// The proxy's listener a holder sent, checked: what the proxy may serve.
pub(super) fn checked(fd: OwnedFd) -> io::Result<TcpListener> {
    check_listener(&fd)?;
    Ok(TcpListener::from(fd))
}

/// A seqpacket socket pair, close-on-exec both ends: what a view's holder talks over (one
/// message, whole, per send).
pub(super) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair writes two descriptors into `fds`, which we then own.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn refused(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the task's proxy listener was refused: {what}"),
    )
}

/// Every descriptor in one message waiting on `sock` (all of them owned, so extras close).
pub(super) fn recv_fds(sock: &OwnedFd) -> io::Result<Vec<OwnedFd>> {
    // Room for more than a holder sends, so that extras arrive (and are closed) rather than
    // being cut off unseen.
    const MAX: usize = 2 * super::child::MAX_SEND_FDS;
    let mut control = [0u64; 8];
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE((MAX * std::mem::size_of::<libc::c_int>()) as u32) };
    debug_assert!(space as usize <= std::mem::size_of_val(&control));
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: `msg` describes live buffers of the lengths given.
        let n = unsafe {
            libc::recvmsg(
                sock.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n >= 0 {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`, within
    // `msg_controllen`; every SCM_RIGHTS descriptor is new to this process and taken once.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Err(io::Error::other("nothing was sent"));
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("too many descriptors were sent"));
    }
    Ok(fds)
}

fn sockopt(fd: &OwnedFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live and sized for an int option.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// A listening TCP socket on `127.0.0.1:PROXY_PORT` in a network namespace that is not the
/// daemon's (so the proxy never serves the host's own network).
fn check_listener(fd: &OwnedFd) -> io::Result<()> {
    let (domain, kind, listening) = (
        sockopt(fd, libc::SO_DOMAIN).map_err(|_| refused("not a socket"))?,
        sockopt(fd, libc::SO_TYPE)?,
        sockopt(fd, libc::SO_ACCEPTCONN)?,
    );
    if (domain, kind, listening) != (libc::AF_INET, libc::SOCK_STREAM, 1) {
        return Err(refused("not a listening TCP/IPv4 socket"));
    }
    // SAFETY: a zeroed sockaddr_in is valid.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockname writes at most `len` bytes into `addr`.
    let r = unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let ip = std::net::Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    if (ip, u16::from_be(addr.sin_port)) != (std::net::Ipv4Addr::LOCALHOST, PROXY_PORT) {
        return Err(refused("not bound to the proxy's address"));
    }
    // The socket's network namespace (the daemon owns its children's user namespaces, so it
    // may ask), against the daemon's own.
    // SAFETY: SIOCGSKNS takes no argument and returns a new (close-on-exec) descriptor.
    let ns = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGSKNS as _) };
    if ns < 0 {
        // EPERM: the daemon holds no CAP_NET_ADMIN there, so no holder of its made it.
        let e = io::Error::last_os_error();
        return Err(refused(&format!(
            "its network namespace is not one a holder of the daemon made ({e})"
        )));
    }
    // SAFETY: a fresh descriptor, ours alone.
    let ns = unsafe { OwnedFd::from_raw_fd(ns) };
    use std::os::unix::fs::MetadataExt;
    let theirs = std::fs::File::from(ns).metadata()?;
    let ours = std::fs::metadata("/proc/self/ns/net")?;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return Err(refused("it is in the daemon's own network namespace"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::RawFd;

    use super::*;

    /// What a holder sends, sent from this process and taken as the sandbox takes it: the
    /// refusal.
    fn refusal(fds: &[RawFd]) -> String {
        let (ours, theirs) = seqpacket_pair().unwrap();
        // SAFETY: both are open descriptors.
        unsafe { super::super::child::send_fds(theirs.as_raw_fd(), fds) }.unwrap();
        let mut got = recv_fds(&ours).unwrap();
        assert_eq!(got.len(), fds.len());
        checked(got.remove(0)).unwrap_err().to_string()
    }

    /// Only a listener on the proxy's address in another network namespace is taken:
    /// anything else a holder sent in its place is refused (and closed).
    #[test]
    fn only_a_listener_in_the_tasks_own_namespace_is_taken() {
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(refusal(&[file.as_raw_fd()]).contains("not a socket"));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(refusal(&[a.as_raw_fd()]).contains("not a listening TCP"));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(refusal(&[l.as_raw_fd()]).contains("proxy's address"));
        // The proxy's port in the daemon's own namespace: never served (as root: the same
        // namespace; unprivileged: not even one the daemon may inspect). Skipped where
        // something on this host already listens there.
        if let Ok(host) = TcpListener::bind(("127.0.0.1", PROXY_PORT)) {
            let why = refusal(&[host.as_raw_fd()]);
            assert!(why.contains("network namespace"), "{why}");
        }
        // Nothing sent (the holder failed before sending): an error, not a wait.
        let (ours, _theirs) = seqpacket_pair().unwrap();
        assert!(recv_fds(&ours).is_err());
    }
}
