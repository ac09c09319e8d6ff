//! Recognising, in a failed child's output, that containment (not the task's code) is why it
//! failed: an EACCES/EPERM on a path outside the task's grants.
//!
//! Under `[network] mode = "none"` the same goes for a child that found no network (no
//! resolver, no route): [`find_network`].
//!
//! Owns the classification only. A failed check or shell command whose output names such a
//! path becomes an infrastructure error (`check_error`, the task's `error`) naming the path
//! and the config line that would grant it, rather than a failure the corrective loop would
//! ask the model to fix: no edit of the workspace can change a sandbox grant.
//!
//! A path counts as denied by containment when three things hold: a line of the output says
//! "permission denied" / "operation not permitted" (in the words of sh, coreutils, node,
//! python, cargo or Go) and names it, on that line or a few lines around it (cargo puts the
//! path above its `Caused by:`, npm below its `code EACCES`); the path is outside the task's write grants (inside
//! them the refusal is the project's own file modes, e.g. a test of a read-only file); and
//! the daemon itself, unconfined, may access it (otherwise ordinary Unix permissions refused
//! it, as they would anywhere).

use std::path::{Path, PathBuf};

use super::landlock::FsPolicy;

/// Phrases that report a refused access, lower case.
const MARKERS: &[&str] = &[
    "permission denied",
    "operation not permitted",
    "eacces",
    "eperm",
    "os error 13",
    "errno 13",
];

/// Phrases that report a path missing, lower case: what a child is told of a path its mount
/// namespace hides (see `mounts.rs`), counted only where the sandbox hides trees and only for
/// a path outside every grant.
const HIDDEN_MARKERS: &[&str] = &[
    "no such file or directory",
    "directory nonexistent",
    "enoent",
    "(os error 2)",
];

/// How many lines above a marker may name its path (cargo: path, blank, `Caused by:`, reason).
const LOOKBACK: usize = 4;

/// How many lines below (npm: `code EACCES`, then `syscall`, then `path`).
const LOOKAHEAD: usize = 3;

/// What containment kept from a task's child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// A path outside the task's grants.
    Path {
        /// The path the child was refused.
        path: PathBuf,
        /// Whether the task may at least read it (then it was refused a write).
        readable: bool,
        /// What the operator would change so tasks may use it.
        remedy: Remedy,
        /// The config file the grant would go into, when known.
        config: Option<PathBuf>,
    },
    /// A host the network proxy refused (`[network] mode = "allowlist"`).
    Host {
        /// `host:port`.
        target: String,
        /// The config file the allowlist is in, when known.
        config: Option<PathBuf>,
    },
    /// An allowed host the proxy could not connect to (`[network] mode = "allowlist"`):
    /// this machine's network, resolver or the host itself, which no edit of the task fixes.
    Unreachable {
        /// `host:port`.
        target: String,
        /// The connect error.
        error: String,
    },
    /// The network, under `[network] mode = "none"`.
    Network {
        /// The line of output that says so.
        line: String,
        /// The config file the mode is set in, when known.
        config: Option<PathBuf>,
    },
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let file = |c: &Option<PathBuf>| {
            c.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "the config file".into())
        };
        match self {
            Denial::Path {
                path,
                readable,
                remedy,
                config,
            } => {
                let what = if *readable { "write" } else { "reach" };
                write!(
                    f,
                    "infrastructure_error: containment denied {}, which a task may not {what}; \
                     not a fault of the task's code, so it is not retried. ",
                    path.display(),
                )?;
                let config = file(config);
                match remedy {
                    Remedy::Cache { var, dir } => write!(
                        f,
                        "It is in {}, the default of `{var}`, a package manager's cache: rather \
                         than granting it, let the sandbox point `{var}` at the repository's own \
                         cache, as it does with `[caches] enabled = true` (the default) in \
                         {config} unless the task sets `{var}` itself",
                        dir.display()
                    ),
                    Remedy::Grant { path, create } => {
                        let p = path.display();
                        let grant = if *readable || path.is_dir() || *create {
                            format!(
                                "`[sandbox] write_paths = [\"{p}\"]` (`read_paths` to let tasks \
                                 only read it)"
                            )
                        } else {
                            format!(
                                "`[sandbox] read_paths = [\"{p}\"]` (`write_paths` if tasks must \
                                 change it)"
                            )
                        };
                        let create = if *create {
                            ", after creating it (a grant needs an existing path)"
                        } else {
                            ""
                        };
                        write!(
                            f,
                            "If tasks need it, grant it with {grant} in {config}{create}"
                        )
                    }
                    Remedy::Rc => write!(
                        f,
                        "It is a package manager's settings file, where registry logins live, \
                         and tasks are not given the service user's (yarn reads one in every \
                         directory above the project, and in HOME): put what tasks need in the \
                         file `[sandbox] npmrc` names in {config} (each task gets a copy as its \
                         ~/.npmrc, and may read that file where it is), or name this one there \
                         if tasks may have what it holds; otherwise keep it out of the \
                         directories above the workspaces (under the unit HOME is the state \
                         directory, above every managed clone)"
                    ),
                    Remedy::None => write!(
                        f,
                        "It is, or holds, what tasks are never granted (the service user's HOME, \
                         the state directory, credentials, a top-level directory): point the tool \
                         at a directory of its own and grant that with `[sandbox] write_paths` in \
                         {config}"
                    ),
                }
            }
            Denial::Host { target, config } => {
                // A bare host is the web ports; another port, or an address of the daemon's
                // host, needs its `host:port` (see `allowlist.rs`).
                let host = match target.rsplit_once(':') {
                    Some((h, "80" | "443")) => h,
                    _ => target.as_str(),
                };
                write!(
                    f,
                    "infrastructure_error: the network allowlist refused {target}; not a fault of \
                     the task's code, so it is not retried. If tasks need it, add \"{host}\" to \
                     `[network] allow` in {}",
                    file(config)
                )
            }
            Denial::Unreachable { target, error } => write!(
                f,
                "infrastructure_error: the task's network proxy could not reach {target}, which \
                 the allowlist lets through ({error}); not a fault of the task's code, so it is \
                 not retried. Check this machine's route and resolver to it, or whether the \
                 host is down"
            ),
            Denial::Network { line, config } => write!(
                f,
                "infrastructure_error: the task has no network ([network] mode = \"none\") and \
                 needed it: {line}; not a fault of the task's code, so it is not retried. If \
                 tasks need the network, set `[network] mode = \"open\"` in {}",
                file(config)
            ),
        }
    }
}

/// What would let tasks use a refused path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remedy {
    /// It is a package manager's default cache under the service user's HOME (`dir`): the
    /// repository's cache, given through `var`, is the tool's place (see `caches.rs`).
    Cache {
        /// The tool's variable the sandbox sets.
        var: &'static str,
        /// The default cache directory the refused path is in.
        dir: PathBuf,
    },
    /// A grant of `path`: the refused path itself when it exists, else its nearest existing
    /// directory, or, when that is too wide, the refused path to be created (`create`).
    Grant {
        /// What to grant.
        path: PathBuf,
        /// It does not exist yet: the operator creates it first.
        create: bool,
    },
    /// A package manager's settings file (`.npmrc`, `.yarnrc`), where registry logins
    /// live: yarn reads them in HOME and in every directory above the project.
    Rc,
    /// Only a grant too wide to suggest would cover it (HOME, `/`, a top-level directory).
    None,
}

/// Settings files package managers look for above the project and in HOME by name.
const RC_FILES: &[&str] = &[".npmrc", ".yarnrc", ".yarnrc.yml"];

/// Words tools print when there is no network at all (no resolver, no route), lower case.
const NO_NETWORK: &[&str] = &[
    "could not resolve host",
    "temporary failure in name resolution",
    "name or service not known",
    "eai_again",
    "enotfound",
    "network is unreachable",
    "enetunreach",
    "failed to lookup address",
    "failed to resolve",
];

/// The first line of `output` that says a child found no network (for a sandbox whose
/// children have none: there, that is the reason).
pub fn find_network(output: &str, config: Option<&Path>) -> Option<Denial> {
    output
        .lines()
        .find(|l| {
            let lower = l.to_ascii_lowercase();
            NO_NETWORK.iter().any(|m| lower.contains(m))
        })
        .map(|l| Denial::Network {
            line: l.trim().chars().take(300).collect(),
            config: config.map(Path::to_path_buf),
        })
}

/// The first path in `output` that containment (as `fs` grants) refused, if any.
/// `config` is where the operator would grant it; `home` is the service user's HOME (never
/// suggested as a grant; the tools' default caches are under it). `hides`: the children
/// see nothing outside `fs`'s trees (a mount namespace hides the rest), so a path outside
/// them that they found missing, though it exists, was hidden by containment too.
pub fn find(
    output: &str,
    fs: &FsPolicy,
    config: Option<&Path>,
    home: Option<&Path>,
    hides: bool,
) -> Option<Denial> {
    let lines: Vec<&str> = output.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let lower = line.to_ascii_lowercase();
        let refused = MARKERS.iter().any(|m| lower.contains(m));
        let missing = hides && HIDDEN_MARKERS.iter().any(|m| lower.contains(m));
        if !refused && !missing {
            continue;
        }
        let fs_hidden = |p: &Path| {
            let real = resolve(p);
            !fs.read.iter().chain(&fs.write).any(|g| real.starts_with(g))
        };
        // The marker's own line first, then upwards, then downwards.
        let from = i.saturating_sub(LOOKBACK);
        let to = (i + LOOKAHEAD).min(lines.len() - 1);
        let near = lines[from..=i].iter().rev().chain(&lines[i + 1..=to]);
        for l in near {
            for p in paths_in(l) {
                if !refused && !fs_hidden(&p) {
                    continue;
                }
                if let Some(d) = judge(&p, fs, config, home) {
                    return Some(d);
                }
            }
        }
    }
    None
}

/// Whether containment explains a refusal of `path`.
fn judge(path: &Path, fs: &FsPolicy, config: Option<&Path>, home: Option<&Path>) -> Option<Denial> {
    let real = resolve(path);
    let under = |list: &[PathBuf]| list.iter().any(|g| real.starts_with(g));
    let denied = under(&fs.deny);
    if under(&fs.write) && !denied {
        return None;
    }
    let readable = under(&fs.read) && !denied;
    // Refused by ordinary permissions too? Then containment is not the reason.
    let mode = if readable { libc::W_OK } else { libc::R_OK };
    if !daemon_may(&real, mode) {
        return None;
    }
    Some(Denial::Path {
        path: path.to_path_buf(),
        readable,
        remedy: remedy(&real, fs, home),
        config: config.map(Path::to_path_buf),
    })
}

/// Absolute paths on one line: tokens starting with `/` after a separator, cut at quotes,
/// backticks, whitespace, commas, parentheses and a trailing colon or period.
fn paths_in(line: &str) -> Vec<PathBuf> {
    // coreutils quotes with ‘…’ in a UTF-8 locale.
    let line = &line.replace(['‘', '’', '“', '”'], "'");
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts = bytes[i] == b'/'
            && (i == 0 || b" \t'\"`(=:[".contains(&bytes[i - 1]))
            // Not a URL's `//`.
            && bytes.get(i + 1).is_some_and(|c| *c != b'/' && *c != b' ');
        if !starts {
            i += 1;
            continue;
        }
        let end = line[i..]
            .find(|c: char| c.is_whitespace() || "'\"`,()[]".contains(c))
            .map_or(line.len(), |n| i + n);
        let tok = line[i..end].trim_end_matches([':', '.', ';']);
        if tok.len() > 1 {
            out.push(PathBuf::from(tok));
        }
        i = end.max(i + 1);
    }
    out
}

/// `path` canonical, or (for one that does not exist yet) its nearest existing ancestor's
/// canonical form with the rest appended: grants are canonical paths.
fn resolve(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut cur = path;
    loop {
        if let Ok(c) = std::fs::canonicalize(cur) {
            let mut c = c;
            c.extend(rest.iter().rev());
            return c;
        }
        match (cur.parent(), cur.file_name()) {
            (Some(p), Some(n)) => {
                rest.push(n.to_os_string());
                cur = p;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Whether this (unconfined) process may access `path`, or for a path that does not exist,
/// write its nearest existing ancestor: `access(2)` with the real ids.
fn daemon_may(path: &Path, mode: libc::c_int) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (target, mode) = if path.exists() {
        (path, mode)
    } else {
        match path.ancestors().find(|a| a.exists()) {
            Some(a) => (a, libc::W_OK),
            None => return false,
        }
    };
    let Ok(c) = std::ffi::CString::new(target.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call; access(2) only
    // reads it.
    #[allow(unsafe_code)]
    let r = unsafe { libc::access(c.as_ptr(), mode) };
    r == 0
}

/// What to suggest for the refused `real` (canonical) path: a tool's default cache is
/// named as such; otherwise the narrowest grant that covers it and opens nothing the policy
/// closes. Too wide: `/` and top-level directories, the service user's HOME or anything
/// holding it, and anything holding or inside a denied path (the state directory, the
/// config file, credentials).
fn remedy(real: &Path, fs: &FsPolicy, home: Option<&Path>) -> Remedy {
    if real
        .file_name()
        .is_some_and(|n| RC_FILES.iter().any(|rc| n == *rc))
    {
        return Remedy::Rc;
    }
    let home = home.map(resolve);
    if let Some(h) = &home {
        if let Ok(rel) = real.strip_prefix(h) {
            let cache = super::caches::HOME_DEFAULTS
                .iter()
                .find(|(_, place)| rel.starts_with(place));
            if let Some((var, place)) = cache {
                return Remedy::Cache {
                    var,
                    dir: h.join(place),
                };
            }
        }
    }
    let too_wide = |p: &Path| {
        p.components().count() <= 2
            || home.as_ref().is_some_and(|h| h.starts_with(p))
            || fs.deny.iter().any(|d| d.starts_with(p) || p.starts_with(d))
    };
    if real.exists() {
        return if too_wide(real) {
            Remedy::None
        } else {
            Remedy::Grant {
                path: real.to_path_buf(),
                create: false,
            }
        };
    }
    match real.ancestors().skip(1).find(|a| a.is_dir()) {
        Some(a) if !too_wide(a) => Remedy::Grant {
            path: a.to_path_buf(),
            create: false,
        },
        _ if !too_wide(real) => Remedy::Grant {
            path: real.to_path_buf(),
            create: true,
        },
        _ => Remedy::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy granting `ws` read-write and `/usr` read-only, as canonical paths.
    fn policy(ws: &Path) -> FsPolicy {
        FsPolicy {
            read: vec![PathBuf::from("/usr")],
            write: vec![std::fs::canonicalize(ws).unwrap()],
            deny: Vec::new(),
        }
    }

    #[test]
    fn the_tools_own_words_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("home/.npm");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let o = outside.display();
        let fs = policy(&ws);
        for output in [
            format!("npm error code EACCES\nnpm error syscall mkdir\nnpm error path {o}/_cacache\nnpm error errno -13"),
            format!("Error: EACCES: permission denied, mkdir '{o}/_cacache'"),
            format!("PermissionError: [Errno 13] Permission denied: '{o}/x'"),
            format!("error: failed to create directory `{o}/registry/index`\n\nCaused by:\n  Permission denied (os error 13)"),
            format!("sh: 1: cannot create {o}/f: Permission denied"),
            format!("mkdir {o}/go-build: permission denied"),
            format!("touch: cannot touch '{o}/f': Operation not permitted"),
            format!("mkdir: cannot create directory ‘{o}/x’: Permission denied"),
        ] {
            let d = find(&output, &fs, Some(Path::new("/etc/hub-sidecar.toml")), None, false)
                .unwrap_or_else(|| panic!("not recognised: {output}"));
            let Denial::Path { path, .. } = &d else {
                panic!("{d:?}")
            };
            assert!(path.starts_with(&outside), "{output}: {d:?}");
            let msg = d.to_string();
            assert!(msg.starts_with("infrastructure_error:"), "{msg}");
            assert!(msg.contains("[sandbox]") && msg.contains("/etc/hub-sidecar.toml"), "{msg}");
        }
    }

    #[test]
    fn a_path_hidden_by_the_mount_namespace_is_containment_and_a_missing_granted_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (ws, outside) = (base.join("ws"), base.join("outside"));
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let fs = FsPolicy {
            read: vec![PathBuf::from("/usr")],
            write: vec![ws.clone()],
            deny: Vec::new(),
        };
        for line in [
            format!(
                "sh: 1: cannot create {}/f: Directory nonexistent",
                outside.display()
            ),
            format!("cat: {}/f: No such file or directory", outside.display()),
            format!(
                "Error: No such file or directory (os error 2): {}",
                outside.display()
            ),
        ] {
            let d = find(&line, &fs, None, None, true).unwrap_or_else(|| panic!("{line}"));
            assert!(
                matches!(&d, Denial::Path { path, .. } if path.starts_with(&outside)),
                "{d:?}"
            );
            // Without a mount namespace a missing path is only missing.
            assert_eq!(find(&line, &fs, None, None, false), None, "{line}");
        }
        // Missing inside a grant, or nowhere at all: the task's own.
        for line in [
            format!("cat: {}/nope: No such file or directory", ws.display()),
            "cat: /usr/nope/x: No such file or directory".to_string(),
        ] {
            assert_eq!(find(&line, &fs, None, None, true), None, "{line}");
        }
    }

    #[test]
    fn a_refusal_inside_the_workspace_or_by_plain_permissions_is_the_tasks_own() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let fs = policy(&ws);
        let w = ws.display();
        // The project's own read-only file: its test failed, containment had no part in it.
        assert_eq!(
            find(
                &format!("sh: 1: cannot create {w}/ro.txt: Permission denied"),
                &fs,
                None,
                None,
                false
            ),
            None
        );
        // No denial at all.
        assert_eq!(
            find(
                "test result: FAILED. 1 passed; 1 failed",
                &fs,
                None,
                None,
                false
            ),
            None
        );
    }

    /// What a refusal of `path` (under `policy(ws)`, the state directory `state` denied,
    /// the service user's HOME `home`) suggests, and its message.
    fn remedy_of(path: &Path, ws: &Path, state: &Path, home: &Path) -> (Remedy, String) {
        let mut fs = policy(ws);
        fs.deny.push(std::fs::canonicalize(state).unwrap());
        let out = format!(
            "error: EACCES: permission denied, open '{}'",
            path.display()
        );
        let d = find(&out, &fs, None, Some(home), false).unwrap_or_else(|| panic!("{out}"));
        let Denial::Path { remedy, .. } = &d else {
            panic!("{d:?}")
        };
        (remedy.clone(), d.to_string())
    }

    #[test]
    fn the_suggested_grant_is_the_narrowest_and_never_home_root_or_the_state_directory() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (ws, state, home) = (base.join("ws"), base.join("state"), base.join("home"));
        for d in [&ws, &state, &home, &base.join("shared/cache")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(home.join(".npmrc"), "").unwrap();
        let of = |p: &Path| remedy_of(p, &ws, &state, &home);

        // A tool's default cache under HOME: the repository's cache is its place, not HOME.
        let (r, msg) = of(&home.join(".cache/uv/sdists-v6"));
        assert_eq!(
            r,
            Remedy::Cache {
                var: "UV_CACHE_DIR",
                dir: home.join(".cache/uv")
            }
        );
        assert!(
            msg.contains("`UV_CACHE_DIR`") && msg.contains("[caches] enabled"),
            "{msg}"
        );
        assert!(!msg.contains("write_paths"), "{msg}");
        let (r, _) = of(&home.join("go/pkg/mod/cache"));
        assert!(
            matches!(
                r,
                Remedy::Cache {
                    var: "GOMODCACHE",
                    ..
                }
            ),
            "{r:?}"
        );

        // An existing file: itself, to read.
        std::fs::write(home.join("data.json"), "").unwrap();
        let (r, msg) = of(&home.join("data.json"));
        assert_eq!(
            r,
            Remedy::Grant {
                path: home.join("data.json"),
                create: false
            }
        );
        assert!(
            msg.contains(&format!(
                "read_paths = [\"{}\"]",
                home.join("data.json").display()
            )),
            "{msg}"
        );
        // A registry settings file (logins): never granted, the operator's route named.
        let (r, msg) = of(&home.join(".npmrc"));
        assert_eq!(r, Remedy::Rc);
        assert!(
            msg.contains("[sandbox] npmrc") && !msg.contains("= [\""),
            "{msg}"
        );
        // A new path whose nearest existing directory is HOME: the path, to be created.
        let (r, msg) = of(&home.join("tool/data/x"));
        assert_eq!(
            r,
            Remedy::Grant {
                path: home.join("tool/data/x"),
                create: true
            }
        );
        assert!(msg.contains("after creating it"), "{msg}");
        // A new path under an ordinary existing directory: that directory.
        let (r, _) = of(&base.join("shared/cache/a/b"));
        assert_eq!(
            r,
            Remedy::Grant {
                path: base.join("shared/cache"),
                create: false
            }
        );
        // HOME itself, the state directory and what is in it: nothing to grant.
        for p in [home.clone(), state.clone(), state.join("outbox/x")] {
            let (r, msg) = of(&p);
            assert_eq!(r, Remedy::None, "{}", p.display());
            assert!(!msg.contains("= [\""), "{msg}");
        }
    }

    #[test]
    fn no_network_is_recognised_in_curl_git_and_cargo_words() {
        for output in [
            "curl: (6) Could not resolve host: example.test",
            "fatal: unable to access 'https://example.test/r.git/': Could not resolve host: example.test",
            "npm error code EAI_AGAIN",
            "warning: spurious network error: [6] Couldn't resolve host name (Could not resolve host: index.crates.io)",
        ] {
            let d = find_network(output, None).unwrap_or_else(|| panic!("{output}"));
            assert!(d.to_string().contains("[network] mode"), "{d}");
        }
        assert_eq!(find_network("test result: FAILED", None), None);
    }

    #[test]
    fn urls_and_relative_paths_are_not_paths() {
        assert_eq!(
            paths_in("GET https://example.test/a/b: permission denied"),
            Vec::<PathBuf>::new()
        );
        assert_eq!(
            paths_in("open 'rel/x' and `/abs/y`: EACCES"),
            vec![PathBuf::from("/abs/y")]
        );
    }
}
