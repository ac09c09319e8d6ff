//! The agent CLI's configuration directory, fresh for every run of it.
//!
//! `claude` reads its settings (hooks, `env`, `apiKeyHelper`), `CLAUDE.md` and login from
//! one directory, `CLAUDE_CONFIG_DIR`, and writes its state there. Shared between tasks,
//! that directory let one task configure the next task's agent, its judge and the
//! operator's `check`. So the operator's directory (`CLAUDE_CONFIG_DIR` of the daemon, else
//! `~/.claude`) is only a **template**: the daemon copies its top-level files (settings,
//! `CLAUDE.md`, the login `.credentials.json`) into a directory of the task's own, under the
//! task's private directory that the daemon removes with the task. Children are never
//! granted the template; what a run writes dies with the task.
//!
//! A task gets one such directory ([`seed`], from [`super::plan`]); the judge gets another,
//! made after the agent has stopped ([`fresh`]), so nothing the agent wrote reaches it.
//!
//! Only files are copied, never directories or links: the template may hold the CLI's own
//! installation (`local/`), transcripts (`projects/`) and caches, none of which a task needs,
//! and a program there must not become a copy the task can rewrite.

use std::io;
use std::path::{Path, PathBuf};

use super::Sandbox;

/// Largest template file copied: settings and a login are a few KiB.
const MAX_FILE: u64 = 1024 * 1024;

/// The name of a per-task config directory under the task's private directory.
const DIR_PREFIX: &str = ".agent-config";

/// The operator's template, from the daemon's (inherited) variables: `CLAUDE_CONFIG_DIR`,
/// else `$HOME/.claude`. `None` without either.
pub fn template(vars: &[(String, String)]) -> Option<PathBuf> {
    let get = |k: &str| {
        vars.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    };
    get("CLAUDE_CONFIG_DIR")
        .map(PathBuf::from)
        .or_else(|| get("HOME").map(|h| Path::new(h).join(".claude")))
}

/// The config directory for run `name` under the task's private directory `task_dir`.
pub fn dir_for(task_dir: &Path, name: &str) -> PathBuf {
    task_dir.join(format!("{DIR_PREFIX}-{name}"))
}

/// Make `dir` a fresh copy of `template`'s top-level regular files (mode 0700, files 0600):
/// whatever `dir` held before is removed first. A missing template gives an empty
/// directory (the CLI then runs unconfigured, e.g. with `ANTHROPIC_API_KEY`).
pub fn seed(template: &Path, dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    // At any depth, never through a link: `dir` is in the task's TMPDIR.
    match super::beneath::remove_tree(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let entries = match std::fs::read_dir(template) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        // Not followed: a link in the template is not the operator's file to hand out.
        let meta = entry.metadata()?;
        if !meta.file_type().is_file() || meta.len() > MAX_FILE {
            continue;
        }
        let bytes = std::fs::read(entry.path())?;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join(entry.file_name()))?;
        io::Write::write_all(&mut out, &bytes)?;
    }
    Ok(())
}

/// What of a template a [`seed`] copies, as the file system describes it: the name, inode,
/// size, modification and change times of each top-level regular file.
pub type Fingerprint = Vec<(std::ffi::OsString, [i64; 5])>;

/// `template`'s [`Fingerprint`]: equal fingerprints, equal copies. `None` when the template
/// cannot be read (nothing can be told from it).
pub fn fingerprint(template: &Path) -> Option<Fingerprint> {
    use std::os::unix::fs::MetadataExt;
    let entries = match std::fs::read_dir(template) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Some(Vec::new()),
        Err(_) => return None,
    };
    let mut v = Vec::new();
    for entry in entries {
        let entry = entry.ok()?;
        let m = entry.metadata().ok()?;
        if m.file_type().is_file() {
            let id = [
                m.ino() as i64,
                m.size() as i64,
                m.mtime(),
                m.mtime_nsec(),
                m.ctime_nsec(),
            ];
            v.push((entry.file_name(), id));
        }
    }
    v.sort();
    Some(v)
}

/// A fresh copy of `sandbox`'s agent template for run `name` (the judge), inside the task's
/// private directory: the `CLAUDE_CONFIG_DIR` that run gets. `None` when the task has no
/// template (the CLI then uses the operator's directory as configured).
pub fn fresh(sandbox: &Sandbox, name: &str) -> io::Result<Option<PathBuf>> {
    let Some(template) = sandbox.agent_template() else {
        return Ok(None);
    };
    let dir = dir_for(sandbox.tmp(), name);
    seed(template, &dir)?;
    Ok(Some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_copies_the_templates_files_only_and_starts_from_nothing() {
        let d = tempfile::tempdir().unwrap();
        let tpl = d.path().join("tpl");
        std::fs::create_dir_all(tpl.join("local")).unwrap();
        std::fs::write(tpl.join("settings.json"), "{}").unwrap();
        std::fs::write(tpl.join(".credentials.json"), "{\"t\":1}").unwrap();
        std::fs::write(tpl.join("local/claude"), "#!/bin/sh\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", tpl.join("linked")).unwrap();
        let dir = dir_for(d.path(), "agent");
        seed(&tpl, &dir).unwrap();
        // What an earlier run left is gone after the next seed.
        std::fs::write(dir.join("settings.json"), "{\"hooks\":1}").unwrap();
        std::fs::write(dir.join("CLAUDE.md"), "planted").unwrap();
        seed(&tpl, &dir).unwrap();
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [".credentials.json", "settings.json"]);
        assert_eq!(
            std::fs::read_to_string(dir.join("settings.json")).unwrap(),
            "{}"
        );
        assert_eq!(
            std::fs::read_to_string(tpl.join("settings.json")).unwrap(),
            "{}"
        );
        // The fingerprint follows what a seed copies: a file rewritten, added or removed.
        let before = fingerprint(&tpl).unwrap();
        assert_eq!(fingerprint(&tpl), Some(before.clone()));
        std::fs::write(tpl.join("local/other"), "x").unwrap();
        assert_eq!(
            fingerprint(&tpl),
            Some(before.clone()),
            "not a top-level file"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(tpl.join(".credentials.json"), "{\"t\":2}").unwrap();
        assert_ne!(fingerprint(&tpl), Some(before.clone()), "a new login");
        let again = fingerprint(&tpl).unwrap();
        std::fs::remove_file(tpl.join("settings.json")).unwrap();
        assert_ne!(fingerprint(&tpl), Some(again));
        assert_eq!(fingerprint(&d.path().join("none")), Some(Vec::new()));
        // No template: an empty directory.
        seed(&d.path().join("none"), &dir).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }

    #[test]
    fn the_template_is_the_daemons_config_dir_else_home() {
        let v = |p: &[(&str, &str)]| -> Vec<(String, String)> {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            template(&v(&[("HOME", "/h"), ("CLAUDE_CONFIG_DIR", "/c")])),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            template(&v(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.claude"))
        );
        assert_eq!(template(&[]), None);
    }
}
