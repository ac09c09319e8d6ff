//! Nothing a task leaves crashes the daemon (issue 43, row 1): a 30,000-deep nest of
//! directories in the task's TMPDIR and in its temp workspace is removed after the result
//! (a recursive removal overflowed the blocking thread's stack and aborted the daemon), the
//! daemon takes the next task, and after a SIGKILL with such a nest left behind, the next
//! start sweeps it and works.
//!
//! The daemon runs as the real binary (an abort is its exit, not the test's), its state on a
//! tmpfs where there is one (`/dev/shm`): 30,000 directories take minutes on a busy ext4.

use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions};

use crate::containment::supported;
use crate::harness::Setup;
use crate::util::{wait_until, T};

/// Make a 30,000-deep nest of directories under each directory named, then print `NESTED`.
/// Made as 30 chains of 1,000
/// joined end to end: Landlock checks every call against the whole path up, so 30,000
/// `mkdir`s one below the other would take minutes under it.
const NEST: &str = r#"use strict;
my ($how, @roots) = @ARGV;
my $down = join("/", ("d") x 1000);
for my $r (@roots) {
  for my $c (0 .. 29) {
    chdir $r or die "chdir $r: $!";
    mkdir "c$c" or die "mkdir: $!"; chdir "c$c" or die;
    for (1 .. 1000) { mkdir "d" or die "mkdir: $!"; chdir "d" or die "chdir: $!" }
  }
  chdir $r or die;
  for my $c (reverse 0 .. 28) { rename "c" . ($c + 1), "c$c/$down/next" or die "rename: $!" }
}
print "NESTED\n";
"#;

fn has_perl() -> bool {
    // The the task that nests.
    crate::util::require("perl", crate::util::missing_tool("perl"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_30000_deep_nest_a_task_leaves_does_not_stop_the_daemon_nor_its_restart() {
    if !supported() || !has_perl() {
        return;
    }
    let mut dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    // Removed the daemon's way (the temp dir's own removal is std's, recursive), also when
    // the test fails; after the daemon (declared before it, dropped after it).
    dir.disable_cleanup(true);
    let _cleanup = Cleanup(dir.path().to_path_buf());
    let s = Setup {
        hub: MockHub::start(MockHubOptions::default()).await.unwrap(),
        dir,
    };
    let probe = crate::util::probe(s.dir());
    let script = probe.join("nest.pl");
    std::fs::write(&script, NEST).unwrap();
    let mut h = s.start_bin("test-token", "", &[]).await;
    let nest = |how: &str| {
        format!(
            "echo tmp=$TMPDIR; perl '{}' {how} \"$TMPDIR\" \"$PWD\"",
            script.display()
        )
    };
    // The nest in its TMPDIR and in its (temp) workspace, both removed after the result.
    h.assign(sample_shell_task("deep-1", &nest("go")));
    let done = terminal(&h, "deep-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(done["result"]["output"]
        .as_str()
        .unwrap_or_default()
        .contains("NESTED"));
    // The daemon is still there and takes the next task.
    h.assign(sample_shell_task("deep-2", "echo next; echo tmp=$TMPDIR"));
    let next = terminal(&h, "deep-2").await;
    assert_eq!(next["type"], "task_complete", "{next}");
    // Both tasks' TMPDIRs go; what may stay is the next task's, made ahead of it (named so,
    // and one at most: see `runner::ahead`).
    let tmp = s_state(&h).join("tmp");
    let used = [tmp_of(&done), tmp_of(&next)];
    let only_ahead = || {
        let names: Vec<String> = std::fs::read_dir(&tmp)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.len() <= 1 && names.iter().all(|n| n.starts_with("ahead."))
    };
    assert!(
        wait_until(|| only_ahead() && used.iter().all(|u| !u.exists()), T).await,
        "the TMPDIRs stay: {:?}",
        std::fs::read_dir(&tmp).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    // Killed, with such nests left where a killed task's TMPDIR and workspace are: the next
    // start sweeps them and works.
    h.bin_mut().kill9().await;
    let state = s_state(&h);
    let left = [
        state.join("tmp/killed-task"),
        state.join("work/killed-task"),
    ];
    for d in &left {
        std::fs::create_dir_all(d).unwrap();
    }
    let made = std::process::Command::new("perl")
        .arg(&script)
        .arg("go")
        .args(&left)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    h.start_bin_again(&[]);
    h.identified_nth(2).await;
    h.assign(sample_shell_task("deep-3", "echo after"));
    let after = terminal(&h, "deep-3").await;
    assert_eq!(after["type"], "task_complete", "{after}");
    for d in &left {
        assert!(!d.exists(), "{} was not swept", d.display());
    }
    h.finish().await;
}

/// The TMPDIR a task printed (`tmp=…`).
fn tmp_of(done: &serde_json::Value) -> std::path::PathBuf {
    let out = done["result"]["output"].as_str().unwrap_or_default();
    out.lines()
        .find_map(|l| l.strip_prefix("tmp="))
        .unwrap_or_else(|| panic!("the task printed its TMPDIR: {out}"))
        .into()
}

/// `id`'s terminal frame, or the daemon's log (30,000 directories take a while to make).
async fn terminal(h: &crate::harness::Harness, id: &str) -> serde_json::Value {
    h.hub()
        .wait_for(
            |f| (f["type"] == "task_complete" || f["type"] == "task_failed") && f["task_id"] == id,
            std::time::Duration::from_secs(120),
        )
        .await
        .unwrap_or_else(|| {
            panic!(
                "no terminal frame for {id}; daemon log:\n{}",
                h.bin().logs()
            )
        })
}

/// The binary daemon's state directory (as [`crate::util::write_config`] writes it).
fn s_state(h: &crate::harness::Harness) -> std::path::PathBuf {
    let text = std::fs::read_to_string(h.config_path()).unwrap();
    let line = text.lines().find(|l| l.starts_with("state_dir")).unwrap();
    std::path::PathBuf::from(line.split('"').nth(1).unwrap())
}

/// Removes the test's directory with the daemon's iterative removal.
struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = hub_sidecar::sandbox::teardown::remove_path(
            &self.0,
            &mut hub_sidecar::sandbox::teardown::Budget::unlimited(),
        );
    }
}
