//! Kernel channels no mount or network namespace separates (issue 43, row 3): SysV IPC and
//! the key store. A task sees none of the host's (the daemon's) IPC objects, leaves none to
//! the next task, holds no more shared memory than its memory limit; it reads no key of the
//! daemon's session keyring and leaves no key to the next task.
//!
//! The tasks are perl scripts (perl's `shmget`/`msgget` and `syscall` are built in: no module,
//! no compiler at test time).

use std::path::Path;

use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions};

use crate::containment::supported;
use crate::git::terminal;
use crate::harness::Harness;
use crate::util::{assert_no_violations, write_config, Bin, PreExec, T};

/// SysV IPC, as a task or the host sees it. `probe KEY SHMID MSGID` reads the shared-memory
/// segment and the message queue of `KEY` and of those ids (`SHM-READ`/`MSG-READ` and what
/// was in them); `leave KEY MARK` makes a segment and a queue of `KEY` with `MARK` in each
/// and leaves them (`LEFT SHMID MSGID`); `big MIB…` asks for segments (`SHM-MADE`/`no shm`)
/// and removes them; `forget KEY` removes the segment and queue of `KEY`.
const IPC: &str = r#"use strict;
my ($mode, @a) = @ARGV;
my ($CREAT, $NOWAIT, $RMID) = (01000, 04000, 0);
sub out { my ($s) = @_; $s =~ s/\0.*//s; $s }
if ($mode eq "probe") {
  my ($key, $shmid, $msgid) = @a;
  my $k = shmget(0 + $key, 0, 0);
  my @ids = grep { defined } ($k, $shmid eq "-" ? undef : 0 + $shmid);
  print "no shm key $key: $!\n" unless defined $k;
  for my $id (@ids) {
    my $buf;
    if (shmread($id, $buf, 0, 64)) { print "SHM-READ $id ", out($buf), "\n" } else { print "no shm $id: $!\n" }
  }
  my $q = msgget(0 + $key, 0);
  print "no msg key $key: $!\n" unless defined $q;
  for my $id (grep { defined } ($q, $msgid eq "-" ? undef : 0 + $msgid)) {
    my $buf;
    if (msgrcv($id, $buf, 64, 0, $NOWAIT)) { print "MSG-READ $id ", out(substr($buf, 8)), "\n" } else { print "no msg $id: $!\n" }
  }
  open my $l, "<", "/proc/sysvipc/shm" or die; my @l = <$l>; print "SYSVIPC-SHM ", scalar(@l) - 1, "\n";
} elsif ($mode eq "leave") {
  my ($key, $mark) = @a;
  my $s = shmget(0 + $key, 4096, $CREAT | 0600) // die "shmget: $!";
  shmwrite($s, $mark, 0, length $mark) or die "shmwrite: $!";
  my $q = msgget(0 + $key, $CREAT | 0600) // die "msgget: $!";
  msgsnd($q, pack("l! a*", 1, $mark), $NOWAIT) or die "msgsnd: $!";
  print "LEFT $s $q\n";
} elsif ($mode eq "big") {
  my @made;
  for my $mib (@a) {
    my $s = shmget(0, $mib * 1024 * 1024, $CREAT | 0600);
    print defined $s ? "SHM-MADE $mib\n" : "no shm $mib: $!\n";
    push @made, $s if defined $s;
  }
  shmctl($_, $RMID, 0) for @made;
  for my $f ("shmmax", "shmall", "msgmni") {
    open my $h, "<", "/proc/sys/kernel/$f" or die; my $v = <$h>; chomp $v; print "SYSCTL $f $v\n";
    print open(my $w, ">", "/proc/sys/kernel/$f") ? "WROTE $f\n" : "cannot write $f: $!\n";
  }
} elsif ($mode eq "forget") {
  my ($key) = @a;
  my $s = shmget(0 + $key, 0, 0); shmctl($s, $RMID, 0) if defined $s;
  my $q = msgget(0 + $key, 0); msgctl($q, $RMID, 0) if defined $q;
}
"#;

fn has_perl() -> bool {
    // The the tasks' IPC and key client.
    crate::util::require("perl", crate::util::missing_tool("perl"))
}

/// Run `ipc.pl ARGS` here, outside any task: the host's (the daemon's) IPC namespace.
fn host_ipc(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("perl")
        .arg(dir.join("ipc.pl"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn output(done: &serde_json::Value) -> String {
    done["result"]["output"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_task_sees_no_host_ipc_object_and_leaves_none_to_the_next() {
    if !supported() || !has_perl() {
        return;
    }
    let s = Harness::setup().await;
    let (mut c, ws) = s.cfg_with_workspace();
    c.sandbox.max_memory_mb = 128;
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("ipc.pl"), IPC).unwrap();
    // The host's copy, outside the workspace the tasks may change.
    let host = s.dir().join("host");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("ipc.pl"), IPC).unwrap();
    let tag = fastrand::u32(1..1 << 30);
    let (host_key, task_key) = ((tag | 1).to_string(), (tag & !1).to_string());
    let (host_mark, task_mark) = (format!("host-{tag}"), format!("task-{tag}"));
    // The daemon's side: a segment and a queue, as the service user's other programs (or
    // an earlier task, before tasks had namespaces of their own) leave them.
    let left = host_ipc(&host, &["leave", &host_key, &host_mark]);
    let ids: Vec<&str> = left.split_whitespace().skip(1).collect();
    let (host_shm, host_msg) = (ids[0].to_string(), ids[1].to_string());
    let h = s.start(c).await;
    h.assign(sample_shell_task(
        "ipc-1",
        &format!(
            "perl ipc.pl probe {host_key} {host_shm} {host_msg}; perl ipc.pl leave {task_key} {task_mark}; perl ipc.pl big 256 100 100"
        ),
    ));
    let first = output(&terminal(h.hub(), "ipc-1").await);
    let theirs: Vec<String> = first
        .lines()
        .find_map(|l| l.strip_prefix("LEFT "))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .unwrap_or_else(|| panic!("the first task made no IPC objects: {first}"));
    h.assign(sample_shell_task(
        "ipc-2",
        &format!("perl ipc.pl probe {task_key} {} {}", theirs[0], theirs[1]),
    ));
    let second = output(&terminal(h.hub(), "ipc-2").await);
    // Nothing of the first task's is left on the host either, and the host's objects are
    // still there, unread.
    let after = host_ipc(&host, &["probe", &task_key, "-", "-"]);
    let host_after = host_ipc(&host, &["probe", &host_key, "-", "-"]);
    // Whatever happened, nothing of the test's stays on the host.
    host_ipc(&host, &["forget", &host_key]);
    host_ipc(&host, &["forget", &task_key]);
    h.finish().await;
    assert!(
        !first.contains(&host_mark),
        "a task read the host's: {first}"
    );
    assert!(first.contains("SYSVIPC-SHM 0"), "{first}");
    assert!(
        !second.contains(&task_mark),
        "a task read the last one's: {second}"
    );
    assert!(second.contains("SYSVIPC-SHM 0"), "{second}");
    assert!(
        !after.contains(&task_mark),
        "a task's object outlived it: {after}"
    );
    assert!(
        host_after.contains(&format!("SHM-READ {host_shm} {host_mark}")),
        "{host_after}"
    );
    // Shared memory is bounded by the task's memory limit (128 MiB): not one segment over
    // it, nor two that together are; and the task cannot lift the bound.
    assert!(first.contains("no shm 256:"), "{first}");
    assert!(first.contains("SHM-MADE 100"), "{first}");
    assert_eq!(first.matches("SHM-MADE").count(), 1, "{first}");
    assert!(first.contains("SYSCTL shmmax 134217728"), "{first}");
    assert!(first.contains("SYSCTL msgmni 32"), "{first}");
    assert!(!first.contains("WROTE"), "{first}");
}

/// The key calls, as a task makes them: `KEYS ADD_KEY KEYCTL MODE ARGS`. Every mode looks
/// for each description in `SEEK` (comma-separated) in the task's session, user and
/// user-session keyrings (`FOUND` and what it read), reads every key `/proc/keys` shows it
/// (`READ`), and links every one into its own session keyring to read through it
/// (`LINKED`); `add DESC PAYLOAD` first adds a key to its session and user keyrings.
const KEYS: &str = r#"use strict;
my ($add_key, $keyctl, $seek, $mode, @a) = @ARGV;
($add_key, $keyctl) = (0 + $add_key, 0 + $keyctl);
my @seek = split /,/, $seek;
sub rd { my ($id) = @_; my $buf = "\0" x 4096; my $n = syscall($keyctl, 11, 0 + $id, $buf, 4096); $n >= 0 ? substr($buf, 0, $n) : undef }
sub find { my ($ring, $d) = @_; my $t = "user"; my $id = syscall($keyctl, 10, 0 + $ring, $t, $d, 0); $id >= 0 ? $id : undef }
sub seek_all {
  my ($how) = @_;
  for my $d (@seek) { for my $ring (-3, -4, -5) {
    my $id = find($ring, $d);
    print defined $id ? "$how $d in $ring: " . (rd($id) // "unreadable: $!") . "\n" : "not found $d in $ring: $!\n";
  } }
}
if ($mode eq "add") {
  my ($d, $p) = @a;
  for my $ring (-3, -4) {
    my $t = "user";
    my $id = syscall($add_key, $t, $d, $p, length $p, $ring);
    print $id >= 0 ? "ADDED $d to $ring\n" : "add refused $ring: $!\n";
  }
}
seek_all("FOUND");
open my $pk, "<", "/proc/keys" or die "/proc/keys: $!";
my $n = 0;
while (<$pk>) {
  my ($hex) = split; my $id = hex $hex; $n++;
  my $v = rd($id);
  print "READ $hex: $v\n" if defined $v && $v =~ /^[\w-]+$/;
  syscall($keyctl, 8, $id, -3);
}
print "PROC-KEYS $n\n";
seek_all("LINKED");
"#;

/// Before the daemon execs: a session keyring of its own with `desc` = `payload` in it (as
/// systemd's service keyring or a login's holds the invocation id or a credential).
fn daemon_keyring(desc: &'static std::ffi::CStr, payload: &'static [u8]) -> PreExec {
    Box::new(move || {
        // SAFETY: two key system calls on static data: async-signal-safe.
        #[allow(unsafe_code)]
        unsafe {
            if libc::syscall(libc::SYS_keyctl, 1, c"hub-sidecar-it".as_ptr()) < 0
                || libc::syscall(
                    libc::SYS_add_key,
                    c"user".as_ptr(),
                    desc.as_ptr(),
                    payload.as_ptr(),
                    payload.len(),
                    -3,
                ) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    })
}

#[tokio::test]
async fn a_task_reads_no_key_of_the_daemons_and_leaves_none_to_the_next() {
    if !supported() || !has_perl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("keys.pl"), KEYS).unwrap();
    let token = "tok-keys-7c1d";
    let hub = MockHub::start(MockHubOptions {
        agents: vec![("sidecar-test".into(), token.into())],
        ..MockHubOptions::default()
    })
    .await
    .unwrap();
    let config = write_config(
        &hub,
        dir.path(),
        token,
        &format!("repo_dir = \"{}\"\n", ws.display()),
    );
    let (daemon_desc, daemon_mark) = (c"hub-sidecar-it-daemon-key", b"daemon-secret-5e2b9f");
    let bin = Bin::start_with_hook(
        dir.path(),
        &config,
        &[],
        Some(daemon_keyring(daemon_desc, daemon_mark)),
    );
    hub.wait_for_type("identify", T)
        .await
        .unwrap_or_else(|| panic!("no identify; daemon log:\n{}", bin.logs()));
    let tag = fastrand::u32(..);
    let task_desc = format!("hub-sidecar-it-task-key-{tag}");
    let task_mark = format!("task-secret-{tag}");
    let seek = format!("{},{task_desc}", daemon_desc.to_str().unwrap());
    let keys = format!(
        "perl keys.pl {} {} {seek}",
        libc::SYS_add_key,
        libc::SYS_keyctl
    );
    let mut outs = Vec::new();
    for (id, cmd) in [
        ("keys-1", format!("{keys} add {task_desc} {task_mark}")),
        ("keys-2", format!("{keys} look")),
    ] {
        hub.assign(sample_shell_task(id, &cmd));
        let done = terminal(&hub, id).await;
        outs.push(output(&done));
    }
    assert_no_violations(&hub);
    drop(bin);
    let daemon_mark = std::str::from_utf8(daemon_mark).unwrap();
    for out in &outs {
        assert!(out.contains("PROC-KEYS"), "the probe did not run: {out}");
        assert!(
            !out.contains(daemon_mark),
            "a task read the daemon's key: {out}"
        );
    }
    assert!(
        !outs[1].contains(&task_mark),
        "a task read the last one's key: {}",
        outs[1]
    );
}
