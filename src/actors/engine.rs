//! Engine actor: runs one forward pass per message on its device through a
//! [`ForwardPass`] (the CPU engine, or a GPU one) and hands the logits on.
//!
//! - `EngineMsg::Step` (from the Scheduler, or the speculative orchestrator in front of
//!   it): the rows of the sequences that sample (the last known token's, then one per
//!   draft token) go to the Sampler (`SamplerMsg::Sample`); or, when the forward pass
//!   samples on its device (the GPU), the engine plans each row from its own sampling
//!   state (`engine_sampling`), gets token ids back, and answers the Scheduler
//!   (`SchedulerMsg::StepDone`) itself.
//! - `EngineMsg::Forward` (from the speculative orchestrator driving a draft model): the
//!   logits come back on the reply port.
//!
//! State: the forward pass (model and KV cache) and each sequence's block table, kept up
//! to date from the deltas in each step. The forward pass runs on the blocking pool so
//! the async runtime keeps serving. A failed or panicking step kills the actor; its
//! supervisor (ModelSupervisor) restarts it with a fresh cache.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::engine_sampling::EngineSampling;
use super::messages::{EngineMsg, SampleRow, SamplerMsg, SchedulerMsg, SeqId, StepSeq, StepTiming};
use crate::model::{Backend, ForwardPass, RowsOut, SeqChunk};
use crate::sampling::RowPlan;

pub struct Engine;

pub struct EngineArgs {
    pub backend: Arc<dyn Backend>,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Where `Step` logits go (None for a draft engine, which only answers `Forward`).
    pub sampler: Option<ActorRef<SamplerMsg>>,
    /// The model's end tokens and vocabulary, for sampling in the engine.
    pub eos_ids: Vec<u32>,
    pub vocab_size: usize,
}

pub struct EngineState {
    forward: Option<Box<dyn ForwardPass>>,
    tables: HashMap<SeqId, Vec<u32>>,
    sampler: Option<ActorRef<SamplerMsg>>,
    /// Set when the forward pass samples: the sequences' sampling state.
    sampling: Option<EngineSampling>,
    /// When the last `Step` finished (its results handed on).
    last_end: Option<Instant>,
    fault: bool,
}

impl Actor for Engine {
    type Msg = EngineMsg;
    type State = EngineState;
    type Arguments = EngineArgs;

    async fn pre_start(
        &self,
        _: ActorRef<EngineMsg>,
        args: EngineArgs,
    ) -> Result<EngineState, ActorProcessingErr> {
        let forward = args.backend.start(args.block_size, args.num_blocks)?;
        let sampling = (forward.samples() && args.sampler.is_some())
            .then(|| EngineSampling::new(args.eos_ids, args.vocab_size));
        Ok(EngineState {
            forward: Some(forward),
            tables: HashMap::new(),
            sampler: args.sampler,
            sampling,
            last_end: None,
            fault: false,
        })
    }

    async fn handle(
        &self,
        _: ActorRef<EngineMsg>,
        msg: EngineMsg,
        state: &mut EngineState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            EngineMsg::InjectFault => state.fault = true,
            EngineMsg::Step {
                iteration,
                seqs,
                dropped,
                follows,
                reply_to,
            } => {
                let started = Instant::now();
                let wait = state
                    .last_end
                    .filter(|_| follows)
                    .map(|end| started.duration_since(end));
                state.drop_seqs(dropped);
                if state.fault {
                    panic!("injected engine fault at iteration {iteration}");
                }
                let sampler = state.sampler.clone().ok_or("a draft engine got a Step")?;
                if let Some(sampling) = state.sampling.as_mut() {
                    let plans: Vec<Vec<RowPlan>> = seqs.iter().map(|s| sampling.plan(s)).collect();
                    let (seqs, out) = state.step(seqs, Some(plans)).await?;
                    let sampling = state.sampling.as_mut().ok_or("engine lost its sampling")?;
                    let (output, sampled) = sampling.finish(&seqs, out);
                    let timing = state.finish_timing(started, wait);
                    reply_to.cast(SchedulerMsg::StepDone {
                        iteration,
                        output,
                        sampled,
                        timing,
                    })?;
                    return Ok(());
                }
                let (seqs, out) = state.step(seqs, None).await?;
                let timing = state.finish_timing(started, wait);
                let mut rows = Vec::new();
                let mut logits = Vec::new();
                for (s, l) in seqs.into_iter().zip(out) {
                    if s.logit_rows() > 0 {
                        rows.push(SampleRow {
                            seq: s.seq,
                            draft: s.draft,
                        });
                        logits.extend_from_slice(&into_logits(l));
                    }
                }
                sampler.cast(SamplerMsg::Sample {
                    iteration,
                    rows,
                    logits,
                    timing,
                    reply_to,
                })?;
            }
            EngineMsg::Forward {
                seqs,
                dropped,
                reply,
            } => {
                state.drop_seqs(dropped);
                let (_, out) = state.step(seqs, None).await?;
                let _ = reply.send(out.into_iter().map(into_logits).collect());
            }
        }
        Ok(())
    }
}

impl EngineState {
    /// The timing of a step that started at `started`, which now ends.
    fn finish_timing(&mut self, started: Instant, wait: Option<Duration>) -> StepTiming {
        let end = Instant::now();
        self.last_end = Some(end);
        StepTiming {
            compute: end.duration_since(started),
            wait,
        }
    }

    fn drop_seqs(&mut self, dropped: Vec<SeqId>) {
        for id in dropped {
            self.tables.remove(&id);
            if let Some(sampling) = self.sampling.as_mut() {
                sampling.drop_seq(id);
            }
        }
    }

    /// Applies the block deltas and runs the forward pass off the async runtime; gives
    /// the steps back with, per sequence, its `logit_rows()` rows: logits, or with
    /// `plans` the tokens chosen with them.
    async fn step(
        &mut self,
        seqs: Vec<StepSeq>,
        plans: Option<Vec<Vec<RowPlan>>>,
    ) -> Result<(Vec<StepSeq>, Vec<RowsOut>), ActorProcessingErr> {
        let mut tables = Vec::with_capacity(seqs.len());
        for s in &seqs {
            let table = self.tables.entry(s.seq).or_default();
            if s.reset {
                table.clear();
            }
            table.extend_from_slice(&s.new_blocks);
            tables.push(table.clone());
        }
        let mut forward = self.forward.take().ok_or("engine lost its KV cache")?;
        let (forward, seqs, result) = tokio::task::spawn_blocking(move || {
            let chunks: Vec<SeqChunk> = seqs
                .iter()
                .zip(&tables)
                .map(|(s, table)| SeqChunk {
                    tokens: &s.tokens,
                    start_pos: s.start_pos,
                    block_table: table,
                    logits: s.logit_rows(),
                })
                .collect();
            let out = match &plans {
                Some(plans) => forward.forward_choose(&chunks, plans),
                None => forward
                    .forward(&chunks)
                    .map(|rows| rows.into_iter().map(RowsOut::Logits).collect()),
            };
            (forward, seqs, out)
        })
        .await?;
        self.forward = Some(forward);
        Ok((seqs, result?))
    }
}

/// A chunk's logits (a chunk run without plans always has them).
fn into_logits(out: RowsOut) -> Vec<f32> {
    match out {
        RowsOut::Logits(rows) => rows,
        RowsOut::Chosen(_) => Vec::new(),
    }
}
