//! Prompts the loop gives LLM executors: the first one (task + completion criteria) and the
//! corrective one after a failed verification.
//!
//! The corrective prompt always restates the ORIGINAL task (never a previous corrective
//! prompt), so the instructions do not drift across attempts; only the latest failure is
//! shown in full, earlier attempts get one line each to keep the prompt bounded.
//!
//! A failed check's output is cut by [`excerpt`], not from the front: test runners print the
//! passing lines first and the failure last, so the prompt keeps the head, the tail (where
//! stderr lands in the combined output) and the lines around failure markers (`FAILED`,
//! `panicked`, `Error`, `assert`, …), and says how much was cut. Every check that did not
//! pass is shown as failed (a check that errored stops the loop before any re-prompt, so in
//! practice these are `fail` and `timeout`), and their count is in the first line.
//!
//! Two corrective forms: [`corrective_prompt`], self-contained (task, plan, previous output),
//! for an executor that starts afresh; [`corrective_turn`], what failed and the stored plan,
//! for a conversation the executor kept.

use crate::task::Task;
use crate::util::truncate_chars;

use super::checks::status_str;
use super::report::AttemptRecord;
use super::report::CheckStatus;
use crate::plan::{self, Plan};

/// Characters of a failed check's output shown in a corrective prompt.
pub const CHECK_OUTPUT_CHARS: usize = 2_000;

/// Substrings that mark a line as part of a failure report.
const FAILURE_MARKERS: &[&str] = &[
    "FAILED",
    "FAIL",
    "panicked",
    "Error",
    "error",
    "assert",
    "Assert",
    "Traceback",
    "expected",
];
/// Lines kept on each side of a marker line.
const MARKER_CONTEXT: usize = 2;
/// A single line is never longer than this in an excerpt.
const MAX_LINE_CHARS: usize = 300;

/// `output` within about `budget` characters: the head, the tail and the lines around
/// failure markers, in their original order, with "[… N lines cut …]" where lines were
/// left out and a first line saying how much is shown.
pub fn excerpt(output: &str, budget: usize) -> String {
    let output = output.trim_end();
    if output.chars().count() <= budget {
        return output.to_string();
    }
    let lines: Vec<String> = output
        .lines()
        .map(|l| {
            if l.chars().count() > MAX_LINE_CHARS {
                format!("{} […]", truncate_chars(l, MAX_LINE_CHARS))
            } else {
                l.to_string()
            }
        })
        .collect();
    let n = lines.len();
    let cost = |i: usize| lines[i].chars().count() + 1;
    let mut keep = vec![false; n];
    let mut used = 0usize;
    let take = |i: usize, keep: &mut Vec<bool>, used: &mut usize, limit: usize| -> bool {
        if keep[i] {
            return true;
        }
        if *used + cost(i) > limit {
            return false;
        }
        keep[i] = true;
        *used += cost(i);
        true
    };
    // Tail first (the failure is usually printed last), then the marker windows from the
    // end backwards, then the head with what is left.
    let tail_budget = budget * 2 / 5;
    for i in (0..n).rev() {
        if !take(i, &mut keep, &mut used, tail_budget) {
            break;
        }
    }
    let marker_budget = budget * 17 / 20;
    'markers: for i in (0..n).rev() {
        if !FAILURE_MARKERS.iter().any(|m| lines[i].contains(m)) {
            continue;
        }
        let lo = i.saturating_sub(MARKER_CONTEXT);
        let hi = (i + MARKER_CONTEXT).min(n - 1);
        for j in lo..=hi {
            if !take(j, &mut keep, &mut used, marker_budget) {
                break 'markers;
            }
        }
    }
    for i in 0..n {
        if !take(i, &mut keep, &mut used, budget) {
            break;
        }
    }
    let shown = keep.iter().filter(|k| **k).count();
    let mut s = format!(
        "[output cut to fit: {shown} of {n} lines shown — the head, the tail and the lines around failure markers]\n"
    );
    let mut gap = 0usize;
    for (i, line) in lines.iter().enumerate() {
        if keep[i] {
            if gap > 0 {
                s.push_str(&format!("[… {gap} lines cut …]\n"));
                gap = 0;
            }
            s.push_str(line);
            s.push('\n');
        } else {
            gap += 1;
        }
    }
    if gap > 0 {
        s.push_str(&format!("[… {gap} lines cut …]\n"));
    }
    s.trim_end().to_string()
}
/// Characters of the previous attempt's output shown in a corrective prompt.
pub const PREVIOUS_OUTPUT_CHARS: usize = 1_000;

/// The first whole lines of `text` within `budget` characters, and whether anything was left
/// out. Never a line cut in the middle, except a first line longer than the whole budget
/// (then its start, marked `[…]`, so the quote is never empty).
pub fn head_lines(text: &str, budget: usize) -> (String, bool) {
    let mut s = String::new();
    let mut used = 0usize;
    for line in text.lines() {
        let n = line.chars().count() + usize::from(!s.is_empty());
        if used + n > budget {
            if s.is_empty() {
                s = format!("{} […]", truncate_chars(line, budget));
            }
            return (s, true);
        }
        if !s.is_empty() {
            s.push('\n');
        }
        s.push_str(line);
        used += n;
    }
    (s, false)
}

/// The previous attempt's output as a corrective prompt quotes it: its first whole lines
/// within [`PREVIOUS_OUTPUT_CHARS`] (the plan, when there was one, is at its start), and a
/// line saying that the rest was left out.
pub fn quote_previous_output(output: &str) -> String {
    match head_lines(output.trim(), PREVIOUS_OUTPUT_CHARS) {
        (s, false) => s,
        (s, true) => format!(
            "{s}\n[… the rest is not shown: only whole lines are quoted, up to {PREVIOUS_OUTPUT_CHARS} characters]"
        ),
    }
}

/// The task as the agent must understand it: description, success criteria, and the
/// verification steps as completion criteria. Every prompt restates it, never a previous
/// corrective prompt, so the instructions do not drift across attempts.
pub fn task_statement(task: &Task) -> String {
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
    s
}

/// The first prompt: the [`task_statement`] and the request for a plan in the
/// specification's shape ([`plan::REQUEST`]).
pub fn first_prompt(task: &Task) -> String {
    format!("{}\n\n{}", task_statement(task), plan::REQUEST)
}

/// Checks of `last` that are not passing: what a retry has to fix.
pub fn failing_count(last: &AttemptRecord) -> usize {
    last.report
        .checks
        .iter()
        .filter(|c| c.status != CheckStatus::Pass)
        .count()
}

/// The first line of every corrective prompt and turn (the specification's announcement).
fn header(retry: u32, max_retries: u32, history: &[AttemptRecord]) -> String {
    let m = history.last().map_or(0, failing_count);
    format!("VERIFICATION RETRY {retry}/{max_retries}: fixing {m} failed check(s). Your previous attempt did not pass verification. Fix the failed checks below without breaking the passing ones.\n")
}

/// Failed and passed checks of the latest run, what it changed, and one line per earlier run.
fn failure_sections(s: &mut String, history: &[AttemptRecord]) {
    if let Some(last) = history.last() {
        s.push_str("\nFAILED CHECKS:\n");
        for c in last
            .report
            .checks
            .iter()
            .filter(|c| c.status != CheckStatus::Pass)
        {
            let flaky = if c.flaky {
                " (it passed when run again: make it pass reliably)"
            } else {
                ""
            };
            s.push_str(&format!(
                "- type: {} | target: {} | status: {}{flaky}\n  output: {}\n",
                c.check_type,
                c.target,
                status_str(c.status),
                excerpt(c.output.trim(), CHECK_OUTPUT_CHARS).replace('\n', "\n    ")
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
}

/// The plan section of a corrective prompt: the plan made once, or (none was found) the
/// request for one.
fn plan_section(s: &mut String, plan: Option<&Plan>) {
    match plan {
        Some(p) => s.push_str(&format!(
            "\nYOUR PLAN (made on attempt {}; keep to it, do not plan again: redo the steps whose verification failed):\n{}",
            p.made_on_attempt,
            p.render()
        )),
        None => s.push_str(&format!(
            "\nYou did not write a plan in the requested form. {}\n",
            plan::REQUEST
        )),
    }
}

/// The corrective prompt of retry `retry` (1-based) of `max_retries`, self-contained, for an
/// executor that starts afresh (a new `claude -p` run, a chat rebuilt after a restart).
///
/// `history` holds every verification run so far; the last one is the failure to fix.
pub fn corrective_prompt(
    task: &Task,
    retry: u32,
    max_retries: u32,
    history: &[AttemptRecord],
    previous_output: &str,
    plan: Option<&Plan>,
) -> String {
    let mut s = header(retry, max_retries, history);
    failure_sections(&mut s, history);
    s.push_str(&format!("\nORIGINAL TASK:\n{}\n", task_statement(task)));
    plan_section(&mut s, plan);
    s.push_str(&format!(
        "\nYOUR PREVIOUS OUTPUT:\n{}\n",
        quote_previous_output(previous_output)
    ));
    s
}

/// The short corrective turn added to a conversation the executor kept (Ollama's chat): the
/// task and the agent's own answer are already in it, so what failed is new — and the stored
/// plan, whole, as the loop keeps it: the model's own plan message may have been summarised
/// to fit the context window, and a retry must not re-plan from a stub.
pub fn corrective_turn(
    retry: u32,
    max_retries: u32,
    history: &[AttemptRecord],
    plan: Option<&Plan>,
) -> String {
    let mut s = header(retry, max_retries, history);
    failure_sections(&mut s, history);
    plan_section(&mut s, plan);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::report::{CheckResult, CheckStatus, VerificationReport};

    fn rec(run: u32, checks: Vec<(&str, &str, CheckStatus, &str)>, obs: &[&str]) -> AttemptRecord {
        let checks = checks
            .into_iter()
            .map(|(t, g, s, o)| CheckResult {
                check_type: t.into(),
                target: g.into(),
                description: None,
                status: s,
                output: o.into(),
                duration_ms: 1,
                flaky: false,
                cost_usd: 0.0,
                tokens_in: 0,
                tokens_out: 0,
            })
            .collect();
        AttemptRecord {
            report: VerificationReport::from_checks("t", run, 0, 1, 1000, checks, false),
            observations: obs.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn task() -> crate::task::Task {
        crate::task::Task::from_value(serde_json::json!({
            "task_id": "t", "description": "Write hello.txt saying hi",
            "success_criteria": ["hello.txt contains hi"],
            "verification_steps": [
                {"type": "file_exists", "target": "hello.txt", "description": "the file"},
                {"type": "command_succeeds", "target": "grep -q hi hello.txt"}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn first_prompt_lists_criteria_and_asks_for_a_plan() {
        let p = first_prompt(&task());
        assert!(p.starts_with("Write hello.txt saying hi"));
        assert!(p.contains("- hello.txt contains hi"));
        assert!(p.contains("- file_exists: hello.txt (the file)"));
        assert!(p.contains("- command_succeeds: grep -q hi hello.txt"));
        // The plan in the specification's shape: goal, numbered steps, each verified.
        assert!(p.contains("PLAN\nGoal: "), "{p}");
        assert!(p.contains("1. <action> -> verify: <how"), "{p}");
        assert!(p.contains("each completion criterion"));
    }

    #[test]
    fn corrective_prompt_has_every_section_and_truncates() {
        let long = "x".repeat(5000);
        let h = vec![
            rec(
                1,
                vec![("file_exists", "hello.txt", CheckStatus::Fail, "old failure")],
                &["workspace unchanged"],
            ),
            rec(
                2,
                vec![
                    ("file_exists", "hello.txt", CheckStatus::Pass, "exists"),
                    (
                        "command_succeeds",
                        "grep -q hi hello.txt",
                        CheckStatus::Fail,
                        &long,
                    ),
                ],
                &["added: hello.txt (+1 lines)"],
            ),
        ];
        let p = corrective_prompt(&task(), 2, 4, &h, &"y".repeat(3000), None);
        assert!(
            p.starts_with("VERIFICATION RETRY 2/4: fixing 1 failed check(s)."),
            "{p}"
        );
        let failed = p.find("FAILED CHECKS:").unwrap();
        let passed = p.find("PASSED CHECKS (keep these passing):").unwrap();
        assert!(failed < passed);
        assert!(p.contains("type: command_succeeds | target: grep -q hi hello.txt | status: fail"));
        // One 5,000-char line: cut to a bounded line, and the cut is said.
        assert!(p.contains(&"x".repeat(300)) && !p.contains(&"x".repeat(301)));
        assert!(p.contains("[output cut to fit"));
        assert!(p.contains("- file_exists: hello.txt\n"));
        assert!(p.contains("- added: hello.txt (+1 lines)"));
        assert!(p.contains("- attempt 1: 0 passed, 1 not passing: file_exists hello.txt (fail)"));
        assert!(
            !p.contains("old failure"),
            "only the latest failure in full"
        );
        assert!(p.contains("ORIGINAL TASK:\nWrite hello.txt saying hi"));
        assert!(p.contains("YOUR PREVIOUS OUTPUT:\n"));
        assert!(p.contains(&"y".repeat(1000)) && !p.contains(&"y".repeat(1001)));
        // No plan was found: the corrective prompt asks for one; with a plan it carries it.
        assert!(p.contains("You did not write a plan"), "{p}");
        let plan = crate::plan::Plan::find(
            "Goal: greet\nSteps:\n1. write hello.txt -> verify: grep hi",
            1,
        );
        let p = corrective_prompt(&task(), 2, 4, &h, "", plan.as_ref());
        assert!(p.contains("YOUR PLAN (made on attempt 1; keep to it, do not plan again"));
        assert!(p.contains("1. write hello.txt -> verify: grep hi"), "{p}");
        assert!(!p.contains("Before you change anything"), "{p}");
        // The short turn for a kept chat: what failed, no task, no previous output.
        let t = corrective_turn(2, 4, &h, plan.as_ref());
        assert!(t.starts_with("VERIFICATION RETRY 2/4: fixing 1 failed check(s)."));
        assert!(t.contains("FAILED CHECKS:") && t.contains("YOUR PLAN (made on attempt 1"));
        assert!(t.contains("1. write hello.txt -> verify: grep hi"), "{t}");
        assert!(!t.contains("ORIGINAL TASK") && !t.contains("YOUR PREVIOUS OUTPUT"));
        assert!(t.len() < p.len());
    }

    /// The retry that asks for the plan again quotes what the agent said in whole lines.
    #[test]
    fn the_previous_output_is_quoted_in_whole_lines() {
        let h = vec![rec(
            1,
            vec![("file_exists", "hello.txt", CheckStatus::Fail, "missing")],
            &["workspace unchanged"],
        )];
        // 40 lines of 35 characters: 1,000 characters end in the middle of line 28.
        let said: Vec<String> = (0..40)
            .map(|i| format!("my plan, roughly, step {i:02} of forty."))
            .collect();
        let p = corrective_prompt(&task(), 1, 3, &h, &said.join("\n"), None);
        assert!(p.contains("You did not write a plan"), "{p}");
        let quoted = p.split("YOUR PREVIOUS OUTPUT:\n").nth(1).unwrap();
        let lines: Vec<&str> = quoted.lines().collect();
        let whole = lines
            .iter()
            .filter(|l| said.iter().any(|s| s == *l))
            .count();
        assert_eq!(whole, 27, "{quoted}");
        assert_eq!(
            lines[..27],
            said[..27].iter().map(String::as_str).collect::<Vec<_>>()[..]
        );
        assert!(
            lines[27].starts_with("[… the rest is not shown: only whole lines"),
            "no line is cut in the middle: {quoted}"
        );
        // Short output is quoted as is.
        assert_eq!(quote_previous_output("a\nb\n"), "a\nb");
    }

    #[test]
    fn a_failure_printed_last_survives_the_cut() {
        let mut out = String::new();
        for i in 0..300 {
            out.push_str(&format!("test tests::case_{i:03} ... ok\n"));
            if i == 150 {
                out.push_str("thread 'tests::middle' panicked at src/lib.rs:42:5:\n");
            }
        }
        out.push_str("---- tests::last stdout ----\n");
        out.push_str("assertion `left == right` failed\n  left: 1\n right: 2\n");
        out.push_str("test result: FAILED. 299 passed; 1 failed\n");
        let e = excerpt(&out, CHECK_OUTPUT_CHARS);
        assert!(e.chars().count() <= CHECK_OUTPUT_CHARS + 200, "{}", e.len());
        assert!(
            e.contains("assertion `left == right` failed\n  left: 1\n right: 2"),
            "{e}"
        );
        assert!(e.contains("test result: FAILED"));
        assert!(e.contains("panicked at src/lib.rs:42:5"), "{e}");
        assert!(
            e.contains("test tests::case_000 ... ok"),
            "the head is kept: {e}"
        );
        assert!(e.starts_with("[output cut to fit: "));
        assert!(e.contains(" lines cut …]"));
        // Short output is left alone.
        assert_eq!(excerpt("one\ntwo", 100), "one\ntwo");
    }
}
