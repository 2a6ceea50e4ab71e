//! The top-level fields each OpenAI route reads, taken from the documented request bodies
//! (src/http/openapi_bodies.rs, whose fields a test checks against the parsers), so that
//! a field the server does not implement is a 400 naming it rather than silently
//! dropped. A few of OpenAI's fields that change nothing here are accepted beside them.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use schemars::JsonSchema;
use serde_json::{Map, Value};

use super::openapi_bodies::{ChatRequestDoc, CompletionRequestDoc};
use super::{ApiError, ApiResult};

/// OpenAI fields accepted with no effect: tags for stored completions, the service tier.
/// `store` is accepted only as false (nothing is stored).
const NEUTRAL: [&str; 3] = ["metadata", "service_tier", "store"];

fn fields_of<T: JsonSchema>() -> BTreeSet<String> {
    let schema = schemars::schema_for!(T).to_value();
    let mut out: BTreeSet<String> = schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    out.extend(NEUTRAL.iter().map(|s| s.to_string()));
    out
}

fn check(body: &Map<String, Value>, known: &BTreeSet<String>, route: &str) -> ApiResult<()> {
    let unknown: Vec<&str> = body
        .keys()
        .filter(|k| !known.contains(k.as_str()))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(ApiError::Unsupported(format!(
            "unsupported field{} for {route}: '{}'",
            if unknown.len() > 1 { "s" } else { "" },
            unknown.join("', '")
        )));
    }
    if body.get("store").is_some_and(|v| v == &Value::Bool(true)) {
        return Err(ApiError::Unsupported(
            "'store': true is not supported: this server keeps no completions".into(),
        ));
    }
    Ok(())
}

/// Refuses the fields `/v1/completions` does not read.
pub fn completions(body: &Map<String, Value>) -> ApiResult<()> {
    static KNOWN: OnceLock<BTreeSet<String>> = OnceLock::new();
    check(
        body,
        KNOWN.get_or_init(fields_of::<CompletionRequestDoc>),
        "/v1/completions",
    )
}

/// Refuses the fields `/v1/chat/completions` does not read.
pub fn chat(body: &Map<String, Value>) -> ApiResult<()> {
    static KNOWN: OnceLock<BTreeSet<String>> = OnceLock::new();
    check(
        body,
        KNOWN.get_or_init(fields_of::<ChatRequestDoc>),
        "/v1/chat/completions",
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unknown_fields_are_named_and_known_ones_pass() {
        let ok = json!({"model": "m", "messages": [], "temperature": 0.5, "tools": [],
            "metadata": {"a": "b"}, "store": false, "min_p": 0.1, "guided_regex": "x", "priority": -2});
        chat(ok.as_object().unwrap()).unwrap();
        let bad =
            json!({"model": "m", "messages": [], "prediction": {}, "reasoning_effort": "low"});
        match chat(bad.as_object().unwrap()) {
            Err(ApiError::Unsupported(m)) => {
                assert!(
                    m.contains("'prediction'") && m.contains("'reasoning_effort'"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        let stored = json!({"model": "m", "prompt": "x", "store": true});
        assert!(completions(stored.as_object().unwrap()).is_err());
        let messages = json!({"model": "m", "prompt": "x", "messages": []});
        assert!(completions(messages.as_object().unwrap()).is_err());
    }
}
