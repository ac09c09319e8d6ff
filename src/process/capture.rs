//! Bounded capture of a child's output: a buffer that keeps head and tail, and a line
//! splitter for streaming parsers. Neither grows without bound whatever the child prints.

use std::collections::VecDeque;

/// A byte buffer that keeps its first and last `cap/2` bytes.
#[derive(Debug)]
pub struct CappedBuf {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    half: usize,
    dropped: u64,
}

impl CappedBuf {
    pub fn new(cap: usize) -> CappedBuf {
        CappedBuf {
            head: Vec::new(),
            tail: VecDeque::new(),
            half: (cap / 2).max(1),
            dropped: 0,
        }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        if self.head.len() < self.half {
            let n = (self.half - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        if bytes.len() >= self.half {
            self.dropped += (self.tail.len() + bytes.len() - self.half) as u64;
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.half..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.half);
        self.tail.drain(..overflow);
        self.dropped += overflow as u64;
        self.tail.extend(bytes);
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Head, an elision marker when bytes were dropped, tail. Lossy UTF-8.
    pub fn to_string_lossy(&self) -> String {
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if self.dropped > 0 {
            out.push('\n');
            out.push_str(&crate::util::elision(self.dropped));
            out.push('\n');
        }
        let (a, b) = self.tail.as_slices();
        let mut t = Vec::with_capacity(a.len() + b.len());
        t.extend_from_slice(a);
        t.extend_from_slice(b);
        out.push_str(&String::from_utf8_lossy(&t));
        out
    }
}

/// Splits a byte stream into lines for [`super::run_with`]. A single line is capped at 8 MiB so a
/// child that never prints a newline cannot grow it without bound (the excess is dropped).
#[derive(Default)]
pub(crate) struct LineSplitter {
    partial: Vec<u8>,
}

const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

impl LineSplitter {
    pub(crate) fn feed(&mut self, mut bytes: &[u8], cb: &mut (dyn FnMut(&str) + Send)) {
        while let Some(i) = bytes.iter().position(|&b| b == b'\n') {
            self.push(&bytes[..i]);
            let line = std::mem::take(&mut self.partial);
            let line = String::from_utf8_lossy(&line);
            cb(line.strip_suffix('\r').unwrap_or(&line));
            bytes = &bytes[i + 1..];
        }
        self.push(bytes);
    }

    fn push(&mut self, bytes: &[u8]) {
        let room = MAX_LINE_BYTES.saturating_sub(self.partial.len());
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    pub(crate) fn finish(&mut self, cb: &mut (dyn FnMut(&str) + Send)) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            cb(&String::from_utf8_lossy(&line));
        }
    }
}

/// `s` cut to about `max` bytes keeping head and tail, with one marker saying how much was
/// cut. `s` may already carry markers (the executor's capture cap): those bytes are counted in,
/// so the marker reports everything left out, not just this second cut.
pub fn head_tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    // The one marker format (`util::elision`), compiled once, on first use.
    static MARKER: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\n?\[… (\d+) bytes elided …\]\n?").expect("valid regex")
    });
    let marker = &*MARKER;
    let earlier: u64 = marker
        .captures_iter(s)
        .filter_map(|c| c[1].parse::<u64>().ok())
        .sum();
    let content = marker.replace_all(s, "");
    let mut buf = CappedBuf::new(max);
    buf.push(content.as_bytes());
    let head_tail = buf.to_string_lossy();
    if earlier == 0 {
        return head_tail;
    }
    let now = buf.dropped();
    let (head, tail) = match marker.find(&head_tail) {
        Some(m) => (&head_tail[..m.start()], &head_tail[m.end()..]),
        // Nothing cut this time: put the earlier marker between what is left.
        None => {
            let mut mid = head_tail.len() / 2;
            while !head_tail.is_char_boundary(mid) {
                mid -= 1;
            }
            head_tail.split_at(mid)
        }
    };
    format!("{head}\n{}\n{tail}", crate::util::elision(earlier + now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_buf_keeps_head_and_tail() {
        let mut b = CappedBuf::new(10);
        for i in 0..100u8 {
            b.push(&[b'a' + (i % 26)]);
        }
        assert_eq!(b.dropped(), 90);
        let s = b.to_string_lossy();
        assert!(s.starts_with("abcde"));
        assert!(s.contains("90 bytes elided"));
        assert!(s.ends_with("rstuv"), "{s}");
        let mut b = CappedBuf::new(10);
        b.push(b"0123456789ABCDEFGHIJ");
        assert_eq!(b.to_string_lossy(), "01234\n[… 10 bytes elided …]\nFGHIJ");
    }
}
