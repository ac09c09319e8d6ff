//! What this machine lets the daemon enforce ([`Support`]), probed once at start-up: the
//! Landlock ABI, and whether a child can enter its own user, PID and mount namespaces.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::child::ChildPlan;
use super::mounts::MountPlan;
use super::view::TaskView;
use super::{landlock, Sandbox};

/// What this machine lets the daemon enforce; probed once at start-up.
#[derive(Debug, Clone)]
pub struct Support {
    /// Landlock ABI version, 0 when absent.
    pub landlock_abi: i32,
    /// Whether a child can enter new user, PID and mount namespaces, else why not.
    pub namespaces: Result<(), NamespaceError>,
}

/// Why children cannot get their own user, PID and mount namespaces here.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NamespaceError {
    /// `containment = "off"`: nothing was probed.
    #[error("containment is off")]
    Off,
    /// Neither `/usr/bin/true` nor `/bin/true` exists to run the probe with.
    #[error("no /bin/true to probe with")]
    NoProbeProgram,
    /// The probe started but did not exit 0 inside the namespaces.
    #[error("the probe exited with {0}")]
    ProbeFailed(std::process::ExitStatus),
    /// The probe could not start (typically EPERM: unprivileged user namespaces are off).
    #[error("{0}")]
    Spawn(Arc<std::io::Error>),
}

impl Support {
    /// Ask the kernel. Forks one short-lived child (blocking, about a millisecond): call it
    /// off the async runtime.
    pub fn probe() -> Support {
        Support {
            landlock_abi: landlock::kernel_abi(),
            namespaces: probe_namespaces(),
        }
    }

    /// Nothing supported: what `containment = "off"` runs with.
    pub fn none() -> Support {
        Support {
            landlock_abi: 0,
            namespaces: Err(NamespaceError::Off),
        }
    }

    /// The layers that cannot be enforced here, each with what to do about it.
    pub fn missing(&self) -> Vec<String> {
        let mut m = Vec::new();
        if self.landlock_abi < 1 {
            m.push("filesystem confinement: Landlock is unavailable (needs Linux ≥ 5.13 with `landlock` in the kernel's `lsm=` list)".to_string());
        }
        if let Err(e) = &self.namespaces {
            m.push(format!(
                "process confinement: cannot create user, PID, mount and IPC namespaces ({e}), so tasks would also reach the host's socket files; allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0, AppArmor's restrict_unprivileged_userns=0), and in the unit RestrictNamespaces=user pid net mnt ipc and SystemCallFilter= with mount open_tree move_mount"
            ));
        }
        m
    }

    /// One line for `check` and the start-up log.
    pub fn describe(&self) -> String {
        let ll = if self.landlock_abi > 0 {
            format!("Landlock ABI {}", self.landlock_abi)
        } else {
            "no Landlock".into()
        };
        let ns = if self.namespaces.is_ok() {
            "user + PID + mount + IPC namespaces (host sockets hidden)"
        } else {
            "no namespaces"
        };
        format!("{ll}, {ns}, resource limits")
    }
}

/// Can a child enter new user, PID and mount namespaces here? Runs `true` in them.
fn probe_namespaces() -> Result<(), NamespaceError> {
    // The task's way: user and mount namespaces made once by a holder, with an empty plan
    // (the namespaces are made, as the daemon's tasks need and the shipped unit must allow,
    // nothing is mounted), then joined by the child, which makes its PID namespace.
    let view =
        TaskView::create(&MountPlan::default()).map_err(|e| NamespaceError::Spawn(Arc::new(e)))?;
    let plan = ChildPlan {
        rlimits: Vec::new(),
        namespaces: Some(view.join()),
        own_network: false,
        proxied: false,
        landlock_fd: None,
    };
    let sb = Arc::new(Sandbox {
        plan,
        _ruleset: None,
        _view: Some(view),
        tmp: PathBuf::new(),
        agent_template: None,
        fs: None,
        network_cut: false,
        proxy: None,
        config: None,
        home: None,
        caches_bytes: None,
    });
    let true_bin = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or(NamespaceError::NoProbeProgram)?;
    let mut cmd = std::process::Command::new(true_bin);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let _spawning = sb
        .install(&mut cmd)
        .map_err(|e| NamespaceError::Spawn(Arc::new(e)))?;
    // What is asked is whether the namespaces can be made, not whether a program runs: once
    // the plan is applied, the namespace's PID 1 leaves without exec'ing `true`. Loading a
    // program was half the probe, and the probe is on the way to `identify`.
    // SAFETY: `_exit` is async-signal-safe; it runs after the plan, in the forked child.
    #[allow(unsafe_code)]
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| libc::_exit(0));
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(NamespaceError::ProbeFailed(s)),
        Err(e) => Err(NamespaceError::Spawn(Arc::new(e))),
    }
}
