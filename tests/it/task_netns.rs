//! One network namespace per task (`src/sandbox/netns.rs`): made with the task's view (on
//! the spot or ahead), shared by the task's children and by no other task's, with the
//! proxy's one listener in it served for the sandbox's life; the daemon's own git keeps the
//! host's network. Driven through the one spawn path (`process::run`) with real sandboxes.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::Arc;

use hub_sidecar::config::{Config, NetworkMode};
use hub_sidecar::process::{self, ChildEnv, CommandSpec, Limits, RunOutput};
use hub_sidecar::sandbox::{Grants, Policy, Sandbox, Support};
use tokio_util::sync::CancellationToken;

use crate::loopback::Loopback;
use crate::util::{wait_until, T};

/// A port a test's child listens on inside a task's namespace (the namespace is the task's
/// own, so a fixed port collides with nothing on the host).
const INSIDE: u16 = 4000;

/// The gate: containment and python3 (the children's sockets are python one-liners).
#[track_caller]
fn gate() -> bool {
    crate::containment::supported()
        && crate::util::require("python3", crate::util::missing_tool("python3"))
}

/// A daemon's config and policy under `mode`, with views made ahead when `ahead`.
struct Daemon {
    dir: tempfile::TempDir,
    cfg: Config,
    policy: Policy,
    ahead: bool,
}

/// One task's (or the daemon's git's) confined environment and workspace.
struct Task {
    env: ChildEnv,
    ws: PathBuf,
}

impl Daemon {
    fn new(mode: NetworkMode, allow: Vec<String>, ahead: bool) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::for_hub("ws://127.0.0.1:9/ws", &dir.path().join("state"));
        cfg.network.mode = mode;
        cfg.network.allow = allow;
        Daemon {
            dir,
            cfg,
            policy: Policy::decide(None, Support::probe()),
            ahead,
        }
    }

    /// A sandbox for `name`: a task's own children (`task`) or the daemon's git.
    fn task(&self, name: &str, task: bool) -> Task {
        let base = ChildEnv::from_config(&self.cfg);
        if self.ahead {
            self.policy.prepare_views(&self.cfg, base.vars());
            assert!(self.policy.views_ready() > 0, "no view was made ahead");
        }
        let ws = self.dir.path().join(name);
        std::fs::create_dir_all(&ws).unwrap();
        let grants = Grants {
            write: vec![ws.clone()],
            task,
            ..Grants::default()
        };
        let tmp = self.dir.path().join("state/tmp").join(name);
        let env = process::confine(&self.cfg, &self.policy, &base, &tmp, &grants).unwrap();
        Task { env, ws }
    }
}

impl Task {
    fn sandbox(&self) -> Arc<Sandbox> {
        self.env.sandbox().unwrap().clone()
    }

    /// `sh -c script` as one child of the task.
    async fn run(&self, script: &str) -> RunOutput {
        let spec = CommandSpec::shell(script, &self.ws, self.env.clone());
        process::run(&spec, &Limits::default(), &CancellationToken::new(), None)
            .await
            .unwrap()
    }

    /// The network namespace one child of the task is in.
    async fn netns(&self) -> String {
        let out = self.run("readlink /proc/self/ns/net").await;
        assert!(out.exit.success(), "{}", out.combined());
        out.stdout.trim().to_string()
    }
}

fn host_netns() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// A python one-liner: connect to `127.0.0.1:port`, print `connected` or the error's name.
fn connect(port: u16) -> String {
    format!(
        "python3 -c \"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')\nexcept OSError as e:\n    print(type(e).__name__)\""
    )
}

/// Children of one task share its network namespace (a listener one child opens is reached
/// by its sibling), two tasks never do (nor the daemon's), with the view made on the spot
/// and made ahead.
#[tokio::test]
async fn children_of_a_task_share_its_network_namespace_and_no_two_tasks_do() {
    if !gate() {
        return;
    }
    for ahead in [false, true] {
        for mode in [NetworkMode::Allowlist, NetworkMode::None] {
            let d = Daemon::new(mode, Vec::new(), ahead);
            let (a, b) = (d.task("a", true), d.task("b", true));
            let (a1, a2, b1) = (a.netns().await, a.netns().await, b.netns().await);
            let how = format!("{mode:?}, made ahead: {ahead}");
            assert_eq!(a1, a2, "two children of one task, {how}");
            assert_ne!(a1, b1, "two tasks share a network namespace, {how}");
            assert_ne!(a1, host_netns(), "a task in the daemon's network, {how}");

            // A listener one child of `a` opens, while it runs.
            let listen = format!(
                "python3 -c \"import socket, os, time\ns = socket.socket(); s.bind(('127.0.0.1', {INSIDE})); s.listen()\nopen('listening', 'w').close()\nwhile not os.path.exists('go'): time.sleep(0.02)\""
            );
            let listening = {
                let ws = a.ws.clone();
                move || ws.join("listening").exists()
            };
            let first = {
                let spec = CommandSpec::shell(&listen, &a.ws, a.env.clone());
                tokio::spawn(async move {
                    process::run(&spec, &Limits::default(), &CancellationToken::new(), None)
                        .await
                        .unwrap()
                })
            };
            assert!(wait_until(listening, T).await, "the listener never came up");
            let sibling = a.run(&connect(INSIDE)).await;
            let other = b.run(&connect(INSIDE)).await;
            std::fs::write(a.ws.join("go"), "").unwrap();
            let first = first.await.unwrap();
            assert!(first.exit.success(), "{}", first.combined());
            assert_eq!(
                sibling.stdout.trim(),
                "connected",
                "{how}: {}",
                sibling.combined()
            );
            assert_eq!(
                other.stdout.trim(),
                "ConnectionRefusedError",
                "another task reached it, {how}: {}",
                other.combined()
            );
        }
    }
}

/// The daemon's own git (a sandbox without the task's grants) keeps the host's network,
/// with the view made ahead (which has a network namespace for the task's children) too.
#[tokio::test]
async fn the_daemons_git_is_never_in_a_tasks_network_namespace() {
    if !gate() {
        return;
    }
    let host = host_netns();
    for ahead in [false, true] {
        let d = Daemon::new(NetworkMode::Allowlist, Vec::new(), ahead);
        let task = d.task("task", true);
        let git = d.task("git", false);
        assert_eq!(git.netns().await, host, "made ahead: {ahead}");
        assert_ne!(task.netns().await, host, "made ahead: {ahead}");
        assert_eq!(git.sandbox().proxy_listeners(), 0);
    }
}

/// The proxy works for every child of a task, not only the first: a second and a third
/// reach an allowed host through it, over the task's one listener.
#[tokio::test]
async fn every_child_of_a_task_reaches_an_allowed_host_through_the_one_listener() {
    if !gate() {
        return;
    }
    let server =
        Loopback::serve(|_| HashMap::from([("/x".to_string(), b"through-the-proxy".to_vec())]))
            .await;
    let port = server.addr.port();
    for ahead in [false, true] {
        let d = Daemon::new(
            NetworkMode::Allowlist,
            vec![format!("127.0.0.1:{port}")],
            ahead,
        );
        let task = d.task("t", true);
        let get = format!(
            "env NO_PROXY= no_proxy= python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/x', timeout=10).read().decode())\""
        );
        for child in 1..=3 {
            let out = task.run(&get).await;
            assert!(
                out.stdout.contains("through-the-proxy"),
                "child {child}, made ahead: {ahead}: {}",
                out.combined()
            );
            assert_eq!(task.sandbox().proxy_listeners(), 1);
        }
        // Around the proxy, straight to the host's loopback: no route.
        let out = task.run(&connect(port)).await;
        assert_ne!(out.stdout.trim(), "connected", "{}", out.combined());
    }
}

/// A task's child cannot take the proxy's place: the address is held for the task's life
/// (EADDRINUSE, whatever reuse option it asks for), and a listener it opens elsewhere is
/// never served by the daemon: the only listening socket the daemon holds in the task's
/// namespace is the one its holder bound on 127.0.0.1:3128.
#[tokio::test]
async fn a_tasks_child_cannot_replace_the_proxys_listener() {
    if !gate() {
        return;
    }
    let d = Daemon::new(NetworkMode::Allowlist, Vec::new(), false);
    let task = d.task("t", true);
    let take = "python3 -c \"import socket\nfor opt in (None, socket.SO_REUSEADDR, socket.SO_REUSEPORT):\n    s = socket.socket()\n    if opt: s.setsockopt(socket.SOL_SOCKET, opt, 1)\n    try:\n        s.bind(('127.0.0.1', 3128)); s.listen(); print('bound')\n    except OSError as e:\n        print(e.errno)\"";
    let out = task.run(take).await;
    let eaddrinuse = libc::EADDRINUSE.to_string();
    assert_eq!(
        out.stdout.lines().collect::<Vec<_>>(),
        [eaddrinuse.as_str(); 3],
        "{}",
        out.combined()
    );
    // A listener of its own on another port, open while the daemon is looked at.
    let listen = "python3 -c \"import socket, os, time\ns = socket.socket(); s.bind(('127.0.0.1', 3129)); s.listen()\nopen('listening', 'w').close()\nwhile not os.path.exists('go'): time.sleep(0.02)\"";
    let spec = CommandSpec::shell(listen, &task.ws, task.env.clone());
    let child = tokio::spawn(async move {
        process::run(&spec, &Limits::default(), &CancellationToken::new(), None)
            .await
            .unwrap()
    });
    let ws = task.ws.clone();
    assert!(wait_until(|| ws.join("listening").exists(), T).await);
    let ns = ns_inode(&task.netns().await);
    assert_eq!(
        listeners_in(ns),
        vec![3128],
        "the daemon serves only the holder's listener"
    );
    assert_eq!(task.sandbox().proxy_listeners(), 1);
    std::fs::write(task.ws.join("go"), "").unwrap();
    assert!(child.await.unwrap().exit.success());
}

/// The task's one listener is served from the sandbox's making to its end, however many
/// children run at once or one after the other, and the daemon lets go of it (and so of
/// the task's network namespace) once the sandbox is gone.
#[tokio::test]
async fn a_tasks_one_proxy_listener_is_served_for_the_sandboxs_life() {
    if !gate() {
        return;
    }
    let d = Daemon::new(NetworkMode::Allowlist, Vec::new(), false);
    let task = d.task("t", true);
    let sandbox = task.sandbox();
    assert_eq!(sandbox.proxy_listeners(), 1, "served before any child runs");
    let ns = ns_inode(&task.netns().await);
    // Three children at once, each leaving a background process behind it.
    let waiting = (0..3)
        .map(|_| {
            let spec = CommandSpec::shell(
                "sleep 300 & mktemp -p . up.XXXXXX; while [ ! -e go ]; do sleep 0.02; done",
                &task.ws,
                task.env.clone(),
            );
            tokio::spawn(async move {
                process::run(&spec, &Limits::default(), &CancellationToken::new(), None)
                    .await
                    .unwrap()
            })
        })
        .collect::<Vec<_>>();
    let ws = task.ws.clone();
    let up = move || {
        std::fs::read_dir(&ws)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("up."))
                    .count()
            })
            .unwrap_or(0)
            == 3
    };
    assert!(wait_until(up, T).await, "the three children never ran");
    assert_eq!(
        sandbox.proxy_listeners(),
        1,
        "one listener, not one a child"
    );
    assert_eq!(listeners_in(ns), vec![3128]);
    std::fs::write(task.ws.join("go"), "").unwrap();
    for w in waiting {
        assert!(w.await.unwrap().exit.success());
    }
    for _ in 0..20 {
        assert!(task.run("true").await.exit.success());
    }
    assert_eq!(
        sandbox.proxy_listeners(),
        1,
        "served while the sandbox lives"
    );
    drop((sandbox, task));
    assert!(
        wait_until(|| sockets_in(ns) == 0, T).await,
        "the daemon still holds a socket of an ended task's namespace"
    );
}

/// `net:[4026532…]` → its inode.
fn ns_inode(link: &str) -> u64 {
    link.trim_start_matches("net:[")
        .trim_end_matches(']')
        .parse()
        .unwrap_or_else(|_| panic!("not a network namespace: {link}"))
}

/// This process's sockets in the network namespace `ns`: (listening, local port) each.
fn socket_views(ns: u64) -> Vec<(bool, u16)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let is_socket = std::fs::read_link(e.path())
            .map(|t| t.to_string_lossy().starts_with("socket:"))
            .unwrap_or(false);
        let Ok(fd) = e.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        if is_socket {
            // Another test may close (and reuse) it meanwhile: then it is not one of ours.
            if let Some(found_one) = inspect(fd, ns) {
                found.push(found_one);
            }
        }
    }
    found
}

fn listeners_in(ns: u64) -> Vec<u16> {
    socket_views(ns)
        .into_iter()
        .filter_map(|(listening, port)| listening.then_some(port))
        .collect()
}

fn sockets_in(ns: u64) -> usize {
    socket_views(ns).len()
}

/// Whether socket `fd` is in `ns`, and if so whether it listens and on what port.
fn inspect(fd: RawFd, ns: u64) -> Option<(bool, u16)> {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::MetadataExt;
    #[allow(unsafe_code)]
    // SAFETY: SIOCGSKNS returns a new descriptor (owned below) or fails; getsockopt and
    // getsockname write at most the lengths given into live locals.
    unsafe {
        let nsfd = libc::ioctl(fd, libc::SIOCGSKNS as _);
        if nsfd < 0 {
            return None;
        }
        let file = std::fs::File::from(std::os::fd::OwnedFd::from_raw_fd(nsfd));
        if file.metadata().ok()?.ino() != ns {
            return None;
        }
        let mut listening: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut listening as *mut libc::c_int).cast(),
            &mut len,
        );
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        libc::getsockname(fd, (&mut addr as *mut libc::sockaddr_in).cast(), &mut len);
        Some((listening == 1, u16::from_be(addr.sin_port)))
    }
}
