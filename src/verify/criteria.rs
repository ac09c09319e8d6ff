//! A task that gives `success_criteria` but no `verification_steps`: what checks it.
//!
//! The seeds disagree. The loop's specification (`002_…`) counts a task with no steps as
//! done (`auto_pass`, "Tasks with … empty `verification_steps` bypass the loop"); the
//! planning design (`004_…`) never accepts a claimed success until each completion
//! criterion was checked. The choice: where the operator configured a judge
//! (`verification.judge_backend` set), each success criterion becomes an `llm_judge` check
//! of what the attempt changed — 004's rule, with 002's loop (a criterion the judge rejects
//! is a failed check, retried like any other). Where none is configured there is nothing
//! that could check prose, so the report stays `auto_pass` as 002 and PROTOCOL.md §7 define
//! it, and the result says plainly that nothing was verified (`result.not_verified`, and a
//! `status` event before the first attempt), so no reader mistakes it for checked work.

use crate::config::VerificationConfig;
use crate::task::{CheckType, Task, VerificationStep};

/// The description of a check made from a success criterion.
pub const JUDGED_CRITERION: &str =
    "success criterion, checked by the judge (the task gives no verification_steps)";

/// Whether the task is the case this module is about.
fn criteria_only(task: &Task) -> bool {
    !task.skip_verification
        && task.verification_steps.is_empty()
        && task.success_criteria.iter().any(|c| !c.trim().is_empty())
}

/// The checks a task with criteria and no steps gets: one `llm_judge` per criterion where
/// a judge is configured, else none.
pub fn judged_steps(task: &Task, vcfg: &VerificationConfig) -> Vec<VerificationStep> {
    if !criteria_only(task) || !vcfg.judge_configured {
        return Vec::new();
    }
    task.success_criteria
        .iter()
        .filter(|c| !c.trim().is_empty())
        .map(|c| VerificationStep {
            check_type: CheckType::LlmJudge,
            target: c.trim().to_string(),
            description: Some(JUDGED_CRITERION.to_string()),
            timeout_ms: None,
            invalid: None,
        })
        .collect()
}

/// What the result says when the task's criteria go unchecked (no judge configured).
pub fn not_verified(task: &Task, vcfg: &VerificationConfig) -> Option<String> {
    (criteria_only(task) && !vcfg.judge_configured).then(|| {
        format!(
            "nothing was verified: the task gives {} success criteria but no verification_steps, and no judge is configured to check them (set verification.judge_backend, or give verification_steps)",
            task.success_criteria.len()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(v: serde_json::Value) -> Task {
        let mut v = v;
        v["task_id"] = "t".into();
        v["description"] = "d".into();
        Task::from_value(v).unwrap()
    }

    #[test]
    fn criteria_are_judged_only_where_a_judge_is_configured() {
        let t = task(serde_json::json!({"success_criteria": ["a.txt says hi", " "]}));
        let mut vcfg = VerificationConfig::default();
        assert!(judged_steps(&t, &vcfg).is_empty());
        let said = not_verified(&t, &vcfg).unwrap();
        assert!(said.starts_with("nothing was verified"), "{said}");
        vcfg.judge_configured = true;
        let steps = judged_steps(&t, &vcfg);
        assert_eq!(steps.len(), 1);
        assert_eq!(
            (&steps[0].check_type, steps[0].target.as_str()),
            (&CheckType::LlmJudge, "a.txt says hi")
        );
        assert_eq!(not_verified(&t, &vcfg), None);
        // Steps given, verification skipped, or no criteria: not this case.
        for other in [
            serde_json::json!({"success_criteria": ["x"],
                "verification_steps": [{"type": "file_exists", "target": "a"}]}),
            serde_json::json!({"success_criteria": ["x"], "skip_verification": true}),
            serde_json::json!({}),
        ] {
            let t = task(other);
            assert!(judged_steps(&t, &vcfg).is_empty());
            vcfg.judge_configured = false;
            assert_eq!(not_verified(&t, &vcfg), None);
            vcfg.judge_configured = true;
        }
    }
}
