//! Tool calling on `/v1/chat/completions`: the request's `tools` and `tool_choice`, the
//! call format the model's chat template speaks (Hermes/Qwen `<tool_call>` JSON, Llama
//! 3.x JSON, Mistral `[TOOL_CALLS]`), the grammar that enforces a call when the choice
//! is `required` or a named function, and the parser that turns the model's output,
//! whole or streamed, into OpenAI `tool_calls`.

use serde_json::{json, Map, Value};

use super::{ApiError, ApiResult};
use crate::guide::Guide;

fn bad(msg: String) -> ApiError {
    ApiError::BadRequest(msg)
}

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: Value,
    /// The tool as the request gave it, for the chat template.
    pub raw: Value,
}

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model decides (the default with tools).
    Auto,
    /// No call: the tools are not shown to the model.
    None,
    /// At least one call, enforced by the grammar.
    Required,
    /// This function, enforced by the grammar.
    Named(String),
}

/// How a model writes its calls, as its chat template shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Hermes, Qwen2.5,
    /// Qwen3, and the format we teach models whose template knows no tools).
    Hermes,
    /// A bare `{"name": ..., "parameters": {...}}` object (Llama 3.1-3.3).
    Llama3,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral).
    Mistral,
}

impl ToolFormat {
    /// The format a chat template writes calls in; Hermes where it shows none.
    pub fn of_template(template: Option<&str>) -> ToolFormat {
        let t = template.unwrap_or_default();
        if t.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if t.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if t.contains("<|python_tag|>")
            || (t.contains("ipython") && t.contains("parameters"))
        {
            ToolFormat::Llama3
        } else {
            ToolFormat::Hermes
        }
    }

    fn args_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }
}

/// A request's tools, as the chat endpoint uses them.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<ToolSpec>,
    pub choice: ToolChoice,
    /// Several calls in one answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`; None without tools (a
/// `tool_choice` other than `none`/`auto` then is a 400).
pub fn tool_request(body: &Map<String, Value>) -> ApiResult<Option<ToolRequest>> {
    let get = |k: &str| body.get(k).filter(|v| !v.is_null());
    if get("functions").is_some() || get("function_call").is_some() {
        return Err(ApiError::Unsupported(
            "'functions' and 'function_call' are deprecated: use 'tools' and 'tool_choice'".into(),
        ));
    }
    let tools = match get("tools") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, t)| tool_spec(i, t))
            .collect::<ApiResult<_>>()?,
        Some(_) => return Err(bad("'tools' must be a list of tools".into())),
    };
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(bad(format!("'tools' names the function '{}' twice", w[0])));
    }
    let choice = match get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "'tool_choice' must be auto, none, required or a function, got '{other}'"
                )))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad("'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}".into())
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(bad(format!(
                    "'tool_choice' names the function '{name}', which is not in 'tools'"
                )));
            }
            ToolChoice::Named(name.to_owned())
        }
        Some(_) => return Err(bad("'tool_choice' must be a string or an object".into())),
    };
    let parallel = match get("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("'parallel_tool_calls' must be a boolean".into())),
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::Auto | ToolChoice::None => Ok(None),
            _ => Err(bad("'tool_choice' requires 'tools'".into())),
        };
    }
    Ok(Some(ToolRequest {
        tools,
        choice,
        parallel,
    }))
}

fn tool_spec(i: usize, t: &Value) -> ApiResult<ToolSpec> {
    let at = format!("tools[{i}]");
    let o = t
        .as_object()
        .ok_or_else(|| bad(format!("'{at}' must be an object")))?;
    match o.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::Unsupported(format!(
                "'{at}.type' '{other}' is not supported: only function tools"
            )))
        }
        None => return Err(bad(format!("'{at}.type' is required (\"function\")"))),
    }
    let f = o
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| bad(format!("'{at}.function' must be an object")))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("'{at}.function.name' is required")))?;
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(bad(format!(
            "'{at}.function.name' must be 1-64 letters, digits, '_' or '-', got '{name}'"
        )));
    }
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(bad(format!(
                "'{at}.function.parameters' must be a JSON Schema object"
            )))
        }
    };
    Ok(ToolSpec {
        name: name.to_owned(),
        parameters,
        raw: t.clone(),
    })
}

impl ToolRequest {
    /// The tools the model is shown (none when the choice is `none`, one when it is named).
    pub fn shown(&self) -> Vec<&ToolSpec> {
        match &self.choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
            _ => self.tools.iter().collect(),
        }
    }

    /// The template variable `tools`: the shown tools as the request gave them.
    pub fn template_tools(&self) -> Value {
        Value::Array(self.shown().iter().map(|t| t.raw.clone()).collect())
    }

    /// The grammar that forces a call in `format`, for `required` and named choices.
    pub fn guide(&self, format: ToolFormat, call_token: Option<u32>) -> Option<Guide> {
        if !matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_)) {
            return None;
        }
        let key = format.args_key();
        let alts: Vec<Value> = self
            .shown()
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, key: t.parameters},
                    "required": ["name", key],
                    "additionalProperties": false
                })
            })
            .collect();
        let mut schema = if alts.len() == 1 {
            alts[0].clone()
        } else {
            json!({"anyOf": alts})
        };
        schema["x-guidance"] =
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
        let one = format!("%json {schema}");
        let many = self.parallel && matches!(self.choice, ToolChoice::Required);
        let lark = match format {
            ToolFormat::Hermes => {
                let call = format!("call: \"<tool_call>\\n\" {one} \"\\n</tool_call>\"\n");
                let start = if many {
                    "start: call (\"\\n\" call)*\n"
                } else {
                    "start: call\n"
                };
                format!("{start}{call}")
            }
            ToolFormat::Llama3 => {
                let start = if many {
                    "start: call (\"; \" call)*\n"
                } else {
                    "start: call\n"
                };
                format!("{start}call: {one}\n")
            }
            ToolFormat::Mistral => {
                let prefix =
                    call_token.map_or("\"[TOOL_CALLS]\"".to_owned(), |t| format!("<[{t}]>"));
                let list = if many { "call (\", \" call)*" } else { "call" };
                format!("start: {prefix} \"[\" {list} \"]\"\ncall: {one}\n")
            }
        };
        Some(Guide::Lark(lark))
    }

    /// A system message that teaches the Hermes format, for a template that shows no tools.
    pub fn instructions(&self) -> String {
        let mut text = String::from(
            "You may call one or more functions to assist with the user query. The functions are:\n<tools>\n",
        );
        for t in self.shown() {
            text.push_str(&t.raw.get("function").unwrap_or(&t.raw).to_string());
            text.push('\n');
        }
        text.push_str(
            "</tools>\nTo call a function, answer with a JSON object of its name and arguments in <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
        text
    }
}

/// One parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// Its arguments as a JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// A call from one JSON object with `name` and `arguments` (or `parameters`).
fn call_of(v: &Value) -> Option<ToolCall> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?.to_owned();
    let args = o
        .get("arguments")
        .or_else(|| o.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match args {
        // Some models write the arguments as a JSON string already.
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// Splits a model's whole answer into its text and its calls, in `format`. Every call
/// that parses is kept; text that looks like a call but does not parse (a malformed
/// block, or the last call cut short by `max_tokens`) stays in the text, so nothing the
/// model wrote is lost.
pub fn parse(text: &str, format: ToolFormat) -> (String, Vec<ToolCall>) {
    let parsed = |s: &str| {
        serde_json::from_str::<Value>(s.trim())
            .ok()
            .as_ref()
            .and_then(call_of)
    };
    let (rest, calls) = match format {
        ToolFormat::Hermes => {
            const OPEN: &str = "<tool_call>";
            const CLOSE: &str = "</tool_call>";
            let mut calls = Vec::new();
            let mut kept = String::new();
            let mut rest = text;
            while let Some(open) = rest.find(OPEN) {
                kept.push_str(&rest[..open]);
                let body = &rest[open + OPEN.len()..];
                let (inner, end) = match body.find(CLOSE) {
                    Some(close) => (&body[..close], open + OPEN.len() + close + CLOSE.len()),
                    None => (body, rest.len()),
                };
                match parsed(inner) {
                    Some(c) => calls.push(c),
                    None => kept.push_str(&rest[open..end]),
                }
                rest = &rest[end..];
            }
            kept.push_str(rest);
            (kept.trim().to_owned(), calls)
        }
        ToolFormat::Llama3 => {
            let body = text.trim().trim_start_matches("<|python_tag|>").trim();
            let mut calls = Vec::new();
            let mut rest = body;
            if body.starts_with('{') {
                for part in body.split("; ") {
                    match parsed(part) {
                        Some(c) => calls.push(c),
                        None => break,
                    }
                    rest = rest[part.len()..].strip_prefix("; ").unwrap_or("");
                }
            }
            (rest.to_owned(), calls)
        }
        ToolFormat::Mistral => {
            let (before, body) = match text.find("[TOOL_CALLS]") {
                Some(at) => (&text[..at], &text[at + "[TOOL_CALLS]".len()..]),
                // The marker is a control token, which decoding drops.
                None if text.trim_start().starts_with("[{") => ("", text),
                None => ("", ""),
            };
            let (calls, rest) = leading_array_calls(body);
            (format!("{}{rest}", before.trim_end()), calls)
        }
    };
    if calls.is_empty() {
        return (text.to_owned(), calls);
    }
    (rest, calls)
}

/// The calls of a JSON list of calls as far as its elements parse (a list cut short keeps
/// its whole elements), and the text from the first element that does not.
fn leading_array_calls(body: &str) -> (Vec<ToolCall>, &str) {
    let mut calls = Vec::new();
    let Some(mut rest) = body.trim_start().strip_prefix('[') else {
        return (calls, body);
    };
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(']') {
            return (calls, after.trim());
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let Some(call) = values
            .next()
            .and_then(|v| v.ok())
            .as_ref()
            .and_then(call_of)
        else {
            return (calls, rest);
        };
        calls.push(call);
        rest = rest[values.byte_offset()..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// Streamed output split into text to send now and calls: text streams until it might
/// begin a call, then is held back until the answer ends (a call is sent whole, as one
/// delta with its name and arguments, which the OpenAI clients accumulate the same way).
#[derive(Debug)]
pub struct ToolStream {
    format: ToolFormat,
    /// Text not yet sent (a possible call, or the tail that might begin one).
    held: String,
    /// A call has begun: everything from here is held.
    in_call: bool,
    /// Any text was seen (Llama 3's calls begin the answer).
    started: bool,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> Self {
        ToolStream {
            format,
            held: String::new(),
            in_call: false,
            started: false,
        }
    }

    fn marker(&self) -> &'static str {
        match self.format {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Mistral => "[TOOL_CALLS]",
            ToolFormat::Llama3 => "{",
        }
    }

    /// Takes new output; returns the text that can be sent now.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.in_call {
            return String::new();
        }
        let lead = self.held.trim_start();
        let at_start = !self.started;
        if !lead.is_empty() {
            self.started = true;
        }
        let starts_call = match self.format {
            // A Llama 3 call (or a Mistral list without its dropped marker) is the
            // whole answer: only a leading object opens one.
            ToolFormat::Llama3 => {
                at_start && (lead.starts_with('{') || lead.starts_with("<|python_tag|>"))
            }
            ToolFormat::Mistral => {
                lead.starts_with("[TOOL_CALLS]") || (at_start && lead.starts_with("[{"))
            }
            ToolFormat::Hermes => false,
        };
        if starts_call || (lead.is_empty() && at_start) {
            self.in_call = starts_call;
            return String::new();
        }
        let marker = self.marker();
        if let Some(at) = self
            .held
            .find(marker)
            .filter(|_| self.format != ToolFormat::Llama3)
        {
            self.in_call = true;
            let out: String = self.held[..at].to_owned();
            self.held.drain(..at);
            return out;
        }
        // Hold back a tail that could be the marker's beginning.
        let keep = (1..marker.len())
            .rev()
            .find(|&n| self.held.ends_with(&marker[..n]))
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        out
    }

    /// The answer ended: the calls, and any held text that turned out not to be one.
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let held = std::mem::take(&mut self.held);
        let (text, calls) = parse(&held, self.format);
        if calls.is_empty() {
            return (held, calls);
        }
        (text, calls)
    }
}

#[cfg(test)]
mod tests;

/// Prepares a chat request for its tools: shows them to the model (the template's
/// `tools` variable where the template reads one, else a system message teaching the
/// Hermes format) and, for `required` and named choices, sets the grammar that forces a
/// call. Returns the format to parse the answer in, None when no call can come (no tools,
/// or `tool_choice: none`).
pub fn prepare_chat(
    req: &mut super::openai_types::ChatRequest,
    template: Option<&str>,
    call_token: Option<u32>,
) -> ApiResult<Option<ToolFormat>> {
    let Some(tools) = req.tools.as_ref() else {
        return Ok(None);
    };
    if tools.choice == ToolChoice::None {
        return Ok(None);
    }
    let knows_tools = template.is_some_and(|t| t.contains("tools"));
    let format = if knows_tools {
        ToolFormat::of_template(template)
    } else {
        ToolFormat::Hermes
    };
    if let Some(g) = tools.guide(format, call_token) {
        if req.params.guide.is_some() {
            return Err(bad(
                "'tool_choice' required or a named function cannot be combined with another output constraint (response_format, guided_*)".into(),
            ));
        }
        req.params.guide = Some(g);
    }
    if knows_tools {
        req.template_vars
            .entry("tools")
            .or_insert_with(|| tools.template_tools());
    } else {
        let text = tools.instructions();
        match req.messages.first_mut() {
            Some(m) if m.role == "system" => m.content = format!("{}\n\n{text}", m.content),
            _ => req
                .messages
                .insert(0, crate::tokenizer::chat::ChatMessage::new("system", text)),
        }
    }
    Ok(Some(format))
}

/// OpenAI's shape of the calls parsed from choice `choice` of the answer `answer_id`,
/// each with an id unique to it; `stream` numbers them for deltas.
pub fn calls_out(
    calls: Vec<ToolCall>,
    answer_id: &str,
    choice: usize,
    stream: bool,
) -> Vec<super::openai_types::ToolCallOut> {
    use super::openai_types::{FunctionCallOut, ToolCallOut};
    calls
        .into_iter()
        .enumerate()
        .map(|(i, c)| ToolCallOut {
            index: stream.then_some(i),
            id: format!("call-{answer_id}-{choice}-{i}"),
            kind: "function",
            function: FunctionCallOut {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect()
}
