//! Engine actor: runs one forward pass per message on its device through a
//! [`ForwardPass`] (the CPU engine, or a GPU one) and hands the logits on.
//!
//! - `EngineMsg::Step` (from the Scheduler, or the speculative orchestrator in front of
//!   it): the rows of the sequences that sample (the last known token's, then one per
//!   draft token) go to the Sampler (`SamplerMsg::Sample`); or, when the forward pass
//!   samples on its device (the GPU), the engine plans each row from its own sampling
//!   state (`engine_sampling`), gets token ids back, and answers the Scheduler
//!   (`SchedulerMsg::StepDone`) itself.
//!   With `hold` (the Scheduler plans ahead), the step is launched and its answer waits
//!   until the next `Step` is launched too, or `EngineMsg::Finish` comes: the next step's
//!   pending tokens are this one's choices, taken on the device, so the device runs
//!   iteration after iteration while the host plans.
//! - `EngineMsg::Forward` (from the speculative orchestrator driving a draft model): the
//!   logits come back on the reply port.
//! - Sequences that generate nothing (embeddings) are taken out of each step and run
//!   through `ForwardPass::forward_hidden` (`engine_pooling`); their embeddings go with
//!   the step's answer (`pooled` in `SamplerMsg::Sample` and `SchedulerMsg::StepDone`).
//!
//! State: the forward pass (model and KV cache), each sequence's block table, kept up
//! to date from the deltas in each step, and the embedding sequences' pooled rows. The forward pass runs off the async workers
//! (`off_runtime`: in place, its worker's other tasks handed to another thread) so the
//! async runtime keeps serving. A failed or panicking step kills the actor; its
//! supervisor (ModelSupervisor) restarts it with a fresh cache.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::engine_pooling::EnginePooling;
use super::engine_sampling::EngineSampling;
use super::messages::{
    EngineMsg, Pooled, SampleRow, SamplerMsg, SchedulerMsg, SeqId, StepSeq, StepTiming,
};
use crate::model::{Backend, Fault, ForwardPass, RowsOut, SeqChunk};
use crate::scheduler::BlockCopy;

pub(crate) struct Engine;

pub struct EngineArgs {
    pub backend: Arc<dyn Backend>,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Blocks of the host cache that preempted sequences swap out to.
    pub num_host_blocks: usize,
    /// Where `Step` logits go (None for a draft engine, which only answers `Forward`).
    pub sampler: Option<ActorRef<SamplerMsg>>,
    /// The model's end tokens and vocabulary, for sampling in the engine.
    pub eos_ids: Vec<u32>,
    pub vocab_size: usize,
    /// Counts the target engine's steps completed (run to their results; a draft engine's
    /// passes do not count): the supervisor tells an engine that fails after serving from
    /// one that fails at once (a crash loop).
    pub served: Arc<AtomicU64>,
}

pub struct EngineState {
    forward: Option<Box<dyn ForwardPass>>,
    tables: HashMap<SeqId, Vec<u32>>,
    sampler: Option<ActorRef<SamplerMsg>>,
    /// Set when the forward pass samples: the sequences' sampling state.
    sampling: Option<EngineSampling>,
    /// The embedding sequences' pooled rows.
    pooling: EnginePooling,
    /// When the last `Step` finished (its results handed on).
    last_end: Option<Instant>,
    /// A launched step whose answer waits for the next launch (`Step::hold`).
    held: Option<Held>,
    /// A fault to meet at the next step (fault injection).
    fault: Option<Fault>,
    served: Arc<AtomicU64>,
}

/// A step launched on a forward pass that samples, not yet answered.
struct Held {
    iteration: u64,
    /// Its generating sequences (launched unless there is none).
    seqs: Vec<StepSeq>,
    launched: bool,
    /// The embeddings its embedding sequences completed.
    pooled: Vec<Pooled>,
    reply_to: ActorRef<SchedulerMsg>,
    /// When its launch began, and the device's idle time before it as the host saw it.
    started: Instant,
    wait: Option<Duration>,
}

impl Held {
    /// The sampling logits row (in chunk order) of each sampling sequence: where a step
    /// planned after this one finds its pending tokens.
    fn rows(&self) -> HashMap<SeqId, usize> {
        let mut at = 0;
        let mut rows = HashMap::new();
        for s in &self.seqs {
            if s.sample {
                // After the rows that score prompt tokens.
                rows.insert(s.seq, at + s.score.len());
            }
            at += s.logit_rows();
        }
        rows
    }
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
        let forward = args
            .backend
            .start(args.block_size, args.num_blocks, args.num_host_blocks)?;
        let sampling = (forward.samples() && args.sampler.is_some())
            .then(|| EngineSampling::new(args.eos_ids, args.vocab_size));
        Ok(EngineState {
            forward: Some(forward),
            tables: HashMap::new(),
            sampler: args.sampler,
            sampling,
            pooling: EnginePooling::default(),
            last_end: None,
            held: None,
            fault: None,
            served: args.served,
        })
    }

    async fn handle(
        &self,
        _: ActorRef<EngineMsg>,
        msg: EngineMsg,
        state: &mut EngineState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            EngineMsg::InjectFault(fault) => state.fault = Some(fault),
            EngineMsg::Finish => {
                if let Some(held) = state.held.take() {
                    state.answer(held).await?;
                }
            }
            EngineMsg::Step {
                iteration,
                seqs,
                dropped,
                swaps,
                follows,
                reply_to,
                hold,
            } => {
                let started = Instant::now();
                // With a step in flight the device had work queued, whatever the host did.
                let wait = match state.held {
                    Some(_) => Some(Duration::ZERO),
                    None => state
                        .last_end
                        .filter(|_| follows)
                        .map(|end| started.duration_since(end)),
                };
                state.drop_seqs(dropped);
                match state.fault.take() {
                    Some(Fault::Panic) => panic!("injected engine fault at iteration {iteration}"),
                    Some(fault) => {
                        tracing::warn!(%fault, iteration, "injecting a device fault");
                        let forward = state.forward.as_mut().ok_or("engine lost its KV cache")?;
                        forward.inject_fault(fault)?;
                    }
                    None => {}
                }
                state.copy_blocks(swaps).await?;
                let sampler = state.sampler.clone().ok_or("a draft engine got a Step")?;
                let (seqs, embeds) = EnginePooling::split(seqs);
                if state.sampling.is_some() {
                    let held = Held {
                        iteration,
                        launched: !seqs.is_empty(),
                        seqs,
                        pooled: Vec::new(),
                        reply_to,
                        started,
                        wait,
                    };
                    return state.launch(held, embeds, hold).await;
                }
                let pooled = state.embed(embeds).await?;
                let (seqs, out) = match seqs.is_empty() {
                    true => (seqs, Vec::new()),
                    false => state.step(seqs).await?,
                };
                let timing = state.finish_timing(started, wait);
                let mut rows = Vec::new();
                let mut logits = Vec::new();
                for (s, l) in seqs.into_iter().zip(out) {
                    if s.logit_rows() > 0 {
                        let keep = s.kept_rows();
                        rows.push(SampleRow {
                            keep,
                            seq: s.seq,
                            draft: s.draft,
                            score: s.score,
                            score_from: s.start_pos + 1,
                            sample: s.sample,
                        });
                        logits.extend_from_slice(&into_logits(l));
                    }
                }
                sampler.cast(SamplerMsg::Sample {
                    iteration,
                    rows,
                    logits,
                    pooled,
                    timing,
                    reply_to,
                })?;
                state.served.fetch_add(1, Ordering::Relaxed);
            }
            EngineMsg::Forward {
                seqs,
                dropped,
                reply,
            } => {
                state.drop_seqs(dropped);
                let (_, out) = state.step(seqs).await?;
                let _ = reply.send(out.into_iter().map(into_logits).collect());
            }
        }
        Ok(())
    }
}

impl EngineState {
    /// The timing of a step that started at `started`, which now ends. A step launched
    /// while the previous one ran computes from that one's end on.
    fn finish_timing(&mut self, started: Instant, wait: Option<Duration>) -> StepTiming {
        let end = Instant::now();
        let from = self.last_end.map_or(started, |last| last.max(started));
        self.last_end = Some(end);
        StepTiming {
            compute: end.duration_since(from),
            wait,
        }
    }

    /// Launches a step on the forward pass that samples (its generating sequences, if it
    /// has any), then answers for the step held before it (whose results the device is
    /// producing meanwhile), then runs its embedding sequences, `embeds`, then either
    /// holds it (`hold`) or answers for it too.
    async fn launch(
        &mut self,
        mut step: Held,
        embeds: Vec<StepSeq>,
        hold: bool,
    ) -> Result<(), ActorProcessingErr> {
        if step.launched {
            self.launch_generating(&mut step).await?;
        }
        if let Some(previous) = self.held.take() {
            self.answer(previous).await?;
        }
        step.pooled = self.embed(embeds).await?;
        if hold {
            self.held = Some(step);
            Ok(())
        } else {
            self.answer(step).await
        }
    }

    /// Launches a step's generating sequences, their pending tokens taken from the step
    /// held before it.
    async fn launch_generating(&mut self, step: &mut Held) -> Result<(), ActorProcessingErr> {
        let sampling = self.sampling.as_mut().ok_or("engine lost its sampling")?;
        let rows = self.held.as_ref().map(Held::rows).unwrap_or_default();
        let mut plans = Vec::with_capacity(step.seqs.len());
        let mut pending = Vec::with_capacity(step.seqs.len());
        for s in &step.seqs {
            if s.is_pending() {
                let row = rows.get(&s.seq).copied().ok_or_else(|| {
                    format!(
                        "seq {} is planned ahead of a step that does not sample it",
                        s.seq
                    )
                })?;
                pending.push(Some(row));
                plans.push(vec![sampling.plan_ahead(s)?]);
            } else {
                pending.push(None);
                plans.push(sampling.plan(s));
            }
        }
        let tables = self.tables_for(&step.seqs);
        let seqs = std::mem::take(&mut step.seqs);
        let mut forward = self.forward.take().ok_or("engine lost its KV cache")?;
        let (forward, seqs, launched) = off_runtime(move || {
            let chunks = chunks(&seqs, &tables);
            let launched = forward.launch_step(&chunks, &plans, &pending);
            (forward, seqs, launched)
        })
        .await?;
        self.forward = Some(forward);
        step.seqs = seqs;
        Ok(launched?)
    }

    /// Runs embedding sequences' chunks through the hidden-state pass and pools their
    /// rows; gives the embeddings of those whose prompt ends in this step.
    async fn embed(&mut self, seqs: Vec<StepSeq>) -> Result<Vec<Pooled>, ActorProcessingErr> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let tables = self.tables_for(&seqs);
        let mut forward = self.forward.take().ok_or("engine lost its KV cache")?;
        let (forward, seqs, hidden) = off_runtime(move || {
            let hidden = forward.forward_hidden(&EnginePooling::chunks(&seqs, &tables));
            (forward, seqs, hidden)
        })
        .await?;
        self.forward = Some(forward);
        Ok(self.pooling.absorb(&seqs, hidden?))
    }

    /// Waits for the oldest launched step's results (when `step` launched one) and
    /// answers the Scheduler with them.
    async fn answer(&mut self, step: Held) -> Result<(), ActorProcessingErr> {
        let (out, idle) = match step.launched {
            true => self.finish_step().await?,
            false => (Vec::new(), None),
        };
        // The step completed on the device.
        self.served.fetch_add(1, Ordering::Relaxed);
        let sampling = self.sampling.as_mut().ok_or("engine lost its sampling")?;
        let (output, sampled, prompt) = sampling.finish(&step.seqs, out);
        // The device's own measure of its idle time, where it has one.
        let wait = step.wait.map(|w| idle.unwrap_or(w));
        let timing = self.finish_timing(step.started, wait);
        step.reply_to.cast(SchedulerMsg::StepDone {
            iteration: step.iteration,
            output,
            sampled,
            pooled: step.pooled,
            prompt,
            timing,
        })?;
        // Until the next step arrives: the guided sequences' next masks.
        if let Some(sampling) = self.sampling.as_mut() {
            sampling.prepare_masks();
        }
        Ok(())
    }

    /// The oldest launched step's results, off the async runtime.
    async fn finish_step(
        &mut self,
    ) -> Result<(Vec<RowsOut>, Option<Duration>), ActorProcessingErr> {
        let mut forward = self.forward.take().ok_or("engine lost its KV cache")?;
        let (forward, finished) = off_runtime(move || {
            let finished = forward.finish_step();
            (forward, finished)
        })
        .await?;
        self.forward = Some(forward);
        Ok(finished?)
    }

    /// Applies each sequence's block delta and gives its whole table.
    fn tables_for(&mut self, seqs: &[StepSeq]) -> Vec<Vec<u32>> {
        let mut tables = Vec::with_capacity(seqs.len());
        for s in seqs {
            let table = self.tables.entry(s.seq).or_default();
            if s.new_table {
                table.clear();
            }
            table.extend_from_slice(&s.new_blocks);
            tables.push(table.clone());
        }
        tables
    }

    /// Queues the block copies of preemption by swapping, before the next forward pass.
    async fn copy_blocks(&mut self, swaps: Vec<BlockCopy>) -> Result<(), ActorProcessingErr> {
        if swaps.is_empty() {
            return Ok(());
        }
        let mut forward = self.forward.take().ok_or("engine lost its KV cache")?;
        let (forward, done) = off_runtime(move || {
            let done = forward.copy_blocks(&swaps);
            (forward, done)
        })
        .await?;
        self.forward = Some(forward);
        Ok(done?)
    }

    fn drop_seqs(&mut self, dropped: Vec<SeqId>) {
        for id in dropped {
            self.tables.remove(&id);
            self.pooling.drop_seq(id);
            if let Some(sampling) = self.sampling.as_mut() {
                sampling.drop_seq(id);
            }
        }
    }

    /// Applies the block deltas and runs the forward pass off the async runtime; gives
    /// the steps back with, per sequence, its `logit_rows()` rows of logits.
    async fn step(
        &mut self,
        seqs: Vec<StepSeq>,
    ) -> Result<(Vec<StepSeq>, Vec<RowsOut>), ActorProcessingErr> {
        let tables = self.tables_for(&seqs);
        let mut forward = self.forward.take().ok_or("engine lost its KV cache")?;
        let (forward, seqs, result) = off_runtime(move || {
            let out = forward
                .forward(&chunks(&seqs, &tables))
                .map(|rows| rows.into_iter().map(RowsOut::Logits).collect());
            (forward, seqs, out)
        })
        .await?;
        self.forward = Some(forward);
        Ok((seqs, result?))
    }
}

/// The forward pass's view of each sequence's chunk.
fn chunks<'a>(seqs: &'a [StepSeq], tables: &'a [Vec<u32>]) -> Vec<SeqChunk<'a>> {
    seqs.iter()
        .zip(tables)
        .map(|(s, table)| SeqChunk {
            tokens: &s.tokens,
            start_pos: s.start_pos,
            block_table: table,
            logits: s.logit_rows(),
            long_rope: s.long_rope,
        })
        .collect()
}

/// A chunk's logits (a chunk run without plans always has them).
fn into_logits(out: RowsOut) -> Vec<f32> {
    match out {
        RowsOut::Logits(rows) => rows,
        RowsOut::Chosen(_) => Vec::new(),
    }
}

/// Runs blocking work (a forward pass, waiting for the device) where it does not hold up
/// the async workers: in place on a multi-threaded runtime (the worker hands its other
/// tasks to another thread, and the step starts and returns without two thread wake-ups:
/// about 0.15 ms of a request's time to first token, docs/perf.md), else on the blocking
/// pool.
async fn off_runtime<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R, tokio::task::JoinError> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        return Ok(tokio::task::block_in_place(f));
    }
    tokio::task::spawn_blocking(f).await
}
