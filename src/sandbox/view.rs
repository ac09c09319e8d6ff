//! A task's view of the host's file system, made once per task: a user namespace and, owned
//! by it, a mount namespace in which the [`MountPlan`] is applied (every tree but the
//! system's hidden under an empty tmpfs, what is granted bound back), and the task's own,
//! bounded IPC namespace (see `ipc.rs`), and for children with a network of their own the
//! task's network namespace (see `netns.rs`). Every child of the task joins them (`setns`,
//! see `child.rs`) before it makes its own PID namespace, so the view is built once per
//! task and not once per child: a fresh mount namespace, its tmpfs and binds, and tearing
//! them down again cost about 0.4 ms a child; a network namespace with its `lo` and
//! listener about 0.5 ms.
//!
//! A short-lived holder process makes them: forked from the daemon by [`TaskView::create`]
//! (on the blocking pool, when the task's sandbox is planned), it unshares, writes its id
//! maps, hides, sends descriptors of its namespaces (and the proxy's listener) back over a
//! socket pair and exits.
//! Usually the namespaces were made before the task was assigned, by a holder that waited
//! for the task's paths (see `premade.rs`); this is the fallback when none was ready.
//! The descriptors keep the namespaces alive (no process needs to stay in them); they close
//! with the task's [`super::Sandbox`], and the view goes with its last child.
//!
//! The holder runs in a copy of a multi-threaded process and never execs, so, as in
//! `child.rs`, it only makes raw system calls on data prepared before the fork (no
//! allocation, no locks): async-signal-safe by construction. Hence `unsafe` here.

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;

use super::child::{send_fds, IdMaps, Join};
use super::ipc::{write_proc, IpcPlan};
use super::mounts::{Hidden, MountPlan, MAX_KEEP};
use super::netns::{self, NetPlan};

/// The task's user, mount and IPC namespaces, and its network namespace, held open.
#[derive(Debug)]
pub(crate) struct TaskView {
    pub(super) user: OwnedFd,
    pub(super) mnt: OwnedFd,
    pub(super) ipc: OwnedFd,
    /// The task's network namespace (not with [`NetPlan::Host`]).
    pub(super) net: Option<OwnedFd>,
    /// The proxy's listener in it (only with [`NetPlan::Proxied`]), until the sandbox takes
    /// it to serve ([`TaskView::take_listener`]).
    pub(super) listener: Option<OwnedFd>,
    /// A holder made ahead (`premade.rs`) that answered and exited: reaped with the view,
    /// or earlier off a task's way ([`TaskView::reap_holder`]).
    pub(super) holder: std::sync::Mutex<Option<Reap>>,
}

/// A holder process killed (if still there) and reaped when dropped. By then it has exited
/// (it leaves once it has answered, or when its socket closes), so the wait does not block.
#[derive(Debug)]
pub(crate) struct Reap(pub(super) std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The namespaces a holder makes first: user, and owned by it mount (the IPC namespace
/// follows, from a user namespace nested in this one: `ipc::make`).
pub(super) const HOLDER_NAMESPACES: libc::c_int = libc::CLONE_NEWUSER | libc::CLONE_NEWNS;

impl TaskView {
    /// Reap the holder that made this view ahead now, rather than with the view: for a view
    /// kept while the daemon is idle (`runner::ahead`), where its exited holder would wait
    /// as a zombie. Blocking (for the moment the holder takes to exit after answering).
    pub(crate) fn reap_holder(&self) {
        let holder = self.holder.lock().ok().and_then(|mut h| h.take());
        drop(holder);
    }

    /// Make the namespaces and apply `plan` in them, the IPC namespace bounded by `ipc`, the
    /// network as `net` says. Blocking (forks a process that lives about a millisecond): off
    /// the async runtime.
    pub(crate) fn create(plan: &MountPlan, ipc: &IpcPlan, net: NetPlan) -> io::Result<TaskView> {
        let maps = IdMaps::current();
        let plan = plan.clone();
        let ipc = ipc.clone();
        let (ours, theirs) = UnixStream::pair()?;
        let to = theirs.as_raw_fd();
        // Never exec'd: the holder leaves from `hold` (an error in it is the spawn's error).
        let mut cmd = holder_command();
        // SAFETY: `hold` only makes async-signal-safe system calls on data prepared before
        // the fork; `to` stays open until the holder has exited.
        unsafe {
            cmd.pre_exec(move || hold(&maps, &plan, &ipc, net, to));
        }
        let status = cmd.spawn()?.wait()?;
        drop(theirs);
        if !status.success() {
            return Err(io::Error::other(format!(
                "the namespace holder exited with {status}"
            )));
        }
        TaskView::received(super::handoff::recv_fds(&OwnedFd::from(ours))?, net)
    }

    /// The view from the descriptors a holder made with `net` sent (user, mount, IPC, then
    /// the network namespace and the listener as `net` has them: [`send`]).
    pub(super) fn received(fds: Vec<OwnedFd>, net: NetPlan) -> io::Result<TaskView> {
        if fds.len() != 3 + net.fds() {
            return Err(io::Error::other(format!(
                "the namespace holder sent {} descriptors, not the {} of its namespaces",
                fds.len(),
                3 + net.fds()
            )));
        }
        let mut fds = fds.into_iter();
        let mut next = || fds.next().ok_or_else(|| io::Error::other("counted above"));
        let (user, mnt, ipc) = (next()?, next()?, next()?);
        let net_fd = (net != NetPlan::Host).then(&mut next).transpose()?;
        let listener = (net == NetPlan::Proxied).then(&mut next).transpose()?;
        Ok(TaskView {
            user,
            mnt,
            ipc,
            net: net_fd,
            listener,
            holder: std::sync::Mutex::new(None),
        })
    }

    /// This view for children that need only `want` of its network (it must cover it, see
    /// [`NetPlan::covers`]): what they do not need is closed now, so the daemon's own git
    /// never holds a task's network namespace and a `mode = "none"` task never a listener.
    pub(super) fn narrow(mut self, want: NetPlan) -> TaskView {
        if want != NetPlan::Proxied {
            self.listener = None;
        }
        if want == NetPlan::Host {
            self.net = None;
        }
        self
    }

    /// The proxy's listener, for the sandbox to serve (once).
    pub(super) fn take_listener(&mut self) -> Option<OwnedFd> {
        self.listener.take()
    }

    /// What each child joins.
    pub(crate) fn join(&self) -> Join {
        Join {
            user: self.user.as_raw_fd(),
            mnt: self.mnt.as_raw_fd(),
            ipc: self.ipc.as_raw_fd(),
            net: self.net.as_ref().map_or(-1, AsRawFd::as_raw_fd),
        }
    }
}

/// The command a holder is forked from: never exec'd (the holder leaves from its
/// `pre_exec` hook), no standard streams, at `/`.
pub(super) fn holder_command() -> std::process::Command {
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .current_dir("/");
    cmd
}

/// The holder, in the forked process: new user and mount (and network) namespaces, the ids
/// mapped, the plan applied, the IPC namespace made, all sent over `to`, then gone.
unsafe fn hold(
    maps: &IdMaps,
    plan: &MountPlan,
    ipc: &IpcPlan,
    net: NetPlan,
    to: RawFd,
) -> io::Result<()> {
    let ns = enter(maps, net)?;
    // Mapped now: what the tmpfs holds belongs to an id of this namespace. The copied
    // mounts are slaves of the host's (the kernel's rule for a namespace owned by a new
    // user namespace), so nothing done here reaches the host.
    hide(plan)?;
    // Last: it leaves the task's user namespace for one nested in it (see `ipc.rs`).
    let ipc = super::ipc::make(ipc)?;
    send(to, &ns, ipc)?;
    libc::_exit(0)
}

/// What a holder entered ([`enter`]): user, mount, network namespace and proxy listener
/// (-1 where the [`NetPlan`] has none).
pub(super) type Entered = [libc::c_int; 4];

/// Send the view over `to`: user, mount, IPC, then the network namespace and the listener
/// when there are ([`TaskView::received`] reads them in that order).
pub(super) unsafe fn send(to: RawFd, ns: &Entered, ipc: libc::c_int) -> io::Result<()> {
    let all = [ns[0], ns[1], ipc, ns[2], ns[3]];
    let n = if ns[2] < 0 {
        3
    } else if ns[3] < 0 {
        4
    } else {
        5
    };
    send_fds(to, &all[..n])
}

/// In a forked holder: unshare [`HOLDER_NAMESPACES`] (and the network namespace `net`
/// asks for), map the ids, open the namespaces (user, mount, network) for sending, and set
/// the network namespace up (`netns.rs`). The IPC namespace is made after (`ipc::make`),
/// from a user namespace nested in this one, so that its bounds can be written.
pub(super) unsafe fn enter(maps: &IdMaps, net: NetPlan) -> io::Result<Entered> {
    // One call: the network namespace, made with the user namespace, is owned by it.
    if libc::unshare(HOLDER_NAMESPACES | net.clone_flag()) != 0 {
        return Err(io::Error::last_os_error());
    }
    // The daemon is non-dumpable (`protect_daemon`), and so is this fork of it: the kernel
    // then makes `/proc/self/*` belong to root, and a service user cannot open its own id
    // maps (EACCES; root can, which is why only a deployment saw it). Dumpable just for the
    // writes and the two opens, as container runtimes do, then closed again: the holder runs
    // nothing of a task, and confined processes of earlier tasks cannot trace it (Landlock
    // forbids tracing a less-restricted process; they are in other namespaces).
    if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut ns: Entered = [-1; 4];
    let done = write_maps(maps).and_then(|()| {
        ns[0] = open_ns(c"/proc/self/ns/user")?;
        ns[1] = open_ns(c"/proc/self/ns/mnt")?;
        if net != NetPlan::Host {
            ns[2] = open_ns(c"/proc/self/ns/net")?;
        }
        Ok(())
    });
    if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    done?;
    // Mapped now: every capability in the user namespace that owns the network namespace.
    ns[3] = netns::set_up(net)?;
    Ok(ns)
}

unsafe fn open_ns(path: &CStr) -> io::Result<libc::c_int> {
    let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Cover each hidden tree of `plan` with an empty directory of one tmpfs (a directory of its
/// own for each tree, so nothing made in one shows in another) and bind back what it keeps
/// (each cloned before its tree is covered).
///
/// One tmpfs and a bind of one of its directories per tree, not a tmpfs per tree: a
/// superblock costs several times a bind to make and to tear down with the namespace.
unsafe fn hide(plan: &MountPlan) -> io::Result<()> {
    let Some(first) = plan.hide.first() else {
        return Ok(());
    };
    let mut base = -1;
    for (i, tree) in plan.hide.iter().enumerate() {
        let mut fds = [-1 as libc::c_int; MAX_KEEP];
        let mut result = clone_keeps(tree, &mut fds);
        if result.is_ok() && i == 0 {
            result = stage(plan, first, &mut base);
        }
        if result.is_ok() {
            result = cover(base, tree).and_then(|()| show_keeps(tree, &fds));
        }
        for fd in fds.iter().filter(|fd| **fd >= 0) {
            libc::close(*fd);
        }
        if let Err(e) = result {
            if base >= 0 {
                libc::close(base);
            }
            return Err(e);
        }
    }
    libc::close(base);
    Ok(())
}

/// Clone what `tree` keeps, into `fds` (-1 for an optional socket that is not there).
unsafe fn clone_keeps(tree: &Hidden, fds: &mut [libc::c_int; MAX_KEEP]) -> io::Result<()> {
    for (keep, fd) in tree.keep.iter().zip(fds.iter_mut()) {
        // Never through a link where the plan had none: a path swapped for a symlink since
        // the plan was made is refused, not bound wherever it points.
        let r = open_tree(
            libc::AT_FDCWD,
            &keep.path,
            libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
        );
        if r < 0 {
            let err = io::Error::last_os_error();
            if keep.optional && err.raw_os_error() == Some(libc::ENOENT) {
                continue;
            }
            return Err(err);
        }
        *fd = r;
    }
    Ok(())
}

/// The one tmpfs, mounted on the first tree (whose keeps are cloned already), with an empty
/// directory for each tree; `base` becomes a descriptor of its root, which stays reachable
/// once the first tree's own directory covers it.
pub(super) unsafe fn stage(
    plan: &MountPlan,
    first: &Hidden,
    base: &mut libc::c_int,
) -> io::Result<()> {
    if libc::mount(
        c"tmpfs".as_ptr(),
        first.path.as_ptr(),
        c"tmpfs".as_ptr(),
        libc::MS_NOSUID | libc::MS_NODEV,
        c"mode=0755,size=64k,nr_inodes=4096".as_ptr().cast(),
    ) != 0
    {
        return Err(io::Error::last_os_error());
    }
    *base = libc::open(
        first.path.as_ptr(),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if *base < 0 {
        return Err(io::Error::last_os_error());
    }
    for tree in &plan.hide {
        if libc::mkdirat(*base, tree.stage.as_ptr(), 0o755) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Cover `tree` with its own directory of the tmpfs under `base`.
pub(super) unsafe fn cover(base: libc::c_int, tree: &Hidden) -> io::Result<()> {
    let fd = open_tree(base, &tree.stage, 0);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let r = move_mount(fd, &tree.path);
    libc::close(fd);
    r
}

/// Bind what `tree` keeps (cloned into `fds`) back at its own paths, making the mount
/// points on the way.
unsafe fn show_keeps(tree: &Hidden, fds: &[libc::c_int; MAX_KEEP]) -> io::Result<()> {
    for (keep, &fd) in tree.keep.iter().zip(fds.iter()) {
        if fd < 0 {
            continue;
        }
        for dir in &keep.parents {
            make(libc::mkdir(dir.as_ptr(), 0o755))?;
        }
        if keep.dir {
            make(libc::mkdir(keep.path.as_ptr(), 0o755))?;
        } else {
            let f = libc::open(
                keep.path.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600,
            );
            if f < 0 {
                return Err(io::Error::last_os_error());
            }
            libc::close(f);
        }
        move_mount(fd, &keep.path)?;
    }
    Ok(())
}

/// A detached recursive copy of the mount tree at `path` (relative to `dirfd`).
pub(super) unsafe fn open_tree(
    dirfd: libc::c_int,
    path: &CStr,
    flags: libc::c_uint,
) -> libc::c_int {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let flags = flags
        | OPEN_TREE_CLONE
        | libc::O_CLOEXEC as libc::c_uint
        | libc::AT_RECURSIVE as libc::c_uint;
    libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) as libc::c_int
}

/// Attach the detached tree `fd` at `path`.
pub(super) unsafe fn move_mount(fd: libc::c_int, path: &CStr) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
    if libc::syscall(
        libc::SYS_move_mount,
        fd,
        c"".as_ptr(),
        libc::AT_FDCWD,
        path.as_ptr(),
        MOVE_MOUNT_F_EMPTY_PATH,
    ) != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A `mkdir` result where an existing directory (a parent shared by two kept paths) is fine.
pub(super) unsafe fn make(r: libc::c_int) -> io::Result<()> {
    if r != 0 && *libc::__errno_location() != libc::EEXIST {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Map the caller's own ids into its new user namespace.
unsafe fn write_maps(maps: &IdMaps) -> io::Result<()> {
    write_proc(c"/proc/self/setgroups", b"deny")?;
    write_proc(c"/proc/self/gid_map", &maps.gid_map)?;
    write_proc(c"/proc/self/uid_map", &maps.uid_map)
}
