//! Unit tests of [`super`]: the parser and the failure classes, on lines the real CLI printed.

use super::*;

/// Lines as Claude Code 2.1.197 printed them against a fake Messages API (unused fields
/// such as `uuid`, `session_id`, the init's tool list are left out).
const INIT: &str = r#"{"type":"system","subtype":"init","cwd":"/w","model":"claude-opus-4-8[1m]","permissionMode":"acceptEdits","apiKeySource":"ANTHROPIC_API_KEY","claude_code_version":"2.1.197"}"#;
const TEXT: &str = r#"{"type":"assistant","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Writing the file."}],"stop_reason":null,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}},"parent_tool_use_id":null}"#;
const WRITE: &str = r#"{"type":"assistant","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"tool_use","id":"toolu_w1","name":"Write","input":{"file_path":"/w/hello.txt","content":"hi\n"}}],"stop_reason":null,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}},"parent_tool_use_id":null}"#;
const DENIED: &str = r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","content":"Claude requested permissions to write to /w/hello.txt, but you haven't granted it yet.","is_error":true,"tool_use_id":"toolu_w1"}]},"parent_tool_use_id":null}"#;
const WRITTEN: &str = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_w1","type":"tool_result","content":"File created successfully at: /w/hello.txt"}]},"parent_tool_use_id":null}"#;
const DONE: &str = r#"{"type":"assistant","message":{"id":"msg_2","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"All done."}],"stop_reason":null,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}},"parent_tool_use_id":null}"#;

fn ok_result(denials: &str) -> String {
    format!(
        r#"{{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"num_turns":2,"result":"All done.","total_cost_usd":0.0035,"usage":{{"input_tokens":200,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":100}},"modelUsage":{{"claude-opus-4-8[1m]":{{"inputTokens":200,"outputTokens":100,"cacheReadInputTokens":40,"cacheCreationInputTokens":0,"costUSD":0.003}},"claude-haiku-4-5":{{"inputTokens":30,"outputTokens":5,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.0005}}}},"permission_denials":[{denials}],"terminal_reason":"completed"}}"#
    )
}

/// The synthetic assistant message and result of a failed API call.
fn api_failure(error: &str, status: &str, text: &str) -> [String; 2] {
    [
        format!(
            r#"{{"type":"assistant","message":{{"id":"4aa3694c","model":"<synthetic>","role":"assistant","stop_reason":"stop_sequence","type":"message","usage":{{"input_tokens":0,"output_tokens":0}},"content":[{{"type":"text","text":"{text}"}}]}},"parent_tool_use_id":null,"error":"{error}","request_id":"req_1"}}"#
        ),
        format!(
            r#"{{"type":"result","subtype":"success","is_error":true,"api_error_status":{status},"num_turns":1,"result":"{text}","stop_reason":"stop_sequence","total_cost_usd":0,"usage":{{"input_tokens":0,"output_tokens":0}},"modelUsage":{{}},"permission_denials":[]}}"#
        ),
    ]
}

fn feed(lines: &[&str]) -> (StreamState, ProgressSink) {
    let sink = ProgressSink::new(8192);
    let mut s = StreamState::new(sink.clone(), "claude-sonnet-4-5", 0);
    for l in lines {
        s.line(l);
    }
    (s, sink)
}

#[test]
fn a_successful_write_run_counts_one_turn_per_message_and_takes_model_usage() {
    let result = ok_result("");
    let (s, sink) = feed(&[INIT, TEXT, WRITE, "not json", WRITTEN, DONE, &result]);
    assert_eq!(s.failure(true, ""), None);
    // Two events share msg_1: two turns, and msg_1's usage counted once.
    assert_eq!(s.turns(), 2);
    assert_eq!(s.tokens_out_seen(), 2);
    let r = s.result.as_ref().unwrap();
    // modelUsage covers both models, cache reads included; the priciest names the model.
    assert_eq!((r.tokens_in, r.tokens_out), (270, 105));
    assert_eq!(r.model.as_deref(), Some("claude-opus-4-8[1m]"));
    assert_eq!(s.usage().2, 0.0035);
    assert_eq!(s.output(), "All done.");
    assert_eq!(s.writes_ok, 1);
    assert_eq!(sink.emitted(), 3);
}

#[test]
fn a_run_whose_only_write_was_denied_is_a_failure_naming_the_tool() {
    let denial = r#"{"tool_name":"Write","tool_use_id":"toolu_w1","tool_input":{"file_path":"/w/hello.txt","content":"hi\n"}}"#;
    let result = ok_result(denial);
    let (s, _) = feed(&[INIT, TEXT, WRITE, DENIED, DONE, &result]);
    let f = s
        .failure(true, "")
        .expect("denied writes are not a success");
    assert_eq!(f.class(), "permission_denied");
    assert!(f.to_string().contains("Write(/w/hello.txt)"), "{f}");
    assert!(f.to_string().contains("claude_allowed_tools"), "{f}");
    // With one write through, the run succeeds and the denial stays listed.
    let (s, _) = feed(&[INIT, WRITE, WRITTEN, DONE, &result]);
    assert_eq!(s.failure(true, ""), None);
    assert_eq!(s.result.unwrap().denials, ["Write(/w/hello.txt)"]);
}

#[test]
fn api_failures_map_to_their_class_with_the_cli_words() {
    let cases = [
        ("authentication_failed", "401", "Invalid API key · Fix external API key", "authentication"),
        ("authentication_failed", "403", "Failed to authenticate. API Error: 403 Your API key does not have permission", "authentication"),
        ("authentication_failed", "null", "Not logged in · Please run /login", "authentication"),
        ("billing_error", "400", "Credit balance is too low", "billing"),
        ("model_not_found", "404", "There's an issue with the selected model (claude-nope).", "model_not_found"),
        ("rate_limit", "429", "API Error: Request rejected (429) · Number of request tokens has exceeded your per-minute rate limit", "rate_limited"),
        ("server_error", "529", "API Error: 529 Overloaded. This is a server-side issue", "overloaded"),
        ("server_error", "500", "API Error: 500 Internal server error", "server_error"),
        ("server_error", "null", "API Error: Unable to connect to API (ConnectionRefused)", "network"),
    ];
    for (error, status, text, class) in cases {
        let [a, r] = api_failure(error, status, text);
        let (s, _) = feed(&[INIT, &a, &r]);
        let f = s.failure(false, "").unwrap();
        assert_eq!(f.class(), class, "{error}/{status}");
        assert!(f.to_string().contains(text), "{f}");
        assert!(!f.retryable(), "{class} must not be retried by the daemon");
    }
}

#[test]
fn error_subtypes_read_errors_and_a_rejected_limit_carries_resets_at() {
    let turns = r#"{"type":"result","subtype":"error_max_turns","duration_ms":1462,"is_error":true,"num_turns":2,"stop_reason":"tool_use","total_cost_usd":0.00175,"usage":{"input_tokens":100,"output_tokens":50},"modelUsage":{},"permission_denials":[],"terminal_reason":"max_turns","errors":["Reached maximum number of turns (1)"]}"#;
    let (s, _) = feed(&[INIT, turns]);
    let f = s.failure(false, "").unwrap();
    assert_eq!(f.class(), "max_turns");
    assert!(
        f.to_string()
            .contains("Reached maximum number of turns (1)"),
        "{f}"
    );
    let budget = turns
        .replace("error_max_turns", "error_max_budget_usd")
        .replace(
            "Reached maximum number of turns (1)",
            "Reached maximum budget ($0.0001)",
        );
    let (s, _) = feed(&[INIT, &budget]);
    assert_eq!(s.failure(false, "").unwrap().class(), "max_budget");

    let event = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1771390800,"rateLimitType":"five_hour"}}"#;
    let [a, r] = api_failure(
        "rate_limit",
        "429",
        "You've hit your limit · resets 8pm (UTC)",
    );
    let (s, _) = feed(&[INIT, event, &a, &r]);
    let f = s.failure(false, "").unwrap();
    assert_eq!(
        f,
        ClaudeFailure::UsageLimit {
            message: "You've hit your limit · resets 8pm (UTC)".into(),
            resets_at: Some(1771390800)
        }
    );
    assert!(f.to_string().contains("1771390800"), "{f}");
}

#[test]
fn without_a_result_line_only_a_crash_is_retryable_and_a_refusal_is_not() {
    let (s, _) = feed(&[INIT]);
    assert_eq!(s.failure(true, ""), None);
    let f = s.failure(false, "Segmentation fault").unwrap();
    assert!(
        f.retryable() && f.to_string().contains("Segmentation fault"),
        "{f}"
    );
    let f = s
        .failure(false, "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons")
        .unwrap();
    assert_eq!(f.class(), "refused");
    assert!(!f.retryable());
}

#[test]
fn a_killed_run_estimates_its_cost_from_the_usage_seen() {
    let retry = r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":4,"retry_delay_ms":545.9,"error_status":429,"error":"rate_limit"}"#;
    let (s, _) = feed(&[INIT, TEXT, WRITE, retry]);
    let (tin, tout, usd) = s.usage();
    assert_eq!((tin, tout), (100, 1));
    assert!(usd > 0.0);
    assert_eq!(s.last_retry, Some((Some(429), "rate_limit".into())));
}
