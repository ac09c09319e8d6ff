//! The push scan: before the daemon pushes a task's work, what the push would send is
//! searched for every credential the daemon knows (in every spelling [`super::forms`]
//! lists) and for a short list of high-confidence credential shapes ([`PATTERNS`]). A hit
//! refuses the publication (see `git::secrets`).
//!
//! It reads streams as they arrive: raw git objects ([`Scanner::begin_object`]: every line
//! of a blob, a commit or a tag, every entry name of a tree), text ([`Scanner::begin_text`])
//! or `git diff -U0` output ([`Scanner::begin_diff`]: the added lines and their paths). The
//! bytes are gathered into blocks of [`BLOCK`] bytes that one multi-literal search and one
//! pattern search go over; a line longer than a block is cut with an overlap, so a secret
//! straddling the cut is still seen whole. Memory stays at one block, whatever the size of
//! the change; time is one pass over the bytes.
//!
//! What it cannot see: a secret split over two lines, compressed or encrypted, or spelled
//! in an encoding not listed (see SECURITY.md).

use std::collections::{HashMap, HashSet};

use regex::bytes::{Regex, RegexBuilder};

use super::forms::{forms, Encoding};
use super::known::Credential;

/// Added bytes gathered before one search: large enough that the per-search cost vanishes,
/// small enough to stay in cache.
pub const BLOCK: usize = 256 * 1024;

/// The least overlap kept between two blocks of one long line (more when a needle is longer).
const MIN_OVERLAP: usize = 512;

/// Most findings reported; the rest are counted.
const MAX_FINDINGS: usize = 20;

/// Longest header line kept (a path is at most 4 KiB on Linux).
const MAX_HEADER: usize = 64 * 1024;

/// High-confidence credential shapes: each has a fixed prefix no ordinary text carries, so a
/// hit is a credential (or a fixture of one, which `[publish] allow_secrets_in` lets
/// through). Kept short on purpose: a noisy list gets switched off.
pub const PATTERNS: &[(&str, &str)] = &[
    (
        "a private key block",
        r"-----BEGIN[ A-Z0-9]{0,20}PRIVATE KEY(?: BLOCK)?-----",
    ),
    ("an AWS access key ID", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    ("a GitHub token", r"\bgh[pousr]_[A-Za-z0-9]{36}\b"),
    ("a GitHub token", r"\bgithub_pat_[A-Za-z0-9_]{82}\b"),
    ("a GitLab token", r"\bglpat-[A-Za-z0-9_-]{20,}"),
    ("a Slack token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    (
        "an Anthropic key",
        r"\bsk-ant-[a-z]{3,5}[0-9]{2}-[A-Za-z0-9_-]{32,}",
    ),
    (
        "an OpenAI key",
        r"\bsk-[A-Za-z0-9_-]{10,}T3BlbkFJ[A-Za-z0-9_-]{10,}",
    ),
];

/// One thing found: where, and what (never the value: a credential in the path itself is
/// shown as `[REDACTED]`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// The file the line is in, or the object (`(commit …)`, `(names in dir/)`, …).
    pub path: String,
    /// Its line in the file or object (a tree's entry number); 0 for a diff's path itself.
    pub line: u64,
    /// What it is: the credential's source and spelling, or the pattern's name.
    pub what: String,
}

/// What a scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// The first [`MAX_FINDINGS`] findings.
    pub findings: Vec<Finding>,
    /// Findings past those.
    pub more: u64,
    /// Pattern hits in paths the operator allows (`[publish] allow_secrets_in`).
    pub allowed: u64,
    /// Added bytes searched.
    pub bytes: u64,
}

/// What to search for: built once per publication from the task's credentials.
#[derive(Debug)]
pub struct Rules {
    known: Option<Regex>,
    /// Needle → (credential, spelling).
    lookup: HashMap<Vec<u8>, (usize, Encoding)>,
    sources: Vec<String>,
    patterns: Regex,
    each: Vec<(&'static str, Regex)>,
    allow: globset::GlobSet,
    overlap: usize,
}

/// Why [`Rules::new`] could not build its searches.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The credentials' forms make one search larger than its bound.
    #[error("too many credentials to search for at once: {0}")]
    TooManyCredentials(regex::Error),
    /// A built-in pattern does not compile (a defect of this build, not of the config).
    #[error("a built-in secret pattern does not compile: {0}")]
    Pattern(regex::Error),
}

impl Rules {
    /// Rules for `credentials` and [`PATTERNS`]; pattern hits under a path `allow` matches
    /// are let through (a credential the daemon knows never is).
    pub fn new(credentials: &[Credential], allow: globset::GlobSet) -> Result<Rules, RulesError> {
        let mut lookup = HashMap::new();
        let mut needles: Vec<Vec<u8>> = Vec::new();
        for (i, c) in credentials.iter().enumerate() {
            for (n, e) in forms(&c.value) {
                let n = n.into_bytes();
                if !lookup.contains_key(&n) {
                    lookup.insert(n.clone(), (i, e));
                    needles.push(n);
                }
            }
        }
        // Longest first: a verbatim secret is named as such, not as a base64 core inside it.
        needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        let longest = needles.first().map_or(0, Vec::len);
        let known = if needles.is_empty() {
            None
        } else {
            let alternation = needles
                .iter()
                .map(|n| regex::escape(&String::from_utf8_lossy(n)))
                .collect::<Vec<_>>()
                .join("|");
            Some(
                RegexBuilder::new(&alternation)
                    .size_limit(64 << 20)
                    .build()
                    .map_err(RulesError::TooManyCredentials)?,
            )
        };
        let build = |p: &str| {
            RegexBuilder::new(p)
                .unicode(false)
                .build()
                .map_err(RulesError::Pattern)
        };
        let all = PATTERNS
            .iter()
            .map(|(_, p)| format!("(?:{p})"))
            .collect::<Vec<_>>()
            .join("|");
        Ok(Rules {
            known,
            lookup,
            sources: credentials.iter().map(|c| c.source.clone()).collect(),
            patterns: build(&all)?,
            each: PATTERNS
                .iter()
                .map(|(name, p)| Ok((*name, build(p)?)))
                .collect::<Result<_, RulesError>>()?,
            allow,
            overlap: longest.max(MIN_OVERLAP),
        })
    }
}

/// Where a piece of a block came from: a line of a file.
#[derive(Debug, Clone, Copy)]
struct Seg {
    at: usize,
    file: usize,
    line: u64,
}

/// What the line being read is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Outside a hunk: kept whole and read at its end (`diff --git`, `+++ b/path`, `@@`).
    Header,
    /// An added line (or a line of text): searched.
    Added,
    /// A removed or context line: not searched.
    Skip,
}

/// Files (or objects) kept for the segments of a block before the unreferenced ones are
/// dropped: an object stream names one per object.
const MAX_FILES: usize = 4096;

/// A file (or object) a block's bytes come from: how it is reported, and whether a pattern
/// hit in it may be let through by `[publish] allow_secrets_in` (a file's path, never a
/// commit, a tag or a tree's names).
#[derive(Debug, Clone)]
struct Source {
    label: String,
    allowable: bool,
}

/// The scan of one publication's streams: feed each stream's bytes after `begin_diff`,
/// `begin_text` or `begin_object`, then [`Scanner::finish`].
#[derive(Debug)]
pub struct Scanner<'r> {
    rules: &'r Rules,
    text_mode: bool,
    files: Vec<Source>,
    file: usize,
    at_line_start: bool,
    kind: Kind,
    header: Vec<u8>,
    /// Lines still to come in the current hunk (old side, new side).
    hunk: Option<(u64, u64)>,
    new_line: u64,
    block: Vec<u8>,
    segs: Vec<Seg>,
    /// Bytes at the start of `block` already searched (the overlap of a cut line).
    carried: usize,
    seen: HashSet<(String, u64, String)>,
    report: Report,
}

impl<'r> Scanner<'r> {
    /// A scan with `rules`.
    pub fn new(rules: &'r Rules) -> Scanner<'r> {
        Scanner {
            rules,
            text_mode: false,
            files: vec![Source {
                label: "(unknown path)".into(),
                allowable: false,
            }],
            file: 0,
            at_line_start: true,
            kind: Kind::Skip,
            header: Vec::new(),
            hunk: None,
            new_line: 0,
            block: Vec::with_capacity(BLOCK + MIN_OVERLAP),
            segs: Vec::new(),
            carried: 0,
            seen: HashSet::new(),
            report: Report::default(),
        }
    }

    /// The next bytes are `git diff`/`git log -p` output (`-U0`, prefixes `a/` and `b/`).
    pub fn begin_diff(&mut self) {
        self.end_stream();
        self.text_mode = false;
        self.file = 0;
    }

    /// The next bytes are text searched whole, every line (commit messages), reported as
    /// `label`.
    pub fn begin_text(&mut self, label: &str) {
        self.end_stream();
        self.text_mode = true;
        self.files.push(Source {
            label: label.to_string(),
            allowable: false,
        });
        self.file = self.files.len() - 1;
        self.new_line = 0;
    }

    /// The next bytes are one raw object, every line searched, reported as `label` (a pattern
    /// hit let through when `allowable` and the operator allows `label` as a path). Unlike
    /// [`Scanner::begin_text`] the block is not searched yet: many small objects share one
    /// search, a line break keeping each apart.
    pub fn begin_object(&mut self, label: String, allowable: bool) {
        if self.block.last().is_some_and(|b| *b != b'\n') {
            self.push(b"\n");
        }
        self.text_mode = true;
        self.at_line_start = true;
        self.hunk = None;
        self.files.push(Source { label, allowable });
        self.file = self.files.len() - 1;
        self.new_line = 0;
    }

    /// One entry of a tree, numbered `n`, whose name is fed next with
    /// [`Scanner::entry_bytes`] (a name may hold any byte but NUL, a line break too).
    pub fn entry_start(&mut self, n: u64) {
        self.mark(self.file, n);
    }

    /// The next bytes of the entry name begun with [`Scanner::entry_start`].
    pub fn entry_bytes(&mut self, bytes: &[u8]) {
        self.push(bytes);
    }

    /// The end of the entry name begun with [`Scanner::entry_start`].
    pub fn entry_end(&mut self) {
        self.push(b"\n");
    }

    /// Search `bytes`, the next piece of the current stream.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.at_line_start {
                bytes = self.start_line(bytes);
                self.at_line_start = false;
                if bytes.is_empty() {
                    break;
                }
            }
            let (piece, ended, rest) = match memchr(b'\n', bytes) {
                Some(i) => (&bytes[..i], true, &bytes[i + 1..]),
                None => (bytes, false, &bytes[bytes.len()..]),
            };
            match self.kind {
                Kind::Added => self.push(piece),
                Kind::Header => {
                    let room = MAX_HEADER.saturating_sub(self.header.len());
                    self.header
                        .extend_from_slice(&piece[..piece.len().min(room)]);
                }
                Kind::Skip => {}
            }
            if ended {
                self.end_line();
            }
            bytes = rest;
        }
    }

    /// Decide what the line starting with `bytes` is; returns what follows its marker.
    fn start_line<'b>(&mut self, bytes: &'b [u8]) -> &'b [u8] {
        if self.text_mode {
            self.new_line += 1;
            self.kind = Kind::Added;
            self.mark(self.file, self.new_line);
            return bytes;
        }
        let Some((old, new)) = self.hunk else {
            self.kind = Kind::Header;
            return bytes;
        };
        let (kind, old, new) = match bytes[0] {
            b'+' => (Kind::Added, old, new.saturating_sub(1)),
            b'-' => (Kind::Skip, old.saturating_sub(1), new),
            b' ' => (Kind::Skip, old.saturating_sub(1), new.saturating_sub(1)),
            b'\\' => (Kind::Skip, old, new),
            _ => {
                self.hunk = None;
                self.kind = Kind::Header;
                return bytes;
            }
        };
        self.kind = kind;
        self.hunk = (old > 0 || new > 0).then_some((old, new));
        if bytes[0] != b'-' && bytes[0] != b'\\' {
            self.new_line += 1;
        }
        if kind == Kind::Added {
            self.mark(self.file, self.new_line - 1);
        }
        &bytes[1..]
    }

    fn end_line(&mut self) {
        match self.kind {
            Kind::Added => self.push(b"\n"),
            Kind::Header => {
                let h = std::mem::take(&mut self.header);
                self.read_header(&h);
                self.header = h;
                self.header.clear();
            }
            Kind::Skip => {}
        }
        self.at_line_start = true;
    }

    /// A header line: a new file (`diff --git`), its path (`+++ b/…`, searched too), a hunk.
    fn read_header(&mut self, h: &[u8]) {
        if h.starts_with(b"diff --git ") {
            self.file = 0;
            self.hunk = None;
        } else if let Some(p) = h.strip_prefix(b"+++ ") {
            let p = p.strip_suffix(b"\t").unwrap_or(p);
            if p == b"/dev/null" {
                self.file = 0;
                return;
            }
            let path = unquote(p);
            let path = path.strip_prefix(b"b/").unwrap_or(&path).to_vec();
            self.files.push(Source {
                label: String::from_utf8_lossy(&path).into_owned(),
                allowable: true,
            });
            self.file = self.files.len() - 1;
            self.mark(self.file, 0);
            self.push(&path);
            self.push(b"\n");
        } else if h.starts_with(b"@@ ") {
            if let Some((old, start, new)) = hunk_header(h) {
                self.hunk = (old > 0 || new > 0).then_some((old, new));
                self.new_line = start;
            }
        }
    }

    fn mark(&mut self, file: usize, line: u64) {
        self.segs.push(Seg {
            at: self.block.len(),
            file,
            line,
        });
    }

    fn push(&mut self, bytes: &[u8]) {
        self.report.bytes += bytes.len() as u64;
        let mut bytes = bytes;
        while !bytes.is_empty() {
            let room = (BLOCK + self.carried)
                .saturating_sub(self.block.len())
                .max(1);
            let n = room.min(bytes.len());
            self.block.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.block.len() >= BLOCK + self.carried {
                self.search();
                self.carry();
            }
        }
    }

    /// Keep the block's last `overlap` bytes (already searched) for the next search.
    fn carry(&mut self) {
        let cut = self.block.len().saturating_sub(self.rules.overlap);
        self.block.drain(..cut);
        self.carried = self.block.len();
        let first = self.segs.partition_point(|s| s.at <= cut).saturating_sub(1);
        self.segs.drain(..first);
        for s in &mut self.segs {
            s.at = s.at.saturating_sub(cut);
        }
        self.compact_files();
    }

    /// Drop the files no segment of the block names any more (an object stream names one
    /// per object): memory stays bounded by a block, not by the number of objects.
    fn compact_files(&mut self) {
        if self.files.len() <= MAX_FILES {
            return;
        }
        let mut keep: Vec<usize> = self.segs.iter().map(|s| s.file).collect();
        keep.push(0);
        keep.push(self.file);
        keep.sort_unstable();
        keep.dedup();
        let files = keep.iter().map(|&i| self.files[i].clone()).collect();
        let at = |i: usize| keep.binary_search(&i).unwrap_or(0);
        for s in &mut self.segs {
            s.file = at(s.file);
        }
        self.file = at(self.file);
        self.files = files;
    }

    fn end_stream(&mut self) {
        if self.block.len() > self.carried {
            self.search();
        }
        self.block.clear();
        self.segs.clear();
        self.carried = 0;
        self.at_line_start = true;
        self.hunk = None;
        self.header.clear();
    }

    /// Search the block; hits wholly inside the carried overlap were reported before.
    fn search(&mut self) {
        let rules = self.rules;
        let mut hits: Vec<(usize, String, bool)> = Vec::new();
        if let Some(known) = &rules.known {
            for m in known.find_iter(&self.block) {
                if m.end() <= self.carried {
                    continue;
                }
                if let Some((i, enc)) = rules.lookup.get(m.as_bytes()) {
                    let what = format!("{} ({})", rules.sources[*i], enc.describe());
                    hits.push((m.start(), what, false));
                }
            }
        }
        for m in rules.patterns.find_iter(&self.block) {
            if m.end() <= self.carried {
                continue;
            }
            let name = rules
                .each
                .iter()
                .find(|(_, re)| re.is_match(m.as_bytes()))
                .map_or("a credential", |(n, _)| *n);
            hits.push((m.start(), name.to_string(), true));
        }
        for (at, what, allowable) in hits {
            let seg = self.segs[self.segs.partition_point(|s| s.at <= at).saturating_sub(1)];
            self.found(seg, what, allowable);
        }
    }

    fn found(&mut self, seg: Seg, what: String, allowable: bool) {
        let source = &self.files[seg.file];
        if allowable && source.allowable && self.rules.allow.is_match(&source.label) {
            self.report.allowed += 1;
            return;
        }
        let path = shown(self.rules, &source.label);
        if !self.seen.insert((path.clone(), seg.line, what.clone())) {
            return;
        }
        if self.report.findings.len() < MAX_FINDINGS {
            self.report.findings.push(Finding {
                path,
                line: seg.line,
                what,
            });
        } else {
            self.report.more += 1;
        }
    }

    /// End the last stream; what was found.
    pub fn finish(mut self) -> Report {
        self.end_stream();
        self.report
    }
}

/// `label` as a finding shows it: whatever in it is a credential (a file or directory
/// named after one) replaced, so the refusal never carries the value.
fn shown(rules: &Rules, label: &str) -> String {
    let mut out = label.as_bytes().to_vec();
    if let Some(known) = &rules.known {
        out = known.replace_all(&out, &b"[REDACTED]"[..]).into_owned();
    }
    out = rules
        .patterns
        .replace_all(&out, &b"[REDACTED]"[..])
        .into_owned();
    String::from_utf8_lossy(&out).into_owned()
}

/// `@@ -a[,b] +c[,d] @@` → (b, c, d); a missing count is 1.
fn hunk_header(h: &[u8]) -> Option<(u64, u64, u64)> {
    let s = std::str::from_utf8(h).ok()?;
    let mut parts = s.split(' ');
    parts.next()?;
    let range = |p: &str| -> Option<(u64, u64)> {
        let (start, count) = p.split_once(',').unwrap_or((p, "1"));
        Some((start.parse().ok()?, count.parse().ok()?))
    };
    let (_, old) = range(parts.next()?.strip_prefix('-')?)?;
    let (start, new) = range(parts.next()?.strip_prefix('+')?)?;
    Some((old, start, new))
}

/// A path as git quotes one with unusual bytes (`"b/a\tb"`, octal escapes), unquoted.
fn unquote(p: &[u8]) -> Vec<u8> {
    let Some(inner) = p.strip_prefix(b"\"").and_then(|p| p.strip_suffix(b"\"")) else {
        return p.to_vec();
    };
    let mut out = Vec::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        let c = inner[i];
        i += 1;
        if c != b'\\' || i >= inner.len() {
            out.push(c);
            continue;
        }
        let e = inner[i];
        i += 1;
        out.push(match e {
            b'n' => b'\n',
            b't' => b'\t',
            b'r' => b'\r',
            b'a' => 7,
            b'b' => 8,
            b'f' => 12,
            b'v' => 11,
            // Three octal digits, as git writes them; anything else is kept as it is (a
            // digit past `7` or a byte below `0` made the arithmetic overflow: a panic in a
            // build with overflow checks).
            b'0'..=b'3'
                if inner
                    .get(i..i + 2)
                    .is_some_and(|d| d.iter().all(|c| (b'0'..=b'7').contains(c))) =>
            {
                let oct = &inner[i - 1..i + 2];
                i += 2;
                oct.iter()
                    .fold(0u8, |a, d| a.wrapping_mul(8).wrapping_add(d - b'0'))
            }
            other => other,
        });
    }
    out
}

fn memchr(b: u8, s: &[u8]) -> Option<usize> {
    s.iter().position(|&c| c == b)
}

#[cfg(test)]
#[path = "scan_tests.rs"]
mod tests;
