//! A stable-toolchain mutation fuzzer for hub frames: the fallback of `scripts/fuzz.sh` when
//! no nightly (cargo-fuzz) is available, and a quick check anywhere.
//!
//! ```sh
//! cargo run --release --example fuzz_frames -- 1000000 [SEED]
//! ```
//!
//! It mutates a seed corpus of real hub frames (byte flips, inserts, deletes, splices,
//! truncation, and structural mutations of the JSON tree: wrong types, huge strings, deep
//! nesting, extreme numbers) and feeds each input to the same check as the cargo-fuzz
//! target (`fuzz/check_frame.rs`). Every panic is caught, counted and saved under
//! `target/fuzz_frames-crashes/`. Exit code 1 when anything crashed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};

// The same check as the cargo-fuzz target: one definition for both fuzzers.
#[path = "../fuzz/check_frame.rs"]
mod check_frame;

fn seeds() -> Vec<Value> {
    let mut assign = hub_sidecar::mock_hub::sample_shell_task("task-1", "echo hi");
    assign["type"] = json!("task_assign");
    assign["verification_steps"] = json!([{"type": "file_exists", "target": "a"}]);
    vec![
        assign,
        json!({"type": "pong", "timestamp": 1}),
        json!({"type": "identified", "agent_id": "a"}),
        json!({"type": "task_ack", "task_id": "t", "status": "complete"}),
        json!({"type": "task_continue", "task_id": "t", "generation": 2}),
        json!({"type": "task_reassign", "task_id": "t"}),
        json!({"type": "task_cancelled", "task_id": "t", "timestamp": 1}),
        json!({"type": "state_report_ack", "task_id": "t", "action": "abort"}),
        json!({"type": "restart_sidecar", "reason": "r"}),
        json!({"type": "rate_limit_warning", "tier": "normal", "remaining": 3, "capacity": 60}),
        json!({"type": "rate_limited", "retry_after_ms": 1000, "tier": "normal"}),
        json!({"type": "error", "error": "task_complete_failed: stale_generation"}),
        json!({"type": "room_message", "text": "hi"}),
    ]
}

fn wild(rng: &mut fastrand::Rng) -> Value {
    match rng.u8(0..12) {
        0 => Value::Null,
        1 => json!(rng.bool()),
        2 => json!(u64::MAX),
        3 => json!(i64::MIN),
        4 => json!(-1),
        5 => json!(1e308),
        6 => json!("x".repeat(rng.usize(0..70_000))),
        7 => json!([]),
        8 => json!({}),
        9 => json!("$(touch /tmp/pwned) ../../etc/passwd \u{0} \u{202e}"),
        10 => {
            let mut v = json!(1);
            for _ in 0..rng.usize(1..140) {
                v = json!([v]);
            }
            v
        }
        _ => json!(rng.i64(..)),
    }
}

/// Replace, drop or add one value somewhere in the tree.
fn mutate_value(v: &mut Value, rng: &mut fastrand::Rng, depth: usize) {
    match v {
        Value::Object(m) if !m.is_empty() && depth < 6 && rng.bool() => {
            let keys: Vec<String> = m.keys().cloned().collect();
            let k = &keys[rng.usize(..keys.len())];
            match rng.u8(0..4) {
                0 => {
                    m.remove(k);
                }
                1 => {
                    m.insert(k.clone(), wild(rng));
                }
                _ => mutate_value(m.get_mut(k).expect("k is one of m's keys"), rng, depth + 1),
            }
        }
        Value::Array(a) if !a.is_empty() && depth < 6 && rng.bool() => {
            let i = rng.usize(..a.len());
            mutate_value(&mut a[i], rng, depth + 1)
        }
        _ => *v = wild(rng),
    }
}

fn mutate_bytes(b: &mut Vec<u8>, rng: &mut fastrand::Rng) {
    for _ in 0..rng.usize(1..6) {
        if b.is_empty() {
            b.push(rng.u8(..));
            continue;
        }
        let i = rng.usize(..b.len());
        match rng.u8(0..6) {
            0 => b[i] ^= 1 << rng.u8(0..8),
            1 => b.insert(i, rng.u8(..)),
            2 => {
                b.remove(i);
            }
            3 => b.truncate(i),
            4 => {
                let tok: &[u8] = [
                    &b"\"task_id\""[..],
                    b"null",
                    b"{",
                    b"[",
                    b"\"",
                    b"\\u0000",
                    b"18446744073709551616",
                ][rng.usize(..7)];
                b.splice(i..i, tok.iter().copied());
            }
            _ => {
                let j = rng.usize(..b.len());
                let (lo, hi) = (i.min(j), i.max(j));
                let chunk = b[lo..hi].to_vec();
                b.splice(i..i, chunk);
            }
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let iterations: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0x5eed);
    let mut rng = fastrand::Rng::with_seed(seed);
    let seeds = seeds();
    let crash_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz_frames-crashes");
    // Findings are reported once each, below; keep the default hook quiet.
    std::panic::set_hook(Box::new(|_| {}));
    let t0 = Instant::now();
    let mut crashes = 0u64;
    for n in 0..iterations {
        let mut v = seeds[rng.usize(..seeds.len())].clone();
        for _ in 0..rng.usize(1..4) {
            mutate_value(&mut v, &mut rng, 0);
        }
        let mut bytes = v.to_string().into_bytes();
        if rng.u8(0..3) == 0 {
            mutate_bytes(&mut bytes, &mut rng);
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if catch_unwind(AssertUnwindSafe(|| check_frame::check(&text))).is_err() {
            crashes += 1;
            let _ = std::fs::create_dir_all(&crash_dir);
            let path = crash_dir.join(format!("crash-{seed}-{n}.txt"));
            let _ = std::fs::write(&path, &bytes);
            eprintln!("crash at iteration {n}: saved {}", path.display());
        }
    }
    println!(
        "fuzz_frames: {iterations} frames, seed {seed}, {crashes} crashes, {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    if crashes > 0 {
        std::process::exit(1);
    }
}
