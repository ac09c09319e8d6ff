//! Prompts the loop gives LLM executors: the first one (task + completion criteria) and the
//! corrective one after a failed verification.
//!
//! The corrective prompt always restates the ORIGINAL task (never a previous corrective
//! prompt), so the instructions do not drift across attempts; only the latest failure is
//! shown in full, earlier attempts get one line each to keep the prompt bounded.

use crate::task::Task;
use crate::util::truncate_chars;

use super::checks::status_str;
use super::report::CheckStatus;
use super::retry_loop::AttemptRecord;

/// Characters of a failed check's output shown in a corrective prompt.
pub const CHECK_OUTPUT_CHARS: usize = 500;
/// Characters of the previous attempt's output shown in a corrective prompt.
pub const PREVIOUS_OUTPUT_CHARS: usize = 1_000;

/// The first prompt: description, success criteria, verification steps as completion
/// criteria, and the instruction to plan first and check each criterion before finishing.
pub fn first_prompt(task: &Task) -> String {
    let mut s = task.description.trim().to_string();
    if !task.success_criteria.is_empty() {
        s.push_str("\n\nSUCCESS CRITERIA:\n");
        for c in &task.success_criteria {
            s.push_str(&format!("- {c}\n"));
        }
    }
    if !task.verification_steps.is_empty() && !task.skip_verification {
        s.push_str("\n\nCOMPLETION CRITERIA (these checks will be run on your work):\n");
        for v in &task.verification_steps {
            s.push_str(&format!("- {}: {}", v.check_type, v.target));
            if let Some(d) = v.description.as_deref().filter(|d| !d.is_empty()) {
                s.push_str(&format!(" ({d})"));
            }
            s.push('\n');
        }
    }
    s.push_str("\n\nPlan your approach before changing anything. Before you finish, check each criterion above yourself and fix what does not hold.");
    s
}

/// The corrective prompt for attempt `attempt` (2-based: retry `attempt - 1` of `max_retries`).
///
/// `history` holds every verification run so far; the last one is the failure to fix.
pub fn corrective_prompt(
    task: &Task,
    attempt: u32,
    max_retries: u32,
    history: &[AttemptRecord],
    previous_output: &str,
) -> String {
    let retry = attempt.saturating_sub(1);
    let mut s = format!("VERIFICATION RETRY {retry}/{max_retries}\n\nYour previous attempt did not pass verification. Fix the failed checks below without breaking the passing ones.\n");
    if let Some(last) = history.last() {
        s.push_str("\nFAILED CHECKS:\n");
        for c in last
            .report
            .checks
            .iter()
            .filter(|c| c.status != CheckStatus::Pass)
        {
            s.push_str(&format!(
                "- type: {} | target: {} | status: {}\n  output: {}\n",
                c.check_type,
                c.target,
                status_str(c.status),
                truncate_chars(c.output.trim(), CHECK_OUTPUT_CHARS).replace('\n', "\n    ")
            ));
        }
        let passed: Vec<_> = last
            .report
            .checks
            .iter()
            .filter(|c| c.status == CheckStatus::Pass)
            .collect();
        if !passed.is_empty() {
            s.push_str("\nPASSED CHECKS (keep these passing):\n");
            for c in passed {
                s.push_str(&format!("- {}: {}\n", c.check_type, c.target));
            }
        }
        s.push_str("\nWHAT YOUR LAST ATTEMPT CHANGED:\n");
        for o in &last.observations {
            s.push_str(&format!("- {o}\n"));
        }
    }
    if history.len() > 1 {
        s.push_str("\nEARLIER ATTEMPTS:\n");
        for r in &history[..history.len() - 1] {
            let failed: Vec<String> = r
                .report
                .checks
                .iter()
                .filter(|c| c.status != CheckStatus::Pass)
                .map(|c| format!("{} {} ({})", c.check_type, c.target, status_str(c.status)))
                .collect();
            s.push_str(&format!(
                "- attempt {}: {} passed, {} not passing: {}\n",
                r.report.run_number,
                r.report.summary.passed,
                failed.len(),
                failed.join(", ")
            ));
        }
    }
    s.push_str(&format!("\nORIGINAL TASK:\n{}\n", first_prompt(task)));
    s.push_str(&format!(
        "\nYOUR PREVIOUS OUTPUT:\n{}\n",
        truncate_chars(previous_output.trim(), PREVIOUS_OUTPUT_CHARS)
    ));
    s
}
