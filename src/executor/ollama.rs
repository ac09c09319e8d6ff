//! The ollama executor (stub until the executors issue lands).

use super::{Attempt, ExecContext, ExecOutcome};

pub struct OllamaExecutor;

impl OllamaExecutor {
    pub fn new(_ctx: &ExecContext) -> Result<OllamaExecutor, String> {
        Err("the ollama executor is not built yet".into())
    }

    pub async fn execute(&mut self, _ctx: &ExecContext, _attempt: &Attempt) -> ExecOutcome {
        ExecOutcome::failed("the ollama executor is not built yet")
    }
}
