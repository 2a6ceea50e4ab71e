//! Sampling inside the Engine actor, for a forward pass that chooses tokens on its device
//! (the GPU): each sequence's sampling state, the plans a step's rows are chosen with,
//! and the verdicts the Scheduler gets from the device's choices. The Sampler actor does
//! the same for engines that hand their logits on; both use `SeqSampler`, so a request
//! gets the same tokens either way.
//!
//! The state is built from what the engine already sees: a sequence's sampler is made at
//! its first sampling step from the tokens fed so far (the prompt, then, for a sequence
//! recomputed after preemption, the tokens it had generated).

use std::collections::HashMap;

use super::messages::{SeqId, SeqSampled, StepSeq};
use super::sampler::{prepare_masks, push_verdict};
use crate::model::RowsOut;
use crate::sampling::{RowPlan, SeqSampler, Verdict};
use crate::scheduler::StepOutput;

/// The sampling state of every sequence an engine holds.
pub struct EngineSampling {
    eos_ids: Vec<u32>,
    vocab_size: usize,
    seqs: HashMap<SeqId, SeqState>,
}

#[derive(Default)]
struct SeqState {
    /// Tokens fed before the first sampling step.
    fed: Vec<u32>,
    sampler: Option<SeqSampler>,
}

impl EngineSampling {
    pub fn new(eos_ids: Vec<u32>, vocab_size: usize) -> Self {
        EngineSampling {
            eos_ids,
            vocab_size,
            seqs: HashMap::new(),
        }
    }

    /// Forgets a sequence (finished, cancelled, or preempted: a recomputed sequence is
    /// rebuilt from its tokens).
    pub fn drop_seq(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }

    /// Takes note of a step's known tokens and returns the plans its rows are chosen
    /// with: none when the chunk does not sample, or when its draft is verified by the
    /// standard rule (which needs the target's distributions: the engine then returns
    /// logits and [`finish`](Self::finish) verifies on the host).
    pub fn plan(&mut self, s: &StepSeq) -> Vec<RowPlan> {
        let st = self.seqs.entry(s.seq).or_default();
        if s.reset {
            *st = SeqState::default();
            // A prefix found in the cache: its tokens come before the chunk's.
            st.fed.extend_from_slice(&s.cached);
        }
        if st.sampler.is_none() {
            st.fed.extend_from_slice(s.known_tokens());
            if !s.sample {
                return Vec::new();
            }
            let fed = std::mem::take(&mut st.fed);
            let prompt_len = s.prompt_len.min(fed.len());
            let mut sampler = SeqSampler::new(&s.params, &fed[..prompt_len], &self.eos_ids);
            for &t in &fed[prompt_len..] {
                sampler.replay(t);
            }
            st.sampler = Some(sampler);
        }
        let Some(sampler) = st.sampler.as_mut().filter(|_| s.sample) else {
            return Vec::new();
        };
        match &s.draft {
            Some(d) if d.probs.is_some() && !sampler.is_greedy() => Vec::new(),
            Some(d) => sampler.plan(&d.tokens),
            None => sampler.plan(&[]),
        }
    }

    /// The plan of a chunk planned ahead ([`StepSeq::is_pending`]): its token is the one
    /// the sequence's previous step chooses, not recorded yet.
    pub fn plan_ahead(&self, s: &StepSeq) -> Result<RowPlan, String> {
        self.seqs
            .get(&s.seq)
            .and_then(|st| st.sampler.as_ref())
            .and_then(|sampler| sampler.plan_ahead())
            .ok_or_else(|| format!("seq {} cannot be planned ahead", s.seq))
    }

    /// Computes the grammar masks of every guided sequence's next token (in parallel):
    /// run between steps, while the device works or waits for the next step, so that
    /// planning the next step finds them ready.
    pub fn prepare_masks(&mut self) {
        prepare_masks(self.seqs.values_mut().filter_map(|st| st.sampler.as_mut()));
    }

    /// Each sampling chunk's tokens from its result, in the Scheduler's terms.
    pub fn finish(
        &mut self,
        seqs: &[StepSeq],
        outs: Vec<RowsOut>,
    ) -> (StepOutput, Vec<SeqSampled>) {
        let mut output = StepOutput::default();
        let mut sampled = Vec::with_capacity(seqs.len());
        for (s, out) in seqs.iter().zip(outs) {
            let Some(sampler) = self.seqs.get_mut(&s.seq).and_then(|st| st.sampler.as_mut()) else {
                continue;
            };
            if !s.sample {
                continue;
            }
            let draft = s.draft.as_ref().map_or(&[][..], |d| &d.tokens[..]);
            let verdict = match out {
                RowsOut::Chosen(choices) => sampler.verify_choices(draft, &choices),
                RowsOut::Logits(mut rows) => match &s.draft {
                    Some(d) => {
                        sampler.verify(&mut rows, self.vocab_size, draft, d.probs.as_deref())
                    }
                    None => {
                        let one = sampler.sample(&mut rows);
                        Verdict {
                            tokens: vec![one.token],
                            log_probs: vec![one.log_prob],
                            stop: one.stop,
                            accepted: 0,
                        }
                    }
                },
            };
            push_verdict(&mut output, &mut sampled, s.seq, verdict, draft.len());
        }
        (output, sampled)
    }
}
