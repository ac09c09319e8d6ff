//! Confinement refused by a seccomp filter, as in a container (issue 44): `hub-sidecar
//! check` run under a filter that refuses `landlock_*` (systemd-nspawn's and Docker's
//! default filters do) or `unshare` names the filter, not an old kernel, and says what to
//! allow. The filter is installed between fork and exec of `check` (no_new_privs lets an
//! unprivileged user install one too), so it runs as root and as the service user.

use std::os::unix::process::CommandExt;

use hub_sidecar::mock_hub::{MockHub, MockHubOptions};

use crate::util::*;

/// A seccomp program answering `errno` to each of `calls` and allowing everything else.
fn refusing(calls: &[libc::c_long], errno: u32) -> Vec<libc::sock_filter> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    // The syscall number: `seccomp_data.nr`, at offset 0.
    let mut prog = vec![stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0)];
    for &nr in calls {
        // Equal: fall through to the refusal; else skip it.
        prog.push(libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: nr as u32,
        });
        prog.push(stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | errno,
        ));
    }
    prog.push(stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW));
    prog
}

/// `hub-sidecar check --config config` under `filter`: its stdout.
async fn check_under(config: &std::path::Path, filter: Vec<libc::sock_filter>) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hub-sidecar"));
    cmd.args(["check", "--config", config.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .env_remove("HUB_SIDECAR_CONFIG")
        .stdin(std::process::Stdio::null());
    // SAFETY: two prctl calls on a program built before the fork; async-signal-safe.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn containment_line(out: &str) -> &str {
    out.lines()
        .find(|l| l.contains("containment"))
        .unwrap_or_else(|| panic!("no containment line:\n{out}"))
}

#[tokio::test]
async fn landlock_or_namespaces_refused_by_a_seccomp_filter_are_named_with_what_to_allow() {
    if !crate::containment::supported() {
        return;
    }
    let hub = MockHub::start(MockHubOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&hub, dir.path(), "test-token", "");
    let landlock = [
        libc::SYS_landlock_create_ruleset,
        libc::SYS_landlock_add_rule,
        libc::SYS_landlock_restrict_self,
    ];
    // ENOSYS is what nspawn answers for a call it does not list, EPERM Docker's default.
    for errno in [libc::ENOSYS, libc::EPERM] {
        let out = check_under(&config, refusing(&landlock, errno as u32)).await;
        let line = containment_line(&out);
        eprintln!("errno {errno}: {line}");
        assert!(
            line.contains("✗ containment")
                && line.contains("refused by a seccomp filter")
                && line.contains("--system-call-filter='landlock_create_ruleset landlock_add_rule landlock_restrict_self'")
                && line.contains("SystemCallFilter="),
            "errno {errno}: {line}"
        );
        assert!(
            !line.contains("needs Linux ≥ 5.13"),
            "not an old kernel: {line}"
        );
    }
    // A filter refusing `unshare`: the namespaces, named as refused, with what to allow.
    let out = check_under(&config, refusing(&[libc::SYS_unshare], libc::EPERM as u32)).await;
    let line = containment_line(&out);
    eprintln!("unshare refused: {line}");
    assert!(
        line.contains("user, PID and mount namespaces")
            && line.contains("refused by a seccomp filter")
            && line.contains("unshare"),
        "{line}"
    );
    assert!(
        !line.contains("Landlock is"),
        "Landlock itself is fine: {line}"
    );
}
