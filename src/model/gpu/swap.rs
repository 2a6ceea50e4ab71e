//! The GPU engine's host cache for preemption by swapping: page-locked host memory
//! (`[block][layer][k|v][block_size * kv_dim]`) that the copy engine reads and writes over
//! PCIe on a stream of its own, beside the forward pass, which waits for each group of
//! layers' copies by event just before it writes that group's first layer's cache.

use cudarc::driver::{CudaEvent, PinnedHostSlice};

use super::scratch::DeviceKv;
use crate::error::{Error, Result};
use crate::kernels::cuda::swap::{self, SwapCaches};
use crate::kernels::cuda::{cuda_err, Gpu};
use crate::model::config::ModelConfig;
use crate::scheduler::BlockCopy;

/// The host cache (none without host blocks) and the block copies the next pass waits for.
#[derive(Default)]
pub(super) struct HostCache {
    /// The page-locked blocks and their address.
    cache: Option<(PinnedHostSlice<u16>, u64)>,
    blocks: usize,
    /// Recorded before the block copies queued for the next step: that step's work begins
    /// there (the copies are not idle time).
    pub begin: Option<CudaEvent>,
    /// The next step's block copies: each group's first layer and the event recorded on
    /// the copy stream after the group.
    copied: Vec<(usize, CudaEvent)>,
}

impl HostCache {
    /// A host cache of `blocks` blocks shaped as `kv`'s (none for 0).
    pub fn new(g: &Gpu, cfg: &ModelConfig, kv: &DeviceKv, blocks: usize) -> Result<Self> {
        if blocks == 0 {
            return Ok(Self::default());
        }
        let len = blocks * cfg.num_layers * 2 * kv.block_size * cfg.kv_dim();
        let mut host = g.pinned_host::<u16>(len)?;
        let addr = host
            .as_mut_ptr()
            .map_err(cuda_err("addressing the host cache"))? as u64;
        Ok(HostCache {
            cache: Some((host, addr)),
            blocks,
            ..Self::default()
        })
    }

    /// Whether there is a host cache (its memory is freed with the engine).
    pub fn exists(&self) -> bool {
        self.cache.is_some()
    }

    /// Whether block copies are queued that no pass has waited for.
    pub fn pending(&self) -> bool {
        !self.copied.is_empty()
    }

    /// Queues the block copies on the copy stream (the copy engine), after everything
    /// queued so far on the compute stream, in groups of layers (1, 1, 2, 4, ...) with an
    /// event after each. The next forward pass waits for a group's event before it writes
    /// the group's first layer's cache, so the copies run beside the layers before it: a
    /// swapped-out block may be reused in the same step, and a swapped-in one read. Within
    /// each group the copies keep their list order (runs of one direction, in turn, on one
    /// stream): the scheduler plans reads and writes of one block within a batch in order.
    pub fn queue(
        &mut self,
        g: &Gpu,
        cfg: &ModelConfig,
        kv: &DeviceKv,
        copies: &[BlockCopy],
    ) -> Result<()> {
        let Some((_, host)) = self.cache else {
            return Err(Error::Cuda("this engine has no host cache".into()));
        };
        for c in copies {
            if c.device as usize >= kv.num_blocks || c.host as usize >= self.blocks {
                return Err(Error::Cuda(format!(
                    "block copy {} <-> {} out of range",
                    c.device, c.host
                )));
            }
        }
        // Copies no pass has waited for yet are waited for first.
        self.join(g)?;
        let chunk = kv.block_size * cfg.kv_dim();
        let caches = SwapCaches {
            dev: kv.buf.ptr(),
            host,
            planes: cfg.num_layers * 2,
            plane: kv.num_blocks * chunk,
            chunk,
        };
        let ready = g
            .stream
            .record_event(None)
            .map_err(cuda_err("recording an event"))?;
        g.copy_stream
            .wait(&ready)
            .map_err(cuda_err("ordering the block copies"))?;
        let runs: Vec<(Vec<(u32, u32)>, bool)> = copies
            .chunk_by(|a, b| a.to_host == b.to_host)
            .map(|run| {
                (
                    run.iter().map(|c| (c.device, c.host)).collect(),
                    run[0].to_host,
                )
            })
            .collect();
        for layers in layer_groups(cfg.num_layers) {
            for (pairs, to_host) in &runs {
                swap::copy_blocks(
                    &g.copy_stream,
                    &caches,
                    pairs,
                    2 * layers.start..2 * layers.end,
                    *to_host,
                )?;
            }
            let done = g
                .copy_stream
                .record_event(Some(
                    cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
                ))
                .map_err(cuda_err("recording an event"))?;
            self.copied.push((layers.start, done));
        }
        Ok(())
    }

    /// Makes the compute stream wait for the block copies of the group of layers that
    /// begins at layer `l`, if any are queued.
    pub fn wait_layer(&self, g: &Gpu, l: usize) -> Result<()> {
        match self.copied.iter().find(|(first, _)| *first == l) {
            Some((_, done)) => wait_for(g, done),
            None => Ok(()),
        }
    }

    /// Forgets the queued copies once a pass has waited for every group's.
    pub fn waited(&mut self) {
        self.copied.clear();
    }

    /// Makes the compute stream wait for every queued block copy, and forgets them.
    pub fn join(&mut self, g: &Gpu) -> Result<()> {
        for (_, done) in &self.copied {
            wait_for(g, done)?;
        }
        self.copied.clear();
        Ok(())
    }
}

/// Makes the compute stream wait for `done`, recorded on the copy stream.
fn wait_for(g: &Gpu, done: &CudaEvent) -> Result<()> {
    g.stream
        .wait(done)
        .map_err(cuda_err("waiting for block copies"))
}

/// Layers in groups of 1, 1, 2, 4, ... (the last one cut short): block copies are waited
/// for group by group, so the first layers' copies are small and later ones run further
/// ahead of the pass.
fn layer_groups(layers: usize) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut at, mut size) = (0, 1);
    while at < layers {
        let end = (at + size).min(layers);
        groups.push(at..end);
        if at > 0 {
            size *= 2;
        }
        at = end;
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_groups_double_after_the_first_two_and_cover_every_layer() {
        assert_eq!(
            layer_groups(32),
            vec![0..1, 1..2, 2..4, 4..8, 8..16, 16..32]
        );
        assert_eq!(
            layer_groups(30),
            vec![0..1, 1..2, 2..4, 4..8, 8..16, 16..30]
        );
        assert_eq!(layer_groups(1), vec![0..1]);
        assert!(layer_groups(0).is_empty());
    }
}
