//! What a finished task leaves on disk, and reporting a tree of it that could not be
//! removed: set aside (`sandbox::teardown`), counted in `/metrics` and `/healthz` and
//! written into the task's flight record.

use std::path::PathBuf;

use crate::git::GitRunner;
use crate::ops::Ops;
use crate::process::ChildEnv;
use crate::recorder::TaskRecord;
use crate::sandbox::teardown::Budget;
use crate::workspace::{self, Workspace};

/// What a finished task leaves behind: removed by [`Leftovers::remove`] once the result is
/// stored and sent, not before. The frame needs none of it, and on a journaling file system
/// removing a task's HOME (a dozen directories) is ~2.5 ms the hub would otherwise wait for
/// (BENCHMARKS.md, figure 3). Whoever holds it must remove it before the next task prepares:
/// the next task may get the same paths (a re-assigned task id) or the same managed clone.
#[must_use = "a task's TMPDIR and temp workspace stay on disk unless removed"]
pub struct Leftovers {
    /// The task's sandboxes (its children's and the daemon git's), closed first: closing a
    /// view's last namespace descriptor unmounts its trees and waits for the kernel (RCU),
    /// and its holder is reaped; all children have ended, so nothing needs them any more,
    /// and the frame need not wait for it either.
    sandboxes: Option<(ChildEnv, GitRunner)>,
    workspace: Option<Workspace>,
    tmp: Option<PathBuf>,
    /// Where a tree set aside is reported: the task's record (kept open until then) and
    /// the operator's counters.
    report: Option<(TaskRecord, Ops)>,
    /// The TMPDIR removal's budget: [`Budget::for_task_tree`] but in tests.
    budget: fn() -> Budget,
}

impl Leftovers {
    /// The task's workspace (if prepared) and TMPDIR; a tree set aside is reported into
    /// `record` and `ops`.
    pub(crate) fn new(
        workspace: Option<Workspace>,
        tmp: PathBuf,
        record: &TaskRecord,
        ops: &Ops,
    ) -> Self {
        Leftovers {
            sandboxes: None,
            workspace,
            tmp: Some(tmp),
            report: Some((record.clone(), ops.clone())),
            budget: Budget::for_task_tree,
        }
    }

    /// Also close the task's sandboxes (held by `env` and `git`) here, off the result's way.
    pub(crate) fn closing(mut self, env: ChildEnv, git: GitRunner) -> Self {
        self.sandboxes = Some((env, git));
        self
    }

    /// Close the task's sandboxes, remove the temp workspace, release the clone, remove the
    /// private TMPDIR; report what had to be set aside.
    pub async fn remove(self) {
        let Leftovers {
            sandboxes,
            workspace,
            tmp,
            report,
            budget,
        } = self;
        // All of it blocks (unmounts, a reap, two tree removals): one job on the blocking
        // pool, not one each. Every job is a wake-up of a pool thread and of the runtime's,
        // and those waits grow on a host that steals CPU (BENCHMARKS.md, "Where a task's
        // CPU and wake-ups go").
        let removed = tokio::task::spawn_blocking(move || {
            drop(sandboxes);
            let mut set_aside = Vec::new();
            if let Some(ws) = workspace {
                set_aside.extend(ws.release_blocking());
            }
            if let Some(tmp) = tmp {
                set_aside.extend(workspace::remove_task_tmp_dir(&tmp, budget()));
            }
            set_aside
        })
        .await;
        let set_aside = match removed {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "removing what a task left failed; its TMPDIR or temp workspace may be left on disk");
                Vec::new()
            }
        };
        let Some((record, ops)) = report else {
            return;
        };
        for s in &set_aside {
            record.set_aside(s.what, &s.to, &s.why);
        }
        ops.trees_set_aside(set_aside.len());
    }

    /// Nothing to remove (a stand-in runner in tests).
    #[cfg(test)]
    pub(crate) fn nothing() -> Self {
        Leftovers {
            sandboxes: None,
            workspace: None,
            tmp: None,
            report: None,
            budget: Budget::for_task_tree,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RecorderConfig;
    use crate::recorder::{self, Recorder};
    use crate::redact::Redactor;
    use crate::task::Task;
    use std::sync::Arc;

    /// A TMPDIR over its removal's budget is set aside, and the operator and the task's
    /// record both hear of it: `/metrics`, `/healthz`, the flight record.
    #[tokio::test]
    async fn a_tree_set_aside_reaches_metrics_health_and_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let (rec, writer) = Recorder::start(dir.path().join("records"), RecorderConfig::default());
        let task = Task::from_value(serde_json::json!({"task_id": "t-aside", "description": "x"}))
            .unwrap();
        let record = rec.open(&task, Some("shell"), Arc::new(Redactor::new(vec![])));
        let ops = Ops::new();
        let tmp = dir.path().join("tmp").join("t-aside");
        std::fs::create_dir_all(tmp.join("nest")).unwrap();
        for i in 0..20 {
            std::fs::write(tmp.join(format!("nest/f{i}")), "x").unwrap();
        }
        let mut left = Leftovers::new(None, tmp.clone(), &record, &ops);
        left.budget = || Budget::new(5, std::time::Duration::from_secs(60));
        drop(record);
        left.remove().await;

        assert!(!tmp.exists());
        let metrics = ops.metrics().encode();
        assert!(
            metrics.contains("hub_sidecar_trees_set_aside 1\n"),
            "{metrics}"
        );
        assert_eq!(ops.snapshot().trees_set_aside, 1);
        drop(rec);
        writer.await.unwrap();
        let story = std::fs::read_to_string(
            dir.path()
                .join("records")
                .join(recorder::dir_name("t-aside"))
                .join(recorder::RECORD_FILE),
        )
        .unwrap();
        let line = story
            .lines()
            .find(|l| l.contains("\"kind\":\"set_aside\""))
            .unwrap_or_else(|| panic!("no set_aside line in {story}"));
        assert!(
            line.contains("\"what\":\"TMPDIR\"") && line.contains(".set-aside"),
            "{line}"
        );
    }
}
