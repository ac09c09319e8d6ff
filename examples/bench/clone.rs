//! Figure 12: many consecutive tasks on one managed clone. Each task's preparation (fetch,
//! reset, clean, task branch, sandbox) must cost the same whether it is the 2nd or the 50th
//! task on that clone: nothing may accumulate (branches, objects, workspace litter).

use std::path::Path;

use hub_sidecar::mock_hub::sample_shell_task;
use serde_json::json;

use crate::harness::*;
use crate::Opts;

/// `git ARGS` in `cwd` with a fixed identity; panics with git's stderr when it fails (the
/// fixture is broken, not the daemon).
fn git(cwd: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "bench: git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A bare remote at `dir/remote.git` seeded with `files` small files on `main`, a realistic
/// tree to reset and clean rather than an empty one.
fn seeded_remote(dir: &Path, files: usize) -> std::path::PathBuf {
    git(
        dir,
        &[
            "init",
            "-q",
            "--bare",
            "--initial-branch=main",
            "remote.git",
        ],
    );
    git(dir, &["clone", "-q", "remote.git", "seed"]);
    let seed = dir.join("seed");
    for i in 0..files {
        let sub = seed.join(format!("src/m{}", i % 20));
        std::fs::create_dir_all(&sub).expect("seed dir");
        std::fs::write(sub.join(format!("f{i}.txt")), format!("file {i}\n")).expect("seed file");
    }
    git(&seed, &["checkout", "-q", "-b", "main"]);
    git(&seed, &["add", "-A"]);
    git(&seed, &["commit", "-q", "-m", "seed"]);
    git(&seed, &["push", "-q", "origin", "main"]);
    dir.join("remote.git")
}

/// Figure 12: `n` sequential shell tasks on one managed clone (git workflow on: a task branch
/// each). Preparation is timed as assign (driver's clock, just before the frame is sent) →
/// the task's command started (`date +%s%N` printed by the task, same clock): accept,
/// workspace fetch + reset + clean, task branch, sandbox and the spawn itself.
pub(crate) async fn managed_clone(o: &Opts, n: usize) -> Vec<Row> {
    let fixture = tempfile::tempdir().expect("temp dir");
    let remote = seeded_remote(fixture.path(), 500);
    let hub = hub_unlimited().await;
    let extra = format!("{UNTHROTTLED}[git]\nhub_api_url = \"http://127.0.0.1:1\"\n");
    let d = Daemon::start(o, &hub, &extra, &[]);
    identified(&hub).await;
    let mut prep = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("clone-{i}");
        let mut task = sample_shell_task(&id, "date +%s%N");
        task["repo"] = json!(remote.display().to_string());
        let sent = epoch_ms_f64();
        hub.assign(task);
        let done = hub
            .wait_for(
                |f| {
                    f["task_id"] == id.as_str()
                        && (f["type"] == "task_complete" || f["type"] == "task_failed")
                },
                T,
            )
            .await
            .expect("managed clone: terminal frame");
        let started_ns: f64 = done["result"]["output"]
            .as_str()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("bench: task {id} printed no timestamp: {done}"));
        prep.push(started_ns / 1e6 - sent);
        settle().await;
    }
    d.stop().await;
    let first_task = prep[0];
    let reuse = &prep[1..];
    let k = 5.min(reuse.len());
    let first = Stats::new(reuse[..k].to_vec());
    let last = Stats::new(reuse[reuse.len() - k..].to_vec());
    let all = Stats::new(reuse.to_vec());
    vec![Row::new(
        &format!("12. {n} tasks on one managed clone: assign → command started (tasks 2–{n})"),
        "flat: last 5 ≤ 1.5 × first 5",
        "—",
        format!(
            "{:.2}× (last 5 median {:.1} ms / first 5 median {:.1} ms); all: min {:.1} / median {:.1} / max {:.1} ms; the clone itself (task 1) {:.0} ms",
            last.median() / first.median(),
            last.median(),
            first.median(),
            all.p(0.0),
            all.median(),
            all.max(),
            first_task
        ),
        Some(last.median() <= 1.5 * first.median()),
    )]
}
