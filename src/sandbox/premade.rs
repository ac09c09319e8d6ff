//! Task views made while the daemon is idle ([`ViewPool`]): the namespaces of the next
//! task's view (`view.rs`) and the hiding of the host's trees in it, ready before the task is
//! assigned, so that only binding the task's own paths back is left on its way to running.
//!
//! A pre-made view is a holder process forked from the daemon that has unshared its user and
//! mount namespaces (a short-lived child of it made the task's bounded IPC namespace, see
//! `ipc.rs` and [`send_with_ipc`]) and, under `[network] mode = "none"` or `"allowlist"`, the
//! task's network namespace with its `lo` and proxy listener (`netns.rs`: the same code as a
//! view made on the spot), mapped its ids, kept a descriptor of each tree it hides (the
//! tree as the host has it) and covered the trees with the empty tmpfs, sent the
//! namespaces to the daemon, and then waits on its socket. At assignment, the task's
//! [`MountPlan`] goes to it in one message; it binds each granted path back from its kept
//! tree (never through a link), answers, and exits: from then on the namespaces are the
//! task's alone, held by its sandbox's descriptors as a view made on the spot would be.
//!
//! Never shared: taking a pre-made view removes it from the pool ([`ViewPool::take`]), and
//! [`Premade::finish`] consumes it; the network namespace in it is the task's alone, and
//! closed at once when the view goes to the daemon's git (which keeps the host's network). A plan whose hidden trees are not the ones the view hid
//! (a tree made at `/` since, a grant that shows a whole tree) gets a view made on the spot.
//! The pool holds two, what a task in a repository uses (the daemon's git and the task's
//! own children each have a view), refilled once the daemon is idle again.
//!
//! The holder runs in a copy of a multi-threaded process and never execs: as in `child.rs`
//! it only makes raw system calls on data prepared before the fork. Its first act is to
//! close every descriptor but its socket, so it holds none of the daemon's (the hub's
//! socket, the state file) while it waits, and it leaves when the daemon's end closes.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::child::IdMaps;
use super::handoff::seqpacket_pair;
use super::ipc::IpcPlan;
use super::mounts::{self, MountPlan};
use super::netns::NetPlan;
use super::view::{self, TaskView};

/// How many views the pool keeps ready: a task in a repository takes two (the daemon's git
/// and the task's own children), a task in a per-task directory one.
const READY: usize = 2;

/// Most trees one view hides (each holds a descriptor in a fixed array in the holder).
const MAX_TREES: usize = 64;

/// Largest plan message (the paths a task binds back); a bigger plan gets a view made on
/// the spot.
const MAX_MESSAGE: usize = 64 * 1024;

/// How long the daemon waits for a holder's answer (it is a handful of system calls).
const ANSWER_TIMEOUT_MS: libc::c_int = 5_000;

/// Views made ahead of their tasks; see the module docs. One per [`super::Policy`]: a new
/// probe's answer starts an empty pool.
#[derive(Debug, Default)]
pub(crate) struct ViewPool {
    ready: Mutex<Vec<Premade>>,
    /// A refill is under way (one at a time).
    filling: AtomicBool,
}

impl ViewPool {
    /// A view made ahead, removed from the pool: it serves one task.
    pub(crate) fn take(&self) -> Option<Premade> {
        self.ready.lock().ok()?.pop()
    }

    /// Make views until [`READY`] are ready, hiding the trees a task's plan hides with
    /// `private` (the service user's HOME, the state directory), with the network `net`
    /// (what the task's own children need; the daemon's git takes less of it). Blocking
    /// (forks): off the runtime, while the daemon is idle. A failure is logged and leaves
    /// the pool short: a task then gets its view made on the spot, as without the pool.
    pub(crate) fn refill(&self, private: &[PathBuf], ipc: &IpcPlan, net: NetPlan) {
        if self.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        loop {
            let have = self.ready.lock().map_or(READY, |r| r.len());
            if have >= READY {
                break;
            }
            match Premade::make(private, ipc, net) {
                Ok(p) => match self.ready.lock() {
                    Ok(mut r) => r.push(p),
                    Err(_) => break,
                },
                Err(e) => {
                    tracing::debug!(error = %e, "cannot make a task view ahead; the next task makes its own");
                    break;
                }
            }
        }
        self.filling.store(false, Ordering::Release);
    }

    /// Views ready now.
    pub(crate) fn ready(&self) -> usize {
        self.ready.lock().map_or(0, |r| r.len())
    }
}

/// One view made ahead: its holder waits for the task's paths.
#[derive(Debug)]
pub(crate) struct Premade {
    /// Until handed over with the view (reaped with it: see [`Reap`]).
    holder: Option<std::process::Child>,
    /// The daemon's end of the holder's socket (seqpacket).
    sock: OwnedFd,
    /// Until handed over.
    view: Option<TaskView>,
    /// The trees the holder hid, in its order (their stage names are their indexes).
    hidden: Vec<CString>,
    /// The network the holder made.
    net: NetPlan,
}

impl Premade {
    /// Fork a holder that makes the namespaces, hides the trees of a plan with nothing
    /// granted, and waits. Blocking.
    fn make(private: &[PathBuf], ipc: &IpcPlan, net: NetPlan) -> io::Result<Premade> {
        let plan = mounts::plan(&[], &[], private).map_err(io::Error::other)?;
        if plan.hide.len() > MAX_TREES {
            return Err(io::Error::other("more trees to hide than a holder keeps"));
        }
        let hidden: Vec<CString> = plan.hide.iter().map(|h| h.path.clone()).collect();
        let maps = IdMaps::current();
        let ipc = ipc.clone();
        let (ours, theirs) = seqpacket_pair()?;
        let to = theirs.as_raw_fd();
        // The holder reads the task's plan into this buffer, allocated before the fork.
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut cmd = view::holder_command();
        // SAFETY: `hold` only makes async-signal-safe system calls on data prepared
        // before the fork (`plan`, `maps`, `buf`), and never returns.
        unsafe {
            cmd.pre_exec(move || hold(&maps, &plan, &ipc, net, to, &mut buf));
        }
        // The spawn returns once the holder has closed the spawn's own status pipe (its
        // first act), not when it exits.
        let mut holder = cmd.spawn()?;
        drop(theirs);
        let view = wait_readable(&ours)
            .and_then(|()| super::handoff::recv_fds(&ours))
            .and_then(|fds| TaskView::received(fds, net));
        match view {
            Ok(view) => Ok(Premade {
                holder: Some(holder),
                sock: ours,
                view: Some(view),
                hidden,
                net,
            }),
            Err(e) => {
                let _ = holder.kill();
                let _ = holder.wait();
                Err(e)
            }
        }
    }

    /// Bind `plan`'s paths back in this view and hand it over, for one task whose children
    /// need the network `net`. Blocking (a round trip to the holder). Fails, and the view is
    /// discarded, when `plan` hides other trees than the view does, the view lacks the
    /// network `net` needs, or the holder cannot bind a path.
    pub(crate) fn finish(mut self, plan: &MountPlan, net: NetPlan) -> io::Result<TaskView> {
        if !self.net.covers(net) {
            return Err(io::Error::other(
                "the task needs a network namespace the view made ahead has not",
            ));
        }
        let same = plan.hide.len() == self.hidden.len()
            && plan
                .hide
                .iter()
                .zip(&self.hidden)
                .all(|(h, p)| h.path == *p);
        if !same {
            return Err(io::Error::other(
                "the task hides other trees than the view made ahead",
            ));
        }
        let message = encode(plan)?;
        // SAFETY: a live buffer of the length given; seqpacket: one message, whole.
        let n = unsafe {
            libc::send(
                self.sock.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n != message.len() as isize {
            return Err(io::Error::last_os_error());
        }
        wait_readable(&self.sock)?;
        let mut answer = [0u8; 4];
        // SAFETY: reads at most 4 bytes into `answer`.
        let n = unsafe {
            libc::recv(
                self.sock.as_raw_fd(),
                answer.as_mut_ptr().cast(),
                4,
                libc::MSG_DONTWAIT,
            )
        };
        if n != 4 {
            return Err(io::Error::other("the view's holder left without answering"));
        }
        match i32::from_ne_bytes(answer) {
            0 => {
                let mut view = self
                    .view
                    .take()
                    .ok_or_else(|| io::Error::other("the view was handed over already"))?;
                // The holder exits right after its answer; it is reaped with the view, after
                // the task, not waited for on the task's way (its exit unmaps a copy of the
                // daemon's address space).
                view.holder = std::sync::Mutex::new(self.holder.take().map(view::Reap));
                Ok(view.narrow(net))
            }
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

impl Drop for Premade {
    fn drop(&mut self) {
        // Unused, or refused the plan: the holder is killed and reaped.
        drop(self.holder.take().map(view::Reap));
    }
}

/// Wait (bounded) until `sock` has something to read, or has hung up.
fn wait_readable(sock: &OwnedFd) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one live pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ANSWER_TIMEOUT_MS) };
        match r {
            1.. => return Ok(()),
            0 => return Err(io::Error::other("the view's holder did not answer in time")),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// What the holder does with one record of the plan message.
const MKDIR: u8 = 1;
const KEEP_DIR: u8 = 2;
const KEEP_FILE: u8 = 3;
/// A socket granted by name that may not exist.
const OPTIONAL: u8 = 0x80;

/// The paths `plan` binds back, as the holder reads them: records of `[op, tree, relative
/// length (u16), absolute length (u16)]`, the path relative to its tree and NUL, the absolute
/// path and NUL. The directories on the way to a kept path come first, as `MKDIR` records.
fn encode(plan: &MountPlan) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    for (i, tree) in plan.hide.iter().enumerate() {
        let root = Path::new(std::ffi::OsStr::from_bytes(tree.path.as_bytes()));
        for keep in &tree.keep {
            let mut op = if keep.dir { KEEP_DIR } else { KEEP_FILE };
            if keep.optional {
                op |= OPTIONAL;
            }
            for dir in &keep.parents {
                record(&mut out, MKDIR, i, root, dir.as_bytes())?;
            }
            record(&mut out, op, i, root, keep.path.as_bytes())?;
        }
    }
    if out.len() > MAX_MESSAGE {
        return Err(io::Error::other("the task's paths do not fit one message"));
    }
    Ok(out)
}

fn record(out: &mut Vec<u8>, op: u8, tree: usize, root: &Path, abs: &[u8]) -> io::Result<()> {
    let path = Path::new(std::ffi::OsStr::from_bytes(abs));
    let rel = path
        .strip_prefix(root)
        .map_err(|_| io::Error::other("a kept path outside its tree"))?
        .as_os_str()
        .as_bytes();
    let (Ok(tree), Ok(rl), Ok(al)) = (
        u8::try_from(tree),
        u16::try_from(rel.len() + 1),
        u16::try_from(abs.len() + 1),
    ) else {
        return Err(io::Error::other("a kept path too long for the holder"));
    };
    out.extend_from_slice(&[op, tree]);
    out.extend_from_slice(&rl.to_le_bytes());
    out.extend_from_slice(&al.to_le_bytes());
    out.extend_from_slice(rel);
    out.push(0);
    out.extend_from_slice(abs);
    out.push(0);
    Ok(())
}

/// The holder, in the forked process: see the module docs. Never returns.
unsafe fn hold(
    maps: &IdMaps,
    plan: &MountPlan,
    ipc: &IpcPlan,
    net: NetPlan,
    to: RawFd,
    buf: &mut [u8],
) -> io::Result<()> {
    // Nothing of the daemon's stays open here but the socket (the spawn's status pipe
    // among them, so the spawn returns now).
    let to_u = to as u32;
    if to_u > 0 {
        libc::syscall(libc::SYS_close_range, 0u32, to_u - 1, 0u32);
    }
    libc::syscall(libc::SYS_close_range, to_u + 1, u32::MAX, 0u32);
    let code = match prepare(maps, plan, ipc, net, to) {
        Ok(roots) => bind_when_told(&roots, plan.hide.len(), to, buf),
        Err(_) => 1,
    };
    libc::_exit(code)
}

/// Namespaces made, trees kept and covered, namespaces sent: the descriptors of the trees
/// as the host has them (-1 past the plan's count).
unsafe fn prepare(
    maps: &IdMaps,
    plan: &MountPlan,
    ipc: &IpcPlan,
    net: NetPlan,
    to: RawFd,
) -> io::Result<[libc::c_int; MAX_TREES]> {
    let ns = view::enter(maps, net)?;
    let mut roots = [-1 as libc::c_int; MAX_TREES];
    for (tree, root) in plan.hide.iter().zip(roots.iter_mut()) {
        *root = libc::open(
            tree.path.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        if *root < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if let Some(first) = plan.hide.first() {
        let mut base = -1;
        view::stage(plan, first, &mut base)?;
        for tree in &plan.hide {
            view::cover(base, tree)?;
        }
        libc::close(base);
    }
    let sent = send_with_ipc(&ns, ipc, to);
    // The listener among them: the holder keeps no copy while it waits.
    for fd in ns.into_iter().filter(|fd| *fd >= 0) {
        libc::close(fd);
    }
    sent?;
    Ok(roots)
}

/// Make the task's IPC namespace and send it with `ns` (see [`view::send`]) over `to`. The IPC
/// namespace is made from a user namespace nested in the task's (see `ipc.rs`); a process
/// that entered that one could no longer bind in the task's mount namespace, which this
/// holder still must, so a short-lived child of the holder makes it and sends all three.
/// A raw `clone` (no `fork` at-fork handlers: this is a copy of a multi-threaded process),
/// waited for here.
unsafe fn send_with_ipc(ns: &view::Entered, ipc: &IpcPlan, to: RawFd) -> io::Result<()> {
    let pid = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0);
    if pid == 0 {
        let code = match super::ipc::make(ipc).and_then(|fd| view::send(to, ns, fd)) {
            Ok(()) => 0,
            Err(_) => 1,
        };
        libc::_exit(code);
    }
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut status = 0;
    loop {
        let r = libc::waitpid(pid as libc::pid_t, &mut status, 0);
        if r >= 0 {
            break;
        }
        if *libc::__errno_location() != libc::EINTR {
            return Err(io::Error::last_os_error());
        }
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
}

/// Wait for the task's plan and bind its paths back; the exit code (0, or 0 after answering
/// an error; 2 when the daemon hung up or sent nothing usable).
unsafe fn bind_when_told(
    roots: &[libc::c_int; MAX_TREES],
    trees: usize,
    to: RawFd,
    buf: &mut [u8],
) -> libc::c_int {
    let n = loop {
        let n = libc::recv(to, buf.as_mut_ptr().cast(), buf.len(), 0);
        if n < 0 && *libc::__errno_location() == libc::EINTR {
            continue;
        }
        break n;
    };
    if n < 0 {
        return 2;
    }
    let errno = match apply(roots, trees, &buf[..n as usize]) {
        Ok(()) => 0,
        Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
    };
    let answer = errno.to_ne_bytes();
    libc::send(to, answer.as_ptr().cast(), 4, libc::MSG_NOSIGNAL);
    0
}

/// Carry out the records of `msg` (see [`encode`]).
unsafe fn apply(roots: &[libc::c_int; MAX_TREES], trees: usize, mut msg: &[u8]) -> io::Result<()> {
    let bad = || io::Error::from_raw_os_error(libc::EINVAL);
    while !msg.is_empty() {
        if msg.len() < 6 {
            return Err(bad());
        }
        let (op, tree) = (msg[0], msg[1] as usize);
        let rl = u16::from_le_bytes([msg[2], msg[3]]) as usize;
        let al = u16::from_le_bytes([msg[4], msg[5]]) as usize;
        if tree >= trees || rl == 0 || al == 0 || msg.len() < 6 + rl + al {
            return Err(bad());
        }
        // Checked in place (a NUL at the end and none before it): no allocation.
        let (Ok(rel), Ok(abs)) = (
            CStr::from_bytes_with_nul(&msg[6..6 + rl]),
            CStr::from_bytes_with_nul(&msg[6 + rl..6 + rl + al]),
        ) else {
            return Err(bad());
        };
        msg = &msg[6 + rl + al..];
        match op & !OPTIONAL {
            MKDIR => view::make(libc::mkdir(abs.as_ptr(), 0o755))?,
            KEEP_DIR | KEEP_FILE => {
                // Cloned from the tree as the host has it, never through a link where the
                // plan had none (a path swapped for a symlink since is refused).
                let fd =
                    view::open_tree(roots[tree], rel, libc::AT_SYMLINK_NOFOLLOW as libc::c_uint);
                if fd < 0 {
                    let err = io::Error::last_os_error();
                    if op & OPTIONAL != 0 && err.raw_os_error() == Some(libc::ENOENT) {
                        continue;
                    }
                    return Err(err);
                }
                let placed = if op & !OPTIONAL == KEEP_DIR {
                    view::make(libc::mkdir(abs.as_ptr(), 0o755))
                } else {
                    let f = libc::open(
                        abs.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                        0o600,
                    );
                    if f < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        libc::close(f);
                        Ok(())
                    }
                };
                let moved = placed.and_then(|()| view::move_mount(fd, abs));
                libc::close(fd);
                moved?;
            }
            _ => return Err(bad()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::sandbox::{Sandbox, Support};

    fn ns_id(fd: &OwnedFd) -> u64 {
        std::fs::File::from(fd.try_clone().unwrap())
            .metadata()
            .unwrap()
            .ino()
    }

    /// `sh -c script` run in `view` (its namespaces joined, as a task's child is): its exit
    /// code.
    fn run_in(view: TaskView, script: &str, cwd: &Path) -> i32 {
        let sb = Sandbox::joining(view);
        let args = ["-c".into(), script.into()];
        let mut child = crate::sandbox::launch(&crate::sandbox::Launch {
            program: "/bin/sh".as_ref(),
            args: &args,
            cwd,
            env: &[],
            stdio: [crate::sandbox::Stdio::Inherit; 3],
            sandbox: Some(&sb),
        })
        .unwrap();
        child.wait_blocking().unwrap().code().unwrap_or(-1)
    }

    /// The gate of these tests: a machine that can make the namespaces a view holds.
    #[track_caller]
    fn namespaces_here() -> bool {
        let missing = Support::probe()
            .namespaces
            .err()
            .map(|e| format!("no namespaces here ({e})"));
        crate::util::require::require("confine", missing)
    }

    /// A view made ahead shows what the task's plan grants and hides the rest of its tree,
    /// and each serves one task: two tasks get two sets of namespaces (user, mount, IPC).
    #[test]
    fn a_view_made_ahead_shows_the_grants_hides_the_rest_and_serves_one_task() {
        if !namespaces_here() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (ws, secret) = (base.join("ws"), base.join("secret"));
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("hello"), "hi").unwrap();
        std::fs::write(&secret, "no").unwrap();
        let pool = ViewPool::default();
        pool.refill(&[], &IpcPlan::new(256), NetPlan::Proxied);
        assert_eq!(pool.ready(), READY);
        let plan = mounts::plan(std::slice::from_ref(&ws), &[], &[]).unwrap();
        let a = pool
            .take()
            .unwrap()
            .finish(&plan, NetPlan::Proxied)
            .unwrap();
        let b = pool
            .take()
            .unwrap()
            .finish(&plan, NetPlan::Proxied)
            .unwrap();
        assert!(pool.take().is_none(), "a view serves one task");
        let (a_net, b_net) = (a.net.as_ref().unwrap(), b.net.as_ref().unwrap());
        for (x, y) in [
            (&a.user, &b.user),
            (&a.mnt, &b.mnt),
            (&a.ipc, &b.ipc),
            (a_net, b_net),
        ] {
            assert_ne!(ns_id(x), ns_id(y), "two tasks share a namespace");
        }
        assert!(a.listener.is_some() && b.listener.is_some());
        let script = format!(
            "test -f {}/hello && ! test -e {}",
            ws.display(),
            secret.display()
        );
        assert_eq!(run_in(a, &script, &ws), 0, "{script}");
        // The host still has both.
        assert!(secret.exists() && ws.join("hello").exists());
        drop(b);
    }

    /// A plan that hides other trees than the view did (here: one more) is refused, so the
    /// task gets a view made for it instead.
    #[test]
    fn a_plan_hiding_other_trees_is_refused() {
        if !namespaces_here() {
            return;
        }
        let pool = ViewPool::default();
        pool.refill(&[], &IpcPlan::new(256), NetPlan::Host);
        // A private tree under a system one (`/usr` itself is never hidden) is hidden too.
        let plan = mounts::plan(&[], &[], &[PathBuf::from("/usr/share")]).unwrap();
        let err = pool
            .take()
            .unwrap()
            .finish(&plan, NetPlan::Host)
            .unwrap_err();
        assert!(err.to_string().contains("other trees"), "{err}");
    }
}
