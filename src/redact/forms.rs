//! The spellings of one secret that text can carry: what the redactor replaces and what the
//! staged-change scan refuses. A tool that prints or writes a credential seldom does so only
//! verbatim: an `Authorization: Basic` header, a config file or a JWT holds it in base64, a
//! URL percent-encoded, a dump in hex.

use base64::Engine;

/// How a form spells its secret (named in a refusal, never the value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// As it is.
    Verbatim,
    /// Base64, standard alphabet (`+/`), at any byte alignment, padded or not.
    Base64,
    /// Base64, URL-safe alphabet (`-_`, JWTs and URLs), at any byte alignment.
    Base64Url,
    /// Percent-encoded (`%2F` and `%2f`).
    UrlEncoded,
    /// Hexadecimal, lower or upper case.
    Hex,
}

impl Encoding {
    /// The word a report uses.
    pub fn describe(self) -> &'static str {
        match self {
            Encoding::Verbatim => "verbatim",
            Encoding::Base64 => "base64",
            Encoding::Base64Url => "URL-safe base64",
            Encoding::UrlEncoded => "URL-encoded",
            Encoding::Hex => "hex",
        }
    }
}

/// The shortest form worth matching: shorter ones would match ordinary words.
pub const MIN_FORM: usize = 6;

/// Every form of `secret` (none when the secret itself is shorter than [`MIN_FORM`]), each
/// at least that long, each once (the first encoding
/// that spells it wins: a secret of unreserved characters is its own URL encoding).
pub fn forms(secret: &str) -> Vec<(String, Encoding)> {
    if secret.len() < MIN_FORM {
        return Vec::new();
    }
    let bytes = secret.as_bytes();
    let mut out: Vec<(String, Encoding)> = Vec::new();
    let mut add = |s: String, e: Encoding| {
        if s.len() >= MIN_FORM && !out.iter().any(|(n, _)| *n == s) {
            out.push((s, e));
        }
    };
    add(secret.to_string(), Encoding::Verbatim);
    for (engine, enc) in [
        (&base64::engine::general_purpose::STANDARD, Encoding::Base64),
        (
            &base64::engine::general_purpose::URL_SAFE,
            Encoding::Base64Url,
        ),
    ] {
        let full = engine.encode(bytes);
        add(full.trim_end_matches('=').to_string(), enc);
        add(full, enc);
        for core in base64_cores(engine, bytes) {
            add(core, enc);
        }
    }
    let url = crate::util::percent_encode(secret);
    add(lower_escapes(&url), Encoding::UrlEncoded);
    add(url, Encoding::UrlEncoded);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    add(hex.to_ascii_uppercase(), Encoding::Hex);
    add(hex, Encoding::Hex);
    out
}

/// The base64 of `secret` as it appears inside a longer base64 stream at each of the three
/// byte alignments: only the characters that depend on the secret's bits alone.
fn base64_cores(engine: &base64::engine::GeneralPurpose, secret: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    for k in 0..3usize {
        let mut buf = vec![0u8; k];
        buf.extend_from_slice(secret);
        let enc = engine.encode(&buf);
        let start = (4 * k).div_ceil(3);
        let end = 4 * (k + secret.len()) / 3;
        if end > start + 7 {
            out.push(enc[start..end].to_string());
        }
    }
    out
}

/// `%2F` → `%2f`: percent-encoders differ in the case of their hex digits.
fn lower_escapes(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let esc = rest.get(i..i + 3).unwrap_or(&rest[i..]);
        out.push_str(&esc.to_ascii_lowercase());
        rest = &rest[i + esc.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every spelling, built from the encoders themselves: each is found among the forms as
    /// a substring of what the encoder writes, at every alignment inside a longer blob.
    #[test]
    fn every_encoding_of_a_secret_contains_one_of_its_forms() {
        let secret = "s3cr3t/tok+en?~é";
        let f = forms(secret);
        let holds = |text: &str, want: Encoding| {
            f.iter()
                .any(|(n, e)| *e == want && text.contains(n.as_str()))
        };
        assert!(holds(&format!("x{secret}y"), Encoding::Verbatim));
        for lead in ["", "a", "ab", "abc"] {
            let blob = format!("{lead}{secret}tail");
            let std = base64::engine::general_purpose::STANDARD.encode(&blob);
            let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&blob);
            // Where the alphabets agree (no `+/`, no `-_`) one form serves both.
            let b64 = |t: &str| holds(t, Encoding::Base64) || holds(t, Encoding::Base64Url);
            assert!(b64(&std), "{lead:?} {std}");
            assert!(b64(&url), "{lead:?} {url}");
        }
        let pct = crate::util::percent_encode(secret);
        assert!(holds(&pct, Encoding::UrlEncoded), "{pct}");
        assert!(holds(&pct.to_ascii_lowercase(), Encoding::UrlEncoded));
        let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
        assert!(holds(&hex, Encoding::Hex));
        assert!(holds(&hex.to_ascii_uppercase(), Encoding::Hex));
        // Each spelling once, none shorter than the floor.
        let mut names: Vec<&str> = f.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), f.len());
        assert!(f.iter().all(|(n, _)| n.len() >= MIN_FORM));
        assert!(
            forms("abcde").is_empty(),
            "too short to be told from a word"
        );
    }
}
