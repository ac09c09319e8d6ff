//! What this machine lets the daemon enforce ([`Support`]), probed once at start-up: the
//! Landlock ABI, and whether a child can enter its own user, PID and mount namespaces.

use std::path::Path;
use std::sync::Arc;

use super::ipc::IpcPlan;
use super::mounts::MountPlan;
use super::netns::NetPlan;
use super::view::TaskView;
use super::{landlock, refusal, Sandbox};

/// What this machine lets the daemon enforce; probed once at start-up.
#[derive(Debug, Clone)]
pub struct Support {
    /// Landlock ABI version, 0 when absent.
    pub landlock_abi: i32,
    /// Whether a child can enter new user, PID and mount namespaces, else why not.
    pub namespaces: Result<(), NamespaceError>,
    /// Who refused what is missing, when the probe could tell (a seccomp filter, an LSM,
    /// a sysctl, the kernel), with what to allow.
    pub refused: Refused,
}

/// What [`refusal`] made of a failed probe; `None` leaves the general advice.
#[derive(Debug, Clone, Default)]
pub struct Refused {
    /// Why Landlock is unavailable.
    pub landlock: Option<String>,
    /// Why the namespaces are.
    pub namespaces: Option<String>,
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
        let landlock = landlock::kernel_abi_or_errno();
        let namespaces = probe_namespaces();
        let facts = (landlock.is_err() || namespaces.is_err()).then(refusal::Facts::read);
        let refused = match &facts {
            None => Refused::default(),
            Some(f) => Refused {
                landlock: landlock.as_ref().err().map(|e| refusal::landlock(e, f)),
                namespaces: match &namespaces {
                    Err(NamespaceError::Spawn(e)) => refusal::namespaces(e, f),
                    _ => None,
                },
            },
        };
        Support {
            landlock_abi: landlock.unwrap_or(0),
            namespaces,
            refused,
        }
    }

    /// Nothing supported: what `containment = "off"` runs with.
    pub fn none() -> Support {
        Support {
            landlock_abi: 0,
            namespaces: Err(NamespaceError::Off),
            refused: Refused::default(),
        }
    }

    /// The layers that cannot be enforced here, each with what to do about it.
    pub fn missing(&self) -> Vec<String> {
        let mut m = Vec::new();
        if self.landlock_abi < 1 {
            m.push(match &self.refused.landlock {
                Some(why) => format!("filesystem confinement: {why}"),
                None => "filesystem confinement: Landlock is unavailable (needs Linux ≥ 5.13 with `landlock` in the kernel's `lsm=` list)".to_string(),
            });
        }
        if let (Err(e), Some(why)) = (&self.namespaces, &self.refused.namespaces) {
            m.push(format!(
                "process confinement: cannot create user, PID and mount namespaces ({e}), so tasks would also reach the host's socket files: {why}"
            ));
        } else if let Err(e) = &self.namespaces {
            m.push(format!(
                "process confinement: cannot create user, PID and mount namespaces ({e}), so tasks would also reach the host's socket files; allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0, AppArmor's restrict_unprivileged_userns=0), and in the unit RestrictNamespaces=user pid net mnt ipc, SystemCallFilter= with mount open_tree move_mount and, under ProtectKernelTunables=, ReadWritePaths=/proc/sys/kernel (a task's IPC namespace gets its bounds there)"
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
    let view = TaskView::create(&MountPlan::default(), &IpcPlan::new(0), NetPlan::Host)
        .map_err(|e| NamespaceError::Spawn(Arc::new(e)))?;
    let sb = Sandbox::joining(view);
    let true_bin = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or(NamespaceError::NoProbeProgram)?;
    // Made as every task's child is (see `launch.rs`): the probe is what a task meets.
    let status = super::launch(&super::Launch {
        program: std::ffi::OsStr::new(true_bin),
        args: &[],
        cwd: Path::new("/"),
        env: &[],
        stdio: [super::Stdio::Null; 3],
        sandbox: Some(&sb),
    })
    .and_then(|mut child| child.wait_blocking());
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(NamespaceError::ProbeFailed(s)),
        Err(e) => Err(NamespaceError::Spawn(Arc::new(e))),
    }
}
