//! The seam between the Engine actor and a device: [`ForwardPass`] is one model plus its
//! KV cache on one device, running a batch of [`SeqChunk`]s; [`Backend`] says how to build
//! one (again, with a fresh cache, when the supervisor restarts a failed engine).
//! [`CpuForward`] is the CPU implementation.
//!
//! A forward pass may also choose tokens itself ([`ForwardPass::forward_choose`]): the GPU
//! samples each row on the device from its [`RowPlan`], so only token ids and
//! log-probabilities come back. The default runs the plans on the host (`RowPlan::choose`,
//! the CPU twin of the device kernel).

use std::sync::Arc;

use super::kv_cache::KvCache;
use super::llama::{Llama, SeqChunk};
use crate::error::Result;
use crate::sampling::{RowChoice, RowPlan};

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
}

/// A chunk's rows chosen with their plans on the host (its logits when it has none).
pub fn choose_on_host(rows: &mut Vec<f32>, plans: &[RowPlan]) -> RowsOut {
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
/// tokens.
pub trait Backend: Send + Sync + 'static {
    fn start(&self, block_size: usize, num_blocks: usize) -> Result<Box<dyn ForwardPass>>;
}

/// The CPU engine: the shared model and a KV cache of its own.
pub struct CpuForward {
    model: Arc<Llama>,
    cache: KvCache,
    samples: bool,
}

impl ForwardPass for CpuForward {
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>> {
        self.model.forward(chunks, &mut self.cache)
    }

    fn samples(&self) -> bool {
        self.samples
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
    fn start(&self, block_size: usize, num_blocks: usize) -> Result<Box<dyn ForwardPass>> {
        let cache = KvCache::new(self.model.config(), block_size, num_blocks);
        Ok(Box::new(CpuForward {
            model: self.model.clone(),
            cache,
            samples: self.samples,
        }))
    }
}
