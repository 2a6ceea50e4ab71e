//! The decoder's forward pass on the CPU (every family, `model::family`): one call prefills several sequences (whole or
//! in chunks) and decodes a batch, reading and writing the paged KV cache through each
//! sequence's block table.

use std::path::Path;

use super::config::ModelConfig;
use super::gguf::GgufFile;
use super::kv_cache::KvCache;
use super::layers::Pass;
use super::safetensors::HfCheckpoint;
use super::stage::{self, Stage};
use super::weights::LlamaWeights;
use crate::error::{Error, Result};

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
    /// Rotated with LongRoPE's long factors (a sequence past the original context;
    /// `ModelConfig::long_rope`), at every position; ignored by other models.
    pub long_rope: bool,
}

/// A loaded decoder of any supported family (`model::family`).
pub struct Llama {
    config: ModelConfig,
    weights: LlamaWeights,
    inv_freq: Vec<f32>,
    /// The local layers' frequencies where they differ (Gemma 3).
    local_inv_freq: Option<Vec<f32>>,
    /// LongRoPE's long-factor frequencies, for sequences past the original context.
    long_inv_freq: Option<Vec<f32>>,
}

impl Llama {
    /// Loads a `.gguf` file, or an HF checkpoint directory (config.json + safetensors).
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, false)
    }

    /// [`Llama::load`] for the GPU engine's upload: a checkpoint folder's 16-bit matrices
    /// stay in their memory maps, unread until the upload copies them.
    pub fn load_mapped(path: &Path) -> Result<Self> {
        Self::load_with(path, true)
    }

    fn load_with(path: &Path, mapped: bool) -> Result<Self> {
        if path.is_dir() {
            let ckpt = HfCheckpoint::open(path)?;
            let config = ckpt.config().clone();
            let weights = LlamaWeights::from_hf(&ckpt, &config, mapped)?;
            Ok(Self::new(config, weights))
        } else {
            Self::from_gguf(&GgufFile::open(path)?)
        }
    }

    /// The model a GGUF file holds (weights kept quantized where the CPU engine can).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let config = ModelConfig::from_gguf(file)?;
        let weights = LlamaWeights::from_gguf(file, &config)?;
        Ok(Self::new(config, weights))
    }

    pub(crate) fn new(config: ModelConfig, weights: LlamaWeights) -> Self {
        let inv_freq = config.rope_inv_freq();
        let local_inv_freq = config.local_rope_inv_freq();
        let long_inv_freq = config.long_rope_inv_freq();
        Llama {
            config,
            weights,
            inv_freq,
            local_inv_freq,
            long_inv_freq,
        }
    }

    /// How many of its matrices are left in a memory map ([`Llama::load_mapped`]).
    #[doc(hidden)]
    pub fn mapped_matrices(&self) -> usize {
        let w = &self.weights;
        let stored = |m: &crate::kernels::matmul::Matrix| {
            matches!(m, crate::kernels::matmul::Matrix::Stored(_)) as usize
        };
        stored(&w.embed)
            + w.lm_head.as_ref().map_or(0, |l| stored(&l.w))
            + w.layers
                .iter()
                .map(|l| {
                    stored(&l.qkv.w) + stored(&l.o.w) + stored(&l.gate_up.w) + stored(&l.down.w)
                })
                .sum::<usize>()
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub(crate) fn weights(&self) -> &LlamaWeights {
        &self.weights
    }

    /// RoPE inverse frequencies of the global layers (scaling applied).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// RoPE inverse frequencies of the local layers, where they differ from the global.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn local_inv_freq(&self) -> Option<&[f32]> {
        self.local_inv_freq.as_deref()
    }

    /// LongRoPE's long-factor frequencies (every layer's), when the model has them.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn long_inv_freq(&self) -> Option<&[f32]> {
        self.long_inv_freq.as_deref()
    }

    /// RoPE inverse frequencies of layer `l`, for a sequence past LongRoPE's original
    /// context when `long`.
    pub(crate) fn layer_inv_freq(&self, l: usize, long: bool) -> &[f32] {
        match (&self.local_inv_freq, &self.long_inv_freq) {
            (Some(local), _) if self.config.arch.is_local(l) => local,
            (_, Some(f)) if long => f,
            _ => &self.inv_freq,
        }
    }

    /// Runs every chunk's new tokens through the model, writing their K/V into `cache`.
    /// Returns, per chunk, row-major logits `[rows, vocab]` for its last `logits` new
    /// tokens. The stages are `model::stage`'s, in its order, as on the GPU.
    pub fn forward(&self, seqs: &[SeqChunk<'_>], cache: &mut KvCache) -> Result<Vec<Vec<f32>>> {
        self.run(seqs, cache, &stage::HEAD)
    }

    /// [`Llama::forward`], returning the final hidden states (after the final norm) of
    /// those rows, `[rows, hidden_size]`, instead of their logits: what embeddings pool.
    pub fn forward_hidden(
        &self,
        seqs: &[SeqChunk<'_>],
        cache: &mut KvCache,
    ) -> Result<Vec<Vec<f32>>> {
        self.run(seqs, cache, &stage::HIDDEN_HEAD)
    }

    /// The forward pass with `head`'s stages after the layers; each chunk's rows of the
    /// last one's output (the logits, or the normed hidden states).
    fn run(
        &self,
        seqs: &[SeqChunk<'_>],
        cache: &mut KvCache,
        head: &[Stage],
    ) -> Result<Vec<Vec<f32>>> {
        self.check(seqs, cache)?;
        let empty = || seqs.iter().map(|_| Vec::new()).collect();
        if seqs.iter().all(|c| c.tokens.is_empty()) {
            return Ok(empty());
        }
        let mut pass = Pass::new(self, seqs, cache);
        pass.run(Stage::Embed, 0);
        let layers = self.weights.layers.len();
        for l in 0..layers {
            for &stage in stage::layer_stages(l, layers, pass.tail.is_empty()) {
                pass.run(stage, l);
            }
        }
        if pass.tail.is_empty() {
            return Ok(empty());
        }
        for &stage in head {
            pass.run(stage, layers);
        }
        let (width, rows_out) = match head.last() {
            Some(Stage::LmHead) => (self.config.vocab_size, &pass.logits),
            _ => (self.config.hidden_size, &pass.xn),
        };
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for c in seqs {
            let rows = c.logits.min(c.tokens.len());
            out.push(rows_out[at * width..(at + rows) * width].to_vec());
            at += rows;
        }
        Ok(out)
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
pub(crate) fn check_chunks(
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
        // Blocks wholly behind every layer's window from the chunk's first query may have
        // been given back (the scheduler's DROPPED): no kernel reads them.
        let behind = cfg
            .arch
            .kv_window(cfg.num_layers)
            .map_or(0, |w| (c.start_pos + 1).saturating_sub(w) / block_size);
        let outside = |(j, &b): (usize, &u32)| {
            let dropped = b == crate::scheduler::DROPPED && j < behind;
            b as usize >= num_blocks && !dropped
        };
        if let Some((_, &b)) = c.block_table[..blocks]
            .iter()
            .enumerate()
            .find(|&e| outside(e))
        {
            return Err(Error::InvalidRequest(format!(
                "block {b} is outside the cache ({num_blocks} blocks)"
            )));
        }
    }
    Ok(())
}
