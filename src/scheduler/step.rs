//! One engine iteration's work for one sequence, as the scheduler sends it: a delta (new
//! tokens and the blocks appended since the last step), and the draft tokens a draft
//! source may append to it.

use std::sync::Arc;

use super::PENDING_TOKEN;
use crate::request::GenerationParams;

/// The scheduler's id of one prompt's sequence.
pub type SeqId = u64;

/// New tokens of one sequence for one engine iteration (a delta: blocks appended since
/// the last step; `reset` replaces the engine's table, for a new or recomputed sequence).
#[derive(Debug, Clone)]
pub struct StepSeq {
    pub seq: SeqId,
    /// Its prompt's length (the tokens before it are prompt, those after generated).
    pub prompt_len: usize,
    pub start_pos: usize,
    /// Known tokens to compute, followed by the draft's tokens when there is a draft.
    pub tokens: Vec<u32>,
    pub reset: bool,
    /// The block table is replaced by `new_blocks` (set with `reset`, and for the first
    /// chunk after the sequence's blocks were swapped back in, whose other state stays).
    pub new_table: bool,
    pub new_blocks: Vec<u32>,
    /// The chunk reaches the last known token: the engine returns logits for it (and
    /// for every draft token after it).
    pub sample: bool,
    pub params: Arc<GenerationParams>,
    /// How many draft tokens may follow the known ones (the blocks cover them); 0 when
    /// the sequence does not speculate this iteration.
    pub max_draft: usize,
    /// Draft tokens appended to `tokens` by the speculative orchestrator.
    pub draft: Option<Draft>,
    /// With `reset` after a prefix-cache hit: the known tokens before `start_pos`, whose
    /// KV the shared blocks hold (state kept per sequence starts from them); else empty.
    pub cached: Vec<u32>,
    /// Prompt tokens this chunk scores (`prompt_log_probs`): the token after each of its
    /// first `score.len()` rows, whose logits rows come before the sampling ones
    /// ([`prompt_targets`]); empty otherwise.
    pub score: Vec<u32>,
    /// Computed with LongRoPE's long factors ([`ScheduledSeq::long_rope`](super::ScheduledSeq::long_rope)).
    pub long_rope: bool,
}

/// Which of a chunk's logits rows go back to the host whole (`return_context_logits`,
/// `return_generation_logits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeptRows {
    /// The rows that score prompt tokens.
    pub scored: bool,
    /// The row its token is drawn from.
    pub sampled: bool,
}

impl StepSeq {
    /// The chunk is the one token its previous iteration samples ([`PENDING_TOKEN`]),
    /// planned before that token is known.
    pub fn is_pending(&self) -> bool {
        self.tokens == [PENDING_TOKEN]
    }

    /// The chunk's known tokens (without the draft's).
    pub fn known_tokens(&self) -> &[u32] {
        let draft = self.draft.as_ref().map_or(0, |d| d.tokens.len());
        &self.tokens[..self.tokens.len().saturating_sub(draft)]
    }

    /// Which of this chunk's logits rows go back to the host whole: with
    /// `return_context_logits` its scoring rows and, on the chunk that ends the prompt, the
    /// sampling row (the last prompt position's); with `return_generation_logits` every
    /// sampling row.
    pub fn kept_rows(&self) -> KeptRows {
        let p = &self.params;
        let ends_prompt = self.start_pos + self.known_tokens().len() == self.prompt_len;
        KeptRows {
            scored: p.return_context_logits,
            sampled: self.sample
                && (p.return_generation_logits || (p.return_context_logits && ends_prompt)),
        }
    }

    /// Rows of logits the engine returns for this chunk: those that score prompt tokens,
    /// then the sampling ones.
    pub fn logit_rows(&self) -> usize {
        self.score.len() + self.sample_rows()
    }

    /// Rows that sample: the last known token's and one per draft token (none when the
    /// chunk does not sample).
    pub fn sample_rows(&self) -> usize {
        if self.sample {
            1 + self.draft.as_ref().map_or(0, |d| d.tokens.len())
        } else {
            0
        }
    }
}

/// The prompt tokens a chunk of `tokens` at `start` scores (each row's next token, while
/// that is a prompt token), given the known token after the chunk (`next`) and the
/// prompt's length. Only a chunk inside the prompt scores (a recomputed chunk that runs
/// past it scored its prompt the first time): then its rows are all its known rows but
/// the one that samples after the prompt, so with the sampling rows they are the chunk's
/// last rows, as the engines return them.
pub fn prompt_targets(
    tokens: &[u32],
    start: usize,
    next: Option<u32>,
    prompt_len: usize,
) -> Vec<u32> {
    let end = start + tokens.len();
    if tokens.is_empty() || end > prompt_len {
        return Vec::new();
    }
    let mut targets = tokens[1..].to_vec();
    if end < prompt_len {
        // The chunk stops inside the prompt: its last row scores the next chunk's first
        // token.
        match next {
            Some(t) => targets.push(t),
            None => return Vec::new(),
        }
    }
    targets
}

/// Tokens a draft source proposes after a sequence's last known token.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// The draft model's sampling distribution at each draft token, `[tokens, vocab]`,
    /// when the acceptance rule uses it (`use_draft_logits`); None means each token is
    /// taken as certain (prompt lookup, greedy drafts).
    pub probs: Option<Vec<f32>>,
}

#[cfg(test)]
mod tests {
    use super::prompt_targets;

    #[test]
    fn a_chunk_scores_the_prompt_tokens_after_its_rows() {
        // A 6-token prompt [10..16) in chunks of 4 and 2: the first chunk's last row scores
        // the second chunk's first token; the last chunk leaves its last row to sample.
        assert_eq!(
            prompt_targets(&[10, 11, 12, 13], 0, Some(14), 6),
            [11, 12, 13, 14]
        );
        assert_eq!(prompt_targets(&[14, 15], 4, None, 6), [15]);
        assert_eq!(
            prompt_targets(&[10, 11, 12, 13, 14, 15], 0, None, 6),
            [11, 12, 13, 14, 15]
        );
        // A one-token prompt scores nothing; nor does a recomputed chunk past the prompt.
        assert!(prompt_targets(&[10], 0, None, 1).is_empty());
        assert!(prompt_targets(&[10, 11, 12, 13, 14, 15, 40], 0, None, 6).is_empty());
    }
}
