//! The mechanical checks (`verification_steps[]`) and one verification run over all of them.
//!
//! Owns: path resolution inside the workspace, the per-check and global deadlines, the
//! file and git checks, and the `verification_check_result` progress events; a check's
//! command and its verdict are `check_command`, `test_passes` and its runner detection
//! `test_runner`. Every command goes
//! through [`crate::process::run`] (own process group, capped output, group kill), so a
//! check that hangs is killed with its whole tree and the runtime never blocks.
//!
//! All checks run (no fail-fast): the LLM gets the full picture in one corrective prompt.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::executor::ExecContext;
use crate::process::Exit;
use crate::progress::{EventKind, ProgressEvent};
use crate::task::{CheckType, Task, VerificationStep};

use super::check_command::{command_succeeds, run_bounded, timed_out, CHECK_KILL_GRACE};
use super::judge;
use super::report::{CheckResult, CheckStatus, ReportStatus, VerificationReport};
use super::test_runner::test_passes;

/// Default global deadline of one verification run (PROTOCOL.md §5).
pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;

/// The global deadline of one run: the task's `verification_timeout_ms`, else config.
pub fn report_timeout_ms(task: &Task, config: &crate::config::VerificationConfig) -> u64 {
    task.verification_timeout_ms
        .filter(|t| *t > 0)
        .unwrap_or(if config.timeout_ms > 0 {
            config.timeout_ms
        } else {
            DEFAULT_TIMEOUT_MS
        })
}

/// Run every verification step of `ctx.task` once, as run `run_number`.
///
/// `observations` (what the attempt changed, from [`super::observe`]) feed `llm_judge`.
/// `skip_verification` gives a `skip` report, no steps an `auto_pass` one (unless success
/// criteria are judged instead: [`super::criteria`]). Checks not reached before the global
/// deadline are reported as `timeout`.
pub async fn run_checks(
    ctx: &ExecContext,
    run_number: u32,
    observations: &[String],
) -> VerificationReport {
    let task = &ctx.task;
    let timeout_ms = report_timeout_ms(task, &ctx.config.verification);
    if task.skip_verification {
        return VerificationReport::empty(
            &task.task_id,
            run_number,
            ReportStatus::Skip,
            timeout_ms,
        );
    }
    // Success criteria and no steps: judged where a judge is configured (`criteria`).
    let judged = super::criteria::judged_steps(task, &ctx.config.verification);
    let steps = if judged.is_empty() {
        &task.verification_steps
    } else {
        &judged
    };
    if steps.is_empty() {
        return VerificationReport::empty(
            &task.task_id,
            run_number,
            ReportStatus::AutoPass,
            timeout_ms,
        );
    }
    let started_at = crate::util::now_ms();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_millis(timeout_ms);
    let mut deadline_hit = false;
    let mut checks = Vec::with_capacity(steps.len());
    for step in steps {
        let now = Instant::now();
        let result = if now >= deadline {
            deadline_hit = true;
            result_for(
                step,
                CheckStatus::Timeout,
                format!("not run: the verification deadline ({timeout_ms} ms) had passed"),
                Duration::ZERO,
            )
        } else {
            let remaining = deadline - now;
            let own = step
                .timeout_ms
                .filter(|t| *t > 0)
                .map(Duration::from_millis);
            // Which bound applies decides whether a timeout is the check's or the report's.
            let (bound, global) = match own {
                Some(t) if t < remaining => (t, false),
                _ => (remaining, true),
            };
            let r = run_step(ctx, step, bound, observations).await;
            if r.status == CheckStatus::Timeout && global {
                deadline_hit = true;
            }
            r
        };
        emit_result(ctx, &result, run_number);
        checks.push(result);
    }
    VerificationReport::from_checks(
        &task.task_id,
        run_number,
        started_at,
        t0.elapsed().as_millis() as u64,
        timeout_ms,
        checks,
        deadline_hit,
    )
}

/// Send the `verification_check_result` event for one check.
pub fn emit_result(ctx: &ExecContext, result: &CheckResult, run_number: u32) {
    let status = status_str(result.status);
    let flaky = if result.flaky {
        " (flaky: passed on re-run)"
    } else {
        ""
    };
    ctx.progress.emit(
        ProgressEvent::new(
            EventKind::VerificationCheckResult,
            format!("{} {}: {status}{flaky}", result.check_type, result.target),
        )
        .with("check_type", result.check_type.as_str())
        .with("check_status", status)
        // One numbering for the three events of a run (see the retry loop's module docs).
        .with("attempt", run_number.saturating_sub(1))
        .with("run_number", run_number),
    );
}

/// The wire name of a check status.
pub fn status_str(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Pass => "pass",
        CheckStatus::Fail => "fail",
        CheckStatus::Error => "error",
        CheckStatus::Timeout => "timeout",
    }
}

/// Run one step within `bound`. Never panics, never blocks; always yields a result.
pub async fn run_step(
    ctx: &ExecContext,
    step: &VerificationStep,
    bound: Duration,
    observations: &[String],
) -> CheckResult {
    let started = std::time::Instant::now();
    if let Some(why) = &step.invalid {
        return result_for(step, CheckStatus::Error, why.clone(), started.elapsed());
    }
    let fut = async {
        let free = |(s, o)| (s, o, 0.0, (0, 0));
        match &step.check_type {
            CheckType::FileExists => free(file_exists(&ctx.workspace, &step.target).await),
            CheckType::GitClean => free(git_clean(ctx, &step.target, bound).await),
            CheckType::CommandSucceeds => free(command_succeeds(ctx, &step.target, bound).await),
            CheckType::TestPasses => free(test_passes(ctx, &step.target, bound).await),
            CheckType::LlmJudge => {
                let j = judge::judge_check(ctx, &step.target, observations, bound).await;
                (j.status, j.output, j.cost_usd, (j.tokens_in, j.tokens_out))
            }
            CheckType::Other(other) => {
                free((CheckStatus::Error, format!("unknown check type: {other}")))
            }
        }
    };
    // Safety net for the non-process checks (and the kill grace of process ones).
    let (status, output, cost_usd, (tokens_in, tokens_out)) =
        match tokio::time::timeout(bound + CHECK_KILL_GRACE * 3, fut).await {
            Ok(r) => r,
            Err(_) => (
                CheckStatus::Timeout,
                format!("check timed out after {} ms", bound.as_millis()),
                0.0,
                (0, 0),
            ),
        };
    let mut r = result_for(step, status, output, started.elapsed());
    r.cost_usd = cost_usd;
    r.tokens_in = tokens_in;
    r.tokens_out = tokens_out;
    r
}

fn result_for(
    step: &VerificationStep,
    status: CheckStatus,
    output: String,
    took: Duration,
) -> CheckResult {
    CheckResult {
        check_type: step.check_type.clone(),
        target: step.target.clone(),
        description: step.description.clone(),
        status,
        output,
        duration_ms: took.as_millis() as u64,
        flaky: false,
        cost_usd: 0.0,
        tokens_in: 0,
        tokens_out: 0,
    }
}

/// Why a target path cannot be used.
#[derive(Debug, PartialEq, Eq)]
pub enum PathError {
    /// The target is empty.
    Empty,
    /// The target leaves the workspace.
    Escapes,
}

/// Resolve `target` (relative to `workspace`) lexically, refusing anything outside it.
/// `allow_root` lets `""`/`"."` mean the workspace itself (directories for `git_clean`).
pub fn resolve_in_workspace(
    workspace: &Path,
    target: &str,
    allow_root: bool,
) -> Result<PathBuf, PathError> {
    let t = target.trim();
    if t.is_empty() && !allow_root {
        return Err(PathError::Empty);
    }
    let rel = Path::new(t);
    if rel.is_absolute() {
        // An absolute path is accepted only when it already points inside the workspace.
        return match rel.strip_prefix(workspace) {
            Ok(inner) => resolve_in_workspace(workspace, &inner.to_string_lossy(), allow_root),
            Err(_) => Err(PathError::Escapes),
        };
    }
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(PathError::Escapes);
                }
            }
            Component::RootDir | Component::Prefix(_) => return Err(PathError::Escapes),
        }
    }
    if parts.is_empty() && !allow_root {
        return Err(PathError::Empty);
    }
    let mut p = workspace.to_path_buf();
    p.extend(parts);
    Ok(p)
}

/// Also refuse symlinks that lead out of the workspace.
async fn still_inside(workspace: &Path, path: &Path) -> bool {
    let (Ok(ws), Ok(real)) = (
        tokio::fs::canonicalize(workspace).await,
        tokio::fs::canonicalize(path).await,
    ) else {
        return true; // nothing resolvable: the existence check reports it
    };
    real.starts_with(ws)
}

fn path_error(check: &str, target: &str, e: PathError) -> (CheckStatus, String) {
    match e {
        PathError::Empty => (
            CheckStatus::Error,
            format!("{check} needs a target path relative to the workspace; the target is empty"),
        ),
        PathError::Escapes => (
            CheckStatus::Error,
            format!("{check} target `{target}` escapes the workspace; use a path inside it"),
        ),
    }
}

async fn file_exists(workspace: &Path, target: &str) -> (CheckStatus, String) {
    let path = match resolve_in_workspace(workspace, target, false) {
        Ok(p) => p,
        Err(e) => return path_error("file_exists", target, e),
    };
    match tokio::fs::metadata(&path).await {
        Ok(_) if !still_inside(workspace, &path).await => {
            path_error("file_exists", target, PathError::Escapes)
        }
        Ok(m) => (
            CheckStatus::Pass,
            format!(
                "{target} exists ({})",
                if m.is_dir() {
                    "directory".to_string()
                } else {
                    format!("{} bytes", m.len())
                }
            ),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            (CheckStatus::Fail, format!("{target} does not exist"))
        }
        Err(e) => (CheckStatus::Error, format!("cannot stat {target}: {e}")),
    }
}

async fn git_clean(ctx: &ExecContext, target: &str, bound: Duration) -> (CheckStatus, String) {
    let dir = match resolve_in_workspace(&ctx.workspace, target, true) {
        Ok(p) => p,
        Err(e) => return path_error("git_clean", target, e),
    };
    // The daemon's git: never running what the repository names (see git::harden).
    if let Some(why) = crate::git::harden::refusal(&dir, &ctx.env, &ctx.cancel).await {
        return (CheckStatus::Error, why.to_string());
    }
    let spec = crate::git::harden::command(&ctx.workspace, &dir, &ctx.env)
        .arg("-C")
        .arg(&dir)
        .args(["status", "--porcelain"]);
    let out = match run_bounded(ctx, &spec, bound).await {
        Ok(o) => o,
        Err(e) => return (CheckStatus::Error, format!("could not start git: {e}")),
    };
    match out.exit {
        Exit::Code(0) if out.stdout.trim().is_empty() => {
            (CheckStatus::Pass, "working tree clean".into())
        }
        Exit::Code(0) => (
            CheckStatus::Fail,
            format!("uncommitted changes:\n{}", out.stdout.trim_end()),
        ),
        Exit::TimedOut => timed_out(bound, &out.combined()),
        Exit::Cancelled => (CheckStatus::Error, "cancelled".into()),
        other => (
            CheckStatus::Error,
            format!(
                "git status failed ({}): {}",
                other.describe(),
                out.stderr.trim()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::test_support::{ctx_for, git};

    #[test]
    fn paths_stay_inside_the_workspace() {
        let ws = Path::new("/w");
        assert_eq!(
            resolve_in_workspace(ws, "a/b", false),
            Ok(PathBuf::from("/w/a/b"))
        );
        assert_eq!(
            resolve_in_workspace(ws, "a/../b", false),
            Ok(PathBuf::from("/w/b"))
        );
        assert_eq!(
            resolve_in_workspace(ws, "../x", false),
            Err(PathError::Escapes)
        );
        assert_eq!(
            resolve_in_workspace(ws, "/etc/passwd", false),
            Err(PathError::Escapes)
        );
        assert_eq!(
            resolve_in_workspace(ws, "/w/ok", false),
            Ok(PathBuf::from("/w/ok"))
        );
        assert_eq!(resolve_in_workspace(ws, "", false), Err(PathError::Empty));
        assert_eq!(resolve_in_workspace(ws, ".", true), Ok(PathBuf::from("/w")));
    }

    #[tokio::test]
    async fn every_check_type_runs_and_none_fail_fast() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        std::fs::write(ws.join("present.txt"), "x").unwrap();
        git(ws, &["init", "-q"]);
        let ctx = ctx_for(
            ws,
            serde_json::json!({"verification_steps": [
                {"type": "file_exists", "target": "present.txt"},
                {"type": "file_exists", "target": "missing.txt"},
                {"type": "file_exists", "target": "../outside"},
                {"type": "file_exists", "target": ""},
                {"type": "command_succeeds", "target": "true"},
                {"type": "command_succeeds", "target": "echo boom; exit 3"},
                {"type": "git_clean", "target": ""},
                {"type": "frobnicate", "target": "x"},
                {"type": "test_passes", "target": "auto"},
                {"type": "test_passes", "target": "test -f present.txt"}
            ]}),
        );
        let r = run_checks(&ctx, 1, &[]).await;
        let st: Vec<CheckStatus> = r.checks.iter().map(|c| c.status).collect();
        use CheckStatus::*;
        assert_eq!(
            st,
            vec![Pass, Fail, Error, Error, Pass, Fail, Fail, Error, Fail, Pass],
            "{:#?}",
            r.checks
        );
        assert!(r.checks[5].output.contains("boom") && r.checks[5].output.contains("exit code 3"));
        assert!(r.checks[6].output.contains("present.txt"));
        assert_eq!(r.checks[7].output, "unknown check type: frobnicate");
        assert!(r.checks[8].output.contains("no project file"));
        assert_eq!(r.status, ReportStatus::Error);
        assert_eq!(r.summary.total, 10);
        assert_eq!(
            (r.summary.passed, r.summary.failed, r.summary.errors),
            (3, 4, 3)
        );
        assert_eq!(ctx.progress.emitted(), 10);
        let ev = ctx.progress.take_event().unwrap();
        assert_eq!(ev["event_type"], "verification_check_result");
        // Run 1 is the first execution: no retry yet (the retry loop's numbering).
        assert_eq!(
            (ev["attempt"].clone(), ev["run_number"].clone()),
            (0.into(), 1.into())
        );
    }

    #[tokio::test]
    async fn a_bad_step_element_is_an_error_check_and_never_a_pass() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), "x").unwrap();
        let ctx = ctx_for(
            dir.path(),
            serde_json::json!({"verification_steps": [
                {"type": "file_exists", "target": "a"},
                ["file_exists", "a"]
            ]}),
        );
        let r = run_checks(&ctx, 1, &[]).await;
        assert_eq!(r.status, ReportStatus::Error, "{:#?}", r.checks);
        assert_eq!(r.checks[0].status, CheckStatus::Pass);
        assert_eq!(r.checks[1].status, CheckStatus::Error);
        assert!(r.checks[1]
            .output
            .contains("verification_steps[1] is a list"));
        let ctx = ctx_for(
            dir.path(),
            serde_json::json!({"verification_steps": {"type": "file_exists", "target": "a"}}),
        );
        let r = run_checks(&ctx, 1, &[]).await;
        assert_eq!(r.status, ReportStatus::Error);
        assert!(!r.status.is_success());
    }

    #[tokio::test]
    async fn git_clean_passes_on_committed_repo_and_errors_outside_git() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        std::fs::create_dir(ws.join("repo")).unwrap();
        std::fs::create_dir(ws.join("plain")).unwrap();
        let repo = ws.join("repo");
        git(&repo, &["init", "-q"]);
        std::fs::write(repo.join("a"), "1").unwrap();
        git(&repo, &["add", "a"]);
        git(&repo, &["commit", "-qm", "a"]);
        let ctx = ctx_for(
            ws,
            serde_json::json!({"verification_steps": [
                {"type": "git_clean", "target": "repo"},
                {"type": "git_clean", "target": "plain"}
            ]}),
        );
        let r = run_checks(&ctx, 2, &[]).await;
        assert_eq!(r.checks[0].status, CheckStatus::Pass, "{:?}", r.checks[0]);
        assert_eq!(r.checks[1].status, CheckStatus::Error, "{:?}", r.checks[1]);
        assert_eq!(r.run_number, 2);
    }

    #[tokio::test]
    async fn skip_and_auto_pass_reports() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx_for(
            dir.path(),
            serde_json::json!({"skip_verification": true,
                "verification_steps": [{"type": "command_succeeds", "target": "false"}]}),
        );
        let r = run_checks(&ctx, 1, &[]).await;
        assert_eq!(r.status, ReportStatus::Skip);
        assert!(r.checks.is_empty());
        let ctx = ctx_for(
            dir.path(),
            serde_json::json!({"verification_timeout_ms": 777}),
        );
        let r = run_checks(&ctx, 1, &[]).await;
        assert_eq!(r.status, ReportStatus::AutoPass);
        assert_eq!(r.timeout_ms, 777);
        let v = serde_json::to_value(&r).unwrap();
        for k in [
            "task_id",
            "run_number",
            "status",
            "started_at",
            "duration_ms",
            "timeout_ms",
            "checks",
            "summary",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(v["status"], "auto_pass");
    }

    #[tokio::test]
    async fn per_check_timeout_and_unreached_checks() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx_for(
            dir.path(),
            serde_json::json!({"verification_timeout_ms": 1500, "verification_steps": [
                {"type": "command_succeeds", "target": "sleep 30", "timeout_ms": 300},
                {"type": "command_succeeds", "target": "sleep 30"},
                {"type": "file_exists", "target": "x"}
            ]}),
        );
        let t0 = std::time::Instant::now();
        let r = run_checks(&ctx, 1, &[]).await;
        assert!(
            t0.elapsed() < Duration::from_millis(2500),
            "{:?}",
            t0.elapsed()
        );
        let st: Vec<CheckStatus> = r.checks.iter().map(|c| c.status).collect();
        assert_eq!(st, vec![CheckStatus::Timeout; 3], "{:#?}", r.checks);
        assert!(r.checks[2].output.contains("not run"));
        assert_eq!(r.status, ReportStatus::Timeout);
        assert_eq!(r.summary.timed_out, 3);
    }
}
