//! Removing a tree a task wrote, at any depth and any width, in bounded stack, memory and
//! descriptors, never following a link, never panicking.
//!
//! A recursive removal (std's `remove_dir_all` included) takes a stack frame and a descriptor
//! per level: a task that leaves a 30,000-deep nest of directories in its TMPDIR overflows
//! the blocking thread's stack and aborts the daemon, again at every start, when the sweep
//! of what a killed daemon left meets the same nest. Here the walk is a loop over an explicit
//! stack of at most [`MAX_HELD`] open directories (each with its listing's position): a
//! directory found deeper than that is renamed to the top of the tree being emptied (never
//! out of it), which cuts any chain into pieces no deeper than the stack. Each entry is
//! handled once per listing pass, a directory is listed again only after a pass that removed
//! something, so the time is linear in the entries. A [`Budget`] bounds it: a tree that needs
//! more is left for [`remove_or_set_aside`] to rename out of the way.
//!
//! Entries are removed with `unlinkat` relative to their directory's descriptor; directories
//! opened `O_NOFOLLOW | O_DIRECTORY`; modes a tool or a task took away given back with
//! `fchmod` on the descriptor (`sandbox::beneath` holds the rest of the descriptor-relative
//! rules).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

/// Most directories held open at once by one removal (its descriptors and listing buffers).
pub const MAX_HELD: usize = 32;

/// Where trees that could not be removed are set aside: a directory of this name beside
/// them, which the start-up sweep leaves alone (it reports what is there instead).
pub const SET_ASIDE: &str = ".set-aside";

/// How a directory of the tree is opened: to list it, never through a link.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// How much one removal may do before it gives up: entries and wall time.
#[derive(Debug, Clone)]
pub struct Budget {
    entries: u64,
    deadline: Option<Instant>,
}

impl Budget {
    /// At most `entries` entries and `time`.
    pub fn new(entries: u64, time: Duration) -> Budget {
        Budget {
            entries,
            deadline: Instant::now().checked_add(time),
        }
    }

    /// No bound: for trees only the daemon writes.
    pub fn unlimited() -> Budget {
        Budget {
            entries: u64::MAX,
            deadline: None,
        }
    }

    /// What a task's tree gets: ten million entries, five minutes (a `node_modules` of
    /// 200,000 files takes a few seconds).
    pub fn for_task_tree() -> Budget {
        Budget::new(10_000_000, Duration::from_secs(300))
    }

    fn spend(&mut self) -> Result<(), RemoveError> {
        self.entries = self.entries.checked_sub(1).ok_or(RemoveError::OverBudget)?;
        // The clock every 1,024 entries: cheap, and still within a second of the deadline.
        if self.entries.is_multiple_of(1024) && self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(RemoveError::OverBudget);
        }
        Ok(())
    }
}

/// Why a tree was not removed.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    /// A system call failed (the tree stays as far as it got).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// More entries or more time than its [`Budget`].
    #[error("more entries or time than the removal's budget")]
    OverBudget,
}

impl From<Errno> for RemoveError {
    fn from(e: Errno) -> Self {
        RemoveError::Io(e.into())
    }
}

impl From<RemoveError> for io::Error {
    fn from(e: RemoveError) -> Self {
        match e {
            RemoveError::Io(e) => e,
            RemoveError::OverBudget => io::Error::new(io::ErrorKind::TimedOut, e.to_string()),
        }
    }
}

/// What [`remove_or_set_aside`] did.
#[derive(Debug)]
pub enum Removal {
    /// Gone (or was never there).
    Removed,
    /// Renamed to `to` (under a [`SET_ASIDE`] directory beside it), because of `why`.
    SetAside {
        /// Where it is now.
        to: PathBuf,
        /// Why it could not be removed.
        why: String,
    },
    /// Neither removed nor set aside.
    Failed(io::Error),
}

/// Remove the tree at `path` (the daemon's own path; the last component may be anything a
/// task made: a link is removed, not followed) within `budget`.
pub fn remove_path(path: &Path, budget: &mut Budget) -> Result<(), RemoveError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput).into());
    };
    let parent = rustix::fs::open(
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    remove_entry(parent.as_fd(), name, budget)
}

/// Remove the tree at `path` within [`Budget::for_task_tree`]; what cannot be removed (over
/// the budget, or a call failing) is renamed into a [`SET_ASIDE`] directory beside it, so
/// nothing walks it again on its own (the start-up sweep reports it, see
/// [`set_aside_in`]). Blocking.
pub fn remove_or_set_aside(path: &Path) -> Removal {
    remove_or_set_aside_within(path, &mut Budget::for_task_tree())
}

/// [`remove_or_set_aside`] with the budget given.
pub fn remove_or_set_aside_within(path: &Path, budget: &mut Budget) -> Removal {
    let why = match remove_path(path, budget) {
        Ok(()) => return Removal::Removed,
        Err(RemoveError::Io(e)) if e.kind() == io::ErrorKind::NotFound => return Removal::Removed,
        Err(e) => e.to_string(),
    };
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Removal::Failed(io::ErrorKind::InvalidInput.into());
    };
    let aside = parent.join(SET_ASIDE);
    if let Err(e) = std::fs::create_dir_all(&aside) {
        return Removal::Failed(e);
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut to_name = name.to_os_string();
    to_name.push(format!(".{stamp}.{:08x}", fastrand::u32(..)));
    let to = aside.join(to_name);
    match std::fs::rename(path, &to) {
        Ok(()) => Removal::SetAside { to, why },
        Err(e) => Removal::Failed(e),
    }
}

/// The trees set aside under `root` (in its [`SET_ASIDE`] directory), by name.
pub fn set_aside_in(root: &Path) -> Vec<OsString> {
    std::fs::read_dir(root.join(SET_ASIDE))
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default()
}

/// Remove `name` from the directory `dir`: unlinked if it is not a directory (a link is
/// removed, never followed), else emptied (see the module docs) and removed.
pub fn remove_entry(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    budget: &mut Budget,
) -> Result<(), RemoveError> {
    budget.spend()?;
    match unlink(dir, name, AtFlags::empty())? {
        Gone::Yes => return Ok(()),
        Gone::IsDir | Gone::NotDir => {}
    }
    let Some(sub) = open_dir(dir, name)? else {
        return Ok(());
    };
    empty(sub, budget, MAX_HELD)?;
    rmdir(dir, name)
}

/// What an unlink did.
enum Gone {
    /// The entry is gone (or was already).
    Yes,
    /// It is a directory with entries (or, unlinked as a file, a directory).
    IsDir,
    /// Removed as a directory, it is not one.
    NotDir,
}

/// `unlinkat(dir, name, flags)`, a directory that refuses it (read-only: Go's module cache)
/// made writable through its descriptor first; a missing entry is gone too.
fn unlink(dir: BorrowedFd<'_>, name: &OsStr, flags: AtFlags) -> Result<Gone, RemoveError> {
    for attempt in 0..2 {
        match rustix::fs::unlinkat(dir, name, flags) {
            Ok(()) | Err(Errno::NOENT) => return Ok(Gone::Yes),
            Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => return Ok(Gone::IsDir),
            Err(Errno::NOTDIR) => return Ok(Gone::NotDir),
            Err(Errno::ACCESS | Errno::PERM) if attempt == 0 => writable(dir)?,
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::from(io::ErrorKind::PermissionDenied).into())
}

/// Remove the directory `name` of `dir`, emptied just before.
fn rmdir(dir: BorrowedFd<'_>, name: &OsStr) -> Result<(), RemoveError> {
    match unlink(dir, name, AtFlags::REMOVEDIR)? {
        Gone::Yes => Ok(()),
        Gone::NotDir => match unlink(dir, name, AtFlags::empty())? {
            Gone::Yes => Ok(()),
            _ => Err(changing()),
        },
        Gone::IsDir => Err(changing()),
    }
}

/// A tree something keeps writing while it is removed (no task runs then: not expected).
fn changing() -> RemoveError {
    io::Error::other("the tree keeps changing while it is removed").into()
}

/// The directory `name` of `dir` opened for listing, made listable and writable by its owner
/// when a task took that away; `None` when it is gone.
fn open_dir(dir: BorrowedFd<'_>, name: &OsStr) -> Result<Option<OwnedFd>, RemoveError> {
    let fd = match rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        // Unreadable (mode 0, or write-only): opened as a path, made the owner's again.
        Err(Errno::ACCESS) => {
            let p = rustix::fs::openat(
                dir,
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            chmod_path_fd(&p)?;
            rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())?
        }
        Err(e) => return Err(e.into()),
    };
    // Not fatal here: a directory we can list but not write fails at the first unlink,
    // which makes it writable then.
    let _ = writable(fd.as_fd());
    Ok(Some(fd))
}

/// One directory on the walk's stack: its listing, and its name in its parent (`None` for
/// the directory being emptied).
struct Level {
    dir: Dir,
    name: Option<OsString>,
    /// Whether this pass over the listing removed or moved anything: if so the directory is
    /// listed once more before it counts as empty.
    changed: bool,
}

/// Remove everything in the directory `root` (not `root` itself). Iterative: at most
/// `held` ([`MAX_HELD`]) directories open; deeper ones are moved up into `root`.
fn empty(root: OwnedFd, budget: &mut Budget, held: usize) -> Result<(), RemoveError> {
    let mut stack = vec![Level {
        dir: Dir::new(root)?,
        name: None,
        changed: false,
    }];
    loop {
        let depth = stack.len();
        let Some(level) = stack.last_mut() else {
            return Ok(());
        };
        let entry = match level.dir.read() {
            None if level.changed => {
                level.changed = false;
                level.dir.rewind();
                continue;
            }
            None => {
                let done = stack.pop().and_then(|l| l.name);
                match (done, stack.last()) {
                    (Some(name), Some(parent)) => rmdir(parent.dir.fd()?, &name)?,
                    _ => return Ok(()),
                }
                continue;
            }
            Some(entry) => entry?,
        };
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = OsStr::from_bytes(name).to_os_string();
        level.changed = true;
        budget.spend()?;
        // A directory is tried with rmdir first (an empty one needs nothing more), anything
        // else (or a type the file system does not say) with unlink.
        let first = if entry.file_type() == FileType::Directory {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        let fd = stack[depth - 1].dir.fd()?;
        let mut gone = unlink(fd, &name, first)?;
        if let Gone::NotDir = gone {
            gone = unlink(fd, &name, AtFlags::empty())?;
        }
        match gone {
            Gone::Yes => continue,
            Gone::IsDir => {}
            Gone::NotDir => return Err(changing()),
        }
        if depth >= held {
            rehome(stack[0].dir.fd()?, fd, &name)?;
            stack[0].changed = true;
            continue;
        }
        if let Some(sub) = open_dir(fd, &name)? {
            stack.push(Level {
                dir: Dir::new(sub)?,
                name: Some(name),
                changed: false,
            });
        }
    }
}

/// Move the directory `name` of `from` to a fresh name in `root` (the directory being
/// emptied: the same file system, and still inside the tree), never over anything.
fn rehome(root: BorrowedFd<'_>, from: BorrowedFd<'_>, name: &OsStr) -> Result<(), RemoveError> {
    let mut made_writable = false;
    for _ in 0..8 {
        let fresh = format!(".hub-sidecar-deep-{:016x}", fastrand::u64(..));
        match rustix::fs::renameat_with(from, name, root, fresh.as_str(), RenameFlags::NOREPLACE) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::EXIST) => continue,
            // A directory moves to another parent only if it is writable itself (its `..`
            // changes): a task may have taken that away.
            Err(Errno::ACCESS | Errno::PERM) if !made_writable => {
                made_writable = true;
                drop(open_dir(from, name)?);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::other("no fresh name to move a deep directory to").into())
}

/// The directory behind `fd` writable (and searchable) by its owner.
fn writable(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mode = rustix::fs::fstat(fd)?.st_mode & 0o7777;
    if mode & 0o700 == 0o700 {
        return Ok(());
    }
    Ok(rustix::fs::fchmod(fd, Mode::from_raw_mode(mode | 0o700))?)
}

/// `chmod u+rwx` on the directory an `O_PATH` descriptor holds: `fchmod` refuses such a
/// descriptor, its `/proc/self/fd` entry names exactly that directory (no path is walked).
fn chmod_path_fd(fd: &OwnedFd) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    let proc = format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd());
    std::fs::set_permissions(proc, std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
#[path = "teardown_tests.rs"]
mod tests;
