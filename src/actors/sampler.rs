//! Sampler actor: turns each iteration's logits (`SamplerMsg::Sample`, from the Engine)
//! into one token per sequence, or, for a sequence with draft tokens, into the accepted
//! drafts and one token after them (`SeqSampler::verify`), scores the prompt tokens of
//! sequences that asked for their log-probabilities, and sends it all to the Scheduler
//! (`SchedulerMsg::StepDone`).
//!
//! State: one `SeqSampler` per live sequence (penalties, bad/stop words, min_length,
//! seeded generator), created by `Register` when a request is queued and dropped by
//! `Drop` when it ends; a beam search's step (`Fork`) copies its beams' samplers. Each sequence has its own generator, so a seed gives the same
//! tokens whatever else shares the batch. Supervised by ModelSupervisor.
//!
//! An engine that samples on its device (the GPU) keeps this state itself
//! (`engine_sampling`) and answers the Scheduler directly; this actor then only sees
//! `Register` and `Drop`.

use std::collections::HashMap;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::messages::{PromptScores, SampleRow, SamplerMsg, SchedulerMsg, SeqId, SeqSampled};
use crate::sampling::{RowChoice, SeqSampler, Verdict};
use crate::scheduler::{SampledToken, StepOutput};

pub(crate) struct Sampler;

pub struct SamplerArgs {
    pub vocab_size: usize,
    pub eos_ids: Vec<u32>,
}

pub struct SamplerState {
    vocab_size: usize,
    eos_ids: Vec<u32>,
    seqs: HashMap<SeqId, SeqSampler>,
}

impl Actor for Sampler {
    type Msg = SamplerMsg;
    type State = SamplerState;
    type Arguments = SamplerArgs;

    async fn pre_start(
        &self,
        _: ActorRef<SamplerMsg>,
        args: SamplerArgs,
    ) -> Result<SamplerState, ActorProcessingErr> {
        Ok(SamplerState {
            vocab_size: args.vocab_size,
            eos_ids: args.eos_ids,
            seqs: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<SamplerMsg>,
        msg: SamplerMsg,
        state: &mut SamplerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SamplerMsg::Register(inits) => {
                for s in inits {
                    let sampler = SeqSampler::new(&s.params, &s.prompt, &state.eos_ids);
                    state.seqs.insert(s.seq, sampler);
                }
            }
            SamplerMsg::Drop(ids) => {
                for id in ids {
                    state.seqs.remove(&id);
                }
            }
            SamplerMsg::Fork(forks) => fork(&mut state.seqs, &forks),
            SamplerMsg::Sample {
                iteration,
                rows,
                mut logits,
                pooled,
                timing,
                reply_to,
            } => {
                let (output, sampled, prompt) = sample_rows(state, &rows, &mut logits);
                reply_to.cast(SchedulerMsg::StepDone {
                    iteration,
                    output,
                    sampled,
                    pooled,
                    prompt,
                    timing,
                })?;
                // The next step's forward pass runs now: the guided sequences' next
                // masks are computed meanwhile, before its logits come back.
                prepare_masks(state.seqs.values_mut());
            }
        }
        Ok(())
    }
}

/// Each row's tokens, and the prompt tokens scored; a row whose sequence is gone
/// (cancelled meanwhile) is skipped.
fn sample_rows(
    state: &mut SamplerState,
    rows: &[SampleRow],
    logits: &mut [f32],
) -> (StepOutput, Vec<SeqSampled>, Vec<PromptScores>) {
    let v = state.vocab_size;
    let mut output = StepOutput::default();
    let mut sampled = Vec::with_capacity(rows.len());
    let mut prompt = Vec::new();
    let mut at = 0;
    for row in rows {
        let sampling = match row.sample {
            true => 1 + row.draft.as_ref().map_or(0, |d| d.tokens.len()),
            false => 0,
        };
        let n = row.score.len() + sampling;
        let Some(block) = logits.get_mut(at * v..(at + n) * v) else {
            break;
        };
        at += n;
        let Some(sampler) = state.seqs.get_mut(&row.seq) else {
            continue;
        };
        let (scored, block) = block.split_at_mut(row.score.len() * v);
        if !row.score.is_empty() {
            prompt.push(PromptScores {
                seq: row.seq,
                from: row.score_from,
                logits: kept(row.keep.scored, scored, v),
                rows: score_rows(sampler, scored, v, &row.score),
            });
        }
        if !row.sample {
            continue;
        }
        let logits = kept(row.keep.sampled, block, v);
        let verdict = match &row.draft {
            Some(d) => sampler.verify(block, v, &d.tokens, d.probs.as_deref()),
            None => one_token(sampler.sample(block)),
        };
        let drafted = row.draft.as_ref().map_or(0, |d| d.tokens.len());
        push_verdict(&mut output, &mut sampled, row.seq, verdict, drafted, logits);
    }
    (output, sampled, prompt)
}

/// Applies a beam search's step to its beams' samplers: each slot's becomes a copy of its
/// parent's as it was before, with the chosen token recorded.
fn fork(seqs: &mut HashMap<SeqId, SeqSampler>, forks: &[crate::scheduler::BeamFork]) {
    let parents: HashMap<SeqId, SeqSampler> = forks
        .iter()
        .filter_map(|f| Some((f.parent, seqs.get(&f.parent)?.clone())))
        .collect();
    for f in forks {
        if let Some(p) = parents.get(&f.parent) {
            let mut s = p.clone();
            s.replay(f.token);
            seqs.insert(f.slot, s);
        }
    }
}

/// Copies of the `vocab`-wide rows of `rows` when `keep` (raw logits the request asked
/// for, taken before sampling changes them); else none.
pub(super) fn kept(keep: bool, rows: &[f32], vocab: usize) -> Vec<Vec<f32>> {
    match keep {
        true => rows
            .chunks_exact(vocab.max(1))
            .map(<[f32]>::to_vec)
            .collect(),
        false => Vec::new(),
    }
}

/// The verdict of a sequence that sampled one token, with no draft.
pub(super) fn one_token(s: crate::sampling::Sampled) -> Verdict {
    Verdict {
        tokens: vec![s.token],
        log_probs: vec![s.log_prob],
        tops: vec![s.top],
        stop: s.stop,
        accepted: 0,
    }
}

/// A score's choice names its target even where the row allowed no token (its
/// log-probability is then -inf).
pub(super) fn named(mut c: RowChoice, target: u32) -> RowChoice {
    c.token.get_or_insert(target);
    c
}

/// Scores prompt tokens on the host: `rows` holds one row of `vocab` logits per target,
/// each the row before it (scratch).
pub(super) fn score_rows(
    sampler: &SeqSampler,
    rows: &mut [f32],
    vocab: usize,
    targets: &[u32],
) -> Vec<RowChoice> {
    targets
        .iter()
        .zip(rows.chunks_exact_mut(vocab.max(1)))
        .map(|(&t, row)| named(sampler.score_plan(t).choose(row), t))
        .collect()
}

/// Computes the next token's grammar mask of every guided sequence among `samplers`
/// that lacks one, in parallel.
pub(super) fn prepare_masks<'a>(samplers: impl Iterator<Item = &'a mut SeqSampler>) {
    use rayon::prelude::*;
    let mut guided: Vec<&mut SeqSampler> = samplers.filter(|s| s.is_guided()).collect();
    match guided.len() {
        0 => {}
        1 => {
            guided[0].prepare();
        }
        _ => guided.par_iter_mut().for_each(|s| {
            s.prepare();
        }),
    }
}

/// Adds one sequence's verdict to a step's output (the Scheduler's tokens, and what
/// Postprocess reports with them).
pub(super) fn push_verdict(
    output: &mut StepOutput,
    sampled: &mut Vec<SeqSampled>,
    seq: SeqId,
    verdict: Verdict,
    drafted: usize,
    logits: Vec<Vec<f32>>,
) {
    let mut tokens = verdict.tokens;
    let Some(token) = tokens.pop() else {
        return;
    };
    output.tokens.push(SampledToken {
        id: seq,
        accepted: tokens,
        token,
        stop: verdict.stop,
    });
    sampled.push(SeqSampled {
        log_probs: verdict.log_probs,
        tops: verdict.tops,
        drafted,
        accepted: verdict.accepted,
        logits,
    });
}
