//! `[publish]`: what the staged-change scan (`redact::scan`) lets through before a task's
//! work is committed and pushed. As written ([`RawPublish`]) and validated
//! ([`PublishConfig`]): every glob is compiled at load, so a typo stops the daemon with the
//! key's name instead of silently allowing nothing (or everything).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::ConfigError;

/// `[publish]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawPublish {
    pub allow_secrets_in: Option<Vec<String>>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[publish]`: the scan before a task's work is committed and pushed.
#[derive(Debug, Clone, Default)]
pub struct PublishConfig {
    /// Globs over paths in the repository (`tests/fixtures/**`; `*` stays within one
    /// directory, `**` crosses them) where a high-confidence credential *pattern* (a private
    /// key block, an AWS key ID, a forge token) is let through: test fixtures. A credential
    /// the daemon itself holds is refused everywhere.
    pub allow_secrets_in: Vec<String>,
}

impl PublishConfig {
    /// The globs as one set (checked at load: an entry that does not compile is never here).
    pub fn allow_set(&self) -> globset::GlobSet {
        build(&self.allow_secrets_in).unwrap_or_else(|_| globset::GlobSet::empty())
    }
}

/// One glob as the scan matches paths: `/` is only crossed by `**`.
fn build(globs: &[String]) -> Result<globset::GlobSet, (String, globset::Error)> {
    let mut set = globset::GlobSetBuilder::new();
    for g in globs {
        let glob = globset::GlobBuilder::new(g)
            .literal_separator(true)
            .build()
            .map_err(|e| (g.clone(), e))?;
        set.add(glob);
    }
    set.build().map_err(|e| (String::new(), e))
}

/// Defaults filled in, every glob compiled; an empty or absolute entry is refused (paths
/// in a diff are relative to the repository's root).
pub(super) fn publish(r: RawPublish, origin: &str) -> Result<PublishConfig, ConfigError> {
    let globs = r.allow_secrets_in.unwrap_or_default();
    let invalid = |message: String| ConfigError::Invalid {
        key: "publish.allow_secrets_in".into(),
        origin: origin.to_string(),
        message,
    };
    if let Some(bad) = globs
        .iter()
        .find(|g| g.trim().is_empty() || g.starts_with('/'))
    {
        return Err(invalid(format!(
            "`{bad}` is not a path glob relative to the repository's root (like `tests/fixtures/**`)"
        )));
    }
    build(&globs).map_err(|(g, e)| invalid(format!("`{g}` is not a glob: {e}")))?;
    Ok(PublishConfig {
        allow_secrets_in: globs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(globs: &[&str]) -> RawPublish {
        RawPublish {
            allow_secrets_in: Some(globs.iter().map(|g| g.to_string()).collect()),
            unknown: BTreeMap::new(),
        }
    }

    #[test]
    fn allowed_paths_are_checked_globs() {
        let ok = publish(raw(&["tests/fixtures/**", "*.pem"]), "test").unwrap();
        let set = ok.allow_set();
        assert!(set.is_match("tests/fixtures/a/b.key"));
        assert!(set.is_match("k.pem"));
        assert!(!set.is_match("src/k.pem"), "`*` stays in one directory");
        assert!(!set.is_match("tests/fixture.key"));
        for bad in ["tests/[fixtures", "/etc/**", " "] {
            let e = publish(raw(&[bad]), "test").unwrap_err().to_string();
            assert!(e.contains("publish.allow_secrets_in"), "{e}");
        }
        assert!(publish(RawPublish::default(), "t")
            .unwrap()
            .allow_set()
            .is_empty());
    }
}
