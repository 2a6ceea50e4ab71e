//! One sequence's output as the client sees it: incremental detokenization that never
//! splits a character, stop strings found across token boundaries and trimmed, the prompt
//! echoed when asked, log-probabilities with their alternatives and the prompt's scores
//! when asked, streamed chunks or one accumulated answer. Pure logic: Postprocess owns
//! one `SeqOutputState` per sequence.

use crate::request::{Chunk, FinishReason, GenerationParams, PromptLogprob, TokenLogprob};
use crate::sampling::{Hypothesis, RowChoice};
use crate::tokenizer::detok::Detokenizer;
use crate::tokenizer::Tokenizer;

/// Output state of one prompt of a request.
pub struct SeqOutputState {
    /// Chunks of this iteration held for the final chunk (the sequence ends in it).
    held_chunk: Option<Chunk>,
    batch_index: usize,
    stream: bool,
    detok: Detokenizer,
    stop_strings: Vec<String>,
    end_ids: Vec<u32>,
    return_log_probs: bool,
    /// Alternatives are returned with each token.
    top_log_probs: bool,
    /// The prompt's scores so far (`prompt_log_probs`): its first token, then each one
    /// scored, in order; None when not asked for or once sent.
    prompt: Option<Vec<PromptLogprob>>,
    /// The prompt's raw logits rows so far, one per position in order
    /// (`return_context_logits`); None when not asked for or once sent.
    context: Option<Vec<Vec<f32>>>,
    /// Each output token's raw logits row is returned (`return_generation_logits`).
    generation_logits: bool,
    /// Text that may be the start of a stop string, not sent yet.
    held: String,
    /// The answer so far when not streaming.
    pending: Chunk,
    prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache.
    cached_tokens: usize,
    output_tokens: usize,
    cum_log_prob: f32,
    first_token_at: Option<std::time::Instant>,
    done: bool,
    draft_steps: usize,
    draft_tokens: usize,
    accepted_draft_tokens: usize,
}

/// What pushing one token produced.
pub struct Pushed {
    /// A chunk to send now (streaming only).
    pub chunk: Option<Chunk>,
    /// A stop string completed: the sequence must end (call `finish`).
    pub stop_string: bool,
}

impl SeqOutputState {
    /// `prompt_text` is sent before the output when the request does not exclude it
    /// and is not streamed (a streamed event carries only new text, as TRT-LLM's do).
    /// `first_prompt_token` starts the prompt's scores, when they are asked for.
    pub fn new(
        batch_index: usize,
        prompt_tokens: usize,
        prompt_text: Option<String>,
        params: &GenerationParams,
        end_ids: Vec<u32>,
        first_prompt_token: Option<u32>,
    ) -> Self {
        let mut pending = Chunk {
            batch_index,
            ..Chunk::default()
        };
        if !params.stream && !params.exclude_input_in_output {
            pending.text = prompt_text.unwrap_or_default();
        }
        SeqOutputState {
            held_chunk: None,
            batch_index,
            stream: params.stream,
            detok: Detokenizer::new(),
            stop_strings: params
                .stop_strings
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
            end_ids: if params.ignore_eos {
                Vec::new()
            } else {
                end_ids
            },
            return_log_probs: params.return_log_probs,
            top_log_probs: params.top_log_probs > 0,
            prompt: first_prompt_token
                .filter(|_| params.prompt_log_probs)
                .map(|token| {
                    vec![PromptLogprob {
                        token,
                        ..PromptLogprob::default()
                    }]
                }),
            context: params.return_context_logits.then(Vec::new),
            generation_logits: params.return_generation_logits,
            held: String::new(),
            pending,
            prompt_tokens,
            output_tokens: 0,
            cum_log_prob: 0.0,
            first_token_at: None,
            done: false,
            draft_steps: 0,
            draft_tokens: 0,
            accepted_draft_tokens: 0,
            cached_tokens: 0,
        }
    }

    /// Counts one speculative step's draft tokens, proposed and accepted (reported on the
    /// last chunk).
    pub fn note_draft(&mut self, proposed: usize, accepted: usize) {
        self.draft_steps += usize::from(proposed > 0);
        self.draft_tokens += proposed;
        self.accepted_draft_tokens += accepted;
    }

    /// Notes the prompt tokens the prefix cache held (reported on every token chunk).
    pub fn note_cached(&mut self, tokens: usize) {
        self.cached_tokens = tokens;
    }

    /// Adds scores of the prompt's tokens from position `from` on (the token a row scores
    /// comes from the engine; positions already known, from a recomputed chunk, are
    /// skipped). They go out with the sequence's next chunk.
    pub fn note_prompt(&mut self, from: usize, rows: Vec<RowChoice>, logits: Vec<Vec<f32>>) {
        if let Some(context) = self.context.as_mut() {
            // The row that scores the token at `pos` was computed at `pos - 1`; the last
            // position's row comes with the first output token.
            for (pos, row) in (from.max(1) - 1..).zip(logits) {
                if pos == context.len() && pos + 1 < self.prompt_tokens {
                    context.push(row);
                }
            }
        }
        let Some(prompt) = self.prompt.as_mut() else {
            return;
        };
        for (pos, r) in (from..).zip(rows) {
            if pos != prompt.len() || pos >= self.prompt_tokens {
                continue;
            }
            prompt.push(PromptLogprob {
                token: r.token.unwrap_or(u32::MAX),
                log_prob: Some(r.log_prob),
                top: r.top,
            });
        }
    }

    /// The prompt's scores, once: on the first chunk after all of them are known (or on
    /// the last chunk).
    fn take_prompt(&mut self, last: bool) -> Vec<PromptLogprob> {
        let complete = self
            .prompt
            .as_ref()
            .is_some_and(|p| last || p.len() >= self.prompt_tokens);
        match complete {
            true => self.prompt.take().unwrap_or_default(),
            false => Vec::new(),
        }
    }

    /// The prompt's logits rows, once: on the chunk of the first output token, whose row
    /// is the last position's (or on the last chunk).
    fn take_context(&mut self, last: bool) -> Vec<Vec<f32>> {
        let complete = self
            .context
            .as_ref()
            .is_some_and(|c| last || c.len() >= self.prompt_tokens);
        match complete {
            true => self.context.take().unwrap_or_default(),
            false => Vec::new(),
        }
    }

    /// `finish` (or `fail`) has produced the last chunk; later tokens are ignored.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Adds one generated token, with its log-probability and alternatives when asked,
    /// and the raw logits row it was drawn from where kept.
    pub fn push(
        &mut self,
        tokenizer: &Tokenizer,
        token: u32,
        (log_prob, top): (Option<f32>, Vec<TokenLogprob>),
        logits: Option<Vec<f32>>,
        queued: Option<std::time::Duration>,
    ) -> Pushed {
        if self.done {
            return Pushed {
                chunk: None,
                stop_string: false,
            };
        }
        let mut chunk = Chunk {
            batch_index: self.batch_index,
            queue_time: queued,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            ..Chunk::default()
        };
        chunk.prompt_log_probs = self.take_prompt(false);
        let prompt_tokens = self.prompt_tokens;
        if let (Some(context), Some(row)) = (self.context.as_mut(), logits.as_ref()) {
            // The first token's row is the prompt's last position's.
            if self.output_tokens == 0 && context.len() + 1 == prompt_tokens {
                context.push(row.clone());
            }
        }
        chunk.context_logits = self.take_context(false);
        // End tokens close the sequence; they are not part of the answer.
        if !self.end_ids.contains(&token) {
            if let Some(row) = logits.filter(|_| self.generation_logits) {
                chunk.generation_logits.push(row);
            }
            self.output_tokens += 1;
            self.first_token_at
                .get_or_insert_with(std::time::Instant::now);
            chunk.token_ids.push(token);
            if self.return_log_probs {
                let lp = log_prob.unwrap_or(0.0);
                self.cum_log_prob += lp;
                chunk.log_probs.push(lp);
            }
            if self.top_log_probs {
                chunk.top_log_probs.push(top);
            }
            let text = token_text(tokenizer, &mut self.detok, token);
            self.held.push_str(&text);
        }
        let stop_string = self.release(&mut chunk.text);
        chunk.output_tokens = self.output_tokens;
        if self.return_log_probs {
            chunk.cum_log_prob = Some(self.cum_log_prob);
        }
        if self.stream {
            Pushed {
                chunk: Some(chunk),
                stop_string,
            }
        } else {
            self.accumulate(chunk);
            Pushed {
                chunk: None,
                stop_string,
            }
        }
    }

    /// Moves held text that cannot start a stop string into `out`. Returns true when a
    /// stop string is complete (the text before it is released, the rest dropped).
    fn release(&mut self, out: &mut String) -> bool {
        if let Some(pos) = self
            .stop_strings
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            out.push_str(&self.held[..pos]);
            self.held.clear();
            return true;
        }
        let keep = self
            .stop_strings
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        out.push_str(&self.held[..cut]);
        self.held.drain(..cut);
        false
    }

    fn accumulate(&mut self, c: Chunk) {
        self.pending.text.push_str(&c.text);
        self.pending.token_ids.extend(c.token_ids);
        self.pending.log_probs.extend(c.log_probs);
        self.pending.top_log_probs.extend(c.top_log_probs);
        self.pending.prompt_log_probs.extend(c.prompt_log_probs);
        self.pending.context_logits.extend(c.context_logits);
        self.pending.generation_logits.extend(c.generation_logits);
        self.pending.cum_log_prob = c.cum_log_prob;
        self.pending.queue_time = self.pending.queue_time.or(c.queue_time);
    }

    /// Holds a streamed chunk for the final one (see [`SeqOutputState::take_held`]).
    pub fn hold(&mut self, c: Chunk) {
        self.held_chunk = Some(match self.held_chunk.take() {
            Some(h) => c.after(h),
            None => c,
        });
    }

    /// The chunks held since the last one sent, as one.
    pub fn take_held(&mut self) -> Option<Chunk> {
        self.held_chunk.take()
    }

    /// The last chunk: flushes held text (unless a stop string ended it) and pending bytes.
    pub fn finish(&mut self, reason: FinishReason) -> Chunk {
        let mut chunk = if self.stream {
            Chunk {
                batch_index: self.batch_index,
                ..Chunk::default()
            }
        } else {
            std::mem::take(&mut self.pending)
        };
        if !self.done && reason != FinishReason::Error {
            let tail = self.detok.finish();
            self.held.push_str(&tail);
            let mut rest = String::new();
            self.release(&mut rest);
            rest.push_str(&self.held);
            self.held.clear();
            chunk.text.push_str(&rest);
        }
        self.done = true;
        chunk.prompt_log_probs.extend(self.take_prompt(true));
        chunk.context_logits.extend(self.take_context(true));
        if !self.stream {
            chunk.first_token_at = self.first_token_at;
        }
        chunk.batch_index = self.batch_index;
        chunk.finish_reason = Some(reason);
        chunk.prompt_tokens = self.prompt_tokens;
        chunk.cached_tokens = self.cached_tokens;
        chunk.output_tokens = self.output_tokens;
        chunk.draft_steps = self.draft_steps;
        chunk.draft_tokens = self.draft_tokens;
        chunk.accepted_draft_tokens = self.accepted_draft_tokens;
        if self.return_log_probs {
            chunk.cum_log_prob = Some(self.cum_log_prob);
        }
        chunk
    }

    /// A beam search's answer so far (`last` set on its end): one chunk whose `beams` are
    /// `beams` whole (best first, an end token left out of its tokens, though its
    /// log-probability is in `cum_log_prob`; the prompt's text first when echoed), with the
    /// prompt's scores and logits when they are complete.
    pub fn beams(
        &mut self,
        tokenizer: &Tokenizer,
        beams: Vec<Hypothesis>,
        last: Option<FinishReason>,
        queued: Option<std::time::Duration>,
        context_row: Option<Vec<f32>>,
    ) -> Chunk {
        let at_end = last.is_some();
        if let (Some(context), Some(row)) = (self.context.as_mut(), context_row) {
            // The last prompt position's row, as the first token's chunk brings it.
            if context.len() + 1 == self.prompt_tokens {
                context.push(row);
            }
        }
        self.first_token_at
            .get_or_insert_with(std::time::Instant::now);
        let echo = self.pending.text.clone();
        let beams: Vec<Chunk> = beams
            .into_iter()
            .map(|h| {
                let n = h.tokens.len() - usize::from(h.ended);
                let ids = h.tokens[..n].to_vec();
                // As `push` builds text, token by token.
                let mut detok = Detokenizer::new();
                let mut text: String = ids
                    .iter()
                    .map(|&id| token_text(tokenizer, &mut detok, id))
                    .collect();
                text.push_str(&detok.finish());
                Chunk {
                    batch_index: self.batch_index,
                    text: format!("{echo}{text}"),
                    log_probs: match self.return_log_probs {
                        true => h.log_probs[..n].to_vec(),
                        false => Vec::new(),
                    },
                    cum_log_prob: self.return_log_probs.then_some(h.cum_log_prob),
                    prompt_tokens: self.prompt_tokens,
                    output_tokens: n,
                    finish_reason: last.map(|_| match h.ended {
                        true => FinishReason::Stop,
                        false => FinishReason::Length,
                    }),
                    token_ids: ids,
                    ..Chunk::default()
                }
            })
            .collect();
        self.output_tokens = beams.first().map_or(0, |b| b.output_tokens);
        let mut chunk = Chunk {
            batch_index: self.batch_index,
            queue_time: queued.or(self.pending.queue_time.take()),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            output_tokens: self.output_tokens,
            prompt_log_probs: self.take_prompt(at_end),
            context_logits: self.take_context(at_end),
            finish_reason: last,
            beams,
            ..Chunk::default()
        };
        if at_end {
            self.done = true;
            if !self.stream {
                chunk.first_token_at = self.first_token_at;
            }
        }
        chunk
    }

    /// The last chunk of a failed sequence.
    pub fn fail(&mut self, error: String) -> Chunk {
        let mut chunk = self.finish(FinishReason::Error);
        chunk.error = Some(error);
        chunk
    }
}

/// The whole characters `token` completes through `detok` (none for a special token).
fn token_text(tokenizer: &Tokenizer, detok: &mut Detokenizer, token: u32) -> String {
    if tokenizer.is_special(token) {
        return String::new();
    }
    tokenizer
        .token_bytes(token)
        .map(|bytes| detok.push(&bytes))
        .unwrap_or_default()
}

/// Length of the longest proper suffix of `text` that is a prefix of `stop`.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffix_prefix_lengths() {
        assert_eq!(longest_suffix_prefix("hello wor", "world"), 3);
        assert_eq!(longest_suffix_prefix("hello", "xyz"), 0);
        assert_eq!(longest_suffix_prefix("abc", "c"), 0);
        assert_eq!(longest_suffix_prefix("é", "éa"), 2);
    }
}
