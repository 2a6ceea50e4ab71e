//! What crosses the scheduler's boundary each iteration: the `Batch` it hands the
//! engines, the `StepOutput` it gets back from the sampler, the `SeqEvent`s it emits
//! for postprocessing, and the per-iteration counts for metrics.

/// One iteration's work. Engines compute `seqs`; they drop any state they keep for
/// `preempted` and `cancelled` ids (unknown ids among them are to be ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Increases by one with every `schedule()` call.
    pub iteration: u64,
    /// The sequences to compute, each with its chunk of tokens.
    pub seqs: Vec<ScheduledSeq>,
    /// Sequences preempted by recompute in this iteration: their blocks are freed
    /// and they will come back with `new` set.
    pub preempted: Vec<u64>,
    /// Sequences cancelled since the previous batch; their blocks are already freed.
    pub cancelled: Vec<u64>,
    /// KV blocks to copy between the device cache and the host cache before this
    /// iteration's forward pass, in order: preempted sequences' blocks going out, resumed
    /// ones' coming back (preemption by swapping).
    pub swaps: Vec<BlockCopy>,
}

impl Batch {
    /// Nothing to compute and nothing to tell the engines.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
            && self.preempted.is_empty()
            && self.cancelled.is_empty()
            && self.swaps.is_empty()
    }

    /// Tokens computed in this iteration, draft tokens included.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len() + s.max_draft).sum()
    }
}

/// One KV block's copy between the device cache and the host cache: every layer's K and
/// V rows of the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    /// The block's id in the device cache.
    pub device: u32,
    /// The block's id in the host cache.
    pub host: u32,
    /// Device to host (a swap out); else host to device (a swap in).
    pub to_host: bool,
}

/// The token of a chunk planned ahead (`Scheduler::schedule_ahead`): the one the
/// sequence's previous iteration samples, which the engine takes from that iteration's
/// result on its device; the host does not know it yet.
pub const PENDING_TOKEN: u32 = u32::MAX;

/// One sequence's share of an iteration: compute `tokens` at positions
/// `start_pos..start_pos + tokens.len()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The sequence's id (its `SeqSpec::id`).
    pub id: u64,
    /// Position of the first token of `tokens` (tokens before it are computed).
    pub start_pos: usize,
    /// Tokens to compute in this iteration.
    pub tokens: Vec<u32>,
    /// The sequence's whole block table; covers `start_pos + tokens.len()` positions.
    pub block_table: Vec<u32>,
    /// This chunk reaches the end of the known tokens: the engine must sample the
    /// next token from its last position.
    pub sample: bool,
    /// First chunk since (re)admission (`start_pos == 0`): an engine that keeps
    /// per-sequence state resets it.
    pub new: bool,
    /// First chunk since the sequence's blocks came back from the host cache: its block
    /// table is all new (its other state is kept).
    pub swapped_in: bool,
    /// Draft tokens that may follow `tokens` in this iteration (speculative decoding):
    /// `block_table` covers them too. 0 unless `sample`.
    pub max_draft: usize,
    /// On the first chunk after an admission that found a prefix in the cache, or after a
    /// beam was forked from another: the known tokens before `start_pos`, whose KV the
    /// shared blocks hold (engines that keep per-sequence state see them here); empty
    /// otherwise.
    pub cached: Vec<u32>,
    /// The known token after `tokens`, when the chunk does not reach the last one (a
    /// chunk that scores its prompt's tokens scores this one on its last row).
    pub next: Option<u32>,
    /// Computed with LongRoPE's long factors (`SchedulerConfig::long_rope_from`), as are
    /// all the sequence's blocks.
    pub long_rope: bool,
}

/// A token the sampler produced for a sequence scheduled with `sample`, after the draft
/// tokens it accepted (speculative decoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampledToken {
    /// The sequence's id.
    pub id: u64,
    /// Draft tokens accepted, in order, before `token` (at most the chunk's `max_draft`).
    pub accepted: Vec<u32>,
    /// The sampled token.
    pub token: u32,
    /// The sampler saw the end id or a stop word: the sequence ends with this token.
    pub stop: bool,
}

/// The result of computing a `Batch`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepOutput {
    /// One entry per sequence that sampled; a sequence scheduled with `sample` that has
    /// none is scheduled again.
    pub tokens: Vec<SampledToken>,
}

/// Why a sequence finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End id or stop word.
    Stop,
    /// max_new_tokens or max_seq_len reached.
    Length,
}

/// What `update` reports, in order, per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqEvent {
    /// A generated token (the stopping token included; postprocessing strips it).
    Token {
        /// The sequence.
        id: u64,
        /// The token.
        token: u32,
    },
    /// The sequence is done; its blocks are already freed.
    Finished {
        /// The sequence.
        id: u64,
        /// Why it ended.
        reason: FinishReason,
    },
    /// A beam's chunk was computed and sampled: its search chooses what comes next
    /// ([`Scheduler::fork_beams`](super::Scheduler::fork_beams)); no token is appended.
    Sampled {
        /// The sequence.
        id: u64,
    },
    /// The sequence was preempted by recompute; it keeps its tokens and resumes later.
    /// (A sequence preempted by swapping reports nothing: engines keep its state.)
    Preempted {
        /// The sequence.
        id: u64,
    },
}

/// Counts for the inflight-batcher metrics of one iteration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IterationStats {
    /// The iteration ([`Batch::iteration`]).
    pub iteration: u64,
    /// Sequences computing prompt (or recomputed) tokens.
    pub num_context_requests: usize,
    /// Tokens those sequences compute.
    pub num_context_tokens: usize,
    /// Sequences computing a generated token.
    pub num_generation_requests: usize,
    /// Tokens those sequences compute.
    pub num_generation_tokens: usize,
    /// Sequences preempted in this iteration, by recompute or by swapping.
    pub num_preempted: usize,
}
