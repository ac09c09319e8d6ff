//! What one sandbox grants its children on the file system: the system read-only, the
//! workspace and the task's private directory read-write, the toolchains, caches and
//! devices, and what stays denied even inside a granted tree. [`Grants`] is the caller's
//! part (which trees, whose children); [`fs_policy`] turns it, with the children's
//! environment, into the [`FsPolicy`] that becomes the Landlock ruleset.

use std::path::{Path, PathBuf};

use crate::config::Config;

use super::landlock::FsPolicy;
use super::resolve::canonical;

/// Trees every child may read: the system, never anyone's home or the daemon's state.
const SYSTEM_READ: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/sys",
];

/// Device files every child may read and write. Never `/dev/tty`: children have no
/// controlling terminal (each leads its own session, see `process`), and the operator's
/// terminal under `run-task` must stay out of a task's reach even if one had.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// What one sandbox lets its children write, beyond the system's read-only trees.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Read-write trees (the workspace first).
    pub write: Vec<PathBuf>,
    /// Extra read-only trees (a managed clone's git directory, the daemon git's empty
    /// HOME). There is no HOME grant: no child class reads the service user's HOME.
    pub read: Vec<PathBuf>,
    /// Whether the children are the task's own (executor, checks): they get the
    /// per-repository dependency caches of the workspace (`write[0]`, see [`caches`]), a HOME
    /// of their own ([`task_home`]) and the network policy (`[network]`). The daemon's own
    /// git calls are not.
    pub task: bool,
    /// With `task`: whether the workspace (`write[0]`) is a repository's, whose dependency
    /// caches ([`caches`]) the children get. The workspace decides (a per-task directory is
    /// nobody's repository: caches keyed by it would never be used again).
    pub caches: bool,
    /// Hosts the task's children may reach under `[network] mode = "allowlist"` beyond
    /// `[network] allow`: the repository's remote.
    pub hosts: Vec<String>,
}

/// The filesystem policy of a task's children (see the module docs).
/// `env` is a stack of variable lists, the first that names a variable wins.
pub(super) fn fs_policy(
    cfg: &Config,
    env: &[&[(String, String)]],
    tmp: &Path,
    grants: &Grants,
) -> FsPolicy {
    let get = |k: &str| var_in(env, k);
    // What the children may write: a path in there is theirs to change (a link put where a
    // directory was), so no other grant or denial is ever derived from one (see below).
    let mut write = grants.write.clone();
    write.push(tmp.to_path_buf());
    let writable = write.clone();
    let theirs = |p: &Path| writable.iter().any(|w| p.starts_with(w));
    // The operator's HOME (the inherited one), not the task's own that `set` names: its
    // toolchains are read, its credentials denied.
    let home = env
        .last()
        .and_then(|l| var_in(&[l], "HOME"))
        .map(PathBuf::from);
    let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
    // Programs on the children's PATH, and the toolchain homes their shims exec into.
    if let Some(path) = get("PATH") {
        read.extend(std::env::split_paths(path).filter(|p| p.is_absolute()));
    }
    // Every list is asked, not only the first that names the variable: the sandbox points
    // CARGO_HOME at the repository's cache, and cargo's rustup proxies still live in the
    // operator's. The cache's own is left out: it is inside a write grant already, and read
    // through whatever a task put there it would grant (or deny) the link's target.
    let toolchain_homes = |k: &str, under_home: &str| -> Vec<PathBuf> {
        let named: Vec<PathBuf> = env
            .iter()
            .filter_map(|l| var_in(&[l], k))
            .map(PathBuf::from)
            .filter(|p| !theirs(p))
            .collect();
        let inherited = env.last().and_then(|l| var_in(&[l], k));
        match (inherited, &home) {
            (None, Some(h)) => named.into_iter().chain([h.join(under_home)]).collect(),
            _ => named,
        }
    };
    for (k, under_home) in [
        ("CARGO_HOME", ".cargo"),
        ("RUSTUP_HOME", ".rustup"),
        ("PYENV_ROOT", ".pyenv"),
        ("NVM_DIR", ".nvm"),
    ] {
        read.extend(toolchain_homes(k, under_home));
    }
    // The executables the daemon was told to use, wherever they live.
    for exe in [&cfg.executor.claude_path, &cfg.git.gh_path]
        .into_iter()
        .flatten()
    {
        if let Some(dir) = exe.parent() {
            read.push(dir.to_path_buf());
        }
        if let Some(dir) = std::fs::canonicalize(exe)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            read.push(dir);
        }
    }
    read.extend(grants.read.iter().cloned());
    read.extend(cfg.sandbox.read_paths.iter().cloned());
    // The operator's `[sandbox] npmrc` is given to tasks anyway (copied into their HOME),
    // and yarn also reads every `.npmrc` above the project by name: where that file sits
    // above the workspace (the service user's HOME under the unit holds both), a denied
    // read would fail the install.
    if grants.task {
        read.extend(cfg.sandbox.npmrc.iter().cloned());
    }
    // A read grant inside a write grant adds nothing but a way to follow a link put there.
    read.retain(|p| !theirs(p));
    write.extend(DEVICES.iter().map(PathBuf::from));
    // `claude`'s per-task directory is inside `tmp`; the operator's template is not
    // granted at all.
    write.extend(cfg.sandbox.write_paths.iter().cloned());

    // The state directory (HOME under the unit) is closed but for what is granted in it.
    let mut deny = vec![cfg.state_file(), cfg.state_dir.clone()];
    deny.extend(cfg.origin.clone());
    // Credentials that live beside toolchains and in HOME.
    let cargo_homes = toolchain_homes("CARGO_HOME", ".cargo");
    for base in cargo_homes
        .into_iter()
        .chain(home.as_ref().map(|h| h.join(".cargo")))
    {
        deny.push(base.join("credentials.toml"));
        deny.push(base.join("credentials"));
    }
    if let Some(h) = &home {
        for p in [
            ".ssh",
            ".git-credentials",
            ".aws",
            ".config/gh",
            ".netrc",
            ".docker",
        ] {
            deny.push(h.join(p));
        }
    }
    FsPolicy {
        read: canonical(read),
        write: canonical(write),
        deny: canonical(deny),
    }
}

/// `key`'s value in the first of `lists` that names it, unless empty.
pub(super) fn var_in<'a>(lists: &[&'a [(String, String)]], key: &str) -> Option<&'a str> {
    lists
        .iter()
        .find_map(|l| l.iter().find(|(k, _)| k == key))
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}
