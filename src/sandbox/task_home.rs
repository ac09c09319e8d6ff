//! The task's own HOME: a fresh directory under the task's private directory, removed with
//! the task, that its children get as `HOME` (and the XDG config, data and state homes).
//!
//! Tools read and write under `$HOME` by name, whatever their variables say: yarn 1 run as
//! root reads `~/.npmrc` and `~/.yarnrc` beside the file `npm_config_userconfig` names, npm
//! writes its logs and update-check stamps there, git reads `~/.gitconfig`, most tools keep
//! settings in `~/.config` and state in `~/.local`. The service user's HOME is closed to
//! tasks (its `.npmrc`, `.ssh`, `.cargo/credentials.toml`, `.git-credentials` hold logins;
//! under the unit HOME *is* the state directory), so a task pointed at it fails on the first
//! such read or write, or would read the operator's logins. A HOME of the task's own makes
//! both go away for every tool at once, and nothing a task writes there outlives it: what
//! should survive between tasks goes to the repository's caches (see [`super::caches`]),
//! through each tool's own variable.
//!
//! What the operator's HOME gave tasks and still should, the task's HOME gets as copies,
//! fresh for every task:
//! - `.gitconfig` and `.config/git/{config,ignore,attributes}` (the author identity, aliases;
//!   never `.config/git/credentials`, credential-store's file);
//! - `.npmrc`: a copy of `[sandbox] npmrc` when the operator names one (the registries and
//!   logins tasks may use, on purpose), else empty. `npm_config_userconfig` names it too, so
//!   npm, pnpm and yarn all read this one file.
//!
//! Toolchain managers that find their toolchains under HOME (`rustup`'s `~/.rustup`,
//! `pyenv`'s `~/.pyenv`, `nvm`'s `~/.nvm`) are pointed at the operator's directories by their
//! own variables, which the filesystem policy grants read-only.
//!
//! Layout (under the task's private directory, `TMPDIR`):
//!
//! ```text
//! home/.npmrc                 [sandbox] npmrc, or empty
//! home/.gitconfig             the operator's, when it has one
//! home/.config/git/           the operator's config, ignore, attributes
//! home/.config/ .local/share/ .local/state/ .cache/   XDG homes (.cache unless caches are on)
//! ```

use std::io;
use std::path::{Path, PathBuf};

/// The directory's name under the task's private directory.
const DIR: &str = "home";

/// Largest file copied in: settings files are a few KiB.
const MAX_FILE: u64 = 1024 * 1024;

/// git's files under the XDG config home that are settings (not `credentials`).
const GIT_XDG_FILES: &[&str] = &["config", "ignore", "attributes"];

/// Toolchain managers found through HOME: their variable and directory under HOME.
pub const TOOLCHAIN_HOMES: &[(&str, &str)] = &[
    ("RUSTUP_HOME", ".rustup"),
    ("PYENV_ROOT", ".pyenv"),
    ("NVM_DIR", ".nvm"),
];

/// Make `tmp/home` the task's fresh HOME, seeded as the module docs say. `inherited` is the
/// environment the children would otherwise get (it names the operator's HOME), `npmrc` the
/// operator's `[sandbox] npmrc`. Returns the variables that point the children at it.
/// Blocking.
pub fn seed(
    tmp: &Path,
    inherited: &[(String, String)],
    npmrc: Option<&Path>,
) -> io::Result<Vec<(String, String)>> {
    use std::os::unix::fs::DirBuilderExt;
    let home = tmp.join(DIR);
    match crate::sandbox::beneath::remove_tree(&home) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut dirs = std::fs::DirBuilder::new();
    dirs.recursive(true).mode(0o700);
    for sub in [".config/git", ".local/share", ".local/state", ".cache"] {
        dirs.create(home.join(sub))?;
    }
    let get = |k: &str| {
        inherited
            .iter()
            .find(|(n, v)| n == k && !v.is_empty())
            .map(|(_, v)| PathBuf::from(v))
    };
    let operator = get("HOME");
    // The operator's own settings, never a credential.
    if let Some(h) = &operator {
        copy_file(&h.join(".gitconfig"), &home.join(".gitconfig"))?;
    }
    let git_xdg = get("XDG_CONFIG_HOME")
        .or_else(|| operator.as_ref().map(|h| h.join(".config")))
        .map(|c| c.join("git"));
    if let Some(from) = git_xdg {
        for name in GIT_XDG_FILES {
            copy_file(&from.join(name), &home.join(".config/git").join(name))?;
        }
    }
    let rc = home.join(".npmrc");
    match npmrc {
        Some(from) => {
            if !copy_file(from, &rc)? {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "[sandbox] npmrc = {:?} is not a readable file of at most 1 MiB",
                        from
                    ),
                ));
            }
        }
        None => write_private(&rc, b"")?,
    }
    let s = |p: PathBuf| p.to_string_lossy().into_owned();
    let mut set = vec![
        ("HOME".to_string(), s(home.clone())),
        ("XDG_CONFIG_HOME".to_string(), s(home.join(".config"))),
        ("XDG_DATA_HOME".to_string(), s(home.join(".local/share"))),
        ("XDG_STATE_HOME".to_string(), s(home.join(".local/state"))),
        ("XDG_CACHE_HOME".to_string(), s(home.join(".cache"))),
        ("npm_config_userconfig".to_string(), s(rc)),
    ];
    // Toolchains stay where the operator installed them.
    for (var, under_home) in TOOLCHAIN_HOMES {
        if get(var).is_some() {
            continue;
        }
        if let Some(dir) = operator.as_ref().map(|h| h.join(under_home)) {
            if dir.is_dir() {
                set.push((var.to_string(), s(dir)));
            }
        }
    }
    Ok(set)
}

/// Copy `from` (a regular file of at most [`MAX_FILE`], links followed: the operator's
/// dotfiles are often links into a dotfiles repository) to `to`, mode 0600. `false` when
/// there is no such file or the daemon may not read it.
fn copy_file(from: &Path, to: &Path) -> io::Result<bool> {
    match std::fs::metadata(from) {
        Ok(m) if m.is_file() && m.len() <= MAX_FILE => {}
        _ => return Ok(false),
    }
    let bytes = match std::fs::read(from) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Ok(false),
        Err(e) => return Err(e),
    };
    write_private(to, &bytes)?;
    Ok(true)
}

fn write_private(to: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    io::Write::write_all(&mut out, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(p: &[(&str, &Path)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string_lossy().into_owned()))
            .collect()
    }

    fn value<'a>(set: &'a [(String, String)], k: &str) -> Option<&'a str> {
        set.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_task_gets_copies_of_the_operators_settings_and_never_its_logins() {
        let d = tempfile::tempdir().unwrap();
        let op = d.path().join("operator");
        std::fs::create_dir_all(op.join(".config/git")).unwrap();
        std::fs::create_dir_all(op.join(".rustup")).unwrap();
        std::fs::write(op.join(".gitconfig"), "[user]\nname = op\n").unwrap();
        std::fs::write(op.join(".npmrc"), "//registry/:_authToken=secret\n").unwrap();
        std::fs::write(op.join(".config/git/ignore"), "*.swp\n").unwrap();
        std::fs::write(op.join(".config/git/credentials"), "https://u:p@h\n").unwrap();
        let tmp = d.path().join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let set = seed(&tmp, &vars(&[("HOME", &op)]), None).unwrap();
        let home = tmp.join(DIR);
        assert_eq!(value(&set, "HOME"), Some(home.to_str().unwrap()));
        assert_eq!(
            std::fs::read_to_string(home.join(".gitconfig")).unwrap(),
            "[user]\nname = op\n"
        );
        assert_eq!(
            std::fs::read_to_string(home.join(".config/git/ignore")).unwrap(),
            "*.swp\n"
        );
        assert!(!home.join(".config/git/credentials").exists());
        // The operator's npmrc (logins) is not the task's: an empty one, named for npm too.
        assert_eq!(std::fs::read_to_string(home.join(".npmrc")).unwrap(), "");
        assert_eq!(
            value(&set, "npm_config_userconfig"),
            Some(home.join(".npmrc").to_str().unwrap())
        );
        assert_eq!(
            value(&set, "RUSTUP_HOME"),
            Some(op.join(".rustup").to_str().unwrap())
        );
        assert_eq!(value(&set, "NVM_DIR"), None, "no such directory");
        // What a task wrote is gone for the next; the one it was given is back.
        std::fs::write(home.join(".gitconfig"), "[alias]\nx = !evil\n").unwrap();
        std::fs::write(home.join(".bashrc"), "planted\n").unwrap();
        seed(&tmp, &vars(&[("HOME", &op)]), None).unwrap();
        assert!(!home.join(".bashrc").exists());
        assert_eq!(
            std::fs::read_to_string(home.join(".gitconfig")).unwrap(),
            "[user]\nname = op\n"
        );
    }

    #[test]
    fn a_configured_npmrc_is_copied_and_a_missing_one_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let rc = d.path().join("tasks.npmrc");
        std::fs::write(&rc, "registry=https://mirror.example/\n").unwrap();
        let set = seed(d.path(), &[], Some(&rc)).unwrap();
        let copy = value(&set, "npm_config_userconfig").unwrap();
        assert_eq!(
            std::fs::read_to_string(copy).unwrap(),
            "registry=https://mirror.example/\n"
        );
        // An explicit rustup location is the operator's choice, kept.
        let set = seed(
            d.path(),
            &vars(&[("RUSTUP_HOME", Path::new("/opt/r"))]),
            None,
        )
        .unwrap();
        assert_eq!(value(&set, "RUSTUP_HOME"), None);
        let err = seed(d.path(), &[], Some(&d.path().join("none"))).unwrap_err();
        assert!(err.to_string().contains("[sandbox] npmrc"), "{err}");
    }
}
