//! The inflight-batching scheduler: a plain struct with no I/O that owns the waiting
//! queue, the running sequences and the KV block accounting. Its actor is a thin shell.
//!
//! # Verbs
//! - [`Scheduler::add`] queues a request, or refuses it at once ([`AddError`]).
//! - [`Scheduler::schedule`] plans one iteration ([`Batch`]).
//! - [`Scheduler::schedule_ahead`] plans the next one while the last is being computed:
//!   decodes continue with the token that iteration samples ([`PENDING_TOKEN`]).
//! - [`Scheduler::update`] applies the engine's result for a batch and returns
//!   [`SeqEvent`]s (tokens, finishes, preemptions).
//! - [`Scheduler::cancel`] drops a request and frees its blocks at once.
//! - [`Scheduler::fork_beams`] applies a beam search's step to its beams' sequences
//!   (beams.rs: a beam's sampled chunk reports [`SeqEvent::Sampled`], its search chooses).
//!
//! # Decisions
//! - One invariant drives every iteration: each sequence's computed tokens catch up
//!   with its known tokens (prompt + generated). Prefill, chunked prefill, decode and
//!   recompute after preemption are the same rule.
//! - Blocks are freed only here, in the call that finishes (`update`), preempts
//!   (`schedule`) or cancels (`cancel`) a sequence.
//! - Without chunked context a prompt longer than `max_num_tokens` is refused by `add`
//!   (`TooLong`), so the engines never see a chunk unless chunking is on. So is any
//!   request whose KV needs exceed the whole cache: it could never finish.
//! - A sequence stops with `Length` at `max_new_tokens` or `max_seq_len`, whichever
//!   comes first; only a prompt that leaves no room for one token is refused. One with
//!   `max_new_tokens` 0 stops (`Length`, no token) when its last chunk is applied: its
//!   prompt's hidden states were all it asked for (an embedding).
//! - Admission is strict FCFS: it stops at the first waiting sequence that does not
//!   fit, and does not happen in an iteration that preempted (it would re-admit the
//!   victim at once).
//! - Preemption swaps when the host cache has room: the victim's computed blocks are
//!   copied to host blocks (`Batch::swaps`, before the iteration's forward pass), its
//!   device blocks freed, and it waits in `swapped` with its computed count and every
//!   engine's state kept. Swapped sequences resume first, most recently swapped first,
//!   and no new sequence is admitted while one waits. Otherwise preemption is by
//!   recompute: the victim's blocks and computed count are dropped.
//! - The host cache is also the prefix cache's second tier (with reuse on and host blocks
//!   configured): a cached device block reclaimed for its memory is copied to a host block
//!   (`Batch::swaps`, before anything writes it) and registered there under the same hash,
//!   unless the host tier holds that hash already. Admission looks a prompt's blocks up on
//!   the device, then in the host tier: a host hit gets a new device block, copied back
//!   before the forward pass and registered on the device, instead of being computed.
//!   Swapped sequences come first: a swap-out reclaims the tier's blocks, and takes back
//!   those its own step was copying to (their copies withdrawn).
//! - Copies are listed in the order they were planned, and that order is the guarantee:
//!   engines apply a batch's copies in list order (the GPU per group of layers, every
//!   direction in turn), so a block read and then overwritten within a batch (a swapped
//!   sequence's host block freed and reused, a reclaimed device block copied out and then
//!   into) sees the copies as planned. The host blocks a batch copies to or from for the
//!   tier stay referenced until its planning ends, so nothing else in it reuses them.
//! - A sequence is "in flight" from the `schedule` that includes it to the `update`
//!   of that batch; it is not scheduled again nor preempted meanwhile. So several
//!   batches may be outstanding (pipeline micro-batches), and an update for a
//!   cancelled, preempted or stale entry is ignored.
//! - A sequence scheduled with `sample` whose token is missing from the step output
//!   is not advanced: the same chunk is scheduled again.
//! - Planning ahead (overlap): a sequence whose in-flight chunk samples may get one more
//!   chunk, of that unknown token, in the next batch, so that the engine never waits for
//!   the host between iterations. It is applied in order after the first; if the first
//!   finished the sequence (a stop), the second's result is ignored and its blocks were
//!   freed with the sequence. A sequence whose pending token may be its last by length,
//!   that speculates, or whose sampling would depend on that token is not continued.
//! - Speculative decoding needs nothing else from the scheduler than room: a decode
//!   chunk of a sequence with `num_draft_tokens` gets blocks and token budget for that
//!   many draft tokens after it (`ScheduledSeq::max_draft`), and the step output may
//!   carry accepted draft tokens before the sampled one. Their KV entries are then
//!   computed; the rejected ones' entries lie past `num_computed` and are overwritten
//!   later, which is the whole rollback. The blocks stay with the sequence.

mod batch;
mod beams;
mod block_manager;
#[cfg(test)]
mod checks;
pub(crate) mod overlap;
mod policy;
mod schedule;
mod sequence;
mod stats;
mod step;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_beams;
#[cfg(test)]
mod tests_random;

use std::collections::{HashSet, VecDeque};

pub use batch::{
    Batch, BlockCopy, FinishReason, IterationStats, SampledToken, ScheduledSeq, SeqEvent,
    StepOutput, PENDING_TOKEN,
};
pub use beams::BeamFork;
pub use block_manager::{BlockManager, DROPPED};
pub use policy::{AddError, ConfigError, Limit, SchedulerConfig, SchedulerPolicy};
pub use sequence::SeqSpec;
pub(crate) use stats::StepTiming;
pub use stats::{EngineTime, SchedulerStats};
pub(crate) use step::{Draft, KeptRows, SeqId, StepSeq};

use sequence::Sequence;

/// Queue, running set and KV blocks of one model instance.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    /// The host cache's blocks, which swapped sequences hold.
    host_blocks: BlockManager,
    /// FCFS; preempted sequences go back to the front.
    waiting: VecDeque<Sequence>,
    /// Sequences preempted by swapping, most recent first; each holds host blocks
    /// (`Sequence::blocks`) for its computed tokens.
    swapped: VecDeque<Sequence>,
    /// In admission order: the last one is the first to be preempted.
    running: Vec<Sequence>,
    /// Ids of waiting and running sequences.
    live: HashSet<u64>,
    /// Cancelled since the last batch, to be reported in the next one.
    cancelled: Vec<u64>,
    iteration: u64,
    /// Iteration of the last batch applied by `update`.
    applied: u64,
    last_stats: IterationStats,
    /// Preemptions by recompute since start.
    preemptions: u64,
    /// Computed tokens those preemptions discarded (each to be computed again).
    preempted_tokens: u64,
    /// Preemptions by swapping since start.
    swap_outs: u64,
    /// Sequences computed again with LongRoPE's long factors as a decode crossed the
    /// original context, since start.
    long_rope_restarts: u64,
    /// Blocks copied to the host cache and back since start.
    blocks_swapped_out: u64,
    blocks_swapped_in: u64,
    /// Known tokens of admitted sequences since start, and those found in the prefix
    /// cache (not computed again).
    prefix_queried: u64,
    prefix_hits: u64,
    /// Cached blocks copied to the host tier, and back from it on a hit, since start.
    blocks_offloaded: u64,
    blocks_onloaded: u64,
}

impl Scheduler {
    /// An empty scheduler with `config`'s limits, or why they cannot work.
    pub fn new(config: SchedulerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let blocks = BlockManager::new(config.num_blocks, config.block_size);
        let host_tier = config.enable_kv_cache_reuse && config.num_host_blocks > 0;
        Ok(Scheduler {
            blocks: if host_tier {
                blocks.with_eviction_log()
            } else {
                blocks
            },
            host_blocks: BlockManager::new(config.num_host_blocks, config.block_size),
            config,
            waiting: VecDeque::new(),
            swapped: VecDeque::new(),
            running: Vec::new(),
            live: HashSet::new(),
            cancelled: Vec::new(),
            iteration: 0,
            applied: 0,
            last_stats: IterationStats::default(),
            preemptions: 0,
            long_rope_restarts: 0,
            preempted_tokens: 0,
            swap_outs: 0,
            blocks_swapped_out: 0,
            blocks_swapped_in: 0,
            prefix_queried: 0,
            prefix_hits: 0,
            blocks_offloaded: 0,
            blocks_onloaded: 0,
        })
    }

    /// Queues a request. A full queue, an empty prompt or a request that could never
    /// run is refused at once.
    pub fn add(&mut self, spec: SeqSpec) -> Result<(), AddError> {
        if self.live.contains(&spec.id) {
            return Err(AddError::DuplicateId);
        }
        self.config.check(&spec)?;
        if self.num_waiting() >= self.config.max_queue_size {
            return Err(AddError::QueueFull {
                max: self.config.max_queue_size,
            });
        }
        let max = self.config.max_queued_tokens;
        if max > 0 {
            let queued: usize = self
                .waiting
                .iter()
                .chain(&self.swapped)
                .map(|s| s.num_known())
                .sum();
            if queued + spec.prompt.len() > max {
                return Err(AddError::QueueTokensFull { queued, max });
            }
        }
        self.live.insert(spec.id);
        // Behind every waiting sequence of its priority or a lower value (FCFS within a level).
        let at = self
            .waiting
            .partition_point(|s| s.priority <= spec.priority);
        self.waiting
            .insert(at, Sequence::new(spec, self.config.max_seq_len));
        Ok(())
    }

    /// Applies the result of computing `batch`: advances every scheduled sequence's
    /// computed count, appends sampled tokens, and finishes sequences that stopped or
    /// reached their length limit (freeing their blocks now). Call it for every
    /// non-empty batch, in the order they were scheduled.
    ///
    /// Entries for sequences cancelled or preempted since are ignored, and so is a
    /// batch older than one already applied. Sequences of an earlier batch that was
    /// never applied (lost with a failed engine) become schedulable again: their
    /// chunks are recomputed.
    pub fn update(&mut self, batch: &Batch, out: &StepOutput) -> Vec<SeqEvent> {
        if batch.iteration <= self.applied {
            return Vec::new();
        }
        self.applied = batch.iteration;
        let mut events: Vec<SeqEvent> = batch
            .preempted
            .iter()
            .map(|&id| SeqEvent::Preempted { id })
            .collect();
        for chunk in &batch.seqs {
            let Some(idx) = self
                .running
                .iter()
                .position(|s| s.id == chunk.id && s.in_flight == Some(batch.iteration))
            else {
                continue;
            };
            let seq = &mut self.running[idx];
            debug_assert_eq!(seq.num_computed, chunk.start_pos, "seq {}", seq.id);
            seq.in_flight = None;
            if !chunk.sample {
                seq.num_computed += chunk.tokens.len();
                self.register_blocks(idx);
                continue;
            }
            if seq.is_beam() {
                // Its search chooses its next token (`fork_beams`); none is appended here.
                if out.tokens.iter().any(|t| t.id == chunk.id) {
                    seq.num_computed += chunk.tokens.len();
                    self.register_blocks(idx);
                    events.push(SeqEvent::Sampled { id: chunk.id });
                }
                continue;
            }
            if seq.at_length_limit() {
                // It generates nothing (max_new_tokens 0): its prompt, now computed, was
                // all it asked for; a token sampled for it is ignored.
                seq.num_computed += chunk.tokens.len();
                self.register_blocks(idx);
                self.finish(idx);
                events.push(SeqEvent::Finished {
                    id: chunk.id,
                    reason: FinishReason::Length,
                });
                continue;
            }
            let Some(sampled) = out.tokens.iter().find(|t| t.id == chunk.id) else {
                // Not advanced: a chunk planned ahead of this token is stale.
                self.drop_ahead(idx);
                continue;
            };
            let seq = &mut self.running[idx];
            // A chunk planned ahead now computes the token this one sampled.
            seq.in_flight = seq.ahead.take();
            let accepted = &sampled.accepted[..sampled.accepted.len().min(chunk.max_draft)];
            seq.num_computed += chunk.tokens.len() + accepted.len();
            let mut reason = None;
            for (i, &token) in accepted.iter().chain([&sampled.token]).enumerate() {
                seq.tokens.push(token);
                events.push(SeqEvent::Token { id: seq.id, token });
                if i == accepted.len() && sampled.stop {
                    reason = Some(FinishReason::Stop);
                } else if seq.at_length_limit() {
                    reason = Some(FinishReason::Length);
                    break;
                }
            }
            if seq.in_flight.is_some() {
                // The continuation computes the token just pushed and samples after it.
                seq.flight_end = seq.num_known();
            }
            self.register_blocks(idx);
            let Some(reason) = reason else {
                continue;
            };
            self.finish(idx);
            events.push(SeqEvent::Finished {
                id: chunk.id,
                reason,
            });
        }
        for idx in 0..self.running.len() {
            let seq = &mut self.running[idx];
            if seq.in_flight.is_some_and(|it| it <= batch.iteration) {
                seq.in_flight = None;
                self.drop_ahead(idx);
            }
        }
        events
    }

    /// Registers running sequence `idx`'s blocks that its computed tokens now fill, so
    /// that later sequences with the same prefix find them; then, under a sliding window,
    /// gives back the blocks its next query can no longer see.
    fn register_blocks(&mut self, idx: usize) {
        self.register_full(idx);
        self.drop_behind_window(idx);
    }

    /// Under `kv_window`, frees running sequence `idx`'s blocks wholly behind the window of
    /// its next query (position `num_computed`, which sees `num_computed + 1 - window` and
    /// after; queries in flight are later still), marking them [`DROPPED`]. Not a beam's:
    /// a fork goes back to the start of its partly filled block, whose window may reach
    /// further back than its parent's.
    fn drop_behind_window(&mut self, idx: usize) {
        let Some(window) = self.config.kv_window else {
            return;
        };
        let seq = &mut self.running[idx];
        if seq.is_beam() {
            return;
        }
        let behind = (seq.num_computed + 1).saturating_sub(window) / self.config.block_size;
        for b in seq.blocks.iter_mut().take(behind) {
            if *b != DROPPED {
                self.blocks.free(&[*b]);
                *b = DROPPED;
            }
        }
    }

    fn register_full(&mut self, idx: usize) {
        if !self.config.enable_kv_cache_reuse {
            return;
        }
        let bs = self.config.block_size;
        let seq = &mut self.running[idx];
        let full = seq.num_computed / bs;
        if full <= seq.registered {
            return;
        }
        seq.block_hashes(bs);
        let end = full.min(seq.hashes.len());
        for j in seq.registered..end {
            if seq.blocks[j] != DROPPED {
                self.blocks.register(seq.blocks[j], seq.hashes[j]);
            }
        }
        seq.registered = end;
    }

    /// Forgets every cached prefix (the engine's cache was lost with it): blocks no
    /// sequence holds become free.
    pub fn clear_prefix_cache(&mut self) {
        self.blocks.clear_cache();
        self.blocks.take_evicted();
        self.host_blocks.clear_cache();
        for seq in &mut self.running {
            seq.registered = 0;
        }
    }

    /// Known tokens of admitted sequences since start, and those found in the prefix
    /// cache (computed by an earlier sequence, not again).
    pub fn prefix_cache_tokens(&self) -> (u64, u64) {
        (self.prefix_queried, self.prefix_hits)
    }

    /// Blocks registered in the prefix cache now (held by sequences or reclaimable).
    pub fn num_cached_blocks(&self) -> usize {
        self.blocks.num_cached()
    }

    /// Blocks of the prefix cache's host tier now.
    pub fn num_host_cached_blocks(&self) -> usize {
        self.host_blocks.num_cached()
    }

    /// Cached blocks copied to the host tier, and back on a hit, since start.
    pub fn num_blocks_offloaded(&self) -> (u64, u64) {
        (self.blocks_offloaded, self.blocks_onloaded)
    }

    /// Forgets running sequence `idx`'s chunk planned ahead (stale: the token it computes
    /// was lost). A block taken for it stays with the sequence (its table only grows, as
    /// the engine's does): the recomputed token lands in it.
    fn drop_ahead(&mut self, idx: usize) {
        self.running[idx].ahead = None;
    }

    /// Drops a waiting or running sequence and frees its blocks now; engines hear of
    /// it in the next batch's `cancelled`. Returns false for an unknown id.
    pub fn cancel(&mut self, id: u64) -> bool {
        if let Some(idx) = self.waiting.iter().position(|s| s.id == id) {
            let seq = self.waiting.remove(idx).expect("index from position");
            self.blocks.free(&seq.blocks);
        } else if let Some(idx) = self.swapped.iter().position(|s| s.id == id) {
            let seq = self.swapped.remove(idx).expect("index from position");
            self.host_blocks.free(&seq.blocks);
        } else if let Some(idx) = self.running.iter().position(|s| s.id == id) {
            self.finish(idx);
        } else {
            return false;
        }
        self.live.remove(&id);
        self.cancelled.push(id);
        true
    }

    /// Removes running sequence `idx` and frees its blocks.
    fn finish(&mut self, idx: usize) {
        let seq = self.running.remove(idx);
        self.blocks.free(&seq.blocks);
        self.live.remove(&seq.id);
    }

    /// Sequences waiting to run: new ones, those preempted by recompute, and those
    /// swapped out.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.swapped.len()
    }

    /// Sequences swapped out to the host cache now.
    pub fn num_swapped(&self) -> usize {
        self.swapped.len()
    }

    /// Sequences admitted and not finished (holding device blocks).
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Free blocks of the device KV cache.
    pub fn num_free_blocks(&self) -> usize {
        self.blocks.num_free()
    }

    /// Blocks of the device KV cache.
    pub fn num_total_blocks(&self) -> usize {
        self.blocks.num_total()
    }

    /// Blocks of the device KV cache held by sequences.
    pub fn num_used_blocks(&self) -> usize {
        self.blocks.num_total() - self.blocks.num_free()
    }

    /// Preemptions by recompute since start.
    pub fn num_preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Computed tokens discarded by preemption since start: the prefill work recompute
    /// repeats.
    pub fn num_preempted_tokens(&self) -> u64 {
        self.preempted_tokens
    }

    /// Sequences computed again with LongRoPE's long factors since start (a decode
    /// crossed the original context).
    pub fn num_long_rope_restarts(&self) -> u64 {
        self.long_rope_restarts
    }

    /// Preemptions by swapping since start.
    pub fn num_swap_outs(&self) -> u64 {
        self.swap_outs
    }

    /// Blocks copied to the host cache, and back, since start.
    pub fn num_blocks_swapped(&self) -> (u64, u64) {
        (self.blocks_swapped_out, self.blocks_swapped_in)
    }

    /// The iteration number of the last batch (0 before the first `schedule`).
    pub fn iteration(&self) -> u64 {
        self.iteration
    }

    /// Counts of the last batch: context vs generation requests and tokens; all 0 (but the
    /// iteration) once nothing is waiting or running, so gauges read 0 when idle.
    pub fn last_stats(&self) -> IterationStats {
        if self.running.is_empty() && self.waiting.is_empty() && self.swapped.is_empty() {
            return IterationStats {
                iteration: self.last_stats.iteration,
                ..IterationStats::default()
            };
        }
        self.last_stats
    }

    /// Whether `schedule` has anything to do or report.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty()
            || !self.swapped.is_empty()
            || !self.running.is_empty()
            || !self.cancelled.is_empty()
    }

    /// The limits it runs with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }
}
