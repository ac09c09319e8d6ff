//! What the task's proxy lets through under `[network] mode = "allowlist"`: a `host:port`
//! is decided twice, by name against the entries, then by address once resolved.
//!
//! **Entries** (`[network] allow`, the repository's remote, the agent's API):
//!
//! - `host` — that name on the web ports, 80 and 443 only;
//! - `host:port` — that name on that port only; `host:*` — on any port;
//! - `*.example.com` or `.example.com` — the domain and its subdomains (on the web ports, or
//!   the port given: `*.example.com:8443`);
//! - an IP address is a name like any other (`127.0.0.1:4000`, `[::1]:4000`): requests are
//!   matched as spelled, so `2130706433` or `0x7f000001` never match `127.0.0.1`.
//!
//! **Addresses**: the proxy connects only to the addresses it resolved and checked itself
//! (never resolving again), and an address of this host — loopback (`127.0.0.0/8`, `::1`),
//! unspecified (`0.0.0.0/8`, `::`, which reach loopback on Linux), link-local
//! (`169.254.0.0/16`, where clouds keep their metadata service, `fe80::/10`), IPv4 in
//! IPv6 (`::ffff:127.0.0.1`) of any of those, and every address of the host's own
//! interfaces (where the daemon's `/metrics`, a hub on the same machine or any local
//! service listens) — only when an entry names that exact host and port. No wildcard
//! domain, bare host or `:*` ever reaches them: a name anyone can point at `127.0.0.1`
//! reaches nothing of the host.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::config::allow::normal;
pub use crate::config::allow::Entry;

/// The entries a task's proxy decides by.
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    entries: Vec<Entry>,
}

/// Why the proxy refuses a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No entry matches the name and port.
    NotListed,
    /// Every address the name resolved to is this host's own (of this kind), and no entry
    /// names the exact `host:port`.
    HostOwn(&'static str),
}

impl Allowlist {
    /// The entries of `items`; one that does not parse is left out (with a warning: the
    /// config's validation refuses such entries, see [`Entry::parse`]).
    pub fn new<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> Allowlist {
        let entries = items
            .into_iter()
            .filter_map(|s| match Entry::parse(s.as_ref()) {
                Ok(e) => Some(e),
                Err(why) => {
                    tracing::warn!(entry = %why, "network allowlist entry ignored");
                    None
                }
            })
            .collect();
        Allowlist { entries }
    }

    /// The name check: whether some entry lets `host:port` through (before resolution).
    pub fn lets_through(&self, host: &str, port: u16) -> bool {
        let host = normal(host);
        self.entries.iter().any(|e| e.matches(&host, port))
    }

    /// The address check: of `addrs` (what `host` resolved to), those the proxy may
    /// connect to, in order; the refusal when none.
    pub fn addresses(
        &self,
        host: &str,
        port: u16,
        addrs: &[SocketAddr],
    ) -> Result<Vec<SocketAddr>, Refusal> {
        let host = normal(host);
        let named = self.entries.iter().any(|e| e.names(&host, port));
        let mut kept = Vec::new();
        let mut why = None;
        for a in addrs {
            match host_own(a.ip()) {
                Some(kind) if !named => why = why.or(Some(kind)),
                _ => kept.push(*a),
            }
        }
        match (kept.is_empty(), why) {
            (true, Some(kind)) => Err(Refusal::HostOwn(kind)),
            (true, None) => Err(Refusal::NotListed),
            _ => Ok(kept),
        }
    }
}

/// What of this host `ip` is, if anything: loopback, unspecified, link-local, or one of
/// the addresses of its interfaces.
pub fn host_own(ip: IpAddr) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => v4_inside(v6).map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let kind = match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => v6_kind(v6),
    };
    kind.or_else(|| is_local_interface(ip).then_some("local interface"))
}

/// The IPv4 address carried in an IPv4-mapped (`::ffff:a.b.c.d`) or IPv4-compatible
/// (`::a.b.c.d`) IPv6 address.
fn v4_inside(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let high_zero = s[..5].iter().all(|x| *x == 0);
    let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    // `::` and `::1` are IPv6's own.
    (high_zero && (s[5] == 0xffff || (s[5] == 0 && u32::from(v4) > 1))).then_some(v4)
}

fn v4_kind(v4: Ipv4Addr) -> Option<&'static str> {
    let o = v4.octets();
    if o[0] == 127 {
        Some("loopback")
    } else if o[0] == 0 {
        Some("unspecified")
    } else if v4.is_link_local() {
        Some("link-local")
    } else if v4.is_broadcast() || v4.is_multicast() {
        Some("broadcast or multicast")
    } else {
        None
    }
}

fn v6_kind(v6: Ipv6Addr) -> Option<&'static str> {
    if v6.is_loopback() {
        Some("loopback")
    } else if v6.is_unspecified() {
        Some("unspecified")
    } else if v6.segments()[0] & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if v6.is_multicast() {
        Some("broadcast or multicast")
    } else {
        None
    }
}

/// Whether `ip` is an address of one of this host's interfaces: the kernel lets a socket
/// bind only to those (or to any, where `ip_nonlocal_bind` is set: then every address
/// counts as this host's, and the proxy reaches only what entries name exactly).
fn is_local_interface(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Allowlist {
        Allowlist::new(items.iter().copied())
    }

    #[test]
    fn a_bare_host_is_the_web_ports_and_a_port_is_that_port_only() {
        let a = list(&[
            "crates.io",
            "*.npmjs.org",
            "gw.example:8443",
            "any.example:*",
        ]);
        assert!(a.lets_through("crates.io", 443));
        assert!(a.lets_through("CRATES.IO.", 80));
        assert!(!a.lets_through("crates.io", 22));
        assert!(!a.lets_through("static.crates.io", 443));
        assert!(!a.lets_through("evilcrates.io", 443));
        assert!(a.lets_through("registry.npmjs.org", 443));
        assert!(a.lets_through("npmjs.org", 443));
        assert!(!a.lets_through("npmjs.org.evil.test", 443));
        assert!(!a.lets_through("registry.npmjs.org", 6379));
        assert!(a.lets_through("gw.example", 8443));
        assert!(!a.lets_through("gw.example", 443));
        assert!(a.lets_through("any.example", 6379));
    }

    /// Every spelling of this host's loopback, link-local or own addresses, once resolved,
    /// is refused unless an entry names that exact `host:port`; a wildcard, a bare host or
    /// `:*` never reaches them.
    #[test]
    fn the_hosts_own_addresses_need_an_exact_host_port_entry() {
        let at = |ip: &str| vec![SocketAddr::new(ip.parse().unwrap(), 4000)];
        for ip in [
            "127.0.0.1",
            "127.3.2.1",
            "::1",
            "0.0.0.0",
            "0.1.2.3",
            "::",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "::ffff:169.254.169.254",
            "169.254.169.254",
            "fe80::1",
        ] {
            // Listed in every loose way: still refused.
            let loose = list(&["evil.example:*", "*.example", "evil.example"]);
            assert!(
                matches!(
                    loose.addresses("evil.example", 4000, &at(ip)),
                    Err(Refusal::HostOwn(_))
                ),
                "{ip}"
            );
            // Named exactly, it is the operator's choice.
            let exact = list(&["evil.example:4000"]);
            assert_eq!(
                exact.addresses("EVIL.example.", 4000, &at(ip)),
                Ok(at(ip)),
                "{ip}"
            );
            assert!(exact.addresses("evil.example", 4001, &at(ip)).is_err());
        }
        // A public address is not the host's own.
        let public = at("192.0.2.7");
        assert_eq!(
            list(&["x.example"]).addresses("x.example", 4000, &public),
            Ok(public.clone())
        );
        // A name resolving to both keeps only the public address.
        let mixed = [at("127.0.0.1"), public.clone()].concat();
        assert_eq!(
            list(&["x.example:*"]).addresses("x.example", 4000, &mixed),
            Ok(public)
        );
    }

    /// An address of one of this host's interfaces (where a service bound to all
    /// interfaces, like the daemon's `/metrics` on `0.0.0.0`, answers) is the host's own.
    #[test]
    fn an_address_of_this_hosts_interfaces_is_its_own() {
        // The address this host would use to reach a public one: its own (skipped without
        // a route).
        let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let routed = probe.connect("192.0.2.1:9");
        let why = routed
            .as_ref()
            .err()
            .map(|e| format!("no route off this host: {e}"));
        if !crate::util::require::require("route", why) {
            return;
        }
        let mine = probe.local_addr().unwrap().ip();
        assert_eq!(host_own(mine), Some("local interface"), "{mine}");
        assert_eq!(host_own("192.0.2.1".parse().unwrap()), None);
    }
}
