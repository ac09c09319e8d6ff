//! The state journal on disk: one file of JSON lines, each line one change, appended and
//! `fdatasync`ed before the caller is told the change is durable.
//!
//! Layout of the file:
//! ```text
//! {"op":"header","version":2}                     first line, always
//! {"op":"active","active":{…} | null}              the active task changed
//! {"op":"push","seq":7,"entry":{…}}                a terminal frame entered the outbox
//! {"op":"remove","seq":7}                          it left the outbox (acknowledged, dropped)
//! ```
//! A change costs one `write` and one `fdatasync`, whatever the size of the state. Removing
//! an outbox entry is written but not synced on its own (the next synced change carries it):
//! losing it to a power cut only means the result is sent again, which the hub answers as a
//! duplicate; a process crash loses nothing written. When dead
//! lines outweigh live ones the file is compacted: the live lines are copied (byte for byte,
//! never re-serialized) into a temp file that is fsynced and renamed over the journal, so the
//! copy work is amortised O(1) per change.
//!
//! Outbox frames are not kept in memory: the journal remembers where each live `push` line
//! is and reads it back when the frame is sent, so a backlog of large results costs disk, not
//! RAM. A change that could not be written stays in memory (and is sent from there); the next
//! successful write rewrites the whole file, so nothing that was in memory is lost once the
//! disk works again.
//!
//! Reading back: a last line that is incomplete or does not parse is a torn write (a crash in
//! the middle of an append): it is copied to `<file>.torn-<ms>`, cut off, and reported. A bad
//! line anywhere else, or a first line that is no header, means the file is corrupt: it is
//! moved to `<file>.corrupt-<ms>` and reported. The single-document `queue.json` of version 1
//! is still read and rewritten as a journal.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{ActiveTask, OutboxEntry, OutboxMeta, PersistedState, STATE_VERSION};

/// Compact when the file is this much larger than its live lines (and at least
/// [`COMPACT_MIN_DEAD`] bytes are dead), so copying stays amortised O(1) per change. Four,
/// not two: draining a large backlog then copies ~1/3 of it in total instead of all of it.
const COMPACT_RATIO: u64 = 4;
const COMPACT_MIN_DEAD: u64 = 64 * 1024;

/// One line of the journal, as written.
#[derive(Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum RecordOut<'a> {
    Header { version: u32 },
    Active { active: &'a Option<ActiveTask> },
    Push { seq: u64, entry: &'a OutboxEntry },
    Remove { seq: u64 },
}

/// One line of the journal, as read at start: the outbox frames are skipped, not parsed
/// into memory.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum RecordIn {
    Header { version: u32 },
    Active { active: Option<Box<ActiveTask>> },
    Push { seq: u64, entry: EntryHead },
    Remove { seq: u64 },
}

#[derive(Deserialize)]
struct EntryHead {
    task_id: String,
    created_at: i64,
    #[allow(dead_code)] // present on every line; skipped without building it
    frame: serde::de::IgnoredAny,
}

/// A push line read in full (to send its frame).
#[derive(Deserialize)]
struct PushFull {
    entry: OutboxEntry,
}

/// Where a live outbox entry's line is.
#[derive(Debug, Clone)]
enum Loc {
    /// `len` bytes (newline included) at `offset` of the open file.
    Disk { offset: u64, len: u64 },
    /// Not on disk (the write failed): the serialized line, kept until a rewrite succeeds.
    Mem(Arc<Vec<u8>>),
}

/// What loading found besides the state.
#[derive(Debug, Default)]
pub(super) struct LoadReport {
    pub corrupt: Option<(PathBuf, String)>,
    pub torn: Option<(PathBuf, u64)>,
    pub upgraded: bool,
}

/// The open journal and the in-memory index of what is live in it.
#[derive(Debug)]
pub(super) struct Journal {
    path: PathBuf,
    /// Open for read and write; `None` until the file exists.
    file: Option<File>,
    /// (device, inode) of `file`: a journal replaced or deleted under us is noticed.
    id: Option<(u64, u64)>,
    /// End of the file: where the next line goes.
    end: u64,
    /// Bytes of the lines that make up the current state.
    live: u64,
    /// A write failed or the file is gone: the next change rewrites the whole file.
    needs_rewrite: bool,
    active: Option<ActiveTask>,
    active_len: u64,
    outbox: BTreeMap<u64, (OutboxMeta, Loc)>,
    next_seq: u64,
}

fn line<T: Serialize>(rec: &T) -> Vec<u8> {
    let mut v = serde_json::to_vec(rec).expect("state records always serialize");
    v.push(b'\n');
    v
}

fn aside_path(path: &Path, what: &str) -> PathBuf {
    PathBuf::from(format!(
        "{}.{what}-{}",
        path.display(),
        crate::util::now_ms()
    ))
}

fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    (m.dev(), m.ino())
}

impl Journal {
    pub(super) fn empty(path: PathBuf) -> Journal {
        let header_len = line(&RecordOut::Header {
            version: STATE_VERSION,
        })
        .len() as u64;
        let active_len = line(&RecordOut::Active { active: &None }).len() as u64;
        Journal {
            path,
            file: None,
            id: None,
            end: 0,
            live: header_len + active_len,
            needs_rewrite: true,
            active: None,
            active_len,
            outbox: BTreeMap::new(),
            next_seq: 1,
        }
    }

    pub(super) fn active(&self) -> Option<&ActiveTask> {
        self.active.as_ref()
    }

    pub(super) fn outbox(&self) -> Vec<OutboxMeta> {
        self.outbox.values().map(|(m, _)| m.clone()).collect()
    }

    /// Open and replay the journal at `path`. A missing file (or one that cannot exist, such
    /// as a path under a regular file) is an empty state; only other read errors fail.
    pub(super) fn load(path: PathBuf) -> std::io::Result<(Journal, LoadReport)> {
        let mut j = Journal::empty(path);
        let mut report = LoadReport::default();
        let file = match OpenOptions::new().read(true).write(true).open(&j.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((j, report)),
            // ENOTDIR / EISDIR: no state can be there. Start empty; the first write fails and
            // the daemon refuses tasks with `state_not_persistable` instead of not running.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::EISDIR)) => {
                return Ok((j, report))
            }
            Err(e) => return Err(e),
        };
        match j.replay(&file)? {
            Replay::Ok {
                good_len,
                total_len,
            } => {
                j.id = Some(file_id(&file.metadata()?));
                j.end = good_len;
                j.file = Some(file);
                // An empty file has no header yet: the first change writes the whole file.
                j.needs_rewrite = good_len == 0;
                if good_len < total_len {
                    let torn = j.keep_torn_tail(good_len, total_len)?;
                    report.torn = Some((torn, total_len - good_len));
                }
            }
            Replay::Legacy(state) => {
                j.adopt(*state);
                j.file = Some(file);
                // If the rewrite fails the state is still held in memory and the next change
                // tries again; the daemon then refuses tasks as with any write failure.
                report.upgraded = j.rewrite().is_ok();
            }
            Replay::Corrupt(error) => {
                drop(file);
                let aside = aside_path(&j.path, "corrupt");
                std::fs::rename(&j.path, &aside)?;
                report.corrupt = Some((aside, error));
                j = Journal::empty(j.path);
            }
        }
        Ok((j, report))
    }

    /// Read every line; fill the index. Stops at the first line that is not a complete,
    /// parseable record.
    fn replay(&mut self, file: &File) -> std::io::Result<Replay> {
        let total_len = file.metadata()?.len();
        let mut r = BufReader::with_capacity(64 * 1024, file);
        let mut buf = Vec::new();
        let mut offset = 0u64;
        let mut first = true;
        loop {
            buf.clear();
            let n = r.read_until(b'\n', &mut buf)? as u64;
            if n == 0 {
                self.recount();
                return Ok(Replay::Ok {
                    good_len: offset,
                    total_len,
                });
            }
            let complete = buf.last() == Some(&b'\n');
            let rec = if complete {
                serde_json::from_slice::<RecordIn>(&buf).map_err(|e| e.to_string())
            } else {
                Err("line not terminated".to_string())
            };
            let rec = match rec {
                Ok(rec) => rec,
                Err(e) if first => {
                    // Version 1 wrote one pretty-printed document; anything else is corrupt.
                    let mut all = Vec::new();
                    let mut f = file;
                    std::io::Seek::rewind(&mut f)?;
                    f.read_to_end(&mut all)?;
                    return Ok(match serde_json::from_slice::<PersistedState>(&all) {
                        Ok(state) => Replay::Legacy(Box::new(state)),
                        Err(_) => {
                            Replay::Corrupt(format!("first line is not a journal header: {e}"))
                        }
                    });
                }
                // The last line may be half-written by a crash: torn, not corrupt.
                Err(_) if offset + n == total_len => {
                    self.recount();
                    return Ok(Replay::Ok {
                        good_len: offset,
                        total_len,
                    });
                }
                Err(e) => {
                    return Ok(Replay::Corrupt(format!(
                        "bad line at byte {offset} with more lines after it: {e}"
                    )))
                }
            };
            match rec {
                RecordIn::Header { version } if first => {
                    if version != STATE_VERSION {
                        return Ok(Replay::Corrupt(format!(
                            "journal version {version}, this build reads {STATE_VERSION}"
                        )));
                    }
                }
                _ if first => {
                    return Ok(Replay::Corrupt("first line is not a journal header".into()))
                }
                RecordIn::Header { .. } => {
                    return Ok(Replay::Corrupt(format!("second header at byte {offset}")))
                }
                RecordIn::Active { active } => {
                    self.active = active.map(|a| *a);
                    self.active_len = n;
                }
                RecordIn::Push { seq, entry } => {
                    self.outbox.insert(
                        seq,
                        (
                            OutboxMeta {
                                seq,
                                task_id: entry.task_id,
                                created_at: entry.created_at,
                            },
                            Loc::Disk { offset, len: n },
                        ),
                    );
                    self.next_seq = self.next_seq.max(seq + 1);
                }
                RecordIn::Remove { seq } => {
                    self.outbox.remove(&seq);
                }
            }
            first = false;
            offset += n;
        }
    }

    /// Bytes of the live lines as a rewrite would write them.
    fn recount(&mut self) {
        let header = line(&RecordOut::Header {
            version: STATE_VERSION,
        })
        .len() as u64;
        let pushes: u64 = self
            .outbox
            .values()
            .map(|(_, loc)| match loc {
                Loc::Disk { len, .. } => *len,
                Loc::Mem(b) => b.len() as u64,
            })
            .sum();
        self.live = header + self.active_len + pushes;
    }

    /// Copy the bytes after `good_len` to a `.torn-<ms>` file, then cut them off.
    fn keep_torn_tail(&mut self, good_len: u64, total_len: u64) -> std::io::Result<PathBuf> {
        let file = self.file.as_ref().expect("opened before");
        let mut tail = vec![0u8; (total_len - good_len) as usize];
        file.read_exact_at(&mut tail, good_len)?;
        let aside = aside_path(&self.path, "torn");
        let mut out = File::create(&aside)?;
        out.write_all(&tail)?;
        out.sync_all()?;
        file.set_len(good_len)?;
        file.sync_all()?;
        Ok(aside)
    }

    /// Take a whole state (version 1 file, or [`super::StateStore::save`]) into memory.
    pub(super) fn adopt(&mut self, state: PersistedState) {
        self.active_len = line(&RecordOut::Active {
            active: &state.active,
        })
        .len() as u64;
        self.active = state.active;
        self.outbox.clear();
        for entry in state.outbox {
            self.insert_mem(entry);
        }
        self.needs_rewrite = true;
    }

    fn insert_mem(&mut self, entry: OutboxEntry) -> OutboxMeta {
        let seq = self.next_seq;
        self.next_seq += 1;
        let bytes = line(&RecordOut::Push { seq, entry: &entry });
        let meta = OutboxMeta {
            seq,
            task_id: entry.task_id,
            created_at: entry.created_at,
        };
        self.live += bytes.len() as u64;
        self.outbox
            .insert(seq, (meta.clone(), Loc::Mem(Arc::new(bytes))));
        meta
    }

    /// Record a new active task (or none). The in-memory state changes even if the write
    /// fails; the error says the change is not durable.
    pub(super) fn set_active(&mut self, active: Option<ActiveTask>) -> std::io::Result<()> {
        let bytes = line(&RecordOut::Active { active: &active });
        self.live = self.live - self.active_len + bytes.len() as u64;
        self.active_len = bytes.len() as u64;
        self.active = active;
        self.append(&bytes)
    }

    /// Add a terminal frame to the outbox.
    pub(super) fn push(
        &mut self,
        entry: OutboxEntry,
        active: Option<Option<ActiveTask>>,
    ) -> (OutboxMeta, std::io::Result<()>) {
        let meta = self.insert_mem(entry);
        let bytes = match &self.outbox[&meta.seq].1 {
            Loc::Mem(b) => b.clone(),
            Loc::Disk { .. } => unreachable!("just inserted in memory"),
        };
        let at = self.end;
        let res = match active {
            None => self.append(&bytes),
            Some(active) => {
                let tail = line(&RecordOut::Active { active: &active });
                self.live = self.live - self.active_len + tail.len() as u64;
                self.active_len = tail.len() as u64;
                self.active = active;
                self.append(&[&bytes[..], &tail[..]].concat())
            }
        };
        // Appended (not rewritten, which already placed it): it lives in the file now.
        if res.is_ok() {
            if let Some((_, loc @ Loc::Mem(_))) = self.outbox.get_mut(&meta.seq) {
                *loc = Loc::Disk {
                    offset: at,
                    len: bytes.len() as u64,
                };
            }
        }
        (meta, res)
    }

    /// Take entries out of the outbox.
    pub(super) fn remove(&mut self, seqs: &[u64]) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        for seq in seqs {
            if let Some((_, loc)) = self.outbox.remove(seq) {
                self.live -= match loc {
                    Loc::Disk { len, .. } => len,
                    Loc::Mem(b) => b.len() as u64,
                };
                bytes.extend(line(&RecordOut::Remove { seq: *seq }));
            }
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.append_with(&bytes, false)
    }

    /// The full entry of a live outbox item, read back from disk (or memory).
    pub(super) fn entry(&self, seq: u64) -> std::io::Result<Option<OutboxEntry>> {
        let Some((_, loc)) = self.outbox.get(&seq) else {
            return Ok(None);
        };
        let bytes = match loc {
            Loc::Mem(b) => return parse_push(b).map(Some),
            Loc::Disk { offset, len } => {
                let mut b = vec![0u8; *len as usize];
                self.file
                    .as_ref()
                    .expect("disk entries have a file")
                    .read_exact_at(&mut b, *offset)?;
                b
            }
        };
        parse_push(&bytes).map(Some)
    }

    /// Replace everything with `state` and rewrite the file.
    pub(super) fn replace(&mut self, state: PersistedState) -> std::io::Result<()> {
        self.adopt(state);
        self.rewrite()
    }

    /// Append `bytes` durably, or rewrite the whole file when that is due (a failed write
    /// earlier, the file deleted or replaced under us, or enough dead lines).
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.append_with(bytes, true)
    }

    /// [`Journal::append`]; `sync: false` leaves the `fdatasync` to the next synced change.
    fn append_with(&mut self, bytes: &[u8], sync: bool) -> std::io::Result<()> {
        if !self.needs_rewrite && !self.still_ours() {
            self.needs_rewrite = true;
        }
        if self.needs_rewrite {
            return self.rewrite();
        }
        let file = self.file.as_ref().expect("checked by still_ours");
        let res = file.write_all_at(bytes, self.end).and_then(|()| {
            if sync {
                file.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(e) = res {
            // What reached the file is unknown: the next change writes it all again.
            self.needs_rewrite = true;
            return Err(e);
        }
        self.end += bytes.len() as u64;
        if self.end > COMPACT_RATIO * self.live && self.end - self.live >= COMPACT_MIN_DEAD {
            // The append is durable already; a failed compaction only leaves a longer file.
            if let Err(e) = self.rewrite() {
                tracing::warn!(error = %e, file = %self.path.display(), "state journal compaction failed; will retry at the next change");
            }
        }
        Ok(())
    }

    /// Whether the path still names the file we have open.
    fn still_ours(&self) -> bool {
        match (&self.file, self.id) {
            (Some(_), Some(id)) => std::fs::metadata(&self.path)
                .map(|m| file_id(&m) == id)
                .unwrap_or(false),
            _ => false,
        }
    }

    /// Write the live state to a temp file (live outbox lines copied from the old file),
    /// fsync it, rename it over the journal, fsync the directory, and switch to it.
    fn rewrite(&mut self) -> std::io::Result<()> {
        let res = self.rewrite_inner();
        self.needs_rewrite = res.is_err();
        res
    }

    fn rewrite_inner(&mut self) -> std::io::Result<()> {
        let dir = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        std::fs::create_dir_all(&dir)?;
        let mut tmp_name = self.path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(".tmp");
        let tmp = dir.join(tmp_name);
        let mut out = std::io::BufWriter::with_capacity(
            256 * 1024,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?,
        );
        let mut pos = 0u64;
        let mut put = |out: &mut std::io::BufWriter<File>, b: &[u8]| -> std::io::Result<u64> {
            out.write_all(b)?;
            let at = pos;
            pos += b.len() as u64;
            Ok(at)
        };
        put(
            &mut out,
            &line(&RecordOut::Header {
                version: STATE_VERSION,
            }),
        )?;
        put(
            &mut out,
            &line(&RecordOut::Active {
                active: &self.active,
            }),
        )?;
        let mut moved = Vec::with_capacity(self.outbox.len());
        let mut buf = Vec::new();
        for (seq, (_, loc)) in &self.outbox {
            let bytes: &[u8] = match loc {
                Loc::Mem(b) => b,
                Loc::Disk { offset, len } => {
                    buf.resize(*len as usize, 0);
                    self.file
                        .as_ref()
                        .expect("disk entries have a file")
                        .read_exact_at(&mut buf, *offset)?;
                    &buf
                }
            };
            let len = bytes.len() as u64;
            let offset = put(&mut out, bytes)?;
            moved.push((*seq, offset, len));
        }
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        File::open(&dir)?.sync_all()?;
        for (seq, offset, len) in moved {
            if let Some((_, loc)) = self.outbox.get_mut(&seq) {
                *loc = Loc::Disk { offset, len };
            }
        }
        self.id = Some(file_id(&file.metadata()?));
        self.end = pos;
        self.live = pos;
        self.file = Some(file);
        Ok(())
    }

    /// The whole state with every frame (tests, tools; not the daemon's path).
    pub(super) fn to_state(&self) -> std::io::Result<PersistedState> {
        let mut outbox = Vec::with_capacity(self.outbox.len());
        for seq in self.outbox.keys() {
            outbox.extend(self.entry(*seq)?);
        }
        Ok(PersistedState {
            version: STATE_VERSION,
            active: self.active.clone(),
            outbox,
        })
    }
}

enum Replay {
    Ok { good_len: u64, total_len: u64 },
    Legacy(Box<PersistedState>),
    Corrupt(String),
}

fn parse_push(bytes: &[u8]) -> std::io::Result<OutboxEntry> {
    serde_json::from_slice::<PushFull>(bytes)
        .map(|p| p.entry)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Read the state at `path` without changing anything on disk (a torn tail is ignored, a
/// corrupt file is an error). For tests and inspection tools.
pub(super) fn read_only(path: &Path) -> std::io::Result<PersistedState> {
    let mut j = Journal::empty(path.to_path_buf());
    let file = File::open(path)?;
    match j.replay(&file)? {
        Replay::Ok { .. } => {
            j.file = Some(file);
            j.to_state()
        }
        Replay::Legacy(state) => Ok(*state),
        Replay::Corrupt(e) => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
    }
}
