//! Chat templates: owns turning a list of chat messages into the prompt text a model was
//! trained on, by rendering the model's HF jinja template with minijinja, compiled once.
//!
//! The environment mirrors what `transformers`' `apply_chat_template` gives a template:
//! `trim_blocks` and `lstrip_blocks`, loop controls (`{% break %}`, `{% continue %}`),
//! `raise_exception`, `strftime_now`, a `tojson` that
//! writes like Python's `json.dumps` (no HTML escaping), Python string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`, ... via minijinja-contrib's pycompat), and
//! the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and any
//! a request adds ([`TemplateVars`]: `enable_thinking` for Qwen3, as vLLM's
//! `chat_template_kwargs`).
//! Models without a template get ChatML. A template is code from the model file: each
//! render runs on a fuel budget ([`TEMPLATE_FUEL`] instructions) and minijinja's recursion
//! limit, so a hostile or broken one fails a request instead of hanging the server.

use std::io;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{context, Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use super::Tokenizer;
use crate::error::{Error, Result};

/// ChatML, for models that ship no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat";

/// Instructions one render may run: real templates take thousands for long conversations;
/// a loop without end stops here, within about a second.
pub const TEMPLATE_FUEL: u64 = 10_000_000;

/// Extra variables a request passes to the chat template (OpenAI-compatible servers'
/// `chat_template_kwargs`, e.g. `{"enable_thinking": false}`).
pub type TemplateVars = serde_json::Map<String, serde_json::Value>;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks: `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// What they say.
    pub content: String,
    /// An assistant's function calls, as templates read them: a list of
    /// `{"type": "function", "id", "function": {"name", "arguments": {...}}}` with the
    /// arguments as an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool message's answer to this call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The function a tool message answers for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// A compiled chat template; `apply` only renders.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is an `Error::ChatTemplate` naming the line.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| Error::ChatTemplate(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// ChatML with the given bos/eos strings.
    pub fn chatml(bos_token: &str, eos_token: &str) -> Self {
        Self::new(CHATML_TEMPLATE, bos_token, eos_token).expect("the ChatML template compiles")
    }

    /// The tokenizer's own template, or ChatML when it has none; bos/eos from its ids.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Self> {
        let text = |id: Option<u32>| {
            id.and_then(|id| tokenizer.token_text(id))
                .unwrap_or_default()
        };
        let bos = text(tokenizer.bos_token_id());
        let eos = text(tokenizer.eos_token_ids().first().copied());
        match tokenizer.chat_template() {
            Some(source) => Self::new(source, &bos, &eos),
            None => Ok(Self::chatml(&bos, &eos)),
        }
    }

    /// Renders the conversation; `add_generation_prompt` opens the assistant's turn.
    /// A template's `raise_exception(msg)` comes back as `Error::ChatTemplate` with `msg`.
    pub fn apply(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.apply_with(messages, add_generation_prompt, &TemplateVars::new())
    }

    /// [`ChatTemplate::apply`] with extra template variables (`enable_thinking`, ...);
    /// `messages`, `add_generation_prompt`, `bos_token` and `eos_token` are the
    /// server's and cannot be overridden.
    pub fn apply_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        vars: &TemplateVars,
    ) -> Result<String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::ChatTemplate(describe(&e)))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                ..Value::from_serialize(vars)
            })
            .map_err(|e| Error::ChatTemplate(describe(&e)))
    }
}

/// The error with its chain of causes on one line.
fn describe(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)` for the UTC clock; supports %Y %y %m %d %-d %B %b %H %M %S %%.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_utc(secs, &format)
}

fn format_utc(secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let no_pad = spec == Some('-');
        if no_pad {
            spec = chars.next();
        }
        let two = |v: i64| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:02}")
            }
        };
        match spec {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&two(y.rem_euclid(100))),
            Some('m') => out.push_str(&two(m)),
            Some('d') => out.push_str(&two(d)),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('H') => out.push_str(&two(rem / 3600)),
            Some('M') => out.push_str(&two(rem / 60 % 60)),
            Some('S') => out.push_str(&two(rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=...)`,
/// so `", "`/`": "` separators, keys in insertion order, and no HTML escaping.
fn tojson(
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        Some(v) if v.kind() == ValueKind::Number => Some(usize::try_from(v)?),
        Some(v) if v.kind() == ValueKind::None || v.is_undefined() => None,
        Some(v) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: bad indent {v}"),
            ))
        }
        None => None,
    };
    // sort_keys / separators are rare in templates; accept and ignore them.
    let _: Option<Value> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PyFormatter::new(indent));
    value.serialize(&mut ser).map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: cannot serialize")
            .with_source(e)
    })?;
    let text = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(text))
}

/// serde_json formatting with Python `json.dumps`' separators and indentation.
struct PyFormatter {
    indent: Option<usize>,
    depth: usize,
    has_value: bool,
}

impl PyFormatter {
    fn new(indent: Option<usize>) -> Self {
        PyFormatter {
            indent,
            depth: 0,
            has_value: false,
        }
    }

    fn newline<W: ?Sized + io::Write>(&self, w: &mut W) -> io::Result<()> {
        if let Some(n) = self.indent {
            w.write_all(b"\n")?;
            w.write_all(" ".repeat(n * self.depth).as_bytes())?;
        }
        Ok(())
    }

    fn open<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    fn close<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        self.has_value = true;
        w.write_all(bracket)
    }

    fn item<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if !first {
            w.write_all(if self.indent.is_some() { b"," } else { b", " })?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.item(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as its GGUF carries it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// Llama-3-Instruct's template (bos_token, `| trim`, loop.index0, raise_exception added).
    const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, *c))
            .collect()
    }

    #[test]
    fn a_template_that_never_ends_runs_out_of_fuel_and_a_long_chat_does_not() {
        let hostile =
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(hostile, "", "").unwrap();
        let t0 = std::time::Instant::now();
        let e = t.apply(&msgs(&[("user", "hi")]), true).unwrap_err();
        assert!(e.to_string().contains("fuel"), "{e}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        let deep = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        let e = ChatTemplate::new(deep, "", "")
            .unwrap()
            .apply(&msgs(&[("user", "hi")]), true)
            .unwrap_err();
        assert!(e.to_string().contains("recursion"), "{e}");
        // 2,000 turns through Llama-3's template fit the budget with room to spare.
        let long: Vec<ChatMessage> = (0..2000)
            .map(|i| ChatMessage::new(["user", "assistant"][i % 2], "some words here"))
            .collect();
        let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        assert!(t.apply(&long, true).unwrap().len() > 2000 * 20);
    }

    #[test]
    fn smollm2_adds_default_system_prompt() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let out = t.apply(&msgs(&[("user", "hi")]), true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t
            .apply(&msgs(&[("system", "Be brief."), ("user", "hi")]), false)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        );
    }

    #[test]
    fn llama3_template_trims_and_prefixes_bos() {
        let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        let out = t
            .apply(
                &msgs(&[("system", "  Be kind. "), ("user", "Hello\n")]),
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn raise_exception_becomes_chat_template_error() {
        let t = ChatTemplate::new(LLAMA3, "", "").unwrap();
        let err = t.apply(&msgs(&[("tool", "x")]), false).unwrap_err();
        assert!(
            matches!(&err, Error::ChatTemplate(m) if m.contains("Unknown role: tool")),
            "{err}"
        );
    }

    #[test]
    fn syntax_error_is_reported_at_compile_time() {
        let err = ChatTemplate::new("{% for m in messages %}", "", "").unwrap_err();
        assert!(matches!(err, Error::ChatTemplate(_)), "{err}");
    }

    #[test]
    fn python_string_methods_and_blocks_trimming() {
        let src = "{% for m in messages %}\n  {% if m.content.startswith('!') %}{{ m.role.upper() }}:{{ m.content.strip('!').strip() }}|{% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out = t
            .apply(&msgs(&[("user", "! hi "), ("bot", "no")]), false)
            .unwrap();
        assert_eq!(out, "USER:hi|");
    }

    #[test]
    fn tojson_writes_like_python() {
        let src =
            "{{ messages[0] | tojson }}|{{ messages | tojson(indent=2) }}|{{ '<a>' | tojson }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out = t.apply(&msgs(&[("user", "é\n")]), false).unwrap();
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"é\\n\"}|[\n  {\n    \"role\": \"user\",\n    \"content\": \"é\\n\"\n  }\n]|\"<a>\""
        );
    }

    #[test]
    fn loop_controls_and_template_variables() {
        let src = "{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}{% if loop.index > 3 %}{% break %}{% endif %}{{ m.content }}{% endfor %}{% if enable_thinking is false %}|off{% endif %}{{ extra.n if extra is defined }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let chat = msgs(&[("user", "a"), ("skip", "b"), ("user", "c"), ("user", "d")]);
        assert_eq!(t.apply(&chat, false).unwrap(), "ac");
        let vars: TemplateVars =
            serde_json::from_str(r#"{"enable_thinking": false, "extra": {"n": 7}}"#).unwrap();
        assert_eq!(t.apply_with(&chat, false, &vars).unwrap(), "ac|off7");
    }

    #[test]
    fn chatml_fallback() {
        let t = ChatTemplate::chatml("", "");
        let out = t.apply(&msgs(&[("user", "hi")]), true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-07-26 13:25:09 UTC
        assert_eq!(
            format_utc(1_722_000_309, "%d %b %Y %H:%M:%S"),
            "26 Jul 2024 13:25:09"
        );
        assert_eq!(format_utc(0, "%-d %B %y %%"), "1 January 70 %");
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }
}
