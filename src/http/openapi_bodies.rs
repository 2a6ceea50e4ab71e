//! Schemas, for the OpenAPI document, of the request bodies that are read field by field
//! rather than through a serde type (Triton's generate, KServe's infer, OpenAI's
//! completions and chat completions: see fields.rs, tensors.rs and openai_types.rs).
//! These types are never deserialized; a test checks that every field they list is one
//! their parser reads.

#![allow(dead_code)]

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde_json::Value;

/// A string or a list of strings.
#[derive(JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// One chat message: text content, or text parts (`{"type": "text", "text"}`).
#[derive(JsonSchema)]
pub struct ChatMessageDoc {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    #[schemars(with = "Option<Value>")]
    pub content: Option<Value>,
    /// An assistant's calls: `{"id", "type": "function", "function": {"name", "arguments"}}`.
    #[schemars(with = "Option<Vec<BTreeMap<String, Value>>>")]
    pub tool_calls: Option<Value>,
    /// The call a tool message answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

/// The sampling and output-constraint fields both OpenAI routes read.
#[derive(JsonSchema)]
pub struct SamplingDoc {
    /// Default 16 on completions; on chat the rest of the context.
    pub max_tokens: Option<u32>,
    /// Default 1.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// vLLM's: -1 or 0 is off.
    pub top_k: Option<i64>,
    /// vLLM's: drop tokens less likely than this fraction of the most likely one's.
    pub min_p: Option<f32>,
    /// Choices per prompt, 1 to 16.
    pub n: Option<u32>,
    /// Up to 4 stop strings.
    pub stop: Option<OneOrMany>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptionsDoc>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_tokens: Option<u32>,
    pub ignore_eos: Option<bool>,
    /// Scheduling priority (vLLM's): lower runs first; 0 by default.
    pub priority: Option<i32>,
    /// Token id to a bias in -100..100.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub user: Option<String>,
    pub cache_salt: Option<String>,
    pub num_draft_tokens: Option<u32>,
    pub use_draft_logits: Option<bool>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
    /// "strict"}}`: the output is constrained to it.
    #[schemars(with = "Option<BTreeMap<String, Value>>")]
    pub response_format: Option<Value>,
    /// A JSON Schema the output must match (vLLM's), an object or a string holding one.
    #[schemars(with = "Option<Value>")]
    pub guided_json: Option<Value>,
    /// A regex the whole output must match (vLLM's).
    pub guided_regex: Option<String>,
    /// The output is one of these strings (vLLM's).
    pub guided_choice: Option<Vec<String>>,
    /// A grammar: GBNF (`root ::= ...`) or llguidance's Lark (vLLM's).
    pub guided_grammar: Option<String>,
    /// vLLM's newer form: one of `json`, `json_object`, `regex`, `choice`, `grammar`.
    #[schemars(with = "Option<BTreeMap<String, Value>>")]
    pub structured_outputs: Option<Value>,
}

/// `POST /v1/completions` (OpenAI's legacy completions, with vLLM's extensions).
#[derive(JsonSchema)]
pub struct CompletionRequestDoc {
    pub model: String,
    /// A string, a list of strings, a list of token ids or a list of such lists.
    #[schemars(with = "Value")]
    pub prompt: Value,
    #[serde(flatten)]
    pub sampling: SamplingDoc,
    /// Sequences generated per choice; the `n` likeliest are returned (not streamed).
    pub best_of: Option<u32>,
    pub echo: Option<bool>,
    /// 0 to 5: the sampled tokens' log-probabilities and this many alternatives (with
    /// `echo`, the prompt's too).
    pub logprobs: Option<u32>,
    /// Refused unless empty.
    pub suffix: Option<String>,
}

/// `stream_options`.
#[derive(JsonSchema)]
pub struct StreamOptionsDoc {
    pub include_usage: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(JsonSchema)]
pub struct ChatRequestDoc {
    pub model: String,
    pub messages: Vec<ChatMessageDoc>,
    /// Default: the rest of the context.
    pub max_completion_tokens: Option<u32>,
    #[serde(flatten)]
    pub sampling: SamplingDoc,
    pub logprobs: Option<bool>,
    /// Alternatives per token, 0 to 20.
    pub top_logprobs: Option<u32>,
    /// Extra chat template variables (vLLM's).
    pub chat_template_kwargs: Option<BTreeMap<String, Value>>,
    /// Function tools: `{"type": "function", "function": {"name", "description",
    /// "parameters"}}`.
    #[schemars(with = "Option<Vec<BTreeMap<String, Value>>>")]
    pub tools: Option<Value>,
    /// `auto`, `none`, `required` or `{"type": "function", "function": {"name"}}`.
    #[schemars(with = "Option<Value>")]
    pub tool_choice: Option<Value>,
    /// Default true.
    pub parallel_tool_calls: Option<bool>,
}

/// `POST /v2/models/{model}/generate` and `generate_stream` (Triton's generate
/// extension, TensorRT-LLM's field names). Each field may also sit under `parameters`,
/// and a value may be a tensor-shaped list around a scalar.
#[derive(JsonSchema)]
pub struct GenerateRequestDoc {
    /// The prompt (the text models).
    pub text_input: Option<String>,
    /// The prompt as token ids (`tensorrt_llm`).
    pub input_ids: Option<Vec<u32>>,
    pub max_tokens: Option<u32>,
    /// TensorRT-LLM's name of `max_tokens`.
    pub request_output_len: Option<u32>,
    pub temperature: Option<f32>,
    pub top_k: Option<u32>,
    pub runtime_top_k: Option<u32>,
    pub top_p: Option<f32>,
    pub runtime_top_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub min_length: Option<u32>,
    pub min_tokens: Option<u32>,
    pub random_seed: Option<u64>,
    pub seed: Option<u64>,
    pub end_id: Option<u32>,
    /// TensorRT-LLM's guided decoding: `json`, `json_schema`, `regex`, `ebnf_grammar` or
    /// `lark_grammar`.
    pub guided_decoding_guide_type: Option<String>,
    /// The schema, regex or grammar of `guided_decoding_guide_type`.
    pub guided_decoding_guide: Option<String>,
    pub pad_id: Option<u32>,
    pub bad_words: Option<OneOrMany>,
    pub stop_words: Option<OneOrMany>,
    pub return_log_probs: Option<bool>,
    /// Sequences sampled per prompt (1-16), each answered with its `sequence_index`; with
    /// beam search, the beams returned (at most `beam_width`).
    pub num_return_sequences: Option<u32>,
    /// Beam search with this many beams (1-8; 1 is no beam search): every output key
    /// becomes a list over the returned beams, best first.
    pub beam_width: Option<u32>,
    /// Beam scores divide by `length ^ length_penalty` (0 by default).
    pub length_penalty: Option<f32>,
    /// TensorRT-LLM's name of `length_penalty`.
    pub len_penalty: Option<f32>,
    /// When beam search ends: 1 (default) once `beam_width` hypotheses are finished, 0
    /// once no running beam can beat them, 2 or more likewise at the longest length.
    pub early_stopping: Option<i32>,
    /// Only 0: beams are ranked by log-probability alone.
    pub beam_search_diversity_rate: Option<f32>,
    /// The raw logits at every prompt position (`context_logits`, `[positions, vocab]`
    /// flattened). The prompt is computed whole.
    pub return_context_logits: Option<bool>,
    /// The raw logits each output token was drawn from (`generation_logits`,
    /// `[1, tokens, vocab]` flattened).
    pub return_generation_logits: Option<bool>,
    pub exclude_input_in_output: Option<bool>,
    pub stream: Option<bool>,
    pub streaming: Option<bool>,
    pub stop_after_ms: Option<u64>,
    pub ignore_eos: Option<bool>,
    /// Scheduling priority (vLLM's): lower runs first; 0 by default.
    pub priority: Option<i32>,
    pub num_draft_tokens: Option<u32>,
    pub use_draft_logits: Option<bool>,
    pub cache_salt: Option<String>,
    /// The request's id (a stop request: `{"id": ..., "stop": true}`).
    pub id: Option<String>,
    pub stop: Option<bool>,
    #[schemars(with = "Option<BTreeMap<String, Value>>")]
    pub parameters: Option<Value>,
}

/// `POST /v2/models/{model}/infer` (KServe v2; JSON, or JSON then binary tensor data with
/// `Inference-Header-Content-Length`).
#[derive(JsonSchema)]
pub struct InferRequestDoc {
    pub id: Option<String>,
    /// Request-wide parameters (generate's fields).
    #[schemars(with = "Option<BTreeMap<String, Value>>")]
    pub parameters: Option<Value>,
    pub inputs: Vec<TensorDoc>,
    pub outputs: Option<Vec<OutputDoc>>,
}

/// One input tensor (`text_input`, `input_ids`, `max_tokens`, ...).
#[derive(JsonSchema)]
pub struct TensorDoc {
    pub name: String,
    pub shape: Vec<u64>,
    /// `BYTES`, `INT32`, `INT64`, `UINT32`, `FP32`, `BOOL`, ...
    pub datatype: String,
    #[schemars(with = "Option<Vec<Value>>")]
    pub data: Option<Value>,
    #[schemars(with = "Option<BTreeMap<String, Value>>")]
    pub parameters: Option<Value>,
}

/// One requested output tensor.
#[derive(JsonSchema)]
pub struct OutputDoc {
    pub name: String,
    #[schemars(with = "Option<BTreeMap<String, Value>>")]
    pub parameters: Option<Value>,
}
