//! Reading the messages of an Ollama chat: a tool call's name and arguments, and text put
//! on one line for a summary. Used by the executor's tool loop and by the context fitting,
//! so neither has to reach into the other.

use serde_json::{json, Value};

/// `(name, arguments)` of a tool call; `arguments` may come as an object or a JSON string.
pub(super) fn parse_call(call: &Value) -> (String, Value) {
    let f = &call["function"];
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_string();
    let args = match f.get("arguments") {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| json!({})),
        Some(v @ Value::Object(_)) => v.clone(),
        _ => json!({}),
    };
    (name, args)
}

/// `s` with every run of whitespace (newlines included) made one space.
pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_call_arguments_as_object_or_string() {
        let (n, a) =
            parse_call(&json!({"function": {"name": "read_file", "arguments": {"path": "a"}}}));
        assert_eq!((n.as_str(), a), ("read_file", json!({"path": "a"})));
        let (_, a) =
            parse_call(&json!({"function": {"name": "x", "arguments": "{\"path\":\"b\"}"}}));
        assert_eq!(a, json!({"path": "b"}));
        let (n, a) = parse_call(&json!({}));
        assert_eq!((n.as_str(), a), ("unknown", json!({})));
        assert_eq!(one_line(" a\n b\t c "), "a b c");
    }
}
