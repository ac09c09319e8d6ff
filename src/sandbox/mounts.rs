//! What a task's children see of the host's file system: every tree outside the system's
//! hidden under an empty tmpfs in a mount namespace of the task's own, and inside those trees
//! only what is granted bound back.
//!
//! Why: Landlock (up to ABI 7) does not govern `connect()` or `sendto()` on a path unix
//! socket, and a network namespace separates only abstract ones. A socket the child can
//! name is one it can talk to: an ssh-agent, `docker.sock`, a user's D-Bus or systemd
//! manager, the daemon's `NOTIFY_SOCKET`. Hidden, it cannot be named. Sockets live in
//! `/run` (and `/var/run`), the host's `/tmp`, `/var/tmp`, `/dev/shm`, HOME and the state
//! directory, and anywhere else an operator puts one (`/srv/…`): so every top-level tree
//! but the system's ([`SYSTEM`]) is hidden, plus `/dev/shm`, HOME and the state directory
//! wherever they are.
//!
//! What is bound back: every path the filesystem policy grants (read or write: the
//! workspace, TMPDIR and the task's HOME in it, the dependency caches, toolchains, the
//! configured `[sandbox] read_paths` / `write_paths`) that lies inside a hidden tree, and
//! the sockets the operator grants by name (`[sandbox] sockets`). A bind shows the same
//! inodes, so the Landlock rules on them still hold.
//!
//! This file owns the plan, plain data built once per task in the parent ([`plan`]);
//! `view.rs` applies it once per task, in namespaces every child of the task joins.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::config::Config;

use super::grants::{var_in, Grants};
use super::landlock::FsPolicy;

/// Top-level trees never hidden: the system every child reads ([`super::grants`]'s
/// read-only trees) and `/dev`, whose devices are granted one by one (`/dev/shm` is hidden on
/// its own).
const SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc",
    "/sys", "/dev",
];

/// Trees below the system ones that are hidden all the same (POSIX shared memory, where a
/// socket may be made as anywhere writable by all).
const ALSO_HIDDEN: &[&str] = &["/dev/shm"];

/// Most paths bound back inside one hidden tree: the child holds a descriptor for each while
/// it hides the tree, in a fixed array (no allocation after `fork`).
pub(crate) const MAX_KEEP: usize = 32;

/// One task's mount plan: the trees its children do not see.
#[derive(Debug, Clone, Default)]
pub(crate) struct MountPlan {
    /// Disjoint trees, each covered by an empty directory of one tmpfs.
    pub hide: Vec<Hidden>,
}

/// One hidden tree and what of it is shown again.
#[derive(Debug, Clone)]
pub(crate) struct Hidden {
    /// The tree's path: an empty directory of the one tmpfs is bound on it.
    pub path: CString,
    /// That directory's name in the tmpfs (one per tree, so nothing made in one shows in
    /// another).
    pub stage: CString,
    /// Paths inside it bound back from what was there before, none inside another.
    pub keep: Vec<Keep>,
}

/// One path shown again inside a hidden tree, at its own place.
#[derive(Debug, Clone)]
pub(crate) struct Keep {
    /// The path, bound (recursively) onto itself.
    pub path: CString,
    /// Directories made in the tmpfs on the way to it, outermost first.
    pub parents: Vec<CString>,
    /// Whether it is a directory (else a file or socket: the mount point is a file).
    pub dir: bool,
    /// A socket granted by name: it may not exist (yet) when a child starts, which then
    /// simply does not see it.
    pub optional: bool,
}

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// More grants inside one hidden tree than a child can bind back.
    #[error("more than {MAX_KEEP} granted paths under {}: grant a common parent in [sandbox] read_paths or write_paths instead", .0.display())]
    TooMany(PathBuf),
    /// A path with a NUL byte cannot be named to the kernel.
    #[error("a granted path contains a NUL byte: {}", .0.display())]
    Nul(PathBuf),
}

/// The plan for one sandbox's children: what `fs` grants them, TMPDIR and the write grants
/// also as given (the children are told those paths; a symlink on the way would otherwise
/// vanish with its hidden tree), the operator's `[sandbox] sockets`, and for the daemon's
/// own git (not the task's children) the ssh-agent the operator passes it (`SSH_AUTH_SOCK`
/// in `[env] allow`). The service user's HOME and the state directory are hidden wherever
/// they are.
pub(super) fn for_sandbox(
    cfg: &Config,
    fs: &FsPolicy,
    vars: &[(String, String)],
    tmp: &Path,
    grants: &Grants,
) -> Result<MountPlan, PlanError> {
    let mut visible: Vec<PathBuf> = fs.read.iter().chain(&fs.write).cloned().collect();
    visible.extend(grants.write.iter().cloned());
    visible.push(tmp.to_path_buf());
    let mut sockets = cfg.sandbox.sockets.clone();
    if !grants.task {
        sockets.extend(var_in(&[vars], "SSH_AUTH_SOCK").map(PathBuf::from));
    }
    plan(&visible, &sockets, &private(cfg, vars))
}

/// The trees hidden wherever they are: the service user's HOME (of `vars`, what the
/// children inherit) and the state directory.
pub(super) fn private(cfg: &Config, vars: &[(String, String)]) -> Vec<PathBuf> {
    var_in(&[vars], "HOME")
        .map(PathBuf::from)
        .into_iter()
        .chain([cfg.state_dir.clone()])
        .collect()
}

/// The plan for children granted `visible` (canonical, existing: the filesystem policy's
/// read and write trees, plus the paths the children are told, such as TMPDIR, as given),
/// the operator's `sockets`, and with `private` (the service user's HOME, the state
/// directory) hidden wherever they are.
pub(crate) fn plan(
    visible: &[PathBuf],
    sockets: &[PathBuf],
    private: &[PathBuf],
) -> Result<MountPlan, PlanError> {
    let shown = |p: &Path| visible.iter().any(|v| p.starts_with(v));
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(top) = std::fs::read_dir("/") {
        for e in top.flatten() {
            let p = Path::new("/").join(e.file_name());
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && !SYSTEM.iter().any(|s| Path::new(s) == p) && !shown(&p) {
                roots.push(p);
            }
        }
    }
    let extra = ALSO_HIDDEN
        .iter()
        .map(PathBuf::from)
        .chain(private.iter().filter_map(|p| std::fs::canonicalize(p).ok()));
    for p in extra {
        let nested = roots.iter().any(|r| p.starts_with(r));
        if p.parent().is_some() && p.is_dir() && !nested && !shown(&p) {
            // A private tree holding an earlier root (HOME = `/srv/x` holds nothing top-level)
            // cannot happen for a top-level root; a later private tree may hold an earlier one.
            roots.retain(|r| !r.starts_with(&p));
            roots.push(p);
        }
    }
    roots.sort();
    let mut hide = Vec::with_capacity(roots.len());
    for (i, root) in roots.into_iter().enumerate() {
        let mut keeps: Vec<(PathBuf, bool, bool)> = Vec::new();
        let inside = |p: &Path| p.starts_with(&root) && p != root;
        for v in visible.iter().filter(|v| inside(v)) {
            if let Ok(m) = std::fs::metadata(v) {
                keeps.push((v.clone(), m.is_dir(), false));
            }
        }
        for s in sockets.iter().filter(|s| inside(s)) {
            let dir = std::fs::metadata(s).is_ok_and(|m| m.is_dir());
            keeps.push((s.clone(), dir, true));
        }
        keeps.sort();
        keeps.dedup_by(|b, a| b.0 == a.0);
        // One inside another comes with it (the bind is recursive).
        let outer: Vec<PathBuf> = keeps.iter().map(|k| k.0.clone()).collect();
        keeps.retain(|(p, _, _)| !outer.iter().any(|o| o != p && p.starts_with(o)));
        if keeps.len() > MAX_KEEP {
            return Err(PlanError::TooMany(root));
        }
        let keep = keeps
            .into_iter()
            .map(|(path, dir, optional)| {
                let parents = path
                    .ancestors()
                    .skip(1)
                    .take_while(|a| *a != root)
                    .map(c_path)
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Keep {
                    parents: parents.into_iter().rev().collect(),
                    path: c_path(&path)?,
                    dir,
                    optional,
                })
            })
            .collect::<Result<_, PlanError>>()?;
        hide.push(Hidden {
            path: c_path(&root)?,
            stage: CString::new(i.to_string()).map_err(|_| PlanError::Nul(root.clone()))?,
            keep,
        });
    }
    Ok(MountPlan { hide })
}

/// The directories at `/` now, sorted: a view hides those that are not the system's, so a
/// view made before one appeared does not hide it (see `runner::ahead`). Blocking.
pub fn host_trees() -> Vec<std::ffi::OsString> {
    let mut v: Vec<_> = std::fs::read_dir("/")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn c_path(p: &Path) -> Result<CString, PlanError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| PlanError::Nul(p.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(plan: &MountPlan) -> Vec<String> {
        plan.hide
            .iter()
            .map(|h| h.path.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn every_tree_but_the_system_is_hidden_and_grants_inside_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let ws = base.join("ws");
        let tmp = base.join("state/tmp/t");
        let home = base.join("home");
        for d in [&ws, &tmp, &home] {
            std::fs::create_dir_all(d).unwrap();
        }
        let sock = base.join("granted.sock");
        let plan = plan(
            &[ws.clone(), tmp.clone(), ws.join("sub")],
            std::slice::from_ref(&sock),
            std::slice::from_ref(&home),
        )
        .unwrap();
        let hidden = names(&plan);
        for must in ["/run", "/tmp", "/var", "/root", "/dev/shm"] {
            if Path::new(must).is_dir() && !base.starts_with(must) {
                assert!(hidden.iter().any(|h| h == must), "{must}: {hidden:?}");
            }
        }
        for never in SYSTEM {
            assert!(!hidden.iter().any(|h| h == never), "{never}: {hidden:?}");
        }
        let top = base.ancestors().nth(base.components().count() - 2).unwrap();
        let root = plan
            .hide
            .iter()
            .find(|h| h.path.as_bytes() == top.as_os_str().as_bytes())
            .expect("the tree of the temp dir is hidden");
        let kept: Vec<String> = root
            .keep
            .iter()
            .map(|k| k.path.to_string_lossy().into_owned())
            .collect();
        // The nested grant comes with its parent; the socket is kept, as a file.
        assert_eq!(kept.len(), 3, "{kept:?}");
        let k = |p: &Path| {
            root.keep
                .iter()
                .find(|k| k.path.as_bytes() == p.as_os_str().as_bytes())
        };
        assert!(k(&ws).unwrap().dir);
        assert!(k(&tmp)
            .unwrap()
            .parents
            .last()
            .unwrap()
            .as_bytes()
            .ends_with(b"state/tmp"));
        assert!(!k(&sock).unwrap().dir && k(&sock).unwrap().optional);
        // HOME inside the already hidden tree is not hidden twice.
        assert!(!hidden
            .iter()
            .any(|h| h.as_bytes() == home.as_os_str().as_bytes()));
    }

    #[test]
    fn a_granted_tree_is_not_hidden() {
        let plan = plan(&[PathBuf::from("/srv")], &[], &[]).unwrap();
        assert!(!names(&plan).iter().any(|h| h == "/srv"));
    }
}
