//! One sequence's scheduling state: its known tokens (prompt + generated), how many
//! of them the engine has computed, the KV blocks it owns and its length limit.

use super::policy::kv_tokens_needed;

/// A request as the scheduler sees it: token ids in, a cap on tokens out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSpec {
    /// The sequence's id, unique among waiting and running ones.
    pub id: u64,
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate (`max_seq_len` may stop it sooner). 0: none, the sequence
    /// ends once its prompt is computed (an embedding: the engine pools its hidden
    /// states).
    pub max_new_tokens: usize,
    /// Draft tokens the target may verify per decode step (0: no speculation).
    pub num_draft_tokens: usize,
    /// Mixed into its blocks' prefix-cache hashes: only sequences with the same salt share
    /// cached blocks (0: the common pool).
    pub cache_salt: u64,
    /// Lower runs first (vLLM's meaning); first come, first served within a level. Under
    /// `max_utilization` a waiting sequence may preempt running ones of a higher value.
    pub priority: i32,
    /// Beam search: the first beam of a search of this many (1: none). It is queued alone;
    /// the others are forked from it ([`Scheduler::fork_beams`](super::Scheduler::fork_beams)),
    /// and it is admitted only with room for all of them.
    pub beam_width: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Sequence {
    pub(crate) id: u64,
    /// [`SeqSpec::priority`].
    pub(crate) priority: i32,
    /// Known tokens: the prompt followed by every generated token.
    pub(crate) tokens: Vec<u32>,
    pub(crate) prompt_len: usize,
    /// The sequence finishes with `Length` once it knows this many tokens
    /// (prompt + max_new_tokens, capped by max_seq_len).
    pub(crate) max_len: usize,
    /// Known tokens whose KV the engine has written. Reset to 0 by preemption.
    pub(crate) num_computed: usize,
    /// KV blocks covering the computed (and in-flight) tokens; empty while waiting.
    pub(crate) blocks: Vec<u32>,
    /// Known tokens at (re)admission: chunks below this are context (prefill),
    /// the rest generation.
    pub(crate) admitted_len: usize,
    /// Iteration of the batch computing this sequence now, until its update.
    pub(crate) in_flight: Option<u64>,
    /// Known tokens once the in-flight chunk is computed (its end): it samples the next
    /// token when this is every known token.
    pub(crate) flight_end: usize,
    /// Iteration of a batch planned ahead (`schedule_ahead`) that computes the token the
    /// in-flight chunk samples; it becomes `in_flight` when that chunk is applied.
    pub(crate) ahead: Option<u64>,
    /// Most draft tokens a decode step of this sequence verifies.
    pub(crate) num_draft: usize,
    pub(crate) cache_salt: u64,
    /// Prefix-cache hash of each full block of known tokens so far (chained over every
    /// token before it and the salt).
    pub(crate) hashes: Vec<u64>,
    /// Leading blocks of `blocks` registered in the prefix cache (or found there).
    pub(crate) registered: usize,
    /// Beams of its search (1: not a beam); a beam is never preempted.
    pub(crate) beam_width: usize,
    /// Its search's first beam (its own id for any other sequence).
    pub(crate) group: u64,
    /// A beam forked from another since its last chunk: its next chunk resets the
    /// engines' state of it (`ScheduledSeq::cached` carries the tokens before it).
    pub(crate) forked: bool,
    /// Computed with LongRoPE's long factors (from its first token on); for good once set.
    pub(crate) long_rope: bool,
}

impl Sequence {
    pub(crate) fn new(spec: SeqSpec, max_seq_len: usize) -> Self {
        let prompt_len = spec.prompt.len();
        Sequence {
            id: spec.id,
            priority: spec.priority,
            tokens: spec.prompt,
            prompt_len,
            max_len: (prompt_len + spec.max_new_tokens).min(max_seq_len),
            num_computed: 0,
            blocks: Vec::new(),
            admitted_len: 0,
            in_flight: None,
            flight_end: 0,
            ahead: None,
            num_draft: spec.num_draft_tokens,
            cache_salt: spec.cache_salt,
            hashes: Vec::new(),
            registered: 0,
            beam_width: spec.beam_width.max(1),
            group: spec.id,
            forked: false,
            long_rope: false,
        }
    }

    /// Whether computing its known tokens up to `end` (and any drafts before it) takes
    /// the long RoPE factors it was not computed with: past the original context `from`.
    pub(crate) fn crosses_long_rope(&self, from: Option<usize>, end: usize) -> bool {
        from.is_some_and(|from| !self.long_rope && end > from)
    }

    /// Computed with the long RoPE factors from now on: its blocks hash apart from the
    /// same tokens' short-factor blocks (both stay in the prefix cache).
    pub(crate) fn take_long_rope(&mut self) {
        self.long_rope = true;
        self.cache_salt = block_hash(self.cache_salt, &[u32::MAX]);
        self.hashes.clear();
    }

    /// Whether it carries one beam of a beam search.
    pub(crate) fn is_beam(&self) -> bool {
        self.beam_width > 1
    }

    /// The hashes of its full blocks of known tokens (`block_size` tokens each), computed
    /// as far as they go.
    pub(crate) fn block_hashes(&mut self, block_size: usize) -> &[u64] {
        let full = self.tokens.len() / block_size;
        while self.hashes.len() < full {
            let j = self.hashes.len();
            let parent = self.hashes.last().copied().unwrap_or(self.cache_salt);
            let block = &self.tokens[j * block_size..(j + 1) * block_size];
            self.hashes.push(block_hash(parent, block));
        }
        &self.hashes
    }

    pub(crate) fn num_known(&self) -> usize {
        self.tokens.len()
    }

    /// Known tokens not yet computed: what the invariant makes the scheduler catch up.
    pub(crate) fn num_uncomputed(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// The most tokens this sequence will ever keep in the KV cache.
    pub(crate) fn max_kv_tokens(&self) -> usize {
        kv_tokens_needed(
            self.prompt_len,
            self.max_len - self.prompt_len,
            self.max_len,
        )
    }

    /// Draft tokens a decode step may verify now: its setting, capped so that every
    /// accepted token and the one sampled after them fit under `max_len`.
    pub(crate) fn draft_room(&self) -> usize {
        self.num_draft
            .min(self.max_len.saturating_sub(self.tokens.len() + 1))
    }

    /// Whether it has generated all it may.
    pub(crate) fn at_length_limit(&self) -> bool {
        self.tokens.len() >= self.max_len
    }
}

/// The prefix-cache hash of a block of `tokens` after the blocks whose chain ends in
/// `parent` (SipHash with fixed keys: the same in every run).
fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_limits() {
        let spec = SeqSpec {
            id: 3,
            prompt: vec![5, 6, 7],
            max_new_tokens: 10,
            num_draft_tokens: 4,
            cache_salt: 0,
            priority: 0,
            beam_width: 1,
        };
        let mut s = Sequence::new(spec.clone(), 8);
        assert_eq!(s.max_len, 8, "capped by max_seq_len");
        assert_eq!(s.max_kv_tokens(), 7);
        assert_eq!(s.num_uncomputed(), 3);
        s.num_computed = 3;
        s.tokens.push(9);
        assert_eq!((s.num_known(), s.num_uncomputed()), (4, 1));
        assert!(!s.at_length_limit());
        assert_eq!(
            s.draft_room(),
            3,
            "4 known of 8: 3 drafts and 1 sampled token"
        );
        let s = Sequence::new(spec, 100);
        assert_eq!((s.max_len, s.max_kv_tokens()), (13, 12));
    }

    #[test]
    fn block_hashes_chain_over_the_prefix_and_the_salt() {
        let seq = |prompt: Vec<u32>, cache_salt| {
            Sequence::new(
                SeqSpec {
                    id: 1,
                    prompt,
                    max_new_tokens: 4,
                    num_draft_tokens: 0,
                    cache_salt,
                    priority: 0,
                    beam_width: 1,
                },
                100,
            )
        };
        let mut a = seq(vec![1, 2, 3, 4, 5, 6, 7], 0);
        let mut b = seq(vec![1, 2, 3, 4, 5, 6, 9, 9], 0);
        let mut c = seq(vec![9, 2, 3, 4, 5, 6], 0);
        let mut d = seq(vec![1, 2, 3, 4, 5, 6], 7);
        let ha = a.block_hashes(3).to_vec();
        assert_eq!(ha.len(), 2, "only full blocks");
        assert_eq!(b.block_hashes(3)[..2], ha[..]);
        // The same second block after another first one hashes apart, as after a salt.
        assert_ne!(c.block_hashes(3)[1], ha[1]);
        assert_ne!(d.block_hashes(3)[0], ha[0]);
        a.tokens.extend([8, 9]);
        assert_eq!(a.block_hashes(3).len(), 3, "extended as tokens come");
    }
}
