//! Sampler actor: turns each iteration's logits (`SamplerMsg::Sample`, from the Engine)
//! into one token per sequence and sends them to the Scheduler (`SchedulerMsg::StepDone`).
//!
//! State: one `SeqSampler` per live sequence (penalties, bad/stop words, min_length,
//! seeded generator), created by `Register` when a request is queued and dropped by
//! `Drop` when it ends. Each sequence has its own generator, so a seed gives the same
//! tokens whatever else shares the batch. Supervised by ModelSupervisor.

use std::collections::HashMap;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::messages::{SamplerMsg, SchedulerMsg, SeqId};
use crate::sampling::SeqSampler;
use crate::scheduler::{SampledToken, StepOutput};

pub struct Sampler;

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
                seqs,
                mut logits,
                reply_to,
            } => {
                let (output, log_probs) = sample_rows(state, &seqs, &mut logits);
                reply_to.cast(SchedulerMsg::StepDone {
                    iteration,
                    output,
                    log_probs,
                })?;
            }
        }
        Ok(())
    }
}

/// One token per row; a row whose sequence is gone (cancelled meanwhile) is skipped.
fn sample_rows(
    state: &mut SamplerState,
    seqs: &[SeqId],
    logits: &mut [f32],
) -> (StepOutput, Vec<Option<f32>>) {
    let v = state.vocab_size;
    let mut output = StepOutput::default();
    let mut log_probs = Vec::with_capacity(seqs.len());
    for (id, row) in seqs.iter().zip(logits.chunks_exact_mut(v)) {
        let Some(sampler) = state.seqs.get_mut(id) else {
            continue;
        };
        let s = sampler.sample(row);
        output.tokens.push(SampledToken {
            id: *id,
            token: s.token,
            stop: s.stop,
        });
        log_probs.push(s.log_prob);
    }
    (output, log_probs)
}
