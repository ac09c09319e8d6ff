//! The compact state [`super`] keeps and compares: rows of path bytes with a metadata
//! fingerprint (the fine view), one fingerprint per ignored root (the coarse view), and the
//! bounded collector of what changed.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::git_text::{display_path, StatusEntry};

/// Racily clean files larger than this are not hashed (a content change that keeps size and
/// timestamps of a file this large within one timestamp tick is not worth reading it for);
/// line counts are not taken past it either.
pub(super) const MAX_HASHED_BYTES: u64 = 8 * 1024 * 1024;

/// A file changed less than this before the snapshot began is racily clean. Linux stamps
/// files from a clock that lags the precise one by up to a tick, and some file systems keep
/// 1 s or 2 s timestamps: 2 s covers both.
pub(super) const RACY_MARGIN_NS: i128 = 2_000_000_000;

/// Entries the coarse view may `lstat` in one snapshot, over all its roots.
pub(super) const COARSE_BUDGET: usize = 20_000;

/// Coarse roots with a fingerprint of their own; the rest share one.
pub(super) const COARSE_ROOTS: usize = 64;

// The fine view: compact rows.

/// A content hash: SHA-256 cut to 128 bits. It only has to tell a rewrite of a racily clean
/// file from the same bytes; 16 bytes keep that out of reach even of a crafted collision
/// (2⁶⁴ work) and halve what a tree of freshly written files costs (100,000 racy rows:
/// 2.0 MB with their keys, not 3.6).
pub(super) type ContentHash = [u8; 16];

/// The fingerprint of a path that does not exist.
pub(super) const ABSENT: u64 = 0;

/// One path's state, 16 bytes; its name lives in [`Table::names`], its content hash (racily
/// clean files only) in [`Table::hashes`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Row {
    /// [`fingerprint`] of the metadata (the size is in it); [`ABSENT`] when there was no file.
    pub(super) fp: u64,
    /// Where the name starts in [`Table::names`]; it ends at the next NUL.
    pub(super) name_at: u32,
    /// Bytes, saturated at [`SIZE_SATURATED`]: only shown, and compared for files small enough
    /// to hash. Four more bytes for every row would pay for the rare file past 4 GiB.
    pub(super) size: u32,
}

/// A [`Row::size`] this large means "4 GiB or more".
pub(super) const SIZE_SATURATED: u32 = u32::MAX;

/// Rows sorted by path bytes; their names back to back, each ended by a NUL (no path holds
/// one: the end costs one byte a row where a length would cost four); and the content hashes
/// of the racily clean rows, by [`Row::name_at`] (appended in that order).
#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) names: Vec<u8>,
    pub(super) rows: Vec<Row>,
    pub(super) hashes: Vec<(u32, ContentHash)>,
}

impl Table {
    pub(super) fn push(&mut self, name: &[u8], st: &Probe, hash: Option<ContentHash>) {
        let name_at = self.names.len();
        if !self.add_row(name_at, name.len(), st) {
            return;
        }
        self.names.extend_from_slice(name);
        self.names.push(0);
        if let Some(h) = hash {
            self.hashes.push((name_at as u32, h));
        }
    }

    /// The row of the name at `name_at` (`name_len` bytes) in [`Self::names`]; `false` when
    /// the offset does not fit (the path is dropped).
    fn add_row(&mut self, name_at: usize, name_len: usize, st: &Probe) -> bool {
        // Offsets are u32: past 4 GiB of names a path is dropped rather than mis-indexed
        // (no walk or git listing within the caps gets there).
        let Ok(at) = u32::try_from(name_at) else {
            return false;
        };
        if u32::try_from(name_at + name_len).is_err() {
            return false;
        }
        self.rows.push(Row {
            size: u32::try_from(st.size).unwrap_or(SIZE_SATURATED),
            fp: st.fp,
            name_at: at,
        });
        true
    }

    /// The rows of the paths a listing named (relative to `root`), each probed now: one
    /// `lstat`, and a hash for a racily clean file. The listing's buffer becomes the table's
    /// names, so the paths are held once; rows and hashes are counted before they are
    /// allocated, so each is allocated once at its size (a tree written just before the
    /// snapshot can be racy throughout: 100,000 hashes).
    pub(super) fn probe(root: &Path, listed: Names, taken_ns: i128) -> Table {
        let mut t = Table {
            names: listed.bytes,
            rows: Vec::with_capacity(listed.count),
            hashes: Vec::new(),
        };
        let mut racy = Seen::new(listed.count);
        let mut at = 0;
        while at < t.names.len() {
            let len = t.names[at..]
                .iter()
                .position(|b| *b == 0)
                .unwrap_or(t.names.len() - at);
            let p = Probe::at(
                &root.join(OsStr::from_bytes(&t.names[at..at + len])),
                taken_ns,
            );
            let i = t.rows.len();
            if t.add_row(at, len, &p) && p.racy && p.is_file && i < listed.count {
                racy.set(i);
            }
            at += len + 1;
        }
        t.hashes
            .reserve_exact((0..t.rows.len()).filter(|i| racy.get(*i)).count());
        for (i, row) in t.rows.iter().enumerate() {
            if !racy.get(i) {
                continue;
            }
            let path = root.join(OsStr::from_bytes(t.name(row)));
            if let Some(h) = content_hash(&path, u64::from(row.size)) {
                t.hashes.push((row.name_at, h));
            }
        }
        t.finish();
        t
    }

    pub(super) fn name(&self, r: &Row) -> &[u8] {
        name_at(&self.names, r.name_at)
    }

    /// The content hash kept for `r`, a racily clean file.
    pub(super) fn hash(&self, r: &Row) -> Option<ContentHash> {
        self.hashes
            .binary_search_by_key(&r.name_at, |(at, _)| *at)
            .ok()
            .map(|i| self.hashes[i].1)
    }

    /// Sort for lookups and give back what growth over-allocated.
    pub(super) fn finish(&mut self) {
        let names = std::mem::take(&mut self.names);
        self.rows
            .sort_unstable_by(|a, b| name_at(&names, a.name_at).cmp(name_at(&names, b.name_at)));
        self.names = names;
        self.names.shrink_to_fit();
        self.rows.shrink_to_fit();
        self.hashes.shrink_to_fit();
    }

    pub(super) fn find(&self, name: &[u8]) -> Option<usize> {
        self.rows.binary_search_by(|r| self.name(r).cmp(name)).ok()
    }
}

/// The NUL-ended name at `at` in `names`.
fn name_at(names: &[u8], at: u32) -> &[u8] {
    let rest = &names[at as usize..];
    &rest[..rest.iter().position(|b| *b == 0).unwrap_or(rest.len())]
}

/// The paths a listing named, in the order it named them, before they are probed: their
/// bytes back to back, each ended by a NUL (which no path holds), and counted.
#[derive(Debug, Default)]
pub(super) struct Names {
    bytes: Vec<u8>,
    count: usize,
}

impl Names {
    pub(super) fn push(&mut self, name: &[u8]) {
        // Grown by a quarter, not doubled: the buffer becomes the table's names and is the
        // largest allocation of a snapshot after the rows.
        let need = name.len() + 1;
        if self.bytes.capacity() - self.bytes.len() < need {
            let more = (self.bytes.capacity() / 4).max(need).max(16 * 1024);
            self.bytes.reserve_exact(more);
        }
        self.bytes.extend_from_slice(name);
        self.bytes.push(0);
        self.count += 1;
    }
}

/// A path's metadata as the fine view compares it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe {
    pub(super) fp: u64,
    pub(super) size: u64,
    pub(super) is_file: bool,
    /// Modified within [`RACY_MARGIN_NS`] of the snapshot's start.
    pub(super) racy: bool,
    /// The later of mtime and ctime, ns since the epoch.
    pub(super) changed_ns: i128,
}

impl Probe {
    pub(super) const ABSENT: Probe = Probe {
        fp: ABSENT,
        size: 0,
        is_file: false,
        racy: false,
        changed_ns: 0,
    };

    pub(super) fn of(meta: &std::fs::Metadata, taken_ns: i128) -> Probe {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        let mtime_ns = ns(meta.mtime(), meta.mtime_nsec());
        Probe {
            fp: fingerprint(meta),
            size: meta.len(),
            is_file: meta.is_file(),
            // git's rule is on mtime alone: a later write moves the mtime away from an old
            // one (and the fingerprint holds it), so only an mtime within a tick is at risk.
            racy: mtime_ns + RACY_MARGIN_NS >= taken_ns,
            changed_ns: mtime_ns.max(ns(meta.ctime(), meta.ctime_nsec())),
        }
    }

    pub(super) fn at(path: &Path, taken_ns: i128) -> Probe {
        match std::fs::symlink_metadata(path) {
            Ok(m) => Probe::of(&m, taken_ns),
            Err(_) => Probe::ABSENT,
        }
    }

    pub(super) fn exists(&self) -> bool {
        self.fp != ABSENT
    }
}

/// What git's index compares, in 64 bits. A collision would hide a change; at 2⁻⁶⁴ per
/// changed file that is below any other error here.
pub(super) fn fingerprint(m: &std::fs::Metadata) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    (m.dev(), m.ino(), m.mode(), m.len()).hash(&mut h);
    (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()).hash(&mut h);
    match h.finish() {
        ABSENT => 1,
        fp => fp,
    }
}

/// SHA-256 of a regular file's content, read in blocks; `None` when it cannot be read or is
/// larger than [`MAX_HASHED_BYTES`].
pub(super) fn content_hash(path: &Path, size: u64) -> Option<ContentHash> {
    if size > MAX_HASHED_BYTES {
        return None;
    }
    // What a task left: a link or a FIFO where a file was listed is not read.
    let mut f = crate::sandbox::beneath::open_regular(path)?;
    let mut h = Sha256::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let full: [u8; 32] = h.finalize().into();
    full[..16].try_into().ok()
}

/// Lines of a regular file (a last line without a newline counts), read in blocks; `None`
/// past [`MAX_HASHED_BYTES`] or when unreadable.
pub(super) fn line_count(path: &Path) -> Option<u64> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_HASHED_BYTES {
        return None;
    }
    // What a task left: a link or a FIFO where a file was listed is not read.
    let mut f = crate::sandbox::beneath::open_regular(path)?;
    let mut buf = [0u8; 16 * 1024];
    let (mut lines, mut last) = (0u64, b'\n');
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                lines += buf[..n].iter().filter(|b| **b == b'\n').count() as u64;
                last = buf[n - 1];
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(lines + u64::from(last != b'\n'))
}

/// The row's content hash to keep, for a racily clean regular file.
pub(super) fn racy_hash(path: &Path, p: &Probe) -> Option<ContentHash> {
    if p.racy && p.is_file {
        content_hash(path, p.size)
    } else {
        None
    }
}

/// Whether the path behind `row` changed, now that it probes as `now`.
pub(super) fn differs(table: &Table, row: &Row, now: &Probe, path: &Path) -> bool {
    let hashed = table.hash(row);
    if row.fp == now.fp {
        // Same metadata: unchanged, unless the row was racily clean and the content moved
        // within the timestamp's resolution.
        return hashed.is_some_and(|h| content_hash(path, now.size) != Some(h));
    }
    if row.fp == ABSENT || !now.exists() {
        return true;
    }
    // Metadata moved: a content hash from before can still show a rewrite of the same bytes.
    match hashed {
        Some(h) if now.is_file && now.size == u64::from(row.size) => {
            content_hash(path, now.size) != Some(h)
        }
        _ => true,
    }
}

// ---------------------------------------------------------------------------------------------
// The coarse view: ignored paths.

/// One fingerprint per ignored root (named for the first [`COARSE_ROOTS`]), one for the rest.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Coarse {
    pub(super) roots: Vec<(Box<[u8]>, u64)>,
    /// How many roots past the named ones, and their combined fingerprint.
    pub(super) rest: (usize, u64),
}

impl Coarse {
    /// Fingerprints of `roots` (paths relative to `base`, in a stable order), visiting at most
    /// [`COARSE_BUDGET`] entries below them.
    pub(super) fn of(base: &Path, roots: impl IntoIterator<Item = Vec<u8>>) -> Coarse {
        let mut budget = COARSE_BUDGET;
        let mut c = Coarse::default();
        for root in roots {
            let fp = coarse_fp(&base.join(OsStr::from_bytes(&root)), &mut budget);
            if c.roots.len() < COARSE_ROOTS {
                c.roots.push((root.into_boxed_slice(), fp));
            } else {
                c.rest.0 += 1;
                c.rest.1 = c.rest.1.wrapping_mul(31).wrapping_add(fp);
            }
        }
        c
    }

    /// Lines naming the roots that differ between `self` (before) and `after`, by path.
    pub(super) fn diff(&self, after: &Coarse) -> Vec<String> {
        let before: BTreeMap<&[u8], u64> = self.roots.iter().map(|(n, f)| (&n[..], *f)).collect();
        let now: BTreeMap<&[u8], u64> = after.roots.iter().map(|(n, f)| (&n[..], *f)).collect();
        let names: std::collections::BTreeSet<&[u8]> =
            before.keys().chain(now.keys()).copied().collect();
        let mut out = Vec::new();
        for name in names {
            let what = match (before.get(name), now.get(name)) {
                (Some(a), Some(b)) if a != b => "changed",
                (Some(_), None) => "gone",
                (None, Some(_)) => "appeared",
                _ => continue,
            };
            out.push(format!(
                "ignored path {what}: {} (sizes or times differ; its files are not listed)",
                display_path(name)
            ));
        }
        if self.rest != after.rest {
            out.push(format!(
                "ignored paths changed beyond the first {COARSE_ROOTS} ({} then, {} now)",
                self.rest.0, after.rest.0
            ));
        }
        out
    }
}

/// A root's metadata, and for a directory the names and metadata of the entries below it,
/// combined order-independently (`read_dir` order is not sorted), within `budget`.
pub(super) fn coarse_fp(root: &Path, budget: &mut usize) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(root) else {
        return ABSENT;
    };
    let mut acc = fingerprint(&meta);
    if !meta.is_dir() {
        return acc;
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            if *budget == 0 {
                return acc;
            }
            *budget -= 1;
            let Ok(m) = e.metadata() else { continue };
            let mut h = std::hash::DefaultHasher::new();
            e.path().as_os_str().as_bytes().hash(&mut h);
            fingerprint(&m).hash(&mut h);
            acc = acc.wrapping_add(h.finish());
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    acc
}

// ---------------------------------------------------------------------------------------------
// Changes: a bounded collector, rendered at the end.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Added,
    /// Seen only after a walk that was capped before: new, or missed by the first walk.
    AddedOrChanged,
    Modified,
    Deleted,
    /// Dirty before, clean now (git).
    Reverted,
}

#[derive(Debug)]
pub(super) struct Change {
    pub(super) kind: Kind,
    /// Tracked by git (its lines are counted against HEAD).
    pub(super) tracked: bool,
    pub(super) size_before: u64,
    pub(super) size_after: u64,
}

/// The first `max` entries by path, and how many were added in all: memory O(`max`)
/// however many paths changed.
#[derive(Debug)]
pub(super) struct Bounded<V> {
    pub(super) kept: BTreeMap<Vec<u8>, V>,
    pub(super) max: usize,
    pub(super) total: usize,
}

/// The changes of the fine view.
pub(super) type Changes = Bounded<Change>;

impl<V> Bounded<V> {
    pub(super) fn new(max: usize) -> Bounded<V> {
        Bounded {
            kept: BTreeMap::new(),
            max,
            total: 0,
        }
    }

    pub(super) fn add(&mut self, path: impl AsRef<[u8]> + Into<Vec<u8>>, v: V) {
        self.total += 1;
        if self.kept.len() < self.max {
            self.kept.insert(path.into(), v);
        } else if self
            .kept
            .last_key_value()
            .is_some_and(|(last, _)| path.as_ref() < &last[..])
        {
            self.kept.pop_last();
            self.kept.insert(path.into(), v);
        }
    }
}

/// What a `git status` listing says now, against the rows from before, gathered while git
/// prints it: one byte of [`Listed::rows`] per before row (0: not listed now, else the
/// `LISTED_*` flags of its status code), the first `max` listed paths that have no row (by
/// path; the rest are counted), and the ignored roots. O(rows + `max`) whatever the length of
/// the listing: neither the listing nor the paths of every new file are held.
#[derive(Debug)]
pub(super) struct Listed {
    pub(super) rows: Vec<u8>,
    pub(super) new: Bounded<u8>,
    pub(super) ignored: Vec<Vec<u8>>,
}

/// Listed now (any status code).
pub(super) const LISTED: u8 = 1;
/// Tracked by git (the code is not `??`).
pub(super) const LISTED_TRACKED: u8 = 2;
/// The code says deleted.
pub(super) const LISTED_DELETED: u8 = 4;
/// The code says added to the index.
pub(super) const LISTED_ADDED: u8 = 8;

impl Listed {
    pub(super) fn new(rows: usize, max: usize) -> Listed {
        Listed {
            rows: vec![0; rows],
            new: Bounded::new(max),
            ignored: Vec::new(),
        }
    }

    /// One entry of the listing, looked up in the rows of `table`.
    pub(super) fn add(&mut self, table: &Table, e: StatusEntry) {
        if e.code == *b"!!" {
            self.ignored.push(e.path);
            return;
        }
        let mut flags = LISTED;
        if e.code != *b"??" {
            flags |= LISTED_TRACKED;
        }
        if e.code.contains(&b'D') {
            flags |= LISTED_DELETED;
        }
        if e.code.contains(&b'A') {
            flags |= LISTED_ADDED;
        }
        match table.find(&e.path) {
            Some(i) => self.rows[i] = flags,
            None => self.new.add(e.path, flags),
        }
    }
}

/// A tiny bit set over the before rows: which ones were found again.
pub(super) struct Seen(Vec<u64>);

impl Seen {
    pub(super) fn new(n: usize) -> Seen {
        Seen(vec![0; n.div_ceil(64)])
    }
    pub(super) fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    pub(super) fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
}
