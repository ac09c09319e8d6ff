//! The attack suite: a hostile task (shell stand-in for an agent) and hostile repositories
//! try every way out of containment the daemon knows of; each test checks one is closed.
//!
//! Every test needs what CI has (Linux with Landlock and user namespaces). Where the kernel
//! lacks them, each test is a listed skip (`util::require("confine", …)`), or fails where
//! `HUB_SIDECAR_REQUIRE` names `confine`, as CI does: containment can only be shown where it
//! exists, and CI must be such a place.

use std::path::{Path, PathBuf};

use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions};
use hub_sidecar::sandbox::Support;
use serde_json::{json, Value};

use crate::git::{base_cfg, git, shell_task, terminal, write_exe, Remote};
use crate::harness::Harness;
use crate::util::*;

const TOKEN: &str = "tok-7f3a9c2e1d5b4a68";

/// Why this machine cannot confine tasks (the daemon's own probe of the kernel), if it cannot.
pub(crate) fn cannot_confine() -> Option<String> {
    let missing = Support::probe().missing();
    (!missing.is_empty())
        .then(|| format!("this machine cannot confine tasks: {}", missing.join("; ")))
}

/// The gate of every test that needs containment (`require("confine", …)`): `false` (a
/// listed skip) where this kernel cannot confine, a failure where CI requires it.
#[track_caller]
pub(crate) fn supported() -> bool {
    require("confine", cannot_confine())
}

/// Run one shell task on the real binary started with `config` and `envs`; its output.
async fn run_on_binary(dir: &Path, extra: &str, envs: &[(&str, &str)], cmd: &str) -> (String, Bin) {
    let hub = MockHub::start(MockHubOptions {
        agents: vec![("sidecar-test".into(), TOKEN.into())],
        ..MockHubOptions::default()
    })
    .await
    .unwrap();
    let config = write_config(&hub, dir, TOKEN, extra);
    let bin = Bin::start(dir, &config, envs);
    hub.wait_for_type("identify", T).await.unwrap();
    hub.assign(sample_shell_task("hostile", cmd));
    let done = hub
        .wait_for(
            |f| {
                (f["type"] == "task_complete" || f["type"] == "task_failed")
                    && f["task_id"] == "hostile"
            },
            T,
        )
        .await
        .unwrap_or_else(|| panic!("no terminal frame; daemon log:\n{}", bin.logs()));
    assert_no_violations(&hub);
    let out = done["result"]["output"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (out, bin)
}

#[tokio::test]
async fn the_token_cannot_be_read_from_the_config_file_the_command_line_names() {
    if !supported() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hub-sidecar.toml");
    // Worst case: the agent knows the path (the daemon's command line names it), and also
    // looks for it the way an attacker would.
    let cmd = format!(
        "cat '{}' 2>&1; for f in /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f 2>/dev/null | grep '\\.toml$'; done | sort -u | while read c; do cat \"$c\" 2>&1; done; true",
        config.display()
    );
    let (out, mut bin) = run_on_binary(dir.path(), "", &[], &cmd).await;
    // Refused (Landlock) or not there at all (hidden by the task's mount namespace).
    assert!(
        out.contains("Permission denied") || out.contains("No such file or directory"),
        "{out}"
    );
    assert!(!out.contains(TOKEN), "token leaked: {out}");
    bin.kill9().await;
}

#[tokio::test]
async fn the_token_cannot_be_read_from_proc_of_the_daemon_or_any_ancestor() {
    if !supported() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Every process's environ and memory the agent can name: the daemon, its supervisor
    // copies, the test runner.
    let cmd = "for p in /proc/[0-9]*; do cat $p/environ 2>/dev/null; done | tr '\\0' '\\n' | grep -c HUB_SIDECAR_TOKEN; \
         for p in /proc/[0-9]*; do dd if=$p/mem bs=1 count=1 skip=4096 2>/dev/null && echo MEM-OPEN; done; \
         cat /proc/$PPID/environ 2>&1 | head -c 200; true";
    let (out, mut bin) = run_on_binary(dir.path(), "", &[("HUB_SIDECAR_TOKEN", TOKEN)], cmd).await;
    // The config above also names the token; the env one must be the one in force here.
    assert!(!out.contains(TOKEN), "token leaked: {out}");
    assert!(
        !out.contains("MEM-OPEN"),
        "a process's memory was readable: {out}"
    );
    assert_eq!(out.lines().next().map(str::trim), Some("0"), "{out}");
    bin.kill9().await;
}

#[tokio::test]
async fn a_task_cannot_write_outside_its_workspace() {
    if !supported() {
        return;
    }
    let s = Harness::setup().await;
    let other = tempfile::tempdir().unwrap();
    let (c, ws) = s.cfg_with_workspace();
    let state = c.state_file();
    let h = s.start(c).await;
    // The daemon writes its state back just after identify (start-up does not wait for it).
    assert!(
        wait_until(|| state.exists(), T).await,
        "the daemon never wrote its state file"
    );
    let before = std::fs::read(&state).unwrap();
    let tag = unique_sleep();
    let targets = [
        state.clone(),
        h.dir().join("new-in-state-dir"),
        other.path().join("other-workspace-file"),
        PathBuf::from(format!("/tmp/hub-sidecar-escape-{tag}")),
        PathBuf::from(format!("/etc/hub-sidecar-escape-{tag}")),
    ];
    let mut cmd = String::from(
        "echo inside > inside.txt; echo \"tmp=$TMPDIR\"; echo t > \"$TMPDIR/t\" && echo TMP-OK; ",
    );
    for t in &targets {
        cmd.push_str(&format!(
            "echo pwned >> '{}' 2>/dev/null && echo 'WROTE {}'; ",
            t.display(),
            t.display()
        ));
    }
    let via_link = format!("/tmp/hub-sidecar-escape-link-{tag}");
    cmd.push_str(&format!("ln -s / rootlink 2>/dev/null; echo x > rootlink{via_link} 2>/dev/null && echo WROTE-VIA-LINK; true"));
    h.assign(sample_shell_task("writer", &cmd));
    let done = terminal(h.hub(), "writer").await;
    let out = done["result"]["output"].as_str().unwrap();
    assert!(
        out.contains("TMP-OK"),
        "the private TMPDIR is writable: {out}"
    );
    assert!(!out.contains("WROTE"), "{out}");
    assert_eq!(
        std::fs::read_to_string(ws.join("inside.txt")).unwrap(),
        "inside\n"
    );
    for t in &targets[1..] {
        assert!(!t.exists(), "{} was created", t.display());
    }
    assert!(!Path::new(&via_link).exists());
    // The state file only changed through the daemon: every line is still one of its
    // journal records, none is the task's "pwned".
    let after = std::fs::read_to_string(&state).unwrap_or_default();
    assert!(
        after.starts_with(&String::from_utf8_lossy(&before)[..20]),
        "{after}"
    );
    for line in after.lines() {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "a line the daemon did not write: {line}"
        );
    }
    h.finish().await;
}

#[tokio::test]
async fn setsid_and_double_fork_do_not_outlive_the_task() {
    if !supported() {
        return;
    }
    let s = Harness::setup().await;
    let (a, b) = (unique_sleep(), unique_sleep());
    let cfg = s.cfg();
    let h = s.start(cfg).await;
    // Both escapes a process-group kill misses: a new session, and a double fork whose
    // middle process exits at once.
    let cmd = format!(
        "setsid sleep {a} > /dev/null 2>&1 < /dev/null & \
         ( ( sleep {b} > /dev/null 2>&1 < /dev/null & ) & ); \
         sleep 0.2; echo started"
    );
    h.assign(sample_shell_task("escaper", &cmd));
    let done = terminal(h.hub(), "escaper").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(
        wait_until(
            || procs_with_arg(&a).is_empty() && procs_with_arg(&b).is_empty(),
            T
        )
        .await,
        "a detached process survived the task"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_detached_grandchild_dies_with_a_sigkilled_daemon_and_the_restart_recovers() {
    if !supported() {
        return;
    }
    let s = Harness::setup().await;
    let mut h = s.start_bin("test-token", "", &[]).await;
    let s = unique_sleep();
    let marker = probe(h.dir()).join("detached");
    let cmd = format!(
        "setsid sleep {s} > /dev/null 2>&1 < /dev/null & touch {}; sleep 30",
        marker.display()
    );
    h.assign(sample_shell_task("orphan-maker", &cmd));
    assert!(wait_until(|| marker.exists(), T).await);
    // The backgrounded `setsid sleep` may not have exec'd yet when the marker appears.
    assert!(wait_until(|| !procs_with_arg(&s).is_empty(), T).await);
    h.bin_mut().kill9().await;
    assert!(
        wait_until(|| procs_with_arg(&s).is_empty(), T).await,
        "the detached sleep outlived the daemon"
    );
    h.start_bin_again(&[]);
    let rec = h.wait_for_type("task_recovering", T).await;
    assert!(
        rec.is_some(),
        "the restarted daemon reports the interrupted task"
    );
    h.bin_mut().kill9().await;
    h.finish().await;
}

#[tokio::test]
async fn resource_limits_bound_what_one_child_can_write() {
    if !supported() {
        return;
    }
    let s = Harness::setup().await;
    let (mut c, ws) = s.cfg_with_workspace();
    c.sandbox.max_file_size_mb = 1;
    let h = s.start(c).await;
    h.assign(sample_shell_task(
        "big",
        "head -c 3000000 /dev/zero > big.bin; echo rc=$?; ulimit -c",
    ));
    let done = terminal(h.hub(), "big").await;
    let size = std::fs::metadata(ws.join("big.bin"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(
        size <= 1024 * 1024,
        "wrote {size} bytes past a 1 MiB limit: {done}"
    );
    let out = done["result"]["output"].as_str().unwrap();
    assert!(
        out.lines().any(|l| l.trim() == "0"),
        "core dumps are off: {out}"
    );
    h.finish().await;
}

// ---------------------------------------------------------------------------------------
// Git: the daemon's own git never runs what a repository names.
// ---------------------------------------------------------------------------------------

/// An operator's `repo_dir` (whose `.git` a task can write) with `plant` applied; one task
/// through the daemon's branch → commit → push. Returns the terminal frame; asserts the
/// planted program never ran.
pub(crate) async fn plant_and_run(plant: impl FnOnce(&Path, &Path)) -> Value {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let work = s.dir().join("checkout");
    git(s.dir(), &["clone", "-q", &remote.url(), "checkout"]);
    let marker = probe(s.dir()).join("pwned");
    let evil = probe(s.dir()).join("evil.sh");
    write_exe(
        &evil,
        &format!("#!/bin/sh\ntouch '{}'\ncat\n", marker.display()),
    );
    plant(&work, &evil);
    let mut c = base_cfg(&s.hub, s.dir());
    c.repo_dir = Some(work.clone());
    c.sandbox.write_paths.push(remote.path());
    let mut h = s.start(c).await;
    let mut t = sample_shell_task("vector", "echo work > work.txt; echo data > data.txt");
    t["description"] = json!("Hostile repository");
    h.assign(t);
    let done = terminal(h.hub(), "vector").await;
    h.stop_daemon().await;
    assert!(!marker.exists(), "git ran the repository's program: {done}");
    assert_no_violations(h.hub());
    done
}

fn git_config(work: &Path, key: &str, value: &str) {
    git(work, &["config", key, value]);
}

/// A config vector is refused with a reason naming the key.
pub(crate) async fn refused(key: &str, value_is_evil: bool, attributes: Option<&str>) {
    if !supported() {
        return;
    }
    let key_owned = key.to_string();
    let attrs = attributes.map(str::to_string);
    let done = plant_and_run(move |work, evil| {
        let v = if value_is_evil {
            evil.display().to_string()
        } else {
            "x".into()
        };
        git_config(work, &key_owned, &v);
        if let Some(a) = attrs {
            std::fs::write(work.join(".gitattributes"), a).unwrap();
        }
    })
    .await;
    let text = done.to_string();
    assert!(
        text.contains("refused") && text.contains(&key.to_ascii_lowercase()),
        "the key is named in the refusal: {done}"
    );
}

macro_rules! config_vector {
    ($name:ident, $key:expr, $attrs:expr) => {
        #[tokio::test]
        async fn $name() {
            refused($key, true, $attrs).await;
        }
    };
}

config_vector!(git_core_fsmonitor_is_never_run, "core.fsmonitor", None);
config_vector!(git_core_ssh_command_is_never_run, "core.sshCommand", None);
config_vector!(git_core_pager_is_never_run, "core.pager", None);
config_vector!(git_core_editor_is_never_run, "core.editor", None);
config_vector!(git_core_hooks_path_is_never_used, "core.hooksPath", None);
config_vector!(git_core_git_proxy_is_never_run, "core.gitProxy", None);
config_vector!(
    git_credential_helper_is_never_run,
    "credential.helper",
    None
);
config_vector!(git_diff_external_is_never_run, "diff.external", None);
config_vector!(
    git_clean_filter_is_never_run,
    "filter.evil.clean",
    Some("* filter=evil\n")
);
config_vector!(
    git_smudge_filter_is_never_run,
    "filter.evil.smudge",
    Some("* filter=evil\n")
);
config_vector!(
    git_filter_process_is_never_run,
    "filter.evil.process",
    Some("* filter=evil\n")
);
config_vector!(
    git_diff_textconv_is_never_run,
    "diff.evil.textconv",
    Some("* diff=evil\n")
);
config_vector!(
    git_diff_driver_command_is_never_run,
    "diff.evil.command",
    Some("* diff=evil\n")
);
config_vector!(
    git_merge_driver_is_never_run,
    "merge.evil.driver",
    Some("* merge=evil\n")
);
config_vector!(
    git_receive_pack_is_never_run,
    "remote.origin.receivepack",
    None
);
config_vector!(
    git_upload_pack_is_never_run,
    "remote.origin.uploadpack",
    None
);
config_vector!(git_gpg_program_is_never_run, "gpg.program", None);
config_vector!(git_include_path_is_never_followed, "include.path", None);
config_vector!(
    git_url_insteadof_is_never_followed,
    "url.evil.insteadOf",
    None
);

#[tokio::test]
async fn git_hooks_in_the_repository_are_never_run() {
    if !supported() {
        return;
    }
    let done = plant_and_run(|work, evil| {
        let hooks = work.join(".git/hooks");
        for h in [
            "pre-commit",
            "prepare-commit-msg",
            "commit-msg",
            "post-commit",
            "post-checkout",
            "pre-push",
            "reference-transaction",
            "post-index-change",
            "pre-auto-gc",
            "post-rewrite",
        ] {
            std::fs::copy(evil, hooks.join(h)).unwrap();
        }
    })
    .await;
    // Hooks are files, not config: nothing to refuse, they just never run.
    assert_eq!(done["result"]["pushed"], true, "{done}");
}

#[tokio::test]
async fn a_gitdir_the_task_plants_in_a_managed_clone_is_never_used() {
    if !supported() {
        return;
    }
    let s = Harness::setup().await;
    let remote = Remote::new();
    let marker = probe(s.dir()).join("pwned");
    let evil = probe(s.dir()).join("evil.sh");
    write_exe(
        &evil,
        &format!("#!/bin/sh\ntouch '{}'\ncat\n", marker.display()),
    );
    let cfg = base_cfg(&s.hub, s.dir());
    let h = s.start(cfg).await;
    // The task replaces the workspace's `.git` link with a repository of its own whose
    // config and hooks name the evil program.
    let cmd = format!(
        "rm -f .git && git init -q . && git config core.fsmonitor '{e}' && cp '{e}' .git/hooks/pre-commit && echo work > work.txt",
        e = evil.display()
    );
    h.assign(shell_task(
        "planter",
        &cmd,
        &remote.url(),
        "Plant a git dir",
    ));
    let done = terminal(h.hub(), "planter").await;
    assert_eq!(done["result"]["pushed"], true, "{done}");
    // The next task on the same clone starts clean, with the daemon's own git directory.
    h.assign(shell_task(
        "after",
        "git status --short | wc -l",
        &remote.url(),
        "After",
    ));
    let done = terminal(h.hub(), "after").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(!marker.exists(), "git ran the task's program: {done}");
    h.finish().await;
}

/// The task makes its workspace a repository whose config and attributes name a program;
/// the daemon's own git after it (the observation of what changed, a `git_clean` check)
/// refuses to run there instead of running it.
#[tokio::test]
async fn observation_and_checks_never_run_what_a_repository_the_task_made_names() {
    if !supported() {
        return;
    }
    let s = Harness::setup().await;
    let (c, _ws) = s.cfg_with_workspace();
    let marker = probe(s.dir()).join("pwned");
    let evil = probe(s.dir()).join("evil.sh");
    write_exe(
        &evil,
        &format!("#!/bin/sh\ntouch '{}'\ncat\n", marker.display()),
    );
    let h = s.start(c).await;
    let cmd = format!(
        "git init -q . && git config core.fsmonitor '{e}' && git config filter.x.clean '{e}' && echo '* filter=x' > .gitattributes && echo data > data.txt",
        e = evil.display()
    );
    let mut t = sample_shell_task("repo-maker", &cmd);
    t["verification_steps"] = json!([
        {"type": "file_exists", "target": "data.txt"},
        {"type": "git_clean", "target": "."}
    ]);
    h.assign(t);
    let done = terminal(h.hub(), "repo-maker").await;
    let report = &done["verification_report"];
    let git_clean = &report["checks"][1];
    assert_eq!(git_clean["status"], "error", "{done}");
    assert!(
        git_clean["output"]
            .as_str()
            .unwrap()
            .contains("core.fsmonitor"),
        "{done}"
    );
    assert!(
        !marker.exists(),
        "the daemon's git ran the task's program: {done}"
    );
    h.finish().await;
}

/// The loop as usual, inside the sandbox: a cargo test suite, a python and a sh check all
/// run confined (the toolchains are readable, the build writes only the workspace).
#[tokio::test]
async fn cargo_python_and_sh_checks_work_under_containment() {
    if !supported() {
        return;
    }
    if !["cargo", "python3"]
        .iter()
        .all(|t| require(t, missing_tool(t)))
    {
        return;
    }
    let s = Harness::setup().await;
    let (mut c, ws) = s.cfg_with_workspace();
    // A developer's exported CARGO_TARGET_DIR (outside the workspace) would otherwise reach the
    // check's cargo, which the sandbox rightly keeps from writing there.
    c.env.deny.push("CARGO_TARGET_DIR".into());
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(
        ws.join("Cargo.toml"),
        "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::write(
        ws.join("src/lib.rs"),
        "pub fn add(a: i32, b: i32) -> i32 { a + b }\n#[test]\nfn adds() { assert_eq!(add(2, 2), 4); }\n",
    )
    .unwrap();
    let h = s.start(c).await;
    let mut t = sample_shell_task("toolchains", "echo made > made.txt");
    t["verification_steps"] = json!([
        {"type": "test_passes", "target": "auto"},
        {"type": "command_succeeds", "target": "python3 -c 'import json; print(json.dumps(1))'"},
        {"type": "command_succeeds", "target": "test \"$(cat made.txt)\" = made"}
    ]);
    h.assign(t);
    let done = terminal(h.hub(), "toolchains").await;
    assert_eq!(done["result"]["verification_status"], "verified", "{done}");
    assert!(ws.join("target").is_dir(), "cargo built in the workspace");
    h.finish().await;
}

/// Python run by a task: every process whose command line is the daemon's (the daemon and
/// the supervisors made from it, which share its memory), its environ and mem opened and a
/// ptrace attach tried.
const PROBE_DAEMONS: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for p in os.listdir("/proc"):
    if not p.isdigit():
        continue
    try:
        argv = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
    except OSError:
        continue
    if not (argv[0].endswith(b"hub-sidecar") and b"run" in argv):
        continue
    print("daemon-found", p)
    for f in ("environ", "mem"):
        try:
            open("/proc/%s/%s" % (p, f), "rb").close()
            print("OPEN-%s %s" % (f, p))
        except OSError:
            pass
    if libc.ptrace(16, int(p), 0, 0) == 0:
        print("PTRACE-OK", p)
"#;

#[tokio::test]
async fn a_task_cannot_open_or_ptrace_the_daemon_or_its_supervisors() {
    if !supported() {
        return;
    }
    if !require("python3", missing_tool("python3")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cmd = format!("python3 -c '{PROBE_DAEMONS}'");
    let (out, mut bin) = run_on_binary(dir.path(), "", &[], &cmd).await;
    assert!(
        out.contains("daemon-found"),
        "the daemon was not found: {out}"
    );
    for bad in ["OPEN-environ", "OPEN-mem", "PTRACE-OK"] {
        assert!(!out.contains(bad), "{bad}: {out}");
    }
    bin.kill9().await;
}
