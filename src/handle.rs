//! The library API: [`ModelHandle::spawn`] builds one model's actor tree inside the
//! caller's tokio runtime; [`ModelHandle::submit`] turns a [`Request`] into a
//! [`ResponseStream`] of [`Chunk`]s; dropping the stream, [`ModelHandle::cancel`] or
//! `stop_after_ms` cancel it; [`ModelHandle::shutdown`] drains and stops the tree.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use ractor::{call, Actor, ActorRef};
use tokio::sync::{mpsc, watch};

use crate::actors::messages::{
    CancelReason, PostprocessMsg, PreprocessMsg, SchedulerMsg, SchedulerStats, SubmitError,
};
use crate::actors::supervisor::{ModelSupervisor, SupervisorArgs, SupervisorMsg, TreeRefs};
use crate::error::{Error, Result};
use crate::model::device::Device;
use crate::model::{Backend, CpuBackend, Fault, KvCache, LoadedModel, ModelConfig, Pooling};
use crate::request::{Chunk, FinishReason, Request, RequestId};
use crate::scheduler::SchedulerConfig;
use crate::speculative::{DraftSource, SpeculativeOptions};
use crate::tokenizer::Tokenizer;

/// How to run a model.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// Scheduler limits; `num_blocks` is the KV cache size in blocks.
    pub scheduler: SchedulerConfig,
    /// Preprocess actors (tokenizing and validating requests); 0 runs one.
    pub preprocess_workers: usize,
    /// Postprocess actors (detokenizing and streaming outputs); 0 runs one.
    pub postprocess_workers: usize,
    /// Speculative decoding (a draft source and its default draft length), or None.
    pub speculative: Option<SpeculativeOptions>,
    /// The device [`ModelHandle::spawn`] runs the engine on.
    pub device: Device,
    /// How embeddings pool the prompt's final hidden states ([`ModelHandle::pooling`]).
    pub pooling: Pooling,
}

impl ModelOptions {
    /// Defaults for `config`: a KV cache of `kv_tokens` tokens, the model's context, and the
    /// device named by `$INFLIGHT_DEVICE` (cpu when unset).
    pub fn for_model(config: &ModelConfig, kv_tokens: usize) -> Self {
        let scheduler = SchedulerConfig {
            num_blocks: kv_tokens.div_ceil(32).max(1),
            block_size: 32,
            max_seq_len: config.max_position_embeddings,
            ..SchedulerConfig::default()
        };
        ModelOptions {
            scheduler,
            preprocess_workers: 2,
            postprocess_workers: 2,
            speculative: None,
            device: Device::from_env(),
            pooling: Pooling::default(),
        }
    }

    /// Bytes the KV cache will take.
    pub fn kv_cache_bytes(&self, config: &ModelConfig) -> usize {
        KvCache::bytes_per_token(config) * self.scheduler.num_blocks * self.scheduler.block_size
    }
}

/// The GPU engine for `model` and the bytes its KV cache takes.
#[cfg(feature = "cuda")]
fn gpu_backend(
    model: &crate::model::Llama,
    ordinal: usize,
    options: &ModelOptions,
) -> Result<(Arc<dyn Backend>, usize)> {
    use crate::model::gpu::{CudaBackend, CudaModel};
    let gpu = CudaModel::load(model, ordinal)?;
    let s = &options.scheduler;
    let bytes = gpu.kv_bytes_per_token() * s.num_blocks * s.block_size;
    Ok((Arc::new(CudaBackend::new(gpu, None)), bytes))
}

#[cfg(not(feature = "cuda"))]
fn gpu_backend(
    _: &crate::model::Llama,
    _: usize,
    _: &ModelOptions,
) -> Result<(Arc<dyn Backend>, usize)> {
    Err(Error::Config(
        "this build has no GPU engine: build with `--features cuda`".into(),
    ))
}

struct Inner {
    name: String,
    device: Device,
    pooling: Pooling,
    kv_cache_bytes: usize,
    config: ModelConfig,
    tokenizer: Arc<Tokenizer>,
    supervisor: ActorRef<SupervisorMsg>,
    refs: TreeRefs,
    ready: watch::Receiver<bool>,
    /// Why the model's device could not be recovered, once that happened.
    lost: watch::Receiver<Option<String>>,
    accepting: AtomicBool,
    next_rid: AtomicU64,
    round_robin: AtomicUsize,
}

/// A running model: cheap to clone, safe to share across tasks.
#[derive(Clone)]
pub struct ModelHandle {
    inner: Arc<Inner>,
}

/// Two handles are equal when they are handles of the same actor tree.
impl PartialEq for ModelHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl ModelHandle {
    /// Spawns the actor tree for `model` on `options.device` in the current tokio runtime.
    pub async fn spawn(model: LoadedModel, options: ModelOptions) -> Result<Self> {
        let config = model.model.config().clone();
        let (backend, kv_cache_bytes) = match options.device {
            Device::Cpu => {
                let bytes = options.kv_cache_bytes(&config);
                let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new(Arc::new(model.model)));
                (cpu, bytes)
            }
            Device::Cuda(ordinal) => gpu_backend(&model.model, ordinal, &options)?,
        };
        Self::spawn_with_backend(
            model.name,
            config,
            model.tokenizer,
            backend,
            kv_cache_bytes,
            options,
        )
        .await
    }

    /// Spawns the actor tree for a model whose engines `backend` starts (the CPU engine,
    /// or the GPU one with feature `cuda`); `kv_cache_bytes` is what its cache takes.
    pub async fn spawn_with_backend(
        name: String,
        config: ModelConfig,
        tokenizer: Tokenizer,
        backend: Arc<dyn Backend>,
        kv_cache_bytes: usize,
        mut options: ModelOptions,
    ) -> Result<Self> {
        // The model's, whatever the options say: the logits depend on it.
        options.scheduler.long_rope_from = config.long_rope_from();
        options
            .scheduler
            .validate()
            .map_err(|e| Error::Model(format!("scheduler configuration: {e}")))?;
        if let Some(SpeculativeOptions {
            draft: DraftSource::Model { vocab_size, .. },
            ..
        }) = &options.speculative
        {
            if *vocab_size != config.vocab_size {
                return Err(Error::Model(format!(
                    "the draft model's vocabulary has {vocab_size} tokens, the target's {}",
                    config.vocab_size
                )));
            }
        }
        let tokenizer = Arc::new(tokenizer);
        let device = options.device;
        let pooling = options.pooling;
        let (ready_tx, ready) = watch::channel(false);
        let (lost_tx, lost) = watch::channel(None);
        let args = SupervisorArgs {
            config: config.clone(),
            backend,
            speculative: options.speculative,
            tokenizer: tokenizer.clone(),
            scheduler: options.scheduler,
            preprocess_workers: options.preprocess_workers,
            postprocess_workers: options.postprocess_workers,
            ready: ready_tx,
            lost: lost_tx,
        };
        let (supervisor, _) = Actor::spawn(None, ModelSupervisor, args)
            .await
            .map_err(|e| Error::Model(format!("starting the model's actors: {e}")))?;
        let refs = call!(supervisor, SupervisorMsg::Refs)
            .map_err(|e| Error::Model(format!("model actors: {e}")))?;
        Ok(ModelHandle {
            inner: Arc::new(Inner {
                name,
                device,
                pooling,
                kv_cache_bytes,
                config,
                tokenizer,
                supervisor,
                refs,
                ready,
                lost,
                accepting: AtomicBool::new(true),
                next_rid: AtomicU64::new(1),
                round_robin: AtomicUsize::new(0),
            }),
        })
    }

    /// The name the model is served under.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.inner.config
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// The device the engine runs on.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// How an embedding request (`GenerationParams::embedding`) pools the prompt's final
    /// hidden states, as configured for this model.
    pub fn pooling(&self) -> Pooling {
        self.inner.pooling
    }

    /// Bytes the engine's KV cache takes.
    pub fn kv_cache_bytes(&self) -> usize {
        self.inner.kv_cache_bytes
    }

    /// The model can take requests (its engine is up and it is not shutting down).
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow() && self.inner.accepting.load(Ordering::Relaxed)
    }

    /// Queues a request; its answer arrives on the returned stream.
    pub async fn submit(&self, request: Request) -> Result<ResponseStream, SubmitError> {
        let inner = &self.inner;
        if !inner.accepting.load(Ordering::Relaxed) {
            return Err(SubmitError::Unavailable(
                "the server is shutting down".into(),
            ));
        }
        if !*inner.ready.borrow() {
            return Err(SubmitError::Unavailable("the model is not ready".into()));
        }
        let rid = inner.next_rid.fetch_add(1, Ordering::Relaxed);
        let id = request.id.clone().unwrap_or_else(|| format!("req-{rid}"));
        // Each prompt's `n` sequences answer apart (`batch_index` `prompt * n + j`).
        let answers = request.prompts.len() * request.params.n.max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = &inner.refs.preprocess
            [inner.round_robin.fetch_add(1, Ordering::Relaxed) % inner.refs.preprocess.len()];
        let submitted = call!(worker, |reply| PreprocessMsg::Submit {
            rid,
            request: id.clone(),
            prompts: request.prompts,
            params: request.params,
            stream: tx,
            reply,
        });
        let prompt_tokens = submitted
            .map_err(|e| SubmitError::Unavailable(format!("the model is not running: {e}")))??;
        Ok(ResponseStream {
            id,
            rid,
            prompt_tokens,
            rx,
            scheduler: inner.refs.scheduler.clone(),
            open: vec![true; answers],
            cancelled_on_drop: true,
        })
    }

    /// Cancels a request by id (a no-op when it already ended).
    pub fn cancel(&self, id: &str) {
        let _ = self.inner.refs.scheduler.cast(SchedulerMsg::Cancel {
            request: id.to_string(),
            rid: None,
            reason: CancelReason::Stopped,
        });
    }

    /// Queue, batch and KV block counts.
    pub async fn stats(&self) -> Result<SchedulerStats> {
        call!(self.inner.refs.scheduler, SchedulerMsg::Stats)
            .map_err(|e| Error::Model(format!("scheduler: {e}")))
    }

    /// Stops admitting, waits up to `timeout` for running requests, then stops the tree.
    pub async fn shutdown(&self, timeout: Duration) {
        self.inner.accepting.store(false, Ordering::Relaxed);
        let drained = ractor::call_t!(
            self.inner.refs.scheduler,
            SchedulerMsg::Drain,
            timeout.as_millis() as u64
        );
        if drained.is_err() {
            tracing::warn!(model = %self.inner.name, "shutdown: requests still running after {timeout:?}; stopping anyway");
        }
        // The scheduler's last outputs may still be on their way through Postprocess: a
        // round trip through each worker delivers them before the tree stops.
        for worker in &self.inner.refs.postprocess {
            let _ = ractor::call_t!(worker, PostprocessMsg::Flush, 2000);
        }
        self.inner.supervisor.stop(Some("shutdown".into()));
    }

    /// Test hook: the engine panics at its next step.
    #[doc(hidden)]
    pub fn inject_engine_fault(&self) {
        self.inject_fault(Fault::Panic);
    }

    /// Fault injection: the engine meets `fault` at its next step, and the model fails and
    /// recovers as it would on a real one (`--fault-injection` serves it over HTTP).
    pub fn inject_fault(&self, fault: Fault) {
        let _ = self
            .inner
            .supervisor
            .cast(SupervisorMsg::InjectFault(fault));
    }

    /// Why the model's device could not be recovered (the model has stopped for good), or
    /// None while it can serve.
    pub fn lost(&self) -> Option<String> {
        self.inner.lost.borrow().clone()
    }
}

/// The chunks of one request, in order; ends after the last prompt's final chunk.
/// Dropping it before the end cancels the request.
pub struct ResponseStream {
    id: RequestId,
    /// The request's unique key (ids can be reused once a request ends).
    rid: u64,
    rx: mpsc::UnboundedReceiver<Chunk>,
    /// Each prompt's token count (by batch_index).
    prompt_tokens: Vec<usize>,
    scheduler: ActorRef<SchedulerMsg>,
    /// Answers (by batch_index: `n` per prompt) whose final chunk has not arrived.
    open: Vec<bool>,
    cancelled_on_drop: bool,
}

impl ResponseStream {
    /// The request's id: its own, or the `req-N` one it was given.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Each prompt's token count (by batch_index), known from submission: a request whose
    /// answer comes in one chunk at the end knows it before any chunk.
    pub fn prompt_tokens(&self) -> &[usize] {
        &self.prompt_tokens
    }

    /// How many answers the stream carries: the prompts times `n`.
    pub fn answers(&self) -> usize {
        self.open.len()
    }
}

impl Stream for ResponseStream {
    type Item = Chunk;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Chunk>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(chunk)) => {
                if chunk.is_final() {
                    if let Some(o) = self.open.get_mut(chunk.batch_index) {
                        *o = false;
                    }
                }
                Poll::Ready(Some(chunk))
            }
            Poll::Ready(None) => {
                // The pipeline closed the stream early: say so once per unfinished prompt.
                match self.open.iter().position(|&o| o) {
                    Some(i) => {
                        self.open[i] = false;
                        Poll::Ready(Some(Chunk {
                            batch_index: i,
                            finish_reason: Some(FinishReason::Error),
                            error: Some("the model stopped before the request finished".into()),
                            ..Chunk::default()
                        }))
                    }
                    None => {
                        self.cancelled_on_drop = false;
                        Poll::Ready(None)
                    }
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for ResponseStream {
    fn drop(&mut self) {
        if self.cancelled_on_drop && self.open.iter().any(|&o| o) {
            let _ = self.scheduler.cast(SchedulerMsg::Cancel {
                request: self.id.clone(),
                rid: Some(self.rid),
                reason: CancelReason::Disconnected,
            });
        }
    }
}
