//! The next task's directories and sandbox, made while the daemon is idle
//! (`src/runner/ahead.rs`), on the real binary: a task without a repository runs in them,
//! confined as any task; each serves one task; their name is kept with the task, so a
//! daemon killed mid-task finds the task's directories again after its restart.

use hub_sidecar::mock_hub::sample_shell_task;
use serde_json::{json, Value};

use crate::harness::Harness;
use crate::util::*;

/// The daemon's log says what it made ahead (`runner::ahead`, at debug).
const LOG: (&str, &str) = ("RUST_LOG", "info,hub_sidecar::runner::ahead=debug");

/// The names the daemon made ahead and said are ready, so far.
fn ready(h: &Harness) -> Vec<String> {
    h.bin()
        .logs()
        .lines()
        .filter(|l| l.contains("sandbox are ready"))
        .filter_map(|l| l.split("name=").nth(1)?.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Wait until the daemon has made a next task's directories and sandbox that are none of
/// `not`; their name.
async fn next_ready(h: &Harness, not: &[String]) -> String {
    let mut found = Vec::new();
    let made = wait_until(
        || {
            found = ready(h).into_iter().filter(|n| !not.contains(n)).collect();
            !found.is_empty()
        },
        T,
    )
    .await;
    assert!(made, "nothing made ahead:\n{}", h.bin().logs());
    assert_eq!(found.len(), 1, "one made ahead at a time: {found:?}");
    assert!(h.dir().join("work").join(&found[0]).is_dir());
    found.remove(0)
}

fn unchecked(id: &str, cmd: &str) -> Value {
    let mut t = sample_shell_task(id, cmd);
    t["verification_steps"] = json!([]);
    t
}

/// The value of the line `key=…` a task printed.
fn printed(done: &Value, key: &str) -> String {
    let out = done["result"]["output"].as_str().unwrap_or_default();
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("the task printed {key}=: {out}"))
        .to_string()
}

/// A task runs in what was made ahead of it (its workspace and TMPDIR are those), sees of
/// the state directory only its own (the view made ahead hides as one made on the spot),
/// and the next task gets another, made after the first ended: never the same twice.
#[tokio::test]
async fn a_task_runs_in_what_was_made_ahead_of_it_and_the_next_gets_another() {
    if !crate::containment::supported() {
        return;
    }
    let h = Harness::setup()
        .await
        .start_bin("test-token", "", &[LOG])
        .await;
    let state = h.dir().to_path_buf();
    let first = next_ready(&h, &[]).await;
    let look = "echo pwd=$PWD; echo tmp=$TMPDIR; echo home=$HOME; \
                echo work=$(ls -A ../ 2>/dev/null | tr '\\n' ' '); \
                echo seen=$(ls -A \"$TMPDIR\" | tr '\\n' ' '); echo x > \"$TMPDIR/left\"";
    h.assign(unchecked("first", look));
    let done = h.completed("first").await;
    assert_eq!(
        printed(&done, "pwd"),
        state.join("work").join(&first).display().to_string()
    );
    let tmp = state.join("tmp").join(&first);
    assert_eq!(printed(&done, "tmp"), tmp.display().to_string());
    assert!(
        printed(&done, "home").starts_with(&tmp.display().to_string()),
        "the task's HOME is in its TMPDIR"
    );
    let work = printed(&done, "work");
    assert!(
        work.split_whitespace().all(|n| n == first),
        "the task sees no other workspace under the state directory: {work}"
    );
    assert_eq!(done["result"]["containment"], "strict", "{done:#}");

    // The next is made once the first has ended, under another name; the first's are gone.
    let second = next_ready(&h, std::slice::from_ref(&first)).await;
    assert!(
        wait_until(
            || !tmp.exists() && !state.join("work").join(&first).exists(),
            T
        )
        .await
    );
    h.assign(unchecked("second", look));
    let done = h.completed("second").await;
    assert_eq!(
        printed(&done, "pwd"),
        state.join("work").join(&second).display().to_string()
    );
    assert!(
        !printed(&done, "seen").contains("left"),
        "the second task saw the first's TMPDIR"
    );
    h.finish().await;
}

/// The operator logs in again while a sandbox waits, made ahead with the old login: the task
/// it serves gets the new login's copy, not the one of when its sandbox was made, and its
/// redactor knows the new token (the handover's checks, `Ahead::hand_over`).
#[tokio::test]
async fn a_new_login_after_the_sandbox_was_made_reaches_its_task_and_its_redactor() {
    if !crate::containment::supported() {
        return;
    }
    let s = Harness::setup().await;
    let template = s.dir().join("operator-claude");
    std::fs::create_dir_all(&template).unwrap();
    let file = template.join(".credentials.json");
    let login = |n: &str, token: &str| {
        format!("{{\"login\":\"{n}\",\"claudeAiOauth\":{{\"accessToken\":\"{token}\"}}}}")
    };
    let (one, two) = (
        "sk-ant-oat01-one-0123456789abcdef",
        "sk-ant-oat01-two-fedcba9876543210",
    );
    std::fs::write(&file, login("one", one)).unwrap();
    let config_dir = template.display().to_string();
    let h = s
        .start_bin("test-token", "", &[LOG, ("CLAUDE_CONFIG_DIR", &config_dir)])
        .await;
    let show = "cat \"$CLAUDE_CONFIG_DIR/.credentials.json\"";

    let first = next_ready(&h, &[]).await;
    h.assign(unchecked("first", show));
    let output = |done: Value| {
        done["result"]["output"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let out = output(h.completed("first").await);
    assert!(
        out.contains(r#""login":"one""#) && out.contains("[REDACTED]") && !out.contains(one),
        "{out}"
    );

    next_ready(&h, std::slice::from_ref(&first)).await;
    std::fs::write(&file, login("two", two)).unwrap();
    h.assign(unchecked("second", show));
    let out = output(h.completed("second").await);
    assert!(
        out.contains(r#""login":"two""#),
        "the task got the login of when its sandbox was made: {out}"
    );
    assert!(
        !out.contains(two) && out.contains("[REDACTED]"),
        "the new token leaked: {out}"
    );
    h.finish().await;
}

/// A daemon killed mid-task, with the hub killed too (it still holds the task for this
/// agent): on restart the task's directories made ahead are kept (their name is on disk
/// with the task) and the task runs again in them, where its first run left its file.
#[tokio::test]
async fn a_restarted_daemon_finds_the_directories_made_ahead_of_its_task() {
    if !crate::containment::supported() {
        return;
    }
    let mut h = Harness::setup()
        .await
        .start_bin("test-token", "", &[LOG])
        .await;
    let state = h.dir().to_path_buf();
    let made = next_ready(&h, &[]).await;
    let marker = h.probe().join("runs");
    let cmd = format!(
        "echo pwd=$PWD; if [ -e earlier ]; then echo SAW-EARLIER; fi; : > earlier; \
         echo run >> {}; sleep 2; echo recovered",
        marker.display()
    );
    h.assign(sample_shell_task("crash-me", &cmd));
    h.accepted("crash-me").await;
    assert!(wait_until(|| marker.exists(), T).await);
    h.stop().await;
    h.bin_mut().kill9().await;
    h.restart().await.unwrap();
    h.start_bin_again(&[LOG]);
    h.frame("task_recovering", "crash-me").await;
    let done = h
        .wait_for_type("task_complete", T)
        .await
        .expect("the task runs again and completes");
    let out = done["result"]["output"].as_str().unwrap_or_default();
    assert!(out.contains("SAW-EARLIER"), "{out}");
    assert_eq!(
        printed(&done, "pwd"),
        state.join("work").join(&made).display().to_string()
    );
    h.finish().await;
}
