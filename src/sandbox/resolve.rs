//! The canonical form of a sandbox's paths: Landlock rules follow the real tree, so every
//! grant and denial is resolved (symlinks, `..`) before it becomes a rule.

use std::path::{Path, PathBuf};

/// Existing paths, canonical (Landlock rules follow the real tree), without duplicates.
pub(super) fn canonical(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut known = Resolved::default();
    let mut out: Vec<PathBuf> = paths
        .into_iter()
        .filter_map(|p| known.canonical(&p))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `realpath` over many paths that share their leading directories (`/usr`, HOME, the
/// state directory, every PATH entry's parents): each directory is resolved once per
/// sandbox, not once per path under it. `realpath(3)` reads every component of every path
/// again: ~110 `readlink` calls for one task's grants, against ~40 `lstat` calls here.
#[derive(Default)]
struct Resolved {
    /// Canonical form of each directory met so far (`None`: does not exist).
    dirs: std::collections::HashMap<PathBuf, Option<PathBuf>>,
}

impl Resolved {
    /// `path` resolved as `std::fs::canonicalize` would, `None` where that fails.
    fn canonical(&mut self, path: &Path) -> Option<PathBuf> {
        use std::path::Component;
        let (Some(parent), Some(Component::Normal(name))) =
            (path.parent(), path.components().next_back())
        else {
            // `/`, a relative path, or one ending in `.` / `..`: the general case.
            return std::fs::canonicalize(path).ok();
        };
        if let Some(known) = self.dirs.get(path) {
            return known.clone();
        }
        let resolved = match self.canonical(parent) {
            None => None,
            // A real directory's child that is no symlink is that directory's child; a
            // symlink (or anything odd) goes the general way.
            Some(real_parent) => {
                let candidate = real_parent.join(name);
                match std::fs::symlink_metadata(&candidate) {
                    Ok(m) if !m.file_type().is_symlink() => Some(candidate),
                    Ok(_) => std::fs::canonicalize(&candidate).ok(),
                    Err(_) => None,
                }
            }
        };
        self.dirs.insert(path.to_path_buf(), resolved.clone());
        resolved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefixes_resolve_as_realpath_does() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("real/bin")).unwrap();
        std::fs::write(d.join("real/bin/tool"), "").unwrap();
        symlink(d.join("real"), d.join("abs")).unwrap(); // absolute link to a directory
        symlink("real/bin", d.join("rel")).unwrap(); // relative link, two levels down
        symlink("abs", d.join("chain")).unwrap(); // a link to a link
        symlink("missing", d.join("dangling")).unwrap();
        let paths: Vec<PathBuf> = [
            "real/bin/tool",
            "abs/bin/tool",
            "abs/bin",
            "rel/tool",
            "chain/bin/../bin/tool",
            "abs/../real/bin",
            "dangling",
            "dangling/x",
            "nothing/here",
            "real/bin/tool/not-a-dir",
        ]
        .iter()
        .map(|p| d.join(p))
        .collect();
        let mut known = Resolved::default();
        for p in &paths {
            // Asked twice: the second answer comes from what the first resolved.
            for _ in 0..2 {
                assert_eq!(
                    known.canonical(p),
                    std::fs::canonicalize(p).ok(),
                    "{}",
                    p.display()
                );
            }
        }
    }
}
