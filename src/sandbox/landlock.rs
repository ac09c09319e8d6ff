//! A task's filesystem policy as a Landlock ruleset: which trees are read-only, which are
//! read-write, and which paths stay closed even inside a granted tree.
//!
//! Landlock grants rights on whole hierarchies and has no "deny" rule, so a denied path
//! inside a granted tree (the daemon's config file in `/etc`, its state directory under the
//! service user's HOME) is honoured by *carving*: the granted tree is replaced by its
//! children, recursively along the way to the denied path, leaving that one branch out.

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, BitFlags, PathBeneath, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, ABI,
};

/// The Landlock ABI this build asks for: filesystem rights up to ioctl on devices, and the
/// signal and abstract-socket scopes (kernel 6.12). Older kernels get what they support.
const TARGET_ABI: ABI = ABI::V6;

/// What the running kernel supports: 0 when Landlock is absent or disabled.
pub fn kernel_abi() -> i32 {
    kernel_abi_or_errno().unwrap_or(0)
}

/// The ABI, or how the call failed: its errno tells a kernel without Landlock from a
/// seccomp filter or an LSM refusing it (`super::refusal`).
pub fn kernel_abi_or_errno() -> std::io::Result<i32> {
    // SAFETY: with a NULL attribute, size 0 and the VERSION flag, the call only reports
    // the ABI version; it touches no memory.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    if v < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(v as i32)
    }
}

/// Paths a task's children may use. Every list holds canonical paths.
#[derive(Debug, Clone, Default)]
pub struct FsPolicy {
    /// Read and execute.
    pub read: Vec<PathBuf>,
    /// Read, write, create, remove (never device nodes).
    pub write: Vec<PathBuf>,
    /// Closed even when inside a `read` or `write` tree.
    pub deny: Vec<PathBuf>,
}

/// Why a ruleset could not be built: Landlock missing here, or the kernel refusing a step.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The kernel has no Landlock (or it is not in the `lsm=` list).
    #[error("Landlock is not available in this kernel (needs Linux ≥ 5.13 with landlock in the `lsm=` list)")]
    Unavailable,
    /// One step of building the ruleset failed; `step` says which.
    #[error("Landlock: {step}: {source}")]
    Step {
        /// What was being done, e.g. `granting /usr`.
        step: String,
        /// What the landlock crate reported.
        source: landlock::RulesetError,
    },
    /// A granted path could not be opened to name it in a rule.
    #[error("Landlock: granting {}: {source}", path.display())]
    Open {
        /// The path the rule was for.
        path: PathBuf,
        /// What opening it reported.
        source: landlock::PathFdError,
    },
    /// The kernel accepted every rule but handed back no ruleset descriptor.
    #[error("Landlock: the kernel refused the ruleset")]
    Refused,
}

/// An enforceable ruleset, and what the kernel made of it.
#[derive(Debug)]
pub struct Built {
    /// The ruleset descriptor the child restricts itself with.
    pub fd: OwnedFd,
    /// The ABI in force (at most the ABI this build targets, 6).
    pub abi: i32,
    /// Whether signals and abstract sockets are scoped to the domain (ABI ≥ 6).
    pub scoped: bool,
}

impl Built {
    /// The descriptor as the child's `landlock_restrict_self` takes it.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// Build the ruleset for `policy`. `Err` names what failed.
pub fn build(policy: &FsPolicy) -> Result<Built, BuildError> {
    let abi = kernel_abi();
    if abi < 1 {
        return Err(BuildError::Unavailable);
    }
    let all = AccessFs::from_all(TARGET_ABI);
    let read = AccessFs::from_read(TARGET_ABI);
    // Device nodes are never made, even in the workspace: a node for a disk would be a way
    // around every rule here.
    let write = all & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let file_rights = AccessFs::from_file(TARGET_ABI);
    let step = |what: &str| {
        let what = what.to_string();
        move |source: landlock::RulesetError| BuildError::Step { step: what, source }
    };
    let mut rs = Ruleset::default()
        .handle_access(all)
        .map_err(step("handling filesystem access"))?
        .scope(Scope::from_all(TARGET_ABI))
        .map_err(step("scoping signals and sockets"))?
        .create()
        .map_err(step("creating the ruleset"))?;
    for (paths, access) in [(&policy.read, read), (&policy.write, write)] {
        for grant in paths {
            for p in carve(grant, &policy.deny) {
                rs = add(rs, &p, access, file_rights)?;
            }
        }
    }
    let fd: Option<OwnedFd> = rs.into();
    let fd = fd.ok_or(BuildError::Refused)?;
    Ok(Built {
        fd,
        abi: abi.min(6),
        scoped: abi >= 6,
    })
}

fn add(
    rs: landlock::RulesetCreated,
    path: &Path,
    access: BitFlags<AccessFs>,
    file_rights: BitFlags<AccessFs>,
) -> Result<landlock::RulesetCreated, BuildError> {
    // Opened without following a link anywhere on the way: `path` is canonical, so a link in
    // it now was planted since it was resolved (a task's tree changed under the daemon), and
    // granting what it points to would be a grant the task chose. Refused, not followed.
    let (fd, is_dir) = match super::beneath::open_exact(path) {
        Ok(opened) => opened,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            tracing::warn!(path = %path.display(), "not granted: the path no longer resolves to itself (a link was put in it)");
            return Ok(rs);
        }
        // A path that does not exist grants nothing; nothing to add.
        Err(_) => return Ok(rs),
    };
    // Directory rights on a file are meaningless and the kernel refuses them.
    let access = if is_dir { access } else { access & file_rights };
    rs.add_rule(PathBeneath::new(fd, access))
        .map_err(|source| BuildError::Step {
            step: format!("granting {}", path.display()),
            source,
        })
}

/// `grant`, minus every path in `deny` (see the module docs). A grant that is itself denied
/// yields nothing; a grant *inside* a denied tree is an explicit exception and stays (the
/// task's workspace inside the denied state directory).
pub fn carve(grant: &Path, deny: &[PathBuf]) -> Vec<PathBuf> {
    if deny.iter().any(|d| d == grant) {
        return Vec::new();
    }
    if !deny.iter().any(|d| d.starts_with(grant)) {
        // Nothing denied below: the whole tree.
        return vec![grant.to_path_buf()];
    }
    let Ok(entries) = std::fs::read_dir(grant) else {
        // Not a directory we can list: leave it out rather than grant the denied path.
        return Vec::new();
    };
    let mut out = Vec::new();
    // A link among the children is not followed: the grant would be its target, chosen by
    // whoever could write the carved tree (a task, in its workspace or caches).
    for e in entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_symlink()))
    {
        out.extend(carve(&e.path(), deny));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carving_leaves_out_only_the_denied_branch() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for p in ["etc/a", "etc/secret/inner", "etc/b"] {
            std::fs::create_dir_all(root.join(p)).unwrap();
        }
        std::fs::write(root.join("etc/secret/config.toml"), "token").unwrap();
        std::fs::write(root.join("etc/secret/other"), "x").unwrap();
        let deny = vec![root.join("etc/secret/config.toml")];
        let mut got = carve(&root.join("etc"), &deny);
        got.sort();
        assert_eq!(
            got,
            vec![
                root.join("etc/a"),
                root.join("etc/b"),
                root.join("etc/secret/inner"),
                root.join("etc/secret/other"),
            ]
        );
        assert!(carve(&root.join("etc/secret"), &[root.join("etc/secret")]).is_empty());
        // A grant inside a denied tree is an explicit exception.
        assert_eq!(
            carve(&root.join("etc/secret"), &[root.join("etc")]),
            vec![root.join("etc/secret")]
        );
        assert_eq!(carve(&root.join("etc/a"), &deny), vec![root.join("etc/a")]);
    }
}
