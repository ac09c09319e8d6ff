//! The two budgets of one task: how many corrective retries it gets ([`RetryBudget`], one
//! rule, said in `result.retry_budget`) and what it may still spend ([`Caps`], the per-task
//! and per-day cost caps the loop checks before each execution and before the judge).

use serde::Serialize;

use crate::config::VerificationConfig;
use crate::task::{Task, MAX_VERIFICATION_RETRIES};

/// The effective number of corrective retries and where it came from (`result.retry_budget`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetryBudget {
    /// Corrective retries this task gets (executions = `max_retries + 1`).
    pub max_retries: u32,
    /// What was asked for, before any cap.
    pub requested: u32,
    /// Where `requested` came from: `task` (its `max_verification_retries`) or
    /// `config_default` (`verification.default_max_retries`; the task carried none).
    pub requested_from: &'static str,
    /// The operator's ceiling in force (`verification.retry_ceiling`).
    pub operator_ceiling: u32,
    /// What lowered the number, if anything: `hub_cap` (5), `retry_ceiling`, or
    /// `shell_executor` (never retried).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limited_by: Option<&'static str>,
    /// The rule applied, in one sentence.
    pub note: String,
}

impl RetryBudget {
    /// The one rule (module docs).
    pub fn decide(task: &Task, vcfg: &VerificationConfig, is_llm: bool) -> RetryBudget {
        let (requested, requested_from) = match task.max_verification_retries {
            Some(n) => (n, "task"),
            None => (vcfg.default_max_retries, "config_default"),
        };
        let mut b = RetryBudget {
            max_retries: requested,
            requested,
            requested_from,
            operator_ceiling: vcfg.retry_ceiling,
            limited_by: None,
            note: String::new(),
        };
        let asked = match requested_from {
            "task" => format!("the task asked for {requested}"),
            _ => format!("the task asked for none, so verification.default_max_retries = {requested} applies"),
        };
        if !is_llm {
            b.max_retries = 0;
            b.limited_by = (requested > 0).then_some("shell_executor");
            b.note = format!(
                "{asked}; a shell executor is never retried (it would run the same command again)"
            );
        } else if requested > MAX_VERIFICATION_RETRIES.min(vcfg.retry_ceiling) {
            if vcfg.retry_ceiling < MAX_VERIFICATION_RETRIES {
                b.max_retries = vcfg.retry_ceiling;
                b.limited_by = Some("retry_ceiling");
                b.note = format!("{asked}; this sidecar's operator ceiling verification.retry_ceiling = {} lowers it", vcfg.retry_ceiling);
            } else {
                b.max_retries = MAX_VERIFICATION_RETRIES;
                b.limited_by = Some("hub_cap");
                b.note = format!(
                    "{asked}; capped at {MAX_VERIFICATION_RETRIES}, the most any task gets"
                );
            }
        } else {
            b.note = asked;
        }
        b
    }
}

/// The cost caps of one task.
pub(crate) struct Caps {
    pub(crate) task: Option<f64>,
    pub(crate) day: Option<f64>,
}

impl Caps {
    /// Why a cost cap stops the loop, if one does.
    pub(crate) fn reached(&self, task_spent: f64, today: f64) -> Option<String> {
        if let Some(cap) = self.task.filter(|cap| task_spent >= *cap) {
            return Some(format!(
                "the per-task cost cap of ${cap:.4} is reached (spent ${task_spent:.4}); raise the task's metadata.max_cost_usd or verification.max_cost_usd_per_task"
            ));
        }
        if let Some(cap) = self.day.filter(|cap| today >= *cap) {
            return Some(format!(
                "the daily cost cap of ${cap:.4} is reached (spent ${today:.4} today, UTC); raise verification.max_cost_usd_per_day or wait for the next UTC day"
            ));
        }
        None
    }

    /// What may still be spent: the smaller of what both caps leave (`None`: no cap).
    pub(crate) fn remaining(&self, task_spent: f64, today: f64) -> Option<f64> {
        let t = self.task.map(|c| (c - task_spent).max(0.0));
        let d = self.day.map(|c| (c - today).max(0.0));
        match (t, d) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_rule_says_what_lowered_it() {
        let mut vcfg = crate::config::VerificationConfig::default();
        let mut t = Task::from_value(serde_json::json!({
            "task_id": "t", "description": "d",
            "verification_steps": [{"type": "file_exists", "target": "a"}]
        }))
        .unwrap();
        t.max_verification_retries = Some(5);
        // A default install gives the task the specification's cap: nothing lowers it.
        let b = RetryBudget::decide(&t, &vcfg, true);
        assert_eq!(
            (b.max_retries, b.requested, b.operator_ceiling, b.limited_by),
            (5, 5, 5, None)
        );
        // An operator may lower it, and the result says so.
        vcfg.retry_ceiling = 3;
        let b = RetryBudget::decide(&t, &vcfg, true);
        assert_eq!(
            (b.max_retries, b.requested, b.limited_by),
            (3, 5, Some("retry_ceiling"))
        );
        assert!(
            b.note.contains("verification.retry_ceiling = 3"),
            "{}",
            b.note
        );
        vcfg.retry_ceiling = 5;
        t.max_verification_retries = Some(9);
        let b = RetryBudget::decide(&t, &vcfg, true);
        assert_eq!((b.max_retries, b.limited_by), (5, Some("hub_cap")));
        t.max_verification_retries = None;
        vcfg.default_max_retries = 2;
        let b = RetryBudget::decide(&t, &vcfg, true);
        assert_eq!(
            (b.max_retries, b.requested_from, b.limited_by),
            (2, "config_default", None)
        );
        let b = RetryBudget::decide(&t, &vcfg, false);
        assert_eq!((b.max_retries, b.limited_by), (0, Some("shell_executor")));
    }
}
