//! `test_passes`: the target's test command, or for `target: "auto"` the project's test
//! runner, detected from the project file the workspace holds (`Cargo.toml` → `cargo test`,
//! …, `Makefile` → `make test`).
//!
//! A workspace with no project file yet is a **failed** check, not one that could not run:
//! a task whose job is to create the project fixes it by adding the file, so the corrective
//! loop must get its retry (a `check_error` would end the loop after one attempt).

use std::path::Path;
use std::time::Duration;

use crate::executor::ExecContext;
use crate::process::CommandSpec;

use super::check_command::command_result;
use super::report::CheckStatus;

/// Project files and the test command each one means, in the order they are looked for.
const RUNNERS: &[(&[&str], &str, &[&str])] = &[
    (&["Cargo.toml"], "cargo", &["test"]),
    (&["mix.exs"], "mix", &["test"]),
    (&["package.json"], "npm", &["test"]),
    (&["pyproject.toml", "pytest.ini"], "pytest", &[]),
    (&["go.mod"], "go", &["test", "./..."]),
    (&["Makefile"], "make", &["test"]),
];

/// The test command `test_passes` runs for `target: "auto"`: detected from marker files.
pub async fn detect_test_runner(workspace: &Path) -> Option<(&'static str, Vec<&'static str>)> {
    for (markers, program, args) in RUNNERS {
        for m in *markers {
            if tokio::fs::try_exists(workspace.join(m))
                .await
                .unwrap_or(false)
            {
                return Some((program, args.to_vec()));
            }
        }
    }
    None
}

/// Every project file [`detect_test_runner`] looks for, for the message of a failed check.
fn project_files() -> String {
    RUNNERS
        .iter()
        .flat_map(|(markers, _, _)| markers.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Run one `test_passes` step within `bound`.
pub(super) async fn test_passes(
    ctx: &ExecContext,
    target: &str,
    bound: Duration,
) -> (CheckStatus, String) {
    let t = target.trim();
    if t.is_empty() {
        return (
            CheckStatus::Error,
            "test_passes needs a target: \"auto\" or a test command; the target is empty".into(),
        );
    }
    if t != "auto" {
        let spec = CommandSpec::shell(t, &ctx.workspace, ctx.env.clone());
        return command_result(ctx, &spec, bound, "sh").await;
    }
    let Some((program, args)) = detect_test_runner(&ctx.workspace).await else {
        return (
            CheckStatus::Fail,
            format!(
                "no project file in the workspace, so there are no tests to run (looked for {}): create the project with its tests (or give the test command as the step's target)",
                project_files()
            ),
        );
    };
    let spec = CommandSpec::new(program, &ctx.workspace, ctx.env.clone()).args(args);
    command_result(ctx, &spec, bound, program).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::test_support::ctx_for;

    const BOUND: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn runner_detection_follows_marker_files() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        assert_eq!(detect_test_runner(ws).await, None);
        std::fs::write(ws.join("Makefile"), "test:\n\ttrue\n").unwrap();
        assert_eq!(detect_test_runner(ws).await, Some(("make", vec!["test"])));
        std::fs::write(ws.join("go.mod"), "").unwrap();
        assert_eq!(
            detect_test_runner(ws).await,
            Some(("go", vec!["test", "./..."]))
        );
        std::fs::write(ws.join("pytest.ini"), "").unwrap();
        assert_eq!(detect_test_runner(ws).await, Some(("pytest", vec![])));
        std::fs::write(ws.join("package.json"), "{}").unwrap();
        assert_eq!(detect_test_runner(ws).await, Some(("npm", vec!["test"])));
        std::fs::write(ws.join("mix.exs"), "").unwrap();
        assert_eq!(detect_test_runner(ws).await, Some(("mix", vec!["test"])));
        std::fs::write(ws.join("Cargo.toml"), "").unwrap();
        assert_eq!(detect_test_runner(ws).await, Some(("cargo", vec!["test"])));
    }

    #[tokio::test]
    async fn auto_runner_runs_make_test() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        std::fs::write(ws.join("Makefile"), "test:\n\t@echo ran-tests\n").unwrap();
        let ctx = ctx_for(ws, serde_json::json!({}));
        let (status, output) = test_passes(&ctx, "auto", BOUND).await;
        assert_eq!(status, CheckStatus::Pass, "{output}");
        assert!(output.contains("ran-tests"));
    }

    /// A task whose job is to create the project: before it exists the check fails (the
    /// agent can fix that), and once the project file is there the same check passes.
    #[tokio::test]
    async fn auto_with_no_project_file_is_a_failure_the_agent_can_fix() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        let ctx = ctx_for(ws, serde_json::json!({}));
        let (status, out) = test_passes(&ctx, "auto", BOUND).await;
        assert_eq!(
            status,
            CheckStatus::Fail,
            "a failure, not a check that could not run: {out}"
        );
        assert!(
            out.contains("no project file")
                && out.contains("Cargo.toml")
                && out.contains("Makefile"),
            "{out}"
        );
        std::fs::write(ws.join("Makefile"), "test:\n\t@echo ok\n").unwrap();
        let (status, out) = test_passes(&ctx, "auto", BOUND).await;
        assert_eq!(status, CheckStatus::Pass, "{out}");
    }
}
