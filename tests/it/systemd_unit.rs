//! The shipped unit under a real systemd: `config/hub-sidecar.service` booted as the
//! service user, one task from the mock hub to `verified`, then a clean stop.
//!
//! systemd runs as PID 1 of a private PID + mount namespace (see
//! `fixtures/systemd-boot.sh`), so the host's services, `/tmp` and users are untouched.
//! The unit file is the shipped one, with two changes only: `ExecStart` names the binary
//! under test, and a drop-in sends its log to a file (there is no journal in the namespace).
//! Needs root (to create the namespaces and boot systemd), systemd, `unshare`, `nsenter`,
//! and a kernel that can confine tasks; elsewhere the test says why and returns.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions};
use serde_json::{json, Value};

use crate::util::*;

const TOKEN: &str = "tok-unit-5c1e8a2b9d";
const SYSTEMD: &str = "/lib/systemd/systemd";

/// Python run by the task: open the daemon's (argv[1]) environ and mem, try to ptrace it.
const PROBE_DAEMON: &str = r#"
import ctypes, os, sys
d = int(sys.argv[1])
print("daemon-visible" if os.path.isdir("/proc/%d" % d) else "daemon-invisible")
for f in ("environ", "mem"):
    try:
        open("/proc/%d/%s" % (d, f), "rb").close()
        print("OPEN-" + f)
    except OSError as e:
        print("denied-%s %s" % (f, e.errno))
libc = ctypes.CDLL(None, use_errno=True)
print("PTRACE-OK" if libc.ptrace(16, d, 0, 0) == 0 else "denied-ptrace %d" % ctypes.get_errno())
"#;

/// Why this machine cannot run the test, if it cannot.
/// The gate of the booted-unit tests: root (to boot systemd in a private namespace),
/// systemd, `unshare`/`nsenter`, containment (each a `require`: a listed skip, or a failure
/// where CI requires it).
fn supported() -> bool {
    let systemd = (!Path::new(SYSTEMD).exists()).then(|| format!("no systemd at {SYSTEMD}"));
    crate::util::require("root", crate::util::missing_root())
        && crate::util::require("systemd", systemd)
        && ["unshare", "nsenter"]
            .iter()
            .all(|t| crate::util::require("unshare", crate::util::missing_tool(t)))
        && crate::containment::supported()
}

/// The booted systemd; killing it (on drop) ends everything in its namespace. Also used by
/// the package test (`package/apt.rs`), whose systemd runs in a Debian root of its own.
pub(crate) struct Booted {
    unshare: std::process::Child,
    /// systemd's pid as the host sees it.
    pid: u32,
    dir: PathBuf,
}

impl Booted {
    fn boot(dir: &Path) -> Booted {
        Booted::boot_with(
            "systemd-boot.sh",
            dir,
            &[Path::new(env!("CARGO_MANIFEST_DIR"))],
        )
    }

    /// Run `fixtures/SCRIPT DIR ARGS…` as PID 1 of new PID + mount namespaces; it ends by
    /// exec'ing systemd. Its stderr goes to `DIR/boot.log`.
    pub(crate) fn boot_with(script: &str, dir: &Path, args: &[&Path]) -> Booted {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/it/fixtures")
            .join(script);
        let mut unshare = Command::new("unshare")
            .args(["--pid", "--mount", "--fork", "--mount-proc", "sh"])
            .arg(&script)
            .arg(dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("boot.log")).unwrap())
            .spawn()
            .expect("start unshare");
        let children = format!("/proc/{0}/task/{0}/children", unshare.id());
        let mut pid = None;
        for _ in 0..500 {
            pid = std::fs::read_to_string(&children)
                .ok()
                .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()));
            if pid.is_some() {
                break;
            }
            if let Ok(Some(st)) = unshare.try_wait() {
                panic!(
                    "the namespace ended at once ({st}): {}",
                    read(&dir.join("boot.log"))
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Booted {
            unshare,
            pid: pid.expect("systemd's pid"),
            dir: dir.to_path_buf(),
        }
    }

    /// `systemctl ARGS` inside the namespace: (success, stdout + stderr).
    pub(crate) fn systemctl(&self, args: &[&str]) -> (bool, String) {
        let mut cmd = vec!["systemctl"];
        cmd.extend_from_slice(args);
        self.exec(&cmd)
    }

    /// `CMD…` inside the namespace, in systemd's root directory: (success, stdout + stderr).
    pub(crate) fn exec(&self, cmd: &[&str]) -> (bool, String) {
        let out = Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-m", "-p", "-r", "-w"])
            .args(cmd)
            .stdin(Stdio::null())
            .output()
            .expect("run nsenter");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text.trim().to_string())
    }

    pub(crate) fn property(&self, unit: &str, prop: &str) -> String {
        self.systemctl(&["show", "-p", prop, "--value", unit]).1
    }

    pub(crate) fn daemon_log(&self) -> String {
        read(&self.dir.join("daemon.log"))
    }

    /// Assign `task` on `hub` to the booted daemon and wait for its `task_complete` (a
    /// `task_failed`, or none within a minute, fails the test with the daemon's log).
    pub(crate) async fn complete(&self, hub: &MockHub, task: Value) -> Value {
        hub.assign(task);
        let done = hub
            .wait_for(
                |f| f["type"] == "task_complete" || f["type"] == "task_failed",
                Duration::from_secs(60),
            )
            .await
            .unwrap_or_else(|| panic!("no result; log:\n{}", self.daemon_log()));
        assert_eq!(
            done["type"],
            "task_complete",
            "{done:#}\nlog:\n{}",
            self.daemon_log()
        );
        done
    }

    /// The uid install.sh gave the service user (in the namespace's /etc only).
    fn service_uid(&self) -> u32 {
        read(&self.dir.join("uid"))
            .trim()
            .parse()
            .unwrap_or_else(|_| {
                panic!(
                    "install.sh did not create the user: {}",
                    read(&self.dir.join("install.log"))
                )
            })
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        // SIGKILL to the namespace's init ends the namespace and everything in it.
        // SAFETY: kill takes plain integers.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.pid as i32, libc::SIGKILL);
        }
        let _ = self.unshare.wait();
    }
}

pub(crate) fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The stand-in targets the unit orders against, and the test's drop-ins: the log to a
/// file (no journal here) and `dropin`'s lines. The units themselves are the ones
/// install.sh installs (see `fixtures/systemd-boot.sh`).
pub(crate) fn write_units(dir: &Path, dropin: &str) {
    let units = dir.join("units");
    std::fs::create_dir_all(units.join("hub-sidecar.service.d")).unwrap();
    std::fs::write(
        units.join("hub-sidecar.service.d/log.conf"),
        "[Service]\nStandardOutput=append:/run/hub-sidecar-test/daemon.log\nStandardError=inherit\n",
    )
    .unwrap();
    std::fs::write(
        units.join("hub-sidecar.service.d/test.conf"),
        format!("[Service]\n{dropin}\n"),
    )
    .unwrap();
    for t in [
        "sysinit",
        "basic",
        "multi-user",
        "network",
        "network-online",
        "shutdown",
        "sockets",
        "timers",
        "paths",
        "local-fs",
        "slices",
        "hub-sidecar-test",
    ] {
        std::fs::write(
            units.join(format!("{t}.target")),
            format!("[Unit]\nDescription={t} (test stand-in)\n"),
        )
        .unwrap();
    }
    std::fs::write(
        units.join("system.slice"),
        "[Unit]\nDescription=System Slice\nDefaultDependencies=no\n",
    )
    .unwrap();
}

/// The unit booted and identified with a mock hub.
struct Rig {
    sd: Booted,
    hub: MockHub,
    /// The service user's uid (and gid).
    uid: u32,
    _tmp: tempfile::TempDir,
}

/// Boot systemd with the shipped unit plus `dropin` (more `[Service]` lines, e.g. another
/// `User=`) and a config for `hub`, in `dir`; the unit is not started. `None` (and a
/// message) where this machine cannot.
fn boot_unit(dir: &Path, hub: &MockHub, dropin: &str) -> Option<Booted> {
    if !supported() {
        return None;
    }
    use std::os::unix::fs::PermissionsExt;
    // The service user walks into the test directory for its binary: 0755, owned by root.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_hub-sidecar"), dir.join("hub-sidecar")).unwrap();
    write_units(dir, dropin);
    // The operator's edit of the example config install.sh copies: the three lines its
    // "next steps" name, nothing else.
    std::fs::write(
        dir.join("edit.sed"),
        format!(
            "s|^agent_id = .*|agent_id = \"worker-unit\"|\ns|^token = .*|token = \"{TOKEN}\"|\ns|^hub_url = .*|hub_url = \"{}\"|\n",
            hub.url()
        ),
    )
    .unwrap();
    Some(Booted::boot(dir))
}

/// Wait until the booted systemd is up.
pub(crate) async fn wait_booted(sd: &Booted) {
    let booted = wait_until(
        || {
            matches!(
                sd.systemctl(&["is-system-running"]).1.as_str(),
                "running" | "degraded"
            )
        },
        T,
    )
    .await;
    assert!(
        booted,
        "systemd did not boot: {}",
        read(&sd.dir.join("boot.log"))
    );
}

/// [`boot_unit`], then start the unit and wait until it has identified and is active.
async fn start_unit(dropin: &str) -> Option<Rig> {
    let tmp = tempfile::tempdir().unwrap();
    let hub = MockHub::start(MockHubOptions {
        agents: vec![("worker-unit".into(), TOKEN.into())],
        ..MockHubOptions::default()
    })
    .await
    .unwrap();
    let sd = boot_unit(tmp.path(), &hub, dropin)?;
    wait_booted(&sd).await;
    let uid = sd.service_uid();
    let (ok, out) = sd.systemctl(&["start", "--no-block", "hub-sidecar.service"]);
    assert!(ok, "systemctl start: {out}");
    hub.wait_for_type("identify", T)
        .await
        .unwrap_or_else(|| panic!("the unit never identified; log:\n{}", sd.daemon_log()));
    assert!(
        wait_until(
            || sd.property("hub-sidecar.service", "ActiveState") == "active",
            T
        )
        .await,
        "the unit did not become active (READY=1); log:\n{}",
        sd.daemon_log()
    );
    Some(Rig {
        sd,
        hub,
        uid,
        _tmp: tmp,
    })
}

#[tokio::test]
async fn the_shipped_unit_runs_a_confined_task_as_the_service_user_and_stops_cleanly() {
    let Some(Rig { sd, hub, uid, _tmp }) = start_unit("").await else {
        return;
    };
    // What install.sh left, as the service user needs it: the config readable by it alone,
    // its directory closed to others, the state directory its own, the binary not its own.
    let installed = read(&sd.dir.join("installed"));
    for want in [
        "root hub-sidecar 750 /etc/hub-sidecar",
        "hub-sidecar hub-sidecar 600 /etc/hub-sidecar/hub-sidecar.toml",
        "hub-sidecar hub-sidecar 750 /var/lib/hub-sidecar",
        "root root 755 /run/hsc/bin/hub-sidecar",
    ] {
        assert!(installed.lines().any(|l| l == want), "{want}: {installed}");
    }
    // `$$` is 1 when the command is the init of a PID namespace of its own. Then the
    // daemon's own memory: its environ and mem closed, ptrace refused (the daemon's pid is
    // named, so the check cannot pass by not finding it).
    let daemon = sd.property("hub-sidecar.service", "MainPID");
    let mut task = sample_shell_task(
        "unit-task",
        &format!("id -u; echo pid=$$; cat /proc/self/uid_map; echo done > done.txt; python3 -c '{PROBE_DAEMON}' {daemon}"),
    );
    task["verification_steps"] = json!([{"type": "file_exists", "target": "done.txt"}]);
    let done = sd.complete(&hub, task).await;
    let result = &done["result"];
    assert_eq!(result["verification_status"], "verified", "{done:#}");
    assert_eq!(result["containment"], "strict", "{done:#}");
    let output = result["output"].as_str().unwrap_or_default();
    let lines: Vec<Vec<&str>> = output
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let id = uid.to_string();
    assert_eq!(
        lines.first(),
        Some(&vec![id.as_str()]),
        "runs as the service user: {output}"
    );
    assert!(
        lines.contains(&vec!["pid=1"]),
        "a PID namespace of its own: {output}"
    );
    // Only the service user's own id is mapped in the task's user namespace.
    assert_eq!(
        lines.get(2),
        Some(&vec![id.as_str(), id.as_str(), "1"]),
        "uid map: {output}"
    );
    // Under the unit the daemon is not even listed (ProtectProc=invisible hides a
    // non-dumpable process), and ptrace is outside the unit's system-call filter; the suite's
    // containment tests show the same refusals without systemd's help.
    for (what, allowed) in [
        ("environ", "OPEN-environ"),
        ("mem", "OPEN-mem"),
        ("ptrace", "PTRACE-OK"),
    ] {
        assert!(
            !output.contains(allowed),
            "the task could {what} the daemon: {output}"
        );
        assert!(
            output.contains(&format!("denied-{what}")),
            "{what} not tried: {output}"
        );
    }
    assert!(!output.contains(TOKEN));
    assert_no_violations(&hub);

    let (ok, out) = sd.systemctl(&["stop", "hub-sidecar.service"]);
    assert!(ok, "systemctl stop: {out}\nlog:\n{}", sd.daemon_log());
    assert_eq!(
        sd.property("hub-sidecar.service", "ActiveState"),
        "inactive"
    );
    assert_eq!(
        sd.property("hub-sidecar.service", "Result"),
        "success",
        "log:\n{}",
        sd.daemon_log()
    );
}

#[tokio::test]
async fn the_unit_run_as_root_is_refused_at_start_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let hub = MockHub::start(MockHubOptions::default()).await.unwrap();
    let Some(sd) = boot_unit(dir, &hub, "User=root\nGroup=root") else {
        return;
    };
    wait_booted(&sd).await;
    let (ok, out) = sd.systemctl(&["start", "--no-block", "hub-sidecar.service"]);
    assert!(ok, "systemctl start: {out}");
    let refused = wait_until(
        || {
            sd.daemon_log()
                .contains("refusing to run as root without root's capabilities")
        },
        T,
    )
    .await;
    assert!(refused, "log:\n{}", sd.daemon_log());
    assert!(sd.daemon_log().contains("User=hub-sidecar"));
    assert!(hub.received_of("identify").is_empty());
}
