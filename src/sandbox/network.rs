//! The network part of a task's sandbox plan under `[network] mode = "allowlist"`: the
//! proxy's allowlist (the operator's entries, the repository's remote, the agent's API as
//! `host:port`), the proxy itself, and the variables that send the children's tools to it.
//!
//! The agent's API may be on the host's loopback (a local gateway at
//! `ANTHROPIC_BASE_URL=http://127.0.0.1:4000`): inside the task's network namespace
//! loopback is the task's own, so the API is reached through the proxy, which the entry
//! `127.0.0.1:4000` lets through to exactly that port. For that the spelling the API uses
//! (`127.0.0.1`, `localhost` or `::1`) is left out of `NO_PROXY`; the other spellings stay,
//! so a task's own servers on its loopback stay reachable directly under them.

use super::allowlist::Allowlist;
use super::grants::{var_in, Grants};
use super::{netns, proxy, ContainmentError};
use crate::config::Config;

/// The loopback spellings `NO_PROXY` names: a task's own loopback is reached directly.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The task's proxy and the variables pointing its children at it, added to `set`.
pub(super) fn proxy(
    cfg: &Config,
    vars: &[(String, String)],
    grants: &Grants,
    set: &mut Vec<(String, String)>,
) -> Result<proxy::Proxy, ContainmentError> {
    let api = executor_api(cfg, vars);
    let api_host = api.as_ref().map(|(_, host)| host.clone());
    let allow = allowlist(cfg, grants, api.map(|(entry, _)| entry));
    let p = proxy::Proxy::start(allow).map_err(ContainmentError::Proxy)?;
    let url = format!("http://127.0.0.1:{}", netns::PROXY_PORT);
    for k in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        set.push((k.to_string(), url.clone()));
    }
    let no_proxy = no_proxy(api_host.as_deref());
    for k in ["NO_PROXY", "no_proxy"] {
        set.push((k.to_string(), no_proxy.clone()));
    }
    Ok(p)
}

/// The operator's entries, the repository's remote and the agent's API entry `api`. The
/// remote is its `host:port`, and its host on the web ports (a forge reached over ssh
/// serves its archives and API over HTTPS; a bare host reached every port before entries
/// had ports).
fn allowlist(cfg: &Config, grants: &Grants, api: Option<String>) -> Allowlist {
    let remote_hosts = grants.hosts.iter().filter_map(|e| {
        let (h, p) = e.rsplit_once(':')?;
        p.parse::<u16>().is_ok().then(|| h.to_string())
    });
    Allowlist::new(
        cfg.network
            .allow
            .iter()
            .cloned()
            .chain(grants.hosts.iter().cloned())
            .chain(remote_hosts)
            .chain(api),
    )
}

/// `NO_PROXY`: the loopback spellings but the one the agent's API host is spelled with.
fn no_proxy(api_host: Option<&str>) -> String {
    let api_host = api_host.map(|h| h.trim_start_matches('[').trim_end_matches(']'));
    LOOPBACK
        .iter()
        .filter(|l| Some(**l) != api_host)
        .copied()
        .collect::<Vec<_>>()
        .join(",")
}

/// The agent's LLM API when the operator points it elsewhere (`ANTHROPIC_BASE_URL`, passed
/// to the agent through `[env] allow` or `[env] agent`): its allowlist entry `host:port`
/// (the URL's port, or its scheme's) and its host. Under the allowlist the task's executor
/// must reach its API wherever it is, and nothing else of that host.
pub(super) fn executor_api(cfg: &Config, vars: &[(String, String)]) -> Option<(String, String)> {
    const KEY: &str = "ANTHROPIC_BASE_URL";
    let url = var_in(&[vars], KEY).map(str::to_string).or_else(|| {
        cfg.env
            .agent
            .iter()
            .any(|k| k == KEY)
            .then(|| std::env::var(KEY).ok())
            .flatten()
    })?;
    let entry = proxy::remote_host(&url)?;
    let host = match entry.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => h.to_string(),
        _ => entry.clone(),
    };
    Some((entry, host.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_api_is_one_host_port_and_leaves_no_proxy_when_on_loopback() {
        let cfg = Config::default();
        let api =
            |url: &str| executor_api(&cfg, &[("ANTHROPIC_BASE_URL".to_string(), url.to_string())]);
        assert_eq!(
            api("https://llm-gw.example.internal:8443/v1"),
            Some((
                "llm-gw.example.internal:8443".to_string(),
                "llm-gw.example.internal".to_string()
            ))
        );
        assert_eq!(
            api("http://127.0.0.1:4000").map(|a| a.0),
            Some("127.0.0.1:4000".into())
        );
        assert_eq!(
            api("http://LOCALHOST:4000/").map(|a| a.0),
            Some("localhost:4000".into())
        );
        assert_eq!(
            api("https://api.anthropic.com").map(|a| a.0),
            Some("api.anthropic.com:443".into())
        );
        assert_eq!(executor_api(&cfg, &[]), None);
        assert_eq!(no_proxy(None), "localhost,127.0.0.1,::1");
        assert_eq!(no_proxy(Some("127.0.0.1")), "localhost,::1");
        assert_eq!(no_proxy(Some("localhost")), "127.0.0.1,::1");
        assert_eq!(no_proxy(Some("[::1]")), "localhost,127.0.0.1");
        assert_eq!(
            no_proxy(Some("api.anthropic.com")),
            "localhost,127.0.0.1,::1"
        );
    }

    #[test]
    fn the_remote_is_its_port_and_the_web_ports_and_the_api_its_port_only() {
        let grants = Grants {
            hosts: vec!["gitlab.corp:22".into()],
            ..Grants::default()
        };
        let a = allowlist(&Config::default(), &grants, Some("gw.corp:4000".into()));
        assert!(a.lets_through("gitlab.corp", 22));
        assert!(a.lets_through("gitlab.corp", 443));
        assert!(!a.lets_through("gitlab.corp", 6379));
        assert!(a.lets_through("gw.corp", 4000));
        assert!(!a.lets_through("gw.corp", 443));
        assert!(a.lets_through("api.anthropic.com", 443));
    }
}
