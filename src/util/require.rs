//! The unit tests' twin of the integration tests' gate (`tests/it/util.rs`, whose module doc
//! is the reference): a unit test that needs what this machine may lack calls
//! [`require`] first; a requirement listed in `HUB_SIDECAR_REQUIRE` fails the test when
//! missing, any other missing one is printed and appended to the `HUB_SIDECAR_SKIPS` list.
//! Kept apart from the library: it is compiled for the unit tests only.

use std::io::Write;

/// The requirements unit tests gate on (a subset of the integration tests' list, same names).
const REQUIREMENTS: &[&str] = &["confine", "root", "route"];

/// `true` when `missing` is `None`; a failure when `requirement` is in
/// `HUB_SIDECAR_REQUIRE`; else a recorded skip and `false`.
#[track_caller]
pub(crate) fn require(requirement: &str, missing: Option<String>) -> bool {
    assert!(
        REQUIREMENTS.contains(&requirement),
        "`{requirement}` is not a known requirement: add it to util::require::REQUIREMENTS"
    );
    let Some(why) = missing else {
        return true;
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("(a test on an unnamed thread)")
        .to_string();
    let required = std::env::var("HUB_SIDECAR_REQUIRE").unwrap_or_default();
    if required.split(',').any(|r| r.trim() == requirement) {
        panic!(
            "{test} needs `{requirement}`, which HUB_SIDECAR_REQUIRE says this machine has, but: {why}"
        );
    }
    let why = why.replace(['\n', '\t'], " ");
    eprintln!("SKIPPED {test}: needs `{requirement}`: {why}");
    if let Some(list) = std::env::var_os("HUB_SIDECAR_SKIPS") {
        // One line, one write (O_APPEND): parallel tests and both runs never interleave.
        let line = format!("{test}\t{requirement}\t{why}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&list)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            panic!("{test} skipped and cannot list it in {list:?}: {e}");
        }
    }
    false
}

/// Why this is not root, if it is not.
pub(crate) fn missing_root() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::geteuid() };
    (uid != 0).then(|| format!("runs as uid {uid}, not root"))
}
