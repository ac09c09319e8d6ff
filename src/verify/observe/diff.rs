//! The two diffs of [`super`]: what `git status` lists now, or what a walk finds now,
//! against the rows of the before-snapshot, into the bounded collector of changes.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::table::*;
use super::{walk, Limits};

/// The snapshot time given to probes of the after side: they keep no hash, so no file is
/// racy there.
const AFTER: i128 = i128::MAX;

/// What `git status` listed now ([`Listed`]) against the rows from before: one `lstat` per
/// row listed now or before, reads only for racily clean rows, and an `lstat` for each kept
/// new path. The listing's order does not matter: the collector keeps the first changes by
/// path.
pub(super) fn diff_git(
    root: &Path,
    table: &Table,
    listed: Listed,
    may_revert: bool,
) -> (Changes, Coarse) {
    let Listed { rows, new, ignored } = listed;
    let mut changes = Changes::new(new.max);
    for (row, &flags) in table.rows.iter().zip(&rows) {
        let name = table.name(row);
        let path = root.join(OsStr::from_bytes(name));
        if flags != 0 {
            let now = Probe::at(&path, AFTER);
            if differs(table, row, &now, &path) {
                changes.add(name, listed_change(Some(row), flags, &now));
            }
            continue;
        }
        // Listed before, not now: gone from disk (an untracked file deleted), or clean again
        // (reverted, or committed). "Reverted" is not claimed when a listing was cut (the path
        // may only be missing from it) or HEAD moved (the commit lines say it).
        let exists = Probe::at(&path, AFTER).exists();
        let kind = match (row.fp != ABSENT, exists) {
            (true, false) => Kind::Deleted,
            // A deleted tracked file brought back is clean again too.
            (_, true) if may_revert => Kind::Reverted,
            // Deleted before and still gone, now unlisted: the deletion was committed.
            _ => continue,
        };
        changes.add(
            name,
            Change {
                kind,
                tracked: false,
                size_before: u64::from(row.size),
                size_after: 0,
            },
        );
    }
    // Listed now with no row from before: every one is a change; the first by path were
    // kept, the others only counted.
    let unkept = new.total - new.kept.len();
    for (name, flags) in new.kept {
        let now = Probe::at(&root.join(OsStr::from_bytes(&name)), AFTER);
        changes.add(name, listed_change(None, flags, &now));
    }
    changes.total += unkept;
    (changes, Coarse::of(root, ignored))
}

/// A path `git status` lists now (with `flags`) that differs from its row `before`, if any.
fn listed_change(before: Option<&Row>, flags: u8, now: &Probe) -> Change {
    let tracked = flags & LISTED_TRACKED != 0;
    let kind = if !now.exists() || flags & LISTED_DELETED != 0 {
        Kind::Deleted
    } else if !tracked || flags & LISTED_ADDED != 0 {
        // An untracked file already there before and changed since is modified.
        if before.is_some_and(|r| r.fp != ABSENT) && !tracked {
            Kind::Modified
        } else {
            Kind::Added
        }
    } else {
        Kind::Modified
    };
    Change {
        kind,
        tracked,
        size_before: before.map_or(0, |r| u64::from(r.size)),
        size_after: now.size,
    }
}

/// A walk now against the rows from before. A cap on this walk hides files, so a row not
/// seen is checked on disk before it is called deleted; a cap on the earlier walk means a
/// path with no row may have existed unseen, so it is listed only when newer than that walk.
pub(super) fn diff_walk(
    root: &Path,
    table: &Table,
    capped_before: bool,
    taken_ns: i128,
    limits: Limits,
) -> (Changes, bool, Coarse) {
    let mut changes = Changes::new(limits.max_lines);
    let mut seen = Seen::new(table.rows.len());
    let (capped_after, coarse) = walk(root, limits.walk_cap, |rel, path, meta| {
        let now = Probe::of(meta, AFTER);
        match table.find(rel) {
            Some(i) => {
                seen.set(i);
                let row = table.rows[i];
                if differs(table, &row, &now, path) {
                    changes.add(rel, modified(&row, &now));
                }
            }
            None if !capped_before || now.changed_ns >= taken_ns => changes.add(
                rel,
                Change {
                    kind: if capped_before {
                        Kind::AddedOrChanged
                    } else {
                        Kind::Added
                    },
                    tracked: false,
                    size_before: 0,
                    size_after: now.size,
                },
            ),
            None => {}
        }
    });
    for (i, row) in table.rows.iter().enumerate() {
        if seen.get(i) {
            continue;
        }
        let name = table.name(row);
        let now = if capped_after {
            Probe::at(&root.join(OsStr::from_bytes(name)), AFTER)
        } else {
            Probe::ABSENT
        };
        if !now.exists() {
            changes.add(
                name,
                Change {
                    kind: Kind::Deleted,
                    tracked: false,
                    size_before: u64::from(row.size),
                    size_after: 0,
                },
            );
        } else if differs(table, row, &now, &root.join(OsStr::from_bytes(name))) {
            changes.add(name, modified(row, &now));
        }
    }
    (changes, capped_after, coarse)
}

fn modified(row: &Row, now: &Probe) -> Change {
    Change {
        kind: Kind::Modified,
        tracked: false,
        size_before: u64::from(row.size),
        size_after: now.size,
    }
}
