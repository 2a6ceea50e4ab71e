//! The OpenAI API's request and response bodies. Requests are read field by field from
//! JSON so every refusal names the field at fault (serde's untagged enums would not);
//! responses are plain `Serialize` structs in the shapes the official client parses.

use serde::Serialize;
use serde_json::{Map, Value};

use super::{ApiError, ApiResult};
use crate::request::{FinishReason, GenerationParams, Prompt};
use crate::tokenizer::chat::{ChatMessage, TemplateVars};

/// OpenAI accepts at most this many stop sequences.
const MAX_STOP: usize = 4;
/// Completions' `logprobs` ranges over 0..=5, as OpenAI's does.
const MAX_LOGPROBS: i64 = 5;
/// Chat's `top_logprobs` ranges over 0..=20, as OpenAI's does.
const MAX_TOP_LOGPROBS: i64 = crate::sampling::MAX_TOP_LOG_PROBS as i64;
/// The most choices (`n`, `best_of`) per prompt.
const MAX_CHOICES: i64 = crate::actors::preprocess::MAX_CHOICES as i64;
/// OpenAI's `logit_bias` range, either way.
const MAX_BIAS: f64 = crate::actors::preprocess::MAX_LOGIT_BIAS as f64;

/// A parsed `/v1/completions` body.
#[derive(Debug)]
pub struct CompletionRequest {
    pub model: String,
    pub prompts: Vec<Prompt>,
    pub echo: bool,
    /// `Some` when log-probabilities are wanted: how many alternatives each token lists.
    pub logprobs: Option<u8>,
    pub include_usage: bool,
    /// Choices returned per prompt.
    pub n: usize,
    /// Sequences generated per prompt (`params.n`), of which the `n` with the highest
    /// cumulative log-probability are returned; `n` without `best_of`.
    pub best_of: usize,
    pub params: GenerationParams,
}

/// A parsed `/v1/chat/completions` body.
#[derive(Debug)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    /// `chat_template_kwargs`: extra chat template variables (`enable_thinking`, ...), as
    /// vLLM and SGLang accept them.
    pub template_vars: TemplateVars,
    pub logprobs: bool,
    pub include_usage: bool,
    /// Choices returned (`params.n`).
    pub n: usize,
    pub params: GenerationParams,
    /// `tools` with `tool_choice`, when the request offers tools.
    pub tools: Option<super::tools::ToolRequest>,
}

/// The fields of a JSON object body, read with errors that name the field.
struct Body<'a>(&'a Map<String, Value>);

fn bad(msg: String) -> ApiError {
    ApiError::BadRequest(msg)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(field: &str, want: &str, got: &Value) -> ApiError {
    bad(format!("'{field}' must be {want}, got {}", kind_of(got)))
}

impl<'a> Body<'a> {
    fn new(v: &'a Value) -> ApiResult<Self> {
        v.as_object().map(Body).ok_or_else(|| {
            bad(format!(
                "the request body must be a JSON object, got {}",
                kind_of(v)
            ))
        })
    }

    /// A present, non-null field.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> ApiResult<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(key, "a string", v)),
        }
    }

    fn boolean(&self, key: &str) -> ApiResult<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(key, "a boolean", v)),
        }
    }

    fn object(&self, key: &str) -> ApiResult<Option<&'a Map<String, Value>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(v) => Err(wrong_type(key, "an object", v)),
        }
    }

    fn int(&self, key: &str) -> ApiResult<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                        .map(|f| f as i64)
                })
                .map(Some)
                .ok_or_else(|| bad(format!("'{key}' must be an integer, got {n}"))),
            Some(v) => Err(wrong_type(key, "an integer", v)),
        }
    }

    /// An integer in `min..=max`.
    fn int_in(&self, key: &str, min: i64, max: i64) -> ApiResult<Option<i64>> {
        match self.int(key)? {
            Some(v) if v < min || v > max => Err(bad(format!(
                "'{key}' must be between {min} and {max}, got {v}"
            ))),
            v => Ok(v),
        }
    }

    fn float(&self, key: &str) -> ApiResult<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64().map(|f| f as f32)),
            Some(v) => Err(wrong_type(key, "a number", v)),
        }
    }

    /// `model`, required.
    fn model(&self) -> ApiResult<String> {
        self.string("model")?.map(str::to_owned).ok_or_else(|| {
            bad("'model' is required: name one of the models GET /v1/models lists".into())
        })
    }

    /// `stream` and `stream_options.include_usage`.
    fn stream(&self) -> ApiResult<(bool, bool)> {
        let stream = self.boolean("stream")?.unwrap_or(false);
        let include_usage = match self.get("stream_options") {
            None => false,
            Some(_) if !stream => {
                return Err(bad(
                    "'stream_options' is only allowed when 'stream' is true".into(),
                ))
            }
            Some(Value::Object(o)) => Body(o)
                .boolean("include_usage")
                .map_err(|_| bad("'stream_options.include_usage' must be a boolean".into()))?
                .unwrap_or(false),
            Some(v) => return Err(wrong_type("stream_options", "an object", v)),
        };
        Ok((stream, include_usage))
    }

    /// `stop`: a string or a list of up to four strings.
    fn stop(&self) -> ApiResult<Vec<String>> {
        let stops = match self.get("stop") {
            None => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| wrong_type("stop", "a string or a list of strings", v))
                })
                .collect::<ApiResult<_>>()?,
            Some(v) => return Err(wrong_type("stop", "a string or a list of strings", v)),
        };
        if stops.len() > MAX_STOP {
            return Err(bad(format!(
                "'stop' takes at most {MAX_STOP} sequences, got {}",
                stops.len()
            )));
        }
        Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
    }

    /// `logit_bias`: an object from token ids (as strings, OpenAI's form) to a bias in
    /// -100..=100. Whether the ids are in the vocabulary is checked with the model.
    fn logit_bias(&self) -> ApiResult<Vec<(u32, f32)>> {
        let Some(map) = self.object("logit_bias")? else {
            return Ok(Vec::new());
        };
        map.iter()
            .map(|(key, v)| {
                let id = key.trim().parse::<u32>().map_err(|_| {
                    bad(format!("'logit_bias' keys must be token ids, got {key:?}"))
                })?;
                let bias = v
                    .as_f64()
                    .ok_or_else(|| wrong_type(&format!("logit_bias.{key}"), "a number", v))?;
                if !(-MAX_BIAS..=MAX_BIAS).contains(&bias) {
                    return Err(bad(format!(
                        "'logit_bias.{key}' must be between -{MAX_BIAS} and {MAX_BIAS}, got {bias}"
                    )));
                }
                Ok((id, bias as f32))
            })
            .collect()
    }

    /// A number in `min..=max`.
    fn float_in(&self, key: &str, min: f32, max: f32) -> ApiResult<Option<f32>> {
        match self.float(key)? {
            Some(v) if !(min..=max).contains(&v) => Err(bad(format!(
                "'{key}' must be between {min} and {max}, got {v}"
            ))),
            v => Ok(v),
        }
    }

    /// Fields that change the answer in ways we do not implement: refused unless empty.
    fn refuse_if_set(&self, key: &str, why: &str) -> ApiResult<()> {
        let set = match self.get(key) {
            None => false,
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::String(s)) => !s.is_empty(),
            Some(_) => true,
        };
        if set {
            return Err(ApiError::Unsupported(format!(
                "'{key}' is not supported: {why}"
            )));
        }
        Ok(())
    }

    /// The sampling fields both endpoints share. `max_tokens` defaults to `default_max`
    /// and must leave room in a context of `context` tokens.
    fn params(
        &self,
        max_keys: &[&str],
        default_max: usize,
        context: usize,
    ) -> ApiResult<GenerationParams> {
        self.string("user")?;
        let (stream, _) = self.stream()?;
        let mut max_tokens = default_max;
        if let Some(&key) = max_keys.iter().find(|k| self.get(k).is_some()) {
            let v = self.int(key)?.unwrap_or_default();
            if v < 1 {
                return Err(bad(format!("'{key}' must be at least 1, got {v}")));
            }
            if v as usize >= context {
                return Err(bad(format!(
                    "'{key}' {v} exceeds the model's context length of {context} tokens"
                )));
            }
            max_tokens = v as usize;
        }
        let d = GenerationParams::default();
        // vLLM spells "no top-k" as -1; ours is 0.
        let top_k = self.int("top_k")?.map_or(0, |k| k.max(0) as usize);
        if self.int("top_k")?.is_some_and(|k| k < -1) {
            return Err(bad("'top_k' must be -1 (off), 0 (off) or positive".into()));
        }
        Ok(GenerationParams {
            max_tokens,
            // OpenAI's default temperature is 1, not greedy.
            temperature: self.float("temperature")?.unwrap_or(1.0),
            top_p: self.float("top_p")?.unwrap_or(d.top_p),
            top_k,
            presence_penalty: self.float("presence_penalty")?.unwrap_or(0.0),
            frequency_penalty: self.float("frequency_penalty")?.unwrap_or(0.0),
            repetition_penalty: self.float("repetition_penalty")?.unwrap_or(1.0),
            min_length: self.int_in("min_tokens", 0, i64::MAX)?.unwrap_or(0) as usize,
            // Any 64-bit seed is accepted; negative ones keep their bits.
            random_seed: self.int("seed")?.map(|s| s as u64),
            ignore_eos: self.boolean("ignore_eos")?.unwrap_or(false),
            priority: self
                .int_in("priority", i32::MIN as i64, i32::MAX as i64)?
                .unwrap_or(0) as i32,
            // Speculative decoding, per request (extensions, as in vLLM's extra body).
            num_draft_tokens: self
                .int_in("num_draft_tokens", 0, i64::MAX)?
                .map(|n| n as usize),
            use_draft_logits: self.boolean("use_draft_logits")?.unwrap_or(false),
            cache_salt: self.string("cache_salt")?.map(str::to_owned),
            guide: super::guided::openai_guide(self.0)?,
            stop_strings: self.stop()?,
            stream,
            exclude_input_in_output: true,
            n: self.int_in("n", 1, MAX_CHOICES)?.unwrap_or(1) as usize,
            logit_bias: self.logit_bias()?,
            // vLLM's extension.
            min_p: self.float_in("min_p", 0.0, 1.0)?.unwrap_or(0.0),
            ..d
        })
    }
}

/// Parses a `/v1/completions` body for a model with a context of `context` tokens.
pub fn completion_request(body: &Value, context: usize) -> ApiResult<CompletionRequest> {
    let b = Body::new(body)?;
    let model = b.model()?;
    let prompts = completion_prompts(b.get("prompt"))?;
    b.refuse_if_set("suffix", "insertion (suffix) is not supported")?;
    let echo = b.boolean("echo")?.unwrap_or(false);
    let logprobs = b.int_in("logprobs", 0, MAX_LOGPROBS)?.map(|n| n as u8);
    let (stream, include_usage) = b.stream()?;
    let mut params = b.params(&["max_tokens"], 16, context)?;
    let n = params.n;
    let best_of = b.int_in("best_of", 1, MAX_CHOICES)?.map(|v| v as usize);
    if let Some(best_of) = best_of {
        if best_of < n {
            return Err(bad(format!(
                "'best_of' ({best_of}) must be at least 'n' ({n})"
            )));
        }
        if stream && best_of > 1 {
            return Err(bad("'best_of' cannot be used with 'stream'".into()));
        }
    }
    let best_of = best_of.unwrap_or(n);
    params.n = best_of;
    // Choosing the best needs every sequence's log-probability.
    params.return_log_probs = logprobs.is_some() || best_of > n;
    params.top_log_probs = logprobs.map_or(0, usize::from);
    // The prompt's log-probabilities come first in an echoed answer's.
    params.prompt_log_probs = echo && logprobs.is_some();
    super::known_fields::completions(b.0)?;
    Ok(CompletionRequest {
        model,
        prompts,
        echo,
        logprobs,
        include_usage,
        n,
        best_of,
        params,
    })
}

/// `prompt`: a string, a list of strings (a batch), a list of token ids, or a list of
/// such lists (a batch).
fn completion_prompts(v: Option<&Value>) -> ApiResult<Vec<Prompt>> {
    const WANT: &str =
        "a string, a list of strings, a list of token ids or a list of lists of token ids";
    let v = v.ok_or_else(|| bad("'prompt' is required".into()))?;
    let ids = |v: &Value, at: &str| -> ApiResult<Vec<u32>> {
        let items = v
            .as_array()
            .ok_or_else(|| wrong_type(at, "a list of token ids", v))?;
        items
            .iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&i| i <= u32::MAX as u64)
                    .map(|i| i as u32)
                    .ok_or_else(|| {
                        bad(format!(
                            "'{at}' must hold non-negative integer token ids, found {x}"
                        ))
                    })
            })
            .collect()
    };
    let prompts = match v {
        Value::String(s) => vec![Prompt::Text(s.clone())],
        Value::Array(items) if items.is_empty() => {
            return Err(bad("'prompt' is an empty list".into()))
        }
        Value::Array(items) => match &items[0] {
            Value::String(_) => items
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_str()
                        .map(|s| Prompt::Text(s.to_owned()))
                        .ok_or_else(|| wrong_type(&format!("prompt[{i}]"), "a string", x))
                })
                .collect::<ApiResult<_>>()?,
            Value::Number(_) => vec![Prompt::Tokens(ids(v, "prompt")?)],
            Value::Array(_) => items
                .iter()
                .enumerate()
                .map(|(i, x)| ids(x, &format!("prompt[{i}]")).map(Prompt::Tokens))
                .collect::<ApiResult<_>>()?,
            other => {
                return Err(wrong_type(
                    "prompt[0]",
                    "a string, a token id or a list of token ids",
                    other,
                ))
            }
        },
        other => return Err(wrong_type("prompt", WANT, other)),
    };
    if let Some(i) = prompts
        .iter()
        .position(|p| matches!(p, Prompt::Tokens(t) if t.is_empty()))
    {
        return Err(bad(format!("'prompt[{i}]' is an empty list of token ids")));
    }
    Ok(prompts)
}

/// Parses a `/v1/chat/completions` body for a model with a context of `context` tokens.
/// Without `max_completion_tokens`/`max_tokens` the answer may run to the context's end.
pub fn chat_request(body: &Value, context: usize) -> ApiResult<ChatRequest> {
    let b = Body::new(body)?;
    let model = b.model()?;
    let messages = chat_messages(b.get("messages"))?;
    let template_vars = b
        .object("chat_template_kwargs")?
        .cloned()
        .unwrap_or_default();
    let tools = super::tools::tool_request(b.0)?;
    let logprobs = b.boolean("logprobs")?.unwrap_or(false);
    let top_logprobs = b.int_in("top_logprobs", 0, MAX_TOP_LOGPROBS)?.unwrap_or(0) as usize;
    if top_logprobs > 0 && !logprobs {
        return Err(bad("'top_logprobs' needs 'logprobs' set to true".into()));
    }
    let (_, include_usage) = b.stream()?;
    let mut params = b.params(
        &["max_completion_tokens", "max_tokens"],
        context.saturating_sub(1).max(1),
        context,
    )?;
    params.return_log_probs = logprobs;
    params.top_log_probs = top_logprobs;
    super::known_fields::chat(b.0)?;
    Ok(ChatRequest {
        model,
        messages,
        template_vars,
        logprobs,
        include_usage,
        n: params.n,
        params,
        tools,
    })
}

/// `messages`: a non-empty list of chat messages, each refusal naming the one at fault.
pub(super) fn chat_messages(v: Option<&Value>) -> ApiResult<Vec<ChatMessage>> {
    let v = v.ok_or_else(|| bad("'messages' is required".into()))?;
    let items = v
        .as_array()
        .ok_or_else(|| wrong_type("messages", "a list of messages", v))?;
    if items.is_empty() {
        return Err(bad("'messages' must hold at least one message".into()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| chat_message(i, m))
        .collect()
}

fn chat_message(i: usize, m: &Value) -> ApiResult<ChatMessage> {
    let at = format!("messages[{i}]");
    let obj = m
        .as_object()
        .ok_or_else(|| wrong_type(&at, "an object with 'role' and 'content'", m))?;
    let role = match obj.get("role") {
        Some(Value::String(r)) => r.as_str(),
        None | Some(Value::Null) => return Err(bad(format!("'{at}.role' is required"))),
        Some(v) => return Err(wrong_type(&format!("{at}.role"), "a string", v)),
    };
    let role = match role {
        "system" | "user" | "assistant" | "tool" => role,
        // OpenAI's newer name for system instructions; templates know only "system".
        "developer" => "system",
        "function" => {
            return Err(ApiError::Unsupported(format!(
                "'{at}.role' 'function' is deprecated: answer calls with 'tool' messages"
            )))
        }
        other => {
            return Err(bad(format!(
                "'{at}.role' must be one of system, developer, user, assistant, tool; got '{other}'"
            )))
        }
    };
    let tool_calls = match obj.get("tool_calls").filter(|v| !v.is_null()) {
        Some(v) if role == "assistant" => Some(assistant_tool_calls(&at, v)?),
        Some(_) => {
            return Err(bad(format!(
                "'{at}.tool_calls' is only for assistant messages"
            )))
        }
        None => None,
    };
    let tool_call_id = match obj.get("tool_call_id").filter(|v| !v.is_null()) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(wrong_type(&format!("{at}.tool_call_id"), "a string", v)),
        None if role == "tool" => {
            return Err(bad(format!(
                "'{at}.tool_call_id' is required for a tool message"
            )))
        }
        None => None,
    };
    let name = match obj.get("name").filter(|v| !v.is_null()) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(wrong_type(&format!("{at}.name"), "a string", v)),
        None => None,
    };
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) if role == "assistant" => String::new(),
        None | Some(Value::Null) => return Err(bad(format!("'{at}.content' is required"))),
        Some(Value::Array(parts)) => text_parts(&at, parts)?,
        Some(v) => {
            return Err(wrong_type(
                &format!("{at}.content"),
                "a string or a list of content parts",
                v,
            ))
        }
    };
    Ok(ChatMessage {
        tool_calls,
        tool_call_id,
        name,
        ..ChatMessage::new(role, content)
    })
}

/// An assistant message's `tool_calls` as chat templates read them: each call's
/// `function.arguments` (a JSON text in OpenAI's API) parsed into an object.
fn assistant_tool_calls(at: &str, v: &Value) -> ApiResult<Value> {
    let items = v
        .as_array()
        .ok_or_else(|| wrong_type(&format!("{at}.tool_calls"), "a list of calls", v))?;
    let calls = items
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let here = format!("{at}.tool_calls[{j}]");
            let f = c
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| bad(format!("'{here}.function' must be an object")))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("'{here}.function.name' is required")))?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                    bad(format!(
                        "'{here}.function.arguments' is not valid JSON: {e}"
                    ))
                })?,
                Some(o @ Value::Object(_)) => o.clone(),
                Some(v) => {
                    return Err(wrong_type(
                        &format!("{here}.function.arguments"),
                        "a JSON text",
                        v,
                    ))
                }
            };
            Ok(serde_json::json!({
                "id": c.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {"name": name, "arguments": arguments}
            }))
        })
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(Value::Array(calls))
}

/// Joins the text parts of a content list, as vLLM does (with newlines).
fn text_parts(at: &str, parts: &[Value]) -> ApiResult<String> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        let kind = p.get("type").and_then(Value::as_str);
        match (kind, p.get("text")) {
            (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
            (Some("text"), _) => return Err(bad(format!("'{here}.text' must be a string"))),
            (Some(other), _) => {
                return Err(ApiError::Unsupported(format!(
                    "'{here}': content parts of type '{other}' are not supported, only 'text'"
                )))
            }
            (None, _) => return Err(bad(format!("'{here}' must be an object with a 'type'"))),
        }
    }
    Ok(texts.join("\n"))
}

/// OpenAI's `finish_reason`; a cancelled sequence reads as vLLM's `abort`.
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "abort",
        FinishReason::Error => "error",
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`: prompt tokens the prefix cache held.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    /// Adds one sequence's final chunk: its completion tokens, and, for the first
    /// sequence of its prompt (`first`), the prompt's tokens, counted once however many
    /// sequences it has (as OpenAI counts them).
    pub fn add_choice(&mut self, c: &crate::request::Chunk, first: bool) {
        if first {
            self.prompt_tokens += c.prompt_tokens;
            self.prompt_tokens_details.cached_tokens += c.cached_tokens;
        }
        self.completion_tokens += c.output_tokens;
        self.total_tokens = self.prompt_tokens + self.completion_tokens;
    }
}

/// A log-probability as JSON can carry it: -inf (a token the request's bans or cuts
/// made impossible) as -9999, vLLM's stand-in (JSON has no infinity, and the official
/// client needs a number).
pub fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}

/// Completions' `top_logprobs` entry: token texts to log-probabilities, from the most
/// likely, as a JSON object (a text that two tokens share keeps the likelier).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopLogprobs(pub Vec<(String, f32)>);

impl TopLogprobs {
    /// Adds an entry unless its text is there already.
    pub fn push(&mut self, text: String, lp: f32) {
        if !self.0.iter().any(|(t, _)| *t == text) {
            self.0.push((text, finite(lp)));
        }
    }
}

impl Serialize for TopLogprobs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// `logprobs` of a completion choice: each token's text, log-probability (null for an
/// echoed prompt's first token), alternatives (`logprobs` of them, and the token itself;
/// null when `logprobs` is 0) and character offset in the choice's text.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Option<Vec<Option<TopLogprobs>>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends `other`'s tokens after these.
    pub fn extend(&mut self, other: CompletionLogprobs) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.text_offset.extend(other.text_offset);
        match (&mut self.top_logprobs, other.top_logprobs) {
            (Some(mine), Some(theirs)) => mine.extend(theirs),
            (mine @ None, theirs) => *mine = theirs,
            (Some(_), None) => {}
        }
    }
}

#[derive(Debug, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A `text_completion` response, or one chunk of a streamed one.
#[derive(Debug, Serialize)]
pub struct Completion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<CompletionChoice>,
    /// Omitted from stream chunks unless usage was asked for (then null but in the last).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One token of a chat choice's `logprobs.content`, with its `top_logprobs`
/// alternatives (as many as asked for, from the most likely).
#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// One alternative of a chat token.
#[derive(Debug, Clone, Serialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Serialize)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// Null when the answer is only tool calls, as OpenAI's is.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// One function call of an answer (`tool_calls[i]`); in a streamed delta it also
/// carries its `index`.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionCallOut {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Serialize)]
pub struct ChatCompletion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

#[derive(Debug, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct ChatCompletionChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Serialize)]
pub struct ModelCard<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

#[derive(Debug, Serialize)]
pub struct ModelList<'a> {
    pub object: &'static str,
    pub data: Vec<ModelCard<'a>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(r: ApiResult<impl std::fmt::Debug>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn prompts_of_every_shape() {
        let p = |v: Value| completion_prompts(Some(&v));
        assert_eq!(p(json!("hi")).unwrap(), vec![Prompt::Text("hi".into())]);
        assert_eq!(p(json!(["a", "b"])).unwrap().len(), 2);
        assert_eq!(p(json!([1, 2])).unwrap(), vec![Prompt::Tokens(vec![1, 2])]);
        assert_eq!(
            p(json!([[1], [2, 3]])).unwrap(),
            vec![Prompt::Tokens(vec![1]), Prompt::Tokens(vec![2, 3])]
        );
        assert!(err(p(json!(["a", 1]))).contains("prompt[1]"));
        assert!(err(p(json!([1, -2]))).contains("prompt"));
        assert!(err(p(json!([]))).contains("empty"));
        assert!(err(p(json!({}))).contains("'prompt' must be"));
    }

    #[test]
    fn completion_fields() {
        let r = completion_request(
            &json!({"model": "m", "prompt": "x", "stop": "\n", "seed": -1, "top_k": -1}),
            100,
        )
        .unwrap();
        assert_eq!(r.params.max_tokens, 16);
        assert_eq!(r.params.temperature, 1.0);
        assert_eq!(r.params.stop_strings, vec!["\n"]);
        assert_eq!(r.params.random_seed, Some(u64::MAX));
        assert_eq!(r.params.top_k, 0);
        assert!(r.params.exclude_input_in_output);
        let e = |v: Value| err(completion_request(&v, 100));
        assert!(e(json!({"prompt": "x"})).contains("'model'"));
        assert!(e(json!({"model": "m"})).contains("'prompt'"));
        assert!(e(json!({"model": "m", "prompt": "x", "max_tokens": 100})).contains("'max_tokens'"));
        assert!(e(json!({"model": "m", "prompt": "x", "max_tokens": -3})).contains("'max_tokens'"));
        assert!(e(json!({"model": "m", "prompt": "x", "n": 17})).contains("'n'"));
        assert!(e(json!({"model": "m", "prompt": "x", "n": 0})).contains("'n'"));
        assert!(
            e(json!({"model": "m", "prompt": "x", "n": 3, "best_of": 2})).contains("'best_of'")
        );
        assert!(
            e(json!({"model": "m", "prompt": "x", "best_of": 2, "stream": true}))
                .contains("'best_of'")
        );
        assert!(
            e(json!({"model": "m", "prompt": "x", "logit_bias": {"a": 1}}))
                .contains("'logit_bias'")
        );
        assert!(
            e(json!({"model": "m", "prompt": "x", "logit_bias": {"5": 101}}))
                .contains("'logit_bias.5'")
        );
        assert!(
            e(json!({"model": "m", "prompt": "x", "logit_bias": {"5": "up"}}))
                .contains("'logit_bias.5'")
        );
        assert!(e(json!({"model": "m", "prompt": "x", "min_p": 1.5})).contains("'min_p'"));
        assert!(e(json!({"model": "m", "prompt": "x", "logprobs": 6})).contains("'logprobs'"));
        assert!(
            e(json!({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}))
                .contains("'stop'")
        );
        assert!(
            e(json!({"model": "m", "prompt": "x", "stream_options": {"include_usage": true}}))
                .contains("'stream_options'")
        );
        assert!(
            e(json!({"model": "m", "prompt": "x", "temperature": "hot"})).contains("'temperature'")
        );
    }

    #[test]
    fn sampling_fields() {
        let r = completion_request(
            &json!({"model": "m", "prompt": "x", "n": 2, "best_of": 5, "logprobs": 3,
                    "echo": true, "logit_bias": {"7": -100, " 12 ": 2.5}, "min_p": 0.1}),
            100,
        )
        .unwrap();
        assert_eq!((r.n, r.best_of, r.params.n), (2, 5, 5));
        assert_eq!(r.params.top_log_probs, 3);
        assert!(r.params.return_log_probs && r.params.prompt_log_probs);
        let mut bias = r.params.logit_bias.clone();
        bias.sort_by_key(|b| b.0);
        assert_eq!(bias, vec![(7, -100.0), (12, 2.5)]);
        assert_eq!(r.params.min_p, 0.1);
        // best_of above n needs the log-probabilities, even unasked; without best_of, n
        // sequences are generated.
        let r =
            completion_request(&json!({"model": "m", "prompt": "x", "best_of": 3}), 100).unwrap();
        assert!(r.params.return_log_probs && !r.params.prompt_log_probs);
        assert_eq!((r.n, r.best_of), (1, 3));
        let r = completion_request(
            &json!({"model": "m", "prompt": "x", "n": 4, "stream": true}),
            100,
        )
        .unwrap();
        assert_eq!((r.n, r.best_of, r.params.n), (4, 4, 4));
        assert!(!r.params.return_log_probs);
        let user = json!([{"role": "user", "content": "x"}]);
        let r = chat_request(
            &json!({"model": "m", "messages": user, "n": 3, "logprobs": true, "top_logprobs": 20}),
            100,
        )
        .unwrap();
        assert_eq!((r.n, r.params.n, r.params.top_log_probs), (3, 3, 20));
        let e = |v: Value| err(chat_request(&v, 100));
        assert!(
            e(json!({"model": "m", "messages": user, "logprobs": true, "top_logprobs": 21}))
                .contains("'top_logprobs'")
        );
    }

    #[test]
    fn chat_fields() {
        let body = json!({"model": "m", "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null},
        ]});
        let r = chat_request(&body, 100).unwrap();
        assert_eq!(r.messages[0], ChatMessage::new("system", "be brief"));
        assert_eq!(r.messages[1].content, "a\nb");
        assert_eq!(r.messages[2].content, "");
        assert_eq!(r.params.max_tokens, 99);
        let e = |v: Value| err(chat_request(&v, 100));
        assert!(e(json!({"model": "m", "messages": []})).contains("'messages'"));
        assert!(
            e(json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}))
                .contains("messages[0].role")
        );
        assert!(e(json!({"model": "m", "messages": [{"role": "user"}]}))
            .contains("messages[0].content"));
        let image = json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]});
        assert!(e(image).contains("image_url"));
        assert!(e(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})
        )
        .contains("top_logprobs"));
        assert!(e(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})).contains("max_completion_tokens"));
    }

    #[test]
    fn chat_template_kwargs_become_template_variables() {
        let user = json!([{"role": "user", "content": "x"}]);
        let r = chat_request(&json!({"model": "m", "messages": user}), 100).unwrap();
        assert!(r.template_vars.is_empty());
        let body = json!({"model": "m", "messages": user,
            "chat_template_kwargs": {"enable_thinking": false, "custom": {"a": [1, "b"]}}});
        let r = chat_request(&body, 100).unwrap();
        assert_eq!(r.template_vars.len(), 2);
        assert_eq!(r.template_vars["enable_thinking"], json!(false));
        assert_eq!(r.template_vars["custom"], json!({"a": [1, "b"]}));
        let r = chat_request(
            &json!({"model": "m", "messages": user, "chat_template_kwargs": null}),
            100,
        )
        .unwrap();
        assert!(r.template_vars.is_empty());
        let e = err(chat_request(
            &json!({"model": "m", "messages": user, "chat_template_kwargs": "enable_thinking"}),
            100,
        ));
        assert!(
            e.contains("'chat_template_kwargs' must be an object"),
            "{e}"
        );
    }
}
