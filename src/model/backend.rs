//! The seam between the Engine actor and a device: [`ForwardPass`] is one model plus its
//! KV cache on one device, running a batch of [`SeqChunk`]s; [`Backend`] says how to build
//! one (again, with a fresh cache, when the supervisor restarts a failed engine).
//! [`CpuForward`] is the CPU implementation. [`ForwardPass::forward_hidden`] returns
//! final hidden states instead of logits, for embeddings.
//!
//! A forward pass may also choose tokens itself ([`ForwardPass::forward_choose`]): the GPU
//! samples each row on the device from its [`RowPlan`], so only token ids and
//! log-probabilities come back. The default runs the plans on the host (`RowPlan::choose`,
//! the CPU twin of the device kernel).
//!
//! Such a forward pass also runs steps planned ahead ([`ForwardPass::launch_step`],
//! [`ForwardPass::finish_step`]): a step is launched before the previous one's tokens are
//! back on the host, its chunks of a pending token take that token from the previous
//! step's result on the device, and the device never waits for the host in between.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::fault::Fault;
use super::kv_cache::KvCache;
use super::llama::{Llama, SeqChunk};
use crate::error::{Error, Result};
use crate::sampling::{RowChoice, RowPlan};
use crate::scheduler::BlockCopy;

/// One chunk's result from [`ForwardPass::forward_choose`].
#[derive(Debug, Clone, PartialEq)]
pub enum RowsOut {
    /// Row-major logits `[rows, vocab]` (a chunk given no plans).
    Logits(Vec<f32>),
    /// One choice per row, made with that row's plan.
    Chosen(Vec<RowChoice>),
}

/// One model and its paged KV cache on one device.
pub trait ForwardPass: Send + 'static {
    /// Runs every chunk's new tokens through the model, writing their K/V into this
    /// engine's cache; returns, per chunk, row-major logits `[rows, vocab]` for its last
    /// `logits` new tokens.
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>>;

    /// [`forward`](Self::forward), returning per chunk the final hidden states (after the
    /// final norm, fp32) of its last `logits` new tokens, `[rows, hidden_size]`, instead of
    /// their logits: what an embedding pools. It may run while a launched step awaits its
    /// [`finish_step`](Self::finish_step), whose results it leaves as they are.
    fn forward_hidden(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>>;

    /// Arranges for `fault` (not [`Fault::Panic`], which the engine raises itself) to
    /// strike the device work that comes next ([`Fault`]). Only a device engine can.
    fn inject_fault(&mut self, fault: Fault) -> Result<()> {
        Err(Error::InvalidRequest(format!(
            "this engine cannot meet the {fault} fault: only the GPU engine can"
        )))
    }

    /// Whether the Engine should sample through [`forward_choose`](Self::forward_choose)
    /// (keeping the sequences' sampling state itself) instead of handing logits to the
    /// Sampler actor.
    fn samples(&self) -> bool {
        false
    }

    /// [`forward`](Self::forward), except that a chunk with plans (one per logits row)
    /// gets each row's token chosen with its plan instead of its logits.
    fn forward_choose(
        &mut self,
        chunks: &[SeqChunk<'_>],
        plans: &[Vec<RowPlan>],
    ) -> Result<Vec<RowsOut>> {
        let logits = self.forward(chunks)?;
        Ok(logits
            .into_iter()
            .zip(plans)
            .map(|(mut rows, plans)| choose_on_host(&mut rows, plans))
            .collect())
    }

    /// Starts [`forward_choose`](Self::forward_choose) on a batch whose results
    /// [`finish_step`](Self::finish_step) returns later. `pending[i] = Some(r)`: chunk `i`
    /// is one token that the host does not know yet, the choice of logits row `r` (rows
    /// in chunk order) of the step launched before this one. At most one launched step
    /// awaits its `finish_step` when the next is launched. Only for passes that
    /// [`samples`](Self::samples).
    fn launch_step(
        &mut self,
        _chunks: &[SeqChunk<'_>],
        _plans: &[Vec<RowPlan>],
        _pending: &[Option<usize>],
    ) -> Result<()> {
        Err(Error::Model("this engine does not run steps ahead".into()))
    }

    /// Copies KV blocks between this pass's cache and its host cache, in order, before
    /// the next forward pass reads or writes them (preemption by swapping).
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()>;

    /// The results of the oldest launched step, and how long the device sat idle before it
    /// (between the previous step's end and its start; None where that is not measured).
    fn finish_step(&mut self) -> Result<(Vec<RowsOut>, Option<Duration>)> {
        Err(Error::Model("no step was launched".into()))
    }
}

/// Steps planned ahead on the host: each is computed when launched and kept until
/// finished; a pending token is read from the previous step's kept choices.
#[derive(Default)]
struct HostSteps {
    /// Each launched step's result, and its logits rows per chunk.
    results: VecDeque<(Vec<RowsOut>, Vec<usize>)>,
}

impl HostSteps {
    /// Runs `forward_choose` on the chunks, pending tokens filled in, and keeps the result.
    fn launch(
        &mut self,
        pass: &mut dyn ForwardPass,
        chunks: &[SeqChunk<'_>],
        plans: &[Vec<RowPlan>],
        pending: &[Option<usize>],
    ) -> Result<()> {
        if self.results.len() > 1 {
            return Err(Error::Model("two launched steps are not finished".into()));
        }
        // The last step's choice at each of its logits rows (chunks without plans
        // chose nothing: 0 stands in for their rows).
        let chosen: Vec<u32> = match self.results.back() {
            Some((prev, rows)) => prev
                .iter()
                .zip(rows)
                .flat_map(|(out, &rows)| match out {
                    RowsOut::Chosen(c) => c.iter().map(|c| c.token.unwrap_or(0)).collect(),
                    RowsOut::Logits(_) => vec![0; rows],
                })
                .collect(),
            None => Vec::new(),
        };
        let resolved: Vec<[u32; 1]> = pending
            .iter()
            .map(|p| match p {
                Some(r) => chosen.get(*r).map(|&t| [t]).ok_or_else(|| {
                    Error::Model(format!("no chosen token at row {r} of the last step"))
                }),
                None => Ok([0]),
            })
            .collect::<Result<_>>()?;
        let chunks: Vec<SeqChunk<'_>> = chunks
            .iter()
            .zip(pending)
            .zip(&resolved)
            .map(|((c, p), t)| match p {
                Some(_) => SeqChunk { tokens: t, ..*c },
                None => *c,
            })
            .collect();
        let out = pass.forward_choose(&chunks, plans)?;
        let rows = chunks
            .iter()
            .map(|c| c.logits.min(c.tokens.len()))
            .collect();
        self.results.push_back((out, rows));
        Ok(())
    }

    fn finish(&mut self) -> Result<(Vec<RowsOut>, Option<Duration>)> {
        let (out, _) = self
            .results
            .pop_front()
            .ok_or_else(|| Error::Model("no step was launched".into()))?;
        Ok((out, None))
    }
}

/// A chunk's rows chosen with their plans on the host (its logits when it has none).
pub(crate) fn choose_on_host(rows: &mut Vec<f32>, plans: &[RowPlan]) -> RowsOut {
    if plans.is_empty() {
        return RowsOut::Logits(std::mem::take(rows));
    }
    let vocab = rows.len() / plans.len();
    RowsOut::Chosen(
        plans
            .iter()
            .zip(rows.chunks_exact_mut(vocab.max(1)))
            .map(|(plan, row)| plan.choose(row))
            .collect(),
    )
}

/// Builds a [`ForwardPass`] with an empty cache of `num_blocks` blocks of `block_size`
/// tokens, and a host cache of `num_host_blocks` such blocks.
pub trait Backend: Send + Sync + 'static {
    /// A new forward pass with empty device and host caches of these sizes.
    fn start(
        &self,
        block_size: usize,
        num_blocks: usize,
        num_host_blocks: usize,
    ) -> Result<Box<dyn ForwardPass>>;

    /// Whether the passes it starts choose tokens themselves ([`ForwardPass::samples`]),
    /// and so run steps planned ahead.
    fn samples(&self) -> bool {
        false
    }

    /// Whether the device still runs work (the GPU: its context answers a synchronize; a
    /// sticky error fails it). The supervisor recovers the device of an engine group one
    /// of whose engines failed, whatever the failure, when a backend is not healthy.
    fn healthy(&self) -> bool {
        true
    }

    /// After an engine failed on a device error, with every forward pass it started
    /// stopped: lets go of everything it holds on the device (the GPU engine: its weights
    /// and its hold on the device's context). An error when the device cannot serve this
    /// process again (a sticky CUDA error). The supervisor releases every backend of an
    /// engine group before it restores any, as they may share one device. The CPU has
    /// nothing to let go of.
    fn release(&self) -> Result<()> {
        Ok(())
    }

    /// After [`release`](Self::release): a fresh context on the device and the weights
    /// loaded onto it again, so that [`start`](Self::start) serves. An error means the
    /// device cannot serve this model again in this process.
    fn restore(&self) -> Result<()> {
        Ok(())
    }
}

/// The CPU engine: the shared model and a KV cache of its own.
pub(crate) struct CpuForward {
    model: Arc<Llama>,
    cache: KvCache,
    /// Where preempted sequences' blocks are swapped out to.
    host: KvCache,
    samples: bool,
    steps: HostSteps,
}

impl ForwardPass for CpuForward {
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>> {
        self.model.forward(chunks, &mut self.cache)
    }

    fn forward_hidden(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>> {
        self.model.forward_hidden(chunks, &mut self.cache)
    }

    fn samples(&self) -> bool {
        self.samples
    }

    fn launch_step(
        &mut self,
        chunks: &[SeqChunk<'_>],
        plans: &[Vec<RowPlan>],
        pending: &[Option<usize>],
    ) -> Result<()> {
        let mut steps = std::mem::take(&mut self.steps);
        let launched = steps.launch(self, chunks, plans, pending);
        self.steps = steps;
        launched
    }

    fn finish_step(&mut self) -> Result<(Vec<RowsOut>, Option<Duration>)> {
        self.steps.finish()
    }

    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        for c in copies {
            let (d, h) = (c.device as usize, c.host as usize);
            if c.to_host {
                self.host.copy_block(h, &self.cache, d)?;
            } else {
                self.cache.copy_block(d, &self.host, h)?;
            }
        }
        Ok(())
    }
}

/// Starts CPU engines for one model (the weights are shared between restarts).
pub struct CpuBackend {
    model: Arc<Llama>,
    samples: bool,
}

impl CpuBackend {
    /// Engines that hand their logits to the Sampler actor.
    pub fn new(model: Arc<Llama>) -> Self {
        CpuBackend {
            model,
            samples: false,
        }
    }

    /// Engines that sample inside the Engine actor, with plans run on the host: the path
    /// a GPU engine takes, on the CPU (tests check it against the Sampler actor's).
    pub fn sampling_in_engine(model: Arc<Llama>) -> Self {
        CpuBackend {
            model,
            samples: true,
        }
    }
}

impl Backend for CpuBackend {
    fn start(
        &self,
        block_size: usize,
        num_blocks: usize,
        num_host_blocks: usize,
    ) -> Result<Box<dyn ForwardPass>> {
        let cache = KvCache::new(self.model.config(), block_size, num_blocks);
        let host = KvCache::new(self.model.config(), block_size, num_host_blocks);
        Ok(Box::new(CpuForward {
            model: self.model.clone(),
            cache,
            host,
            samples: self.samples,
            steps: HostSteps::default(),
        }))
    }

    fn samples(&self) -> bool {
        self.samples
    }
}
