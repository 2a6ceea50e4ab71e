//! Speculative decoding's pure parts, used by the orchestrator actor
//! (`actors::speculative`): where drafts come from ([`DraftSource`], prompt lookup) and
//! what the orchestrator knows of each sequence (`SeqTrack`), rebuilt from the steps
//! it forwards. Verification is the sampler's (`sampling::speculative`).

pub(crate) mod prompt_lookup;
mod track;

use std::sync::Arc;

pub(crate) use track::SeqTrack;

use crate::model::Backend;

/// Most draft tokens a request may ask the target to verify per step.
pub(crate) const MAX_DRAFT_TOKENS: usize = 32;

/// Where draft tokens come from.
#[derive(Clone)]
pub enum DraftSource {
    /// A smaller model with the target's vocabulary, run by its own engine.
    Model {
        /// Starts the draft model's engines.
        backend: Arc<dyn Backend>,
        /// The draft model's vocabulary size; must equal the target's.
        vocab_size: usize,
    },
    /// N-gram lookup in the sequence's own tokens: the latest earlier occurrence of its
    /// last n tokens, n from `max_ngram` down to `min_ngram`, and what followed it.
    PromptLookup {
        /// Shortest n-gram tried; 0 proposes nothing.
        min_ngram: usize,
        /// Longest n-gram tried (first).
        max_ngram: usize,
    },
}

impl std::fmt::Debug for DraftSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftSource::Model { vocab_size, .. } => {
                write!(f, "DraftSource::Model {{ vocab_size: {vocab_size} }}")
            }
            DraftSource::PromptLookup {
                min_ngram,
                max_ngram,
            } => write!(
                f,
                "DraftSource::PromptLookup {{ {min_ngram}..={max_ngram} }}"
            ),
        }
    }
}

/// Speculative decoding for one model.
#[derive(Debug, Clone)]
pub struct SpeculativeOptions {
    /// Where draft tokens come from.
    pub draft: DraftSource,
    /// Draft tokens per step for requests that do not set `num_draft_tokens`.
    pub num_draft_tokens: usize,
}
