//! Figures about a task's output: a progress flood (4), a trickle then a second task (5),
//! and 150 MB of output through the capped capture (10).

use std::time::{Duration, Instant};

use hub_sidecar::mock_hub::{sample_shell_task, Recorded};

use crate::harness::*;
use crate::Opts;

/// Figure 4: `seq 1 200000` with the hub's limiter on and default daemon settings.
pub(crate) async fn flood(o: &Opts) -> Vec<Row> {
    let hub = hub_default().await;
    let d = Daemon::start(o, &hub, "resource_report_interval_secs = 3600\n", &[]);
    identified(&hub).await;
    let hwm_before = d.status_kb("VmHWM");
    let rss_before = d.status_kb("VmRSS");
    let (anon_before, file_before) = (d.status_kb("RssAnon"), d.status_kb("RssFile"));
    hub.assign(sample_shell_task("flood", "seq 1 200000"));
    let (done, anon_max, file_max) = d
        .sampling_split(
            Duration::from_millis(1),
            hub.wait_for_type("task_complete", T),
        )
        .await;
    let Some(done) = done else {
        let log = d.dir.path().join("daemon.log");
        let seen: Vec<String> = hub
            .received()
            .iter()
            .map(|f| type_of(f).to_string())
            .collect();
        panic!(
            "flood: no task_complete in {T:?}; the hub received {seen:?} ({} rate_limited); daemon log:\n{}",
            hub.rate_limited_count(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
    };
    let hwm = d.status_kb("VmHWM");
    let frames = hub.frames();
    let assigned = at_of(&frames, false, "task_assign", Some("flood")).expect("assign");
    let accepted = at_of(&frames, true, "task_accepted", Some("flood")).expect("accepted");
    let completed = at_of(&frames, true, "task_complete", Some("flood")).expect("complete");
    let wall = ms(completed - assigned);
    let to_accept = ms(accepted - assigned);
    let progress: Vec<&Recorded> = frames
        .iter()
        .filter(|r| r.inbound && type_of(&r.frame) == "task_progress")
        .collect();
    let bytes: usize = progress.iter().map(|r| r.frame.to_string().len()).sum();
    let out = done["result"]["output"].as_str().unwrap_or("");
    let intact = out.starts_with("1\n2\n") && out.trim_end().ends_with("200000");
    let limited = hub.rate_limited_count();
    d.stop().await;
    vec![
        Row::new(
            "4a. `seq 1 200000`: assign → task_complete wall",
            "≤ 100 ms",
            "90 ms",
            format!(
                "{wall:.1} ms (assign → accepted {to_accept:.1} ms; {} progress frames, {bytes} B; result.output {} B)",
                progress.len(),
                out.len()
            ),
            Some(wall <= 100.0),
        ),
        Row::new(
            "4b. `seq 1 200000`: peak RSS (VmHWM)",
            "≤ 15 MB",
            "63 MB",
            format!(
                "{:.1} MB (before the task {:.1} MB, peak so far {:.1}; sampled peaks anon {:.1} from {:.1}, file {:.1} from {:.1})",
                hwm as f64 / 1024.0,
                rss_before as f64 / 1024.0,
                hwm_before as f64 / 1024.0,
                anon_max as f64 / 1024.0,
                anon_before as f64 / 1024.0,
                file_max as f64 / 1024.0,
                file_before as f64 / 1024.0
            ),
            Some(hwm <= 15 * 1024),
        ),
        Row::new(
            "4c. `seq 1 200000`: rate_limited, output head/tail",
            "0, intact",
            "—",
            format!(
                "{limited} rate_limited, output {}",
                if intact { "intact" } else { "BROKEN" }
            ),
            Some(limited == 0 && intact),
        ),
    ]
}

/// Figure 5: a task printing a line every 10 ms for 2 s, then a second task right after its
/// result; limiter on.
pub(crate) async fn trickle(o: &Opts) -> Vec<Row> {
    let hub = hub_default().await;
    let d = Daemon::start(o, &hub, "resource_report_interval_secs = 3600\n", &[]);
    identified(&hub).await;
    hub.assign(sample_shell_task(
        "trickle-1",
        "i=0; while [ $i -lt 200 ]; do i=$((i+1)); echo line $i; sleep 0.01; done",
    ));
    hub.wait_for(
        |f| type_of(f) == "task_complete" && f["task_id"] == "trickle-1",
        T,
    )
    .await
    .expect("first result");
    hub.assign(sample_shell_task("trickle-2", "echo second"));
    hub.wait_for(
        |f| type_of(f) == "task_complete" && f["task_id"] == "trickle-2",
        T,
    )
    .await
    .expect("second result");
    // Both results must also be acknowledged (not dropped by the limiter and re-sent).
    let deadline = Instant::now() + T;
    while (hub.acked_terminal("trickle-1") == 0 || hub.acked_terminal("trickle-2") == 0)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let acked = hub.acked_terminal("trickle-1") == 1 && hub.acked_terminal("trickle-2") == 1;
    let progress = hub.received_of("task_progress").len();
    let limited = hub.rate_limited_count();
    let frames = hub.frames();
    let first = ms(
        at_of(&frames, true, "task_complete", Some("trickle-1")).expect("complete")
            - at_of(&frames, false, "task_assign", Some("trickle-1")).expect("assign"),
    );
    d.stop().await;
    vec![Row::new(
        "5. trickle 10 ms × 2 s, then a second task",
        "0 dropped, both results",
        "loses the result",
        format!(
            "{limited} rate_limited, both results {} (first task {first:.0} ms, {progress} progress frames)",
            if acked { "acked" } else { "NOT acked" }
        ),
        Some(limited == 0 && acked),
    )]
}

/// Figure 10: `seq 1 20000000` (~150 MB of output) through the shell executor with default
/// settings (hub limiter off so the hub's budget is not what is measured): the daemon's peak
/// RSS and assign → complete wall time, against `seq` alone writing into a pipe. Median of
/// `runs` (min–max beside it).
pub(crate) async fn big_output(o: &Opts, runs: usize) -> Vec<Row> {
    let cmd = "seq 1 20000000";
    let mut walls = Vec::new();
    let mut peaks = Vec::new();
    let mut alone = Vec::new();
    let (mut idle, mut anons, mut files) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..runs {
        let t = Instant::now();
        let ok = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{cmd} | cat >/dev/null"))
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "seq alone failed");
        alone.push(ms(t.elapsed()));
        let hub = hub_unlimited().await;
        let d = Daemon::start(o, &hub, UNTHROTTLED, &[]);
        identified(&hub).await;
        let id = format!("big-{r}");
        let idle_kb = d.status_kb("VmRSS");
        hub.assign(sample_shell_task(&id, cmd));
        let (done, anon_max, file_max) = d
            .sampling_split(
                Duration::from_millis(5),
                hub.wait_for_type("task_complete", T * 4),
            )
            .await;
        done.expect("big output: task_complete");
        idle.push(idle_kb as f64 / 1024.0);
        anons.push(anon_max as f64 / 1024.0);
        files.push(file_max as f64 / 1024.0);
        let frames = hub.frames();
        let a = at_of(&frames, false, "task_assign", Some(&id)).expect("assign");
        let c = at_of(&frames, true, "task_complete", Some(&id)).expect("complete");
        walls.push(ms(c - a));
        peaks.push(d.status_kb("VmHWM") as f64 / 1024.0);
        d.stop().await;
    }
    let (w, p, a) = (Stats::new(walls), Stats::new(peaks), Stats::new(alone));
    vec![Row::new(
        &format!("10. `{cmd}` (~150 MB output), median of {runs}"),
        "peak RSS ≤ 8 MB, wall ≤ 1.5 × seq alone",
        "—",
        format!(
            "peak RSS {:.1} MB ({:.1}–{:.1}; before the task {:.1}; sampled peaks anon {:.1}, file {:.1}); wall {:.0} ms ({:.0}–{:.0}) vs seq | cat {:.0} ms ({:.0}–{:.0}): {:.2}×",
            p.median(),
            p.p(0.0),
            p.max(),
            Stats::new(idle).median(),
            Stats::new(anons).median(),
            Stats::new(files).median(),
            w.median(),
            w.p(0.0),
            w.max(),
            a.median(),
            a.p(0.0),
            a.max(),
            w.median() / a.median()
        ),
        Some(p.median() <= 8.0 && w.median() <= 1.5 * a.median()),
    )]
}
