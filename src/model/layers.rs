//! The CPU forward pass's stages ([`super::stage`]) over f32 buffers: the same stages, in
//! the same order, as the GPU engine's `gpu/layers.rs` launches on the device.

use super::config::ModelConfig;
use super::family::Mlp;
use super::kv_cache::{KvCache, KvStore};
use super::llama::{Llama, SeqChunk};
use super::stage::Stage;
use super::weights::{Linear, Norm};
use crate::kernels::cpu::{self, AttnOpts, AttnRow, KvElem, PagedView};
use crate::kernels::matmul::linear;

/// One forward call's rows and activations.
pub(super) struct Pass<'a> {
    model: &'a Llama,
    cache: &'a mut KvCache,
    ids: Vec<u32>,
    positions: Vec<usize>,
    /// Rows rotated with LongRoPE's long factors (their sequence's `long_rope`).
    long_rope: Vec<bool>,
    slots: Vec<usize>,
    rows: Vec<AttnRow<'a>>,
    /// The rows that get logits, in order. The last layer's outputs feed nothing else.
    pub tail: Vec<usize>,
    /// The rows the layers run on: every row, until the last layer keeps the tail's.
    n: usize,
    x: Vec<f32>,
    /// Normed rows; after [`Stage::FinalNorm`], the final hidden states `[tail.len(),
    /// hidden_size]`.
    pub xn: Vec<f32>,
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
        let mut long_rope = vec![];
        for c in seqs {
            for (i, &t) in c.tokens.iter().enumerate() {
                let pos = c.start_pos + i;
                positions.push(pos);
                long_rope.push(c.long_rope);
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
            long_rope,
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
            gu: vec![0f32; n * cfg.arch.up_rows(f)],
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
                if let Some(pe) = &w.pos_embed {
                    for (row, &p) in self.x.chunks_exact_mut(h).zip(&self.positions) {
                        cpu::add_in_place(row, &pe[p * h..(p + 1) * h]);
                    }
                }
                if let Some(scale) = cfg.arch.embed_scale {
                    self.x.iter_mut().for_each(|v| *v *= scale);
                }
            }
            Stage::Qkv => {
                norm(cfg, &w.layers[l].attn_norm, &self.x, &mut self.xn);
                apply(&w.layers[l].qkv, &self.xn, n, &mut self.qkv);
            }
            Stage::Rope => {
                let width = qd + 2 * kvd;
                for (r, row) in self.qkv.chunks_exact(width).take(n).enumerate() {
                    self.q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
                    self.k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
                    self.v[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd + kvd..]);
                }
                let lw = &w.layers[l];
                if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                    // Per head: the norm's weight is one head wide.
                    cpu::rms_norm_in_place(&mut self.q, qn, eps);
                    cpu::rms_norm_in_place(&mut self.k, kn, eps);
                }
                if !cfg.arch.learned_positions {
                    // Runs of rows of one kind of factors (a sequence's rows are one run).
                    let mut r = 0;
                    while r < n {
                        let long = self.long_rope[r];
                        let end = r + self.long_rope[r..n]
                            .iter()
                            .take_while(|&&x| x == long)
                            .count();
                        let freq = model.layer_inv_freq(l, long);
                        let pos = &self.positions[r..end];
                        cpu::rope(&mut self.q[r * qd..end * qd], pos, cfg.head_dim, freq);
                        cpu::rope(&mut self.k[r * kvd..end * kvd], pos, cfg.head_dim, freq);
                        r = end;
                    }
                }
                self.cache.write(l, &self.slots, &self.k, &self.v);
            }
            Stage::Attention => {
                if l + 1 == w.layers.len() && self.tail.len() < n {
                    // Every row's K/V of the last layer is written; its attention and MLP
                    // run only on the rows that get logits.
                    self.keep_tail();
                }
                let opts = AttnOpts {
                    scale: cfg.attn_scale,
                    softcap: cfg.arch.attn_softcap,
                    window: cfg.arch.window(l),
                };
                attention(
                    self.cache,
                    l,
                    &self.q,
                    &self.rows,
                    cfg,
                    &opts,
                    &mut self.attn,
                );
            }
            Stage::O => {
                apply(&w.layers[l].o, &self.attn, n, &mut self.tmp);
                self.add_residual(w.layers[l].post_attn_norm.as_ref());
            }
            Stage::GateUp => {
                norm(cfg, &w.layers[l].ffn_norm, &self.x, &mut self.xn);
                apply(&w.layers[l].gate_up, &self.xn, n, &mut self.gu);
            }
            Stage::Swiglu => match cfg.arch.mlp {
                Mlp::SwiGlu => cpu::silu_mul(&self.gu, f, &mut self.act),
                Mlp::GeGlu => cpu::gelu_mul(&self.gu, f, &mut self.act),
                Mlp::Gelu => cpu::gelu(&self.gu, &mut self.act),
            },
            Stage::Down => {
                apply(&w.layers[l].down, &self.act, n, &mut self.tmp);
                self.add_residual(w.layers[l].post_ffn_norm.as_ref());
            }
            Stage::FinalNorm => {
                if self.n != self.tail.len() {
                    // A model without layers: the embeddings are the rows.
                    self.x = gather_rows(&self.x, &self.tail, h);
                    self.n = self.tail.len();
                }
                self.xn.resize(self.n * h, 0.0);
                norm(cfg, &w.final_norm, &self.x, &mut self.xn);
            }
            Stage::LmHead => {
                let (m, vocab) = (self.n, cfg.vocab_size);
                self.logits = vec![0f32; m * vocab];
                match &w.lm_head {
                    Some(head) => apply(head, &self.xn, m, &mut self.logits),
                    None => linear(&self.xn, &w.embed, None, m, h, vocab, &mut self.logits),
                }
                if let Some(cap) = cfg.arch.final_softcap {
                    cpu::softcap(&mut self.logits, cap);
                }
            }
        }
    }

    /// Adds the sublayer's output (`tmp`) into the residual, through its output norm
    /// where the family has one.
    fn add_residual(&mut self, post: Option<&Norm>) {
        match post {
            Some(pn) => {
                let cfg = self.model.config();
                norm(cfg, pn, &self.tmp, &mut self.xn);
                cpu::add_in_place(&mut self.x, &self.xn);
            }
            None => cpu::add_in_place(&mut self.x, &self.tmp),
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
            (&mut self.gu, cfg.arch.up_rows(f)),
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

/// The family's norm of `x` into `out` (RMSNorm, or LayerNorm where it has a bias).
pub(crate) fn norm(cfg: &ModelConfig, n: &Norm, x: &[f32], out: &mut [f32]) {
    match &n.b {
        Some(b) => cpu::layer_norm(x, &n.w, b, cfg.rms_norm_eps, out),
        None => cpu::rms_norm(x, &n.w, cfg.rms_norm_eps, out),
    }
}

/// Paged attention of layer `l` over the cache, whatever its element type.
fn attention(
    cache: &KvCache,
    l: usize,
    q: &[f32],
    rows: &[AttnRow<'_>],
    cfg: &ModelConfig,
    opts: &AttnOpts,
    out: &mut [f32],
) {
    #[allow(clippy::too_many_arguments)]
    fn run<T: KvElem>(
        k: &[T],
        v: &[T],
        cache: &KvCache,
        q: &[f32],
        rows: &[AttnRow<'_>],
        cfg: &ModelConfig,
        opts: &AttnOpts,
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
            opts,
            out,
        );
    }
    match &cache.layers[l] {
        (KvStore::F32(k), KvStore::F32(v)) => run(k, v, cache, q, rows, cfg, opts, out),
        (KvStore::F16(k), KvStore::F16(v)) => run(k, v, cache, q, rows, cfg, opts, out),
        _ => unreachable!("K and V of a layer share one element type"),
    }
}

fn apply(lin: &Linear, x: &[f32], n: usize, y: &mut [f32]) {
    linear(x, &lin.w, lin.b.as_deref(), n, lin.cols, lin.rows, y);
}
