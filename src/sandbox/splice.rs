//! Moving a proxied connection's bytes between two TCP sockets with `splice(2)` through a
//! pipe, so they never enter the daemon's memory: the kernel hands the pages on.
//!
//! A user-space copy (read into a buffer, write it out) costs the proxy two copies of every
//! byte, on the cores the task's tools and the server need too: 59 ms of CPU per 100 MB with
//! 64 KiB buffers, against 17 ms here (see BENCHMARKS.md).

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// The pipe asked for on the way down (host → task, where downloads go): bytes moved per
/// `splice` at most. Four times the default, because every `splice` pair costs about the
/// same whatever it moves (17 ms of CPU per 100 MB against 21 ms at 64 KiB, 14 ms at 1 MiB);
/// not more, because pipe capacity counts against the service user's
/// `fs.pipe-user-pages-soft` (64 MiB by default), which its tasks' own pipes share. When the
/// kernel refuses, the pipe keeps its default size and works the same, only with more calls.
const DOWN_PIPE: libc::c_int = 256 * 1024;

/// Move bytes both ways between `task` and `host` until both directions reached end of file,
/// passing each half-close on, or one failed. Returns the bytes moved up (task → host) and
/// down (counted even when it fails).
pub(crate) async fn bidirectional(task: &TcpStream, host: &TcpStream) -> (u64, u64) {
    let (ab, ba) = (AtomicU64::new(0), AtomicU64::new(0));
    let there = one_way(task, host, &ab, None);
    let back = one_way(host, task, &ba, Some(DOWN_PIPE));
    tokio::pin!(there, back);
    let (mut there_done, mut back_done) = (false, false);
    while !(there_done && back_done) {
        let ok = tokio::select! {
            r = &mut there, if !there_done => { there_done = true; r.is_ok() }
            r = &mut back, if !back_done => { back_done = true; r.is_ok() }
        };
        if !ok {
            break;
        }
    }
    (ab.load(Ordering::Relaxed), ba.load(Ordering::Relaxed))
}

/// `from` → `to` until end of file (then `to` is shut down for writing), through a pipe of
/// `size` bytes if the kernel grants it (None: the default, 64 KiB).
async fn one_way(
    from: &TcpStream,
    to: &TcpStream,
    moved: &AtomicU64,
    size: Option<libc::c_int>,
) -> io::Result<()> {
    let pipe = Pipe::new(size)?;
    loop {
        // The pipe is empty here, so EAGAIN can only be the socket's.
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                splice(from.as_raw_fd(), pipe.w.as_raw_fd(), pipe.size)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => break r?,
            }
        };
        if n == 0 {
            // SAFETY: shutdown takes plain integers.
            unsafe { libc::shutdown(to.as_raw_fd(), libc::SHUT_WR) };
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            // The pipe holds data here, so EAGAIN can only be the socket's.
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(pipe.r.as_raw_fd(), to.as_raw_fd(), left)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(w) => {
                    left -= w;
                    moved.fetch_add(w as u64, Ordering::Relaxed);
                }
            }
        }
    }
}

/// One `splice` of up to `len` bytes, without blocking on either side.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: no memory is passed; both descriptors are live for the call.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A pipe and how many bytes it holds.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    size: usize,
}

impl Pipe {
    fn new(size: Option<libc::c_int>) -> io::Result<Pipe> {
        let mut fds = [-1; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`, which we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both are fresh descriptors owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        if let Some(size) = size {
            // SAFETY: F_SETPIPE_SZ takes an int; on failure the pipe keeps its size.
            unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
        }
        // SAFETY: F_GETPIPE_SZ takes no argument.
        let size = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ) };
        let size = usize::try_from(size)
            .ok()
            .filter(|s| *s > 0)
            .unwrap_or(4096);
        Ok(Pipe { r, w, size })
    }
}
