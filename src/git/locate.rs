//! Finding the git directory the way git does: `.git` as a directory, a symlink or a gitfile
//! with any bytes, a linked worktree's common directory, alternates refused. What cannot be
//! resolved is a [`Refusal`], never "no repository" (git would then search further up).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::refusal::Refusal;

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
        let path = read_gitfile(&dot).map_err(|e| refuse(e.to_string()))?;
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

/// Why a `.git` file is not a gitfile git would follow.
#[derive(Debug, thiserror::Error)]
enum BadGitfile {
    #[error("a gitfile that cannot be read ({0})")]
    Unreadable(std::io::Error),
    #[error("a gitfile too large to be one")]
    TooLarge,
    #[error("a file that is not a gitfile (no `gitdir: ` line)")]
    NoGitdirLine,
    #[error("a gitfile whose path is empty or holds a NUL byte")]
    BadPath,
}

/// The path in a gitfile: `gitdir: ` then the path, trailing newlines and carriage returns
/// dropped (git's `read_gitfile_gently`). Bytes, not text: a path need not be UTF-8.
fn read_gitfile(file: &Path) -> Result<PathBuf, BadGitfile> {
    let bytes = read_small(file).map_err(BadGitfile::Unreadable)?;
    if bytes.len() as u64 > MAX_GITFILE {
        return Err(BadGitfile::TooLarge);
    }
    let Some(rest) = bytes.strip_prefix(b"gitdir: ") else {
        return Err(BadGitfile::NoGitdirLine);
    };
    let mut end = rest.len();
    while end > 0 && matches!(rest[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    let path = &rest[..end];
    if path.is_empty() || path.contains(&0) {
        return Err(BadGitfile::BadPath);
    }
    Ok(PathBuf::from(OsStr::from_bytes(path)))
}

/// The common directory of a (linked-worktree) git directory, from its `commondir` file,
/// read as bytes like a gitfile's path.
/// None when it is not a regular file or holds more than [`MAX_GITFILE`] bytes: a task can
/// write the git directory, and a `commondir` linked to `/dev/zero` was read to the end
/// (memory without a bound), one made a FIFO blocked the thread; a path that long cannot
/// resolve for git either.
fn common_dir(git_dir: &Path) -> Option<PathBuf> {
    let bytes = read_small(&git_dir.join("commondir")).ok()?;
    if bytes.len() as u64 > MAX_GITFILE {
        return None;
    }
    let mut end = bytes.len();
    while end > 0 && matches!(bytes[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    let p = PathBuf::from(OsStr::from_bytes(&bytes[..end]));
    Some(git_dir.join(p))
}

/// At most [`MAX_GITFILE`]` + 1` bytes of the regular file at `path` (links followed, as
/// git follows them): opened non-blocking and checked on its descriptor, so a FIFO or a
/// device put there (a task writes work trees and git directories) neither blocks nor
/// streams without end.
fn read_small(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    f.take(MAX_GITFILE + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Refuse a git directory (or its common directory) that lists alternates: objects from
/// another repository would be read as its own.
pub(crate) fn no_alternates(git_dir: &Path) -> Result<(), Refusal> {
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
pub(crate) mod tests {
    use super::*;
    use std::ffi::OsStr;

    /// A bare repository at `dir` (also used by `harden`'s tests).
    pub(crate) fn init_at(dir: &Path) {
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

    /// Issue 43 audit: a task can write a git directory's `commondir`. A FIFO there blocked
    /// the reading thread for ever, a link to `/dev/zero` was read without a bound; now
    /// neither is read (no common directory: a path that long or that odd git cannot use).
    #[test]
    fn a_commondir_that_is_a_fifo_or_endless_is_not_read() {
        use std::os::unix::ffi::OsStrExt;
        let d = tempfile::tempdir().unwrap();
        let git_dir = d.path().join("repo.git");
        init_at(&git_dir);
        let commondir = git_dir.join("commondir");
        let c = std::ffi::CString::new(commondir.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates the node.
        #[allow(unsafe_code)]
        let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(r, 0);
        // On a thread: before the fix the open blocks until a writer comes (never); the
        // wait below is a guard against that hang, not a timing measure.
        let (tx, rx) = std::sync::mpsc::channel();
        let gd = git_dir.clone();
        std::thread::spawn(move || {
            let _ = tx.send((common_dir(&gd), config_files(&gd)));
        });
        let (common, files) = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("reading a FIFO commondir blocked");
        assert_eq!(common, None);
        assert_eq!(files, vec![git_dir.join("config")]);
        assert!(no_alternates(&git_dir).is_ok());

        std::fs::remove_file(&commondir).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &commondir).unwrap();
        assert_eq!(common_dir(&git_dir), None);
        std::fs::remove_file(&commondir).unwrap();
        std::fs::write(&commondir, vec![b'x'; MAX_GITFILE as usize + 1]).unwrap();
        assert_eq!(common_dir(&git_dir), None);
        std::fs::write(&commondir, b"../other.git\n").unwrap();
        assert_eq!(common_dir(&git_dir), Some(git_dir.join("../other.git")));
    }
}
