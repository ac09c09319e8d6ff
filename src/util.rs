//! Small helpers shared across modules: time, truncation.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (the hub's timestamp unit).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// At most `max` chars of `s`, on a char boundary.
pub fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_string(),
        None => s.to_string(),
    }
}

/// The marker every truncation in the daemon writes where it cut `n` bytes. The redactor
/// finds cuts by it ([`ELISION_END`]) to remove both halves of a secret a cut split, so every
/// truncation must write exactly this.
pub fn elision(n: u64) -> String {
    format!("[… {n} bytes elided …]")
}

/// How every [`elision`] marker ends.
pub const ELISION_END: &str = " bytes elided …]";

/// The last `max` bytes of `s` (on a char boundary), prefixed with an elision marker when cut.
pub fn tail_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("{}\n{}", elision(start as u64), &s[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_chars("héllo", 2), "hé");
        assert_eq!(truncate_chars("hi", 5), "hi");
        let t = tail_bytes("ééééé", 3);
        assert!(t.ends_with('é') && t.contains("elided"));
        assert_eq!(tail_bytes("abc", 3), "abc");
    }
}
