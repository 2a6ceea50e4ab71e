//! The Llama-family forward pass on the CPU: one call prefills several sequences (whole or
//! in chunks) and decodes a batch, reading and writing the paged KV cache through each
//! sequence's block table.

use std::path::Path;

use super::config::ModelConfig;
use super::gguf::GgufFile;
use super::kv_cache::{KvCache, KvStore};
use super::safetensors::HfCheckpoint;
use super::weights::{Linear, LlamaWeights};
use crate::error::{Error, Result};
use crate::kernels::cpu::{self, AttnRow, KvElem, PagedView};
use crate::kernels::matmul::linear;

/// New tokens of one sequence for one forward call.
#[derive(Clone, Copy, Debug)]
pub struct SeqChunk<'a> {
    /// Tokens at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: &'a [u32],
    /// Tokens of this sequence already in the cache.
    pub start_pos: usize,
    /// Physical block of each logical block; must cover every position up to the last new one.
    pub block_table: &'a [u32],
    /// How many of the last new tokens get a row of logits (0: none; all of them with
    /// `tokens.len()`; more is clamped to it).
    pub logits: usize,
}

/// A loaded Llama-family model (weights in f32).
pub struct Llama {
    config: ModelConfig,
    weights: LlamaWeights,
    inv_freq: Vec<f32>,
}

impl Llama {
    /// Loads a `.gguf` file, or an HF checkpoint directory (config.json + safetensors).
    pub fn load(path: &Path) -> Result<Self> {
        if path.is_dir() {
            let ckpt = HfCheckpoint::open(path)?;
            let config = ckpt.config().clone();
            let weights = LlamaWeights::from_hf(&ckpt, &config)?;
            Ok(Self::new(config, weights))
        } else {
            Self::from_gguf(&GgufFile::open(path)?)
        }
    }

    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let config = ModelConfig::from_gguf(file)?;
        let weights = LlamaWeights::from_gguf(file, &config)?;
        Ok(Self::new(config, weights))
    }

    pub fn new(config: ModelConfig, weights: LlamaWeights) -> Self {
        let inv_freq = config.rope_inv_freq();
        Llama {
            config,
            weights,
            inv_freq,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn weights(&self) -> &LlamaWeights {
        &self.weights
    }

    /// RoPE inverse frequencies (Llama 3 scaling applied).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Runs every chunk's new tokens through the model, writing their K/V into `cache`.
    /// Returns, per chunk, row-major logits `[rows, vocab]` for its last `logits` new
    /// tokens.
    pub fn forward(&self, seqs: &[SeqChunk<'_>], cache: &mut KvCache) -> Result<Vec<Vec<f32>>> {
        self.check(seqs, cache)?;
        let cfg = &self.config;
        let (h, qd, kvd, f) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let mut positions = Vec::new();
        let mut slots = Vec::new();
        let mut ids = Vec::new();
        let mut row_seq = Vec::new();
        for (s, c) in seqs.iter().enumerate() {
            for (i, &t) in c.tokens.iter().enumerate() {
                let pos = c.start_pos + i;
                positions.push(pos);
                slots.push(cache.slot(c.block_table, pos));
                ids.push(t);
                row_seq.push(s);
            }
        }
        let n = ids.len();
        if n == 0 {
            return Ok(seqs.iter().map(|_| Vec::new()).collect());
        }
        let mut attn_rows: Vec<AttnRow> = positions
            .iter()
            .zip(&row_seq)
            .map(|(&pos, &s)| AttnRow {
                block_table: seqs[s].block_table,
                pos,
            })
            .collect();

        // The rows that get logits, in order. The last layer's outputs feed nothing else.
        let tail = logit_rows(seqs);
        let mut x = vec![0f32; n * h];
        for (row, &id) in x.chunks_exact_mut(h).zip(&ids) {
            self.weights.embed.row_into(id as usize, h, row);
        }
        let mut xn = vec![0f32; n * h];
        let mut qkv = vec![0f32; n * (qd + 2 * kvd)];
        let (mut q, mut k, mut v) = (vec![0f32; n * qd], vec![0f32; n * kvd], vec![0f32; n * kvd]);
        let mut attn = vec![0f32; n * qd];
        let mut tmp = vec![0f32; n * h];
        let mut gu = vec![0f32; n * 2 * f];
        let mut act = vec![0f32; n * f];

        let layers = self.weights.layers.len();
        // The rows the layers run on: every row, until the last layer keeps the tail's.
        let mut n = n;
        for (l, lw) in self.weights.layers.iter().enumerate() {
            cpu::rms_norm(&x, &lw.attn_norm, cfg.rms_norm_eps, &mut xn);
            apply(&lw.qkv, &xn, n, &mut qkv);
            for r in 0..n {
                let row = &qkv[r * (qd + 2 * kvd)..(r + 1) * (qd + 2 * kvd)];
                q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
                k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
                v[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd + kvd..]);
            }
            cpu::rope(&mut q, &positions, cfg.head_dim, &self.inv_freq);
            cpu::rope(&mut k, &positions, cfg.head_dim, &self.inv_freq);
            cache.write(l, &slots, &k, &v);
            if l + 1 == layers && tail.len() < n {
                // Every row's K/V of the last layer is written; its attention and MLP run
                // only on the rows that get logits.
                if tail.is_empty() {
                    return Ok(seqs.iter().map(|_| Vec::new()).collect());
                }
                x = gather_rows(&x, &tail, h);
                q = gather_rows(&q, &tail, qd);
                attn_rows = tail.iter().map(|&r| attn_rows[r]).collect();
                n = tail.len();
                for (buf, width) in [
                    (&mut xn, h),
                    (&mut attn, qd),
                    (&mut tmp, h),
                    (&mut gu, 2 * f),
                    (&mut act, f),
                ] {
                    buf.truncate(n * width);
                }
            }
            attention(cache, l, &q, &attn_rows, cfg, &mut attn);
            apply(&lw.o, &attn, n, &mut tmp);
            cpu::add_in_place(&mut x, &tmp);

            cpu::rms_norm(&x, &lw.ffn_norm, cfg.rms_norm_eps, &mut xn);
            apply(&lw.gate_up, &xn, n, &mut gu);
            cpu::silu_mul(&gu, f, &mut act);
            apply(&lw.down, &act, n, &mut tmp);
            cpu::add_in_place(&mut x, &tmp);
        }
        if n != tail.len() {
            // A model without layers: the embeddings are the rows.
            x = gather_rows(&x, &tail, h);
        }
        Ok(self.logits(seqs, &x))
    }

    /// Final norm and LM head on `rows`: the rows each chunk asked for, in order.
    fn logits(&self, seqs: &[SeqChunk<'_>], rows: &[f32]) -> Vec<Vec<f32>> {
        let cfg = &self.config;
        let (h, vsz) = (cfg.hidden_size, cfg.vocab_size);
        let counts: Vec<usize> = seqs.iter().map(|c| c.logits.min(c.tokens.len())).collect();
        let m = rows.len() / h;
        let mut normed = vec![0f32; m * h];
        cpu::rms_norm(
            rows,
            &self.weights.final_norm,
            cfg.rms_norm_eps,
            &mut normed,
        );
        let mut logits = vec![0f32; m * vsz];
        match &self.weights.lm_head {
            Some(head) => apply(head, &normed, m, &mut logits),
            None => linear(&normed, &self.weights.embed, None, m, h, vsz, &mut logits),
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for c in counts {
            out.push(logits[at * vsz..(at + c) * vsz].to_vec());
            at += c;
        }
        out
    }

    /// Rejects chunks the model or cache cannot take, before touching the cache.
    fn check(&self, seqs: &[SeqChunk<'_>], cache: &KvCache) -> Result<()> {
        let cfg = &self.config;
        if cache.kv_dim != cfg.kv_dim() || cache.layers.len() != cfg.num_layers {
            return Err(Error::Model("KV cache was built for another model".into()));
        }
        check_chunks(cfg, seqs, cache.block_size, cache.num_blocks)
    }
}

/// Rejects chunks a model with `cfg` and a cache of `num_blocks` blocks of `block_size`
/// tokens cannot take (shared by every engine, so bad input fails alike everywhere).
pub fn check_chunks(
    cfg: &ModelConfig,
    seqs: &[SeqChunk<'_>],
    block_size: usize,
    num_blocks: usize,
) -> Result<()> {
    for (i, c) in seqs.iter().enumerate() {
        let end = c.start_pos + c.tokens.len();
        if end > cfg.max_position_embeddings {
            return Err(Error::InvalidRequest(format!(
                "sequence {i} reaches position {end}, past the model's context of {}",
                cfg.max_position_embeddings
            )));
        }
        if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(Error::InvalidRequest(format!(
                "token id {t} is outside the vocabulary ({} tokens)",
                cfg.vocab_size
            )));
        }
        let blocks = end.div_ceil(block_size);
        if c.block_table.len() < blocks {
            return Err(Error::InvalidRequest(format!(
                "sequence {i} needs {blocks} blocks for {end} positions, its table has {}",
                c.block_table.len()
            )));
        }
        if let Some(&b) = c.block_table[..blocks]
            .iter()
            .find(|&&b| b as usize >= num_blocks)
        {
            return Err(Error::InvalidRequest(format!(
                "block {b} is outside the cache ({num_blocks} blocks)"
            )));
        }
    }
    Ok(())
}

/// The rows of a batch that get logits, in order: each chunk's last `logits` new tokens
/// (every engine lays its rows out chunk after chunk).
fn logit_rows(seqs: &[SeqChunk<'_>]) -> Vec<usize> {
    let mut rows = Vec::new();
    let mut start = 0;
    for c in seqs {
        let n = c.tokens.len();
        rows.extend(start + n - c.logits.min(n)..start + n);
        start += n;
    }
    rows
}

/// Rows `rows` of the row-major matrix `x` of rows `width` wide, in that order.
fn gather_rows(x: &[f32], rows: &[usize], width: usize) -> Vec<f32> {
    rows.iter()
        .flat_map(|&r| &x[r * width..(r + 1) * width])
        .copied()
        .collect()
}

/// Paged attention of layer `l` over the cache, whatever its element type.
fn attention(
    cache: &KvCache,
    l: usize,
    q: &[f32],
    rows: &[AttnRow<'_>],
    cfg: &ModelConfig,
    out: &mut [f32],
) {
    fn run<T: KvElem>(
        k: &[T],
        v: &[T],
        cache: &KvCache,
        q: &[f32],
        rows: &[AttnRow<'_>],
        cfg: &ModelConfig,
        out: &mut [f32],
    ) {
        let view = |data| PagedView {
            data,
            block_size: cache.block_size,
            kv_dim: cache.kv_dim,
        };
        cpu::paged_attention(
            q,
            rows,
            &view(k),
            &view(v),
            cfg.num_heads,
            cfg.head_dim,
            out,
        );
    }
    match &cache.layers[l] {
        (KvStore::F32(k), KvStore::F32(v)) => run(k, v, cache, q, rows, cfg, out),
        (KvStore::F16(k), KvStore::F16(v)) => run(k, v, cache, q, rows, cfg, out),
        _ => unreachable!("K and V of a layer share one element type"),
    }
}

fn apply(lin: &Linear, x: &[f32], n: usize, y: &mut [f32]) {
    linear(x, &lin.w, lin.b.as_deref(), n, lin.cols, lin.rows, y);
}
