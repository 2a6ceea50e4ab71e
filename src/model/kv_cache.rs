//! The CPU engine's paged KV cache: per layer, K and V stored as
//! `[num_blocks, block_size, kv_heads * head_dim]` f32. Which blocks a sequence owns is the
//! scheduler's business (block tables come in with each forward call).

use super::config::ModelConfig;

pub struct KvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    pub kv_dim: usize,
    /// One `(k, v)` pair per layer.
    pub layers: Vec<(Vec<f32>, Vec<f32>)>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, block_size: usize, num_blocks: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        let kv_dim = cfg.kv_dim();
        let per_layer = num_blocks * block_size * kv_dim;
        KvCache {
            block_size,
            num_blocks,
            kv_dim,
            layers: (0..cfg.num_layers)
                .map(|_| (vec![0f32; per_layer], vec![0f32; per_layer]))
                .collect(),
        }
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.layers.len() * 2 * self.num_blocks * self.block_size * self.kv_dim * 4
    }

    /// Writes K and V rows of `layer` for the given (block table, position) slots.
    pub fn write(&mut self, layer: usize, slots: &[usize], k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let (kc, vc) = &mut self.layers[layer];
        for (i, &slot) in slots.iter().enumerate() {
            kc[slot * d..(slot + 1) * d].copy_from_slice(&k[i * d..(i + 1) * d]);
            vc[slot * d..(slot + 1) * d].copy_from_slice(&v[i * d..(i + 1) * d]);
        }
    }

    /// The flat slot index of position `pos` in a sequence with `block_table`.
    pub fn slot(&self, block_table: &[u32], pos: usize) -> usize {
        block_table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }
}
