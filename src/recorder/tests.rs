//! Unit tests of the recorder: redaction before the disk, bounds, retention, torn records.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::json;

use super::story::{self, TaskStory};
use super::*;
use crate::executor::{ExecOutcome, ExecStatus};
use crate::progress::ProgressEvent;

const SECRET: &str = "tok-SECRET-4711";

fn task(id: &str, description: &str) -> Task {
    Task::from_value(json!({"task_id": id, "description": description})).unwrap()
}

fn cfg(max_task_bytes: u64) -> RecorderConfig {
    RecorderConfig {
        max_task_bytes: Some(max_task_bytes),
        ..RecorderConfig::default()
    }
}

/// Run `f` against a task record under `root`, then wait until everything is on disk.
async fn record(root: &Path, cfg: RecorderConfig, id: &str, f: impl FnOnce(&TaskRecord)) -> String {
    let (rec, writer) = Recorder::start(root.to_path_buf(), cfg);
    let redactor = Arc::new(Redactor::new(vec![SECRET.to_string()]));
    let t = rec.open(
        &task(id, &format!("use {SECRET} carefully")),
        Some("claude"),
        redactor,
    );
    f(&t);
    drop(t);
    drop(rec);
    writer.await.unwrap();
    std::fs::read_to_string(root.join(dir_name(id)).join(RECORD_FILE)).unwrap()
}

/// The retention rule applied to what is on disk (the running writer applies it to its
/// index): scan, pick, remove. Returns what went.
fn prune(
    root: &Path,
    max_tasks: usize,
    max_total_bytes: u64,
    keep: &HashSet<String>,
) -> std::io::Result<Vec<String>> {
    let doomed = over_retention(scan(root)?, max_tasks, max_total_bytes, keep);
    for name in &doomed {
        std::fs::remove_dir_all(root.join(name))?;
    }
    Ok(doomed)
}

#[tokio::test]
async fn secrets_never_reach_the_disk_even_split_across_stream_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let text = record(dir.path(), cfg(1 << 20), "t1", |r| {
        r.attempt_start(1, &format!("prompt with {SECRET}"));
        // The secret arrives in two pieces, each harmless alone.
        r.on_event(&ProgressEvent::new(EventKind::Stdout, "key=tok-SECR"));
        r.on_event(&ProgressEvent::new(EventKind::Stdout, "ET-4711 done\n"));
        r.on_event(&ProgressEvent::status(format!("status {SECRET}")));
        let mut out = ExecOutcome::new(ExecStatus::Failed, format!("out {SECRET}"), None);
        out.error = Some(format!("error {SECRET}"));
        r.attempt_end(1, &out);
    })
    .await;
    assert!(
        !text.contains("SECR"),
        "a secret or part of it on disk:\n{text}"
    );
    assert!(!text.contains("4711"), "{text}");
    let s = TaskStory::parse(&text);
    assert_eq!(s.task_id, "t1");
    assert_eq!(s.executor.as_deref(), Some("claude"));
    assert_eq!(s.task["description"], "use [REDACTED] carefully");
    let a = &s.attempts[0];
    assert_eq!(a.prompt.as_deref(), Some("prompt with [REDACTED]"));
    assert_eq!(a.output, "key=[REDACTED] done\n");
    assert_eq!(a.execution.as_ref().unwrap()["error"], "error [REDACTED]");
}

#[tokio::test]
async fn output_and_events_stop_at_max_task_bytes_but_decisions_and_results_stay() {
    let dir = tempfile::tempdir().unwrap();
    let text = record(dir.path(), cfg(64 * 1024), "big", |r| {
        r.attempt_start(1, "p");
        for i in 0..20_000 {
            r.on_event(&ProgressEvent::new(
                EventKind::Stdout,
                format!("line {i} {}\n", "x".repeat(40)),
            ));
            if i % 10 == 0 {
                r.on_event(&ProgressEvent::status(format!("tick {i}")));
            }
        }
        r.attempt_end(
            1,
            &ExecOutcome::new(ExecStatus::Succeeded, String::new(), None),
        );
        r.final_decision(1, "retries_exhausted", json!({}));
        r.terminal(&crate::hub::proto::Outbound::task_failed(
            "big", 1, "gave up",
        ));
    })
    .await;
    // ~1 MB of output was produced; the record keeps the bound plus the small fixed records.
    assert!(text.len() < 64 * 1024 + 16 * 1024, "{} bytes", text.len());
    let s = TaskStory::parse(&text);
    assert!(s.truncated);
    assert_eq!(s.stop.as_ref().unwrap()["decision"], "retries_exhausted");
    assert_eq!(s.status, "failed");
    let out = &s.attempts[0].output;
    assert!(out.starts_with("line 0 "), "the head is kept");
    assert!(out.contains("bytes elided"), "the cut is marked");
    assert!(
        out.ends_with(&format!("line 19999 {}\n", "x".repeat(40))),
        "the end of the output is kept: {}",
        &out[out.len().saturating_sub(200)..]
    );
}

#[test]
fn a_torn_last_line_is_skipped_and_the_task_shows_as_unfinished() {
    let text = concat!(
        "{\"ts\":1000,\"kind\":\"assigned\",\"task_id\":\"c\",\"generation\":2,\"executor\":\"shell\",\"task\":{}}\n",
        "{\"ts\":1500,\"kind\":\"attempt_start\",\"attempt\":1,\"prompt\":\"echo hi\"}\n",
        "{\"ts\":1600,\"kind\":\"output\",\"attempt\":1,\"stream\":\"stdout\",\"text\":\"hi\\n\",\"elided_before\":0}\n",
        "{\"ts\":1700,\"kind\":\"attem",
    );
    let s = TaskStory::parse(text);
    assert_eq!(s.status, "unfinished");
    assert_eq!(s.unreadable_lines, 1);
    assert_eq!(s.attempts.len(), 1);
    assert_eq!(s.attempts[0].output, "hi\n");
    assert_eq!(s.summary().duration_ms, 600);
}

/// A task record dir with `bytes` of content, last written `age_s` seconds ago.
fn fake_record(root: &Path, name: &str, bytes: usize, age_s: u64) {
    let d = root.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let f = std::fs::File::create(d.join(RECORD_FILE)).unwrap();
    f.set_len(bytes as u64).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(age_s))
        .unwrap();
}

fn names(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn retention_by_count_removes_the_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    for (i, age) in [50, 40, 30, 20, 10].iter().enumerate() {
        fake_record(dir.path(), &format!("t{i}"), 100, *age);
    }
    let removed = prune(dir.path(), 3, u64::MAX, &HashSet::new()).unwrap();
    assert_eq!(removed, ["t1", "t0"]);
    assert_eq!(names(dir.path()), ["t2", "t3", "t4"]);
}

#[test]
fn retention_by_total_size_removes_the_oldest_first_and_keeps_open_records() {
    let dir = tempfile::tempdir().unwrap();
    fake_record(dir.path(), "old-open", 4000, 100);
    fake_record(dir.path(), "old", 4000, 90);
    fake_record(dir.path(), "mid", 4000, 50);
    fake_record(dir.path(), "new", 4000, 10);
    let keep: HashSet<String> = ["old-open".to_string()].into();
    // 16 KB on disk, 10 KB allowed: the two newest fit, the older closed one goes, the
    // open one (still being written) stays whatever its age.
    let removed = prune(dir.path(), 100, 10_000, &keep).unwrap();
    assert_eq!(removed, ["old"]);
    assert_eq!(names(dir.path()), ["mid", "new", "old-open"]);
}

#[tokio::test]
async fn the_writer_applies_retention_when_a_task_record_closes() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..4 {
        fake_record(dir.path(), &format!("old{i}"), 10, 100 + i);
    }
    let c = RecorderConfig {
        max_tasks: 2,
        ..RecorderConfig::default()
    };
    // When the first task wrote, retention cut the four old records to two.
    record(dir.path(), c, "fresh", |r| r.cancelled("test")).await;
    let left = names(dir.path());
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&"fresh".to_string()), "{left:?}");
    assert!(
        left.contains(&"old0".to_string()),
        "the newest old one stays: {left:?}"
    );
}

#[test]
fn dir_names_are_safe() {
    assert_eq!(dir_name("a/../b c"), "a_.._b_c");
    assert_eq!(dir_name(".."), "_");
    assert_eq!(dir_name(""), "_");
}

#[tokio::test]
async fn the_summary_skips_output_but_agrees_with_the_full_story() {
    let dir = tempfile::tempdir().unwrap();
    record(dir.path(), cfg(1 << 20), "sum", |r| {
        r.attempt_start(1, "p");
        // Output that mentions the marker the summary skips by: it stays text.
        r.on_event(&ProgressEvent::new(
            EventKind::Stdout,
            "\"kind\":\"output\"\n",
        ));
        let mut out = ExecOutcome::new(ExecStatus::Succeeded, String::new(), None);
        out.cost_usd = 0.25;
        r.attempt_end(1, &out);
        r.final_decision(1, "retries_exhausted", json!({}));
    })
    .await;
    let list = story::recent(dir.path(), 10).unwrap();
    let full = TaskStory::load(dir.path(), "sum").unwrap();
    assert_eq!(full.attempts[0].output, "\"kind\":\"output\"\n");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].task_id, "sum");
    assert_eq!(list[0].attempts, 1);
    assert_eq!(list[0].cost_usd, 0.25);
    assert_eq!(list[0].status, full.summary().status);
}

#[tokio::test]
async fn a_secret_cut_by_a_chunk_boundary_is_held_back_then_redacted_whole() {
    let dir = tempfile::tempdir().unwrap();
    let text = record(dir.path(), cfg(1 << 20), "edge", |r| {
        r.attempt_start(1, "p");
        // A full chunk ending in the start of the secret: written now, minus that start.
        let filler = "y".repeat(STREAM_CHUNK);
        r.on_event(&ProgressEvent::new(
            EventKind::Stdout,
            format!("{filler}tok-SEC"),
        ));
        r.on_event(&ProgressEvent::new(EventKind::Stdout, "RET-4711 end\n"));
        r.attempt_end(
            1,
            &ExecOutcome::new(ExecStatus::Succeeded, String::new(), None),
        );
    })
    .await;
    assert!(
        !text.contains("tok-SEC") && !text.contains("RET-4711"),
        "{text}"
    );
    let out = &TaskStory::parse(&text).attempts[0].output;
    assert!(
        out.ends_with("y[REDACTED] end\n"),
        "{}",
        &out[out.len() - 40..]
    );
    // It really was written in two pieces.
    assert_eq!(text.matches("\"kind\":\"output\"").count(), 2, "{text}");
}

/// Retention while the daemon runs works from the writer's index (no walk of the records per
/// task): the count and the bytes it tracks for what it appended must match what is on disk.
#[tokio::test]
async fn retention_across_tasks_of_one_run_keeps_the_newest_by_count_and_bytes() {
    async fn run(root: &Path, cfg: RecorderConfig, n: usize) {
        let (rec, writer) = Recorder::start(root.to_path_buf(), cfg);
        let redactor = Arc::new(Redactor::new(vec![SECRET.to_string()]));
        for i in 0..n {
            let t = rec.open(
                &task(&format!("t{i}"), "same size"),
                Some("claude"),
                redactor.clone(),
            );
            t.cancelled("test");
            // Closing sends `Done`: the one writer applies retention before it sees the next
            // task's first line.
            drop(t);
        }
        drop(rec);
        writer.await.unwrap();
    }
    let by_count = tempfile::tempdir().unwrap();
    let c = RecorderConfig {
        max_tasks: 3,
        ..RecorderConfig::default()
    };
    run(by_count.path(), c, 5).await;
    assert_eq!(names(by_count.path()), ["t2", "t3", "t4"]);

    let one = tempfile::tempdir().unwrap();
    run(one.path(), RecorderConfig::default(), 1).await;
    let size = std::fs::metadata(one.path().join("t0").join(RECORD_FILE))
        .unwrap()
        .len();
    let by_bytes = tempfile::tempdir().unwrap();
    let c = RecorderConfig {
        max_total_bytes: Some(size * 5 / 2),
        ..RecorderConfig::default()
    };
    run(by_bytes.path(), c, 5).await;
    assert_eq!(names(by_bytes.path()), ["t3", "t4"]);
}

/// Output chunks larger than the kept tail, past the bound: the tail is the last 8 KiB of the
/// output and the count of what was left out is exact (the path a 150 MB flood takes).
#[tokio::test]
async fn big_chunks_past_the_bound_keep_the_exact_tail_and_count() {
    let dir = tempfile::tempdir().unwrap();
    let text = record(dir.path(), cfg(1024), "flood", |r| {
        r.attempt_start(1, "p");
        for c in ['a', 'b', 'c'] {
            r.on_event(&ProgressEvent::new(
                EventKind::Stdout,
                c.to_string().repeat(20_000),
            ));
        }
        r.attempt_end(
            1,
            &ExecOutcome::new(ExecStatus::Succeeded, String::new(), None),
        );
    })
    .await;
    let s = TaskStory::parse(&text);
    assert!(s.truncated);
    let out = &s.attempts[0].output;
    assert!(
        out.ends_with(&"c".repeat(STREAM_CHUNK)),
        "{}",
        &out[..200.min(out.len())]
    );
    assert!(!out.contains(&"c".repeat(STREAM_CHUNK + 1)));
    assert!(
        out.contains(&(60_000 - STREAM_CHUNK).to_string()),
        "{}",
        &out[..200.min(out.len())]
    );
}

/// Every line counts against the per-task bound, not only output and events: a task that
/// asked the proxy for thousands of long host names, with a long prompt and a verification
/// of many observations, still leaves a record near its bound (its story shrunk, the
/// network summary trimmed and the rest counted), so retention never has to remove other
/// tasks' records for it.
#[tokio::test]
async fn every_line_counts_against_the_per_task_bound() {
    use crate::sandbox::proxy::{HostUse, OTHER_TARGETS};
    const BOUND: u64 = 64 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let hosts: Vec<HostUse> = (0..3_000)
        .map(|i| HostUse {
            target: format!("{i}-{}.test:443", "h".repeat(250)),
            allowed: false,
            connections: 1,
            bytes_up: 0,
            bytes_down: 0,
            unreachable: 0,
            last_error: None,
        })
        .collect();
    let text = record(dir.path(), cfg(BOUND), "many-hosts", |r| {
        r.attempt_start(1, &"p".repeat(100_000));
        for i in 0..2_000 {
            r.on_event(&ProgressEvent::status(format!("tick {i} {}", "x".repeat(100))));
        }
        r.verification(
            1,
            json!({"checks": (0..500).map(|i| json!({"name": i, "output": "o".repeat(5_000)})).collect::<Vec<_>>()}),
            &(0..1_000).map(|i| format!("changed file {i}")).collect::<Vec<_>>(),
        );
        r.network(&hosts);
        r.final_decision(1, "retries_exhausted", json!({}));
        r.terminal(&crate::hub::proto::Outbound::task_failed(
            "many-hosts",
            1,
            "gave up",
        ));
    })
    .await;
    // The shrunk story lines past the bound: a few of [`bound::SHRUNK_STRING`] each.
    assert!(
        (text.len() as u64) < BOUND + 48 * 1024,
        "{} bytes against a bound of {BOUND}",
        text.len()
    );
    let s = TaskStory::parse(&text);
    assert!(s.truncated);
    assert_eq!(s.status, "failed", "the end of the story is kept");
    let others = s
        .network
        .iter()
        .find(|h| h["target"] == OTHER_TARGETS)
        .expect("the hosts left out are counted");
    let listed = s.network.len() as u64 - 1;
    assert_eq!(others["connections"], json!(3_000 - listed));
}
