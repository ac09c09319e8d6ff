//! The launcher alone, unconfined: what `std::process::Command` did for the daemon, it
//! must still do (the confined cases run in the sandbox's and the daemon's tests).

use super::*;

fn run(program: &str, args: &[&str], env: &[(String, String)]) -> io::Result<Launched> {
    let args: Vec<OsString> = args.iter().map(Into::into).collect();
    launch(&Launch {
        program: program.as_ref(),
        args: &args,
        cwd: Path::new("/"),
        env,
        stdio: [Stdio::Null, Stdio::Piped, Stdio::Piped],
        sandbox: None,
    })
}

fn output(child: &mut Launched) -> (String, ExitStatus) {
    use std::io::Read;
    let mut out = String::new();
    std::fs::File::from(child.stdout.take().unwrap())
        .read_to_string(&mut out)
        .unwrap();
    (out, child.wait_blocking().unwrap())
}

fn path_env() -> Vec<(String, String)> {
    vec![("PATH".into(), "/nonexistent:/usr/bin:/bin".into())]
}

/// A name is looked up on the child's `PATH`, not the daemon's; argv, the environment and
/// the working directory are the child's.
#[test]
fn a_name_is_found_on_the_childs_path_with_its_argv_and_env() {
    let mut env = path_env();
    env.push(("ONLY_HERE".into(), "yes".into()));
    let script = "echo \"$0 $1 $ONLY_HERE $(pwd)\"";
    let mut child = run("sh", &["-c", script, "zero", "one"], &env).unwrap();
    let (out, status) = output(&mut child);
    assert!(status.success());
    assert_eq!(out, "zero one yes /\n");
}

/// A program that cannot be run is the spawn's error, with its errno, as `std` gives it;
/// nothing is left to reap.
#[test]
fn a_missing_program_is_the_spawns_error() {
    let e = run("no-such-program-here", &[], &path_env()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    let e = run("/nonexistent/prog", &[], &path_env()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, "not executable").unwrap();
    let e = run(plain.to_str().unwrap(), &[], &path_env()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
}

/// The child leads a session of its own, gets SIGPIPE's default disposition back (the
/// daemon ignores it) and no blocked signal, although every signal is blocked in the
/// daemon's thread across the `clone`.
#[test]
fn the_child_starts_with_default_signals_and_its_own_session() {
    let mut child = run(
        "sh",
        &[
            "-c",
            "grep -E '^(SigBlk|SigIgn)' /proc/self/status; cat /proc/self/stat",
        ],
        &path_env(),
    )
    .unwrap();
    let pid = child.id();
    let (out, status) = output(&mut child);
    assert!(status.success(), "{out}");
    assert!(out.contains("SigBlk:\t0000000000000000"), "{out}");
    // What the daemon ignores stays ignored (as across `std`'s exec), but SIGPIPE.
    let ignored = |status: &str| {
        let line = status.lines().find(|l| l.starts_with("SigIgn:")).unwrap();
        u64::from_str_radix(line[7..].trim(), 16).unwrap()
    };
    let ours = ignored(&std::fs::read_to_string("/proc/self/status").unwrap());
    assert_ne!(
        ours & (1 << (libc::SIGPIPE - 1)),
        0,
        "the test ignores SIGPIPE"
    );
    assert_eq!(ignored(&out), ours & !(1 << (libc::SIGPIPE - 1)), "{out}");
    let stat = out.lines().last().unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    // `cat` runs as the shell's child: its group and session are the shell's, our child's.
    assert_eq!(fields[2], pid.to_string(), "group: {stat}");
    assert_eq!(fields[3], pid.to_string(), "session: {stat}");
}

/// A child dropped before it is reaped is killed and reaped, not left a zombie.
#[test]
fn a_dropped_child_is_killed_and_reaped() {
    let child = run("sleep", &["30"], &path_env()).unwrap();
    let pid = child.id();
    drop(child);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "sleep {pid} survived its handle"
    );
}

/// A sandbox that only joins a fresh view's namespaces (as the probe's), so the child gets a
/// supervisor and a PID namespace; `None` (the test skipped, or failed under
/// `HUB_SIDECAR_REQUIRE`) where they cannot be made.
#[track_caller]
fn supervised() -> Option<Sandbox> {
    let missing = super::super::Support::probe()
        .namespaces
        .err()
        .map(|e| format!("no namespaces here ({e})"));
    if !crate::util::require::require("confine", missing) {
        return None;
    }
    let view = super::super::view::TaskView::create(
        &super::super::mounts::MountPlan::default(),
        &super::super::ipc::IpcPlan::new(0),
        super::super::netns::NetPlan::Host,
    )
    .unwrap();
    Some(Sandbox::joining(view))
}

fn run_in(sb: &Sandbox, program: &str, args: &[&str]) -> io::Result<Launched> {
    let args: Vec<OsString> = args.iter().map(Into::into).collect();
    launch(&Launch {
        program: program.as_ref(),
        args: &args,
        cwd: Path::new("/"),
        env: &path_env(),
        stdio: [Stdio::Null, Stdio::Piped, Stdio::Null],
        sandbox: Some(sb),
    })
}

/// The host pid of the namespace's PID 1: the supervisor's one child.
fn init_of(supervisor: u32) -> u32 {
    let children =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children")).unwrap();
    children.trim().parse().unwrap()
}

fn gone_within_a_second(pid: u32) -> bool {
    for _ in 0..100 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty()
            || stat
                .rsplit_once(')')
                .unwrap()
                .1
                .trim_start()
                .starts_with('Z')
        {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

static HANDLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn note_usr1(_: libc::c_int) {
    HANDLED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// The supervisor shares the daemon's memory for the command's whole life: a signal sent to
/// it (the group's SIGTERM at a timeout, or anything else) must never run one of the
/// daemon's handlers there, which would write the daemon's memory (tokio's signal flags:
/// a daemon that believes it was asked to stop). It blocks every signal; only SIGKILL ends
/// it, and with it the namespace.
#[test]
fn a_signal_to_the_supervisor_runs_no_handler_of_the_daemons() {
    let Some(sb) = supervised() else { return };
    // SAFETY: a handler that only stores to an atomic; SIGUSR1 is used by nothing else here.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = note_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut()),
            0
        );
    }
    let mut child = run_in(&sb, "sleep", &["30"]).unwrap();
    let supervisor = child.id();
    let init = init_of(supervisor);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(supervisor as i32, libc::SIGUSR1) };
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        !HANDLED.load(std::sync::atomic::Ordering::SeqCst),
        "the daemon's handler ran in the supervisor"
    );
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: as above.
        unsafe { libc::kill(supervisor as i32, sig) };
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(child.try_wait().unwrap().is_none(), "the supervisor died");
    // Dropped unreaped: the supervisor is killed, and the namespace's PID 1 with it.
    drop(child);
    assert!(!Path::new(&format!("/proc/{supervisor}")).exists());
    assert!(
        gone_within_a_second(init),
        "PID 1 {init} outlived its supervisor"
    );
}

/// In the namespace as outside it: a program that cannot be run is the spawn's error, and
/// the supervisor and PID 1 are reaped; the command's own exit status, or the signal it
/// died of, comes back.
#[test]
fn in_a_pid_namespace_exec_errors_and_exit_statuses_come_back() {
    let Some(sb) = supervised() else { return };
    let e = run_in(&sb, "no-such-program-here", &[]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    let mut child = run_in(&sb, "sh", &["-c", "echo $$; exit 7"]).unwrap();
    let (out, status) = output(&mut child);
    assert_eq!(out, "1\n", "the command is the namespace's PID 1");
    assert_eq!(status.code(), Some(7));
    // PID 1 dying of a signal: the supervisor dies of the same one. A fault is delivered
    // to a namespace's init (a `kill` from inside is not); so is SIGKILL from outside.
    let crash = "import ctypes; ctypes.string_at(0)";
    let mut child = run_in(&sb, "python3", &["-c", crash]).unwrap();
    let (_, status) = output(&mut child);
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?}");
    let mut child = run_in(&sb, "sleep", &["30"]).unwrap();
    // SAFETY: signalling the namespace's init from its ancestor namespace.
    unsafe { libc::kill(init_of(child.id()) as i32, libc::SIGKILL) };
    let (_, status) = output(&mut child);
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
}
