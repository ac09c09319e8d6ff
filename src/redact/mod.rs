//! Secret scrubbing: no credential the daemon knows leaves the process.
//!
//! Task output often echoes environment values, so every progress event, result and report
//! passes through [`Redactor`] before it is sent, and log lines go through it too. The
//! redactor knows every credential the daemon holds ([`known`]: the hub token, `secrets`,
//! the `[env] agent` and `[env] publish` values, the agent login's tokens), each matched in
//! every spelling [`forms`] lists (verbatim, base64 in both alphabets at every alignment,
//! URL-encoded, hex; a secret under 6 bytes is ignored, it would redact ordinary words).
//! Credentials embedded in URLs (`https://user:pass@host`, e.g. a task's `repo`) are
//! scrubbed by shape, whatever they are: the userinfo becomes `[REDACTED]`.
//!
//! # Layout
//!
//! - [`Redactor`] and the log writer: this file.
//! - [`forms`]: the spellings of one secret.
//! - [`known`]: the credentials the daemon holds and where each came from.
//! - [`scan`]: the staged-change scan that refuses to publish a credential.

pub mod forms;
pub mod known;
pub mod scan;

use serde_json::Value;

use known::Credential;

/// What every secret is replaced with.
pub const MARK: &str = "[REDACTED]";

/// How the marker every truncation writes ends (see [`crate::util::elision`]).
const ELISION: &str = crate::util::ELISION_END;

/// The shortest piece of a cut secret that is redacted at an elision: shorter pieces are
/// too likely to be ordinary text, and too short to be worth anything to a reader.
const MIN_PIECE: usize = 4;

/// Replaces known secret values with [`MARK`].
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// The credentials, named by source: what the staged-change scan refuses.
    credentials: std::sync::Arc<Vec<Credential>>,
    needles: Vec<String>,
    /// Every needle, [`ELISION`] and [`URL_SCHEME_END`] as one search, built on first use
    /// ([`Redactor::finder`]): "is there anything to scrub?" is asked of every output chunk,
    /// often three times (the progress event, its stream, the recorder), and one SIMD pass
    /// over all patterns costs less than one `str::contains` per needle did for a single
    /// needle (figure 10). Shared by clones (a task's redactor is a clone of the daemon's):
    /// compiled once.
    finder: std::sync::Arc<std::sync::OnceLock<Option<regex::Regex>>>,
}

impl Redactor {
    /// A redactor for `secrets` (short or empty ones are ignored).
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Redactor {
        Redactor::from_credentials(
            secrets
                .into_iter()
                .map(|s| Credential::new("a secret", s))
                .collect(),
        )
    }

    /// A redactor for `credentials`, each in every form [`forms::forms`] lists: for the
    /// daemon, `ChildEnv::credentials` (everything it holds).
    pub fn from_credentials(credentials: Vec<Credential>) -> Redactor {
        let mut needles: Vec<String> = Vec::new();
        for c in &credentials {
            for (n, _) in forms::forms(&c.value) {
                if !needles.contains(&n) {
                    needles.push(n);
                }
            }
        }
        let mut r = Redactor::from_needles(needles);
        r.credentials = std::sync::Arc::new(credentials);
        r
    }

    /// The credentials this redactor scrubs, each with its source.
    pub fn credentials(&self) -> &[Credential] {
        &self.credentials
    }

    /// Sort `needles` longest first, so a secret's encoded form is not half-replaced by a
    /// shorter one.
    fn from_needles(mut needles: Vec<String>) -> Redactor {
        needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        Redactor {
            credentials: Default::default(),
            needles,
            finder: Default::default(),
        }
    }

    /// The finder, built on first use: a daemon that never scrubs a chunk (idle) never
    /// compiles it (figure 2). `None` when the needles are too many or too long for one
    /// regex (then [`Redactor::needs_scrub`] asks each needle).
    fn finder(&self) -> Option<&regex::Regex> {
        let built = self.finder.get_or_init(|| {
            // An alternation of plain literals: `regex` searches it with a SIMD multi-literal
            // searcher (Teddy) and never runs an automaton over text without a candidate.
            let patterns = self.needles.iter().map(String::as_str);
            let alternation = (patterns.chain([ELISION, URL_SCHEME_END]))
                .map(regex::escape)
                .collect::<Vec<_>>()
                .join("|");
            regex::Regex::new(&alternation).ok()
        });
        built.as_ref()
    }

    /// This redactor plus more secrets (e.g. the password of one task's repository URL).
    pub fn with_extra(&self, extra: impl IntoIterator<Item = String>) -> Redactor {
        self.with_credentials(
            extra
                .into_iter()
                .map(|s| Credential::new("a secret of this task", s))
                .collect(),
        )
    }

    /// This redactor plus more credentials (the agent login the task's copy was made from).
    /// The same redactor, sharing its compiled finder, when they add no new spelling.
    pub fn with_credentials(&self, extra: Vec<Credential>) -> Redactor {
        let extra: Vec<Credential> = extra
            .into_iter()
            .filter(|c| !self.credentials.iter().any(|k| k.value == c.value))
            .collect();
        let added = Redactor::from_credentials(extra);
        if added.needles.iter().all(|n| self.needles.contains(n)) {
            return self.clone();
        }
        let mut needles = added.needles;
        for n in &self.needles {
            if !needles.contains(n) {
                needles.push(n.clone());
            }
        }
        let mut credentials = (*self.credentials).clone();
        credentials.extend(added.credentials.iter().cloned());
        let mut r = Redactor::from_needles(needles);
        r.credentials = std::sync::Arc::new(credentials);
        r
    }

    /// Whether there is nothing to scrub.
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// `s` with every secret and every URL userinfo replaced, and with what is left of a
    /// secret cut in two by an elision (`[… N bytes elided …]`) replaced on both sides of it.
    pub fn scrub(&self, s: &str) -> String {
        let mut out = s.to_string();
        for n in &self.needles {
            if out.contains(n.as_str()) {
                out = out.replace(n.as_str(), MARK);
            }
        }
        if out.contains(ELISION) {
            out = self.scrub_around_elisions(&out);
        }
        scrub_url_userinfo(&out)
    }

    /// Whether [`Redactor::scrub`] could change `s`: a needle, an elision (when there are
    /// secrets to cut) or a URL that may carry userinfo. Text with none of the finder's
    /// literals (nearly every chunk of output) is cleared in one pass; the rest is asked
    /// precisely.
    fn needs_scrub(&self, s: &str) -> bool {
        self.finder().is_none_or(|f| f.is_match(s)) && self.holds_what_scrub_changes(s)
    }

    /// The precise question, one needle at a time.
    fn holds_what_scrub_changes(&self, s: &str) -> bool {
        self.needles.iter().any(|n| s.contains(n.as_str()))
            || (!self.needles.is_empty() && s.contains(ELISION))
            || may_hold_userinfo(s)
    }

    /// Scrub `s` in place; no allocation when it holds no secret.
    pub fn scrub_in_place(&self, s: &mut String) {
        if self.needs_scrub(s) {
            *s = self.scrub(s);
        }
    }

    /// Truncation keeps a head and a tail: a secret straddling the cut leaves its start at
    /// the end of the head and its end at the start of the tail, neither of which matches
    /// whole. Both halves go (any piece of at least [`MIN_PIECE`] bytes).
    fn scrub_around_elisions(&self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(at) = rest.find(ELISION) {
            // The marker starts at its `[`; the text before it may end with a newline.
            let open = rest[..at].rfind('[').unwrap_or(at);
            let close = at + ELISION.len();
            let (before, marker) = (&rest[..open], &rest[open..close]);
            let trimmed = before.strip_suffix('\n').unwrap_or(before);
            let cut = self.partial_suffix_len(trimmed);
            if cut >= MIN_PIECE {
                out.push_str(&trimmed[..trimmed.len() - cut]);
                out.push_str(MARK);
                out.push_str(&before[trimmed.len()..]);
            } else {
                out.push_str(before);
            }
            out.push_str(marker);
            rest = &rest[close..];
            let lead = rest.len() - rest.trim_start_matches('\n').len();
            let after = &rest[lead..];
            let cut = self.partial_prefix_len(after);
            out.push_str(&rest[..lead]);
            if cut >= MIN_PIECE {
                out.push_str(MARK);
                rest = &after[cut..];
            } else {
                rest = after;
            }
        }
        out.push_str(rest);
        out
    }

    /// Length of the longest start of `s` that is the end of a secret (in any form).
    fn partial_prefix_len(&self, s: &str) -> usize {
        let mut best = 0;
        for n in &self.needles {
            for k in (best + 1..n.len().min(s.len() + 1)).rev() {
                let start = n.len() - k;
                if n.is_char_boundary(start) && s.starts_with(&n[start..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }

    /// Length of the longest end of `s` that is the start of a secret (in any form): text
    /// a stream must hold back until the next chunk shows whether it completes one, or a
    /// secret split across two frames would be whole again at the receiver.
    pub fn partial_suffix_len(&self, s: &str) -> usize {
        let mut best = 0;
        for n in &self.needles {
            for k in (best + 1..n.len().min(s.len() + 1)).rev() {
                if n.is_char_boundary(k) && s.ends_with(&n[..k]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }

    /// Scrub every string inside a JSON value, in place.
    pub fn scrub_value(&self, v: &mut Value) {
        match v {
            Value::String(s) if self.needs_scrub(s) => {
                *s = self.scrub(s);
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.scrub_value(x)),
            Value::Object(m) => m.values_mut().for_each(|x| self.scrub_value(x)),
            _ => {}
        }
    }
}

/// What ends a URL's scheme: no userinfo without it.
const URL_SCHEME_END: &str = "://";

/// Cheap pre-check before running the URL regex: a scheme separator and an `@` after it.
fn may_hold_userinfo(s: &str) -> bool {
    s.find(URL_SCHEME_END).is_some_and(|i| s[i..].contains('@'))
}

/// `scheme://user:pass@host` → `scheme://[REDACTED]@host` (also a bare `user@` token form).
pub fn scrub_url_userinfo(s: &str) -> String {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    if !may_hold_userinfo(s) {
        return s.to_string();
    }
    let re = RE.get_or_init(|| {
        // Userinfo ends at the last `@` before the host: no `/`, whitespace or quote in it.
        regex::Regex::new(r#"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@'"<>\[\]]+@"#)
            .expect("static regex")
    });
    re.replace_all(s, |c: &regex::Captures<'_>| {
        if &c[0][c[1].len()..] == "[REDACTED]@" {
            c[0].to_string()
        } else {
            format!("{}{MARK}@", &c[1])
        }
    })
    .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use serde_json::json;

    const PIECES: &[&str] = &[
        "tok-UNIQUE-1",
        "dG9rLVVOSVFVRS0x",
        "LVVOSVFVRS0",
        "tok%2DUNIQUE",
        "tok-UNI",
        "QUE-1",
        " bytes elided …]",
        "[… 12",
        "://",
        "@",
        "https://u:p@h",
        "0123456789\n",
        "é…",
        " ",
    ];

    proptest::proptest! {
        /// The one-pass finder answers exactly what asking each needle did, and whatever it
        /// lets through is text `scrub` would not change: the fast path misses nothing.
        #[test]
        fn the_finder_agrees_with_each_needle_and_misses_nothing(
            picks in proptest::collection::vec(0..PIECES.len(), 0..12),
        ) {
            let r = Redactor::new(vec!["tok-UNIQUE-1".to_string(), "hunter2hunter2".to_string()]);
            let s: String = picks.iter().map(|&i| PIECES[i]).collect();
            proptest::prop_assert!(r.finder().is_some());
            proptest::prop_assert_eq!(r.needs_scrub(&s), r.holds_what_scrub_changes(&s), "{}", s);
            if !r.needs_scrub(&s) {
                proptest::prop_assert_eq!(r.scrub(&s), s);
            }
        }
    }

    #[test]
    fn a_task_redactor_reuses_the_daemon_finder_unless_it_adds_a_secret() {
        let daemon = Redactor::new(vec!["tok-UNIQUE-1".to_string()]);
        let same = daemon.with_extra(Vec::new());
        let also_same = daemon.with_extra(vec!["tok-UNIQUE-1".to_string(), "pw".to_string()]);
        assert!(same.needs_scrub("x tok-UNIQUE-1"));
        assert!(std::sync::Arc::ptr_eq(&daemon.finder, &same.finder));
        assert!(std::sync::Arc::ptr_eq(&daemon.finder, &also_same.finder));
        assert!(
            daemon.finder.get().is_some(),
            "compiled once, for all clones"
        );
        let more = daemon.with_extra(vec!["repo-password-9".to_string()]);
        assert!(!std::sync::Arc::ptr_eq(&daemon.finder, &more.finder));
        assert!(more.needs_scrub("x repo-password-9") && more.needs_scrub("x tok-UNIQUE-1"));
        assert!(!daemon.needs_scrub("x repo-password-9"));
    }

    #[test]
    fn every_form_of_a_secret_and_every_elision_is_found_in_one_pass() {
        let secret = "s3cr3t/tok+en";
        let r = Redactor::new(vec![secret.to_string()]);
        let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
        let forms = [
            format!("x {secret} y"),
            format!("x {b64} y"),
            format!("x {} y", b64.trim_end_matches('=')),
            "x s3cr3t%2Ftok%2Ben y".to_string(),
            format!("x {} y", crate::util::elision(7)),
            "see https://user:pw@example.com/x".to_string(),
        ];
        for (i, text) in forms.iter().enumerate() {
            assert!(r.needs_scrub(text), "{text}");
            let mut scrubbed = text.clone();
            r.scrub_in_place(&mut scrubbed);
            assert_eq!(scrubbed, r.scrub(text));
            // The elision alone cuts no secret here; every other form is replaced.
            assert_eq!(scrubbed.contains(MARK), i != 4, "{scrubbed}");
        }
        let mut clean = "0123456789\n".repeat(2000);
        let before = clean.clone();
        r.scrub_in_place(&mut clean);
        assert!(!r.needs_scrub(&clean));
        assert_eq!(clean, before);
        let none = Redactor::new(Vec::new());
        assert!(none.needs_scrub("see https://user:pw@example.com/x"));
        assert!(
            !none.needs_scrub(&crate::util::elision(7)),
            "no secret to cut"
        );
    }

    #[test]
    fn scrubs_plain_base64_and_urlencoded_forms() {
        let r = Redactor::new(vec!["s3cr3t/tok+en".to_string(), "abc".to_string()]);
        let b64 = base64::engine::general_purpose::STANDARD.encode("s3cr3t/tok+en");
        let text = format!("a s3cr3t/tok+en b {b64} c s3cr3t%2Ftok%2Ben abc");
        let out = r.scrub(&text);
        assert_eq!(out, "a [REDACTED] b [REDACTED] c [REDACTED] abc");
        let mut v = json!({"x": ["s3cr3t/tok+en"], "n": 1});
        r.scrub_value(&mut v);
        assert_eq!(v, json!({"x": ["[REDACTED]"], "n": 1}));
    }

    /// Every spelling of every credential, as the encoders write it inside longer text:
    /// nothing of the secret's own characters is left.
    #[test]
    fn every_spelling_of_each_credential_is_scrubbed() {
        let creds = [
            Credential::new("the hub token", "hub-tok-8c1f2e7a9b"),
            Credential::new("`[env] agent` ANTHROPIC_API_KEY", "sk-ant-api03-x/y+z~9"),
        ];
        let r = Redactor::from_credentials(creds.to_vec());
        assert_eq!(r.credentials(), &creds);
        for c in &creds {
            let v = c.value.as_str();
            let hex: String = v.bytes().map(|b| format!("{b:02x}")).collect();
            let mut spelled = vec![
                v.to_string(),
                crate::util::percent_encode(v),
                crate::util::percent_encode(v).to_ascii_lowercase(),
                hex.clone(),
                hex.to_ascii_uppercase(),
            ];
            for lead in ["", "a", "ab"] {
                let blob = format!("{lead}{v}");
                spelled.push(base64::engine::general_purpose::STANDARD.encode(&blob));
                spelled.push(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&blob));
            }
            for s in spelled {
                let out = r.scrub(&format!("before {s} after"));
                assert!(out.contains(MARK), "{s} -> {out}");
                // At most the characters a base64 alignment shares with its neighbours, and
                // padding.
                let left = out.replace(MARK, "").len() - "before  after".len();
                assert!(left <= 6, "{s} -> {out}");
            }
        }
    }

    #[test]
    fn scrubs_base64_at_every_alignment_inside_a_longer_blob() {
        let secret = "tok-7f3a9c2e1d5b4a68";
        let r = Redactor::new([secret.to_string()]);
        for lead in ["", "a", "ab", "abc", "abcd"] {
            let blob = base64::engine::general_purpose::STANDARD
                .encode(format!("{lead}{secret}tail-bytes"));
            let out = r.scrub(&blob);
            assert!(
                out.contains(MARK),
                "alignment {}: {blob} -> {out}",
                lead.len()
            );
        }
    }

    #[test]
    fn a_secret_cut_by_an_elision_leaves_nothing_of_itself_on_either_side() {
        let secret = "tok-7f3a9c2e1d5b4a68";
        let r = Redactor::new([secret.to_string()]);
        // The cut falls in the middle of the secret: head ends with its start, tail starts
        // with its end, exactly as a head+tail capture would keep them.
        let text = "before tok-7f3a9c\n[… 1000 bytes elided …]\n2e1d5b4a68 after";
        let out = r.scrub(text);
        assert!(!out.contains("7f3a9c"), "{out}");
        assert!(!out.contains("2e1d5b4a68"), "{out}");
        assert!(
            out.starts_with("before ") && out.ends_with(" after"),
            "{out}"
        );
        assert!(out.contains("bytes elided"), "{out}");
        // Ordinary text around a marker is left alone.
        let plain = "ok\n[… 10 bytes elided …]\nfine";
        assert_eq!(r.scrub(plain), plain);
    }

    #[test]
    fn scrubs_url_userinfo_by_shape() {
        let r = Redactor::default();
        assert_eq!(
            r.scrub("fatal: unable to access 'http://user:s3cretpass@127.0.0.1:1/x.git/': refused"),
            "fatal: unable to access 'http://[REDACTED]@127.0.0.1:1/x.git/': refused"
        );
        assert_eq!(
            r.scrub("https://ghp_tok@github.com/a/b and mail a@b.c"),
            "https://[REDACTED]@github.com/a/b and mail a@b.c"
        );
        let mut v = json!({"repo": "https://u:p%40ss@h/r.git"});
        r.scrub_value(&mut v);
        assert_eq!(v, json!({"repo": "https://[REDACTED]@h/r.git"}));
        assert_eq!(r.scrub("https://[REDACTED]@h"), "https://[REDACTED]@h");
    }

    #[test]
    fn partial_suffix_is_the_longest_secret_prefix_at_the_end() {
        let r = Redactor::new(vec!["tok-UNIQUE-1".to_string()]);
        assert_eq!(r.partial_suffix_len("out: tok-UNI"), 7);
        assert_eq!(r.partial_suffix_len("out: t"), 1);
        assert_eq!(
            r.partial_suffix_len("out: tok-UNIQUE-1"),
            0,
            "whole secrets are scrubbed, not held"
        );
        assert_eq!(r.partial_suffix_len("done\n"), 0);
        assert_eq!(r.partial_suffix_len(""), 0);
    }
}

/// A `tracing_subscriber` writer that scrubs secrets from every log line before it is
/// written: defence in depth, so even a careless log statement cannot leak the token.
///
/// Cloning shares the secret list: [`RedactingWriter::set`] on any clone (e.g. once the
/// config file is loaded) applies to all log output from then on.
#[derive(Clone, Default)]
pub struct RedactingWriter {
    redactor: std::sync::Arc<std::sync::RwLock<std::sync::Arc<Redactor>>>,
}

impl RedactingWriter {
    /// A writer scrubbing with `redactor` before writing to stderr.
    pub fn new(redactor: Redactor) -> RedactingWriter {
        let w = RedactingWriter::default();
        w.set(std::sync::Arc::new(redactor));
        w
    }

    /// Replace the secrets scrubbed from logs.
    pub fn set(&self, redactor: std::sync::Arc<Redactor>) {
        *self.redactor.write().expect("redactor lock poisoned") = redactor;
    }

    fn current(&self) -> std::sync::Arc<Redactor> {
        self.redactor
            .read()
            .expect("redactor lock poisoned")
            .clone()
    }
}

/// One event's bytes, scrubbed and written to stderr on drop.
pub struct ScrubbedLine {
    redactor: std::sync::Arc<Redactor>,
    buf: Vec<u8>,
}

impl std::io::Write for ScrubbedLine {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ScrubbedLine {
    fn drop(&mut self) {
        use std::io::Write;
        let text = String::from_utf8_lossy(&self.buf);
        let clean = self.redactor.scrub(&text);
        let _ = std::io::stderr().lock().write_all(clean.as_bytes());
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactingWriter {
    type Writer = ScrubbedLine;

    fn make_writer(&'a self) -> Self::Writer {
        ScrubbedLine {
            redactor: self.current(),
            buf: Vec::with_capacity(256),
        }
    }
}
