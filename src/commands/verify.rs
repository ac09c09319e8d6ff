//! `hub-sidecar verify TASK.json --workspace DIR`: run only the task's verification steps
//! against a workspace and print the report as JSON. Exit 0 iff the report is `pass`,
//! `skip` or `auto_pass`.
//!
//! With no attempt to observe, an `llm_judge` check judges the workspace against its
//! baseline ([`observe::against_baseline`]): the uncommitted changes in a git work tree,
//! every file elsewhere.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::cli::VerifyArgs;
use crate::executor::ExecContext;
use crate::process::ChildEnv;
use crate::redact::Redactor;
use crate::task::CheckType;
use crate::verify::{checks, observe};

/// Run the checks once and print the report.
pub async fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let task = super::read_task(&args.task).await?;
    let state = super::run_task::temp_dir("hub-sidecar-state-").await?;
    let cfg = super::run_task::offline_config(args.config.as_deref(), Some(state.path()))?;
    let workspace = tokio::fs::canonicalize(&args.workspace)
        .await
        .with_context(|| {
            format!(
                "the workspace {} does not exist; pass an existing directory with --workspace",
                args.workspace.display()
            )
        })?;
    // Checks are commands from the task: confined like a task's, with a throwaway TMPDIR.
    let policy = crate::sandbox::Policy::probe_and_decide(&cfg).await;
    let grants = crate::sandbox::Grants {
        write: vec![workspace.clone()],
        task: true,
        ..Default::default()
    };
    let tmp = state.path().join("tmp");
    let env = crate::process::confine(&cfg, &policy, &ChildEnv::from_config(&cfg), &tmp, &grants)?;
    let line = crate::term::ProgressLine::start(1);
    let ctx = ExecContext {
        task: Arc::new(task),
        workspace,
        env,
        progress: line.sink(cfg.progress.max_text_bytes),
        config: Arc::new(cfg),
        cancel: CancellationToken::new(),
        remaining_budget_usd: None,
    };
    let needs_observations = ctx
        .task
        .verification_steps
        .iter()
        .any(|s| s.check_type == CheckType::LlmJudge);
    let observations = if needs_observations {
        observe::against_baseline(&ctx.workspace, &ctx.env, &ctx.cancel).await
    } else {
        Vec::new()
    };
    let checks = checks::run_checks(&ctx, 1, &observations);
    tokio::pin!(checks);
    let report = tokio::select! {
        r = &mut checks => r,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted: stopping the checks");
            ctx.cancel.cancel();
            checks.await
        }
    };
    line.finish().await;
    tokio::task::spawn_blocking(move || drop(state)).await?;
    let mut json = serde_json::to_value(&report).context("serializing the report")?;
    Redactor::from_config(&ctx.config).scrub_value(&mut json);
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(if report.status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
