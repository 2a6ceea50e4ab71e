//! The bodies of `POST /v1/responses` (OpenAI's Responses API, the part a stateless
//! server can honour): the request as a serde type (its unknown fields refused by name),
//! its checks and its conversion into chat messages and generation parameters, and the
//! response object and stream events in the shapes the official client parses.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ApiError, ApiResult};
use crate::request::{FinishReason, GenerationParams};
use crate::tokenizer::chat::ChatMessage;

/// `POST /v1/responses`. Nothing is stored: `store: true` and `previous_response_id` are
/// refused, as are tools; any field not listed here is refused by name.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    /// A served model name.
    pub model: String,
    /// A user message as text, or a list of message items (read item by item, so that a
    /// refusal names the item at fault).
    #[schemars(with = "ResponsesInput")]
    pub input: Value,
    /// A system message put before the input.
    pub instructions: Option<String>,
    /// Most tokens to generate (default: the rest of the context).
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature (default 1).
    pub temperature: Option<f32>,
    /// Nucleus sampling (default 1).
    pub top_p: Option<f32>,
    /// Answer as server-sent events.
    pub stream: Option<bool>,
    /// Only false: responses are not stored.
    pub store: Option<bool>,
    /// Refused: no response is stored to continue from.
    pub previous_response_id: Option<String>,
    /// Only an empty list: tools are not supported.
    #[schemars(with = "Option<Vec<BTreeMap<String, Value>>>")]
    pub tools: Option<Vec<Value>>,
    /// Only `auto` or `none` (no tools).
    #[schemars(with = "Option<String>")]
    pub tool_choice: Option<Value>,
    /// Accepted and ignored (no tools).
    pub parallel_tool_calls: Option<bool>,
    /// Echoed in the response object.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Only `{"format": {"type": "text"}}`.
    pub text: Option<TextConfig>,
    /// Only `disabled`.
    pub truncation: Option<String>,
    /// Accepted and ignored.
    #[allow(dead_code)]
    pub user: Option<String>,
}

/// The request's `input` (its schema; it is read by [`ResponsesRequest::messages`]).
#[derive(Debug, JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum ResponsesInput {
    /// One user message.
    Text(String),
    /// Messages, in order.
    Items(Vec<InputItem>),
}

/// One message item of `input` (`type` is `message`, or absent).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputItem {
    /// Only `message` (checked before the item is read).
    #[serde(rename = "type")]
    #[allow(dead_code)]
    pub kind: Option<String>,
    /// `user`, `system`, `developer` or `assistant`.
    pub role: String,
    /// Text, or content parts (`input_text`; `output_text` in assistant messages).
    pub content: InputContent,
    /// Accepted and ignored (an earlier output item's id and status).
    #[allow(dead_code)]
    pub id: Option<String>,
    #[allow(dead_code)]
    pub status: Option<String>,
}

/// A message item's content.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum InputContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One content part: `{"type": "input_text" | "output_text", "text"}`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// `text`: the output's format.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    pub format: Option<TextFormat>,
}

/// `text.format`: only `{"type": "text"}`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct TextFormat {
    #[serde(rename = "type")]
    pub kind: String,
}

impl ResponsesRequest {
    /// Refuses what a stateless server without tools cannot honour, naming the field.
    pub fn check(&self) -> ApiResult<()> {
        let unsupported = |m: &str| Err(ApiError::Unsupported(m.into()));
        if self.store == Some(true) {
            return unsupported("'store': true is not supported: this server stores no responses (send store: false)");
        }
        if self.previous_response_id.is_some() {
            return unsupported("'previous_response_id' is not supported: this server stores no responses; send the conversation in 'input'");
        }
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return unsupported("'tools' is not supported: tool calling is not implemented");
        }
        match &self.tool_choice {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "auto" || s == "none" => {}
            Some(_) => {
                return unsupported(
                    "'tool_choice' supports only \"auto\" and \"none\" (there are no tools)",
                )
            }
        }
        let format = self.text.as_ref().and_then(|t| t.format.as_ref());
        if format.is_some_and(|f| f.kind != "text") {
            return unsupported("'text.format' supports only {\"type\": \"text\"}");
        }
        if self.truncation.as_deref().is_some_and(|t| t != "disabled") {
            return unsupported("'truncation' supports only \"disabled\"");
        }
        Ok(())
    }

    /// The conversation: `instructions` as a system message, then the input.
    pub fn messages(&self) -> ApiResult<Vec<ChatMessage>> {
        let mut out = Vec::new();
        if let Some(i) = &self.instructions {
            out.push(ChatMessage::new("system", i.clone()));
        }
        match &self.input {
            Value::String(t) => out.push(ChatMessage::new("user", t.clone())),
            Value::Array(items) if items.is_empty() => {
                return Err(ApiError::BadRequest("'input' is an empty list".into()))
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    out.push(InputItem::read(i, item)?.message(i)?);
                }
            }
            _ => {
                return Err(ApiError::BadRequest(
                    "'input' must be a string or a list of message items".into(),
                ))
            }
        }
        Ok(out)
    }

    /// How to generate, for a model with a context of `context` tokens.
    pub fn params(&self, context: usize) -> ApiResult<GenerationParams> {
        let max_tokens = match self.max_output_tokens {
            None => context.saturating_sub(1).max(1),
            Some(0) => {
                return Err(ApiError::BadRequest(
                    "'max_output_tokens' must be at least 1".into(),
                ))
            }
            Some(n) if n as usize >= context => {
                return Err(ApiError::BadRequest(format!(
                    "'max_output_tokens' {n} exceeds the model's context length of {context} tokens"
                )))
            }
            Some(n) => n as usize,
        };
        Ok(GenerationParams {
            max_tokens,
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            stream: self.stream.unwrap_or(false),
            exclude_input_in_output: true,
            ..GenerationParams::default()
        })
    }
}

impl InputItem {
    /// Item `i` of `input`; another type than `message` is refused before its fields are
    /// read.
    fn read(i: usize, v: &Value) -> ApiResult<Self> {
        let at = format!("input[{i}]");
        if let Some(kind) = v.get("type").and_then(Value::as_str) {
            if kind != "message" {
                return Err(ApiError::Unsupported(format!(
                    "'{at}.type': items of type '{kind}' are not supported, only 'message'"
                )));
            }
        }
        serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            match path.as_str() {
                "" | "." => ApiError::BadRequest(format!("'{at}': {inner}")),
                p => ApiError::BadRequest(format!("'{at}.{p}': {inner}")),
            }
        })
    }

    fn message(&self, i: usize) -> ApiResult<ChatMessage> {
        let at = format!("input[{i}]");
        let role = match self.role.as_str() {
            "user" | "system" | "assistant" => self.role.as_str(),
            // The templates know "system" only.
            "developer" => "system",
            other => {
                return Err(ApiError::BadRequest(format!(
                    "'{at}.role' must be one of user, system, developer, assistant; got '{other}'"
                )))
            }
        };
        let content = match &self.content {
            InputContent::Text(t) => t.clone(),
            InputContent::Parts(parts) => {
                let mut texts = Vec::with_capacity(parts.len());
                for (j, p) in parts.iter().enumerate() {
                    let here = format!("{at}.content[{j}]");
                    match (p.kind.as_str(), &p.text) {
                        ("input_text" | "output_text", Some(t)) => texts.push(t.as_str()),
                        ("input_text" | "output_text", None) => {
                            return Err(ApiError::BadRequest(format!("'{here}.text' is required")))
                        }
                        (other, _) => {
                            return Err(ApiError::Unsupported(format!(
                                "'{here}': content parts of type '{other}' are not supported, only 'input_text'"
                            )))
                        }
                    }
                }
                texts.join("\n")
            }
        };
        Ok(ChatMessage::new(role, content))
    }
}

/// The response object (`object: "response"`), whole or as a stream event carries it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ResponseObject {
    pub id: String,
    /// Always `response`.
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub model: String,
    pub output: Vec<OutputMessage>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub temperature: f32,
    pub top_p: f32,
    /// `auto`, or `none` when the request said so (there are no tools).
    pub tool_choice: &'static str,
    #[schemars(with = "Vec<Value>")]
    pub tools: Vec<Value>,
    pub text: TextOut,
    /// Always `disabled`.
    pub truncation: &'static str,
    pub metadata: BTreeMap<String, String>,
    pub usage: Option<ResponseUsage>,
}

/// `error` of a failed response.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ResponseError {
    pub code: &'static str,
    pub message: String,
}

/// Why a response is incomplete (`max_output_tokens`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct IncompleteDetails {
    pub reason: &'static str,
}

/// `text` of the response object: the format it was written in.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TextOut {
    pub format: FormatOut,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FormatOut {
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The assistant's message: one `output_text` part.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct OutputMessage {
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: String,
    pub status: &'static str,
    /// Always `assistant`.
    pub role: &'static str,
    pub content: Vec<OutputText>,
}

/// An `output_text` content part.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct OutputText {
    /// Always `output_text`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    #[schemars(with = "Vec<Value>")]
    pub annotations: Vec<Value>,
    #[schemars(with = "Vec<Value>")]
    pub logprobs: Vec<Value>,
}

impl OutputText {
    pub fn new(text: String) -> Self {
        OutputText {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, Serialize, JsonSchema)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Copy, Default, Serialize, JsonSchema)]
pub struct InputTokensDetails {
    /// Prompt tokens the prefix cache held.
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, Default, Serialize, JsonSchema)]
pub struct OutputTokensDetails {
    /// Always 0.
    pub reasoning_tokens: usize,
}

impl ResponseUsage {
    /// The counts of a prompt's last chunk.
    pub fn of(c: &crate::request::Chunk) -> Self {
        ResponseUsage {
            input_tokens: c.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: c.cached_tokens,
            },
            output_tokens: c.output_tokens,
            output_tokens_details: OutputTokensDetails::default(),
            total_tokens: c.prompt_tokens + c.output_tokens,
        }
    }
}

/// The status a finished generation gives the response and its message, and why it is
/// incomplete: a stop is `completed`, the length limit `incomplete`.
pub fn status_of(reason: Option<FinishReason>) -> (&'static str, Option<IncompleteDetails>) {
    match reason {
        Some(FinishReason::Length) => (
            "incomplete",
            Some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
        ),
        _ => ("completed", None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;

    fn req(body: Value) -> ApiResult<ResponsesRequest> {
        super::super::json_body::parse(&Bytes::from(body.to_string()))
    }

    fn refusal(body: Value) -> String {
        match req(body).and_then(|r| r.check()) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("accepted"),
        }
    }

    #[test]
    fn input_becomes_the_conversation() {
        let r = req(serde_json::json!({"model": "m", "input": "hi", "instructions": "be brief"}))
            .unwrap();
        r.check().unwrap();
        let m = r.messages().unwrap();
        assert_eq!(
            m,
            vec![
                ChatMessage::new("system", "be brief"),
                ChatMessage::new("user", "hi")
            ]
        );
        let r = req(serde_json::json!({"model": "m", "input": [
            {"role": "developer", "content": "x"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
        ]}))
        .unwrap();
        let m = r.messages().unwrap();
        assert_eq!(m[0], ChatMessage::new("system", "x"));
        assert_eq!(m[1].content, "a\nb");
        assert_eq!(m[2], ChatMessage::new("assistant", "c"));
        let p = r.params(100).unwrap();
        assert_eq!((p.max_tokens, p.temperature, p.top_p), (99, 1.0, 1.0));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        use serde_json::json;
        assert!(refusal(json!({"model": "m", "input": "x", "store": true})).contains("'store'"));
        assert!(
            refusal(json!({"model": "m", "input": "x", "previous_response_id": "r"}))
                .contains("'previous_response_id'")
        );
        assert!(
            refusal(json!({"model": "m", "input": "x", "tools": [{"type": "function"}]}))
                .contains("'tools'")
        );
        assert!(refusal(
            json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema"}}})
        )
        .contains("'text.format'"));
        let e =
            req(json!({"model": "m", "input": "x", "reasoning": {"effort": "low"}})).unwrap_err();
        assert!(e.to_string().contains("unknown field `reasoning`"), "{e}");
        let ok = req(
            json!({"model": "m", "input": "x", "store": false, "tools": [], "tool_choice": "auto"}),
        );
        ok.unwrap().check().unwrap();
        let r = req(json!({"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]})).unwrap();
        assert!(r
            .messages()
            .unwrap_err()
            .to_string()
            .contains("'input[0].type'"));
        let r = req(json!({"model": "m", "input": [{"role": "user"}]})).unwrap();
        let e = r.messages().unwrap_err().to_string();
        assert!(e.starts_with("'input[0]'") && e.contains("content"), "{e}");
        let r = req(json!({"model": "m", "input": 3})).unwrap();
        assert!(r
            .messages()
            .unwrap_err()
            .to_string()
            .contains("'input' must be"));
        let r = req(json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]})).unwrap();
        assert!(r
            .messages()
            .unwrap_err()
            .to_string()
            .contains("input_image"));
        let r = req(json!({"model": "m", "input": "x", "max_output_tokens": 0})).unwrap();
        assert!(r
            .params(100)
            .unwrap_err()
            .to_string()
            .contains("'max_output_tokens'"));
        let r = req(json!({"model": "m", "input": "x", "max_output_tokens": 100})).unwrap();
        assert!(r.params(100).is_err());
    }
}
