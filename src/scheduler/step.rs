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

    /// Rows of logits the engine returns for this chunk.
    pub fn logit_rows(&self) -> usize {
        if self.sample {
            1 + self.draft.as_ref().map_or(0, |d| d.tokens.len())
        } else {
            0
        }
    }
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
