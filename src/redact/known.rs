//! Every credential the daemon knows, each named by where it came from: the hub token,
//! `secrets`, the values of `[env] agent` (`ANTHROPIC_API_KEY`) and `[env] publish`
//! (`GH_TOKEN`), and the tokens of the agent's login in the operator's template (copied into
//! every task's `CLAUDE_CONFIG_DIR`, see `sandbox::agent_home`). The redactor scrubs them
//! all from what leaves the process; the staged-change scan refuses a change that holds one
//! and names the source, never the value.

use std::path::Path;

use serde_json::Value;

use crate::config::Config;

/// One credential and where it came from. Its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// Where the daemon got it, for a report: "the hub token", "`[env] agent`
    /// ANTHROPIC_API_KEY", "the agent login (.credentials.json: claudeAiOauth.accessToken)".
    pub source: String,
    /// The value.
    pub value: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("source", &self.source)
            .field("value", &super::MARK)
            .finish()
    }
}

impl Credential {
    /// `value` from `source`.
    pub fn new(source: impl Into<String>, value: impl Into<String>) -> Credential {
        Credential {
            source: source.into(),
            value: value.into(),
        }
    }
}

/// The files of the agent's configuration directory that hold its login: the CLI's OAuth
/// tokens, a stored API key, an `env` block of its settings.
const LOGIN_FILES: &[&str] = &[".credentials.json", ".claude.json", "settings.json"];

/// Largest login file read (the agent home copies nothing larger either).
const MAX_LOGIN_FILE: u64 = 1024 * 1024;

/// Most values taken from one login file: a login holds a handful.
const MAX_PER_FILE: usize = 32;

/// The credentials of `cfg` and of the child environment built from it (its `[env] agent`
/// and `[env] publish` values, kept aside from every other child); the agent login's are
/// [`agent_login`]'s. `ChildEnv::credentials` passes its own parts and adds the login's.
pub fn from_parts(
    cfg: &Config,
    agent: &[(String, String)],
    publish: &[(String, String)],
) -> Vec<Credential> {
    let mut out = vec![Credential::new("the hub token", &cfg.token)];
    out.extend(
        cfg.secrets
            .iter()
            .map(|s| Credential::new("a `secrets` value", s)),
    );
    out.extend(
        cfg.otel
            .headers
            .iter()
            .map(|(k, v)| Credential::new(format!("`[otel] headers` {k}"), v)),
    );
    for (list, vars) in [("agent", agent), ("publish", publish)] {
        out.extend(
            vars.iter()
                .map(|(k, v)| Credential::new(format!("`[env] {list}` {k}"), v)),
        );
    }
    out
}

/// The tokens in the agent's configuration directory `dir` (the operator's template): every
/// string a [`LOGIN_FILES`] file holds under a credential's name (`accessToken`,
/// `refreshToken`, `primaryApiKey`, `ANTHROPIC_API_KEY`, …). Links are not followed; a
/// missing or unreadable file gives nothing.
pub fn agent_login(dir: &Path) -> Vec<Credential> {
    let mut out = Vec::new();
    for name in LOGIN_FILES {
        let path = dir.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() || meta.len() > MAX_LOGIN_FILE {
            continue;
        }
        let Some(v) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        else {
            continue;
        };
        let mut found = Vec::new();
        collect(&v, "", &mut found);
        out.extend(found.into_iter().take(MAX_PER_FILE).map(|(key, value)| {
            Credential::new(format!("the agent login ({name}: {key})"), value)
        }));
    }
    out
}

/// Strings under a credential-named key anywhere in `v`, with their dotted key paths.
fn collect(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    let Value::Object(m) = v else {
        return;
    };
    for (k, child) in m {
        let path = if at.is_empty() {
            k.clone()
        } else {
            format!("{at}.{k}")
        };
        match child {
            Value::String(s) if names_a_credential(k) && s.len() >= 8 => {
                out.push((path, s.clone()));
            }
            Value::Object(_) => collect(child, &path, out),
            _ => {}
        }
    }
}

/// Whether a JSON key names a credential: `…token…`, `…secret…`, `…password…`, or ends in
/// `key` (`primaryApiKey`, `ANTHROPIC_API_KEY`; not `apiKeyHelper`, which names a program).
fn names_a_credential(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["token", "secret", "password"]
        .iter()
        .any(|w| k.contains(w))
        || k.ends_with("key")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The login as the Claude CLI writes it, and the other places a key can sit: each token
    /// is taken, with its file and key; what only describes the login is not.
    #[test]
    fn the_agent_login_yields_its_tokens_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join(".credentials.json"),
            r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-AAAAaaaa","refreshToken":"sk-ant-ort01-BBBBbbbb","expiresAt":1760000000000,"scopes":["user:inference"],"subscriptionType":"max"}}"#,
        )
        .unwrap();
        std::fs::write(
            d.path().join("settings.json"),
            r#"{"apiKeyHelper":"/usr/local/bin/key-helper","env":{"ANTHROPIC_API_KEY":"sk-ant-api03-CCCCcccc","DISABLE_TELEMETRY":"1"}}"#,
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/hostname", d.path().join(".claude.json")).unwrap();
        let got = agent_login(d.path());
        let pairs: Vec<(&str, &str)> = got
            .iter()
            .map(|c| (c.source.as_str(), c.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    "the agent login (.credentials.json: claudeAiOauth.accessToken)",
                    "sk-ant-oat01-AAAAaaaa"
                ),
                (
                    "the agent login (.credentials.json: claudeAiOauth.refreshToken)",
                    "sk-ant-ort01-BBBBbbbb"
                ),
                (
                    "the agent login (settings.json: env.ANTHROPIC_API_KEY)",
                    "sk-ant-api03-CCCCcccc"
                ),
            ]
        );
        assert!(agent_login(&d.path().join("none")).is_empty());
        assert!(
            !format!("{got:?}").contains("AAAAaaaa"),
            "Debug shows no value"
        );
    }
}
