//! Levels and policies: what strict, best-effort and off do with what the kernel allows.

use super::*;

fn without_kernel_support() -> Support {
    Support {
        landlock_abi: 0,
        namespaces: Err(NamespaceError::Spawn(Arc::new(
            std::io::Error::from_raw_os_error(libc::EPERM),
        ))),
        refused: Default::default(),
    }
}

#[test]
fn strict_refuses_what_it_cannot_confine_and_says_what_is_missing() {
    let cfg = Config::default();
    let policy = Policy::decide(Some(Containment::Strict), without_kernel_support());
    let dir = tempfile::tempdir().unwrap();
    let err = plan(
        &cfg,
        &policy,
        &[],
        &dir.path().join("tmp"),
        &Grants::default(),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("containment_unavailable:"), "{msg}");
    assert!(
        msg.contains("Landlock") && msg.contains("namespaces"),
        "{msg}"
    );
    assert!(msg.contains("best-effort"), "says what to do: {msg}");
}

#[test]
fn a_network_policy_without_namespaces_refuses_the_task_even_in_best_effort() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config {
        state_dir: dir.path().join("state"),
        ..Config::default()
    };
    cfg.network.mode = NetworkMode::Allowlist;
    let policy = Policy::decide(Some(Containment::BestEffort), without_kernel_support());
    let grants = Grants {
        write: vec![dir.path().to_path_buf()],
        task: true,
        ..Grants::default()
    };
    let err = plan(&cfg, &policy, &[], &dir.path().join("tmp"), &grants).unwrap_err();
    assert!(err.to_string().contains("[network] mode"), "{err}");
    // The daemon's own git calls are not the task's: they keep the host's network.
    let git = Grants {
        task: false,
        ..grants
    };
    assert!(plan(&cfg, &policy, &[], &dir.path().join("tmp"), &git).is_ok());
}

#[test]
fn unset_means_strict_everywhere_and_a_machine_that_cannot_confine_refuses_work() {
    let full = Support {
        landlock_abi: 6,
        namespaces: Ok(()),
        refused: Default::default(),
    };
    let strict = Policy::decide(None, full);
    assert_eq!(strict.level, Containment::Strict);
    assert!(strict.refusal().is_none());
    assert_eq!(strict.ran_under(), serde_json::json!({"level": "strict"}));
    // No silent downgrade: unset on a machine without the layers refuses work and says
    // why and what to do.
    let none = without_kernel_support();
    let unset = Policy::decide(None, none.clone());
    assert_eq!(unset.level, Containment::Strict);
    let why = unset.refusal().expect("refuses");
    assert!(why.starts_with("containment_unavailable:"), "{why}");
    assert!(why.contains("best-effort"), "{why}");
    // best-effort, chosen explicitly, runs with what there is (here: limits only), and
    // says what was not enforced.
    let chosen = Policy::decide(Some(Containment::BestEffort), none);
    assert!(chosen.refusal().is_none());
    assert_eq!(chosen.ran_under()["level"], "best-effort");
    assert_eq!(
        chosen.ran_under()["not_enforced"].as_array().map(Vec::len),
        Some(2)
    );
    let cfg = Config::default();
    let dir = tempfile::tempdir().unwrap();
    let c = plan(
        &cfg,
        &chosen,
        &[],
        &dir.path().join("tmp"),
        &Grants::default(),
    )
    .unwrap();
    assert!(c.sandbox.is_some());
    let tmp = dir.path().join("tmp").to_string_lossy().into_owned();
    assert!(c.set.contains(&("TMPDIR".to_string(), tmp)), "{:?}", c.set);
}
