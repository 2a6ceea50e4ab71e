//! The seam between the Engine actor and a device: [`ForwardPass`] is one model plus its
//! KV cache on one device, running a batch of [`SeqChunk`]s; [`Backend`] says how to build
//! one (again, with a fresh cache, when the supervisor restarts a failed engine).
//! [`CpuForward`] is the CPU implementation.

use std::sync::Arc;

use super::kv_cache::KvCache;
use super::llama::{Llama, SeqChunk};
use crate::error::Result;

/// One model and its paged KV cache on one device.
pub trait ForwardPass: Send + 'static {
    /// Runs every chunk's new tokens through the model, writing their K/V into this
    /// engine's cache; returns, per chunk, row-major logits `[rows, vocab]` for its last
    /// `logits` new tokens.
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>>;
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
}

impl ForwardPass for CpuForward {
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>> {
        self.model.forward(chunks, &mut self.cache)
    }
}

/// Starts CPU engines for one model (the weights are shared between restarts).
pub struct CpuBackend(pub Arc<Llama>);

impl Backend for CpuBackend {
    fn start(&self, block_size: usize, num_blocks: usize) -> Result<Box<dyn ForwardPass>> {
        let cache = KvCache::new(self.0.config(), block_size, num_blocks);
        Ok(Box::new(CpuForward {
            model: self.0.clone(),
            cache,
        }))
    }
}
