//! The host's socket files (issue 35, class 2): a task connects to no path unix socket outside
//! its workspace and its own TMPDIR, wherever the socket lives and whatever its type, nor
//! sends to the daemon's `NOTIFY_SOCKET`; its own socket servers keep working, and a socket
//! the operator grants by name (`[sandbox] sockets`) is reachable.
//!
//! Each location is tried where this user can make a socket there (root: all of them; the
//! service user: the world-writable ones, the state directory and its HOME); the others are
//! reported as skipped.

use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};

use hub_sidecar::mock_hub::sample_shell_task;

use crate::containment::supported;
use crate::git::terminal;
use crate::harness::{Harness, Setup};

/// Tries each `s=PATH` (stream: connect) and `d=PATH` (datagram: send) argument; one line
/// each: `REACHED PATH` or `refused PATH: why`.
const CLIENT: &str = r#"use Socket;
for my $a (@ARGV) {
  my ($t, $p) = split /=/, $a, 2;
  socket(my $s, AF_UNIX, $t eq "s" ? SOCK_STREAM : SOCK_DGRAM, 0) or die "socket: $!";
  my $ok = $t eq "s" ? connect($s, pack_sockaddr_un($p)) : send($s, "hostile task", 0, pack_sockaddr_un($p));
  print $ok ? "REACHED $p\n" : "refused $p: $!\n";
  close $s;
}
"#;

/// Serves a stream and a datagram socket at each PATH argument and talks to it from the same
/// process: `SERVED PATH stream|dgram`, or dies saying what failed.
const SERVER: &str = r#"use Socket;
for my $p (@ARGV) {
  for my $t (SOCK_STREAM, SOCK_DGRAM) {
    unlink $p;
    socket(my $l, AF_UNIX, $t, 0) or die "socket: $!";
    bind($l, pack_sockaddr_un($p)) or die "bind $p: $!";
    socket(my $c, AF_UNIX, $t, 0) or die "socket: $!";
    my $got;
    if ($t == SOCK_STREAM) {
      listen($l, 5) or die "listen $p: $!";
      connect($c, pack_sockaddr_un($p)) or die "connect $p: $!";
      accept(my $a, $l) or die "accept $p: $!";
      syswrite($c, "ping"); sysread($a, $got, 4);
    } else {
      send($c, "ping", 0, pack_sockaddr_un($p)) or die "send $p: $!";
      recv($l, $got, 4, 0);
    }
    print "SERVED $p ", ($t == SOCK_STREAM ? "stream" : "dgram"), " $got\n";
    unlink $p;
  }
}
"#;

/// A stream and a datagram socket of the test's, listening at one place; removed on drop.
struct HostSockets {
    stream_path: PathBuf,
    dgram_path: PathBuf,
    stream: UnixListener,
    dgram: UnixDatagram,
}

impl HostSockets {
    /// In `dir` (made if missing), or `None` (a listed skip) where this user cannot.
    fn at(dir: &Path, tag: &str) -> Option<HostSockets> {
        let made = std::fs::create_dir_all(dir);
        let stream_path = dir.join(format!("hs-{tag}-s.sock"));
        let dgram_path = dir.join(format!("hs-{tag}-d.sock"));
        let bound = made.and_then(|()| {
            let stream = UnixListener::bind(&stream_path)?;
            let dgram = UnixDatagram::bind(&dgram_path)?;
            stream.set_nonblocking(true)?;
            dgram.set_nonblocking(true)?;
            Ok((stream, dgram))
        });
        match bound {
            Ok((stream, dgram)) => Some(HostSockets {
                stream_path,
                dgram_path,
                stream,
                dgram,
            }),
            Err(e) => {
                // Root takes a socket in every place; another user lists the places closed
                // to it as skips.
                let why = crate::util::missing_root()
                    .map(|uid| format!("{} is closed to this user ({uid}): {e}", dir.display()));
                assert!(
                    !crate::util::require("root", why),
                    "root cannot bind a socket in {}: {e}",
                    dir.display()
                );
                let _ = std::fs::remove_file(&stream_path);
                None
            }
        }
    }

    /// The client's arguments for both.
    fn args(&self) -> String {
        format!(
            "s='{}' d='{}' ",
            self.stream_path.display(),
            self.dgram_path.display()
        )
    }

    /// Whether anything reached either socket.
    fn reached(&self) -> bool {
        let mut buf = [0u8; 64];
        self.stream.accept().is_ok() || self.dgram.recv(&mut buf).is_ok()
    }
}

impl Drop for HostSockets {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.stream_path);
        let _ = std::fs::remove_file(&self.dgram_path);
    }
}

/// The task's output, with `probe.pl` and `serve.pl` in the workspace.
async fn run(s: Setup, cfg: hub_sidecar::config::Config, ws: &Path, cmd: &str) -> String {
    std::fs::create_dir_all(ws).unwrap();
    std::fs::write(ws.join("probe.pl"), CLIENT).unwrap();
    std::fs::write(ws.join("serve.pl"), SERVER).unwrap();
    let h = s.start(cfg).await;
    h.assign(sample_shell_task("sockets", cmd));
    let done = terminal(h.hub(), "sockets").await;
    let out = done["result"]["output"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    h.finish().await;
    out
}

fn has_perl() -> bool {
    let missing = (!Path::new("/usr/bin/perl").exists())
        .then(|| "/usr/bin/perl is not installed (the task's socket client)".to_string());
    crate::util::require("perl", missing)
}

#[tokio::test]
async fn a_task_reaches_no_host_socket_but_its_own_and_the_granted_ones() {
    if !supported() || !has_perl() {
        return;
    }
    let s = Harness::setup().await;
    let (mut c, ws) = s.cfg_with_workspace();
    let tag = format!("{}-{}", std::process::id(), fastrand::u32(..));
    let home = std::env::var_os("HOME").map(PathBuf::from);
    // Every place the class names: the runtime dirs (as named and through the /var/run
    // link), the host's temp dirs, shared memory, the service user's HOME, the state
    // directory, an operator's tree (/srv) and any other directory outside the grants.
    let mut places: Vec<PathBuf> = vec![
        PathBuf::from(format!("/run/hub-sidecar-it-{tag}")),
        PathBuf::from("/run/lock"),
        PathBuf::from("/var/run/lock"),
        PathBuf::from("/tmp"),
        PathBuf::from("/var/tmp"),
        PathBuf::from("/dev/shm"),
        PathBuf::from(format!("/srv/hub-sidecar-it-{tag}")),
        c.state_dir.clone(),
        s.dir().join("elsewhere"),
    ];
    places.extend(home);
    let hosts: Vec<HostSockets> = places
        .iter()
        .enumerate()
        .filter_map(|(i, d)| HostSockets::at(d, &format!("{tag}-{i}")))
        .collect();
    assert!(hosts.len() >= 6, "too few locations could be tried");
    // Granted by name: reachable, though its directory is hidden.
    let granted = HostSockets::at(&s.dir().join("granted"), &tag).unwrap();
    c.sandbox.sockets = vec![granted.stream_path.clone(), granted.dgram_path.clone()];
    let mut cmd = String::from("perl probe.pl ");
    for h in hosts.iter().chain([&granted]) {
        cmd.push_str(&h.args());
    }
    cmd.push_str("; perl serve.pl \"$PWD/own.sock\" \"$TMPDIR/own.sock\"; true");
    let out = run(s, c, &ws, &cmd).await;
    for h in &hosts {
        for p in [&h.stream_path, &h.dgram_path] {
            assert!(
                out.contains(&format!("refused {}:", p.display())),
                "{}: {out}",
                p.display()
            );
        }
        assert!(
            !h.reached(),
            "{} received the task: {out}",
            h.stream_path.display()
        );
    }
    for p in [&granted.stream_path, &granted.dgram_path] {
        assert!(out.contains(&format!("REACHED {}", p.display())), "{out}");
    }
    assert!(granted.stream.accept().is_ok(), "{out}");
    // The task's own servers, in its workspace and its TMPDIR, both kinds.
    for place in ["ws/own.sock", "/own.sock"] {
        for kind in ["stream ping", "dgram ping"] {
            assert!(
                out.lines()
                    .any(|l| l.starts_with("SERVED") && l.contains(place) && l.ends_with(kind)),
                "{place} {kind}: {out}"
            );
        }
    }
    assert_eq!(out.matches("SERVED").count(), 4, "{out}");
}

#[tokio::test]
async fn a_task_cannot_send_to_the_daemons_notify_socket() {
    if !supported() || !has_perl() {
        return;
    }
    let s = Setup::new().await;
    let notify_dir = s.dir().join("systemd");
    std::fs::create_dir_all(&notify_dir).unwrap();
    let path = notify_dir.join("notify");
    let notify = UnixDatagram::bind(&path).unwrap();
    let ws = s.dir().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("probe.pl"), CLIENT).unwrap();
    let extra = format!("repo_dir = \"{}\"\n", ws.display());
    let h = s
        .start_bin(
            "test-token",
            &extra,
            &[("NOTIFY_SOCKET", path.to_str().unwrap())],
        )
        .await;
    // The daemon itself still tells systemd it is ready.
    let mut buf = [0u8; 512];
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut seen = Vec::new();
    while !seen.iter().any(|m: &String| m.contains("READY=1")) {
        let n = notify
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("{e}; got {seen:?}"));
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let cmd = format!(
        "echo \"notify=${{NOTIFY_SOCKET:-unset}}\"; perl probe.pl d='{p}' s='{p}'; true",
        p = path.display()
    );
    h.assign(sample_shell_task("notify", &cmd));
    let done = terminal(h.hub(), "notify").await;
    let out = done["result"]["output"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(out.contains("notify=unset"), "{out}");
    assert!(
        out.contains(&format!("refused {}:", path.display())),
        "{out}"
    );
    assert!(!out.contains("REACHED"), "{out}");
    notify.set_nonblocking(true).unwrap();
    while let Ok(n) = notify.recv(&mut buf) {
        let msg = String::from_utf8_lossy(&buf[..n]);
        assert!(!msg.contains("hostile"), "the task reached systemd: {msg}");
    }
    h.finish().await;
}
