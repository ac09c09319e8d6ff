//! Small helpers shared across modules: time, truncation, URLs.
//!
//! URLs are parsed with the `url` crate and percent-encoded with `percent-encoding` here, and
//! nowhere else: one reading of what a host is, one set of characters left unencoded.

use std::time::{SystemTime, UNIX_EPOCH};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};

/// The unit tests' gate for what this machine may lack (no silent skips).
#[cfg(test)]
pub(crate) mod require;

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

/// Where the last `max` bytes of `s` start, moved forward to a char boundary: 0 when `s`
/// fits, and never more than `max` bytes from the end.
pub fn tail_start(s: &str, max: usize) -> usize {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    start
}

/// The last `max` bytes of `s` (on a char boundary), prefixed with an elision marker when cut.
pub fn tail_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let start = tail_start(s, max);
    format!("{}\n{}", elision(start as u64), &s[start..])
}

/// Everything but RFC 3986's unreserved characters (`A-Z a-z 0-9 - _ . ~`).
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `s` with every byte outside RFC 3986's unreserved set as `%XX`: safe as one URL path
/// segment or query value, and the form a secret takes when a tool URL-encodes it.
pub fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, NOT_UNRESERVED).to_string()
}

/// Whether `url`'s host is a loopback address (or `localhost`), as the `url` crate parses it.
///
/// Decided on the parsed host, never on a prefix: `127.0.0.1.evil.example` is a DNS name.
pub fn is_loopback_url(url: &str) -> bool {
    match url::Url::parse(url).ok().as_ref().and_then(url::Url::host) {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// An HTTP endpoint as configured (`host:port`, or a full `http(s)://` URL) as a base URL:
/// `http://` added when no scheme is given, no trailing slash. Paths are appended to it.
pub fn http_base_url(endpoint: &str) -> String {
    let e = endpoint.trim().trim_end_matches('/');
    if e.starts_with("http://") || e.starts_with("https://") {
        e.to_string()
    } else {
        format!("http://{e}")
    }
}

/// A string the hub or a task sends and the daemon branches on, as an enum parsed once where
/// it arrives: the known values are variants, anything else is kept as sent in `Other` (a
/// newer hub or an extension is not an error). Serialises back to exactly the string.
macro_rules! open_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(from = "String", into = "String")]
        pub enum $name {
            $($(#[$vm])* $v,)+
            /// A value this build does not know, as sent.
            Other(String),
        }
        impl $name {
            /// The wire string.
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$v => $s,)+
                    $name::Other(s) => s,
                }
            }
        }
        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $($s => $name::$v,)+
                    other => $name::Other(other.to_string()),
                }
            }
        }
        impl From<String> for $name {
            fn from(s: String) -> Self {
                match $name::from(s.as_str()) {
                    $name::Other(_) => $name::Other(s),
                    known => known,
                }
            }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.as_str().to_string()
            }
        }
        impl Default for $name {
            fn default() -> Self {
                $name::Other(String::new())
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}
pub(crate) use open_enum;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_decided_on_the_parsed_host() {
        assert!(is_loopback_url("ws://127.0.0.1:4000/ws"));
        assert!(is_loopback_url("ws://localhost/ws"));
        assert!(is_loopback_url("ws://[::1]:4000/ws"));
        assert!(is_loopback_url("http://user:pw@127.0.0.1:11434"));
        assert!(!is_loopback_url("ws://hub.example:4000/ws"));
        assert!(!is_loopback_url("ws://127.0.0.1.evil.example/ws"));
        assert!(!is_loopback_url("http://localhost@evil.example/"));
        assert!(!is_loopback_url("not a url"));
    }

    #[test]
    fn percent_encoding_keeps_only_unreserved_characters() {
        assert_eq!(percent_encode("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(percent_encode("t/1 ?&=+é"), "t%2F1%20%3F%26%3D%2B%C3%A9");
    }

    #[test]
    fn endpoints_become_base_urls() {
        assert_eq!(http_base_url("gpu:11434/"), "http://gpu:11434");
        assert_eq!(http_base_url(" https://o.example/ "), "https://o.example");
        assert_eq!(http_base_url("http://127.0.0.1:1"), "http://127.0.0.1:1");
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_chars("héllo", 2), "hé");
        assert_eq!(truncate_chars("hi", 5), "hi");
        let t = tail_bytes("ééééé", 3);
        assert!(t.ends_with('é') && t.contains("elided"));
        assert_eq!(tail_bytes("abc", 3), "abc");
    }
}
