//! Git objects as git stores them, fed to the push scan: the output of
//! `git cat-file --batch` read as it streams, each object handed to the
//! [`Scanner`] whole: a blob's bytes, a commit's or a tag's raw bytes (every header, the
//! message as stored, never re-encoded), and each entry name of a tree (the binary
//! `<mode> <name>\0<hash>` format, parsed here). Nothing is held but the current header.

use crate::redact::scan::Scanner;

/// The `cat-file --batch` format: `%(rest)` hands back what followed the object name on
/// the input line, the path `git rev-list --objects` gave it.
pub(super) const BATCH: &str = "--batch=%(objectname) %(objecttype) %(objectsize) %(rest)";

/// Longest header line kept: a path beyond it is cut in the label (the object is still
/// read whole).
const MAX_HEADER: usize = 8 * 1024;

/// Longest mode of a tree entry (git writes at most six digits).
const MAX_MODE: usize = 16;

/// Where the stream is.
#[derive(Debug)]
enum State {
    /// Reading `<oid> <type> <size> <rest>\n`.
    Header,
    /// Inside an object's `left` bytes of body.
    Body { left: u64, tree: Option<Tree> },
    /// The `\n` after a body.
    Trailer,
}

/// Where a tree's body is.
#[derive(Debug)]
struct Tree {
    hash_len: usize,
    entry: u64,
    part: Part,
}

#[derive(Debug)]
enum Part {
    Mode(usize),
    Name,
    Hash(usize),
}

/// A `cat-file --batch` stream being read into a scanner; [`ObjectStream::finish`] says
/// whether it was whole and well formed.
#[derive(Debug)]
pub(super) struct ObjectStream {
    state: State,
    header: Vec<u8>,
    objects: u64,
    error: Option<StreamError>,
}

/// Why a `cat-file --batch` stream cannot be trusted to be what is pushed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum StreamError {
    /// A header git could not answer with an object (`<oid> missing`, an ambiguous name).
    #[error(
        "git cat-file: `{0}`: not an object it could read (a missing object is never pushed unread)"
    )]
    Unreadable(String),
    #[error("git cat-file: object {short} of unknown type `{kind}`")]
    UnknownType { short: String, kind: String },
    #[error("a tree object ends inside an entry")]
    TreeCut,
    #[error("an object is not followed by a line break")]
    NoLineBreak,
    #[error("git cat-file's output ends inside an object")]
    Truncated,
}

impl ObjectStream {
    pub(super) fn new() -> ObjectStream {
        ObjectStream {
            state: State::Header,
            header: Vec::new(),
            objects: 0,
            error: None,
        }
    }

    /// Read the next `bytes` of the stream into `scanner`.
    pub(super) fn feed(&mut self, scanner: &mut Scanner<'_>, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.error.is_none() {
            bytes = match &mut self.state {
                State::Header => match bytes.iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        self.keep_header(&bytes[..i]);
                        let header = std::mem::take(&mut self.header);
                        self.begin(scanner, &header);
                        &bytes[i + 1..]
                    }
                    None => {
                        self.keep_header(bytes);
                        &[]
                    }
                },
                State::Body { left, tree } => {
                    let n = usize::try_from(*left).map_or(bytes.len(), |l| l.min(bytes.len()));
                    let (body, rest) = bytes.split_at(n);
                    match tree {
                        Some(t) => t.feed(scanner, body),
                        None => scanner.feed(body),
                    }
                    *left -= n as u64;
                    if *left == 0 {
                        if tree
                            .as_ref()
                            .is_some_and(|t| !matches!(t.part, Part::Mode(0)))
                        {
                            self.error = Some(StreamError::TreeCut);
                        }
                        self.state = State::Trailer;
                    }
                    rest
                }
                State::Trailer => {
                    if bytes[0] != b'\n' {
                        self.error = Some(StreamError::NoLineBreak);
                    }
                    self.state = State::Header;
                    &bytes[1..]
                }
            };
        }
    }

    fn keep_header(&mut self, bytes: &[u8]) {
        let room = MAX_HEADER.saturating_sub(self.header.len());
        self.header
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// A header line: the object it announces, begun in `scanner`.
    fn begin(&mut self, scanner: &mut Scanner<'_>, header: &[u8]) {
        let text = String::from_utf8_lossy(header);
        let mut parts = text.splitn(4, ' ');
        let (oid, kind, size, rest) = (
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let short: String = oid.chars().take(12).collect();
        let Ok(size) = size.parse::<u64>() else {
            self.error = Some(StreamError::Unreadable(format!("{short} {kind}")));
            return;
        };
        let tree = match kind {
            "blob" if !rest.is_empty() => {
                scanner.begin_object(rest.to_string(), true);
                None
            }
            "blob" => {
                scanner.begin_object(format!("(blob {short})"), false);
                None
            }
            "commit" | "tag" => {
                scanner.begin_object(format!("({kind} {short})"), false);
                None
            }
            "tree" => {
                let dir = if rest.is_empty() {
                    "/".to_string()
                } else {
                    format!("{rest}/")
                };
                scanner.begin_object(format!("(names in {dir})"), false);
                Some(Tree {
                    hash_len: oid.len() / 2,
                    entry: 0,
                    part: Part::Mode(0),
                })
            }
            other => {
                self.error = Some(StreamError::UnknownType {
                    short,
                    kind: other.to_string(),
                });
                return;
            }
        };
        self.objects += 1;
        self.state = if size == 0 {
            State::Trailer
        } else {
            State::Body { left: size, tree }
        };
    }

    /// The objects read, or why the stream cannot be trusted to be what is pushed.
    pub(super) fn finish(self) -> Result<u64, StreamError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        match self.state {
            State::Header if self.header.is_empty() => Ok(self.objects),
            _ => Err(StreamError::Truncated),
        }
    }
}

impl Tree {
    /// The next bytes of a tree's body: each entry's name goes to `scanner`.
    fn feed(&mut self, scanner: &mut Scanner<'_>, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            bytes = match &mut self.part {
                Part::Mode(n) => match bytes.iter().position(|&b| b == b' ') {
                    Some(i) => {
                        self.entry += 1;
                        scanner.entry_start(self.entry);
                        self.part = Part::Name;
                        &bytes[i + 1..]
                    }
                    None => {
                        // A malformed mode cannot hide a name: it is searched as one.
                        *n += bytes.len();
                        if *n > MAX_MODE {
                            self.entry += 1;
                            scanner.entry_start(self.entry);
                            scanner.entry_bytes(bytes);
                            self.part = Part::Name;
                        }
                        &[]
                    }
                },
                Part::Name => match bytes.iter().position(|&b| b == 0) {
                    Some(i) => {
                        scanner.entry_bytes(&bytes[..i]);
                        scanner.entry_end();
                        self.part = Part::Hash(self.hash_len);
                        &bytes[i + 1..]
                    }
                    None => {
                        scanner.entry_bytes(bytes);
                        &[]
                    }
                },
                Part::Hash(left) => {
                    let n = (*left).min(bytes.len());
                    *left -= n;
                    if *left == 0 {
                        self.part = Part::Mode(0);
                    }
                    &bytes[n..]
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::known::Credential;
    use crate::redact::scan::Rules;

    /// A `cat-file --batch` stream of a blob, a tree, a commit and a tag, cut at every size: each
    /// object is read whole, the tree's entry names one by one.
    #[test]
    fn a_batch_stream_is_read_object_by_object_at_any_cut() {
        let key = "listed-secret-4Kd8wQz";
        let rules = Rules::new(
            &[Credential::new("a `secrets` value", key)],
            globset::GlobSet::empty(),
        )
        .unwrap();
        let oid = "ab".repeat(20);
        let blob = format!("one\ntwo {key}\n");
        let mut tree = Vec::new();
        for name in ["README".to_string(), format!("{key}.txt")] {
            tree.extend_from_slice(format!("100644 {name}\0").as_bytes());
            tree.extend_from_slice(&[7u8; 20]);
        }
        let commit = format!("tree {oid}\nencoding IBM037\n\n{key}\n");
        let tag = format!("object {oid}\ntype commit\ntag v1\n\nrelease {key}\n");
        let mut stream = Vec::new();
        stream
            .extend_from_slice(format!("{oid} blob {} src/a.txt\n{blob}\n", blob.len()).as_bytes());
        stream.extend_from_slice(format!("{oid} tree {} src\n", tree.len()).as_bytes());
        stream.extend_from_slice(&tree);
        stream
            .extend_from_slice(format!("\n{oid} commit {} \n{commit}\n", commit.len()).as_bytes());
        stream.extend_from_slice(format!("{oid} blob 0 empty\n\n").as_bytes());
        stream.extend_from_slice(format!("{oid} tag {} \n{tag}\n", tag.len()).as_bytes());
        for cut in [1, 2, 3, 7, 64, stream.len()] {
            let mut scanner = Scanner::new(&rules);
            let mut objects = ObjectStream::new();
            for piece in stream.chunks(cut) {
                objects.feed(&mut scanner, piece);
            }
            assert_eq!(objects.finish(), Ok(5), "cut {cut}");
            let found: Vec<_> = scanner
                .finish()
                .findings
                .into_iter()
                .map(|f| (f.path, f.line))
                .collect();
            assert_eq!(
                found,
                [
                    ("src/a.txt".to_string(), 2),
                    ("(names in src/)".to_string(), 2),
                    ("(commit abababababab)".to_string(), 4),
                    ("(tag abababababab)".to_string(), 5),
                ],
                "cut {cut}"
            );
        }
    }

    /// What is not a whole, known object is an error, never a scan that passed.
    #[test]
    fn a_missing_truncated_or_unknown_object_fails_the_scan() {
        let rules = Rules::new(&[], globset::GlobSet::empty()).unwrap();
        let oid = "cd".repeat(20);
        for (stream, why) in [
            (format!("{oid} missing\n"), "not an object"),
            (format!("{oid} blob 10 a\nabc"), "ends inside"),
            (format!("{oid} weird 1 a\nx\n"), "unknown type"),
            (format!("{oid} tree 9 d\n100644 ab\n"), "inside an entry"),
        ] {
            let mut scanner = Scanner::new(&rules);
            let mut objects = ObjectStream::new();
            objects.feed(&mut scanner, stream.as_bytes());
            let e = objects.finish().unwrap_err().to_string();
            assert!(e.contains(why), "{stream:?}: {e}");
        }
    }
}
