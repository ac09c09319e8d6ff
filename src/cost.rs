//! Model pricing: USD per million tokens, for results' `estimated_cost_usd` and
//! `equivalent_claude_cost_usd`. The CLI's own reported cost wins when present.

/// (model-name prefix, USD per million input tokens, USD per million output tokens).
/// Longer prefixes first so `claude-opus-4-6` does not match `claude-opus-4-5`'s row by accident.
const TABLE: &[(&str, f64, f64)] = &[
    ("claude-sonnet-4-5", 3.0, 15.0),
    ("claude-opus-4-6", 5.0, 25.0),
    ("claude-opus-4-5", 5.0, 25.0),
    ("claude-haiku-4-5", 1.0, 5.0),
    ("sonnet-4-5", 3.0, 15.0),
    ("opus-4-6", 5.0, 25.0),
    ("opus-4-5", 5.0, 25.0),
    ("haiku-4-5", 1.0, 5.0),
    ("sonnet", 3.0, 15.0),
    ("opus", 5.0, 25.0),
    ("haiku", 1.0, 5.0),
];

/// The model used to express what a local run would have cost on Claude.
pub const REFERENCE_MODEL: &str = "claude-sonnet-4-5";

/// Price per million tokens (in, out) for a Claude model name, by prefix; `None` if unknown.
pub fn price(model: &str) -> Option<(f64, f64)> {
    let m = model.to_ascii_lowercase();
    let m = m.strip_prefix("anthropic/").unwrap_or(&m);
    TABLE
        .iter()
        .find(|(p, _, _)| m.starts_with(p))
        .map(|&(_, i, o)| (i, o))
}

/// Estimated USD for a Claude model; unknown models cost as the reference model.
pub fn claude_cost(model: &str, tokens_in: u64, tokens_out: u64) -> f64 {
    let (i, o) = price(model).unwrap_or_else(|| price(REFERENCE_MODEL).expect("reference priced"));
    (tokens_in as f64 * i + tokens_out as f64 * o) / 1_000_000.0
}

/// What the same token counts would have cost on the reference Claude model.
pub fn equivalent_claude_cost(tokens_in: u64, tokens_out: u64) -> f64 {
    claude_cost(REFERENCE_MODEL, tokens_in, tokens_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_by_prefix() {
        assert_eq!(price("claude-sonnet-4-5-20250929"), Some((3.0, 15.0)));
        assert_eq!(price("claude-opus-4-6"), Some((5.0, 25.0)));
        assert_eq!(price("haiku-4-5"), Some((1.0, 5.0)));
        assert_eq!(price("qwen3:8b"), None);
        let c = claude_cost("claude-haiku-4-5", 1_000_000, 1_000_000);
        assert!((c - 6.0).abs() < 1e-9);
    }
}
