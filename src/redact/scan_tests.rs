//! The scan, built from the class: each source the daemon knows a credential from × each
//! spelling, in an added line; the same in a removed or context line (not reported); every
//! pattern; an allowed path; a secret straddling a block cut; a path; a commit message; raw
//! objects, tree entry names among them.

use base64::Engine;

use super::*;

fn creds() -> Vec<Credential> {
    [
        ("the hub token", "hub-token-4f9a1c77e2"),
        ("a `secrets` value", "listed/secret+value=9"),
        ("`[env] agent` ANTHROPIC_API_KEY", "sk-ant-api03-Zq7_key~é"),
        ("`[env] publish` GH_TOKEN", "gh-publish-8d2b6e0f31"),
        (
            "the agent login (.credentials.json: claudeAiOauth.accessToken)",
            "oauth-access-5c3e9a1b7d",
        ),
    ]
    .map(|(s, v)| Credential::new(s, v))
    .to_vec()
}

fn rules(allow: &[&str]) -> Rules {
    let mut b = globset::GlobSetBuilder::new();
    for g in allow {
        b.add(
            globset::GlobBuilder::new(g)
                .literal_separator(true)
                .build()
                .unwrap(),
        );
    }
    Rules::new(&creds(), b.build().unwrap()).unwrap()
}

/// `git diff -U0` output adding `lines` to `path` (a new file).
fn diff(path: &str, lines: &[&str]) -> String {
    let mut d = format!(
        "diff --git a/{path} b/{path}\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{} @@\n",
        lines.len()
    );
    for l in lines {
        d.push('+');
        d.push_str(l);
        d.push('\n');
    }
    d
}

fn scan(r: &Rules, streams: &[&str], chunk: usize) -> Report {
    let mut s = Scanner::new(r);
    s.begin_diff();
    for text in streams {
        for piece in text.as_bytes().chunks(chunk.max(1)) {
            s.feed(piece);
        }
    }
    s.finish()
}

/// Every spelling a tool writes, each inside longer text as a tool would write it.
fn spellings(v: &str) -> Vec<(String, &'static str)> {
    let hex: String = v.bytes().map(|b| format!("{b:02x}")).collect();
    let mut out = vec![
        (format!("key = \"{v}\""), "verbatim"),
        (
            format!("url=https://h/?k={}", crate::util::percent_encode(v)),
            "URL-encoded",
        ),
        (format!("0x{hex}"), "hex"),
        (format!("0x{}", hex.to_ascii_uppercase()), "hex"),
    ];
    for lead in ["", "x", "xy"] {
        let blob = format!("{lead}{v}:tail");
        let std = base64::engine::general_purpose::STANDARD.encode(&blob);
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&blob);
        out.push((format!("Authorization: Basic {std}"), "base64"));
        out.push((format!("jwt.{url}.sig"), "URL-safe base64"));
    }
    out
}

#[test]
fn each_credential_in_each_spelling_on_an_added_line_is_found_and_named() {
    let r = rules(&[]);
    for c in creds() {
        for (line, spelling) in spellings(&c.value) {
            let d = diff("src/config.txt", &["ordinary", &line]);
            let rep = scan(&r, &[&d], 4096);
            let want = format!("{} ({spelling})", c.source);
            assert!(
                rep.findings.iter().any(|f| f.path == "src/config.txt"
                    && f.line == 2
                    && f.what.starts_with(&c.source)),
                "{line}: {rep:?}"
            );
            // Where two spellings coincide (a secret of unreserved characters is its own
            // URL encoding, the base64 alphabets agree without `+/-_`) the first is named.
            let named = |f: &Finding| match spelling {
                "URL-encoded" => f.what.starts_with(&c.source),
                "base64" | "URL-safe base64" => {
                    f.what.starts_with(&c.source) && f.what.ends_with("base64)")
                }
                _ => f.what == want,
            };
            assert!(rep.findings.iter().any(named), "{want} in {line}: {rep:?}");
            assert!(
                rep.findings.iter().all(|f| !f.what.contains(&c.value)),
                "a report never holds the value"
            );
        }
    }
}

#[test]
fn only_added_lines_count() {
    let r = rules(&[]);
    let v = &creds()[0].value;
    let d = format!(
        "diff --git a/a.txt b/a.txt\nindex 1..2 100644\n--- a/a.txt\n+++ b/a.txt\n@@ -3,2 +3,1 @@\n-{v}\n- also {v}\n+clean\n\\ No newline at end of file\ndiff --git a/b.txt b/b.txt\ndeleted file mode 100644\n--- a/b.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-{v}\n"
    );
    let rep = scan(&r, &[&d], 7);
    assert!(rep.findings.is_empty(), "{rep:?}");
    // A header-looking added line is content: `+++ x` adds the line `++ x`.
    let d2 = diff("c.txt", &[&format!("++ {v}"), "-- also content"]);
    let rep = scan(&r, &[&d2], 3);
    assert_eq!(rep.findings.len(), 1, "{rep:?}");
    assert_eq!(
        (rep.findings[0].path.as_str(), rep.findings[0].line),
        ("c.txt", 1)
    );
}

#[test]
fn each_pattern_is_found_and_an_allowed_path_lets_only_patterns_through() {
    let samples = [
        "-----BEGIN OPENSSH PRIVATE KEY-----",
        "-----BEGIN RSA PRIVATE KEY-----",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----",
        "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
        "token: ghp_0123456789abcdefghijABCDEFGHIJ012345",
        &format!("github_pat_{}", "A1b2C3d4E5".repeat(8) + "xy"),
        "glpat-abcdefghij0123456789",
        "xoxb-1234567890-abcdefghij",
        &format!("sk-ant-api03-{}", "a1B2_c3-D4".repeat(4)),
        &format!("sk-proj-{}T3BlbkFJ{}", "Ab1".repeat(8), "Cd2".repeat(8)),
    ];
    let r = rules(&["tests/fixtures/**"]);
    for (i, s) in samples.iter().enumerate() {
        let rep = scan(&r, &[&diff("src/main.rs", &[s])], 4096);
        assert_eq!(rep.findings.len(), 1, "{s}: {rep:?}");
        assert_eq!(rep.findings[0].what, PATTERNS[i.saturating_sub(2)].0, "{s}");
        let rep = scan(&r, &[&diff("tests/fixtures/keys/k.pem", &[s])], 4096);
        assert!(rep.findings.is_empty(), "{s}: {rep:?}");
        assert_eq!(rep.allowed, 1);
        // `**` is needed to go deeper, `*` stays in one directory.
        let rep = scan(&r, &[&diff("tests/fixtures2/k.pem", &[s])], 4096);
        assert_eq!(rep.findings.len(), 1, "{s}");
    }
    // A credential the daemon knows is refused in an allowed path too.
    let v = &creds()[2].value;
    let rep = scan(&r, &[&diff("tests/fixtures/k.txt", &[v])], 4096);
    assert_eq!(rep.findings.len(), 1, "{rep:?}");
    // Near misses of every shape are not findings.
    let clean = [
        "-----BEGIN PUBLIC KEY-----",
        "AKIA-not-a-key",
        "ghp_short",
        "sk-ant-short",
        "sk-1234567890abcdefghij",
        "xoxb-short",
    ];
    let rep = scan(&r, &[&diff("src/a.rs", &clean)], 4096);
    assert!(rep.findings.is_empty(), "{rep:?}");
}

#[test]
fn a_secret_straddling_a_block_cut_in_one_long_line_is_found_once() {
    let r = rules(&[]);
    let v = &creds()[4].value;
    for shift in [0usize, 3, 11, 23] {
        let pad = "a".repeat(BLOCK - shift - 1);
        let line = format!("{pad}{v}{}", "b".repeat(2 * BLOCK));
        let rep = scan(&r, &[&diff("big.min.js", &[&line])], 65536);
        assert_eq!(rep.findings.len(), 1, "shift {shift}: {rep:?}");
        assert_eq!(rep.findings[0].line, 1);
    }
    // Many lines over many blocks: the line numbers stay right.
    let mut lines: Vec<String> = (0..40_000)
        .map(|i| format!("line {i} {}", "z".repeat(20)))
        .collect();
    lines[31_234] = format!("x {v} y");
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let rep = scan(&r, &[&diff("many.txt", &refs)], 8192);
    assert_eq!(rep.findings.len(), 1, "{rep:?}");
    assert_eq!(rep.findings[0].line, 31_235);
    assert!(rep.bytes > 1_000_000);
}

#[test]
fn a_path_and_a_commit_message_are_searched_too() {
    let r = rules(&[]);
    let v = &creds()[0].value;
    let quoted = format!(
        "diff --git \"a/x\\t{v}\" \"b/x\\t{v}\"\nnew file mode 100644\n--- /dev/null\n+++ \"b/x\\t{v}\"\n@@ -0,0 +1 @@\n+fine\n"
    );
    let rep = scan(&r, &[&quoted], 5);
    assert_eq!(rep.findings.len(), 1, "{rep:?}");
    // The path is named, the credential in it is not.
    assert_eq!(rep.findings[0].path, "x\t[REDACTED]");
    assert_eq!(rep.findings[0].line, 0);
    let mut s = Scanner::new(&r);
    s.begin_diff();
    s.feed(diff("ok.txt", &["fine"]).as_bytes());
    s.begin_text("(commit message)");
    s.feed(format!("Add things\n\nkey: {v}\n").as_bytes());
    let rep = s.finish();
    assert_eq!(
        rep.findings,
        [Finding {
            path: "(commit message)".into(),
            line: 3,
            what: "the hub token (verbatim)".into()
        }]
    );
}

/// Raw objects: every line of each, a tree's entry names one by one (cut anywhere), a file
/// the operator allows let through only for a pattern, a credential in a name never shown;
/// thousands of objects in one block keep memory bounded and their findings apart.
#[test]
fn raw_objects_and_tree_entry_names_are_searched_and_named() {
    let r = rules(&["fixtures/**"]);
    let v = &creds()[1].value;
    let key = "-----BEGIN OPENSSH PRIVATE KEY-----";
    let mut s = Scanner::new(&r);
    for i in 0..10_000 {
        s.begin_object(format!("f{i}.txt"), true);
        s.feed(b"nothing here");
    }
    s.begin_object("(commit 0123456789ab)".into(), false);
    s.feed(format!("tree 1\nx-extra {v}\n\nmsg\n").as_bytes());
    s.begin_object("fixtures/k.pem".into(), true);
    s.feed(format!("{key}\n").as_bytes());
    s.begin_object("(names in d/)".into(), false);
    for (n, name) in [(1u64, "README".to_string()), (2, format!("a\n{v}.txt"))] {
        s.entry_start(n);
        for piece in name.as_bytes().chunks(3) {
            s.entry_bytes(piece);
        }
        s.entry_end();
    }
    s.begin_object(format!("dir-{v}/x.pem"), true);
    s.feed(format!("ok\n{key}\n").as_bytes());
    let rep = s.finish();
    let what = "a `secrets` value (verbatim)";
    assert_eq!(
        rep.findings,
        [
            Finding {
                path: "(commit 0123456789ab)".into(),
                line: 2,
                what: what.into()
            },
            Finding {
                path: "(names in d/)".into(),
                line: 2,
                what: what.into()
            },
            Finding {
                path: "dir-[REDACTED]/x.pem".into(),
                line: 2,
                what: "a private key block".into()
            },
        ]
    );
    assert_eq!(rep.allowed, 1, "the fixture's key is let through");
    // What is kept per object is bounded by the block, not by the number of objects.
    let mut s = Scanner::new(&r);
    for i in 0..100_000 {
        s.begin_object(format!("f{i}"), true);
        s.feed(&[b'x'; 16]);
    }
    assert!(s.files.len() < MAX_FILES + BLOCK / 16, "{}", s.files.len());
}

/// Issue 43 audit: a quoted path's escape that is not three octal digits is kept, never
/// overflows (it panicked with overflow checks on).
#[test]
fn a_quoted_path_with_a_broken_octal_escape_is_kept_as_written() {
    assert_eq!(unquote(b"\"a\\1 !\""), b"a1 !".to_vec());
    assert_eq!(unquote(b"\"a\\399\""), b"a399".to_vec());
    assert_eq!(unquote(b"\"a\\303\\251\""), "a\u{e9}".as_bytes().to_vec());
    assert_eq!(unquote(b"\"a\\3\""), b"a3".to_vec());
}
