//! Every message the actors of one model tree exchange. One iteration travels as whole
//! batches: Scheduler → Engine (`Step`) → Sampler (`Sample`) → Scheduler (`StepDone`) →
//! Postprocess (`Emit`); an engine that samples on its device (the GPU) answers the
//! Scheduler itself. Fan-out to per-request streams happens only in Postprocess.

use std::sync::Arc;

use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::mpsc::UnboundedSender;

use crate::request::{Chunk, GenerationParams, Prompt, RequestId, TokenLogprob};
use crate::sampling::{Hypothesis, RowChoice};
pub use crate::scheduler::SchedulerStats;
use crate::scheduler::{AddError, BeamFork, BlockCopy, FinishReason as SeqFinish, StepOutput};
pub(crate) use crate::scheduler::{Draft, EngineTime, KeptRows, SeqId, StepSeq, StepTiming};

/// One sequence as the pipeline first learns of it.
#[derive(Debug, Clone)]
pub(crate) struct SeqInit {
    pub seq: SeqId,
    /// Its request's numeric key (routes it to one Postprocess worker).
    pub rid: u64,
    pub request: RequestId,
    pub batch_index: usize,
    pub prompt: Vec<u32>,
    pub params: Arc<GenerationParams>,
    /// Beam search: its search's first sequence, whose stream carries the search's answer
    /// (the search's own id for that one); None without beam search.
    pub beam_of: Option<SeqId>,
}

/// Why a request is being cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelReason {
    /// A stop request or an explicit cancel from the library.
    Stopped,
    /// `stop_after_ms` elapsed.
    Timeout,
    /// The client went away (its stream was dropped).
    Disconnected,
}

pub(crate) enum PreprocessMsg {
    /// Tokenize and validate a request, open its output stream, queue its sequences.
    Submit {
        rid: u64,
        request: RequestId,
        prompts: Vec<Prompt>,
        params: GenerationParams,
        stream: UnboundedSender<Chunk>,
        /// Each prompt's token count once it is queued.
        reply: RpcReplyPort<Result<Vec<usize>, SubmitError>>,
    },
}

/// Why a request was not accepted; the HTTP layer maps each to a status.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum SubmitError {
    /// Malformed or impossible request (400).
    #[error("{0}")]
    Invalid(String),
    /// The queue is full (503).
    #[error("{0}")]
    QueueFull(String),
    /// The model is not ready or is shutting down (503).
    #[error("{0}")]
    Unavailable(String),
    /// A request with this id is already running (400).
    #[error("request id {0:?} is already in use")]
    DuplicateId(String),
}

impl From<AddError> for SubmitError {
    fn from(e: AddError) -> Self {
        match e {
            AddError::QueueFull { .. } | AddError::QueueTokensFull { .. } => {
                SubmitError::QueueFull(e.to_string())
            }
            other => SubmitError::Invalid(other.to_string()),
        }
    }
}

pub(crate) enum SchedulerMsg {
    /// Queue every sequence of one request, or none of them.
    Enqueue {
        seqs: Vec<SeqInit>,
        reply: RpcReplyPort<Result<(), SubmitError>>,
    },
    /// Drop a request's sequences and free their blocks this iteration. With `rid`, only
    /// if the request with this id is still that one (a timer must not cancel a later
    /// request that reuses the id).
    Cancel {
        request: RequestId,
        rid: Option<u64>,
        reason: CancelReason,
    },
    /// A stop string completed this sequence's answer: stop generating it.
    EndSeq(SeqId),
    /// The sampled tokens of one batch; `sampled` lines up with `output.tokens`.
    /// `prompt`: the prompt tokens the batch scored (`prompt_log_probs`).
    StepDone {
        iteration: u64,
        output: StepOutput,
        sampled: Vec<SeqSampled>,
        /// The embeddings of the sequences that generate nothing whose prompt this batch
        /// finished computing.
        pooled: Vec<Pooled>,
        prompt: Vec<PromptScores>,
        timing: StepTiming,
    },
    /// The engine died: fail the requests whose KV state it held.
    EngineFailed { error: String },
    /// A (re)started engine is ready for work.
    EngineReady(ActorRef<EngineMsg>),
    /// Report counts for metrics, health and tests.
    Stats(RpcReplyPort<SchedulerStats>),
    /// Stop admitting; report when nothing is left running.
    Drain(RpcReplyPort<()>),
}

/// One sequence of an engine step that has logits rows: first one per prompt token it
/// scores (`score`, the token each row scores), then, when it samples, the last known
/// token's and one per draft token.
#[derive(Debug, Clone)]
pub(crate) struct SampleRow {
    pub seq: SeqId,
    pub draft: Option<Draft>,
    pub score: Vec<u32>,
    /// Position of the first token `score` names.
    pub score_from: usize,
    pub sample: bool,
    /// Which rows go back whole besides being used ([`StepSeq::kept_rows`]).
    pub keep: KeptRows,
}

/// A chunk's scores of its prompt tokens (`prompt_log_probs`), for Postprocess.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PromptScores {
    pub seq: SeqId,
    /// Position in the prompt of the first token scored.
    pub from: usize,
    /// Each token (`token`, as scored; None when the row allowed none) with its
    /// log-probability and alternatives.
    pub rows: Vec<RowChoice>,
    /// The raw logits rows they were scored from, when `return_context_logits` keeps
    /// them (else empty).
    pub logits: Vec<Vec<f32>>,
}

/// One sequence's embedding (`GenerationParams::pooling`): its prompt's final hidden
/// states pooled and L2-normalized by the engine.
pub(crate) type Pooled = (SeqId, Vec<f32>);

/// What the sampler chose for one sequence in one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SeqSampled {
    /// Log-probability of each emitted token (accepted drafts, then the sampled one).
    pub log_probs: Vec<Option<f32>>,
    /// Alternatives of each emitted token (`top_log_probs`; empty when not asked for).
    pub tops: Vec<Vec<TokenLogprob>>,
    /// Draft tokens proposed and accepted in this step.
    pub drafted: usize,
    pub accepted: usize,
    /// The raw logits row of each emitted token, where kept ([`KeptRows::sampled`]).
    pub logits: Vec<Vec<f32>>,
}

pub(crate) enum EngineMsg {
    /// Run one forward pass over a batch.
    Step {
        iteration: u64,
        seqs: Vec<StepSeq>,
        /// Sequences whose state the engine can drop (finished, cancelled, preempted).
        dropped: Vec<SeqId>,
        /// KV blocks to copy between the device and host caches before this step's
        /// forward pass, in order (preemption by swapping).
        swaps: Vec<BlockCopy>,
        /// Sent in reply to the previous iteration's results (not after idling for work).
        follows: bool,
        /// Where the sampled tokens go.
        reply_to: ActorRef<SchedulerMsg>,
        /// The Scheduler plans ahead (an engine that samples on its device): it follows
        /// this step with the next `Step` (whose pending tokens are this step's) or with
        /// `Finish`, and the engine answers for this step only after launching that one, so
        /// that its device never waits for the host between iterations.
        hold: bool,
    },
    /// Answer for the step held back (`Step::hold`): no step is planned ahead of it.
    Finish,
    /// Run one forward pass and answer with each sequence's `logit_rows()` rows (a draft
    /// model's engine, driven by the speculative orchestrator).
    Forward {
        seqs: Vec<StepSeq>,
        dropped: Vec<SeqId>,
        reply: RpcReplyPort<Vec<Vec<f32>>>,
    },
    /// Fault injection: the next step meets this fault (a panic, or a device error).
    InjectFault(crate::model::Fault),
}

pub(crate) enum SamplerMsg {
    /// Create per-sequence sampling state.
    Register(Vec<SeqInit>),
    /// Sample each row's next token (verifying its draft first, when it has one):
    /// `logits` holds each row's `1 + draft` rows of `vocab` logits, in order.
    Sample {
        iteration: u64,
        rows: Vec<SampleRow>,
        logits: Vec<f32>,
        /// The step's embeddings, passed on with its tokens (`StepDone::pooled`).
        pooled: Vec<Pooled>,
        timing: StepTiming,
        reply_to: ActorRef<SchedulerMsg>,
    },
    /// Drop per-sequence state.
    Drop(Vec<SeqId>),
    /// A beam search's step, applied at once: each slot's state becomes a copy of its
    /// parent's (as it was before this message) with the chosen token recorded.
    Fork(Vec<BeamFork>),
}

/// What happened to one sequence in an iteration, for Postprocess.
#[derive(Debug, Clone)]
pub(crate) enum SeqOutput {
    Token {
        seq: SeqId,
        token: u32,
        log_prob: Option<f32>,
        /// Its alternatives (`top_log_probs`).
        top: Vec<TokenLogprob>,
        /// Set on a sequence's first token: how long it waited to be scheduled.
        queued: Option<std::time::Duration>,
        /// Prompt tokens its first admission found in the prefix cache (on every token).
        cached: usize,
        /// Draft tokens proposed and accepted in the step that produced this token (set on
        /// the first token of the step).
        drafted: usize,
        accepted: usize,
        /// The raw logits row it was drawn from, where kept.
        logits: Option<Vec<f32>>,
    },
    /// Prompt tokens scored (`prompt_log_probs`), from position `from` on; a recomputed
    /// sequence may score some again.
    PromptLogprobs {
        seq: SeqId,
        from: usize,
        rows: Vec<RowChoice>,
        /// Their raw logits rows (`return_context_logits`; else empty).
        logits: Vec<Vec<f32>>,
    },
    Finished {
        seq: SeqId,
        reason: SeqFinish,
        /// The embedding of a sequence that generates nothing.
        embedding: Option<Vec<f32>>,
    },
    Cancelled {
        seq: SeqId,
        // Postprocess answers every cancel with `FinishReason::Cancelled`; the reason is
        // carried for debugging only.
        #[allow(dead_code)]
        reason: CancelReason,
    },
    Failed {
        seq: SeqId,
        error: String,
    },
    /// A beam search's answer so far (`last` set on its last), for its first sequence's
    /// stream: the returned hypotheses, best first.
    Beams {
        seq: SeqId,
        beams: Vec<Hypothesis>,
        last: Option<SeqFinish>,
        /// Set on its first output: how long it waited to be scheduled.
        queued: Option<std::time::Duration>,
        /// Prompt tokens its admission found in the prefix cache.
        cached: usize,
        /// The last prompt position's logits row (`return_context_logits`), on the first.
        context_row: Option<Vec<f32>>,
    },
}

pub(crate) enum PostprocessMsg {
    /// A request's stream and its sequences; sent before any of them is queued.
    Open {
        rid: u64,
        request: RequestId,
        seqs: Vec<SeqInit>,
        prompt_texts: Vec<Option<String>>,
        stream: UnboundedSender<Chunk>,
        /// Where a departed client's cancel goes.
        scheduler: ActorRef<SchedulerMsg>,
    },
    /// Forget a request that was refused after `Open`.
    Discard { rid: u64 },
    /// One iteration's outputs for this worker's requests.
    Emit(Vec<SeqOutput>),
    /// Answers once every output queued before it has been delivered (used to drain).
    Flush(RpcReplyPort<()>),
}
