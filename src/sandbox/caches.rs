//! Per-repository dependency caches: where a task's package managers keep what they download,
//! so the second task on a repository does not fetch everything again.
//!
//! Owns `state_dir/caches/`: one directory per repository, `caches/<repo key>/`, holding one
//! subdirectory per ecosystem (cargo's registry and git checkouts, npm, pnpm, yarn, pip, uv,
//! go, gradle, deno, bun and the XDG cache most other tools fall back to). A task's children
//! get that one directory read-write (a Landlock write grant) and are pointed into it through
//! each tool's own variable ([`Prepared::set`], set by the sandbox, so an environment
//! allowlist cannot drop them). Toolchains stay read-only where they are: `CARGO_HOME` moves
//! to the cache, the `rustup` proxies on PATH still find their toolchains in `RUSTUP_HOME`.
//!
//! **Why per repository** and not one shared store: whatever a task writes into a cache, the
//! next task that reads it loads and often executes (a build script in cargo's registry
//! source, an npm package's install script, a wheel). A shared cache would let one
//! repository's task change what every other repository builds with; a per-repository one
//! confines that to the repository the task could change anyway. The price is disk: the
//! same crate is stored once per repository, which the size bound keeps in check. (The
//! alternative, a shared store only the daemon writes after checking content hashes, would
//! need the daemon to speak every registry's protocol.)
//!
//! **Bounded**: `[caches] max_size_mb` over all repositories. When a task starts, the
//! directories of the least recently used repositories (by the time their last task
//! started, `<key>/last-used`) are removed until the rest fits; the starting task's own
//! directory is never removed.
//!
//! **The operator's own settings**: cargo's `config.toml` (mirrors, source replacement, net
//! settings) is copied into the repository's `CARGO_HOME` for every task, never its
//! `credentials.toml`. npm's user config, where registry logins live, is not a cache: it is
//! in the task's own HOME (see [`super::task_home`]), fresh for every task.
//!
//! **A tree tasks write, prepared by the daemon** (issue 35): a task may leave a link, a FIFO
//! or a socket anywhere in `tree/`, and the daemon, unconfined, prepares that tree before the
//! next task. So it touches `tree/` only through [`super::beneath`]: every directory opened
//! beneath the tree's root without following a link, and an entry that is not what it expects
//! (a link where `cargo/` or `go/` was, a FIFO where `config.toml` is written) replaced, never
//! used or written through. Its own bookkeeping (the LRU clock) is beside the tree, in the
//! repository's directory that no task is granted; and the grant is that tree's own path,
//! never one read back from inside it.
//!
//! Layout of one repository's directory:
//!
//! ```text
//! caches/<key>/last-used          when its last task started (the LRU clock; the daemon's)
//! caches/<key>/tree/              the one tree the task's children may write:
//! caches/<key>/tree/cargo/        CARGO_HOME (registry, git, config.toml copied in)
//! caches/<key>/tree/npm/ pnpm-store/ pnpm/ yarn/ yarn-berry/ pip/ uv/ go/{mod,build,path}/
//! caches/<key>/tree/gradle/ deno/ bun/ xdg/
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::Digest as _;

use crate::config::Config;

use super::beneath::Tree;
use super::grants::Grants;

/// The caches' root under the state directory.
const ROOT: &str = "caches";

/// The file whose modification time says when the repository's last task started: in the
/// repository's directory, beside the tree tasks write, never in it.
const LAST_USED: &str = "last-used";

/// The tree under the repository's directory that its tasks' children may write.
const TREE: &str = "tree";

/// Largest operator cargo config copied in: settings are a few KiB.
const MAX_CONFIG: u64 = 1024 * 1024;

/// Each tool's variable and the directory (under the repository's cache) it names.
const VARS: &[(&str, &str)] = &[
    ("CARGO_HOME", "cargo"),
    ("npm_config_cache", "npm"),
    ("npm_config_store_dir", "pnpm-store"),
    ("npm_config_cache_dir", "pnpm"),
    ("YARN_CACHE_FOLDER", "yarn"),
    ("YARN_GLOBAL_FOLDER", "yarn-berry"),
    ("PIP_CACHE_DIR", "pip"),
    ("UV_CACHE_DIR", "uv"),
    ("GOMODCACHE", "go/mod"),
    ("GOCACHE", "go/build"),
    ("GOPATH", "go/path"),
    ("GRADLE_USER_HOME", "gradle"),
    ("DENO_DIR", "deno"),
    ("BUN_INSTALL_CACHE_DIR", "bun"),
    ("XDG_CACHE_HOME", "xdg"),
];

/// Where each tool keeps its cache under HOME when its variable is unset, most specific
/// first: a refused path there is a cache the repository's replaces (see `denial.rs`).
pub const HOME_DEFAULTS: &[(&str, &str)] = &[
    ("CARGO_HOME", ".cargo"),
    ("npm_config_cache", ".npm"),
    ("npm_config_store_dir", ".local/share/pnpm"),
    ("npm_config_cache_dir", ".cache/pnpm"),
    ("YARN_CACHE_FOLDER", ".cache/yarn"),
    ("YARN_GLOBAL_FOLDER", ".yarn/berry"),
    ("PIP_CACHE_DIR", ".cache/pip"),
    ("UV_CACHE_DIR", ".cache/uv"),
    ("GOMODCACHE", "go/pkg/mod"),
    ("GOCACHE", ".cache/go-build"),
    ("GOPATH", "go"),
    ("GRADLE_USER_HOME", ".gradle"),
    ("DENO_DIR", ".cache/deno"),
    ("BUN_INSTALL_CACHE_DIR", ".bun/install/cache"),
    ("XDG_CACHE_HOME", ".cache"),
];

/// One repository's caches, ready for a task.
#[derive(Debug)]
pub struct Prepared {
    /// `caches/<key>/tree`: the one tree the children get read-write for their caches.
    pub dir: PathBuf,
    /// `caches/<key>`: the repository's directory (the tree and the daemon's LRU clock).
    pub repo: PathBuf,
    /// The variables pointing each tool into it.
    pub set: Vec<(String, String)>,
    /// Other repositories' caches removed to stay under the size limit.
    pub pruned: Vec<PathBuf>,
    /// What every repository's caches take after that; `None` without a limit (nothing
    /// was counted).
    pub bytes: Option<u64>,
}

/// The directory holding every repository's caches.
pub fn root(cfg: &Config) -> PathBuf {
    cfg.state_dir.join(ROOT)
}

/// The key of the repository worked on in `workspace`: its last path component (for people
/// reading `status`) and a hash of the whole canonical path (so two repositories never
/// share a key). A managed clone's workspace is `workspaces/<slug of its URL>`, one per
/// repository; `repo_dir` is one repository too.
pub fn key_for(workspace: &Path) -> String {
    let path = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    let hash = sha2::Sha256::digest(path.as_os_str().as_encoded_bytes());
    let hex: String = hash.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let name: String = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let name = name.trim_start_matches('.');
    if name.is_empty() {
        hex
    } else {
        format!("{name}-{hex}")
    }
}

/// The workspace whose repository's caches a sandbox with `grants` gets: the task's own
/// children's (not the daemon's git), with `[caches]` on. A per-task directory is nobody's
/// repository: caches keyed by it would never be used again, one more directory for every
/// task, each walked by every later prune. Its tools cache under the task's HOME, which goes
/// with the task.
pub fn workspace_of<'a>(cfg: &Config, grants: &'a Grants) -> Option<&'a Path> {
    let ws = grants.write.first()?;
    (grants.task && grants.caches && cfg.caches.enabled).then_some(ws.as_path())
}

/// Create (or reuse) the caches of the repository in `workspace`, mark them used now and
/// prune other repositories' past the limit. `inherited` is the environment the children
/// would otherwise get: it names the operator's `CARGO_HOME` and `HOME`. Blocking.
///
/// Everything in `tree/` was left by a task: it is opened and replaced as the module docs say,
/// never followed.
pub fn prepare(
    cfg: &Config,
    workspace: &Path,
    inherited: &[(String, String)],
) -> io::Result<Prepared> {
    let root = root(cfg);
    let repo = root.join(key_for(workspace));
    let own = Tree::open_root(&repo)?;
    // Only the tree and the clock belong here. Anything else is what tasks left when this
    // directory itself was theirs (before issue 35): gone, links removed, never followed.
    for (name, _) in own.entries()? {
        if name != TREE && name != LAST_USED {
            own.remove(&name)?;
        }
    }
    let tree = own.dir(TREE)?;
    let mut set = Vec::with_capacity(VARS.len());
    for (var, sub) in VARS {
        let d = tree.dir(sub)?;
        set.push((var.to_string(), d.path().to_string_lossy().into_owned()));
    }
    // Rewritten every time: the task may write here, the next task starts from the
    // operator's settings again.
    copy_cargo_config(inherited, &tree.dir("cargo")?)?;
    // The LRU clock: a new file, so its modification time is now.
    own.put_file(LAST_USED, b"", 0o600)?;
    let dir = tree.path().to_path_buf();
    let (pruned, bytes) = match cfg.caches.max_size_mb {
        0 => (Vec::new(), None),
        mb => {
            let (removed, left) = prune_counted(&root, mb.saturating_mul(1024 * 1024), &repo);
            (removed, Some(left))
        }
    };
    Ok(Prepared {
        dir,
        repo,
        set,
        pruned,
        bytes,
    })
}

/// The operator's cargo settings (not credentials) into the repository's `CARGO_HOME`,
/// replacing whatever the last task left under those names.
fn copy_cargo_config(inherited: &[(String, String)], cargo_home: &Tree) -> io::Result<()> {
    let get = |k: &str| {
        inherited
            .iter()
            .find(|(n, v)| n == k && !v.is_empty())
            .map(|(_, v)| PathBuf::from(v))
    };
    let operator = get("CARGO_HOME").or_else(|| get("HOME").map(|h| h.join(".cargo")));
    for name in ["config.toml", "config"] {
        // The operator's own file (links followed: the operator's dotfiles are often links).
        let from = operator.as_ref().map(|o| o.join(name));
        let bytes = match from.as_deref().map(std::fs::metadata) {
            Some(Ok(m)) if m.is_file() && m.len() <= MAX_CONFIG => {
                from.as_deref().map(std::fs::read)
            }
            _ => None,
        };
        match bytes {
            Some(bytes) => cargo_home.put_file(name, &bytes?, 0o600)?,
            // Whatever a task left there is not the operator's.
            None => cargo_home.remove(name)?,
        }
    }
    // A login a task left (`cargo login`) is not handed to the next one.
    for name in ["credentials.toml", "credentials"] {
        cargo_home.remove(name)?;
    }
    Ok(())
}

/// One repository's cache directory as `status` shows it.
#[derive(Debug, Clone)]
pub struct Usage {
    /// The repository's key (`caches/<key>`).
    pub key: String,
    /// Bytes on disk.
    pub bytes: u64,
    /// When its last task started.
    pub last_used: Option<SystemTime>,
}

/// Every repository's caches under `root`, least recently used first. Blocking (walks every
/// file).
pub fn usage(root: &Path) -> Vec<Usage> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out: Vec<Usage> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| Usage {
            key: e.file_name().to_string_lossy().into_owned(),
            bytes: disk_usage(&e.path()),
            last_used: std::fs::symlink_metadata(e.path().join(LAST_USED))
                .ok()
                .filter(|m| m.is_file())
                .and_then(|m| m.modified().ok()),
        })
        .collect();
    out.sort_by_key(|u| u.last_used);
    out
}

/// Remove the least recently used repositories' caches under `root` until all of them
/// take at most `max_bytes`; `keep` (the starting task's) is never removed. Returns what
/// was removed.
pub fn prune(root: &Path, max_bytes: u64, keep: &Path) -> Vec<PathBuf> {
    prune_counted(root, max_bytes, keep).0
}

/// [`prune`], and the bytes every repository's caches take after it.
fn prune_counted(root: &Path, max_bytes: u64, keep: &Path) -> (Vec<PathBuf>, u64) {
    let all = usage(root);
    let mut total: u64 = all.iter().map(|u| u.bytes).sum();
    let mut removed = Vec::new();
    for u in &all {
        if total <= max_bytes {
            break;
        }
        let path = root.join(&u.key);
        if path == keep {
            continue;
        }
        match super::beneath::remove_tree(&path) {
            Ok(()) => {
                total = total.saturating_sub(u.bytes);
                tracing::info!(cache = %path.display(), bytes = u.bytes, "removed the least recently used repository cache");
                removed.push(path);
            }
            Err(e) => {
                tracing::warn!(cache = %path.display(), error = %e, "cannot remove a repository cache; delete it by hand");
            }
        }
    }
    (removed, total)
}

/// One line for `status`: how many repositories, how much of the limit.
pub fn describe(cfg: &Config) -> String {
    if !cfg.caches.enabled {
        return "caches: off ([caches] enabled = false)\n".to_string();
    }
    let root = root(cfg);
    let all = usage(&root);
    let total: u64 = all.iter().map(|u| u.bytes).sum();
    let limit = match cfg.caches.max_size_mb {
        0 => "no limit".to_string(),
        mb => format!("limit {mb} MiB"),
    };
    let mut s = format!(
        "caches: {} repositories, {:.1} MiB ({limit}) in {}\n",
        all.len(),
        total as f64 / (1024.0 * 1024.0),
        root.display()
    );
    // Most recently used first: what an operator looks for.
    for u in all.iter().rev() {
        let age = u
            .last_used
            .and_then(|t| t.elapsed().ok())
            .map(|d| format!("{} min ago", d.as_secs() / 60))
            .unwrap_or_else(|| "never".into());
        s.push_str(&format!(
            "  {:<52} {:>10.1} MiB  used {age}\n",
            u.key,
            u.bytes as f64 / (1024.0 * 1024.0)
        ));
    }
    s
}

/// Bytes `path` takes on disk (allocated blocks), not following symlinks. Iterative (a task
/// writes the caches: any depth); a directory whose path the kernel refuses as too long counts
/// for itself only.
fn disk_usage(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = m.blocks().saturating_mul(512);
    // One listing per level (streamed, not collected): memory grows with depth only, which
    // the kernel bounds (a path past PATH_MAX is refused).
    let mut open: Vec<std::fs::ReadDir> = std::fs::read_dir(path).into_iter().collect();
    while let Some(rd) = open.last_mut() {
        let Some(e) = rd.next() else {
            open.pop();
            continue;
        };
        let Ok(e) = e else { continue };
        let Ok(m) = e.metadata() else { continue };
        total = total.saturating_add(m.blocks().saturating_mul(512));
        if m.is_dir() {
            if let Ok(sub) = std::fs::read_dir(e.path()) {
                open.push(sub);
            }
        }
    }
    total
}

#[cfg(test)]
#[path = "cache_links_tests.rs"]
mod links_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(state: &Path, max_mb: u64) -> Config {
        let mut c = Config {
            state_dir: state.to_path_buf(),
            ..Config::default()
        };
        c.caches.max_size_mb = max_mb;
        c
    }

    #[test]
    fn each_repository_gets_its_own_directory_and_the_same_one_again() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("ws/a"), dir.path().join("ws/b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let c = cfg(dir.path(), 0);
        let pa = prepare(&c, &a, &[]).unwrap();
        let pb = prepare(&c, &b, &[]).unwrap();
        assert_ne!(pa.dir, pb.dir);
        assert_eq!(prepare(&c, &a, &[]).unwrap().dir, pa.dir);
        assert!(pa.dir.starts_with(dir.path().join("caches")));
        let cargo = pa.set.iter().find(|(k, _)| k == "CARGO_HOME").unwrap();
        assert_eq!(Path::new(&cargo.1), pa.dir.join("cargo"));
        for (_, v) in &pa.set {
            assert!(Path::new(v).starts_with(&pa.dir), "{v}");
            assert!(Path::new(v).exists(), "{v}");
        }
    }

    #[test]
    fn the_operators_cargo_config_is_copied_and_its_credentials_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let op = dir.path().join("home/.cargo");
        std::fs::create_dir_all(&op).unwrap();
        std::fs::write(op.join("config.toml"), "[net]\noffline = true\n").unwrap();
        std::fs::write(op.join("credentials.toml"), "token = \"secret\"\n").unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let home = dir.path().join("home").to_string_lossy().into_owned();
        let p = prepare(&cfg(dir.path(), 0), &ws, &[("HOME".into(), home)]).unwrap();
        let cargo = p.dir.join("cargo");
        assert_eq!(
            std::fs::read_to_string(cargo.join("config.toml")).unwrap(),
            "[net]\noffline = true\n"
        );
        assert!(!cargo.join("credentials.toml").exists());
        // A task's own edit, or login, does not survive into the next task.
        std::fs::write(cargo.join("config.toml"), "[source]\n").unwrap();
        std::fs::write(cargo.join("credentials.toml"), "token = \"t\"\n").unwrap();
        let home = dir.path().join("home").to_string_lossy().into_owned();
        prepare(&cfg(dir.path(), 0), &ws, &[("HOME".into(), home)]).unwrap();
        assert_eq!(
            std::fs::read_to_string(cargo.join("config.toml")).unwrap(),
            "[net]\noffline = true\n"
        );
        assert!(!cargo.join("credentials.toml").exists());
    }

    #[test]
    fn the_least_recently_used_repositories_go_first_and_the_current_one_never() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path(), 0);
        let mut prepared = Vec::new();
        for name in ["old", "mid", "new"] {
            let ws = dir.path().join("ws").join(name);
            std::fs::create_dir_all(&ws).unwrap();
            let p = prepare(&c, &ws, &[]).unwrap();
            // 400 KiB each (and the directories): two fit under 1 MiB, three do not.
            std::fs::write(p.dir.join("pip/blob"), vec![7u8; 400 * 1024]).unwrap();
            let t = SystemTime::now() - std::time::Duration::from_secs(3600);
            let t = match name {
                "old" => t,
                "mid" => t + std::time::Duration::from_secs(60),
                _ => t + std::time::Duration::from_secs(120),
            };
            std::fs::File::options()
                .write(true)
                .open(p.repo.join(LAST_USED))
                .unwrap()
                .set_modified(t)
                .unwrap();
            prepared.push(p.repo);
        }
        // Go-style read-only trees are removed too.
        let ro = prepared[0].join("tree/go/mod/x");
        std::fs::create_dir_all(&ro).unwrap();
        std::fs::write(ro.join("f"), "x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        // The oldest is the current task's: kept; the next oldest goes.
        let removed = prune(&root(&c), 1024 * 1024, &prepared[0]);
        assert_eq!(removed, vec![prepared[1].clone()]);
        assert!(prepared[0].exists() && prepared[2].exists());
        // "new" grows past the limit: "old" is now the least recently used.
        std::fs::write(prepared[2].join("tree/npm/blob"), vec![7u8; 400 * 1024]).unwrap();
        let removed = prune(&root(&c), 1024 * 1024, &prepared[2]);
        assert_eq!(removed, vec![prepared[0].clone()]);
        let text = describe(&c);
        assert!(text.starts_with("caches: 1 repositories"), "{text}");
    }
}
