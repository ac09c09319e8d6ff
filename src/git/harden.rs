//! Git must never run what a repository says to run.
//!
//! A repository can make git execute a program in many places (`git help config`,
//! `githooks`, `gitattributes`): hooks; `core.fsmonitor`; `core.pager` and `pager.*`;
//! `core.editor` and `sequence.editor`; `core.sshCommand` and `core.gitProxy`;
//! `core.askPass`; `credential.helper`; `diff.external`, `diff.<driver>.command` and
//! `diff.<driver>.textconv`; `filter.<driver>.{clean,smudge,process}` and
//! `merge.<driver>.driver` (chosen by `.gitattributes` in the tree); `remote.<name>.
//! {uploadpack,receivepack,vcs}`; `gpg.program` and `gpg.<format>.program`; `alias.*`
//! with `!`; `include.path` / `includeIf` pulling in a file of the tree; `url.<base>.
//! insteadOf` redirecting a push (and its credentials) elsewhere.
//!
//! A repository can also *steer* git without running anything: `core.worktree` moves the
//! work tree (a commit of files outside the workspace), `refs/replace/`, `info/grafts` and
//! `objects/info/alternates` change the object graph (a `diff_stats` that is not the
//! commit pushed), and `.git` itself may be a symlink or a gitfile naming any directory.
//!
//! Four defences, all on every git call of the daemon ([`super::GitRunner`], and
//! [`command`] for the observer and the checks):
//!
//! 1. **Fixed overrides** on the command line ([`overrides`]): hooks off, fsmonitor off, no
//!    pager, no editor, no external diff, no `ext::` transport, no askpass, submodules not
//!    entered by status, diff, fetch or push; the work tree named as a safe directory.
//! 2. **A fixed environment** ([`ENV`], [`scrub_env`]): no system or global config
//!    (`GIT_CONFIG_NOSYSTEM`, `GIT_CONFIG_GLOBAL=/dev/null`), no replace refs or grafts
//!    (`GIT_NO_REPLACE_OBJECTS`, `GIT_GRAFT_FILE=/dev/null`), and no inherited `GIT_DIR`,
//!    `GIT_WORK_TREE`, `GIT_INDEX_FILE`, alternates or other `GIT_*` that would redirect it.
//! 3. **An explicit git directory**: `.git` is resolved here the way git resolves it
//!    ([`locate`]: a directory, a symlink, or a gitfile with any bytes) and git is handed
//!    `--git-dir` and `--work-tree`, so what was checked is what git uses and
//!    `core.worktree` has no effect. What cannot be resolved is refused, never run unchecked.
//! 4. **A trusted git directory**: a managed clone keeps its git directory outside the
//!    workspace, where a task cannot write, so its config is the daemon's own. Any other git
//!    directory (an operator's `repo_dir`, a repository the task created) may have been
//!    written by the task: its config is read first and every key outside a short
//!    allowlist ([`untrusted_keys`]) refuses the call, as do alternates. A driver named in
//!    `.gitattributes` only runs when config defines it, so a trusted config makes
//!    attributes inert too. A populated submodule (which `git add` enters whatever the
//!    overrides say) has its own config checked the same way, in a managed clone too
//!    ([`submodule_refusal`]).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::process::{self, ChildEnv, CommandSpec, Limits};

/// The fixed `-c` overrides (and the safe directory) for a git call in `work_tree`.
pub fn overrides(work_tree: &Path) -> Vec<OsString> {
    const FIXED: &[&str] = &[
        "core.hooksPath=/dev/null",
        "core.fsmonitor=false",
        "core.pager=cat",
        "core.editor=true",
        "sequence.editor=true",
        "core.askPass=",
        "diff.external=",
        "protocol.ext.allow=never",
        "commit.gpgSign=false",
        "tag.gpgSign=false",
        // A submodule has its own git directory and config, which nothing here checked:
        // never enter one (status, diff, fetch, push).
        "diff.ignoreSubmodules=all",
        "status.submoduleSummary=false",
        "submodule.recurse=false",
        "fetch.recurseSubmodules=false",
        "push.recurseSubmodules=no",
    ];
    let mut v = Vec::with_capacity(FIXED.len() * 2 + 2);
    for kv in FIXED {
        v.push(OsString::from("-c"));
        v.push(OsString::from(kv));
    }
    // The work tree may belong to another user (a service user working in an operator's
    // checkout): trust exactly this one directory, nothing wider.
    let mut safe = OsString::from("safe.directory=");
    safe.push(work_tree.as_os_str());
    v.push(OsString::from("-c"));
    v.push(safe);
    v
}

/// Environment for every git call: no pager, no editor, never a prompt; no system or
/// global config, no replace refs, no grafts.
pub const ENV: &[(&str, &str)] = &[
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_ATTR_NOSYSTEM", "1"),
    ("GIT_NO_REPLACE_OBJECTS", "1"),
    ("GIT_GRAFT_FILE", "/dev/null"),
    ("GIT_PAGER", "cat"),
    ("PAGER", "cat"),
    ("GIT_EDITOR", "true"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_ASKPASS", ""),
    ("SSH_ASKPASS", ""),
    ("GCM_INTERACTIVE", "never"),
];

/// Inherited `GIT_*` variables the daemon's git keeps: the operator's choice of ssh
/// program and transports. Every other one (`GIT_DIR`, `GIT_WORK_TREE`, `GIT_INDEX_FILE`,
/// `GIT_OBJECT_DIRECTORY`, `GIT_ALTERNATE_OBJECT_DIRECTORIES`, `GIT_CONFIG_PARAMETERS`, …)
/// would move what git reads and is removed by [`scrub_env`].
const GIT_VARS_KEPT: &[&str] = &["GIT_SSH_COMMAND", "GIT_SSH", "GIT_ALLOW_PROTOCOL"];

/// `env` made fit for the daemon's git: inherited `GIT_*` variables that redirect git
/// removed (see [`GIT_VARS_KEPT`]), then [`ENV`] set.
pub fn scrub_env(env: &mut ChildEnv) {
    let drop: Vec<String> = env
        .vars()
        .iter()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("GIT_") && !GIT_VARS_KEPT.contains(&k.as_str()))
        .cloned()
        .collect();
    for k in drop {
        env.remove(&k);
    }
    for (k, v) in ENV {
        env.set(k, v);
    }
}

/// Keys a repository's own config may set without making git run anything. Section and
/// key names are lower-case as `git config --list` prints them; `*` is one subsection.
const ALLOWED: &[&str] = &[
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.logallrefupdates",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.symlinks",
    "core.autocrlf",
    "core.eol",
    "core.safecrlf",
    "core.quotepath",
    "core.compression",
    "core.abbrev",
    "core.sparsecheckout",
    "core.sparsecheckoutcone",
    "core.checkstat",
    "core.trustctime",
    "core.untrackedcache",
    "core.splitindex",
    "core.commentchar",
    "remote.*.url",
    "remote.*.pushurl",
    "remote.*.fetch",
    "remote.*.push",
    "remote.*.tagopt",
    "remote.*.prune",
    "remote.*.mirror",
    "remote.*.promisor",
    "remote.*.partialclonefilter",
    "branch.*.remote",
    "branch.*.pushremote",
    "branch.*.merge",
    "branch.*.rebase",
    "branch.*.description",
    "user.name",
    "user.email",
    "init.defaultbranch",
    "extensions.objectformat",
    "extensions.worktreeconfig",
    "extensions.partialclone",
    "extensions.refstorage",
    "extensions.preciousobjects",
    "gc.auto",
    "gc.autodetach",
    "fetch.prune",
    "pull.rebase",
    "pull.ff",
    "push.default",
    "push.autosetupremote",
    "index.version",
    "index.sparse",
    "feature.manyfiles",
    "maintenance.auto",
    "maintenance.strategy",
    "lfs.repositoryformatversion",
    "submodule.*.url",
    "submodule.*.active",
];

/// Keys of `config` (the `-z` output of `git config --list`) that a repository must not
/// set: anything not in the allowlist.
pub fn untrusted_keys(listing: &[u8]) -> Vec<String> {
    let mut bad = Vec::new();
    for entry in listing.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let key = entry.split(|b| *b == b'\n').next().unwrap_or_default();
        let key = String::from_utf8_lossy(key).to_ascii_lowercase();
        if !allowed(&key) {
            bad.push(key);
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

fn allowed(key: &str) -> bool {
    // `section.subsection.name`: the subsection may itself contain dots.
    let Some((section, rest)) = key.split_once('.') else {
        return false;
    };
    let (sub, name) = match rest.rsplit_once('.') {
        Some((sub, name)) => (Some(sub), name),
        None => (None, rest),
    };
    ALLOWED.iter().any(|pat| {
        let mut p = pat.split('.');
        match (p.next(), p.next(), p.next(), sub) {
            (Some(s), Some(n), None, None) => s == section && n == name,
            (Some(s), Some("*"), Some(n), Some(_)) => s == section && n == name,
            _ => false,
        }
    })
}

/// Why the daemon runs no git in a work tree.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A config file of the git directory could not be listed.
    #[error("refused: cannot read {} ({exit}); the daemon runs no git in this work tree", file.display())]
    Unreadable {
        /// The config file.
        file: PathBuf,
        /// How `git config --list` ended.
        exit: String,
    },
    /// git itself could not be started to list the config.
    #[error("refused: cannot run git to read {}: {source}", file.display())]
    Spawn {
        /// The config file.
        file: PathBuf,
        /// Why git did not start.
        source: std::io::Error,
    },
    /// `.git` is something git would follow but the daemon cannot resolve the same way.
    #[error("refused: {} is {why}; the daemon runs no git in this work tree (make `.git` a directory or a gitfile naming one)", dot_git.display())]
    Unresolvable {
        /// The `.git` entry.
        dot_git: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The git directory borrows objects from elsewhere.
    #[error("refused: {} exists: objects from another repository could enter what the daemon commits and pushes; the daemon runs no git in this work tree until it is removed", file.display())]
    Alternates {
        /// The alternates file.
        file: PathBuf,
    },
    /// A populated submodule, which git enters (`git add` asks its `git status`), is not
    /// safe (its own config, alternates, or a `.git` that cannot be resolved).
    #[error("refused: the submodule checkout {} has a git directory of its own that git would enter: {why}", path.display())]
    Submodule {
        /// The submodule's directory.
        path: PathBuf,
        /// Why it is not safe.
        why: String,
    },
    /// The config sets keys outside the allowlist.
    #[error("refused: {} sets {}, which can make git run a program; the daemon runs no git in this work tree until the key is removed (or use a managed clone: a task with `repo`)", file.display(), keys.join(", "))]
    UntrustedKeys {
        /// The config file.
        file: PathBuf,
        /// The keys, sorted.
        keys: Vec<String>,
    },
}

/// Why git must not run in `work_tree`: its git directory (which the task could have
/// written) cannot be resolved as git would, sets a key outside the allowlist, borrows
/// objects, or cannot be read. `None`: no git directory, or nothing but plain settings.
/// Every git call of the daemon asks this first, except in a managed clone, whose git
/// directory only the daemon writes.
pub async fn refusal(
    work_tree: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Option<Refusal> {
    let found = match locate(work_tree) {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(why) => return Some(why),
    };
    if let Err(why) = no_alternates(&found.git_dir) {
        return Some(why);
    }
    if let Some(why) = refusal_of(&config_files(&found.git_dir), env, cancel).await {
        return Some(why);
    }
    submodule_refusal(&found, env, cancel).await.err()
}

/// Submodules nested deeper than this are refused rather than followed.
const MAX_SUBMODULE_DEPTH: usize = 3;

/// Refuse when a populated submodule of `found` (a gitlink in its index whose directory has
/// a `.git`) is not safe: git runs `git status` inside each one (from `git add`, among
/// others) with the submodule's own config, which no `-c` of ours can cover, so that config
/// is checked like the superproject's, and so on down. An index that cannot be listed
/// refuses too. A managed clone needs this as much as any work tree: its base commit may
/// hold gitlinks, and the task can populate them.
pub async fn submodule_refusal(
    found: &Located,
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Result<(), Refusal> {
    let mut todo = vec![(found.clone(), 0usize)];
    while let Some((repo, depth)) = todo.pop() {
        let refuse = |path: &Path, why: String| Refusal::Submodule {
            path: path.to_path_buf(),
            why,
        };
        let spec = CommandSpec::new("git", &repo.work_tree, {
            let mut env = env.clone();
            scrub_env(&mut env);
            env
        })
        .args(overrides(&repo.work_tree))
        .args(repo.args())
        .args(["ls-files", "--stage", "-z"]);
        let limits = Limits {
            timeout: Some(Duration::from_secs(60)),
            grace: Duration::from_millis(500),
            output_cap: 64 * 1024 * 1024,
        };
        let listing = match process::run(&spec, &limits, cancel, None).await {
            Ok(o) if o.exit.success() && o.dropped_bytes == 0 => o.stdout,
            // git cannot read this index (not a repository, a corrupt index): the call
            // that follows cannot enter a submodule through it either, and says why.
            Ok(o) if !o.exit.success() => continue,
            Ok(_) => {
                return Err(refuse(
                    &repo.work_tree,
                    "the index lists more than can be checked".into(),
                ))
            }
            Err(e) => return Err(refuse(&repo.work_tree, format!("cannot run git: {e}"))),
        };
        for entry in listing.split('\0') {
            // `<mode> <object> <stage>\t<path>`; only gitlinks (160000) are submodules.
            let Some(("160000", rest)) = entry.split_once(' ') else {
                continue;
            };
            let Some((_, rel)) = rest.split_once('\t') else {
                continue;
            };
            let dir = repo.work_tree.join(rel);
            if rel.contains('\u{fffd}') {
                return Err(refuse(&dir, "its path is not UTF-8".into()));
            }
            let git_dir = match git_dir_of(&dir) {
                Ok(Some(d)) => d,
                // Not populated: git does not enter it.
                Ok(None) => continue,
                Err(e) => return Err(refuse(&dir, e.to_string())),
            };
            if depth + 1 > MAX_SUBMODULE_DEPTH {
                return Err(refuse(&dir, "submodules nest too deep to check".into()));
            }
            no_alternates(&git_dir).map_err(|e| refuse(&dir, e.to_string()))?;
            if let Some(why) = refusal_of(&config_files(&git_dir), env, cancel).await {
                return Err(refuse(&dir, why.to_string()));
            }
            todo.push((
                Located {
                    work_tree: dir,
                    git_dir,
                },
                depth + 1,
            ));
        }
    }
    Ok(())
}

/// What a git directory's config says, as far as a verdict on it goes: which files git
/// would read and a digest of each one's bytes. Two equal stamps give the same verdict
/// (`git config --no-includes --file` reads nothing else), so a clean verdict can be reused
/// for as long as the stamp holds.
///
/// The bytes, not mtime + size + inode: file timestamps advance in coarse clock ticks, so
/// a same-size rewrite in place within one tick (or one followed by `touch -d`) would keep
/// all three. Hashing a config file costs microseconds; the `git config` it saves, a fork
/// and exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigStamp(Vec<(PathBuf, [u8; 32])>);

impl ConfigStamp {
    /// Largest config file worth stamping; a larger one is simply checked every time.
    const MAX_BYTES: u64 = 1 << 20;

    /// The stamp of `files`, `None` when one cannot be read (or is huge): then there is
    /// nothing to compare and the caller checks as usual. Blocking, a few small reads.
    pub fn of(files: &[PathBuf]) -> Option<ConfigStamp> {
        use sha2::Digest as _;
        use std::io::Read as _;
        let mut v = Vec::with_capacity(files.len());
        for f in files {
            let mut bytes = Vec::new();
            std::fs::File::open(f)
                .ok()?
                .take(Self::MAX_BYTES + 1)
                .read_to_end(&mut bytes)
                .ok()?;
            if bytes.len() as u64 > Self::MAX_BYTES {
                return None;
            }
            v.push((f.clone(), sha2::Sha256::digest(&bytes).into()));
        }
        Some(ConfigStamp(v))
    }
}

/// [`refusal`] with memory: the git directories found clean, each verdict kept while its
/// [`ConfigStamp`] holds, so an unchanged config is not listed again and a changed one
/// always is. Share one (in an `Arc`) among the git calls of one task.
#[derive(Debug, Default)]
pub struct CleanConfigs {
    /// Git directory → the stamp its config had when it was found clean.
    clean: Mutex<HashMap<PathBuf, ConfigStamp>>,
    /// How many times a config was actually listed with `git config`.
    reads: AtomicU64,
}

impl CleanConfigs {
    /// [`refusal`] for `work_tree`, skipped when its git directory was found clean and its
    /// config files are byte for byte what they were then.
    pub async fn check(
        &self,
        work_tree: &Path,
        env: &ChildEnv,
        cancel: &CancellationToken,
    ) -> Result<(), Refusal> {
        let Some(found) = locate(work_tree)? else {
            return Ok(());
        };
        let git_dir = found.git_dir.clone();
        // Not part of the stamp: a stat each time, as cheap as comparing one.
        no_alternates(&git_dir)?;
        self.check_config(&git_dir, env, cancel).await?;
        // The submodules live in the index and the work tree, not in the config: listed
        // every time, once the config is known to be plain.
        submodule_refusal(&found, env, cancel).await
    }

    /// The config verdict for `git_dir`, from memory while its stamp holds.
    async fn check_config(
        &self,
        git_dir: &Path,
        env: &ChildEnv,
        cancel: &CancellationToken,
    ) -> Result<(), Refusal> {
        let files = config_files(git_dir);
        // Taken before the listing: a change during it makes the next call list again.
        let stamp = ConfigStamp::of(&files);
        if stamp.is_some() && self.clean_stamp(git_dir) == stamp {
            return Ok(());
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let verdict = refusal_of(&files, env, cancel).await;
        let mut clean = self.clean.lock().expect("clean configs lock poisoned");
        match (verdict, stamp) {
            (None, Some(stamp)) => {
                clean.insert(git_dir.to_path_buf(), stamp);
                Ok(())
            }
            (None, None) => {
                clean.remove(git_dir);
                Ok(())
            }
            (Some(why), _) => {
                clean.remove(git_dir);
                Err(why)
            }
        }
    }

    fn clean_stamp(&self, git_dir: &Path) -> Option<ConfigStamp> {
        let clean = self.clean.lock().expect("clean configs lock poisoned");
        clean.get(git_dir).cloned()
    }

    /// How many times a config was listed with `git config` (not answered from memory).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

/// [`refusal`] for the config files of one git directory (see [`config_files`]).
pub async fn refusal_of(
    files: &[PathBuf],
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Option<Refusal> {
    let limits = Limits {
        timeout: Some(Duration::from_secs(30)),
        grace: Duration::from_millis(500),
        output_cap: 1024 * 1024,
    };
    for file in files {
        // From `/`, so git discovers no repository and reads nothing but this one file.
        let spec = CommandSpec::new("git", "/", env.clone())
            .args(["config", "--no-includes", "--file"])
            .arg(file)
            .args(["--list", "-z"]);
        let listing = match process::run(&spec, &limits, cancel, None).await {
            Ok(o) if o.exit.success() => o.stdout,
            Ok(o) => {
                return Some(Refusal::Unreadable {
                    file: file.clone(),
                    exit: o.exit.describe(),
                })
            }
            Err(source) => {
                return Some(Refusal::Spawn {
                    file: file.clone(),
                    source,
                })
            }
        };
        let keys = untrusted_keys(listing.as_bytes());
        if !keys.is_empty() {
            return Some(Refusal::UntrustedKeys {
                file: file.clone(),
                keys,
            });
        }
    }
    None
}

/// `git` in `cwd` with the fixed overrides and environment for `work_tree`, its git
/// directory named explicitly (see [`locate`]); the caller adds its own arguments. Call
/// [`refusal`] first: this only makes sure git uses the directory that was checked. A
/// `.git` that cannot be resolved makes git fail (`--git-dir=/dev/null`), never discover.
pub fn command(cwd: &Path, work_tree: &Path, env: &ChildEnv) -> CommandSpec {
    let mut env = env.clone();
    scrub_env(&mut env);
    let mut spec = CommandSpec::new("git", cwd, env).args(overrides(work_tree));
    match locate(work_tree) {
        Ok(Some(found)) => spec = spec.args(found.args()),
        Ok(None) => {}
        Err(_) => spec = spec.arg("--git-dir=/dev/null"),
    }
    spec
}

/// A git directory found for a path, the way git's discovery finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The top of the work tree: the directory holding `.git`.
    pub work_tree: PathBuf,
    /// The git directory `.git` resolves to (canonical).
    pub git_dir: PathBuf,
}

impl Located {
    /// `--git-dir=… --work-tree=…`: git reads nothing but these, whatever `.git` or
    /// `core.worktree` say by the time it runs.
    pub fn args(&self) -> [OsString; 2] {
        let mut gd = OsString::from("--git-dir=");
        gd.push(&self.git_dir);
        let mut wt = OsString::from("--work-tree=");
        wt.push(&self.work_tree);
        [gd, wt]
    }
}

/// The git directory git would use at `start`: the first of `start` and its parents with a
/// `.git` entry, resolved by [`git_dir_of`]. `Ok(None)`: no `.git` anywhere up.
pub fn locate(start: &Path) -> Result<Option<Located>, Refusal> {
    for dir in start.ancestors() {
        if let Some(git_dir) = git_dir_of(dir)? {
            return Ok(Some(Located {
                work_tree: dir.to_path_buf(),
                git_dir,
            }));
        }
    }
    Ok(None)
}

/// Largest gitfile read; git's own are one short line.
const MAX_GITFILE: u64 = 64 * 1024;

/// The git directory of the work tree at `work_tree`, resolved as git resolves `.git`
/// (`setup.c`): a directory, or a symlink to one, is the git directory; a regular file
/// (or a symlink to one) is a gitfile, `gitdir: <path>` with any bytes but NUL, relative to
/// `work_tree` unless absolute. `Ok(None)` when there is no `.git` entry at all; a refusal
/// for any other shape (a dangling symlink, which would make git search further up, a
/// malformed gitfile, a target that is not a directory), never a silent "no repository".
pub fn git_dir_of(work_tree: &Path) -> Result<Option<PathBuf>, Refusal> {
    let dot = work_tree.join(".git");
    let refuse = |why: String| Refusal::Unresolvable {
        dot_git: dot.clone(),
        why,
    };
    match std::fs::symlink_metadata(&dot) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(refuse(format!("unreadable ({e})"))),
    }
    // Followed, as git follows it.
    let meta = std::fs::metadata(&dot)
        .map_err(|e| refuse(format!("a link that does not resolve ({e})")))?;
    let target = if meta.is_dir() {
        dot.clone()
    } else if meta.is_file() {
        let path = read_gitfile(&dot).map_err(refuse)?;
        if path.is_absolute() {
            path
        } else {
            work_tree.join(path)
        }
    } else {
        return Err(refuse("neither a directory nor a file".into()));
    };
    let git_dir = std::fs::canonicalize(&target).map_err(|e| {
        refuse(format!(
            "naming {}, which does not resolve ({e})",
            target.display()
        ))
    })?;
    if !git_dir.is_dir() {
        return Err(refuse(format!(
            "naming {}, which is not a directory",
            git_dir.display()
        )));
    }
    Ok(Some(git_dir))
}

/// The path in a gitfile: `gitdir: ` then the path, trailing newlines and carriage returns
/// dropped (git's `read_gitfile_gently`). Bytes, not text: a path need not be UTF-8.
fn read_gitfile(file: &Path) -> Result<PathBuf, String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(MAX_GITFILE + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("a gitfile that cannot be read ({e})"))?;
    if bytes.len() as u64 > MAX_GITFILE {
        return Err("a gitfile too large to be one".into());
    }
    let Some(rest) = bytes.strip_prefix(b"gitdir: ") else {
        return Err("a file that is not a gitfile (no `gitdir: ` line)".into());
    };
    let mut end = rest.len();
    while end > 0 && matches!(rest[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    let path = &rest[..end];
    if path.is_empty() || path.contains(&0) {
        return Err("a gitfile whose path is empty or holds a NUL byte".into());
    }
    Ok(PathBuf::from(OsStr::from_bytes(path)))
}

/// The common directory of a (linked-worktree) git directory, from its `commondir` file,
/// read as bytes like a gitfile's path.
fn common_dir(git_dir: &Path) -> Option<PathBuf> {
    let bytes = std::fs::read(git_dir.join("commondir")).ok()?;
    let mut end = bytes.len();
    while end > 0 && matches!(bytes[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    let p = PathBuf::from(OsStr::from_bytes(&bytes[..end]));
    Some(git_dir.join(p))
}

/// Refuse a git directory (or its common directory) that lists alternates: objects from
/// another repository would be read as its own.
fn no_alternates(git_dir: &Path) -> Result<(), Refusal> {
    let mut dirs = vec![git_dir.to_path_buf()];
    dirs.extend(common_dir(git_dir));
    for d in dirs {
        for name in ["objects/info/alternates", "objects/info/http-alternates"] {
            let file = d.join(name);
            if std::fs::symlink_metadata(&file).is_ok() {
                return Err(Refusal::Alternates { file });
            }
        }
    }
    Ok(())
}

/// The config files of an untrusted git directory that git would read: its `config`, the
/// per-worktree `config.worktree`, and those of the common directory a linked worktree
/// points to (`commondir`).
pub fn config_files(git_dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![git_dir.to_path_buf()];
    dirs.extend(common_dir(git_dir));
    let mut files = Vec::new();
    for d in dirs {
        for name in ["config", "config.worktree"] {
            let f = d.join(name);
            if f.exists() {
                files.push(f);
            }
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowlist_keeps_plain_settings_and_refuses_everything_that_runs_a_program() {
        let listing = b"core.repositoryformatversion\n0\0core.bare\nfalse\0remote.origin.url\n/x\0\
remote.my.fork.fetch\n+refs/heads/*\0branch.main.merge\nrefs/heads/main\0user.name\nA\0\
core.fsmonitor\n./evil\0core.sshcommand\nevil\0filter.lfs2.clean\nevil\0\
diff.x.textconv\nevil\0credential.helper\nevil\0include.path\n../evil\0\
includeif.gitdir:/.path\nevil\0remote.origin.uploadpack\nevil\0url.evil.insteadof\nhttps://\0\
core.pager\nevil\0alias.st\n!evil\0gpg.program\nevil\0core.hookspath\n.hooks\0\
core.worktree\n/home/svc\0";
        assert_eq!(
            untrusted_keys(listing),
            vec![
                "alias.st",
                "core.fsmonitor",
                "core.hookspath",
                "core.pager",
                "core.sshcommand",
                "core.worktree",
                "credential.helper",
                "diff.x.textconv",
                "filter.lfs2.clean",
                "gpg.program",
                "include.path",
                "includeif.gitdir:/.path",
                "remote.origin.uploadpack",
                "url.evil.insteadof",
            ]
        );
    }

    fn init_at(dir: &Path) {
        let ok = std::process::Command::new("git")
            .args(["init", "-q", "--bare"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    /// Every shape `.git` can take is resolved to the directory git itself would use, with
    /// paths that are not UTF-8 kept byte for byte; every shape git would not read the same
    /// way is refused, never taken for "no repository".
    #[test]
    fn every_form_of_dot_git_resolves_as_git_does_or_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        let store = root.join(OsStr::from_bytes(b"store-\xff\x1b[31m.git"));
        init_at(&store);
        let wt = root.join("wt");
        std::fs::create_dir(&wt).unwrap();
        let dot = wt.join(".git");
        assert_eq!(git_dir_of(&wt).unwrap(), None, "no .git: no repository");

        let resolves = |what: &str| {
            assert_eq!(git_dir_of(&wt).unwrap(), Some(store.clone()), "{what}");
            let found = locate(&wt.join("sub/dir")).unwrap().unwrap();
            assert_eq!(
                (found.work_tree, found.git_dir),
                (wt.clone(), store.clone())
            );
        };
        let refused = |what: &str| {
            let e = git_dir_of(&wt).unwrap_err();
            assert!(matches!(e, Refusal::Unresolvable { .. }), "{what}: {e}");
            assert!(locate(&wt).is_err(), "{what}");
        };
        let reset = || {
            let _ = std::fs::remove_file(&dot);
            let _ = std::fs::remove_dir_all(&dot);
        };

        // A symlink to the directory.
        std::os::unix::fs::symlink(&store, &dot).unwrap();
        resolves("symlink to a directory");
        // A gitfile, absolute, with bytes that are not UTF-8.
        reset();
        let mut bytes = b"gitdir: ".to_vec();
        bytes.extend_from_slice(store.as_os_str().as_bytes());
        bytes.extend_from_slice(b"\r\n\n");
        std::fs::write(&dot, &bytes).unwrap();
        resolves("absolute gitfile, CRLF");
        // A gitfile, relative to the work tree.
        reset();
        let mut rel = b"gitdir: ../".to_vec();
        rel.extend_from_slice(store.file_name().unwrap().as_bytes());
        std::fs::write(&dot, &rel).unwrap();
        resolves("relative gitfile");
        // A symlink to a gitfile.
        reset();
        let gitfile = root.join("gitfile");
        std::fs::write(&gitfile, &bytes).unwrap();
        std::os::unix::fs::symlink(&gitfile, &dot).unwrap();
        resolves("symlink to a gitfile");

        // What git would not read the same way.
        reset();
        std::os::unix::fs::symlink(root.join("nowhere"), &dot).unwrap();
        refused("dangling symlink (git would search further up)");
        reset();
        std::fs::write(&dot, b"gitdir:/srv/x.git\n").unwrap();
        refused("no space after the colon");
        reset();
        std::fs::write(&dot, b"gitdir: /srv/x\0y.git\n").unwrap();
        refused("a NUL byte");
        reset();
        std::fs::write(&dot, b"gitdir: /no/such/dir\n").unwrap();
        refused("a target that does not exist");
        reset();
        std::fs::write(&dot, format!("gitdir: {}\n", gitfile.display())).unwrap();
        refused("a target that is a file");
        reset();
        let fifo = std::ffi::CString::new(dot.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates the node.
        #[allow(unsafe_code)]
        let r = unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) };
        assert_eq!(r, 0);
        refused("a fifo");
    }

    /// The config of a linked worktree's common directory is checked too, whatever bytes
    /// `commondir` holds; alternates in either refuse.
    #[tokio::test]
    async fn the_common_directory_and_alternates_are_checked() {
        use std::os::unix::ffi::OsStrExt;
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        let common = root.join(OsStr::from_bytes(b"common-\xfe.git"));
        init_at(&common);
        let own = root.join("own.git");
        init_at(&own);
        let mut bytes = b"../".to_vec();
        bytes.extend_from_slice(common.file_name().unwrap().as_bytes());
        bytes.push(b'\n');
        std::fs::write(own.join("commondir"), bytes).unwrap();
        let wt = root.join("wt");
        std::fs::create_dir(&wt).unwrap();
        std::fs::write(wt.join(".git"), format!("gitdir: {}\n", own.display())).unwrap();
        let env = ChildEnv::inherit();
        let cancel = CancellationToken::new();
        assert!(refusal(&wt, &env, &cancel).await.is_none());
        let ok = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&common)
            .args(["config", "core.fsmonitor", "/bin/evil"])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let why = refusal(&wt, &env, &cancel).await.unwrap().to_string();
        assert!(why.contains("core.fsmonitor"), "{why}");
        let ok = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&common)
            .args(["config", "--unset", "core.fsmonitor"])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        std::fs::write(
            common.join("objects/info/alternates"),
            "/elsewhere/objects\n",
        )
        .unwrap();
        let why = refusal(&wt, &env, &cancel).await.unwrap();
        assert!(matches!(why, Refusal::Alternates { .. }), "{why}");
    }

    #[test]
    fn the_daemon_git_environment_drops_what_redirects_git() {
        let mut env = ChildEnv::default();
        for k in [
            "GIT_DIR",
            "GIT_WORK_TREE",
            "GIT_INDEX_FILE",
            "GIT_OBJECT_DIRECTORY",
            "GIT_ALTERNATE_OBJECT_DIRECTORIES",
            "GIT_CONFIG_PARAMETERS",
            "GIT_CONFIG_GLOBAL",
            "GIT_SSH_COMMAND",
        ] {
            env.set(k, "/elsewhere");
        }
        scrub_env(&mut env);
        for k in [
            "GIT_DIR",
            "GIT_WORK_TREE",
            "GIT_INDEX_FILE",
            "GIT_OBJECT_DIRECTORY",
            "GIT_ALTERNATE_OBJECT_DIRECTORIES",
            "GIT_CONFIG_PARAMETERS",
        ] {
            assert_eq!(env.get(k), None, "{k}");
        }
        assert_eq!(env.get("GIT_SSH_COMMAND"), Some("/elsewhere"));
        assert_eq!(env.get("GIT_CONFIG_GLOBAL"), Some("/dev/null"));
        assert_eq!(env.get("GIT_CONFIG_NOSYSTEM"), Some("1"));
        assert_eq!(env.get("GIT_NO_REPLACE_OBJECTS"), Some("1"));
    }
}
