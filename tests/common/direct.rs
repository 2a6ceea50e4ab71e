//! The CPU engine's own logits for a token sequence, from one direct forward pass (no
//! server, no scheduler): what tests compare served log-probabilities and logits with.

use inflight::model::{KvCache, Llama, SeqChunk};

/// The model's logits at every position of `tokens`, one row per position.
pub fn logits_of(model: &Llama, tokens: &[u32]) -> Vec<Vec<f32>> {
    let bs = 16;
    let blocks = tokens.len().div_ceil(bs);
    let mut cache = KvCache::new(model.config(), bs, blocks);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let chunk = SeqChunk {
        tokens,
        start_pos: 0,
        block_table: &table,
        logits: tokens.len(),
        long_rope: false,
    };
    let out = model.forward(&[chunk], &mut cache).unwrap().remove(0);
    out.chunks(model.config().vocab_size)
        .map(<[f32]>::to_vec)
        .collect()
}
