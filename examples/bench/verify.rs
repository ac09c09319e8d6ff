//! Figures about verification: a check's deadline killing its process tree (6) and the
//! engine's overhead around the checks (7).

use std::process::Stdio;
use std::time::{Duration, Instant};

use hub_sidecar::mock_hub::sample_shell_task;
use serde_json::{json, Value};

use crate::harness::*;
use crate::Opts;

/// Figure 6: a `sleep 60` check under `verification_timeout_ms: 2000`: deadline → the whole
/// tree (the `sh` and its `sleep`) gone.
pub(crate) async fn check_timeout(o: &Opts) -> Vec<Row> {
    let hub = hub_unlimited().await;
    let d = Daemon::start(o, &hub, UNTHROTTLED, &[]);
    identified(&hub).await;
    let mut samples = Vec::new();
    for run in 0..3 {
        // A unique duration finds exactly this run's processes; `; true` keeps `sh` alive as
        // the parent, so there is a tree to kill, not a single exec'd `sleep`.
        let arg = format!("60.{}{run}", std::process::id());
        let mut task = sample_shell_task(&format!("timeout-{run}"), "true");
        task["verification_steps"] =
            json!([{"type": "command_succeeds", "target": format!("sleep {arg}; true")}]);
        task["verification_timeout_ms"] = json!(2000);
        hub.assign(task);
        let deadline = Instant::now() + T;
        while procs_matching(&arg).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Poll tight around the expected deadline: /proc has no event for "process gone".
        while !procs_matching(&arg).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let gone = epoch_ms_f64();
        let done = hub
            .wait_for(
                |f| type_of(f) == "task_complete" && f["task_id"] == format!("timeout-{run}"),
                T,
            )
            .await
            .expect("task_complete");
        let report = &done["verification_report"];
        let started = report["started_at"].as_f64().unwrap_or(f64::NAN);
        // started_at has millisecond resolution: ±1 ms.
        samples.push(gone - (started + 2000.0));
        settle().await;
    }
    d.stop().await;
    let s = Stats::new(samples);
    vec![Row::new(
        "6. check deadline → process tree gone (3 runs)",
        "≤ 200 ms",
        "—",
        format!("median {:.1} ms, max {:.1} ms", s.median(), s.max()),
        Some(s.max() <= 200.0),
    )]
}

/// Figure 7: verification engine overhead with 4 `true` checks: from the report
/// (`duration_ms` − Σ check `duration_ms`, ms resolution) and from the wire (round trip with
/// 4 checks − without, minus 4 bare spawns measured here).
pub(crate) async fn verify_overhead(o: &Opts, n: usize) -> Vec<Row> {
    let hub = hub_unlimited().await;
    let d = Daemon::start(o, &hub, UNTHROTTLED, &[]);
    identified(&hub).await;
    let mut count = 0;
    let mut run = |id: String, checks: usize| {
        let mut task = sample_shell_task(&id, "true");
        task["verification_steps"] = Value::Array(vec![
            json!({"type": "command_succeeds", "target": "true"});
            checks
        ]);
        count += 1;
        (hub.assign(task), count)
    };
    let mut residue = Vec::new();
    let mut with = Vec::new();
    let mut without = Vec::new();
    for i in 0..n {
        for checks in [0usize, 4] {
            let (_, nth) = run(format!("v{checks}-{i}"), checks);
            let done = hub
                .wait_for_nth("task_complete", nth, T)
                .await
                .expect("task_complete");
            settle().await;
            if checks == 4 {
                let r = &done["verification_report"];
                let sum: f64 = r["checks"]
                    .as_array()
                    .map(|c| c.iter().filter_map(|c| c["duration_ms"].as_f64()).sum())
                    .unwrap_or(0.0);
                residue.push(r["duration_ms"].as_f64().unwrap_or(f64::NAN) - sum);
            }
        }
    }
    let frames = hub.frames();
    for i in 0..n {
        for (checks, v) in [(0, &mut without), (4, &mut with)] {
            let id = format!("v{checks}-{i}");
            let a = at_of(&frames, false, "task_assign", Some(&id))
                .expect("the mock recorded the assignment");
            let c = at_of(&frames, true, "task_complete", Some(&id))
                .expect("every timed task completes");
            v.push(ms(c - a));
        }
    }
    d.stop().await;
    let spawn = spawn_cost(50).await;
    let (with, without, residue) = (Stats::new(with), Stats::new(without), Stats::new(residue));
    let per_check = (with.median() - without.median()) / 4.0;
    vec![
        Row::new(
            &format!("7a. verification engine beyond the commands, 4 × `true` (p50 of {n})"),
            "≤ 5 ms",
            "—",
            format!(
                "{:.0} ms report `duration_ms` − Σ checks' `duration_ms` (max {:.0})",
                residue.median(),
                residue.max()
            ),
            Some(residue.median() <= 5.0),
        ),
        Row::new(
            "7b. cost per `command_succeeds` check, from the wire",
            "—",
            "—",
            format!(
                "{per_check:.2} ms/check (round trip +{:.2} ms with 4 checks than with none; a bare `sh -c true` spawn+reap from the driver {:.2} ms)",
                with.median() - without.median(),
                spawn.median()
            ),
            None,
        ),
    ]
}

/// What one `sh -c true` costs to spawn and reap from a tokio runtime, set up like the
/// daemon's checks (own process group, explicit environment and working directory, piped
/// output): the floor under any command check.
pub(crate) async fn spawn_cost(n: usize) -> Stats {
    let cwd = std::env::temp_dir();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let st = tokio::process::Command::new("sh")
            .arg("-c")
            .arg("true")
            .current_dir(&cwd)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .await
            .expect("sh");
        assert!(st.status.success());
        v.push(ms(t.elapsed()));
    }
    Stats::new(v)
}
