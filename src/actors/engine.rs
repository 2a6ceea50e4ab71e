//! Engine actor: runs one forward pass per `EngineMsg::Step` on its device (the CPU
//! engine today) and sends the last-token logits of the sequences that sample to the
//! Sampler (`SamplerMsg::Sample`).
//!
//! State: the model (shared, read-only), its KV cache, and each sequence's block table,
//! kept up to date from the deltas in each step. The forward pass runs on the blocking
//! pool so the async runtime keeps serving. A failed or panicking step kills the actor;
//! its supervisor (ModelSupervisor) restarts it with a fresh cache.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::messages::{EngineMsg, SamplerMsg, SeqId, StepSeq};
use crate::model::{KvCache, Llama, SeqChunk};

pub struct Engine;

pub struct EngineArgs {
    pub model: Arc<Llama>,
    pub block_size: usize,
    pub num_blocks: usize,
    pub sampler: ActorRef<SamplerMsg>,
}

pub struct EngineState {
    model: Arc<Llama>,
    cache: Option<KvCache>,
    tables: HashMap<SeqId, Vec<u32>>,
    sampler: ActorRef<SamplerMsg>,
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
        let cache = KvCache::new(args.model.config(), args.block_size, args.num_blocks);
        Ok(EngineState {
            model: args.model,
            cache: Some(cache),
            tables: HashMap::new(),
            sampler: args.sampler,
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
                reply_to,
            } => {
                for id in dropped {
                    state.tables.remove(&id);
                }
                if state.fault {
                    panic!("injected engine fault at iteration {iteration}");
                }
                let (sampled, logits) = step(state, seqs).await?;
                state.sampler.cast(SamplerMsg::Sample {
                    iteration,
                    seqs: sampled,
                    logits,
                    reply_to,
                })?;
            }
        }
        Ok(())
    }
}

/// Applies the block deltas, runs the forward pass off the async runtime, and returns
/// the sampling sequences with their logits rows.
async fn step(
    state: &mut EngineState,
    seqs: Vec<StepSeq>,
) -> Result<(Vec<SeqId>, Vec<f32>), ActorProcessingErr> {
    let mut work = Vec::with_capacity(seqs.len());
    for s in seqs {
        let table = state.tables.entry(s.seq).or_default();
        if s.reset {
            table.clear();
        }
        table.extend_from_slice(&s.new_blocks);
        work.push((s.seq, s.tokens, s.start_pos, table.clone(), s.sample));
    }
    let model = state.model.clone();
    let mut cache = state.cache.take().ok_or("engine lost its KV cache")?;
    let (cache, result) = tokio::task::spawn_blocking(move || {
        let chunks: Vec<SeqChunk> = work
            .iter()
            .map(|(_, tokens, start_pos, table, _)| SeqChunk {
                tokens,
                start_pos: *start_pos,
                block_table: table,
                all_logits: false,
            })
            .collect();
        let out = model.forward(&chunks, &mut cache);
        let result = out.map(|rows| {
            let mut ids = Vec::new();
            let mut logits = Vec::new();
            for ((seq, _, _, _, sample), row) in work.iter().zip(rows) {
                if *sample {
                    ids.push(*seq);
                    logits.extend_from_slice(&row);
                }
            }
            (ids, logits)
        });
        (cache, result)
    })
    .await?;
    state.cache = Some(cache);
    Ok(result?)
}
