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
//! Two defences, both on every git call of the daemon ([`super::GitRunner`]):
//!
//! 1. **Fixed overrides** on the command line ([`overrides`]): hooks off, fsmonitor off, no
//!    pager, no editor, no external diff, no `ext::` transport, no askpass; the work tree
//!    named as a safe directory.
//! 2. **A trusted git directory**: a managed clone keeps its git directory outside the
//!    workspace, where a task cannot write, so its config is the daemon's own. Any other git
//!    directory (an operator's `repo_dir`, a repository the task created) may have been
//!    written by the task: its config is read first and every key outside a short
//!    allowlist ([`untrusted_keys`]) refuses the call. A driver named in `.gitattributes`
//!    only runs when config defines it, so a trusted config makes attributes inert too.

use std::collections::HashMap;
use std::ffi::OsString;
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

/// Environment for every git call: no pager, no editor, never a prompt.
pub const ENV: &[(&str, &str)] = &[
    ("GIT_PAGER", "cat"),
    ("PAGER", "cat"),
    ("GIT_EDITOR", "true"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_ASKPASS", ""),
    ("SSH_ASKPASS", ""),
    ("GCM_INTERACTIVE", "never"),
];

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
    "core.worktree",
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
/// written) sets a key outside the allowlist, or cannot be read. `None`: no git directory,
/// or nothing but plain settings. Every git call of the daemon asks this first, except in a
/// managed clone, whose git directory only the daemon writes.
pub async fn refusal(
    work_tree: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Option<Refusal> {
    let git_dir = git_dir_of(work_tree)?;
    refusal_of(&config_files(&git_dir), env, cancel).await
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
        let Some(git_dir) = git_dir_of(work_tree) else {
            return Ok(());
        };
        let files = config_files(&git_dir);
        // Taken before the listing: a change during it makes the next call list again.
        let stamp = ConfigStamp::of(&files);
        if stamp.is_some() && self.clean_stamp(&git_dir) == stamp {
            return Ok(());
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let verdict = refusal_of(&files, env, cancel).await;
        let mut clean = self.clean.lock().expect("clean configs lock poisoned");
        match (verdict, stamp) {
            (None, Some(stamp)) => {
                clean.insert(git_dir, stamp);
                Ok(())
            }
            (None, None) => {
                clean.remove(&git_dir);
                Ok(())
            }
            (Some(why), _) => {
                clean.remove(&git_dir);
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

/// `git` in `cwd` with the fixed overrides and environment for `work_tree`; the caller
/// adds its own arguments.
pub fn command(cwd: &Path, work_tree: &Path, env: &ChildEnv) -> CommandSpec {
    let mut spec = CommandSpec::new("git", cwd, env.clone()).args(overrides(work_tree));
    for (k, v) in ENV {
        spec.env.set(k, v);
    }
    spec
}

/// The git directory of the work tree at `work_tree`, as git would find it there: `.git`
/// itself, or the directory a `.git` file (`gitdir: …`) points to. `None` when there is
/// no `.git` (not the top of a work tree).
pub fn git_dir_of(work_tree: &Path) -> Option<PathBuf> {
    let dot = work_tree.join(".git");
    let meta = std::fs::symlink_metadata(&dot).ok()?;
    if meta.is_dir() {
        return Some(dot);
    }
    let text = std::fs::read_to_string(&dot).ok()?;
    let target = text.trim().strip_prefix("gitdir:")?.trim();
    Some(work_tree.join(target))
}

/// The config files of an untrusted git directory that git would read: its `config`, the
/// per-worktree `config.worktree`, and those of the common directory a linked worktree
/// points to (`commondir`).
pub fn config_files(git_dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![git_dir.to_path_buf()];
    if let Ok(common) = std::fs::read_to_string(git_dir.join("commondir")) {
        dirs.push(git_dir.join(common.trim()));
    }
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
core.pager\nevil\0alias.st\n!evil\0gpg.program\nevil\0core.hookspath\n.hooks\0";
        assert_eq!(
            untrusted_keys(listing),
            vec![
                "alias.st",
                "core.fsmonitor",
                "core.hookspath",
                "core.pager",
                "core.sshcommand",
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

    #[test]
    fn a_gitfile_names_the_git_directory() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(git_dir_of(d.path()), None);
        std::fs::write(d.path().join(".git"), "gitdir: /srv/x.git\n").unwrap();
        assert_eq!(git_dir_of(d.path()), Some(PathBuf::from("/srv/x.git")));
    }
}
