//! Bounded capture of a child's output: a buffer that keeps head and tail, and a line
//! splitter for streaming parsers. Neither grows without bound whatever the child prints.
//!
//! The buffer is on the path of every byte a task prints (150 MB for `seq 1 20000000`), so
//! it is written in place: the tail is a fixed ring allocated once at its full size, never
//! shifted, and the result string is built in the head's allocation, so a capped capture
//! costs its cap once and not the two or three copies a build-then-join would.

/// A byte buffer that keeps its first and last `cap/2` bytes.
#[derive(Debug)]
pub struct CappedBuf {
    /// The first `half` bytes, in order.
    head: Vec<u8>,
    /// The last bytes seen. While it is shorter than `half` it is in order; once full it is a
    /// ring whose oldest byte is at `start`.
    tail: Vec<u8>,
    /// Index of the oldest byte in `tail` once it is full (0 until then).
    start: usize,
    half: usize,
    dropped: u64,
}

impl CappedBuf {
    /// A buffer keeping at most `cap` bytes (at least one at each end). Nothing is allocated
    /// until bytes arrive, and never more than `cap` rounded up to even.
    pub fn new(cap: usize) -> CappedBuf {
        CappedBuf {
            head: Vec::new(),
            tail: Vec::new(),
            start: 0,
            half: (cap / 2).max(1),
            dropped: 0,
        }
    }

    /// Append `bytes`: the head fills first, then the tail ring keeps the newest `cap/2`.
    pub fn push(&mut self, mut bytes: &[u8]) {
        if self.head.len() < self.half {
            let n = (self.half - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        if bytes.is_empty() {
            return;
        }
        if bytes.len() >= self.half {
            // The chunk alone fills the tail: everything the tail held is dropped.
            let keep = &bytes[bytes.len() - self.half..];
            self.dropped += (self.tail.len() + bytes.len() - self.half) as u64;
            self.tail.clear();
            self.tail.reserve_exact(self.half);
            self.tail.extend_from_slice(keep);
            self.start = 0;
            return;
        }
        let room = self.half - self.tail.len();
        if room > 0 {
            // Still filling: in order, allocated once at full size.
            if self.tail.capacity() < self.half {
                self.tail.reserve_exact(self.half - self.tail.len());
            }
            let n = room.min(bytes.len());
            self.tail.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        // Full ring: overwrite the oldest bytes in place.
        self.dropped += bytes.len() as u64;
        while !bytes.is_empty() {
            let n = (self.half - self.start).min(bytes.len());
            self.tail[self.start..self.start + n].copy_from_slice(&bytes[..n]);
            self.start = (self.start + n) % self.half;
            bytes = &bytes[n..];
        }
    }

    /// Bytes left out between head and tail so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Head, an elision marker when bytes were dropped, tail. Lossy UTF-8.
    pub fn to_string_lossy(&self) -> String {
        let (a, b) = self.tail_slices();
        let marker = marker(self.dropped);
        let mut bytes = Vec::with_capacity(self.head.len() + marker.len() + a.len() + b.len());
        bytes.extend_from_slice(&self.head);
        bytes.extend_from_slice(marker.as_bytes());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        lossy(bytes)
    }

    /// [`Self::to_string_lossy`] without a copy of what is kept: the tail is put in order in
    /// place and appended to the head's allocation (grown once, to the exact size).
    pub fn into_string_lossy(self) -> String {
        let marker = marker(self.dropped);
        let CappedBuf {
            mut head,
            mut tail,
            start,
            ..
        } = self;
        tail.rotate_left(start);
        head.reserve_exact(marker.len() + tail.len());
        head.extend_from_slice(marker.as_bytes());
        head.extend_from_slice(&tail);
        drop(tail);
        lossy(head)
    }

    /// The tail's bytes, oldest first, as the ring's two halves.
    fn tail_slices(&self) -> (&[u8], &[u8]) {
        let (newer, older) = self.tail.split_at(self.start);
        (older, newer)
    }
}

/// The text between head and tail: nothing when nothing was dropped, else the one elision
/// marker on its own line.
fn marker(dropped: u64) -> String {
    if dropped == 0 {
        String::new()
    } else {
        format!("\n{}\n", crate::util::elision(dropped))
    }
}

/// `bytes` as a string, without a copy when it is valid UTF-8 (the usual case). Invalid
/// sequences become U+FFFD. Head and tail are decoded as one text: the marker's newlines end
/// any sequence cut at either edge, and with nothing dropped a character spanning the
/// head/tail boundary stays whole.
fn lossy(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
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
    // The text without its markers, fed piece by piece: the buffer keeps only head and tail,
    // so a 1 MiB capture cut to 64 KiB is never copied whole.
    let mut buf = CappedBuf::new(max);
    for piece in marker.split(s) {
        buf.push(piece.as_bytes());
    }
    let now = buf.dropped();
    let head_tail = buf.into_string_lossy();
    if earlier == 0 {
        return head_tail;
    }
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

    /// The buffer as it was before the ring (a `VecDeque` tail drained from the front), kept
    /// here as the reference the in-place ring must match byte for byte.
    struct Reference {
        head: Vec<u8>,
        tail: std::collections::VecDeque<u8>,
        half: usize,
        dropped: u64,
    }

    impl Reference {
        fn new(cap: usize) -> Reference {
            Reference {
                head: Vec::new(),
                tail: Default::default(),
                half: (cap / 2).max(1),
                dropped: 0,
            }
        }

        fn push(&mut self, mut bytes: &[u8]) {
            if self.head.len() < self.half {
                let n = (self.half - self.head.len()).min(bytes.len());
                self.head.extend_from_slice(&bytes[..n]);
                bytes = &bytes[n..];
            }
            for &b in bytes {
                if self.tail.len() == self.half {
                    self.tail.pop_front();
                    self.dropped += 1;
                }
                self.tail.push_back(b);
            }
        }

        fn kept(&self) -> (Vec<u8>, Vec<u8>) {
            (self.head.clone(), self.tail.iter().copied().collect())
        }
    }

    fn kept(b: &CappedBuf) -> (Vec<u8>, Vec<u8>) {
        let (a, c) = b.tail_slices();
        (b.head.clone(), [a, c].concat())
    }

    proptest::proptest! {
        /// Any sequence of chunks, any cap: same head, tail, dropped count and text as the
        /// reference, and never more than the cap held.
        #[test]
        fn ring_keeps_what_the_reference_keeps(
            cap in 1usize..64,
            chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..80), 0..40),
        ) {
            let mut ring = CappedBuf::new(cap);
            let mut reference = Reference::new(cap);
            for c in &chunks {
                ring.push(c);
                reference.push(c);
                proptest::prop_assert_eq!(kept(&ring), reference.kept());
                proptest::prop_assert_eq!(ring.dropped(), reference.dropped);
                proptest::prop_assert!(ring.tail.capacity() <= ring.half);
            }
            let text = ring.to_string_lossy();
            proptest::prop_assert_eq!(&ring.into_string_lossy(), &text);
            let (head, tail) = reference.kept();
            let expected = if reference.dropped == 0 {
                String::from_utf8_lossy(&[head, tail].concat()).into_owned()
            } else {
                format!(
                    "{}\n{}\n{}",
                    String::from_utf8_lossy(&head),
                    crate::util::elision(reference.dropped),
                    String::from_utf8_lossy(&tail)
                )
            };
            proptest::prop_assert_eq!(text, expected);
        }
    }

    #[test]
    fn head_tail_counts_earlier_markers_and_cuts_once() {
        let mut capture = CappedBuf::new(200);
        for i in 0..1000 {
            capture.push(format!("line {i}\n").as_bytes());
        }
        let captured = capture.into_string_lossy();
        let cut = head_tail(&captured, 50);
        // 25 bytes of head, one marker for everything left out, 25 bytes of tail.
        let total: usize = (0..1000).map(|i| format!("line {i}\n").len()).sum();
        assert!(cut.starts_with("line 0\nline 1\nline 2\nline"), "{cut}");
        assert!(cut.ends_with("line 998\nline 999\n"), "{cut}");
        assert_eq!(cut.matches("bytes elided").count(), 1, "{cut}");
        assert!(
            cut.contains(&crate::util::elision(total as u64 - 50)),
            "{cut}"
        );
        assert_eq!(head_tail("short", 50), "short");
    }

    #[test]
    fn a_flood_keeps_its_first_and_last_lines_and_counts_the_rest() {
        let mut b = CappedBuf::new(64);
        let mut total = 0u64;
        let mut chunk = Vec::new();
        for i in 1..=100_000u32 {
            chunk.extend_from_slice(format!("{i}\n").as_bytes());
            if chunk.len() >= 4096 {
                total += chunk.len() as u64;
                b.push(&chunk);
                chunk.clear();
            }
        }
        total += chunk.len() as u64;
        b.push(&chunk);
        assert_eq!(b.dropped(), total - 64);
        let s = b.into_string_lossy();
        assert!(s.starts_with("1\n2\n3\n"), "{s}");
        assert!(s.ends_with("99999\n100000\n"), "{s}");
        assert!(s.contains(&crate::util::elision(total - 64)), "{s}");
    }

    #[test]
    fn a_character_across_the_head_tail_boundary_stays_whole_when_nothing_is_dropped() {
        // "é" is two bytes; the head ends after its first byte.
        let text = "abcé";
        let mut b = CappedBuf::new(8);
        b.push(text.as_bytes());
        assert_eq!(b.dropped(), 0);
        assert_eq!(b.into_string_lossy(), text);
    }

    #[test]
    fn into_combined_moves_a_lone_stream_and_joins_two() {
        let out = |o: &str, e: &str| super::super::RunOutput {
            exit: super::super::Exit::Code(0),
            stdout: o.into(),
            stderr: e.into(),
            dropped_bytes: 0,
            duration: Default::default(),
        };
        for (o, e) in [("out", ""), ("", "err"), ("out", "err"), ("", "")] {
            assert_eq!(out(o, e).into_combined(), out(o, e).combined());
        }
    }
}
