//! Repository URLs: the credentials they may carry, and the names derived from them.

use std::fmt::Write as _;
use std::path::PathBuf;

/// `host/path` of a repository URL as a directory name: safe characters only, credentials
/// stripped, plus a short hash of the clean URL so `a/b` and `a_b` never share a clone.
pub fn slug_of_url(url: &str) -> String {
    let clean = strip_userinfo(url);
    let rest = clean.split_once("://").map_or(clean.as_str(), |(_, r)| r);
    let mut slug = String::new();
    for c in rest.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
            c
        } else {
            '_'
        };
        // No runs of `_`, and never `..` (a name that looks like a parent reference).
        if !((c == '_' || c == '.') && (slug.ends_with('_') || slug.ends_with('.'))) {
            slug.push(c);
        }
    }
    let slug: String = slug
        .trim_matches(|c| c == '_' || c == '.')
        .chars()
        .take(80)
        .collect();
    use sha2::Digest;
    let hash = sha2::Sha256::digest(clean.as_bytes());
    let mut short = String::new();
    for b in &hash[..4] {
        let _ = write!(short, "{b:02x}");
    }
    format!("{}-{short}", if slug.is_empty() { "repo" } else { &slug })
}

/// `url` without `user:pass@`.
pub fn strip_userinfo(url: &str) -> String {
    match userinfo(url) {
        Some(u) => url.replacen(&format!("{u}@"), "", 1),
        None => url.to_string(),
    }
}

/// The `user:pass` part of `scheme://user:pass@host/…`, if any.
pub fn userinfo(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let (info, _) = authority.rsplit_once('@')?;
    (!info.is_empty()).then(|| info.to_string())
}

/// The directory a local remote lives in: a `file://` URL or a plain path (git's own rule:
/// no `scheme://` and no `host:` before the first slash).
pub fn local_path(url: &str) -> Option<PathBuf> {
    if let Some(rest) = url.strip_prefix("file://") {
        return Some(PathBuf::from(rest));
    }
    if url.contains("://") {
        return None;
    }
    let colon = url.find(':');
    let slash = url.find('/');
    match (colon, slash) {
        (Some(c), Some(s)) if c < s => None,
        (Some(_), None) => None,
        _ => Some(PathBuf::from(url)),
    }
}

/// Secrets in a repository URL (the whole userinfo, and the password alone), to add to the
/// task's redactor.
pub fn url_secrets(url: &str) -> Vec<String> {
    let Some(info) = userinfo(url) else {
        return Vec::new();
    };
    let mut v = vec![info.clone()];
    if let Some((_, pass)) = info.split_once(':') {
        v.push(pass.to_string());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_slug_strips_credentials_and_is_safe() {
        let a = slug_of_url("https://user:s3cret@github.com/org/repo.git");
        assert!(a.starts_with("github.com_org_repo.git-"), "{a}");
        assert!(!a.contains("s3cret") && !a.contains("user"));
        assert_eq!(a, slug_of_url("https://github.com/org/repo.git"));
        assert_ne!(slug_of_url("file:///a/b"), slug_of_url("file:///a_b"));
        let p = slug_of_url("/tmp/x y/../bare.git");
        assert!(p
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)));
        assert!(!p.contains(".."), "{p}");
    }

    #[test]
    fn workspace_url_secrets_and_stripping() {
        let u = "http://user:s3cretpass@127.0.0.1:1/x.git";
        assert_eq!(strip_userinfo(u), "http://127.0.0.1:1/x.git");
        assert_eq!(url_secrets(u), vec!["user:s3cretpass", "s3cretpass"]);
        assert!(url_secrets("/srv/git/x.git").is_empty());
        assert!(url_secrets("https://h/a@b").is_empty());
        assert_eq!(
            local_path("/srv/git/x.git"),
            Some(PathBuf::from("/srv/git/x.git"))
        );
        assert_eq!(local_path("file:///srv/x"), Some(PathBuf::from("/srv/x")));
        assert_eq!(local_path("git@github.com:o/r.git"), None);
        assert_eq!(local_path("https://h/r.git"), None);
    }
}
