//! Figure 14: the push scan (`git::secrets::scan`), what it costs a publication. It calls the
//! library directly on a local repository (no daemon, no network): every object a push of
//! the change would send, enumerated against the base (`rev-list --objects`), streamed raw
//! (`cat-file --batch`) and searched for five credentials in every spelling and every shape.
//! Two changes: an everyday one (a few files edited and added in a 2,000-file repository)
//! and a large one (64 MiB of new text). For comparison, what git alone takes to list and
//! stream the same objects, and to write the `-U0` diff the scan used to read.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hub_sidecar::config::Config;
use hub_sidecar::git::secrets;
use hub_sidecar::git::GitRunner;
use hub_sidecar::process::ChildEnv;
use hub_sidecar::redact::known::Credential;
use tokio_util::sync::CancellationToken;

use crate::harness::{Row, Stats};

/// Runs per change; the median is reported.
const RUNS: usize = 5;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@x"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(out.status.success(), "git {args:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Lines of ordinary-looking text, `bytes` long, different for each `seed`.
fn text(seed: u64, bytes: usize) -> String {
    let words = [
        "fn", "let", "match", "return", "value", "config", "error", "result", "self", "path",
        "state", "task", "=", "{", "}", "(", ")", "&", "42", "\"ok\"",
    ];
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut s = String::with_capacity(bytes + 80);
    while s.len() < bytes {
        for _ in 0..10 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s.push_str(words[(x >> 33) as usize % words.len()]);
            s.push(' ');
        }
        s.push('\n');
    }
    s
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Wall time of `sh -c script` in `dir`.
fn time_sh(dir: &Path, script: &str) -> Duration {
    let t = Instant::now();
    let ok = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .status()
        .expect("run sh")
        .success();
    assert!(ok, "{script}");
    t.elapsed()
}

pub(crate) async fn push_scan() -> Vec<Row> {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = dir.path();
    git(repo, &["init", "-q"]);
    for d in 0..20 {
        let sub = repo.join(format!("src/m{d}"));
        std::fs::create_dir_all(&sub).expect("write the fixture");
        for f in 0..100 {
            std::fs::write(sub.join(format!("f{f}.rs")), text(d * 1000 + f, 2_000))
                .expect("write the fixture");
        }
    }
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "base"]);
    let base = git(repo, &["rev-parse", "HEAD"]);

    // Everyday: ten files edited, five added, in three directories.
    for f in 0..10 {
        let p = repo.join(format!("src/m3/f{f}.rs"));
        let mut t = std::fs::read_to_string(&p).expect("write the fixture");
        t.push_str(&text(90_000 + f, 1_500));
        std::fs::write(p, t).expect("write the fixture");
    }
    for f in 0..5 {
        std::fs::write(
            repo.join(format!("src/m7/new{f}.rs")),
            text(91_000 + f, 4_000),
        )
        .expect("write the fixture");
    }
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "everyday"]);
    let everyday = git(repo, &["rev-parse", "HEAD"]);

    // Large: 64 files of 1 MiB of new text.
    let big = repo.join("data");
    std::fs::create_dir_all(&big).expect("write the fixture");
    for f in 0..64 {
        std::fs::write(big.join(format!("d{f}.txt")), text(95_000 + f, 1 << 20))
            .expect("write the fixture");
    }
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "large"]);
    let large = git(repo, &["rev-parse", "HEAD"]);

    let cfg = Config::default();
    let runner = GitRunner::new(&cfg, &ChildEnv::inherit(), CancellationToken::new());
    let creds: Vec<Credential> = [
        ("the hub token", "hub-token-4f9a1c77e2"),
        ("a `secrets` value", "listed/secret+value=9"),
        ("`[env] agent` ANTHROPIC_API_KEY", "sk-ant-api03-Zq7_key~x"),
        ("`[env] publish` GH_TOKEN", "gh-publish-8d2b6e0f31"),
        ("the agent login", "oauth-access-5c3e9a1b7d"),
    ]
    .map(|(s, v)| Credential::new(s, v))
    .to_vec();

    let mut rows = Vec::new();
    for (name, from, to) in [
        ("everyday change (15 files, ~55 KB new)", &base, &everyday),
        ("large change (64 MiB of new text)", &everyday, &large),
    ] {
        let tips = vec![from.clone()];
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..RUNS {
            let t = Instant::now();
            let report = secrets::scan(repo, &runner, to, &tips, &cfg.publish, &creds)
                .await
                .expect("scan");
            times.push(seconds(t.elapsed()) * 1000.0);
            assert!(report.findings.is_empty(), "{:?}", report.findings);
            bytes = report.bytes;
        }
        let stats = Stats::new(times);
        let git_alone = time_sh(
            repo,
            &format!("git rev-list --objects {to} --not {from} | git cat-file '--batch=%(objectname) %(objecttype) %(objectsize) %(rest)' > /dev/null"),
        );
        let diff = time_sh(
            repo,
            &format!("git diff -U0 --text --no-renames {from} {to} > /dev/null"),
        );
        let mib = bytes as f64 / (1 << 20) as f64;
        rows.push(Row::new(
            &format!("15. push scan: {name}"),
            "~200 MiB/s",
            "—",
            format!(
                "{:.1} ms median (min {:.1} / max {:.1}) for {:.2} MiB of objects: {:.0} MiB/s end to end; git alone lists and streams them in {:.1} ms, writes the old `-U0` diff in {:.1} ms",
                stats.median(),
                stats.p(0.0),
                stats.max(),
                mib,
                mib / (stats.median() / 1000.0),
                seconds(git_alone) * 1000.0,
                seconds(diff) * 1000.0,
            ),
            None,
        ));
    }
    // The search alone, the objects' bytes already in memory: what the scanner itself reads.
    let rules =
        hub_sidecar::redact::scan::Rules::new(&creds, cfg.publish.allow_set()).expect("rules");
    let files: Vec<Vec<u8>> = (0..64)
        .map(|f| std::fs::read(big.join(format!("d{f}.txt"))).expect("read the fixture"))
        .collect();
    let mut times = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        let mut scanner = hub_sidecar::redact::scan::Scanner::new(&rules);
        for (i, f) in files.iter().enumerate() {
            scanner.begin_object(format!("data/d{i}.txt"), true);
            for chunk in f.chunks(16 * 1024) {
                scanner.feed(chunk);
            }
        }
        let report = scanner.finish();
        assert!(report.findings.is_empty());
        times.push(seconds(t.elapsed()) * 1000.0);
    }
    let stats = Stats::new(times);
    rows.push(Row::new(
        "15. push scan: the search alone (64 MiB in memory, 16 KiB chunks)",
        "~200 MiB/s",
        "—",
        format!(
            "{:.0} ms median (min {:.0} / max {:.0}): {:.0} MiB/s",
            stats.median(),
            stats.p(0.0),
            stats.max(),
            64.0 / (stats.median() / 1000.0)
        ),
        None,
    ));
    rows
}
