//! Sampler actor: turns each iteration's logits (`SamplerMsg::Sample`, from the Engine)
//! into one token per sequence, or, for a sequence with draft tokens, into the accepted
//! drafts and one token after them (`SeqSampler::verify`), and sends them to the
//! Scheduler (`SchedulerMsg::StepDone`).
//!
//! State: one `SeqSampler` per live sequence (penalties, bad/stop words, min_length,
//! seeded generator), created by `Register` when a request is queued and dropped by
//! `Drop` when it ends. Each sequence has its own generator, so a seed gives the same
//! tokens whatever else shares the batch. Supervised by ModelSupervisor.
//!
//! An engine that samples on its device (the GPU) keeps this state itself
//! (`engine_sampling`) and answers the Scheduler directly; this actor then only sees
//! `Register` and `Drop`.

use std::collections::HashMap;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::messages::{SampleRow, SamplerMsg, SchedulerMsg, SeqId, SeqSampled};
use crate::sampling::{SeqSampler, Verdict};
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
            SamplerMsg::Sample {
                iteration,
                rows,
                mut logits,
                pooled,
                timing,
                reply_to,
            } => {
                let (output, sampled) = sample_rows(state, &rows, &mut logits);
                reply_to.cast(SchedulerMsg::StepDone {
                    iteration,
                    output,
                    sampled,
                    pooled,
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

/// Each row's tokens; a row whose sequence is gone (cancelled meanwhile) is skipped.
fn sample_rows(
    state: &mut SamplerState,
    rows: &[SampleRow],
    logits: &mut [f32],
) -> (StepOutput, Vec<SeqSampled>) {
    let v = state.vocab_size;
    let mut output = StepOutput::default();
    let mut sampled = Vec::with_capacity(rows.len());
    let mut at = 0;
    for row in rows {
        let n = 1 + row.draft.as_ref().map_or(0, |d| d.tokens.len());
        let Some(block) = logits.get_mut(at * v..(at + n) * v) else {
            break;
        };
        at += n;
        let Some(sampler) = state.seqs.get_mut(&row.seq) else {
            continue;
        };
        let verdict = match &row.draft {
            Some(d) => sampler.verify(block, v, &d.tokens, d.probs.as_deref()),
            None => {
                let s = sampler.sample(block);
                Verdict {
                    tokens: vec![s.token],
                    log_probs: vec![s.log_prob],
                    stop: s.stop,
                    accepted: 0,
                }
            }
        };
        let drafted = row.draft.as_ref().map_or(0, |d| d.tokens.len());
        push_verdict(&mut output, &mut sampled, row.seq, verdict, drafted);
    }
    (output, sampled)
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
        drafted,
        accepted: verdict.accepted,
    });
}
