//! The task's plan: asked for once, in one shape, found in the first attempt's words, and
//! carried into every later prompt.
//!
//! Owns the plan's shape (the specification's: a goal, then numbered steps each saying how it
//! will be verified), the request for it in the first prompt, [`Plan::find`] in what the agent
//! wrote, and how a plan is handed back to a later attempt. The loop, not the executor, keeps
//! the plan: a fresh `claude -p` run and an Ollama chat rebuilt after a restart both get it
//! back in their prompt, so no attempt plans again from scratch.

use serde::{Deserialize, Serialize};

/// Text of the assistant kept for [`Plan::find`]: a plan comes first, so the head suffices.
pub const NARRATIVE_HEAD_BYTES: usize = 16 * 1024;

/// Steps kept from one plan (a longer list is cut, and says so).
const MAX_STEPS: usize = 20;
/// Characters kept per goal, step or criterion.
const MAX_ITEM_CHARS: usize = 300;

/// The instruction of the first prompt (and of a corrective prompt when no plan was found).
pub const REQUEST: &str = "Before you change anything, write your plan in exactly this form:

PLAN
Goal: <what the task asks for, in one sentence>
Steps:
1. <action> -> verify: <how you will confirm this step is done>
2. <action> -> verify: <how you will confirm this step is done>

Then carry out the steps in order. Before you finish, confirm each step's verification and each completion criterion above yourself, and fix what does not hold.";

/// A plan as the agent wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// What the task asks for, in the agent's words.
    pub goal: String,
    /// The steps, in order.
    pub steps: Vec<PlanStep>,
    /// The attempt whose output it was found in (1-based).
    pub made_on_attempt: u32,
}

/// One numbered step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStep {
    /// What the step does.
    pub action: String,
    /// How the agent said it would confirm the step (empty: it did not say).
    pub verify: String,
}

impl Plan {
    /// The plan in `text`: a `Goal:` line followed by numbered steps. `None` without a goal
    /// or without a step: a list of intentions with no goal is not the shape asked for.
    pub fn find(text: &str, attempt: u32) -> Option<Plan> {
        let lines: Vec<&str> = text.lines().map(clean_line).collect();
        let goal_at = lines
            .iter()
            .position(|l| label_value(l, "goal").is_some())?;
        let goal = label_value(lines[goal_at], "goal")?.to_string();
        if goal.is_empty() {
            return None;
        }
        let mut steps = Vec::new();
        for line in &lines[goal_at + 1..] {
            if let Some(step) = numbered(line) {
                if steps.len() < MAX_STEPS {
                    steps.push(split_verify(step));
                }
            } else if !steps.is_empty() && line.is_empty() {
                break; // the list ended
            }
        }
        if steps.is_empty() {
            return None;
        }
        Some(Plan {
            goal: cap(&goal),
            steps,
            made_on_attempt: attempt,
        })
    }

    /// How many steps say how they will be verified.
    pub fn verified_steps(&self) -> usize {
        self.steps.iter().filter(|s| !s.verify.is_empty()).count()
    }

    /// The plan in the shape it was asked for, for a later prompt.
    pub fn render(&self) -> String {
        let mut s = format!("Goal: {}\nSteps:\n", self.goal);
        for (i, step) in self.steps.iter().enumerate() {
            s.push_str(&format!("{}. {}", i + 1, step.action));
            if !step.verify.is_empty() {
                s.push_str(&format!(" -> verify: {}", step.verify));
            }
            s.push('\n');
        }
        s
    }
}

/// A line without list decoration and markdown emphasis, trimmed.
fn clean_line(l: &str) -> &str {
    l.trim().trim_start_matches(['-', '*', '>', '#']).trim()
}

/// `value` of a `label: value` line (case-insensitive, `**Goal:**` too).
fn label_value<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let l = line.trim_start_matches('*');
    let head = l.get(..label.len())?;
    if !head.eq_ignore_ascii_case(label) {
        return None;
    }
    let rest = l[label.len()..].trim_start_matches('*').trim_start();
    let rest = rest.strip_prefix(':')?;
    Some(rest.trim_start_matches('*').trim())
}

/// The text of a `1.` / `1)` line.
fn numbered(line: &str) -> Option<&str> {
    let digits = line.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 || digits > 3 {
        return None;
    }
    let rest = &line[digits..];
    let rest = rest.strip_prefix('.').or_else(|| rest.strip_prefix(')'))?;
    let rest = rest.trim();
    (!rest.is_empty()).then_some(rest)
}

/// `action -> verify: how` (also `→` and `— verify:`), or the whole line as the action.
fn split_verify(step: &str) -> PlanStep {
    let lower = step.to_ascii_lowercase();
    if let Some(i) = lower.find("verify:") {
        let action = step[..i]
            .trim_end()
            .trim_end_matches(['-', '>', '→', '—', '–', '(', ';', ','])
            .trim();
        let how = step[i + "verify:".len()..].trim().trim_end_matches(')');
        return PlanStep {
            action: cap(action),
            verify: cap(how),
        };
    }
    PlanStep {
        action: cap(step),
        verify: String::new(),
    }
}

fn cap(s: &str) -> String {
    crate::util::truncate_chars(s.trim(), MAX_ITEM_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_requested_shape_and_markdown_variants_are_found() {
        let text = "I'll start.\n\n**Plan:**\n**Goal:** write hello.txt saying hi\n\nSteps:\n1. Write hello.txt → verify: `cat hello.txt` prints hi\n2) Run the check -> verify: grep -q hi hello.txt\n\nNow step 1.";
        let p = Plan::find(text, 1).unwrap();
        assert_eq!(p.goal, "write hello.txt saying hi");
        assert_eq!(p.steps.len(), 2);
        assert_eq!(p.steps[0].action, "Write hello.txt");
        assert_eq!(p.steps[0].verify, "`cat hello.txt` prints hi");
        assert_eq!(p.verified_steps(), 2);
        assert!(p.render().starts_with("Goal: write hello.txt saying hi\nSteps:\n1. Write hello.txt -> verify: `cat hello.txt` prints hi\n"));
        // Round trip: a rendered plan is found again.
        assert_eq!(Plan::find(&p.render(), 1).unwrap(), p);
    }

    #[test]
    fn no_goal_or_no_steps_is_no_plan() {
        assert_eq!(Plan::find("1. do it\n2. check it", 1), None);
        assert_eq!(Plan::find("Goal: something\nI will just do it.", 1), None);
        assert_eq!(Plan::find("", 1), None);
    }
}
