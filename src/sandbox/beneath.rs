//! The one way the daemon touches a tree a task can write: held open by descriptor, every
//! entry beneath it opened relative to that descriptor without following a link.
//!
//! A task may leave anything in a tree it was granted — the repository's dependency caches,
//! its TMPDIR and HOME, the workspace: a symbolic link where the daemon expects a file or a
//! directory, a FIFO or a socket, a directory where a file was. Opened by path, the daemon
//! (unconfined, with its own uid or root) follows such a link to wherever it points and
//! writes, truncates, deletes or creates there; and a grant built from a path through it
//! hands the next task the target. Here instead:
//!
//! - a directory is opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the tree's
//!   root descriptor; where that fails (a link, a file in the way, a missing directory, an
//!   old kernel) the path is walked one component at a time with `O_NOFOLLOW | O_DIRECTORY`,
//!   and an entry that is not a directory is **replaced** by one, never used;
//! - a file the daemon writes is written to a fresh name (`O_CREAT | O_EXCL`) and renamed over
//!   the entry, so whatever stood there (a link, a FIFO, a hard link to someone else's file) is
//!   replaced, never written through;
//! - an entry is removed with `unlinkat` relative to its directory's descriptor, a directory
//!   emptied through descriptors opened `O_NOFOLLOW`, made writable with `fchmod` on those
//!   descriptors (never `chmod` by path), iteratively at any depth ([`super::teardown`]).
//!
//! The root of a tree is a path the daemon made and a task cannot change (its parent is not
//! granted): `state_dir/caches/<key>/tree`, `state_dir/tmp/<task>`. The system calls are
//! `rustix`'s (already in the build through `tempfile`), so this module needs no `unsafe`.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

use super::teardown;
use rustix::io::Errno;

/// How a directory of a tree is opened: readable (to list it), never through a link.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// A directory held open; every path below it is resolved beneath it without following links.
#[derive(Debug)]
pub struct Tree {
    fd: OwnedFd,
    path: PathBuf,
}

impl Tree {
    /// Open `root`, made (with its parents) when missing. `root` is the daemon's own path, in
    /// a directory no task can write (`caches/<key>`, `tmp/<task>`), so it is opened as named:
    /// a link the operator made there (the state directory on a larger disk) is followed.
    /// Everything beneath it is opened by [`Tree::dir`] and friends.
    pub fn open_root(root: &Path) -> io::Result<Tree> {
        std::fs::create_dir_all(root)?;
        Ok(Tree {
            fd: rustix::fs::open(
                root,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?,
            path: root.to_path_buf(),
        })
    }

    /// The path this tree was opened as (for messages and for the variables that name it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory `rel` (plain names only: no `..`, not absolute) beneath this one, made
    /// where missing; any entry on the way that is not a directory (a link, a file, a FIFO,
    /// a socket, a directory the daemon cannot open) is removed and replaced by a fresh one.
    pub fn dir(&self, rel: &str) -> io::Result<Tree> {
        let names = plain_names(rel)?;
        // The everyday case, one system call: everything is there and nothing is a link.
        let beneath = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS;
        if let Ok(fd) = rustix::fs::openat2(&self.fd, rel, DIR_FLAGS, Mode::empty(), beneath) {
            return Ok(Tree {
                fd,
                path: self.path.join(rel),
            });
        }
        let mut names = names.into_iter();
        let Some(first) = names.next() else {
            return self.reopen();
        };
        let mut cur = self.child_dir(first)?;
        for name in names {
            cur = cur.child_dir(name)?;
        }
        Ok(cur)
    }

    /// Make `name` in this directory a regular file holding `bytes` with `mode`: written under
    /// a fresh name and renamed over whatever `name` was, which is replaced, never written
    /// through (a directory there is removed first).
    pub fn put_file(&self, name: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
        single_name(OsStr::new(name))?;
        let tmp = format!(".{}.hub-sidecar-{:016x}", name, fastrand::u64(..));
        let fd = rustix::fs::openat(
            &self.fd,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?;
        let written = (|| -> io::Result<()> {
            let mut file = std::fs::File::from(fd);
            io::Write::write_all(&mut file, bytes)?;
            // The umask may have taken bits the caller asked for; never adds any.
            rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))?;
            match rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name) {
                // A directory stands there: it goes, then the file takes its place.
                Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                    self.remove(name)?;
                    rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name)?;
                }
                r => r?,
            }
            Ok(())
        })();
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
        }
        written
    }

    /// Remove `name` from this directory, whatever it is (a directory with everything beneath
    /// it), never following a link. Missing is not an error.
    pub fn remove(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        remove_entry(&self.fd, single_name(name.as_ref())?)
    }

    /// The names in this directory with their types (never `.` or `..`), links not followed.
    pub fn entries(&self) -> io::Result<Vec<(std::ffi::OsString, FileType)>> {
        let mut out = Vec::new();
        for e in rustix::fs::Dir::read_from(&self.fd)? {
            let e = e?;
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            out.push((OsStr::from_bytes(name).to_os_string(), e.file_type()));
        }
        Ok(out)
    }

    /// This directory opened again (a second descriptor on the same directory).
    fn reopen(&self) -> io::Result<Tree> {
        Ok(Tree {
            fd: rustix::fs::openat(&self.fd, ".", DIR_FLAGS, Mode::empty())?,
            path: self.path.clone(),
        })
    }

    /// The directory `name` in this one, made when missing and replaced when it is
    /// anything else (see [`Tree::dir`]).
    fn child_dir(&self, name: &OsStr) -> io::Result<Tree> {
        let path = self.path.join(name);
        for _ in 0..3 {
            match rustix::fs::openat(&self.fd, name, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => return Ok(Tree { fd, path }),
                Err(Errno::NOENT) => {}
                // A link (`O_NOFOLLOW`), something other than a directory, or a directory the
                // task made unreadable: not what the daemon expects, so replaced.
                Err(Errno::LOOP | Errno::NOTDIR | Errno::ACCESS) => remove_entry(&self.fd, name)?,
                Err(e) => return Err(e.into()),
            }
            match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(io::Error::other(format!(
            "{} keeps changing under the daemon",
            path.display()
        )))
    }
}

/// Remove the tree at `path` (the daemon's own path: a task's TMPDIR, a per-task workspace, a
/// repository's cache), everything in it, also where a tool made directories read-only (Go's
/// module cache), never following a link, at any depth (see [`super::teardown`]), within
/// [`teardown::Budget::for_task_tree`]. Blocking.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    Ok(teardown::remove_path(
        path,
        &mut teardown::Budget::for_task_tree(),
    )?)
}

/// Remove `name` from the directory `dir`, whatever it is (see [`super::teardown`]).
fn remove_entry(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    Ok(teardown::remove_entry(
        dir.as_fd(),
        name,
        &mut teardown::Budget::for_task_tree(),
    )?)
}

/// `rel` as plain names: no `..`, no root, no `.`.
fn plain_names(rel: &str) -> io::Result<Vec<&OsStr>> {
    Path::new(rel)
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{rel:?} is not a path of plain names"),
            )),
        })
        .collect()
}

/// `name` as one plain name (no `/` at all: a trailing one would make the kernel follow a
/// link).
fn single_name(name: &OsStr) -> io::Result<&OsStr> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not one name"),
        ));
    }
    Ok(name)
}

/// The regular file at `path` in a tree a task wrote (a file the daemon only reads, such as
/// one it hashes in the workspace), opened without following a link in its last component
/// and without blocking on a FIFO; `None` for anything else or nothing.
pub fn open_regular(path: &Path) -> Option<std::fs::File> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = rustix::fs::open(path, flags | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let regular = FileType::from_raw_mode(rustix::fs::fstat(&fd).ok()?.st_mode).is_file();
    regular.then(|| std::fs::File::from(fd))
}

/// `path` (absolute, canonical) opened as a path (`O_PATH`), only if it resolves to itself:
/// no component of it is a link, so what is opened is what the path names now, not what a
/// link planted since it was resolved points to. For the grants of a Landlock ruleset, which
/// are canonical paths: a grant that no longer resolves to itself is refused (`ELOOP`).
/// With it, whether it is a directory.
pub fn open_exact(path: &Path) -> io::Result<(OwnedFd, bool)> {
    let flags = OFlags::PATH | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        flags,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS,
    ) {
        // Kernels before 5.6 (no Landlock either, so rarely here): the last component only.
        Err(Errno::NOSYS) => rustix::fs::open(path, flags | OFlags::NOFOLLOW, Mode::empty())?,
        r => r?,
    };
    let is_dir = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode).is_dir();
    Ok((fd, is_dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn a_tree_is_removed_whatever_its_modes_and_links_and_what_they_name_stays() {
        let d = tempfile::tempdir().unwrap();
        let (tree, outside) = (d.path().join("tree"), d.path().join("outside"));
        std::fs::create_dir_all(tree.join("ro/deep")).unwrap();
        std::fs::create_dir_all(tree.join("closed")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("f"), "x").unwrap();
        std::fs::write(tree.join("ro/deep/f"), "x").unwrap();
        symlink(&outside, tree.join("ro/link")).unwrap();
        let mode = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
        mode(&outside, 0o555).unwrap();
        mode(&tree.join("ro/deep"), 0o555).unwrap();
        mode(&tree.join("ro"), 0o555).unwrap();
        mode(&tree.join("closed"), 0o000).unwrap();
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        // Never made writable, never emptied: the link was removed, not followed.
        assert_eq!(
            std::fs::metadata(&outside).unwrap().permissions().mode() & 0o777,
            0o555
        );
        assert_eq!(std::fs::read_to_string(outside.join("f")).unwrap(), "x");
        mode(&outside, 0o755).unwrap();
    }

    #[test]
    fn a_file_put_replaces_what_stood_there_and_names_are_single() {
        let d = tempfile::tempdir().unwrap();
        let t = Tree::open_root(&d.path().join("t")).unwrap();
        std::fs::write(d.path().join("target"), "theirs").unwrap();
        symlink(d.path().join("target"), t.path().join("a")).unwrap();
        std::fs::create_dir_all(t.path().join("b/c")).unwrap();
        for name in ["a", "b"] {
            t.put_file(name, b"ours", 0o600).unwrap();
            let m = std::fs::symlink_metadata(t.path().join(name)).unwrap();
            assert!(m.is_file() && m.permissions().mode() & 0o777 == 0o600);
        }
        assert_eq!(
            std::fs::read_to_string(d.path().join("target")).unwrap(),
            "theirs"
        );
        for bad in ["", ".", "..", "a/b", "a/", "/a"] {
            assert!(t.put_file(bad, b"", 0o600).is_err(), "{bad:?}");
            assert!(t.remove(bad).is_err(), "{bad:?}");
        }
        assert!(t.dir("../x").is_err() && t.dir("/x").is_err());
        // Only beside the tree's own entries: nothing left behind by the writes.
        let mut names: Vec<_> = t.entries().unwrap().into_iter().map(|(n, _)| n).collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
    }
}
