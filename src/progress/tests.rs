//! The sink's unit tests: bounded streams, scrubbing, merging and own-frame events.

use super::*;

#[test]
fn stream_text_is_bounded_and_keeps_the_tail() {
    let s = ProgressSink::new(1024);
    for i in 0..100_000 {
        s.stream(EventKind::Stdout, &format!("{i}\n"));
    }
    let ev = s.take_event().unwrap();
    let text = ev["text"].as_str().unwrap();
    assert!(text.len() <= 1024 + 64, "{}", text.len());
    assert!(text.ends_with("99999\n"));
    assert!(text.contains("elided"));
    assert!(s.take_event().is_none());
}

#[test]
fn a_secret_split_across_chunks_or_cut_by_the_cap_never_leaves_in_pieces() {
    let s = ProgressSink::new(256);
    s.set_redactor(Arc::new(Redactor::new(vec!["tok-UNIQUE-1".to_string()])));
    s.stream(EventKind::Stdout, "a tok-UN");
    assert_eq!(s.take_event().unwrap()["text"], "a ");
    s.stream(EventKind::Stdout, "IQUE-1 b\n");
    assert_eq!(s.take_event().unwrap()["text"], "[REDACTED] b\n");
    for _ in 0..200 {
        s.stream(EventKind::Stdout, "x tok-UNIQUE-1\n");
    }
    let text = s.take_event().unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!text.contains("UNIQUE"), "{text}");
}

#[test]
fn the_tap_sees_events_only_after_scrubbing_and_the_observer_before() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let shown = Arc::new(Mutex::new(Vec::new()));
    let s = {
        let shown = shown.clone();
        ProgressSink::with_observer(1024, move |e| shown.lock().unwrap().push(e.text.clone()))
    };
    s.set_redactor(Arc::new(Redactor::new(vec!["tok-UNIQUE-1".to_string()])));
    let tapped = seen.clone();
    s.set_tap(move |e| tapped.lock().unwrap().push(e.text.clone()));
    s.emit(ProgressEvent::status("key tok-UNIQUE-1"));
    assert_eq!(*seen.lock().unwrap(), ["key [REDACTED]"]);
    assert_eq!(
        *shown.lock().unwrap(),
        ["key tok-UNIQUE-1"],
        "the local display is unchanged"
    );
}

#[test]
fn structured_events_are_merged_not_lost() {
    let s = ProgressSink::new(8192);
    for i in 0..40 {
        s.emit(
            ProgressEvent::new(EventKind::VerificationCheckResult, format!("check {i}"))
                .with("attempt", 1),
        );
    }
    let ev = s.take_merged().unwrap();
    assert_eq!(ev["event_type"], "verification_check_result");
    let text = ev["text"].as_str().unwrap();
    for i in 0..40 {
        assert!(text.contains(&format!("check {i}")), "lost check {i}");
    }
}

#[test]
fn merged_events_keep_their_own_timestamps() {
    let s = ProgressSink::new(8192);
    for (i, ts) in [1_000_i64, 2_000, 3_000].into_iter().enumerate() {
        let mut ev = ProgressEvent::new(EventKind::ToolCall, format!("call {i}"));
        ev.timestamp = ts;
        s.emit(ev);
    }
    let v = s.take_event().unwrap();
    let stamps: Vec<i64> = v["merged_events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["timestamp"].as_i64().unwrap())
        .collect();
    assert_eq!(stamps, [1_000, 2_000, 3_000]);
    assert_eq!(
        v["timestamp"], 3_000,
        "the frame carries its newest event's time"
    );
}

/// The demo's "6 events in one frame" reached the hub as `[status] running claude`: the
/// retry that started was hidden. A merged frame (the batch a terminal frame carries)
/// takes the retry's shape and text first, and the status lines stay readable after it.
#[test]
fn a_merged_frame_leads_with_its_most_important_event() {
    let s = ProgressSink::new(8192);
    s.emit(ProgressEvent::status("retry budget: 3 corrective retries"));
    s.emit(
        ProgressEvent::new(
            EventKind::VerificationRetryStart,
            "Verification retry 1/3: fixing 1 failed check",
        )
        .with("attempt", 1)
        .with("max_retries", 3),
    );
    s.emit(ProgressEvent::status("running claude"));
    s.stream(EventKind::Token, "thinking");
    let v = s.take_merged().unwrap();
    assert_eq!(v["event_type"], "verification_retry_start", "{v}");
    assert_eq!(
        (v["attempt"].clone(), v["max_retries"].clone()),
        (1.into(), 3.into())
    );
    let text = v["text"].as_str().unwrap();
    assert!(
        text.starts_with("Verification retry 1/3: fixing 1 failed check\n"),
        "{text}"
    );
    for other in [
        "retry budget: 3 corrective retries",
        "running claude",
        "thinking",
    ] {
        assert!(text.contains(other), "{other} lost: {text}");
    }
    assert_eq!(v["merged_events"].as_array().unwrap().len(), 3);
    // Among equals the newest leads; an error outranks a status line and a check.
    s.emit(ProgressEvent::new(
        EventKind::VerificationRetryComplete,
        "Retry 1/3 complete",
    ));
    s.emit(ProgressEvent::new(
        EventKind::VerificationRetryStart,
        "Verification retry 2/3",
    ));
    s.emit(ProgressEvent::status("running claude"));
    assert_eq!(
        s.take_merged().unwrap()["text"]
            .as_str()
            .unwrap()
            .lines()
            .next(),
        Some("Verification retry 2/3")
    );
    s.emit(ProgressEvent::new(
        EventKind::VerificationCheckResult,
        "check: fail",
    ));
    s.emit(ProgressEvent::new(EventKind::Error, "ollama call failed"));
    s.emit(ProgressEvent::status("still working"));
    assert_eq!(s.take_merged().unwrap()["event_type"], "error");
}

/// However long the merged text, the leading event's text is kept and the rest keeps
/// its tail, within the cap.
#[test]
fn the_leading_text_survives_the_cap() {
    let s = ProgressSink::new(256);
    s.emit(ProgressEvent::new(
        EventKind::VerificationRetryStart,
        "RETRY-STARTS",
    ));
    for i in 0..30 {
        s.emit(ProgressEvent::status(format!("status line number {i:02}")));
    }
    let text = s.take_merged().unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.starts_with("RETRY-STARTS\n"), "{text}");
    assert!(text.ends_with("status line number 29"), "{text}");
    assert!(text.len() <= 256 + 64, "{}", text.len());
}

#[test]
fn folded_events_keep_their_fields() {
    let s = ProgressSink::new(8192);
    for i in 0..40u32 {
        s.emit(
            ProgressEvent::new(EventKind::VerificationCheckResult, format!("check {i}"))
                .with("attempt", 1)
                .with("check_status", if i % 2 == 0 { "pass" } else { "fail" })
                .with("index", i),
        );
    }
    let ev = s.take_merged().unwrap();
    let mut seen: Vec<u64> = Vec::new();
    for m in ev["merged_events"].as_array().unwrap() {
        seen.push(m["index"].as_u64().unwrap());
        for f in m["folded_events"].as_array().into_iter().flatten() {
            assert!(f["check_status"].is_string(), "{f}");
            seen.push(f["index"].as_u64().unwrap());
        }
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..40).collect::<Vec<u64>>(),
        "every event's fields arrive"
    );
}

/// Issue 44: a retry's verdict and the next retry's start, milliseconds apart, always
/// shared a frame led by the start; a reader of the §6 fields never saw the verdict (nor
/// a check result) as an event. Each now leads a frame of its own, carrying what came
/// before it; the stream goes with the first frame.
#[test]
fn each_verdict_retry_start_and_check_result_is_a_frame_of_its_own() {
    let s = ProgressSink::new(8192);
    let verdict = |run: u32| {
        ProgressEvent::new(
            EventKind::VerificationRetryComplete,
            format!("run {run} verdict"),
        )
        .with("run_number", run)
    };
    let check = |name: &str| {
        ProgressEvent::new(EventKind::VerificationCheckResult, format!("{name}: fail"))
            .with("check_status", "fail")
            .with("check_type", name)
    };
    s.emit(ProgressEvent::status("running claude"));
    s.stream(EventKind::Token, "thinking");
    s.emit(check("file_exists"));
    s.emit(verdict(1));
    s.emit(
        ProgressEvent::new(EventKind::VerificationRetryStart, "Verification retry 1/5")
            .with("attempt", 1),
    );
    s.emit(ProgressEvent::new(EventKind::ToolCall, "edit greeting.txt"));
    s.emit(check("command_succeeds"));
    s.emit(verdict(2));
    assert!(s.own_frame_pending());
    let mut frames = Vec::new();
    while let Some(f) = s.take_event() {
        frames.push(f);
    }
    let types: Vec<&str> = frames
        .iter()
        .map(|f| f["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "verification_check_result",
            "verification_retry_complete",
            "verification_retry_start",
            "verification_check_result",
            "verification_retry_complete"
        ]
    );
    // Each carries its own fields and leads with its own text.
    assert_eq!(frames[0]["check_type"], "file_exists");
    assert_eq!(
        frames[0]["text"], "file_exists: fail\nrunning claude\nthinking",
        "the stream rides with the first frame"
    );
    assert_eq!(frames[0]["merged_events"].as_array().unwrap().len(), 2);
    assert_eq!(
        (frames[1]["run_number"].clone(), frames[1]["text"].clone()),
        (1.into(), "run 1 verdict".into())
    );
    assert!(frames[1].get("merged_events").is_none());
    assert_eq!(frames[2]["attempt"], 1);
    assert_eq!(frames[3]["check_type"], "command_succeeds");
    assert!(frames[3]["text"]
        .as_str()
        .unwrap()
        .ends_with("edit greeting.txt"));
    assert_eq!(
        (frames[4]["run_number"].clone(), frames[4]["text"].clone()),
        (2.into(), "run 2 verdict".into())
    );
    assert!(!s.pending() && !s.own_frame_pending());
    // Without an own-frame event everything pending is still one frame, ranked.
    s.emit(ProgressEvent::status("a"));
    s.emit(ProgressEvent::new(EventKind::Error, "b"));
    s.emit(ProgressEvent::status("c"));
    let f = s.take_event().unwrap();
    assert_eq!(f["event_type"], "error");
    assert_eq!(f["merged_events"].as_array().unwrap().len(), 3);
    assert!(s.take_event().is_none());
}
