//! How every child the daemon runs for a task is made: `clone`, not `fork`.
//!
//! A `fork` of the daemon copies its page tables, and every page the daemon then writes
//! while the child lives is copied once more (copy-on-write). With a PID namespace there
//! were two such forks per child (its supervisor and its PID 1), and they were most of a
//! confined spawn's cost. Here the child shares the daemon's memory (`CLONE_VM`) until it
//! execs, as `posix_spawn` does:
//! - a child without a PID namespace is made with `CLONE_VFORK` (the daemon's thread waits
//!   until it has exec'd or failed) and execs the command itself;
//! - a child with one (see `child.rs`) is the namespace's supervisor. It runs on a stack of
//!   its own, joins the task's namespaces, makes the PID namespace and, with
//!   `CLONE_VM | CLONE_VFORK` again, its PID 1, which confines itself and execs the
//!   command. The supervisor then only waits: it shares the daemon's memory for the
//!   child's life, and touches nothing but its own stack.
//!
//! Code that runs in the child runs in the daemon's memory, so it only makes system calls
//! on data prepared here: no allocation, no lock, and no handler of the daemon's may run in
//! it (every signal is blocked across the `clone`, and the child resets every handler
//! before it unblocks any). An exec that fails comes back as its errno on a close-on-exec
//! pipe, as `std` reports it; the pipe reads as closed once the command has been exec'd.

#![allow(unsafe_code)]

use std::convert::Infallible;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use super::child::ChildPlan;
use super::Sandbox;

/// Where one of the child's standard streams goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdio {
    /// `/dev/null`.
    Null,
    /// A pipe whose other end is [`Launched`]'s.
    Piped,
    /// The daemon's own.
    Inherit,
}

/// A command to start: what [`launch`] needs, all of it read before the child exists.
#[derive(Debug)]
pub struct Launch<'a> {
    /// A path, or a name looked up on the `PATH` of `env`.
    pub program: &'a OsStr,
    /// Its arguments, without `argv[0]` (the program as given).
    pub args: &'a [OsString],
    /// The working directory (entered through the task's view, when it has one).
    pub cwd: &'a Path,
    /// The child's whole environment.
    pub env: &'a [(String, String)],
    /// stdin, stdout, stderr.
    pub stdio: [Stdio; 3],
    /// The task's confinement; `None` runs the command unconfined.
    pub sandbox: Option<&'a Sandbox>,
}

/// A started child: the process group leader, which a caller must reap (see
/// [`Launched::try_wait`]); dropped before that, it is killed and reaped.
#[derive(Debug)]
pub struct Launched {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    /// The daemon's end of stdin, if [`Stdio::Piped`].
    pub stdin: Option<OwnedFd>,
    /// The daemon's end of stdout, if [`Stdio::Piped`].
    pub stdout: Option<OwnedFd>,
    /// The daemon's end of stderr, if [`Stdio::Piped`].
    pub stderr: Option<OwnedFd>,
    status: Option<ExitStatus>,
    /// The supervisor's stack, which it runs on until it is reaped (see `Drop`).
    stack: Option<Stack>,
}

impl Launched {
    /// The child's pid, which is also its process group's id (it leads a session).
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// A descriptor that reads as ready once the child has exited (a pidfd).
    pub fn exit_fd(&self) -> RawFd {
        self.pidfd.as_raw_fd()
    }

    /// The exit status, reaping the child, if it has exited; never blocks.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    /// Wait for the child to exit and reap it. Blocking: for a child known to be short.
    pub fn wait_blocking(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.reap(0)? {
                return Ok(s);
            }
        }
    }

    fn reap(&mut self, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let mut status = 0;
        // SAFETY: waitpid writes an int we own; the pid is our unreaped child.
        let r = unsafe { libc::waitpid(self.pid, &mut status, flags) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        if r == 0 {
            return Ok(None);
        }
        let s = ExitStatus::from_raw(status);
        self.status = Some(s);
        Ok(Some(s))
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        // SAFETY: signalling our own unreaped child.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        if matches!(self.try_wait(), Ok(Some(_))) {
            return;
        }
        // Not gone yet (a command in the middle of a slow write dies when that returns):
        // reaped off the caller's thread, which may be the runtime's. A supervisor runs on
        // `stack`, which must outlive it: the stack goes with the reaper.
        let (pid, stack) = (self.pid, self.stack.take());
        let reap = move || {
            let mut status = 0;
            // SAFETY: reaping our own child; EINTR retried.
            while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
                && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
            {}
            drop(stack);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(reap)),
            Err(_) => reap(),
        }
    }
}

/// Start `l`: returns once the command has been exec'd (or with the errno of what failed
/// on the way, as `std::process::Command::spawn` does).
pub fn launch(l: &Launch<'_>) -> io::Result<Launched> {
    let program = cstring(l.program.as_bytes())?;
    let mut argv_c = vec![program.clone()];
    for a in l.args {
        argv_c.push(cstring(a.as_bytes())?);
    }
    let envp_c = l
        .env
        .iter()
        .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
        .collect::<io::Result<Vec<_>>>()?;
    let candidates_c = candidates(l.program, l.env)?;
    let (argv, envp, candidates) = (nulled(&argv_c), nulled(&envp_c), nulled(&candidates_c));
    let cwd = cstring(l.cwd.as_os_str().as_bytes())?;

    let (report_r, report_w) = pipe()?;
    let null = if l.stdio.contains(&Stdio::Null) {
        Some(above_stdio(open_null()?)?)
    } else {
        None
    };
    let mut ours: [Option<OwnedFd>; 3] = [None, None, None];
    let mut theirs: [Option<OwnedFd>; 3] = [None, None, None];
    for (i, how) in l.stdio.iter().enumerate() {
        if *how == Stdio::Piped {
            let (r, w) = pipe()?;
            let (mine, child) = if i == 0 { (w, r) } else { (r, w) };
            ours[i] = Some(mine);
            theirs[i] = Some(above_stdio(child)?);
        }
    }
    let stdio = std::array::from_fn(|i| match (l.stdio[i], &theirs[i], &null) {
        (Stdio::Piped, Some(fd), _) | (Stdio::Null, _, Some(fd)) => fd.as_raw_fd(),
        _ => -1,
    });
    let plan = l.sandbox.map(Sandbox::child_plan);
    let supervised = plan.is_some_and(|p| p.namespaces.is_some());
    let ctx = Ctx {
        stdio,
        cwd: cwd.as_ptr(),
        candidates: candidates.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        report: report_w.as_raw_fd(),
        plan,
    };
    let stack = Stack::new(if supervised {
        SUPERVISOR_STACK
    } else {
        EXEC_STACK
    })?;
    let (pid, pidfd) = clone_child(&ctx, &stack, supervised)?;
    // The child's ends: only the child (and, with a supervisor, its PID 1) keep them.
    drop((report_w, theirs, null));
    let mut launched = Launched {
        pid,
        pidfd,
        stdin: ours[0].take(),
        stdout: ours[1].take(),
        stderr: ours[2].take(),
        status: None,
        stack: supervised.then_some(stack),
    };
    // Until this reads as closed, the child (or the supervisor) may still read `ctx` and
    // the strings it points to, which live in this frame.
    match read_report(&report_r)? {
        None => Ok(launched),
        Some(errno) => {
            launched.wait_blocking()?;
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// The supervisor's stack holds the PID 1's (see [`become_supervisor`]).
const SUPERVISOR_STACK: usize = 256 * 1024;
const PID1_STACK: usize = 128 * 1024;
const EXEC_STACK: usize = 128 * 1024;

/// What the child reads, in the daemon's memory (see the module docs).
struct Ctx<'a> {
    /// The descriptors to make its stdin, stdout and stderr (-1: keep the daemon's).
    stdio: [RawFd; 3],
    cwd: *const libc::c_char,
    /// Paths to try `execve` on, in order (the `PATH` lookup, done here).
    candidates: *const *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// Where a failure's errno goes (close-on-exec).
    report: RawFd,
    plan: Option<&'a ChildPlan>,
}

/// `clone` the child with every signal blocked; returns its pid and pidfd.
fn clone_child(ctx: &Ctx<'_>, stack: &Stack, supervised: bool) -> io::Result<(i32, OwnedFd)> {
    let mut flags = libc::CLONE_VM | libc::CLONE_PIDFD | libc::SIGCHLD;
    if !supervised {
        flags |= libc::CLONE_VFORK;
    }
    let mut pidfd: libc::c_int = -1;
    // SAFETY: the full set blocks every signal in this thread across the clone, then the
    // old mask is put back; `child_main` only makes system calls on `ctx`, which outlives
    // the child's use of it (see `launch`), on `stack`, which outlives the child.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            stack.top(),
            flags,
            (ctx as *const Ctx<'_>).cast_mut().cast(),
            &mut pidfd as *mut libc::c_int,
        );
        let err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(err);
        }
        Ok((pid, OwnedFd::from_raw_fd(pidfd)))
    }
}

/// The child: whatever fails is reported and ends it.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Ctx` of `launch`, alive until the report pipe closes.
    unsafe {
        let ctx = &*(arg as *const Ctx<'_>);
        let Err(e) = start(ctx);
        fail(ctx.report, &e)
    }
}

/// Session, streams, limits; then exec, or become the supervisor of a PID namespace.
unsafe fn start(ctx: &Ctx<'_>) -> io::Result<Infallible> {
    reset_signal_handlers();
    // A session of its own, and so a process group it leads: the group is what timeouts
    // and cancellation kill, and a new session has no controlling terminal, so a task under
    // `run-task` in the operator's shell cannot open `/dev/tty`, read the operator's
    // keystrokes, or push its own into the shell's input (`TIOCSTI`). Never EPERM: a
    // fresh child leads no group.
    if libc::setsid() < 0 {
        return Err(io::Error::last_os_error());
    }
    for (to, &from) in ctx.stdio.iter().enumerate() {
        // `from` is never 0–2 (see `above_stdio`), so dup2 always makes a new descriptor,
        // without close-on-exec.
        if from >= 0 && libc::dup2(from, to as libc::c_int) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if let Some(plan) = ctx.plan {
        plan.limit()?;
        if let Some(join) = &plan.namespaces {
            plan.join(join, ctx.cwd)?;
            return become_supervisor(ctx, plan);
        }
    }
    if libc::chdir(ctx.cwd) != 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(plan) = ctx.plan {
        plan.confine()?;
    }
    exec(ctx)
}

/// What the namespace's PID 1 reads (on the supervisor's stack).
struct Init<'a, 'b> {
    ctx: &'a Ctx<'b>,
    plan: &'a ChildPlan,
    /// The read end of a pipe whose write end only the supervisor keeps.
    alive: [libc::c_int; 2],
}

/// Make the PID namespace and its PID 1, then supervise it (see `child.rs`).
unsafe fn become_supervisor(ctx: &Ctx<'_>, plan: &ChildPlan) -> io::Result<Infallible> {
    if libc::unshare(libc::CLONE_NEWPID) != 0 {
        return Err(io::Error::last_os_error());
    }
    // A pipe whose write end only the supervisor keeps: when it reads as hung up, the
    // supervisor is gone (pids are useless for this: the supervisor is outside the new
    // namespace and its pid means nothing inside).
    let mut alive = [0 as libc::c_int; 2];
    if libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
        return Err(io::Error::last_os_error());
    }
    // Dies with the daemon's spawning thread, which lives as long as the runtime.
    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    let init = Init { ctx, plan, alive };
    // Left uninitialised: PID 1 touches only the few pages it uses, from the top down
    // (zeroing it faulted in all 32 pages of it, in the daemon's memory, on every spawn).
    let mut stack = std::mem::MaybeUninit::<[u128; PID1_STACK / 16]>::uninit();
    let top = stack
        .as_mut_ptr()
        .cast::<u8>()
        .add(PID1_STACK)
        .cast::<libc::c_void>();
    // The supervisor waits (CLONE_VFORK) until PID 1 has exec'd or died: `init` and the
    // stack stay valid for as long as PID 1 reads them.
    let pid = libc::clone(
        pid1_main,
        top,
        libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
        (&init as *const Init<'_, '_>).cast_mut().cast(),
    );
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    super::child::supervise(pid, alive[1])
}

/// The namespace's PID 1.
extern "C" fn pid1_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the supervisor's `Init`, alive while it waits for this exec.
    unsafe {
        let init = &*(arg as *const Init<'_, '_>);
        let Err(e) = pid1(init);
        fail(init.ctx.report, &e)
    }
}

unsafe fn pid1(init: &Init<'_, '_>) -> io::Result<Infallible> {
    libc::close(init.alive[1]);
    // If the supervisor dies, so do we (and so the namespace).
    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    // The supervisor may have died before the line above, unnoticed: check once.
    let mut pfd = libc::pollfd {
        fd: init.alive[0],
        events: libc::POLLIN,
        revents: 0,
    };
    if libc::poll(&mut pfd, 1, 0) != 0 {
        libc::_exit(137);
    }
    // alive[0] is close-on-exec: the command never sees it.
    init.plan.confine()?;
    exec(init.ctx)
}

/// Every handler back to its default (those ignored stay ignored, but `SIGPIPE`, which the
/// Rust runtime ignores and `std` gives children back), so none of the daemon's runs here.
unsafe fn reset_signal_handlers() {
    let mut dfl: libc::sigaction = std::mem::zeroed();
    dfl.sa_sigaction = libc::SIG_DFL;
    for sig in 1..libc::SIGRTMAX() + 1 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            continue;
        }
        if old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE {
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    }
}

/// Unblock every signal and exec the first candidate that can be (as `execvp` walks
/// `PATH`: a missing or unreadable one is skipped, any other failure stops the walk).
unsafe fn exec(ctx: &Ctx<'_>) -> io::Result<Infallible> {
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    let mut refused = false;
    let mut last = libc::ENOENT;
    let mut at = ctx.candidates;
    while !(*at).is_null() {
        libc::execve(*at, ctx.argv, ctx.envp);
        last = *libc::__errno_location();
        match last {
            libc::EACCES => refused = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => break,
        }
        at = at.add(1);
    }
    let errno = if refused && last != libc::ENOEXEC {
        libc::EACCES
    } else {
        last
    };
    Err(io::Error::from_raw_os_error(errno))
}

/// Report `e` on the close-on-exec pipe and leave.
unsafe fn fail(report: RawFd, e: &io::Error) -> ! {
    let errno = e.raw_os_error().unwrap_or(libc::EINVAL).to_ne_bytes();
    libc::write(report, errno.as_ptr().cast(), errno.len());
    libc::_exit(127)
}

/// The errno a child reported, or `None` once the pipe reads as closed (it exec'd).
fn read_report(r: &OwnedFd) -> io::Result<Option<i32>> {
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into our own buffer.
        let n = unsafe { libc::read(r.as_raw_fd(), buf[got..].as_mut_ptr().cast(), 4 - got) };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok((got == 4).then(|| i32::from_ne_bytes(buf)))
}

/// Where `execve` is tried, in order: `program` itself if it names a path, else each
/// directory of the child's `PATH` (glibc's default when it has none) joined with it.
fn candidates(program: &OsStr, env: &[(String, String)]) -> io::Result<Vec<CString>> {
    let bytes = program.as_bytes();
    if bytes.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if bytes.contains(&b'/') {
        return Ok(vec![cstring(bytes)?]);
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or("/bin:/usr/bin", |(_, v)| v.as_str());
    path.split(':')
        .map(|dir| {
            let dir = if dir.is_empty() { "." } else { dir };
            let mut full = Vec::with_capacity(dir.len() + 1 + bytes.len());
            full.extend_from_slice(dir.as_bytes());
            full.push(b'/');
            full.extend_from_slice(bytes);
            cstring(&full)
        })
        .collect()
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a program, argument, directory or variable holds a NUL byte",
        )
    })
}

/// `v`'s pointers, then a null one, as `execve` takes arrays.
fn nulled(v: &[CString]) -> Vec<*const libc::c_char> {
    v.iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the two ints; each is then owned once.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

fn open_null() -> io::Result<OwnedFd> {
    Ok(std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?
        .into())
}

/// `fd`, moved to a number above 2 if it is one of 0–2 (a daemon started with a standard
/// stream closed): the child `dup2`s its streams onto 0–2 in order, which must not close
/// one it has yet to read from.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor we then own.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `n` is fresh and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// A child's stack: anonymous memory with a guard page below it.
#[derive(Debug)]
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is only ever used by the child; the handle just unmaps it.
unsafe impl Send for Stack {}
unsafe impl Sync for Stack {}

impl Stack {
    fn new(len: usize) -> io::Result<Stack> {
        // SAFETY: a fresh private mapping; its lowest page made inaccessible as a guard.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let stack = Stack { base, len };
            if libc::mprotect(base, page_size(), libc::PROT_NONE) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(stack)
        }
    }

    /// Where the stack starts (it grows down).
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of our own mapping.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used (see `Launched`'s drop).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096)
}

#[cfg(test)]
#[path = "launch_tests.rs"]
mod tests;
