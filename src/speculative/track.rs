//! [`SeqTrack`]: what the speculative orchestrator knows of one sequence. It sees only
//! the steps it forwards: each chunk's known tokens and block deltas, and the drafts it
//! proposed. Which drafts the target accepted shows in the next chunk's start: the
//! target computed the last known token plus the accepted drafts, so the next chunk
//! starts that many positions later.
//!
//! It also sets how many tokens to draft next ([`SeqTrack::draft_len`]): every draft
//! token costs the target compute whether or not it is kept, so the length follows the
//! sequence's recent luck: after a step that kept all its drafts it doubles (up to what
//! the scheduler allows), after one that did not it becomes the number kept plus one.

use crate::scheduler::StepSeq;

#[derive(Debug, Clone, Default)]
pub struct SeqTrack {
    /// Known tokens (prompt and output) up to the end of the last chunk, plus accepted
    /// drafts once the next chunk shows them.
    pub tokens: Vec<u32>,
    /// The sequence's whole block table.
    pub table: Vec<u32>,
    /// Draft tokens proposed in the last step, at positions `tokens.len()..`.
    pub drafts: Vec<u32>,
    /// Positions whose K/V the draft model holds: for these tokens, then for the drafts
    /// it wrote (valid only as far as they are accepted).
    pub draft_kv: usize,
    /// Drafts to propose next; None until the first verification.
    budget: Option<usize>,
}

impl SeqTrack {
    /// Takes in the sequence's next chunk. False when the chunk does not follow from
    /// what was seen (then the track starts over at the next reset and the sequence is
    /// not drafted for meanwhile).
    pub fn advance(&mut self, step: &StepSeq) -> bool {
        if step.reset {
            // A prefix found in the cache is known, and its KV the target's.
            *self = SeqTrack {
                tokens: step.cached.clone(),
                ..SeqTrack::default()
            };
        }
        self.table.extend_from_slice(&step.new_blocks);
        let start = step.start_pos;
        let known = self.tokens.len();
        if start < known || start > known + self.drafts.len() {
            self.drafts.clear();
            return false;
        }
        let (kept, proposed) = (start - known, self.drafts.len());
        if proposed > 0 {
            self.budget = Some(if kept == proposed {
                2 * proposed
            } else {
                kept + 1
            });
        }
        self.tokens.extend_from_slice(&self.drafts[..kept]);
        self.drafts.clear();
        self.draft_kv = self.draft_kv.min(start);
        self.tokens.extend_from_slice(&step.tokens);
        true
    }

    /// How many tokens to draft now, when the scheduler leaves room for `room`.
    pub fn draft_len(&self, room: usize) -> usize {
        self.budget.map_or(room, |b| b.min(room))
    }

    /// Tokens the draft model has not seen yet, from `draft_kv`.
    pub fn draft_catch_up(&self) -> &[u32] {
        &self.tokens[self.draft_kv.min(self.tokens.len())..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::GenerationParams;
    use std::sync::Arc;

    fn step(start_pos: usize, tokens: &[u32], reset: bool, new_blocks: &[u32]) -> StepSeq {
        StepSeq {
            seq: 1,
            prompt_len: 0,
            start_pos,
            tokens: tokens.to_vec(),
            reset,
            new_table: reset,
            new_blocks: new_blocks.to_vec(),
            sample: true,
            params: Arc::new(GenerationParams::default()),
            max_draft: 3,
            draft: None,
            cached: Vec::new(),
            score: Vec::new(),
            long_rope: false,
        }
    }

    #[test]
    fn accepted_drafts_show_in_the_next_start() {
        let mut t = SeqTrack::default();
        assert!(t.advance(&step(0, &[1, 2, 3], true, &[7])));
        assert_eq!(t.tokens, [1, 2, 3]);
        // Proposed 10 11 12; the draft model wrote K/V up to the last draft but one.
        t.drafts = vec![10, 11, 12];
        t.draft_kv = 5;
        // One accepted: the target computed 3 + 1 positions; the sampled token is 13.
        assert!(t.advance(&step(4, &[13], false, &[8])));
        assert_eq!(t.tokens, [1, 2, 3, 10, 13]);
        assert_eq!(t.table, [7, 8]);
        assert_eq!(t.draft_kv, 4, "the rejected draft's K/V is not counted");
        assert_eq!(t.draft_catch_up(), [13]);
        assert_eq!(t.draft_len(8), 2, "one of three kept: draft two next");
        t.drafts = vec![14, 15];
        assert!(t.advance(&step(7, &[16], false, &[])), "both kept");
        assert_eq!(
            (t.draft_len(8), t.draft_len(3)),
            (4, 3),
            "doubles, within the room"
        );
    }

    #[test]
    fn rejected_drafts_roll_back_and_resets_start_over() {
        let mut t = SeqTrack::default();
        t.advance(&step(0, &[1, 2], true, &[4]));
        t.drafts = vec![5, 6];
        t.draft_kv = 3;
        assert!(t.advance(&step(2, &[9], false, &[])), "none accepted");
        assert_eq!(t.tokens, [1, 2, 9]);
        assert_eq!(t.draft_kv, 2);
        // A chunk past what the drafts explain is inconsistent.
        assert!(!t.advance(&step(7, &[3], false, &[])));
        assert_eq!(t.draft_len(5), 1, "none kept: one draft next");
        // Preempted and recomputed: everything from scratch.
        assert!(t.advance(&step(0, &[1, 2, 9, 3], true, &[6])));
        assert_eq!(
            (t.tokens.len(), t.table.clone(), t.draft_kv),
            (4, vec![6], 0)
        );
        assert_eq!(t.draft_len(5), 5, "a reset forgets the history");
    }
}
