//! What a client asks for and what it gets back, independent of HTTP: [`Request`] (one or
//! more prompts with [`GenerationParams`]) in, a stream of [`Chunk`]s out.

use serde::{Deserialize, Serialize};

use crate::guide::{Compiled, Guide};
use crate::model::Pooling;
use crate::tokenizer::chat::{ChatMessage, TemplateVars};

/// A request's id: given by the client (echoed back, used to cancel) or generated.
pub type RequestId = String;

/// One prompt of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, tokenized as is (special tokens such as `<|im_start|>` are parsed).
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
    /// Messages rendered through the model's chat template, with the generation prompt
    /// and the request's extra template variables.
    Chat {
        /// The conversation.
        messages: Vec<ChatMessage>,
        /// Variables the template sees besides the messages (`enable_thinking`, ...).
        template_vars: TemplateVars,
    },
}

impl Prompt {
    /// A conversation for the model's chat template, with no extra variables.
    pub fn chat(messages: Vec<ChatMessage>) -> Prompt {
        Prompt::Chat {
            messages,
            template_vars: TemplateVars::new(),
        }
    }
}

/// How to generate: the Triton/TensorRT-LLM request fields that apply to every prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerationParams {
    /// Most tokens to generate per prompt.
    pub max_tokens: usize,
    /// 0 is greedy.
    pub temperature: f32,
    /// 0 keeps every token.
    pub top_k: usize,
    /// Nucleus sampling: the smallest set of likeliest tokens whose probability reaches
    /// it; 1 keeps every token.
    pub top_p: f32,
    /// Divides positive logits (multiplies negative ones) of tokens already present; 1 is off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already generated.
    pub presence_penalty: f32,
    /// Subtracted per occurrence of each token already generated.
    pub frequency_penalty: f32,
    /// End and stop tokens are suppressed until this many tokens were generated.
    pub min_length: usize,
    /// None: a random seed per request.
    pub random_seed: Option<u64>,
    /// Token that ends generation (default: the model's end-of-sequence tokens).
    pub end_id: Option<u32>,
    /// Token that pads the shorter outputs of a batch where outputs are tensors (KServe);
    /// default `end_id`, else 0.
    pub pad_id: Option<u32>,
    /// Sequences of tokens that are never generated.
    pub bad_words: Vec<Vec<u32>>,
    /// Generation stops after any of these token sequences.
    pub stop_words: Vec<Vec<u32>>,
    /// Generation stops at any of these strings, which are trimmed from the output.
    pub stop_strings: Vec<String>,
    /// Return each output token's log-probability and their sum.
    pub return_log_probs: bool,
    /// Without it the prompt's text precedes the output (Triton's default).
    pub exclude_input_in_output: bool,
    /// Stream token by token; otherwise one chunk carries the whole answer.
    pub stream: bool,
    /// Cancel the request this long after it arrives.
    pub stop_after_ms: Option<u64>,
    /// Keep generating past end tokens (benchmarks force output lengths this way).
    pub ignore_eos: bool,
    /// Scheduling priority: lower runs first (vLLM's `priority`), first come first served
    /// within a level; under `max_utilization` a waiting request may preempt running ones
    /// of a higher value. 0 by default.
    pub priority: i32,
    /// Draft tokens the target verifies per step (speculative decoding); None: the
    /// model's default, 0: no speculation. Only where a draft source is configured.
    pub num_draft_tokens: Option<usize>,
    /// Accept draft tokens by the standard speculative sampling rule on the draft model's
    /// probabilities, rather than by matching the target's own draws.
    pub use_draft_logits: bool,
    /// Prefix caching shares KV cache blocks only between requests with the same salt
    /// (vLLM's `cache_salt`): a tenant's prompts stay apart from others'. None: the
    /// common pool.
    pub cache_salt: Option<String>,
    /// Structured output: the output must match this (a JSON Schema, a regex, a
    /// grammar, ...); tokens it does not allow are never sampled.
    pub guide: Option<Guide>,
    /// `guide` compiled for the model (Preprocess compiles it; a request whose guide
    /// is not compiled can generate nothing).
    #[serde(skip)]
    pub compiled_guide: Option<Compiled>,
    /// Some: the answer is the prompt's embedding, its final hidden states pooled so and
    /// L2-normalized (`Chunk::embedding`), and nothing is generated (`max_tokens` must be
    /// 0). None: a generation.
    pub pooling: Option<Pooling>,
    /// Sequences generated for each prompt (OpenAI's `n`), each answered on its own
    /// `batch_index`: `prompt * n + j`. With a seed, sequence `j` draws from
    /// [`choice_seed`](crate::sampling::choice_seed)`(seed, j)`. They share the prompt's
    /// full KV blocks through prefix caching.
    pub n: usize,
    /// Alternatives returned with each output token: this many of the most likely
    /// tokens with their log-probabilities (`Chunk::top_log_probs`; at most 20).
    pub top_log_probs: usize,
    /// Return every prompt token's log-probability under the model (the raw log-softmax
    /// of the logits before it; none for the first token) with `top_log_probs`
    /// alternatives (`Chunk::prompt_log_probs`). Such a sequence computes its whole
    /// prompt: it finds no prefix in the cache.
    pub prompt_log_probs: bool,
    /// Added to these tokens' logits before penalties and sampling (OpenAI's
    /// `logit_bias`): `(token id, bias)`, a bias in -100..=100.
    pub logit_bias: Vec<(u32, f32)>,
    /// Drops the tokens whose probability (after temperature) is below `min_p` times the
    /// most likely token's, before top-k and top-p (vLLM's `min_p`); 0 is off.
    pub min_p: f32,
    /// Return the model's raw logits at every prompt position (`Chunk::context_logits`,
    /// TensorRT-LLM's `return_context_logits`): the last one is the first output token's.
    /// Such a sequence computes its whole prompt (no cached prefix) and does not speculate.
    pub return_context_logits: bool,
    /// Return the model's raw logits each output token was drawn from
    /// (`Chunk::generation_logits`, TensorRT-LLM's `return_generation_logits`), before
    /// penalties, bias and temperature. Such a sequence does not speculate.
    pub return_generation_logits: bool,
    /// Beam search (TensorRT-LLM's `beam_width`): this many beams per prompt, the best by
    /// length-penalized cumulative log-probability returned whole in `Chunk::beams`; 1 is
    /// sampling (or greedy), no beams.
    pub beam_width: usize,
    /// Beams returned per prompt, best first (`num_return_sequences` with beams): at most
    /// `beam_width`; 0 returns them all.
    pub beams_returned: usize,
    /// A beam's score is its cumulative log-probability over `length ^ length_penalty`
    /// (its generated tokens, an end token included); 0 (the default) scores by the sum
    /// alone, as TensorRT-LLM does.
    pub length_penalty: f32,
    /// When beam search stops (TensorRT-LLM's `early_stopping`): 1 (the default) once
    /// `beam_width` finished hypotheses exist; 0 once no running beam can beat the worst
    /// of them at its current length; 2 or more likewise at the longest length it may reach.
    pub early_stopping: i32,
}

impl Default for GenerationParams {
    fn default() -> Self {
        GenerationParams {
            max_tokens: 16,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            min_length: 0,
            random_seed: None,
            end_id: None,
            pad_id: None,
            bad_words: Vec::new(),
            stop_words: Vec::new(),
            stop_strings: Vec::new(),
            return_log_probs: false,
            exclude_input_in_output: false,
            stream: true,
            stop_after_ms: None,
            ignore_eos: false,
            num_draft_tokens: None,
            use_draft_logits: false,
            cache_salt: None,
            priority: 0,
            guide: None,
            compiled_guide: None,
            pooling: None,
            n: 1,
            top_log_probs: 0,
            prompt_log_probs: false,
            logit_bias: Vec::new(),
            min_p: 0.0,
            return_context_logits: false,
            return_generation_logits: false,
            beam_width: 1,
            beams_returned: 0,
            length_penalty: 0.0,
            early_stopping: 1,
        }
    }
}

impl GenerationParams {
    /// Whether the engine returns this sequence's logits rows to the host as they are
    /// (rather than only its choices from them).
    pub fn wants_logit_rows(&self) -> bool {
        self.return_context_logits || self.return_generation_logits
    }

    /// Whether the request runs beam search (`beam_width` > 1).
    pub fn is_beam_search(&self) -> bool {
        self.beam_width > 1
    }

    /// The parameters of an embedding request: nothing generated, no speculation, the
    /// answer in one chunk.
    pub fn embedding(pooling: Pooling) -> Self {
        GenerationParams {
            max_tokens: 0,
            num_draft_tokens: Some(0),
            stream: false,
            exclude_input_in_output: true,
            pooling: Some(pooling),
            ..GenerationParams::default()
        }
    }
}

/// A generation request: one prompt, or several (a batch, answered with `batch_index`).
#[derive(Debug, Clone)]
pub struct Request {
    /// The client's id; None gets `req-N`.
    pub id: Option<RequestId>,
    /// The prompts, answered by index (`Chunk::batch_index`).
    pub prompts: Vec<Prompt>,
    /// How to generate, for every prompt.
    pub params: GenerationParams,
}

impl Request {
    /// A request for one text prompt.
    pub fn text(prompt: impl Into<String>, params: GenerationParams) -> Self {
        Request {
            id: None,
            prompts: vec![Prompt::Text(prompt.into())],
            params,
        }
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end token, stop word or stop string.
    Stop,
    /// max_tokens or the context length.
    Length,
    /// Cancelled by the client, a stop request or stop_after_ms.
    Cancelled,
    /// The engine failed; `Chunk::error` says how.
    Error,
}

impl FinishReason {
    /// The reason's name, as Triton's `finish_reason` output and the request log give it.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

/// A token and its log-probability: one of the alternatives at a position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    /// The token's id.
    pub token: u32,
    /// Its log-probability.
    pub log_prob: f32,
}

/// One prompt token as the model scores it (`GenerationParams::prompt_log_probs`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PromptLogprob {
    /// The prompt token's id.
    pub token: u32,
    /// None for the first token, which nothing precedes.
    pub log_prob: Option<f32>,
    /// The most likely tokens at its position, from the most likely.
    pub top: Vec<TokenLogprob>,
}

/// A piece of one prompt's answer, streamed to the client.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Chunk {
    /// Which prompt of the request this belongs to.
    pub batch_index: usize,
    /// New text (whole UTF-8 characters only).
    pub text: String,
    /// New token ids.
    pub token_ids: Vec<u32>,
    /// Log-probabilities of the new tokens, when asked for.
    pub log_probs: Vec<f32>,
    /// Sum of the log-probabilities of all output tokens so far, when asked for.
    pub cum_log_prob: Option<f32>,
    /// The alternatives at each new token (lined up with `token_ids`), when
    /// `top_log_probs` asked for them.
    pub top_log_probs: Vec<Vec<TokenLogprob>>,
    /// Every prompt token with its log-probability, on the first chunk of a sequence
    /// (the whole answer's, when not streamed) when `prompt_log_probs` asked for them.
    pub prompt_log_probs: Vec<PromptLogprob>,
    /// The raw logits at each prompt position (`[prompt_tokens][vocab]`), on the chunk of
    /// the first output token when `return_context_logits` asked for them.
    pub context_logits: Vec<Vec<f32>>,
    /// The raw logits each new token was drawn from (lined up with `token_ids`), when
    /// `return_generation_logits` asked for them.
    pub generation_logits: Vec<Vec<f32>>,
    /// Set on the last chunk of this prompt.
    pub finish_reason: Option<FinishReason>,
    /// Set when the request failed.
    pub error: Option<String>,
    /// Prompt tokens of this prompt (on its token chunks and its last).
    pub prompt_tokens: usize,
    /// Output tokens of this prompt so far.
    pub output_tokens: usize,
    /// Time this prompt waited before it was first scheduled (on its first chunk).
    pub queue_time: Option<std::time::Duration>,
    /// Prompt tokens found in the KV cache (prefix caching), not computed again (on its
    /// token chunks and its last).
    pub cached_tokens: usize,
    /// When the first token of this chunk was produced, for a chunk that accumulates
    /// several (a non-streamed answer), so latency metrics stay server-side.
    pub first_token_at: Option<std::time::Instant>,
    /// The prompt's embedding, on the last chunk of a request with `pooling` set.
    pub embedding: Option<Vec<f32>>,
    /// Beam search: every returned beam so far, best first, each whole (its text, token
    /// ids and log-probabilities from the first output token on, `cum_log_prob` its
    /// sum, `finish_reason` its own end); each chunk replaces the last one's beams, as a
    /// beam's earlier tokens may change. Empty without beam search; the prompt's own
    /// `text` and `token_ids` are then empty.
    pub beams: Vec<Chunk>,
    /// Speculative decoding of this prompt so far: verification steps (on the last
    /// chunk).
    pub draft_steps: usize,
    /// Draft tokens proposed in them.
    pub draft_tokens: usize,
    /// Draft tokens accepted in them.
    pub accepted_draft_tokens: usize,
}

impl Chunk {
    /// The last chunk of its prompt (`finish_reason` is set).
    pub fn is_final(&self) -> bool {
        self.finish_reason.is_some()
    }
}

impl Chunk {
    /// This chunk with `earlier` (of the same sequence) before it: the tokens, text and
    /// log-probabilities of both, this chunk's end and counts, the first queue time and
    /// first-token time.
    pub fn after(mut self, earlier: Chunk) -> Chunk {
        self.text.insert_str(0, &earlier.text);
        self.token_ids.splice(0..0, earlier.token_ids);
        self.log_probs.splice(0..0, earlier.log_probs);
        self.top_log_probs.splice(0..0, earlier.top_log_probs);
        self.prompt_log_probs.splice(0..0, earlier.prompt_log_probs);
        self.context_logits.splice(0..0, earlier.context_logits);
        self.generation_logits
            .splice(0..0, earlier.generation_logits);
        self.queue_time = earlier.queue_time.or(self.queue_time);
        self.first_token_at = earlier.first_token_at.or(self.first_token_at);
        self.cum_log_prob = self.cum_log_prob.or(earlier.cum_log_prob);
        if self.beams.is_empty() {
            self.beams = earlier.beams;
        }
        self
    }
}

/// Each answer whole, from the chunks of a request (by `batch_index`: `answers` is the
/// number of prompts times `n`).
pub fn answers(chunks: Vec<Chunk>, prompts: usize) -> Vec<Chunk> {
    let mut out: Vec<Chunk> = (0..prompts)
        .map(|i| Chunk {
            batch_index: i,
            ..Chunk::default()
        })
        .collect();
    for c in chunks {
        let Some(slot) = out.get_mut(c.batch_index) else {
            continue;
        };
        slot.text.push_str(&c.text);
        slot.token_ids.extend(c.token_ids);
        slot.log_probs.extend(c.log_probs);
        slot.top_log_probs.extend(c.top_log_probs);
        slot.prompt_log_probs.extend(c.prompt_log_probs);
        slot.context_logits.extend(c.context_logits);
        slot.generation_logits.extend(c.generation_logits);
        slot.cum_log_prob = c.cum_log_prob.or(slot.cum_log_prob);
        slot.finish_reason = c.finish_reason.or(slot.finish_reason);
        slot.error = c.error.or(slot.error.take());
        slot.embedding = c.embedding.or(slot.embedding.take());
        slot.prompt_tokens = slot.prompt_tokens.max(c.prompt_tokens);
        slot.output_tokens = slot.output_tokens.max(c.output_tokens);
        slot.draft_steps = slot.draft_steps.max(c.draft_steps);
        slot.draft_tokens = slot.draft_tokens.max(c.draft_tokens);
        slot.accepted_draft_tokens = slot.accepted_draft_tokens.max(c.accepted_draft_tokens);
        if !c.beams.is_empty() {
            // A later chunk's beams replace the earlier ones.
            slot.beams = c.beams;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reason_names_match_their_serialized_form() {
        for r in [
            FinishReason::Stop,
            FinishReason::Length,
            FinishReason::Cancelled,
            FinishReason::Error,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }
}
