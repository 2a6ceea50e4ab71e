//! Single-sequence generation for `inflight generate`: prefill the prompt, then decode
//! token by token, streaming text through a callback as soon as it is whole UTF-8.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::model::{KvCache, Llama, SeqChunk};
use crate::request::GenerationParams;
use crate::sampling::SeqSampler;
use crate::tokenizer::detok::Detokenizer;
use crate::tokenizer::Tokenizer;

const BLOCK_SIZE: usize = 32;

/// How [`generate`] runs.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling, end tokens and stop words (its `max_tokens` is not read).
    pub sampling: GenerationParams,
}

/// What one generation did, for reporting speed.
#[derive(Debug, Clone, Default)]
pub struct GenerateStats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// The generated token ids, in order (an end token that stopped generation excluded).
    pub generated: Vec<u32>,
    /// Time of the prompt's forward pass.
    pub prefill: Duration,
    /// Time from the end of prefill to the last token: sampling, detokenizing and every
    /// decode step.
    pub decode: Duration,
}

impl GenerateStats {
    /// Decode speed: tokens after the first over the time spent producing them.
    pub fn decode_tokens_per_s(&self) -> f64 {
        let n = self.generated.len().saturating_sub(1);
        n as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// Generates from `prompt`, calling `on_text` with each newly completed piece of text.
pub fn generate(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_text: impl FnMut(&str),
) -> Result<GenerateStats> {
    let cfg = model.config();
    if prompt.is_empty() {
        return Err(Error::InvalidRequest("the prompt has no tokens".into()));
    }
    let total = prompt.len() + opts.max_tokens;
    if total > cfg.max_position_embeddings {
        return Err(Error::InvalidRequest(format!(
            "prompt ({} tokens) plus max_tokens ({}) exceeds the context length {}",
            prompt.len(),
            opts.max_tokens,
            cfg.max_position_embeddings
        )));
    }
    let blocks = total.div_ceil(BLOCK_SIZE);
    let mut cache = KvCache::new(cfg, BLOCK_SIZE, blocks);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut sampler = SeqSampler::new(&opts.sampling, prompt, tokenizer.eos_token_ids());
    let mut detok = Detokenizer::new();
    let mut stats = GenerateStats {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };

    // LongRoPE (Phi-3): the long factors for a sequence past the original context, the
    // whole sequence computed again with them where a decode crosses it (the scheduler's
    // rule, `SchedulerConfig::long_rope_from`).
    let long_from = cfg.long_rope_from();
    let mut long_rope = long_from.is_some_and(|from| prompt.len() > from);
    let t0 = Instant::now();
    let mut logits = model.forward(
        &[SeqChunk {
            tokens: prompt,
            start_pos: 0,
            block_table: &table,
            logits: 1,
            long_rope,
        }],
        &mut cache,
    )?;
    stats.prefill = t0.elapsed();
    let t1 = Instant::now();
    let mut pos = prompt.len();
    while stats.generated.len() < opts.max_tokens {
        let sampled = sampler.sample(&mut logits[0]);
        let next = sampled.token;
        if sampled.stop && sampler.is_end_token(next) {
            break;
        }
        stats.generated.push(next);
        if !tokenizer.is_special(next) {
            if let Some(bytes) = tokenizer.token_bytes(next) {
                let piece = detok.push(&bytes);
                if !piece.is_empty() {
                    on_text(&piece);
                }
            }
        }
        if sampled.stop || stats.generated.len() == opts.max_tokens {
            break;
        }
        let crossing = long_from.is_some_and(|from| !long_rope && pos + 1 > from);
        let known;
        let (tokens, start_pos) = if crossing {
            long_rope = true;
            known = [prompt, &stats.generated[..]].concat();
            (&known[..], 0)
        } else {
            (std::slice::from_ref(&next), pos)
        };
        logits = model.forward(
            &[SeqChunk {
                tokens,
                start_pos,
                block_table: &table,
                logits: 1,
                long_rope,
            }],
            &mut cache,
        )?;
        pos += 1;
    }
    let rest = detok.finish();
    if !rest.is_empty() {
        on_text(&rest);
    }
    stats.decode = t1.elapsed();
    Ok(stats)
}
