//! The GPU engine's device buffers: the 16-bit paged KV cache
//! (`[layer][k|v][num_blocks * block_size][kv_dim]`), and for one step the activations of up
//! to `tokens` rows and `rows` logit rows, the step's upload ([`super::layout::Layout`]) and
//! the sampling kernel's results. The step's buffers grow with the batch, never shrink.

use super::CudaModel;
use crate::error::{Error, Result};
use crate::kernels::cuda::{DevBuf, Gpu};
use crate::model::config::ModelConfig;
use crate::sampling;

/// The paged KV cache on the device.
pub(super) struct DeviceKv {
    pub buf: DevBuf<u16>,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Values of one layer's K (or V) plane: `num_blocks * block_size * kv_dim`.
    plane: usize,
}

impl DeviceKv {
    /// A zeroed cache of `num_blocks` blocks of `block_size` positions for `model`.
    pub fn new(model: &CudaModel, block_size: usize, num_blocks: usize) -> Result<Self> {
        if block_size == 0 || num_blocks == 0 {
            return Err(Error::Model(
                "the KV cache needs blocks of positive size".into(),
            ));
        }
        let cfg = &model.config;
        let slots = num_blocks * block_size;
        if i32::try_from(slots).is_err() {
            return Err(Error::Model(format!(
                "a KV cache of {slots} slots is too large"
            )));
        }
        let plane = slots * cfg.kv_dim();
        Ok(DeviceKv {
            buf: model.gpu.zeros::<u16>(cfg.num_layers * 2 * plane)?,
            block_size,
            num_blocks,
            plane,
        })
    }

    /// The K and V cache addresses of layer `l`.
    pub fn layer(&self, l: usize) -> (u64, u64) {
        (
            self.buf.at(2 * l * self.plane),
            self.buf.at((2 * l + 1) * self.plane),
        )
    }
}

/// Activation buffers for up to `tokens` tokens and `rows` logit rows.
pub(super) struct Scratch {
    pub tokens: usize,
    pub rows: usize,
    pub meta_cap: usize,
    /// The step's upload: its layout, then its sampling plans.
    pub meta: DevBuf<i32>,
    /// The fp32 residual.
    pub x: DevBuf<f32>,
    pub xn: DevBuf<u16>,
    pub qkv: DevBuf<u16>,
    pub q: DevBuf<f32>,
    pub attn: DevBuf<u16>,
    pub gu: DevBuf<u16>,
    pub act: DevBuf<u16>,
    /// A linear layer's fp32 output before it joins the residual (where a bias or an
    /// output norm comes between: `residual_add`).
    pub tmp: DevBuf<f32>,
    /// The split attention's partial sums and (max, weight sum) pairs.
    pub part_acc: DevBuf<f32>,
    pub part_ml: DevBuf<f32>,
    /// The last layer's rows that get logits, gathered (fp32 residual, 16-bit attention).
    pub x_rows: DevBuf<f32>,
    pub attn_rows: DevBuf<u16>,
    pub head_in: DevBuf<u16>,
    pub logits: DevBuf<f32>,
}

/// Split-K workspace in floats for `tokens` rows.
fn acc_floats(cfg: &ModelConfig, tokens: usize) -> usize {
    cfg.q_dim() * (tokens * 4).max(1024)
}

/// Device bytes of the scratch for `tokens` tokens and `rows` logit rows.
pub fn scratch_bytes(cfg: &ModelConfig, tokens: usize, rows: usize) -> usize {
    let (h, qd, kvd, f) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
    );
    // fp32: x, q, tmp; 16-bit: qkv, gate|up, xn, attn, act; 8 ints of metadata (the step's
    // upload; its sampling plans are counted a row below, their edits in the reserve's
    // slack).
    let per_token = 4 * (2 * h + qd) + 2 * (qd + 2 * kvd + 2 * f) + 2 * (h + qd + f) + 4 * 8;
    let acc = acc_floats(cfg, tokens);
    tokens * per_token
        + acc * 4
        + acc / cfg.head_dim.max(1) * 8
        + rows * (2 * h + 4 * cfg.vocab_size + 4 * h + 2 * qd + 4 * sampling::PLAN_WORDS)
}

impl Scratch {
    fn new(m: &CudaModel, tokens: usize, rows: usize, meta_cap: usize) -> Result<Self> {
        let cfg = &m.config;
        let g = &m.gpu;
        let (h, qd, kvd, f) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let acc = acc_floats(cfg, tokens);
        Ok(Scratch {
            tokens,
            rows,
            meta_cap,
            meta: g.alloc(meta_cap)?,
            x: g.alloc(tokens * h)?,
            xn: g.alloc(tokens * h)?,
            qkv: g.alloc(tokens * (qd + 2 * kvd))?,
            q: g.alloc(tokens * qd)?,
            attn: g.alloc(tokens * qd)?,
            gu: g.alloc(tokens * 2 * f)?,
            act: g.alloc(tokens * f)?,
            tmp: g.alloc(tokens * h)?,
            part_acc: g.alloc(acc)?,
            part_ml: g.alloc(acc / cfg.head_dim * 2)?,
            x_rows: g.alloc(rows * h)?,
            attn_rows: g.alloc(rows * qd)?,
            head_in: g.alloc(rows * h)?,
            logits: g.alloc(rows * cfg.vocab_size)?,
        })
    }

    /// Grows `slot`'s scratch to hold `n` tokens, `m` logit rows and an upload of `meta`
    /// words; true when it was (re)allocated. Where only the upload outgrew its buffer (a
    /// step's sampling edits grow with the penalised history), only that buffer is.
    pub fn ensure(
        slot: &mut Option<Scratch>,
        model: &CudaModel,
        n: usize,
        m: usize,
        meta: usize,
    ) -> Result<bool> {
        let grow = |want: usize, had: usize| want.next_power_of_two().max(had).max(16);
        if let Some(s) = slot
            .as_mut()
            .filter(|s| s.tokens >= n && s.rows >= m && s.meta_cap < meta)
        {
            s.meta_cap = grow(meta, s.meta_cap);
            s.meta = model.gpu.alloc(s.meta_cap)?;
            return Ok(true);
        }
        let fits = slot
            .as_ref()
            .is_some_and(|s| s.tokens >= n && s.rows >= m && s.meta_cap >= meta);
        if !fits {
            let old = slot.take();
            let (t, r, c) = old
                .as_ref()
                .map_or((0, 0, 0), |s| (s.tokens, s.rows, s.meta_cap));
            drop(old);
            *slot = Some(Scratch::new(model, grow(n, t), grow(m, r), grow(meta, c))?);
        }
        Ok(!fits)
    }
}

/// Device buffers of the sampling kernel's results for up to `rows` rows (its plans go up
/// with the step's layout).
pub(super) struct SampleBufs {
    pub rows: usize,
    /// The chosen tokens (i32) then their log-probabilities (f32), `m` each.
    pub chosen: DevBuf<u32>,
    /// Where the blocks of a split greedy row meet: 2 words a row, zero between launches.
    pub best: DevBuf<u64>,
}

impl SampleBufs {
    pub fn new(g: &Gpu, rows: usize) -> Result<Self> {
        Ok(SampleBufs {
            rows,
            chosen: g.alloc(2 * rows)?,
            best: g.zeros(2 * rows)?,
        })
    }
}
