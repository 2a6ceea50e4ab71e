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
    pub compute: Duration,
    /// Waits between back-to-back iterations, and how many there were.
    pub wait: Duration,
    pub waits: u64,
}

impl EngineTime {
    pub fn add(&mut self, t: StepTiming) {
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
    pub waiting: usize,
    pub running: usize,
    pub free_blocks: usize,
    pub total_blocks: usize,
    pub block_size: usize,
    pub iteration: u64,
    pub max_batch_size: usize,
    pub context_requests: usize,
    pub context_tokens: usize,
    pub generation_requests: usize,
    pub active_requests: usize,
    /// Preemptions by recompute since start.
    pub preemptions: u64,
    /// Computed tokens those preemptions discarded, to be computed again.
    pub preempted_tokens: u64,
    /// Preemptions by swapping since start, and the KV blocks copied out to the host
    /// cache and back in.
    pub swap_outs: u64,
    pub blocks_swapped_out: u64,
    pub blocks_swapped_in: u64,
    /// Iterations planned while the one before them ran (overlap), since start.
    pub planned_ahead: u64,
    pub ready: bool,
    /// Engine time since start.
    pub engine_time: EngineTime,
}
