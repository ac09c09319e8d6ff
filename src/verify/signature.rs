//! Failure signatures: a stable digest of "what failed and how", used by the loop to spot
//! no-progress (same failure, workspace untouched) and oscillation (A, B, A).
//!
//! Output is normalised first so that a re-run differing only in timings, temp paths, ids
//! or line numbers has the same signature.

use std::sync::OnceLock;

use regex::Regex;
use sha2::{Digest, Sha256};

use super::checks::status_str;
use super::report::{CheckStatus, VerificationReport};

struct Patterns {
    ansi: Regex,
    uuid: Regex,
    timestamp: Regex,
    temp_path: Regex,
    duration: Regex,
    hex: Regex,
    line_col: Regex,
    spaces: Regex,
}

fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let re = |s: &str| Regex::new(s).expect("static regex");
        Patterns {
            ansi: re(r"\x1b\[[0-9;?]*[ -/]*[@-~]"),
            uuid: re(r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"),
            timestamp: re(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?"),
            temp_path: re(r#"(/tmp|/var/tmp|/var/folders|/private/var/folders|\$TMPDIR)/[^\s:'"`)\]]*"#),
            duration: re(
                r"(?i)\b\d+(\.\d+)?\s?(ns|us|µs|ms|s|sec|secs|seconds?|m|min|mins|minutes?)\b",
            ),
            hex: re(r"(?i)\b(0x)?[0-9a-f]*[0-9][0-9a-f]*[a-f][0-9a-f]*\b|\b(0x)?[0-9a-f]*[a-f][0-9a-f]*[0-9][0-9a-f]*\b"),
            line_col: re(r":\d+(:\d+)?\b"),
            spaces: re(r"[ \t]+"),
        }
    })
}

/// Strip what varies between identical failures: ANSI codes, UUIDs, timestamps, temp paths,
/// durations (`0.12s`, `12ms`), hex ids (≥ 7 chars mixing digits and letters), `:line:col`.
pub fn normalise(output: &str) -> String {
    let p = patterns();
    let s = p.ansi.replace_all(output, "");
    let s = p.uuid.replace_all(&s, "<uuid>");
    let s = p.timestamp.replace_all(&s, "<time>");
    let s = p.temp_path.replace_all(&s, "<tmp>");
    let s = p.duration.replace_all(&s, "<dur>");
    let s = p.hex.replace_all(&s, |c: &regex::Captures| {
        if c[0].len() >= 7 {
            "<hex>".to_string()
        } else {
            c[0].to_string()
        }
    });
    let s = p.line_col.replace_all(&s, ":<n>");
    let s = p.spaces.replace_all(&s, " ");
    s.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The signature of a report's failures: type, target, status and normalised output of each
/// non-passing check, hashed. Equal signatures mean "the same failure".
pub fn failure_signature(report: &VerificationReport) -> String {
    let mut h = Sha256::new();
    h.update(status_str_report(report).as_bytes());
    for c in report
        .checks
        .iter()
        .filter(|c| c.status != CheckStatus::Pass)
    {
        h.update(b"\x00");
        h.update(c.check_type.as_str().as_bytes());
        h.update(b"\x1f");
        h.update(c.target.as_bytes());
        h.update(b"\x1f");
        h.update(status_str(c.status).as_bytes());
        h.update(b"\x1f");
        h.update(normalise(&c.output).as_bytes());
    }
    let d = h.finalize();
    d.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// Whether a non-passing check of `report` was killed by a signal the daemon did not send
/// (SIGINT, SIGKILL, SIGTERM on the check or on the child of its `sh`, which then prints
/// `Terminated`/`Killed` and exits 128 + n): a shutdown reaching the check before the task's
/// cancellation does. Such a run says nothing about the work.
pub fn interrupted(report: &VerificationReport) -> bool {
    const MARKS: [&str; 6] = [
        "[killed by signal 2]",
        "[killed by signal 9]",
        "[killed by signal 15]",
        "[exit code 130]",
        "[exit code 137]",
        "[exit code 143]",
    ];
    report
        .checks
        .iter()
        .filter(|c| c.status != CheckStatus::Pass)
        .any(|c| {
            let tail = c.output.trim_end();
            MARKS.iter().any(|m| tail.ends_with(m))
        })
}

fn status_str_report(r: &VerificationReport) -> String {
    serde_json::to_value(r.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::report::CheckResult;

    #[test]
    fn normaliser_strips_what_varies() {
        let a = "\x1b[31mFAILED\x1b[0m tests::it at src/lib.rs:12:5 in 0.12s (id 3f2a9c1d7e, run 1b4e28ba-2fa1-11d2-883f-0016d3cca427) /tmp/.tmpAbC123/x.rs took 12ms at 2026-11-22T05:03:32Z";
        let b = "FAILED tests::it at src/lib.rs:40:1 in 3.5s (id 99aa00ffee, run 6ba7b810-9dad-11d1-80b4-00c04fd430c8) /tmp/.tmpZZZ999/x.rs took 7 ms at 2026-11-23T11:00:00Z";
        assert_eq!(normalise(a), normalise(b));
        let n = normalise(a);
        assert!(n.contains("FAILED tests::it"), "{n}");
        assert!(!n.contains('\x1b'));
        assert!(
            n.contains("<dur>")
                && n.contains("<hex>")
                && n.contains("<uuid>")
                && n.contains("<tmp>"),
            "{n}"
        );
        // Real content differences survive.
        assert_ne!(normalise("expected 3 got 4"), normalise("expected 3 got 5"));
        assert_eq!(normalise("word cafe stays"), "word cafe stays");
    }

    fn report(output: &str, status: CheckStatus) -> VerificationReport {
        VerificationReport::from_checks(
            "t",
            1,
            0,
            5,
            100,
            vec![
                CheckResult {
                    check_type: "test_passes".into(),
                    target: "auto".into(),
                    description: None,
                    status,
                    output: output.into(),
                    duration_ms: 3,
                    flaky: false,
                    cost_usd: 0.0,
                    tokens_in: 0,
                    tokens_out: 0,
                },
                CheckResult {
                    check_type: "file_exists".into(),
                    target: "a".into(),
                    description: None,
                    status: CheckStatus::Pass,
                    output: "differs freely".into(),
                    duration_ms: 1,
                    flaky: false,
                    cost_usd: 0.0,
                    tokens_in: 0,
                    tokens_out: 0,
                },
            ],
            false,
        )
    }

    #[test]
    fn signature_ignores_timings_but_not_substance() {
        let a = failure_signature(&report("1 failed in 0.31s", CheckStatus::Fail));
        let b = failure_signature(&report("1 failed in 2.02s", CheckStatus::Fail));
        let c = failure_signature(&report("2 failed in 0.31s", CheckStatus::Fail));
        let d = failure_signature(&report("1 failed in 0.31s", CheckStatus::Error));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }
}
