//! Scheduler actor: the thin shell around the pure [`crate::scheduler::Scheduler`]. It
//! queues sequences (`Enqueue`, from Preprocess), plans one iteration at a time and sends
//! it to the Engine as a delta (`EngineMsg::Step`: new tokens, appended blocks, dropped
//! sequences), applies the sampled tokens (`StepDone`, from the Sampler) and fans the
//! resulting outputs to the Postprocess workers (`PostprocessMsg::Emit`).
//!
//! Overlap: with an engine that samples on its device, the next iteration is planned
//! while the last one runs; the pure [`Overlap`] decides what goes out (steps with
//! `hold`, or `EngineMsg::Finish` when nothing can be planned ahead) and what each step
//! carries as a delta. The `overlap_scheduling` config key turns it off.
//!
//! Cancels (`Cancel`, `EndSeq`) free blocks at once and are reported to the engine with
//! the next step. When the engine dies (`EngineFailed`, from the supervisor) every
//! sequence whose KV state it held gets an error; queued ones wait for `EngineReady`.
//! Supervised by ModelSupervisor.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::messages::{
    CancelReason, EngineMsg, EngineTime, Pooled, PostprocessMsg, PromptScores, SamplerMsg,
    SchedulerMsg, SchedulerStats, SeqId, SeqInit, SeqOutput, SeqSampled, SubmitError,
};
use crate::model::Pooling;
use crate::request::{GenerationParams, RequestId};
use crate::sampling::SeqSampler;
use crate::scheduler::overlap::{Overlap, SeqInfo, Step};
use crate::scheduler::{SchedulerConfig, SeqEvent, SeqSpec, StepOutput};
use beams::Search;

#[path = "scheduler_beams.rs"]
mod beams;

pub(crate) struct SchedulerActor;

pub struct SchedulerArgs {
    pub config: SchedulerConfig,
    /// With a draft source configured: draft tokens per decode step for requests that do
    /// not say. None: no request speculates.
    pub default_draft_tokens: Option<usize>,
    pub sampler: ActorRef<SamplerMsg>,
    pub postprocess: Vec<ActorRef<PostprocessMsg>>,
    /// Plan iterations ahead (the engine samples on its device; no draft source).
    pub overlap: bool,
    /// The model's end tokens (a beam search's hypotheses end at them).
    pub eos_ids: Vec<u32>,
}

struct SeqMeta {
    rid: u64,
    request: RequestId,
    params: Arc<GenerationParams>,
    prompt_len: usize,
    enqueued: Instant,
    /// Wait before its first batch; reported with its first token, then None.
    queued: Option<Duration>,
    /// Prompt tokens its first batch found in the prefix cache.
    cached: usize,
    first_scheduled: bool,
    /// Its sampling does not depend on a token not yet known: it may be planned ahead.
    continues: bool,
    /// A beam's search: its first sequence's id (a beam's slot is its id less that).
    beam_of: Option<SeqId>,
}

pub struct SchedulerState {
    core: crate::scheduler::Scheduler,
    engine: Option<ActorRef<EngineMsg>>,
    sampler: ActorRef<SamplerMsg>,
    postprocess: Vec<ActorRef<PostprocessMsg>>,
    /// In-flight iterations and the deltas the engine gets.
    overlap: Overlap,
    seqs: HashMap<SeqId, SeqMeta>,
    requests: HashMap<RequestId, Vec<SeqId>>,
    drains: Vec<RpcReplyPort<()>>,
    default_draft_tokens: Option<usize>,
    timing: EngineTime,
    /// Beam searches in progress, by their first sequence's id.
    searches: HashMap<SeqId, Search>,
    eos_ids: Vec<u32>,
}

impl Actor for SchedulerActor {
    type Msg = SchedulerMsg;
    type State = SchedulerState;
    type Arguments = SchedulerArgs;

    async fn pre_start(
        &self,
        _: ActorRef<SchedulerMsg>,
        args: SchedulerArgs,
    ) -> Result<SchedulerState, ActorProcessingErr> {
        let core = crate::scheduler::Scheduler::new(args.config)
            .map_err(|e| format!("scheduler config: {e}"))?;
        Ok(SchedulerState {
            core,
            engine: None,
            sampler: args.sampler,
            postprocess: args.postprocess,
            overlap: Overlap::new(args.overlap),
            seqs: HashMap::new(),
            requests: HashMap::new(),
            drains: Vec::new(),
            default_draft_tokens: args.default_draft_tokens,
            timing: EngineTime::default(),
            searches: HashMap::new(),
            eos_ids: args.eos_ids,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SchedulerMsg>,
        msg: SchedulerMsg,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        let follows = matches!(msg, SchedulerMsg::StepDone { .. });
        match msg {
            SchedulerMsg::Enqueue { seqs, reply } => {
                let _ = reply.send(state.enqueue(seqs));
            }
            SchedulerMsg::Cancel {
                request,
                rid,
                reason,
            } => state.cancel(&request, rid, reason),
            SchedulerMsg::EndSeq(seq) => state.end_seq(seq),
            SchedulerMsg::StepDone {
                iteration,
                output,
                sampled,
                pooled,
                prompt,
                timing,
            } => {
                state.timing.add(timing);
                state.step_done(iteration, output, sampled, pooled, prompt);
            }
            SchedulerMsg::EngineFailed { error } => state.engine_failed(&error),
            SchedulerMsg::EngineReady(engine) => state.engine = Some(engine),
            SchedulerMsg::Stats(reply) => {
                let _ = reply.send(state.stats());
            }
            SchedulerMsg::Drain(reply) => state.drains.push(reply),
        }
        state.kick(&myself, follows)?;
        if state.requests.is_empty() {
            for d in state.drains.drain(..) {
                let _ = d.send(());
            }
        }
        Ok(())
    }
}

impl SchedulerState {
    /// Queues all sequences of one request, or none.
    fn enqueue(&mut self, seqs: Vec<SeqInit>) -> Result<(), SubmitError> {
        let Some(first) = seqs.first() else {
            return Err(SubmitError::Invalid("the request has no prompts".into()));
        };
        let request = first.request.clone();
        if self.requests.contains_key(&request) {
            return Err(SubmitError::DuplicateId(request));
        }
        let max_queue = self.core.config().max_queue_size;
        // A search's later beams are not queued.
        let queued = seqs
            .iter()
            .filter(|s| s.beam_of.is_none_or(|first| first == s.seq))
            .count();
        if queued > max_queue {
            // Never fits, however long the client waits: a client error, not "queue full".
            return Err(SubmitError::Invalid(format!(
                "the request has {queued} prompts; at most {max_queue} fit the queue (max_queue_size)"
            )));
        }
        let mut added = Vec::with_capacity(seqs.len());
        for s in &seqs {
            // A search's later beams are forked from its first one once it has run.
            if s.beam_of.is_some_and(|first| first != s.seq) {
                continue;
            }
            // A sequence whose logits rows go back whole does not speculate: each row is
            // one output token's; nor does a beam.
            let num_draft_tokens = match s.params.wants_logit_rows() || s.beam_of.is_some() {
                true => 0,
                false => self
                    .default_draft_tokens
                    .map_or(0, |d| s.params.num_draft_tokens.unwrap_or(d)),
            };
            let spec = SeqSpec {
                id: s.seq,
                prompt: s.prompt.clone(),
                max_new_tokens: s.params.max_tokens,
                num_draft_tokens,
                cache_salt: cache_salt(s),
                priority: s.params.priority,
                beam_width: s.params.beam_width.max(1),
            };
            if let Err(e) = self.core.add(spec) {
                for &seq in &added {
                    self.core.cancel(seq);
                }
                return Err(e.into());
            }
            added.push(s.seq);
        }
        for s in &seqs {
            let meta = SeqMeta {
                rid: s.rid,
                request: request.clone(),
                params: s.params.clone(),
                prompt_len: s.prompt.len(),
                enqueued: Instant::now(),
                queued: None,
                cached: 0,
                first_scheduled: false,
                // Logits rows come back to the host: the device chooses no token to
                // go on with.
                continues: SeqSampler::plans_ahead(&s.params) && !s.params.wants_logit_rows(),
                beam_of: s.beam_of,
            };
            self.seqs.insert(s.seq, meta);
            if s.beam_of == Some(s.seq) {
                let search = Search::new(s, &self.eos_ids, self.core.config().max_seq_len);
                self.searches.insert(s.seq, search);
            }
        }
        self.requests
            .insert(request, seqs.iter().map(|s| s.seq).collect());
        let _ = self.sampler.cast(SamplerMsg::Register(seqs));
        Ok(())
    }

    fn cancel(&mut self, request: &RequestId, rid: Option<u64>, reason: CancelReason) {
        let Some(ids) = self.requests.get(request) else {
            return;
        };
        if rid.is_some_and(|rid| ids.first().is_some_and(|&s| self.rid(s) != rid)) {
            return;
        }
        let Some(ids) = self.requests.remove(request) else {
            return;
        };
        let mut outs = Vec::new();
        for seq in ids {
            self.core.cancel(seq);
            outs.push((self.rid(seq), SeqOutput::Cancelled { seq, reason }));
            self.forget(seq);
        }
        self.emit(outs);
    }

    fn end_seq(&mut self, seq: SeqId) {
        let Some(meta) = self.seqs.get(&seq) else {
            return;
        };
        let request = meta.request.clone();
        self.core.cancel(seq);
        self.forget(seq);
        if let Some(ids) = self.requests.get_mut(&request) {
            ids.retain(|&s| s != seq);
            if ids.is_empty() {
                self.requests.remove(&request);
            }
        }
    }

    /// Drops a sequence's bookkeeping here, in the sampler and (next step) in the engine.
    fn forget(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
        self.searches.remove(&seq);
        self.overlap.reset(seq);
        let _ = self.sampler.cast(SamplerMsg::Drop(vec![seq]));
    }

    fn step_done(
        &mut self,
        iteration: u64,
        output: StepOutput,
        sampled: Vec<SeqSampled>,
        pooled: Vec<Pooled>,
        prompt: Vec<PromptScores>,
    ) {
        let Some(batch) = self.overlap.answered(iteration) else {
            return;
        };
        let mut pooled: HashMap<SeqId, Vec<f32>> = pooled.into_iter().collect();
        // Prompt scores go out before the tokens of the same step.
        let mut outs: Vec<(u64, SeqOutput)> = prompt
            .into_iter()
            .filter(|p| self.seqs.contains_key(&p.seq))
            .map(|p| {
                let out = SeqOutput::PromptLogprobs {
                    seq: p.seq,
                    from: p.from,
                    rows: p.rows,
                    logits: p.logits,
                };
                (self.rid(p.seq), out)
            })
            .collect();
        // Per sequence: what the sampler said, and how many of its tokens went out.
        let mut per_seq: HashMap<SeqId, (SeqSampled, usize)> = output
            .tokens
            .iter()
            .map(|t| t.id)
            .zip(sampled.into_iter().map(|s| (s, 0)))
            .collect();
        for event in self.core.update(&batch, &output) {
            match event {
                SeqEvent::Token { id, token } => {
                    let (log_prob, top, drafted, accepted, logits) = match per_seq.get_mut(&id) {
                        Some((s, i)) => {
                            let first = *i == 0;
                            let lp = s.log_probs.get(*i).copied().flatten();
                            let top = s.tops.get_mut(*i).map(std::mem::take).unwrap_or_default();
                            let logits = s.logits.get_mut(*i).map(std::mem::take);
                            *i += 1;
                            if first {
                                (lp, top, s.drafted, s.accepted, logits)
                            } else {
                                (lp, top, 0, 0, logits)
                            }
                        }
                        None => (None, Vec::new(), 0, 0, None),
                    };
                    let queued = self.seqs.get_mut(&id).and_then(|m| m.queued.take());
                    let cached = self.seqs.get(&id).map_or(0, |m| m.cached);
                    outs.push((
                        self.rid(id),
                        SeqOutput::Token {
                            seq: id,
                            token,
                            log_prob,
                            top,
                            queued,
                            cached,
                            drafted,
                            accepted,
                            logits,
                        },
                    ));
                }
                SeqEvent::Finished { id, reason } => {
                    let embedding = pooled.remove(&id);
                    outs.push((
                        self.rid(id),
                        SeqOutput::Finished {
                            seq: id,
                            reason,
                            embedding,
                        },
                    ));
                    if let Some(meta) = self.seqs.get(&id) {
                        let request = meta.request.clone();
                        self.forget(id);
                        if let Some(ids) = self.requests.get_mut(&request) {
                            ids.retain(|&s| s != id);
                            if ids.is_empty() {
                                self.requests.remove(&request);
                            }
                        }
                    }
                }
                SeqEvent::Sampled { id } => {
                    let (offer, row) = per_seq
                        .get_mut(&id)
                        .map(|(s, _)| {
                            let offer = s.tops.first_mut().map(std::mem::take);
                            (offer, s.logits.first_mut().map(std::mem::take))
                        })
                        .unwrap_or_default();
                    self.beam_sampled(id, &offer.unwrap_or_default(), row, &mut outs);
                }
                // Reset when its batch was sent (`send`): by now a batch planned ahead may
                // have admitted it again.
                SeqEvent::Preempted { .. } => {}
            }
        }
        self.emit(outs);
    }

    fn engine_failed(&mut self, error: &str) {
        self.engine = None;
        let held: Vec<SeqId> = self
            .seqs
            .keys()
            .copied()
            .filter(|&s| self.overlap.engine_holds(s))
            .collect();
        self.overlap.engine_failed();
        let mut failed_requests = Vec::new();
        for seq in &held {
            if let Some(m) = self.seqs.get(seq) {
                failed_requests.push(m.request.clone());
            }
        }
        failed_requests.sort();
        failed_requests.dedup();
        let mut outs = Vec::new();
        for request in failed_requests {
            for seq in self.requests.remove(&request).unwrap_or_default() {
                self.core.cancel(seq);
                let error = format!("the engine failed: {error}");
                outs.push((self.rid(seq), SeqOutput::Failed { seq, error }));
                self.seqs.remove(&seq);
                self.searches.remove(&seq);
                let _ = self.sampler.cast(SamplerMsg::Drop(vec![seq]));
            }
        }
        // The new engine's cache holds none of the cached prefixes.
        self.core.clear_prefix_cache();
        self.emit(outs);
    }

    /// Plans and sends what [`Overlap::kick`] decides: the next iteration when the engine
    /// is idle (`follows`: this is the reply to the previous one's results), the one after
    /// it planned ahead, or `Finish`.
    fn kick(
        &mut self,
        myself: &ActorRef<SchedulerMsg>,
        follows: bool,
    ) -> Result<(), ActorProcessingErr> {
        let Some(engine) = self.engine.clone() else {
            return Ok(());
        };
        let seqs = &self.seqs;
        let kick = self.overlap.kick(
            &mut self.core,
            follows,
            |id| seqs.get(&id).is_some_and(|m| m.continues),
            |id| {
                seqs.get(&id).map(|m| SeqInfo {
                    prompt_len: m.prompt_len,
                    params: m.params.clone(),
                })
            },
        )?;
        for step in kick.steps {
            self.first_scheduled(&step);
            engine.cast(EngineMsg::Step {
                iteration: step.iteration,
                seqs: step.seqs,
                dropped: step.dropped,
                swaps: step.swaps,
                follows: step.follows,
                reply_to: myself.clone(),
                hold: step.hold,
            })?;
        }
        if kick.finish {
            engine.cast(EngineMsg::Finish)?;
        }
        Ok(())
    }

    /// Notes how long each sequence in its first step waited since it was queued, and how
    /// much of its prompt the prefix cache held.
    fn first_scheduled(&mut self, step: &Step) {
        for s in &step.seqs {
            if let Some(meta) = self.seqs.get_mut(&s.seq) {
                if !meta.first_scheduled {
                    meta.first_scheduled = true;
                    meta.queued = Some(meta.enqueued.elapsed());
                    meta.cached = s.cached.len();
                }
            }
        }
    }

    /// The request key of a live sequence (0 for unknown ones, whose outputs the
    /// worker ignores).
    fn rid(&self, seq: SeqId) -> u64 {
        self.seqs.get(&seq).map_or(0, |m| m.rid)
    }

    /// Sends outputs to the Postprocess worker that owns each one's request.
    fn emit(&self, outs: Vec<(u64, SeqOutput)>) {
        let n = self.postprocess.len() as u64;
        let mut per_worker: Vec<Vec<SeqOutput>> =
            self.postprocess.iter().map(|_| Vec::new()).collect();
        for (rid, o) in outs {
            per_worker[(rid % n) as usize].push(o);
        }
        for (w, outs) in self.postprocess.iter().zip(per_worker) {
            if !outs.is_empty() {
                let _ = w.cast(PostprocessMsg::Emit(outs));
            }
        }
    }

    fn stats(&self) -> SchedulerStats {
        let it = self.core.last_stats();
        let (blocks_swapped_out, blocks_swapped_in) = self.core.num_blocks_swapped();
        let (prefix_queried_tokens, prefix_hit_tokens) = self.core.prefix_cache_tokens();
        let (blocks_offloaded, blocks_onloaded) = self.core.num_blocks_offloaded();
        SchedulerStats {
            waiting: self.core.num_waiting(),
            running: self.core.num_running(),
            free_blocks: self.core.num_free_blocks(),
            total_blocks: self.core.num_total_blocks(),
            block_size: self.core.config().block_size,
            iteration: self.core.iteration(),
            max_batch_size: self.core.config().max_batch_size,
            context_requests: it.num_context_requests,
            context_tokens: it.num_context_tokens,
            generation_requests: it.num_generation_requests,
            active_requests: self.requests.len(),
            preemptions: self.core.num_preemptions(),
            preempted_tokens: self.core.num_preempted_tokens(),
            swap_outs: self.core.num_swap_outs(),
            long_rope_restarts: self.core.num_long_rope_restarts(),
            blocks_swapped_out,
            blocks_swapped_in,
            planned_ahead: self.overlap.planned_ahead(),
            prefix_queried_tokens,
            prefix_hit_tokens,
            cached_blocks: self.core.num_cached_blocks(),
            host_cached_blocks: self.core.num_host_cached_blocks(),
            blocks_offloaded,
            blocks_onloaded,
            ready: self.engine.is_some(),
            engine_time: self.timing,
        }
    }
}

/// The prefix cache's salt of a request's `cache_salt` (never 0, the common pool's).
fn salt_of(salt: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    salt.hash(&mut h);
    h.finish() | 1
}

/// A sequence's prefix-cache salt. Mean pooling needs every prompt token's hidden state,
/// which a cached prefix would skip: such a sequence gets a salt of its own, so it finds
/// no cached block (and no other sequence finds its blocks).
fn cache_salt(s: &SeqInit) -> u64 {
    match s.params.pooling {
        Some(Pooling::Mean) => salt_of(&format!("\0mean pooling of sequence {}", s.seq)),
        // Its prompt's logits are wanted at every position: a salt of its own finds no
        // cached prefix, so it computes them all.
        _ if s.params.prompt_log_probs || s.params.return_context_logits => {
            salt_of(&format!("prompt-log-probs-{}", s.seq))
        }
        _ => s.params.cache_salt.as_deref().map_or(0, salt_of),
    }
}
