//! The claude executor (stub until the executors issue lands).

use super::{Attempt, ExecContext, ExecOutcome};

pub struct ClaudeExecutor;

impl ClaudeExecutor {
    pub fn new(_ctx: &ExecContext) -> Result<ClaudeExecutor, String> {
        Err("the claude executor is not built yet".into())
    }

    pub async fn execute(&mut self, _ctx: &ExecContext, _attempt: &Attempt) -> ExecOutcome {
        ExecOutcome::failed("the claude executor is not built yet")
    }
}
