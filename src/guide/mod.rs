//! Structured output: what a request constrains its output to ([`Guide`]: a JSON
//! Schema, any JSON object, a regex, a choice of strings, a Lark or GBNF grammar),
//! compiled once per request by [`Guides`] against the model's vocabulary with
//! llguidance, and followed token by token by each sequence's [`GuideState`].
//!
//! # Layout
//! - `vocab`: the model's tokenizer as llguidance's token trie;
//! - `gbnf`: GBNF grammars rewritten in llguidance's Lark dialect;
//! - `state`: one sequence's matcher and the mask of the tokens it allows next.

pub mod gbnf;
mod state;
mod vocab;

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use state::GuideState;

use crate::sampling::TokenMask;
use crate::tokenizer::Tokenizer;

/// A constraint on a request's output text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "value")]
pub enum Guide {
    /// JSON valid against this JSON Schema (`response_format: json_schema`,
    /// `guided_json`, TensorRT-LLM's `json_schema`).
    JsonSchema(Value),
    /// Any JSON object (`response_format: json_object`, TensorRT-LLM's `json`).
    JsonObject,
    /// Text matching this regular expression (Rust `regex` syntax, whole match).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A GBNF grammar (`root ::= ...`), as llama.cpp, vLLM's `guided_grammar` and
    /// TensorRT-LLM's `ebnf_grammar` take.
    Ebnf(String),
}

impl Guide {
    /// The constraint's kind, as metrics and logs name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Guide::JsonSchema(_) => "json_schema",
            Guide::JsonObject => "json_object",
            Guide::Regex(_) => "regex",
            Guide::Choice(_) => "choice",
            Guide::Lark(_) => "lark",
            Guide::Ebnf(_) => "ebnf",
        }
    }
}

/// A guide compiled for one model: a matcher at the start of its grammar and the mask
/// of its first token, shared by the sequences of a request (each clones its own).
#[derive(Clone)]
pub struct Compiled {
    start: Arc<Matcher>,
    first: Arc<GrammarMask>,
    /// The vocabulary trie's end tokens, which the masks take out.
    trie_eos: Arc<[u32]>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("first_allowed", &self.first.allowed.count())
            .finish_non_exhaustive()
    }
}

/// Two compilations are the same only if they are one (a request's params compare
/// equal to their clones).
impl PartialEq for Compiled {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.start, &other.start)
    }
}

/// What a grammar allows next: tokens (never an end token) and whether it may end here.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GrammarMask {
    pub(crate) allowed: TokenMask,
    pub(crate) may_end: bool,
}

/// Compiles requests' guides for one model. The vocabulary's token trie is built on the
/// first guided request (tens of milliseconds for a large vocabulary), then shared.
pub struct Guides {
    tokenizer: Arc<Tokenizer>,
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl std::fmt::Debug for Guides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guides").finish_non_exhaustive()
    }
}

/// The JSON layout generated where a schema does not say otherwise: one space after
/// `,` and `:` as models mostly saw JSON written, and no other whitespace, so a small
/// model cannot wander into endless blank lines.
fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

impl Guides {
    /// Compiles guides against `tokenizer`'s vocabulary.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Guides {
            tokenizer,
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, String> {
        self.factory
            .get_or_init(|| vocab::factory(&self.tokenizer))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Compiles `guide`, or says what is wrong with it: a schema or grammar that does
    /// not parse, uses what llguidance cannot enforce, or can match nothing.
    pub fn compile(&self, guide: &Guide) -> Result<Compiled, String> {
        let grammar = match guide {
            Guide::JsonSchema(schema) => {
                let mut schema = match schema {
                    Value::Object(_) => schema.clone(),
                    Value::Bool(true) => json!({}),
                    other => {
                        return Err(format!(
                            "a JSON schema must be an object, got {}",
                            json_kind(other)
                        ))
                    }
                };
                if let Some(o) = schema.as_object_mut() {
                    o.entry("x-guidance").or_insert_with(json_layout);
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            Guide::JsonObject => TopLevelGrammar::from_json_schema(
                json!({"type": "object", "x-guidance": json_layout()}),
            ),
            Guide::Regex(rx) => {
                if rx.is_empty() {
                    return Err("the regex is empty".into());
                }
                TopLevelGrammar::from_regex(rx)
            }
            Guide::Choice(choices) => {
                if choices.is_empty() || choices.iter().any(String::is_empty) {
                    return Err("a choice needs at least one non-empty string".into());
                }
                let alts: Vec<String> = choices
                    .iter()
                    .map(|c| Value::from(c.as_str()).to_string())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            Guide::Lark(g) => {
                if g.trim().is_empty() {
                    return Err("the grammar is empty".into());
                }
                TopLevelGrammar::from_lark(g.clone())
            }
            Guide::Ebnf(g) => TopLevelGrammar::from_lark(gbnf::to_lark(g)?),
        };
        let factory = self.factory()?;
        let parser = factory
            .create_parser(grammar)
            .map_err(|e| short(&e.to_string()))?;
        let mut start = Matcher::new(Ok(parser));
        if let Some(e) = start.get_error() {
            return Err(short(&e));
        }
        let trie_eos: Arc<[u32]> = self.tokenizer.eos_token_ids().into();
        let first = state::grammar_mask(&mut start, self.tokenizer.vocab_size(), &trie_eos)?;
        if first.allowed.count() == 0 && !first.may_end {
            return Err("the constraint can match nothing".into());
        }
        Ok(Compiled {
            start: Arc::new(start),
            first: Arc::new(first),
            trie_eos,
        })
    }
}

/// llguidance's messages may carry the whole grammar and parser state: the first lines.
fn short(e: &str) -> String {
    let mut lines: Vec<&str> = e.lines().filter(|l| !l.trim().is_empty()).take(3).collect();
    if lines.is_empty() {
        lines.push("invalid constraint");
    }
    let msg = lines.join("; ");
    match msg.char_indices().nth(400) {
        Some((at, _)) => format!("{}...", &msg[..at]),
        None => msg,
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
