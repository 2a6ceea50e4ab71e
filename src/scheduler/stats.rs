//! What the scheduler and its engine report about themselves: an iteration's engine time,
//! the totals since start and the scheduler's counts, read by the metrics.

use std::time::Duration;

/// Where one engine iteration's time went, for the pipeline metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTiming {
    /// The forward pass (with sampling, on a device that samples), start to results.
    pub compute: Duration,
    /// For an iteration the Scheduler sent in reply to the previous one's results: the
    /// time since the engine finished that one, during which the device had nothing to
    /// do but wait for the rest of the pipeline (sampling on the host, scheduling,
    /// drafting, messages).
    pub wait: Option<Duration>,
}

/// Engine time summed over every iteration (see `StepTiming`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineTime {
    /// Forward passes (with sampling, on a device that samples), summed.
    pub compute: Duration,
    /// Waits between back-to-back iterations, summed.
    pub wait: Duration,
    /// How many such waits there were.
    pub waits: u64,
}

impl EngineTime {
    pub(crate) fn add(&mut self, t: StepTiming) {
        self.compute += t.compute;
        if let Some(w) = t.wait {
            self.wait += w;
            self.waits += 1;
        }
    }
}

/// What the scheduler reports about itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerStats {
    /// Sequences waiting to run (new, preempted or swapped out).
    pub waiting: usize,
    /// Sequences running.
    pub running: usize,
    /// Free blocks of the device KV cache.
    pub free_blocks: usize,
    /// Blocks of the device KV cache.
    pub total_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// The last iteration's number.
    pub iteration: u64,
    /// The configured `max_batch_size`.
    pub max_batch_size: usize,
    /// Sequences computing prompt (or recomputed) tokens in the last iteration.
    pub context_requests: usize,
    /// Tokens they computed.
    pub context_tokens: usize,
    /// Sequences computing a generated token in the last iteration.
    pub generation_requests: usize,
    /// Requests with a sequence waiting or running.
    pub active_requests: usize,
    /// Preemptions by recompute since start.
    pub preemptions: u64,
    /// Computed tokens those preemptions discarded, to be computed again.
    pub preempted_tokens: u64,
    /// Sequences computed again with LongRoPE's long factors since start.
    pub long_rope_restarts: u64,
    /// Preemptions by swapping since start, and the KV blocks copied out to the host
    /// cache and back in.
    pub swap_outs: u64,
    /// KV blocks copied out to the host cache since start.
    pub blocks_swapped_out: u64,
    /// KV blocks copied back in since start.
    pub blocks_swapped_in: u64,
    /// Iterations planned while the one before them ran (overlap), since start.
    pub planned_ahead: u64,
    /// Known tokens of admitted sequences since start, and those found in the prefix
    /// cache instead of computed.
    pub prefix_queried_tokens: u64,
    /// See `prefix_queried_tokens`.
    pub prefix_hit_tokens: u64,
    /// Blocks registered in the prefix cache now (held by sequences or reclaimable).
    pub cached_blocks: usize,
    /// Blocks of the prefix cache's host tier now.
    pub host_cached_blocks: usize,
    /// Cached blocks copied to the host tier since start (evicted from the device).
    pub blocks_offloaded: u64,
    /// Blocks copied back from the host tier since start (prefix hits found there).
    pub blocks_onloaded: u64,
    /// The scheduler has a running engine.
    pub ready: bool,
    /// Engine time since start.
    pub engine_time: EngineTime,
}
