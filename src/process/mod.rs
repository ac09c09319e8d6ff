//! Child processes: spawned in their own session and process group (no controlling
//! terminal), stdin `/dev/null` unless the spec gives bytes, output captured with a cap
//! (head and tail kept), killed as a whole tree on timeout, cancellation or after the
//! leader exits.
//!
//! Every command the daemon runs for a task (shell tasks, `claude`, checks, agentic
//! `run_command`, the judge, git) goes through [`run_with`], so "no orphans", "no unbounded
//! buffers" and "confined as the task's [`crate::sandbox::Sandbox`] says" hold in one place.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::unix::pipe;
use tokio_util::sync::CancellationToken;

use crate::progress::{EventKind, ProgressSink};
use crate::sandbox::{self, Launch, Launched, Stdio};

mod capture;
mod env;
pub mod fence;

use capture::LineSplitter;
pub use capture::{head_tail, CappedBuf};
pub use env::{confine, ChildEnv};
pub use fence::Fence;

/// A command to run: program and argv, never a shell string built from task data.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// The program (a path, or a name looked up on the child's PATH).
    pub program: OsString,
    /// Its arguments: argv, never a shell string.
    pub args: Vec<OsString>,
    /// The working directory.
    pub cwd: PathBuf,
    /// The whole environment (and the sandbox) the child gets.
    pub env: ChildEnv,
    /// Bytes written to the child's stdin, then closed (None: /dev/null).
    pub stdin: Option<Vec<u8>>,
}

impl CommandSpec {
    /// `program` in `cwd` with `env` and no arguments yet.
    pub fn new(
        program: impl Into<OsString>,
        cwd: impl Into<PathBuf>,
        env: ChildEnv,
    ) -> CommandSpec {
        CommandSpec {
            program: program.into(),
            args: Vec::new(),
            cwd: cwd.into(),
            env,
            stdin: None,
        }
    }

    /// `sh -c SCRIPT`: only for commands that are shell by design (`shell_command`, check targets).
    /// `/bin/sh` by its POSIX path, as the Node sidecar runs it: not looked up on the
    /// children's PATH, whose toolchain directories come first (a failed `execve` each).
    pub fn shell(script: &str, cwd: impl Into<PathBuf>, env: ChildEnv) -> CommandSpec {
        CommandSpec::new("/bin/sh", cwd, env).arg("-c").arg(script)
    }

    /// One more argument.
    pub fn arg(mut self, a: impl Into<OsString>) -> CommandSpec {
        self.args.push(a.into());
        self
    }

    /// More arguments.
    pub fn args<I, S>(mut self, args: I) -> CommandSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }
}

/// Bounds on one run.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall time before the group is killed; `None` for no limit.
    pub timeout: Option<Duration>,
    /// SIGTERM → SIGKILL grace.
    pub grace: Duration,
    /// Bytes kept per stream (half head, half tail).
    pub output_cap: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Some(Duration::from_secs(60)),
            grace: Duration::from_secs(5),
            output_cap: 1024 * 1024,
        }
    }
}

/// How a run ended. Callers branch on this, so it is an enum, not a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this status code.
    Code(i32),
    /// Killed by this signal (not by us).
    Signal(i32),
    /// Killed by us at its timeout.
    TimedOut,
    /// Killed by us on cancellation.
    Cancelled,
}

impl Exit {
    /// Exit status 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }

    /// How it ended, in words for a reason or a log line.
    pub fn describe(self) -> String {
        match self {
            Exit::Code(c) => format!("exit code {c}"),
            Exit::Signal(s) => format!("killed by signal {s}"),
            Exit::TimedOut => "timed out".into(),
            Exit::Cancelled => "cancelled".into(),
        }
    }
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// How it ended.
    pub exit: Exit,
    /// Captured stdout (head and tail within the cap).
    pub stdout: String,
    /// Captured stderr (head and tail within the cap).
    pub stderr: String,
    /// Bytes dropped from the middle of stdout + stderr by the cap.
    pub dropped_bytes: u64,
    /// Wall time from spawn to reaping.
    pub duration: Duration,
}

impl RunOutput {
    /// stdout then stderr, for reports.
    pub fn combined(&self) -> String {
        match (self.stdout.is_empty(), self.stderr.is_empty()) {
            (_, true) => self.stdout.clone(),
            (true, false) => self.stderr.clone(),
            (false, false) => format!("{}\n{}", self.stdout, self.stderr),
        }
    }

    /// [`Self::combined`], consuming the output: when one stream is empty the other is moved,
    /// not copied (a capped capture is up to `output_cap` bytes).
    pub fn into_combined(self) -> String {
        match (self.stdout.is_empty(), self.stderr.is_empty()) {
            (_, true) => self.stdout,
            (true, false) => self.stderr,
            (false, false) => {
                let mut s = self.stdout;
                s.reserve_exact(1 + self.stderr.len());
                s.push('\n');
                s.push_str(&self.stderr);
                s
            }
        }
    }
}

/// Send `sig` to the whole process group `pgid` (0 is ignored: never our own group).
#[allow(unsafe_code)]
pub fn signal_group(pgid: u32, sig: libc::c_int) {
    if pgid == 0 {
        return;
    }
    // SAFETY: killpg has no memory-safety preconditions; a stale pgid yields ESRCH.
    unsafe {
        libc::killpg(pgid as libc::pid_t, sig);
    }
}

/// Kills the group when dropped, so a cancelled future cannot leak a process tree.
struct GroupGuard(u32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        signal_group(self.0, libc::SIGKILL);
    }
}

/// Run a command to completion under `limits`, streaming output to `progress` if given.
///
/// The child leads its own process group. On timeout or `cancel` the group gets SIGTERM,
/// then SIGKILL after the grace period. After the leader exits, stragglers (background jobs)
/// are killed too: nothing the command started outlives it.
pub async fn run(
    spec: &CommandSpec,
    limits: &Limits,
    cancel: &CancellationToken,
    progress: Option<&ProgressSink>,
) -> std::io::Result<RunOutput> {
    run_with(spec, limits, cancel, progress, None).await
}

/// A callback fed each complete stdout line (without its `\n`) as it arrives.
pub type LineCallback<'a> = &'a mut (dyn FnMut(&str) + Send);

/// A callback fed stdout's bytes as they arrive, chunk by chunk, none held back or cut.
pub type ChunkCallback<'a> = &'a mut (dyn FnMut(&[u8]) + Send);

/// Where stdout goes while the child runs, besides the capped capture.
enum Tap<'a> {
    /// Complete lines (see [`run_with`]).
    Lines(LineSplitter, LineCallback<'a>),
    /// Raw chunks (see [`run_chunks`]).
    Chunks(ChunkCallback<'a>),
}

impl Tap<'_> {
    fn feed(&mut self, bytes: &[u8]) {
        match self {
            Tap::Lines(lines, cb) => lines.feed(bytes, *cb),
            Tap::Chunks(cb) => cb(bytes),
        }
    }

    fn finish(&mut self) {
        if let Tap::Lines(lines, cb) = self {
            lines.finish(*cb);
        }
    }
}

/// [`run`], also handing every stdout line to `on_stdout_line` while the child runs
/// (streaming parsers such as Claude's `stream-json`). A last line without a newline is
/// delivered at EOF. Lines still reach the capped capture and `progress` as with [`run`].
pub async fn run_with(
    spec: &CommandSpec,
    limits: &Limits,
    cancel: &CancellationToken,
    progress: Option<&ProgressSink>,
    on_stdout_line: Option<LineCallback<'_>>,
) -> std::io::Result<RunOutput> {
    let tap = on_stdout_line.map(|cb| Tap::Lines(LineSplitter::default(), cb));
    run_tapped(spec, limits, cancel, progress, tap).await
}

/// [`run`], handing every byte of stdout to `on_chunk` as it arrives (a scan of output too
/// large to hold, such as a diff): unlike [`run_with`]'s lines, nothing is cut.
pub async fn run_chunks(
    spec: &CommandSpec,
    limits: &Limits,
    cancel: &CancellationToken,
    on_chunk: ChunkCallback<'_>,
) -> std::io::Result<RunOutput> {
    run_tapped(spec, limits, cancel, None, Some(Tap::Chunks(on_chunk))).await
}

async fn run_tapped(
    spec: &CommandSpec,
    limits: &Limits,
    cancel: &CancellationToken,
    progress: Option<&ProgressSink>,
    tap: Option<Tap<'_>>,
) -> std::io::Result<RunOutput> {
    let fence = spec.env.fence();
    // A paused task starts nothing (a check, a commit, a push) until its fence opens.
    if let Some(f) = fence {
        if !f.open(cancel).await {
            return Ok(RunOutput {
                exit: Exit::Cancelled,
                stdout: String::new(),
                stderr: String::new(),
                dropped_bytes: 0,
                duration: Duration::ZERO,
            });
        }
    }
    let started = Instant::now();
    // Every child is made here, confined as its sandbox says (see `sandbox::launch`).
    let mut child = sandbox::launch(&Launch {
        program: &spec.program,
        args: &spec.args,
        cwd: &spec.cwd,
        env: spec.env.vars(),
        stdio: [
            if spec.stdin.is_some() {
                Stdio::Piped
            } else {
                Stdio::Null
            },
            Stdio::Piped,
            Stdio::Piped,
        ],
        sandbox: spec.env.sandbox().map(|s| &**s),
    })?;
    let pgid = child.id();
    let guard = GroupGuard(pgid);
    // SAFETY: `exited` watches `child`'s pidfd, which stays open while `child` lives, and
    // is declared after it, so it is dropped (and deregistered) first.
    #[allow(unsafe_code)]
    let exited = unsafe { AsyncFd::register_with_interest(child.exit_fd(), Interest::READABLE)? };

    if let (Some(data), Some(stdin)) = (spec.stdin.clone(), child.stdin.take()) {
        let mut stdin = pipe::Sender::from_owned_fd(stdin)?;
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = stdin.write_all(&data).await;
        });
    }
    let mut out = pipe::Receiver::from_owned_fd(child.stdout.take().expect("stdout piped"))?;
    let mut err = pipe::Receiver::from_owned_fd(child.stderr.take().expect("stderr piped"))?;
    let mut sinks = Sinks {
        out: CappedBuf::new(limits.output_cap),
        err: CappedBuf::new(limits.output_cap),
        tap,
        progress,
    };
    let mut ob = vec![0u8; 16 * 1024];
    let mut eb = vec![0u8; 16 * 1024];
    let (mut out_open, mut err_open) = (true, true);

    // The timeout counts only time the task's fence was open.
    let sleep_deadline = async {
        match limits.timeout {
            Some(t) => fence::sleep(fence, t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep_deadline);
    let mut fenced = fence.map(Fence::watch);
    // Closed between the check before the spawn and now: stopped at once.
    let mut paused = fence.is_some_and(Fence::is_paused);
    if paused {
        fence::signal_tree(pgid, libc::SIGSTOP).await;
    }

    let mut forced: Option<Exit> = None;
    let status = loop {
        tokio::select! {
            n = out.read(&mut ob), if out_open => match n {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => sinks.stdout(&ob[..n]),
            },
            n = err.read(&mut eb), if err_open => match n {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => sinks.stderr(&eb[..n]),
            },
            status = wait(&mut child, &exited) => break status?,
            p = fence_changed(&mut fenced) => {
                // Stop the whole tree where it stands, or let it go on.
                paused = p;
                fence::signal_tree(pgid, if p { libc::SIGSTOP } else { libc::SIGCONT }).await;
            }
            _ = &mut sleep_deadline, if forced.is_none() => {
                forced = Some(Exit::TimedOut);
                break terminate(&mut child, &exited, pgid, limits.grace).await?;
            }
            _ = cancel.cancelled(), if forced.is_none() => {
                forced = Some(Exit::Cancelled);
                if paused {
                    // A paused task is not ours any more: killed where it stands, never
                    // continued (a SIGTERM handler would run one more step of it).
                    fence::signal_tree(pgid, libc::SIGKILL).await;
                    break wait(&mut child, &exited).await?;
                }
                break terminate(&mut child, &exited, pgid, limits.grace).await?;
            }
        }
    };
    // The leader is gone; anything left in its group is an orphan in the making.
    signal_group(pgid, libc::SIGKILL);
    drop(guard);
    // Drain what is still buffered in the pipes (writers are dead now, so EOF comes fast).
    // The exit is often seen before the last output is read: what is drained is streamed
    // like the rest, or the task's record would miss how its child ended.
    let drain = async {
        while out_open {
            match out.read(&mut ob).await {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => sinks.stdout(&ob[..n]),
            }
        }
        while err_open {
            match err.read(&mut eb).await {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => sinks.stderr(&eb[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
    let Sinks { out, err, tap, .. } = sinks;
    if let Some(mut t) = tap {
        t.finish();
    }

    let exit = forced.unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(s)) => Exit::Signal(s),
            _ => Exit::Code(-1),
        }
    });
    Ok(RunOutput {
        exit,
        dropped_bytes: out.dropped() + err.dropped(),
        stdout: out.into_string_lossy(),
        stderr: err.into_string_lossy(),
        duration: started.elapsed(),
    })
}

/// Where a child's output goes as it is read: the capped capture, the tap (stdout) and the
/// task's progress stream; the same before and after its exit is seen.
struct Sinks<'t, 'p> {
    out: CappedBuf,
    err: CappedBuf,
    tap: Option<Tap<'t>>,
    progress: Option<&'p ProgressSink>,
}

impl Sinks<'_, '_> {
    fn stdout(&mut self, bytes: &[u8]) {
        self.out.push(bytes);
        if let Some(t) = self.tap.as_mut() {
            t.feed(bytes);
        }
        if let Some(p) = self.progress {
            p.stream(EventKind::Stdout, &String::from_utf8_lossy(bytes));
        }
    }

    fn stderr(&mut self, bytes: &[u8]) {
        self.err.push(bytes);
        if let Some(p) = self.progress {
            p.stream(EventKind::Stderr, &String::from_utf8_lossy(bytes));
        }
    }
}

/// The fence's next state (`true`: closed); pending for ever without a fence, or once it
/// is gone.
async fn fence_changed(rx: &mut Option<tokio::sync::watch::Receiver<bool>>) -> bool {
    let Some(r) = rx.as_mut() else {
        return std::future::pending().await;
    };
    if r.changed().await.is_err() {
        *rx = None;
        return std::future::pending().await;
    }
    let paused = *r.borrow_and_update();
    paused
}

/// The child's exit status once it has exited, reaping it: `exited` is its pidfd, ready
/// once it has.
async fn wait(child: &mut Launched, exited: &AsyncFd<RawFd>) -> std::io::Result<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        exited.readable().await?.clear_ready();
    }
}

/// SIGTERM the group, wait `grace`, then SIGKILL; returns the leader's status.
async fn terminate(
    child: &mut Launched,
    exited: &AsyncFd<RawFd>,
    pgid: u32,
    grace: Duration,
) -> std::io::Result<ExitStatus> {
    signal_group(pgid, libc::SIGTERM);
    match tokio::time::timeout(grace, wait(child, exited)).await {
        Ok(status) => status,
        Err(_) => {
            signal_group(pgid, libc::SIGKILL);
            wait(child, exited).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn run_with_delivers_lines_as_they_stream() {
        let dir = tempfile::tempdir().unwrap();
        let spec = CommandSpec::shell("printf 'a\\nbb\\r\\nccc'", dir.path(), ChildEnv::inherit());
        let mut seen = Vec::new();
        let mut cb = |l: &str| seen.push(l.to_string());
        let out = run_with(
            &spec,
            &Limits::default(),
            &CancellationToken::new(),
            None,
            Some(&mut cb),
        )
        .await
        .unwrap();
        assert!(out.exit.success());
        assert_eq!(seen, ["a", "bb", "ccc"]);
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("pid");
        let script = format!("sleep 30 & echo $! > {}; wait", marker.display());
        let spec = CommandSpec::shell(&script, dir.path(), ChildEnv::inherit());
        let limits = Limits {
            timeout: Some(Duration::from_millis(300)),
            grace: Duration::from_millis(200),
            output_cap: 1024,
        };
        let out = run(&spec, &limits, &CancellationToken::new(), None)
            .await
            .unwrap();
        assert_eq!(out.exit, Exit::TimedOut);
        assert_gone(&marker, Zombie::Will).await;
    }

    #[tokio::test]
    async fn background_children_do_not_outlive_a_normal_exit() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("pid");
        let script = format!(
            "sleep 30 > /dev/null 2>&1 & echo $! > {}; echo done",
            marker.display()
        );
        let spec = CommandSpec::shell(&script, dir.path(), ChildEnv::inherit());
        let out = run(&spec, &Limits::default(), &CancellationToken::new(), None)
            .await
            .unwrap();
        assert!(out.exit.success());
        assert_eq!(out.stdout.trim(), "done");
        assert_gone(&marker, Zombie::Will).await;
    }

    /// Every child leads a session of its own: no controlling terminal, whatever the
    /// daemon's, and stdin is `/dev/null`.
    #[tokio::test]
    async fn a_child_gets_a_session_of_its_own_and_no_terminal() {
        let dir = tempfile::tempdir().unwrap();
        let spec = CommandSpec::shell(
            "cat /proc/self/stat; readlink /proc/self/fd/0",
            dir.path(),
            ChildEnv::inherit(),
        );
        let out = run(&spec, &Limits::default(), &CancellationToken::new(), None)
            .await
            .unwrap();
        assert!(out.exit.success(), "{}", out.stderr);
        let mut lines = out.stdout.lines();
        // `pid (comm) state ppid pgrp session tty_nr …`; comm may hold spaces.
        let stat = lines.next().unwrap();
        let rest: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let (pid, pgrp, session, tty): (i32, i32, i32, i32) = (
            stat.split_whitespace().next().unwrap().parse().unwrap(),
            rest[2].parse().unwrap(),
            rest[3].parse().unwrap(),
            rest[4].parse().unwrap(),
        );
        // `cat` is the shell's child: the session and group are the shell's, not ours.
        // SAFETY: getsid(0) has no preconditions.
        #[allow(unsafe_code)]
        let ours = unsafe { libc::getsid(0) };
        assert_ne!(session, ours, "the child shares the daemon's session");
        assert_eq!(pgrp, session, "the session leader leads the group");
        assert_ne!(pid, session);
        assert_eq!(tty, 0, "a controlling terminal: {stat}");
        assert_eq!(lines.next(), Some("/dev/null"));
    }

    /// What a child printed just before it exited reaches the task's progress stream (and
    /// so the flight record), not only the capture, however the exit and the last read
    /// race: once in CI the exit was seen first, and the drained output never streamed.
    #[tokio::test]
    async fn output_read_after_the_exit_is_seen_is_streamed_too() {
        let dir = tempfile::tempdir().unwrap();
        let spec = CommandSpec::shell(
            "printf out; printf err >&2",
            dir.path(),
            ChildEnv::inherit(),
        );
        for run_no in 0..40 {
            let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
            let sink = {
                let seen = seen.clone();
                ProgressSink::with_observer(1024, move |ev| {
                    if ev.kind.is_stream() {
                        seen.lock().unwrap().push_str(&ev.text);
                    }
                })
            };
            let out = run(
                &spec,
                &Limits::default(),
                &CancellationToken::new(),
                Some(&sink),
            )
            .await
            .unwrap();
            assert_eq!((out.stdout.as_str(), out.stderr.as_str()), ("out", "err"));
            let seen = seen.lock().unwrap().clone();
            assert!(
                seen.contains("out") && seen.contains("err"),
                "run {run_no}: streamed {seen:?} of a child that printed out/err"
            );
        }
    }

    /// A run whose future is dropped (its task cancelled from above) kills its child and
    /// reaps it: no process, not even a zombie, is left.
    #[tokio::test]
    async fn a_dropped_run_leaves_no_process_and_no_zombie() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("pid");
        let script = format!(
            "echo $$ > {}.tmp; mv {0}.tmp {0}; exec sleep 30",
            marker.display()
        );
        let spec = CommandSpec::shell(&script, dir.path(), ChildEnv::inherit());
        let cancel = CancellationToken::new();
        let limits = Limits::default();
        tokio::select! {
            _ = run(&spec, &limits, &cancel, None) => panic!("sleep 30 ended"),
            _ = async {
                while !marker.exists() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            } => {}
        }
        assert_gone(&marker, Zombie::NotEven).await;
    }

    /// Whether [`assert_gone`] accepts a zombie.
    #[derive(PartialEq)]
    enum Zombie {
        /// Killed is enough; its reaper may come later.
        Will,
        /// Reaped too.
        NotEven,
    }

    /// The pid written to `marker` is gone (or, with [`Zombie::Will`], a zombie awaiting its
    /// reaper) within 1 s.
    async fn assert_gone(marker: &std::path::Path, zombie: Zombie) {
        let pid: i32 = std::fs::read_to_string(marker)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SIGKILL delivery is asynchronous; give the kernel a moment.
        for _ in 0..50 {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || (zombie == Zombie::Will && is_zombie(pid))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{pid} survived (alive, or a zombie where none may be)");
    }

    fn is_zombie(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.split_whitespace().nth(2) == Some("Z"))
            .unwrap_or(true)
    }
}
