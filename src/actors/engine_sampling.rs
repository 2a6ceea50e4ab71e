//! Sampling inside the Engine actor, for a forward pass that chooses tokens on its device
//! (the GPU): each sequence's sampling state, the plans a step's rows are chosen with,
//! and the verdicts the Scheduler gets from the device's choices. The Sampler actor does
//! the same for engines that hand their logits on; both use `SeqSampler`, so a request
//! gets the same tokens either way.
//!
//! The state is built from what the engine already sees: a sequence's sampler is made at
//! its first sampling step from the tokens fed so far (the prompt, then, for a sequence
//! recomputed after preemption or a beam forked from another, the tokens it had
//! generated). A beam that goes on records the token its search chose when its next
//! chunk, that token, comes.
//!
//! A chunk that scores its prompt's tokens (`StepSeq::score`) gets a scoring plan per
//! such row before its sampling plans, so the device returns those scores too.

use std::collections::HashMap;

use super::messages::{PromptScores, SeqId, SeqSampled, StepSeq};
use super::sampler::{kept, named, one_token, prepare_masks, push_verdict};
use crate::model::RowsOut;
use crate::sampling::{RowChoice, RowPlan, SeqSampler};
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
    /// with: a scoring plan per prompt token the chunk scores, then its sampling plans;
    /// none when the chunk neither scores nor samples, or when its draft is verified by
    /// the standard rule (which needs the target's distributions: the engine then returns
    /// logits and [`finish`](Self::finish) verifies on the host).
    pub fn plan(&mut self, s: &StepSeq) -> Vec<RowPlan> {
        let st = self.seqs.entry(s.seq).or_default();
        if s.reset {
            *st = SeqState::default();
            // A prefix found in the cache: its tokens come before the chunk's.
            st.fed.extend_from_slice(&s.cached);
        }
        let mut plans: Vec<RowPlan> = s
            .score
            .iter()
            .map(|&t| RowPlan::score(t, s.params.top_log_probs))
            .collect();
        let existed = st.sampler.is_some();
        if !existed {
            st.fed.extend_from_slice(s.known_tokens());
            if !s.sample {
                return match s.kept_rows().scored && !s.score.is_empty() {
                    true => Vec::new(),
                    false => plans,
                };
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
            return plans;
        };
        if sampler.is_beam() && existed {
            // A beam that goes on: its chunk is the token its search chose for it.
            for &t in s.known_tokens() {
                sampler.replay(t);
            }
        }
        match &s.draft {
            Some(d) if d.probs.is_some() && !sampler.is_greedy() => return Vec::new(),
            Some(d) => plans.extend(sampler.plan(&d.tokens)),
            None => plans.extend(sampler.plan(&[])),
        }
        // Rows the request wants whole come back as logits (chosen from on the host).
        let keep = s.kept_rows();
        if keep.sampled || (keep.scored && !s.score.is_empty()) {
            return Vec::new();
        }
        plans
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

    /// Each sampling chunk's tokens from its result, and each scoring chunk's prompt
    /// scores, in the Scheduler's terms.
    pub fn finish(
        &mut self,
        seqs: &[StepSeq],
        outs: Vec<RowsOut>,
    ) -> (StepOutput, Vec<SeqSampled>, Vec<PromptScores>) {
        let mut output = StepOutput::default();
        let mut sampled = Vec::with_capacity(seqs.len());
        let mut prompt = Vec::new();
        let v = self.vocab_size;
        for (s, out) in seqs.iter().zip(outs) {
            let scored = s.score.len();
            // The scoring rows first, then the sampling ones.
            let out = match out {
                RowsOut::Chosen(mut choices) => {
                    let rest = choices.split_off(scored.min(choices.len()));
                    if scored > 0 {
                        prompt.push(PromptScores {
                            seq: s.seq,
                            logits: Vec::new(),
                            from: s.start_pos + 1,
                            rows: choices
                                .into_iter()
                                .zip(&s.score)
                                .map(|(c, &t)| named(c, t))
                                .collect(),
                        });
                    }
                    RowsOut::Chosen(rest)
                }
                RowsOut::Logits(mut rows) => {
                    let rest = rows.split_off((scored * v).min(rows.len()));
                    if scored > 0 {
                        prompt.push(PromptScores {
                            seq: s.seq,
                            logits: kept(s.kept_rows().scored, &rows, v),
                            from: s.start_pos + 1,
                            rows: score_on_host(&mut rows, v, &s.score, s.params.top_log_probs),
                        });
                    }
                    RowsOut::Logits(rest)
                }
            };
            if !s.sample {
                continue;
            }
            let Some(sampler) = self.seqs.get_mut(&s.seq).and_then(|st| st.sampler.as_mut()) else {
                continue;
            };
            let draft = s.draft.as_ref().map_or(&[][..], |d| &d.tokens[..]);
            let mut logits = Vec::new();
            let verdict = match out {
                RowsOut::Chosen(choices) => sampler.verify_choices(draft, &choices),
                RowsOut::Logits(mut rows) => {
                    logits = kept(s.kept_rows().sampled, &rows, v);
                    match &s.draft {
                        Some(d) => sampler.verify(&mut rows, v, draft, d.probs.as_deref()),
                        None => one_token(sampler.sample(&mut rows)),
                    }
                }
            };
            push_verdict(
                &mut output,
                &mut sampled,
                s.seq,
                verdict,
                draft.len(),
                logits,
            );
        }
        (output, sampled, prompt)
    }
}

/// Scores prompt tokens from their logits rows on the host (a chunk the engine returned
/// logits for).
fn score_on_host(rows: &mut [f32], vocab: usize, targets: &[u32], top: usize) -> Vec<RowChoice> {
    targets
        .iter()
        .zip(rows.chunks_exact_mut(vocab.max(1)))
        .map(|(&t, row)| named(RowPlan::score(t, top).choose(row), t))
        .collect()
}
