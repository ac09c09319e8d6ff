//! The proxy's record of what a task asked of the network: per `host:port`, connections and
//! bytes, allowed or refused. Bounded whatever the task requests: a target is kept at most
//! [`MAX_TARGET`] bytes long and at most [`MAX_TARGETS`] targets are kept one by one; the
//! rest is counted in one summary line per verdict, [`OTHERS`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most distinct targets kept one by one in a task's tally.
pub(super) const MAX_TARGETS: usize = 256;
/// Longest target kept: a DNS name (253) and a port. A longer one is shortened, marked `…`.
pub(super) const MAX_TARGET: usize = 260;
/// The target of the summary line counting every target beyond [`MAX_TARGETS`], and the
/// connections refused beyond the proxy's connection cap.
pub const OTHERS: &str = "(other targets)";

/// One host's use through the proxy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HostUse {
    /// `host:port` as asked for (at most [`MAX_TARGET`] bytes), or [`OTHERS`].
    pub target: String,
    /// Whether the allowlist let it through.
    pub allowed: bool,
    /// Connections made (or refused).
    pub connections: u64,
    /// Bytes from the task to the host.
    pub bytes_up: u64,
    /// Bytes from the host to the task.
    pub bytes_down: u64,
    /// Connections to an allowed host that could not be made (the proxy answered 502).
    #[serde(skip_serializing_if = "is_zero")]
    pub unreachable: u64,
    /// Why the last of those failed (the connect error), for the task's infrastructure error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl HostUse {
    fn new(target: String, allowed: bool) -> HostUse {
        HostUse {
            target,
            allowed,
            connections: 0,
            bytes_up: 0,
            bytes_down: 0,
            unreachable: 0,
            last_error: None,
        }
    }
}

/// A task's tally, shared by its proxy's connections.
#[derive(Debug, Clone, Default)]
pub(super) struct Tally(Arc<Mutex<Inner>>);

#[derive(Debug, Default)]
struct Inner {
    /// In order of first use.
    hosts: Vec<HostUse>,
    /// `(target, allowed)` → index in `hosts`.
    index: HashMap<(String, bool), usize>,
    /// Beyond [`MAX_TARGETS`]: refused and allowed.
    others: [Option<HostUse>; 2],
}

impl Inner {
    fn entry(&mut self, target: &str, allowed: bool) -> &mut HostUse {
        let target = shorten(target);
        if let Some(&i) = self.index.get(&(target.clone(), allowed)) {
            return &mut self.hosts[i];
        }
        if self.hosts.len() < MAX_TARGETS {
            self.index
                .insert((target.clone(), allowed), self.hosts.len());
            self.hosts.push(HostUse::new(target, allowed));
            let last = self.hosts.len() - 1;
            return &mut self.hosts[last];
        }
        self.others[usize::from(allowed)]
            .get_or_insert_with(|| HostUse::new(OTHERS.to_string(), allowed))
    }
}

/// `target` cut to [`MAX_TARGET`] bytes (on a character boundary), marked when cut.
fn shorten(target: &str) -> String {
    if target.len() <= MAX_TARGET {
        return target.to_string();
    }
    let mut end = MAX_TARGET;
    while !target.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &target[..end])
}

impl Tally {
    /// One connection to `target`, with the bytes it moved.
    pub(super) fn note(&self, target: &str, allowed: bool, up: u64, down: u64) {
        let Ok(mut t) = self.0.lock() else { return };
        let h = t.entry(target, allowed);
        h.connections += 1;
        h.bytes_up += up;
        h.bytes_down += down;
    }

    /// An allowed host that could not be reached: counted as a connection, and why it failed.
    pub(super) fn note_unreachable(&self, target: &str, error: &std::io::Error) {
        let Ok(mut t) = self.0.lock() else { return };
        let h = t.entry(target, true);
        h.connections += 1;
        h.unreachable += 1;
        h.last_error = Some(shorten(&error.to_string()));
    }

    /// A connection the proxy shed unread (over its connection cap): counted as refused,
    /// under [`OTHERS`].
    pub(super) fn note_shed(&self) {
        let Ok(mut t) = self.0.lock() else { return };
        t.others[0]
            .get_or_insert_with(|| HostUse::new(OTHERS.to_string(), false))
            .connections += 1;
    }

    /// Every target kept, in order of first use, then the summary lines.
    pub(super) fn hosts(&self) -> Vec<HostUse> {
        let Ok(t) = self.0.lock() else {
            return Vec::new();
        };
        let others = t.others.iter().flatten().cloned();
        t.hosts.iter().cloned().chain(others).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However many distinct targets a task asks for, and however long, the tally keeps at
    /// most [`MAX_TARGETS`] of them, each at most [`MAX_TARGET`] bytes, and counts the rest.
    #[test]
    fn many_long_targets_are_kept_bounded_and_the_rest_counted() {
        let t = Tally::default();
        let long = "a".repeat(10_000);
        for i in 0..3_000 {
            t.note(&format!("{i}{long}.test:443"), false, 0, 0);
        }
        t.note("kept.test:443", true, 5, 7);
        t.note_shed();
        let hosts = t.hosts();
        assert_eq!(hosts.len(), MAX_TARGETS + 2);
        assert!(hosts
            .iter()
            .all(|h| h.target.len() <= MAX_TARGET + '…'.len_utf8()));
        let refused_others = hosts
            .iter()
            .find(|h| h.target == OTHERS && !h.allowed)
            .unwrap();
        assert_eq!(refused_others.connections, 3_000 - MAX_TARGETS as u64 + 1);
        let allowed_others = hosts
            .iter()
            .find(|h| h.target == OTHERS && h.allowed)
            .unwrap();
        assert_eq!((allowed_others.bytes_up, allowed_others.bytes_down), (5, 7));
        // A target kept early keeps counting.
        let t = Tally::default();
        t.note("a.test:443", true, 1, 1);
        t.note("a.test:443", true, 1, 1);
        assert_eq!(t.hosts()[0].connections, 2);
    }
}
