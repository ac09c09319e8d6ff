//! Git's text as [`super`] reads it: `git status --porcelain` and `git diff --numstat` lines
//! with paths quoted by `core.quotePath`, unquoted back to their exact bytes; and paths shown
//! escaped in the observation lines.

/// One entry of `git status --porcelain` (v1, newline-terminated, quoted paths).
pub(super) struct StatusEntry {
    pub(super) code: [u8; 2],
    pub(super) path: Vec<u8>,
}

/// The entries of `git status --porcelain` output; a rename or copy gives its new path. Lines
/// that are not entries (an elision marker in a capped listing) are skipped.
#[cfg(test)]
pub(super) fn parse_status(s: &str) -> impl Iterator<Item = StatusEntry> + '_ {
    s.lines().filter_map(parse_status_line)
}

/// One line of `git status --porcelain`, as [`super`] reads the listing while git prints it;
/// `None` for a line that is not an entry.
pub(super) fn parse_status_line(line: &str) -> Option<StatusEntry> {
    let b = line.as_bytes();
    let valid = |c: u8| b" MTADRCU?!".contains(&c);
    if b.len() < 4 || !valid(b[0]) || !valid(b[1]) || b[2] != b' ' {
        return None;
    }
    let code = [b[0], b[1]];
    let rest = &line[3..];
    let path = if code[0] == b'R' || code[0] == b'C' {
        let (_, after) = split_quoted(rest);
        unquote(after.strip_prefix(" -> ")?)
    } else {
        unquote(rest)
    };
    Some(StatusEntry { code, path })
}

/// The first path of `s` (quoted or not, ending at a space when unquoted) and the rest.
fn split_quoted(s: &str) -> (&str, &str) {
    if let Some(body) = s.strip_prefix('"') {
        let b = body.as_bytes();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' => return (&s[..i + 2], &s[i + 2..]),
                _ => i += 1,
            }
        }
        (s, "")
    } else {
        match s.find(' ') {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        }
    }
}

/// A path as git prints it with `core.quotePath`: as is, or C-quoted with octal escapes for
/// every byte that is not printable ASCII.
pub(super) fn unquote(s: &str) -> Vec<u8> {
    let Some(body) = s.strip_prefix('"').and_then(|b| b.strip_suffix('"')) else {
        return s.as_bytes().to_vec();
    };
    let b = body.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        out.push(match c {
            b'a' => 0x07,
            b'b' => 0x08,
            b't' => b'\t',
            b'n' => b'\n',
            b'v' => 0x0b,
            b'f' => 0x0c,
            b'r' => b'\r',
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    if let Some(d @ b'0'..=b'7') = b.get(i).copied() {
                        v = v * 8 + u32::from(d - b'0');
                        i += 1;
                    }
                }
                v as u8
            }
            other => other,
        });
    }
    out
}

/// `git diff --numstat` lines: (path, added, deleted); binary files show `-`.
pub(super) fn parse_numstat(s: &str) -> impl Iterator<Item = (Vec<u8>, String, String)> + '_ {
    s.lines().filter_map(parse_numstat_line)
}

/// One `git diff --numstat` line; `None` for a line that is not one.
pub(super) fn parse_numstat_line(l: &str) -> Option<(Vec<u8>, String, String)> {
    let mut it = l.splitn(3, '\t');
    let (a, d, p) = (it.next()?, it.next()?, it.next()?);
    Some((unquote(p), a.to_string(), d.to_string()))
}

/// A path for a line of text: UTF-8 as is, every other byte as `\xNN`, and backslashes and
/// control characters escaped, so the bytes can be read back and one path is one line.
pub fn display_path(p: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(p.len());
    for chunk in p.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                // As `term::printable` writes them: ASCII controls as `\xNN` (an invalid
                // byte is always ≥ 0x80, so the two never collide), the rest as `\u{..}`.
                c if c.is_control() && (c as u32) < 0x80 => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c if c.is_control() => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}
