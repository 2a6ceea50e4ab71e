//! Turning a sequence's row of logits into its next token, TensorRT-LLM style: logit
//! bias, penalties, bad words, `min_length`, greedy or temperature/min-p/top-k/top-p from
//! a per-sequence seeded generator, log-probabilities and the most likely alternatives,
//! prompt tokens' scores, end tokens and stop words. Pure logic: the Sampler actor
//! holds one `SeqSampler` per running sequence and calls `SeqSampler::sample`.
//!
//! # Layout
//! - `seq` (`SeqSampler`): the per-sequence state and the order of the steps;
//! - `penalties`: repetition, presence and frequency penalties;
//! - `words`: end tokens, `min_length`, bad words, stop words;
//! - `plan`: one row's choice as plain data ([`RowPlan`]) for a device, and its CPU twin;
//! - `select`: greedy, top-k, top-p and the draw, without sorting whole rows;
//! - `nucleus`: top-p over a whole row through a histogram;
//! - `math`: vectorised row kernels (cleaning, fast `exp`, sums);
//! - `speculative`: draft proposals and their verification against the target;
//! - `beam`: beam search's choices for one prompt ([`BeamSearch`]).

mod beam;
mod mask;
mod math;
mod nucleus;
mod penalties;
mod plan;
mod select;
mod seq;
mod speculative;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_surface;
mod words;

pub use beam::{BeamSearch, BeamSettings, Hypothesis, Move, Selection};
pub use mask::TokenMask;
pub use plan::{
    choice_seed, log_softmax, Edit, RowChoice, RowPlan, EDIT_BAN, EDIT_COUNT, EDIT_REPEAT,
    MAX_TOP_LOG_PROBS,
};
#[cfg(feature = "cuda")]
pub(crate) use plan::{pack, PLAN_WORDS, TOP_WORDS};
pub(crate) use seq::{Sampled, SeqSampler};
pub(crate) use speculative::{DraftSampler, Verdict};
pub(crate) use words::end_ids;

/// The index of the largest logit (the first one on ties); NaN counts as -inf, and a row
/// with nothing above -inf (or empty) gives 0.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_val = f32::NEG_INFINITY;
    for (i, &x) in logits.iter().enumerate() {
        if x > best_val {
            best = i;
            best_val = x;
        }
    }
    best as u32
}
