//! One `[network] allow` entry: `host`, `host:port`, `host:*`, `*.domain[:port]`, an IP
//! address (`[::1]:4000`), parsed once — by the config's validation, which refuses a
//! malformed one, and by the task's proxy ([`crate::sandbox::allowlist`]), which decides by it.

/// An entry that does not parse: which, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{entry}`: {why}")]
pub struct BadEntry {
    entry: String,
    why: &'static str,
}

/// The ports a bare host entry allows.
const WEB_PORTS: [u16; 2] = [80, 443];

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    host: Host,
    port: Port,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    /// Exactly this name (lowercase, no trailing dot).
    Exact(String),
    /// This domain and its subdomains.
    Domain(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    /// A bare entry: [`WEB_PORTS`].
    Web,
    /// `:*`.
    Any,
    /// `:port`.
    Exact(u16),
}

impl Entry {
    /// Parse one entry (see the module docs); the error says what is wrong with it.
    pub fn parse(s: &str) -> Result<Entry, BadEntry> {
        let s = s.trim();
        let bad = |why| BadEntry {
            entry: s.to_string(),
            why,
        };
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (h, after) = rest.split_once(']').ok_or_else(|| bad("`[` without `]`"))?;
            match after {
                "" => (h, None),
                _ => (
                    h,
                    Some(
                        after
                            .strip_prefix(':')
                            .ok_or_else(|| bad("only `:port` may follow `]`"))?,
                    ),
                ),
            }
        } else if s.matches(':').count() > 1 {
            // A bare IPv6 address: no port (write `[v6]:port` for one).
            (s, None)
        } else {
            match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        let port = match port {
            None => Port::Web,
            Some("*") => Port::Any,
            Some(p) => Port::Exact(
                p.parse()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad("the port must be 1–65535 or `*`"))?,
            ),
        };
        let host = normal(host);
        let host = match host.strip_prefix("*.").or_else(|| host.strip_prefix('.')) {
            Some(d) => Host::Domain(d.to_string()),
            None => Host::Exact(host),
        };
        match &host {
            Host::Exact(h) | Host::Domain(h) if h.is_empty() || h.contains(['*', '/', ' ']) => Err(
                bad("not a host name, `*.domain` or IP address (with an optional `:port`)"),
            ),
            _ => Ok(Entry { host, port }),
        }
    }

    pub(crate) fn matches(&self, host: &str, port: u16) -> bool {
        let name = match &self.host {
            Host::Exact(h) => h == host,
            Host::Domain(d) => {
                host == d
                    || host
                        .strip_suffix(d.as_str())
                        .is_some_and(|h| h.ends_with('.'))
            }
        };
        name && match self.port {
            Port::Web => WEB_PORTS.contains(&port),
            Port::Any => true,
            Port::Exact(p) => p == port,
        }
    }

    /// Whether this entry names `host:port` exactly: what lets it reach this host's own
    /// addresses.
    pub(crate) fn names(&self, host: &str, port: u16) -> bool {
        self.host == Host::Exact(host.to_string()) && self.port == Port::Exact(port)
    }
}

/// A host name as compared: lowercase, without the root's trailing dot.
pub(crate) fn normal(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_parsed_or_refused_with_a_reason() {
        for ok in [
            "h",
            "h:1",
            "h:*",
            "[::1]:4000",
            "::1",
            "*.d.example:443",
            ".d",
        ] {
            assert!(Entry::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["h:0", "h:x", "h:70000", "", "*", "[::1", "[::1]4000", "a/b"] {
            assert!(Entry::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Entry::parse("[::1]:4000").unwrap(),
            Entry {
                host: Host::Exact("::1".into()),
                port: Port::Exact(4000)
            }
        );
    }
}
