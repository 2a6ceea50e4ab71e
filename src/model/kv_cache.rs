//! The CPU engine's paged KV cache: per layer, K and V stored as
//! `[num_blocks, block_size, kv_heads * head_dim]` in f32 or f16 (the model's
//! `kv_dtype`). Which blocks a sequence owns is the scheduler's business (block tables
//! come in with each forward call).

use half::f16;

use super::config::{KvDtype, ModelConfig};
use crate::kernels::cpu::KvElem;

/// One layer's K or V storage.
pub(crate) enum KvStore {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl KvStore {
    /// Zeroed storage. Zero-filled vectors come from the allocator's zeroed pages, so a
    /// large cache costs memory only as blocks are first written.
    fn new(dtype: KvDtype, len: usize) -> Self {
        use half::vec::HalfBitsVecExt;
        match dtype {
            KvDtype::F32 => KvStore::F32(vec![0.0; len]),
            KvDtype::F16 => KvStore::F16(vec![0u16; len].reinterpret_into()),
        }
    }

    fn write(&mut self, at: usize, values: &[f32]) {
        fn put<T: KvElem>(dst: &mut [T], values: &[f32]) {
            for (d, &v) in dst.iter_mut().zip(values) {
                *d = T::from_f32(v);
            }
        }
        match self {
            KvStore::F32(s) => put(&mut s[at..at + values.len()], values),
            KvStore::F16(s) => put(&mut s[at..at + values.len()], values),
        }
    }
}

/// The CPU engine's KV cache: every layer's K and V for `num_blocks` blocks of
/// `block_size` token positions each.
pub struct KvCache {
    pub(crate) block_size: usize,
    pub(crate) num_blocks: usize,
    pub(crate) kv_dim: usize,
    /// One `(k, v)` pair per layer.
    pub(crate) layers: Vec<(KvStore, KvStore)>,
}

impl KvCache {
    /// A cache of `num_blocks` blocks of `block_size` tokens in the model's `kv_dtype`.
    pub fn new(cfg: &ModelConfig, block_size: usize, num_blocks: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        let kv_dim = cfg.kv_dim();
        let per_layer = num_blocks * block_size * kv_dim;
        KvCache {
            block_size,
            num_blocks,
            kv_dim,
            layers: (0..cfg.num_layers)
                .map(|_| {
                    (
                        KvStore::new(cfg.kv_dtype, per_layer),
                        KvStore::new(cfg.kv_dtype, per_layer),
                    )
                })
                .collect(),
        }
    }

    /// Bytes one token takes across all layers.
    pub(crate) fn bytes_per_token(cfg: &ModelConfig) -> usize {
        let elem = match cfg.kv_dtype {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        };
        cfg.num_layers * 2 * cfg.kv_dim() * elem
    }

    /// Writes K and V rows of `layer` into the given slots.
    pub(crate) fn write(&mut self, layer: usize, slots: &[usize], k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let (kc, vc) = &mut self.layers[layer];
        for (i, &slot) in slots.iter().enumerate() {
            kc.write(slot * d, &k[i * d..(i + 1) * d]);
            vc.write(slot * d, &v[i * d..(i + 1) * d]);
        }
    }

    /// Copies block `from` of `src` (every layer's K and V rows) into block `to` of
    /// `self`, a cache of the same model and block size: the CPU's swap between its
    /// cache and the host cache that preempted sequences swap out to.
    pub(crate) fn copy_block(
        &mut self,
        to: usize,
        src: &KvCache,
        from: usize,
    ) -> crate::error::Result<()> {
        let n = self.block_size * self.kv_dim;
        if src.block_size != self.block_size
            || src.kv_dim != self.kv_dim
            || src.layers.len() != self.layers.len()
            || to >= self.num_blocks
            || from >= src.num_blocks
        {
            return Err(crate::error::Error::Model(format!(
                "block copy {from} -> {to} between caches of different shapes or out of range"
            )));
        }
        fn copy<T: Copy>(dst: &mut [T], to: usize, src: &[T], from: usize, n: usize) {
            dst[to * n..(to + 1) * n].copy_from_slice(&src[from * n..(from + 1) * n]);
        }
        for (dst, src) in self.layers.iter_mut().zip(&src.layers) {
            for (d, s) in [(&mut dst.0, &src.0), (&mut dst.1, &src.1)] {
                match (d, s) {
                    (KvStore::F32(d), KvStore::F32(s)) => copy(d, to, s, from, n),
                    (KvStore::F16(d), KvStore::F16(s)) => copy(d, to, s, from, n),
                    _ => {
                        return Err(crate::error::Error::Model(
                            "block copy between caches of different types".into(),
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// The flat slot index of position `pos` in a sequence with `block_table`.
    pub(crate) fn slot(&self, block_table: &[u32], pos: usize) -> usize {
        block_table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }
}
