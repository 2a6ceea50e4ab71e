//! Beam search in the scheduler: the sequences that carry one search's beams, forked from
//! one another as the search chooses (sharing their KV blocks copy-on-write), and the
//! blocks a search keeps in reserve.
//!
//! A search's first beam is queued alone (`SeqSpec::beam_width`) and admitted only when
//! blocks for every beam's whole life are free (`width x` a sequence's, under either
//! policy), and a beam is never preempted: a search runs to its end once admitted. When
//! the search has chosen, [`Scheduler::fork_beams`] makes each slot's sequence a copy of
//! its parent's plus the chosen token: the parent's blocks are shared (one more reference
//! each). The block the next token is written into is shared only when it is partly
//! filled: the slot that continues its own beam (or else the parent's first child) keeps
//! it, and every other child gives it up and computes its tokens again into a block of its
//! own (at most `block_size - 1` tokens and the new one): the copy of copy-on-write, done
//! by the forward pass. No block that another beam reads is ever written.

use std::collections::{HashMap, HashSet};

use super::policy::SchedulerPolicy;
use super::sequence::Sequence;
use super::Scheduler;

/// One slot of a search after its step: sequence `slot` becomes a copy of sequence
/// `parent` (as it was before this fork) followed by `token`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeamFork {
    /// The sequence that changes.
    pub slot: u64,
    /// The sequence it copies.
    pub parent: u64,
    /// The token after the copy.
    pub token: u32,
}

impl Scheduler {
    /// Applies one search's step: each fork's slot becomes its parent's copy plus its
    /// token (a slot not running yet is created: a search's later beams), sharing the
    /// parent's blocks; the slots' old blocks are freed. Every parent must be a running
    /// beam whose tokens are all computed and not in flight. Nothing changes on an error.
    pub fn fork_beams(&mut self, forks: &[BeamFork]) -> Result<(), String> {
        let bs = self.config.block_size;
        let mut parents: HashMap<u64, Sequence> = HashMap::new();
        for f in forks {
            if parents.contains_key(&f.parent) {
                continue;
            }
            let p = self
                .running
                .iter()
                .find(|s| s.id == f.parent)
                .ok_or_else(|| format!("beam {} is not running", f.parent))?;
            if !p.is_beam() || p.in_flight.is_some() || p.num_uncomputed() > 0 {
                return Err(format!("beam {} cannot be forked now", f.parent));
            }
            parents.insert(f.parent, p.clone());
        }
        // The child that keeps each parent's partly filled block: the slot that continues
        // its own beam, else the first.
        let mut keeper: HashMap<u64, u64> = HashMap::new();
        for f in forks {
            let k = keeper.entry(f.parent).or_insert(f.slot);
            if f.slot == f.parent {
                *k = f.slot;
            }
        }
        let mut children = Vec::with_capacity(forks.len());
        for f in forks {
            let mut s = parents[&f.parent].clone();
            self.blocks.fork(&s.blocks);
            s.id = f.slot;
            s.tokens.push(f.token);
            s.forked = f.slot != f.parent;
            let partial = !s.num_computed.is_multiple_of(bs);
            if partial && keeper[&f.parent] != f.slot {
                let keep = s.num_computed / bs;
                let given_up = s.blocks.split_off(keep);
                self.blocks.free(&given_up);
                s.num_computed = keep * bs;
                s.registered = s.registered.min(keep);
            }
            children.push(s);
        }
        for s in children {
            match self.running.iter().position(|r| r.id == s.id) {
                Some(i) => {
                    let old = std::mem::replace(&mut self.running[i], s);
                    self.blocks.free(&old.blocks);
                }
                None => {
                    self.live.insert(s.id);
                    self.running.push(s);
                }
            }
        }
        Ok(())
    }

    /// Blocks running sequences may still claim: under `guaranteed_no_evict` each
    /// sequence's whole life less what it holds; under either policy each search's
    /// `width x` a beam's whole life less the distinct blocks its beams hold.
    pub(super) fn reserved_blocks(&self) -> usize {
        let mut total = 0;
        let mut searches: HashMap<u64, (usize, HashSet<u32>)> = HashMap::new();
        for s in &self.running {
            if s.is_beam() {
                let whole = s.beam_width * self.blocks.blocks_for(s.max_kv_tokens());
                let e = searches.entry(s.group).or_insert((whole, HashSet::new()));
                e.1.extend(&s.blocks);
            } else {
                total += self.reserve_of(s.max_kv_tokens(), s.blocks.len());
            }
        }
        total
            + searches
                .values()
                .map(|(whole, held)| whole.saturating_sub(held.len()))
                .sum::<usize>()
    }

    /// Blocks a waiting sequence's whole life may claim, for admission: a search's first
    /// beam claims for all its beams, under either policy.
    pub(super) fn whole_reserve(&self, seq: &Sequence) -> usize {
        match seq.is_beam() {
            true => seq.beam_width * self.blocks.blocks_for(seq.max_kv_tokens()),
            false => self.reserve_of(seq.max_kv_tokens(), 0),
        }
    }

    /// Whether admission checks `seq` against the reserve (it may never run out of blocks).
    pub(super) fn reserves(&self, seq: &Sequence) -> bool {
        seq.is_beam() || self.config.policy == SchedulerPolicy::GuaranteedNoEvict
    }
}
