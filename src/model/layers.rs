//! The CPU forward pass's stages ([`super::stage`]) over f32 buffers: the same stages, in
//! the same order, as the GPU engine's `gpu/layers.rs` launches on the device.

use super::kv_cache::{KvCache, KvStore};
use super::llama::{Llama, SeqChunk};
use super::stage::Stage;
use super::weights::Linear;
use crate::kernels::cpu::{self, AttnRow, KvElem, PagedView};
use crate::kernels::matmul::linear;

/// One forward call's rows and activations.
pub(super) struct Pass<'a> {
    model: &'a Llama,
    cache: &'a mut KvCache,
    ids: Vec<u32>,
    positions: Vec<usize>,
    slots: Vec<usize>,
    rows: Vec<AttnRow<'a>>,
    /// The rows that get logits, in order. The last layer's outputs feed nothing else.
    pub tail: Vec<usize>,
    /// The rows the layers run on: every row, until the last layer keeps the tail's.
    n: usize,
    x: Vec<f32>,
    xn: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    tmp: Vec<f32>,
    gu: Vec<f32>,
    act: Vec<f32>,
    /// `[tail.len(), vocab]` after [`Stage::LmHead`].
    pub logits: Vec<f32>,
}

impl<'a> Pass<'a> {
    /// Lays out the chunks' rows (checked by the caller) and sizes the activations.
    pub fn new(model: &'a Llama, seqs: &[SeqChunk<'a>], cache: &'a mut KvCache) -> Self {
        let cfg = model.config();
        let (h, qd, kvd, f) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let (mut ids, mut positions, mut slots, mut rows) = (vec![], vec![], vec![], vec![]);
        for c in seqs {
            for (i, &t) in c.tokens.iter().enumerate() {
                let pos = c.start_pos + i;
                positions.push(pos);
                slots.push(cache.slot(c.block_table, pos));
                ids.push(t);
                rows.push(AttnRow {
                    block_table: c.block_table,
                    pos,
                });
            }
        }
        let n = ids.len();
        Pass {
            model,
            cache,
            ids,
            positions,
            slots,
            rows,
            tail: logit_rows(seqs),
            n,
            x: vec![0f32; n * h],
            xn: vec![0f32; n * h],
            qkv: vec![0f32; n * (qd + 2 * kvd)],
            q: vec![0f32; n * qd],
            k: vec![0f32; n * kvd],
            v: vec![0f32; n * kvd],
            attn: vec![0f32; n * qd],
            tmp: vec![0f32; n * h],
            gu: vec![0f32; n * 2 * f],
            act: vec![0f32; n * f],
            logits: Vec::new(),
        }
    }

    /// Runs `stage` (of layer `l`, for a layer's stages).
    pub fn run(&mut self, stage: Stage, l: usize) {
        let model = self.model;
        let (cfg, w) = (model.config(), model.weights());
        let (h, qd, kvd, f) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let eps = cfg.rms_norm_eps;
        let n = self.n;
        match stage {
            Stage::Embed => {
                for (row, &id) in self.x.chunks_exact_mut(h).zip(&self.ids) {
                    w.embed.row_into(id as usize, h, row);
                }
            }
            Stage::Qkv => {
                cpu::rms_norm(&self.x, &w.layers[l].attn_norm, eps, &mut self.xn);
                apply(&w.layers[l].qkv, &self.xn, n, &mut self.qkv);
            }
            Stage::Rope => {
                let width = qd + 2 * kvd;
                for (r, row) in self.qkv.chunks_exact(width).take(n).enumerate() {
                    self.q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
                    self.k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
                    self.v[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd + kvd..]);
                }
                cpu::rope(&mut self.q, &self.positions, cfg.head_dim, model.inv_freq());
                cpu::rope(&mut self.k, &self.positions, cfg.head_dim, model.inv_freq());
                self.cache.write(l, &self.slots, &self.k, &self.v);
            }
            Stage::Attention => {
                if l + 1 == w.layers.len() && self.tail.len() < n {
                    // Every row's K/V of the last layer is written; its attention and MLP
                    // run only on the rows that get logits.
                    self.keep_tail();
                }
                attention(self.cache, l, &self.q, &self.rows, cfg, &mut self.attn);
            }
            Stage::O => {
                apply(&w.layers[l].o, &self.attn, n, &mut self.tmp);
                cpu::add_in_place(&mut self.x, &self.tmp);
            }
            Stage::GateUp => {
                cpu::rms_norm(&self.x, &w.layers[l].ffn_norm, eps, &mut self.xn);
                apply(&w.layers[l].gate_up, &self.xn, n, &mut self.gu);
            }
            Stage::Swiglu => cpu::silu_mul(&self.gu, f, &mut self.act),
            Stage::Down => {
                apply(&w.layers[l].down, &self.act, n, &mut self.tmp);
                cpu::add_in_place(&mut self.x, &self.tmp);
            }
            Stage::FinalNorm => {
                if self.n != self.tail.len() {
                    // A model without layers: the embeddings are the rows.
                    self.x = gather_rows(&self.x, &self.tail, h);
                    self.n = self.tail.len();
                }
                self.xn.resize(self.n * h, 0.0);
                cpu::rms_norm(&self.x, &w.final_norm, eps, &mut self.xn);
            }
            Stage::LmHead => {
                let (m, vocab) = (self.n, cfg.vocab_size);
                self.logits = vec![0f32; m * vocab];
                match &w.lm_head {
                    Some(head) => apply(head, &self.xn, m, &mut self.logits),
                    None => linear(&self.xn, &w.embed, None, m, h, vocab, &mut self.logits),
                }
            }
        }
    }

    /// Keeps the tail's rows of the residual, the queries and their attention rows, and
    /// cuts the other activations to them.
    fn keep_tail(&mut self) {
        let cfg = self.model.config();
        let (h, qd, f) = (cfg.hidden_size, cfg.q_dim(), cfg.intermediate_size);
        self.x = gather_rows(&self.x, &self.tail, h);
        self.q = gather_rows(&self.q, &self.tail, qd);
        self.rows = self.tail.iter().map(|&r| self.rows[r]).collect();
        self.n = self.tail.len();
        let n = self.n;
        for (buf, width) in [
            (&mut self.xn, h),
            (&mut self.attn, qd),
            (&mut self.tmp, h),
            (&mut self.gu, 2 * f),
            (&mut self.act, f),
        ] {
            buf.truncate(n * width);
        }
    }
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
    cfg: &super::config::ModelConfig,
    out: &mut [f32],
) {
    fn run<T: KvElem>(
        k: &[T],
        v: &[T],
        cache: &KvCache,
        q: &[f32],
        rows: &[AttnRow<'_>],
        cfg: &super::config::ModelConfig,
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
