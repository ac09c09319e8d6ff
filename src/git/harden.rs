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
//!    ([`locate`](super::locate::locate): a directory, a symlink, or a gitfile with any bytes) and git is handed
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
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::locate::{config_files, git_dir_of, locate, no_alternates, Located};
pub use super::refusal::Refusal;

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
/// program and transports, and the CA a private git server's certificate is checked
/// against (`GIT_SSL_CAINFO`/`GIT_SSL_CAPATH`: a trust anchor, not a way around the check;
/// they reach git only when the operator passes them with `[env] allow`). Every other one
/// (`GIT_DIR`, `GIT_WORK_TREE`, `GIT_INDEX_FILE`, `GIT_OBJECT_DIRECTORY`,
/// `GIT_ALTERNATE_OBJECT_DIRECTORIES`, `GIT_CONFIG_PARAMETERS`, `GIT_SSL_NO_VERIFY`, …)
/// would move what git reads or what it trusts and is removed by [`scrub_env`].
const GIT_VARS_KEPT: &[&str] = &[
    "GIT_SSH_COMMAND",
    "GIT_SSH",
    "GIT_ALLOW_PROTOCOL",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
];

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

/// [`refusal`] for the config files of one git directory (see [`config_files`](super::locate::config_files)).
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
/// directory named explicitly (see [`locate`](super::locate::locate)); the caller adds its own arguments. Call
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::locate::tests::init_at;
    use std::ffi::OsStr;

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
