//! `hub-sidecar verify TASK.json --workspace DIR`: run only the task's verification steps
//! against a workspace and print the report as JSON. Exit 0 iff the report is `pass`,
//! `skip` or `auto_pass`.
//!
//! With no attempt to observe, an `llm_judge` check judges the workspace against a base. In a
//! git work tree that is a revision (`judge_base`): `--base REV`, else the merge base of
//! HEAD with the default branch — committed work is what a task branch holds, so "nothing
//! uncommitted" must not read as "nothing changed". The observations are then the commits
//! since the base and what is uncommitted, and stderr says which base was used. Outside git
//! ([`observe::against_baseline`]) every file counts as added.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::cli::VerifyArgs;
use crate::executor::ExecContext;
use crate::process::ChildEnv;
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
    let policy = crate::sandbox::Policy::probe_and_decide(cfg.containment).await;
    let grants = crate::sandbox::Grants {
        write: vec![workspace.clone()],
        task: true,
        caches: true,
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
        match judge_base(&ctx, args.base.as_deref()).await? {
            Some(base) => {
                eprintln!(
                    "verify: llm_judge sees the work since {} ({})",
                    &base.sha[..base.sha.len().min(12)],
                    base.why
                );
                observe::against_commit(&ctx.workspace, &base.sha, &ctx.env, &ctx.cancel).await
            }
            None => {
                eprintln!("verify: not a git work tree; llm_judge sees every file as added");
                observe::against_baseline(&ctx.workspace, &ctx.env, &ctx.cancel).await
            }
        }
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
    ChildEnv::from_config(&ctx.config)
        .redactor(&ctx.config)
        .await
        .scrub_value(&mut json);
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(if report.status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The revision `llm_judge` judges the work against, and why that one.
struct Base {
    sha: String,
    why: String,
}

/// `--base REV` resolved, else the merge base of HEAD with the default branch; `None` outside
/// a git work tree (and without `--base`). A `--base` that git cannot resolve is an error.
async fn judge_base(ctx: &ExecContext, base: Option<&str>) -> anyhow::Result<Option<Base>> {
    let in_git = git(ctx, &["rev-parse", "--is-inside-work-tree"])
        .await
        .is_some();
    if !in_git {
        anyhow::ensure!(
            base.is_none(),
            "--base needs a git work tree; {} is not one",
            ctx.workspace.display()
        );
        return Ok(None);
    }
    if let Some(rev) = base {
        let sha = git(
            ctx,
            &["rev-parse", "--verify", "-q", &format!("{rev}^{{commit}}")],
        )
        .await
        .with_context(|| {
            format!(
                "--base {rev}: no such commit in {}",
                ctx.workspace.display()
            )
        })?;
        return Ok(Some(Base {
            sha,
            why: format!("--base {rev}"),
        }));
    }
    let Some(head) = git(ctx, &["rev-parse", "--verify", "-q", "HEAD"]).await else {
        return Ok(None); // an unborn branch: everything is uncommitted
    };
    let default = match git(
        ctx,
        &["symbolic-ref", "-q", "--short", "refs/remotes/origin/HEAD"],
    )
    .await
    {
        Some(b) => Some(b),
        None => {
            let mut found = None;
            for b in ["main", "master", "origin/main", "origin/master"] {
                if git(
                    ctx,
                    &["rev-parse", "--verify", "-q", &format!("{b}^{{commit}}")],
                )
                .await
                .is_some()
                {
                    found = Some(b.to_string());
                    break;
                }
            }
            found
        }
    };
    let Some(default) = default else {
        return Ok(Some(Base {
            sha: head,
            why: "HEAD: no default branch (origin/HEAD, main, master) to compare with; pass --base"
                .into(),
        }));
    };
    Ok(Some(match git(ctx, &["merge-base", "HEAD", &default]).await {
        Some(sha) if sha == head => Base {
            sha,
            why: format!("HEAD, which is on {default}: only uncommitted work counts; pass --base to judge commits"),
        },
        Some(sha) => Base {
            sha,
            why: format!("the merge base of HEAD with {default}"),
        },
        None => Base {
            sha: head,
            why: format!("HEAD: it shares no history with {default}; pass --base"),
        },
    }))
}

/// One read-only git call in the workspace, hardened like every git call of the daemon;
/// its trimmed stdout, or `None` when it failed.
async fn git(ctx: &ExecContext, args: &[&str]) -> Option<String> {
    let ws = &ctx.workspace;
    if crate::git::harden::refusal(ws, &ctx.env, &ctx.cancel)
        .await
        .is_some()
    {
        return None;
    }
    let spec = crate::git::harden::command(ws, ws, &ctx.env)
        .arg("--no-optional-locks")
        .arg("-C")
        .arg(ws)
        .args(args.iter().copied());
    let limits = crate::process::Limits {
        timeout: Some(std::time::Duration::from_secs(30)),
        grace: std::time::Duration::from_millis(500),
        output_cap: 64 * 1024,
    };
    let out = crate::process::run(&spec, &limits, &ctx.cancel, None)
        .await
        .ok()?;
    out.exit
        .success()
        .then(|| out.stdout.trim().to_string())
        .filter(|s| !s.is_empty())
}
