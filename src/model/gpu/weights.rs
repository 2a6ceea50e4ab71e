//! Decoder weights (every family) on the GPU: every matrix in the model's 16-bit type (f16 by default:
//! HF checkpoints' bf16 values, which f16 holds exactly in its range; bf16 on request or
//! when a weight overflows f16), except GGUF matrices the CPU engine keeps quantized, which
//! stay quantized here too (qweights.rs; GGUF's other types come dequantized by the
//! loader), norms, biases and RoPE frequencies in fp32.

use half::f16;
use rayon::prelude::*;

use super::qweights;
use super::upload::{Rows, Uploader};
use crate::error::{Error, Result};
use crate::kernels::cuda::qgemm::{QScratch, QWeight, PANEL_BYTES};
use crate::kernels::cuda::{DevBuf, Gpu, Half};
use crate::kernels::matmul::Matrix;
use crate::model::family::{Arch, Mlp};
use crate::model::weights::{Linear, Norm};
use crate::model::Llama;

/// A weight matrix on the device: 16-bit row-major, or kept quantized.
pub enum GpuMatrix {
    Half(DevBuf<u16>),
    Quant(QWeight),
}

impl GpuMatrix {
    /// The 16-bit matrix's address; None for a quantized one.
    pub fn half_ptr(&self) -> Option<u64> {
        match self {
            GpuMatrix::Half(b) => Some(b.ptr()),
            GpuMatrix::Quant(_) => None,
        }
    }

    /// Device bytes of the matrix.
    pub fn bytes(&self) -> usize {
        match self {
            GpuMatrix::Half(b) => 2 * b.len(),
            GpuMatrix::Quant(q) => q.bytes(),
        }
    }
}

/// A linear layer `y = x · Wᵀ (+ b)`, `w` `[rows, cols]`.
pub struct GpuLinear {
    pub w: GpuMatrix,
    pub b: Option<DevBuf<f32>>,
}

/// A norm's weight, and its bias for a LayerNorm.
pub struct GpuNorm {
    pub w: DevBuf<f32>,
    pub b: Option<DevBuf<f32>>,
}

pub struct GpuLayer {
    pub attn_norm: GpuNorm,
    pub qkv: GpuLinear,
    /// Per-head norms of q and k (Qwen3, Gemma 3).
    pub qk_norm: Option<(DevBuf<f32>, DevBuf<f32>)>,
    pub o: GpuLinear,
    /// The attention output's norm (Gemma).
    pub post_attn_norm: Option<GpuNorm>,
    pub ffn_norm: GpuNorm,
    /// Gate and up rows interleaved ([`interleave_halves`]): gate i at row 2i, up i at
    /// 2i + 1, so that the GEMV kernel's pair of rows is one SwiGLU input (the up rows
    /// alone, as they are, for an ungated MLP).
    pub gate_up: GpuLinear,
    pub down: GpuLinear,
    /// The MLP output's norm (Gemma).
    pub post_ffn_norm: Option<GpuNorm>,
}

pub struct GpuWeights {
    /// The 16-bit type of the matrices (and of the GEMM inputs and KV cache).
    pub half: Half,
    /// `[vocab, hidden]`, also the LM head when tied.
    pub embed: GpuMatrix,
    /// Learned positions `[max_position_embeddings, hidden]`, fp32 (GPT-2).
    pub pos_embed: Option<DevBuf<f32>>,
    pub layers: Vec<GpuLayer>,
    pub final_norm: GpuNorm,
    pub lm_head: Option<GpuLinear>,
    /// RoPE frequencies of the global layers (zeros where positions are learned: RoPE is
    /// then the identity), followed by LongRoPE's long-factor ones where the model has them.
    pub inv_freq: DevBuf<f32>,
    /// `inv_freq` holds the long-factor frequencies after the short ones.
    pub long_rope: bool,
    /// The local layers' own, where they differ (Gemma 3).
    pub local_inv_freq: Option<DevBuf<f32>>,
    /// Where quantized products work (None: no matrix is quantized).
    pub qscratch: Option<QScratch>,
}

impl GpuWeights {
    /// The LM head's weights: its own, or the embedding's when tied.
    pub fn head(&self) -> &GpuMatrix {
        self.lm_head.as_ref().map_or(&self.embed, |l| &l.w)
    }

    /// Device bytes of the weight matrices.
    pub fn matrix_bytes(&self) -> usize {
        self.matrices().map(GpuMatrix::bytes).sum()
    }

    /// Every matrix, for their device bytes.
    fn matrices(&self) -> impl Iterator<Item = &GpuMatrix> {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| [&l.qkv.w, &l.o.w, &l.gate_up.w, &l.down.w]);
        std::iter::once(&self.embed)
            .chain(self.lm_head.as_ref().map(|l| &l.w))
            .chain(layers)
    }

    /// The RoPE frequencies of layer `l` of a model with `arch`, and the rows' LongRoPE
    /// flags `long_rows` where its frequencies have the long ones after them (else 0): the
    /// pair `launch::rope_kv_write` takes.
    pub fn inv_freq_of(&self, arch: &Arch, l: usize, long_rows: u64) -> (u64, u64) {
        match &self.local_inv_freq {
            Some(local) if arch.is_local(l) => (local.ptr(), 0),
            _ => (
                self.inv_freq.ptr(),
                if self.long_rope { long_rows } else { 0 },
            ),
        }
    }
}

fn norm(gpu: &Gpu, n: &Norm) -> Result<GpuNorm> {
    Ok(GpuNorm {
        w: gpu.upload(&n.w)?,
        b: n.b.as_deref().map(|b| gpu.upload(b)).transpose()?,
    })
}

/// What the error of a weight that overflows the 16-bit type says.
pub const OVERFLOW: &str = "overflows the 16-bit type";

/// A matrix as 16-bit bits, row by row (in parallel: dequantizing is the slow part).
pub fn to_half(m: &Matrix, rows: usize, cols: usize, half: Half) -> Vec<u16> {
    let mut out = vec![0u16; rows * cols];
    out.par_chunks_mut(cols.max(1)).enumerate().for_each_init(
        || vec![0f32; cols],
        |buf, (r, dst)| {
            m.row_into(r, cols, buf);
            for (d, &v) in dst.iter_mut().zip(buf.iter()) {
                *d = half.bits(v);
            }
        },
    );
    out
}

/// [`to_half`], refusing a matrix with a finite weight the type cannot hold.
fn to_half_checked(
    m: &Matrix,
    rows: usize,
    cols: usize,
    half: Half,
    what: &str,
) -> Result<Vec<u16>> {
    let bits = to_half(m, rows, cols, half);
    let inf = half.bits(f32::INFINITY) & 0x7fff;
    if bits.par_iter().any(|&b| b & 0x7fff == inf) {
        let mut row = vec![0f32; cols];
        let finite_overflow = (0..rows).any(|r| {
            m.row_into(r, cols, &mut row);
            row.iter()
                .any(|v| v.is_finite() && !half.value(half.bits(*v)).is_finite())
        });
        if finite_overflow {
            return Err(Error::Model(format!(
                "a weight of {what} {OVERFLOW} {}",
                half.suffix()
            )));
        }
    }
    Ok(bits)
}

/// The rows of `v` (`rows` of `cols`, `rows` even) with its two halves interleaved: row
/// 2i is row i of the first half, row 2i + 1 row i of the second.
pub fn interleave_halves<T: Copy>(v: &[T], rows: usize, cols: usize) -> Vec<T> {
    debug_assert!(rows.is_multiple_of(2) && v.len() == rows * cols);
    let (first, second) = v.split_at(rows / 2 * cols);
    let mut out = Vec::with_capacity(v.len());
    for (a, b) in first.chunks(cols.max(1)).zip(second.chunks(cols.max(1))) {
        out.extend_from_slice(a);
        out.extend_from_slice(b);
    }
    out
}

fn arranged<T: Copy>(v: Vec<T>, rows: usize, cols: usize, order: Rows) -> Vec<T> {
    match order {
        Rows::AsIs => v,
        Rows::HalvesInterleaved => interleave_halves(&v, rows, cols),
    }
}

/// A matrix on the device, its rows placed as `order` says: one the CPU engine keeps
/// quantized stays so (an embedding only as one band: its gather takes one format);
/// otherwise in `half`, one left in the checkpoint's memory map through the uploader, any
/// other converted here first.
fn matrix(
    gpu: &Gpu,
    up: &mut Uploader,
    m: &Matrix,
    (rows, cols): (usize, usize),
    half: Half,
    order: Rows,
    what: &str,
) -> Result<GpuMatrix> {
    match m {
        Matrix::Quant(q)
            if (q.rows, q.cols) == (rows, cols)
                && (what != EMBEDDING || q.bands().count() == 1) =>
        {
            // A prefill's panel holds the values in `half`: f16 must hold them all.
            if half == Half::F16 && qweights::max_abs_bound(q) > f16::MAX.to_f32() {
                return Err(Error::Model(format!(
                    "a weight of {what} may {OVERFLOW} {}",
                    half.suffix()
                )));
            }
            match qweights::upload(gpu, q, order)? {
                Some(w) => Ok(GpuMatrix::Quant(w)),
                None => converted(gpu, m, (rows, cols), half, order, what),
            }
        }
        Matrix::Stored(s) if (s.rows(), s.cols()) == (rows, cols) => {
            Ok(GpuMatrix::Half(up.upload(s, half, order)?))
        }
        _ => converted(gpu, m, (rows, cols), half, order, what),
    }
}

/// `m` converted to `half` on the host, then copied.
fn converted(
    gpu: &Gpu,
    m: &Matrix,
    (rows, cols): (usize, usize),
    half: Half,
    order: Rows,
    what: &str,
) -> Result<GpuMatrix> {
    let bits = to_half_checked(m, rows, cols, half, what)?;
    Ok(GpuMatrix::Half(
        gpu.upload(&arranged(bits, rows, cols, order))?,
    ))
}

const EMBEDDING: &str = "the embedding";

fn linear(gpu: &Gpu, up: &mut Uploader, l: &Linear, half: Half, order: Rows) -> Result<GpuLinear> {
    Ok(GpuLinear {
        w: matrix(
            gpu,
            up,
            &l.w,
            (l.rows, l.cols),
            half,
            order,
            "a linear layer",
        )?,
        b: l.b
            .as_deref()
            .map(|b| gpu.upload(&arranged(b.to_vec(), l.rows, 1, order)))
            .transpose()?,
    })
}

impl GpuWeights {
    pub fn upload(gpu: &Gpu, model: &Llama, half: Half) -> Result<Self> {
        gpu.bind()?;
        let cfg = model.config();
        let w = model.weights();
        let started = std::time::Instant::now();
        let mut up = Uploader::new(gpu)?;
        let embed = matrix(
            gpu,
            &mut up,
            &w.embed,
            (cfg.vocab_size, cfg.hidden_size),
            half,
            Rows::AsIs,
            EMBEDDING,
        )?;
        let up_rows = if cfg.arch.mlp == Mlp::Gelu {
            Rows::AsIs
        } else {
            Rows::HalvesInterleaved
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for (l, lw) in w.layers.iter().enumerate() {
            if l > 0 && l % 8 == 0 {
                tracing::info!("uploading the weights: layer {l} of {}", w.layers.len());
            }
            let qk_norm = match (&lw.q_norm, &lw.k_norm) {
                (Some(q), Some(k)) => Some((gpu.upload(q)?, gpu.upload(k)?)),
                _ => None,
            };
            layers.push(GpuLayer {
                attn_norm: norm(gpu, &lw.attn_norm)?,
                qkv: linear(gpu, &mut up, &lw.qkv, half, Rows::AsIs)?,
                qk_norm,
                o: linear(gpu, &mut up, &lw.o, half, Rows::AsIs)?,
                post_attn_norm: lw
                    .post_attn_norm
                    .as_ref()
                    .map(|n| norm(gpu, n))
                    .transpose()?,
                ffn_norm: norm(gpu, &lw.ffn_norm)?,
                gate_up: linear(gpu, &mut up, &lw.gate_up, half, up_rows)?,
                down: linear(gpu, &mut up, &lw.down, half, Rows::AsIs)?,
                post_ffn_norm: lw
                    .post_ffn_norm
                    .as_ref()
                    .map(|n| norm(gpu, n))
                    .transpose()?,
            });
        }
        let inv_freq = if cfg.arch.learned_positions {
            vec![0f32; cfg.head_dim / 2]
        } else {
            [model.inv_freq(), model.long_inv_freq().unwrap_or_default()].concat()
        };
        let mut weights = GpuWeights {
            half,
            embed,
            pos_embed: w.pos_embed.as_deref().map(|p| gpu.upload(p)).transpose()?,
            layers,
            final_norm: norm(gpu, &w.final_norm)?,
            lm_head: w
                .lm_head
                .as_ref()
                .map(|l| linear(gpu, &mut up, l, half, Rows::AsIs))
                .transpose()?,
            inv_freq: gpu.upload(&inv_freq)?,
            long_rope: model.long_inv_freq().is_some() && !cfg.arch.learned_positions,
            local_inv_freq: model.local_inv_freq().map(|f| gpu.upload(f)).transpose()?,
            qscratch: None,
        };
        // The panel: the widest quantized row's whole 64-row groups in PANEL_BYTES, or
        // the smallest quantized matrix whole where that is less.
        let quant = weights.matrices().filter_map(|m| match m {
            GpuMatrix::Quant(q) => Some((q.rows, q.cols)),
            GpuMatrix::Half(_) => None,
        });
        let panel = quant.fold(None, |acc: Option<usize>, (rows, cols)| {
            let want = (rows * cols).min((PANEL_BYTES / 2 / cols.max(1)).max(64) * cols);
            Some(acc.map_or(want, |a| a.max(want)))
        });
        weights.qscratch = panel.map(|len| QScratch::new(gpu, len)).transpose()?;
        let on_device = weights.matrix_bytes();
        let mapped = up.bytes;
        up.finish()?;
        gpu.sync()?;
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            seconds = format!("{seconds:.2}"),
            gb_from_map = format!("{:.2}", mapped as f64 / 1e9),
            gb_per_s = format!("{:.2}", mapped as f64 / 1e9 / seconds.max(1e-9)),
            matrices_gb = format!("{:.3}", on_device as f64 / 1e9),
            "weights uploaded"
        );
        Ok(weights)
    }
}

#[cfg(test)]
mod tests {
    use super::interleave_halves;

    #[test]
    fn gate_and_up_rows_alternate() {
        // Rows g0 g1 g2 | u0 u1 u2 of two columns each.
        let v = [1, 2, 3, 4, 5, 6, 11, 12, 13, 14, 15, 16];
        assert_eq!(
            interleave_halves(&v, 6, 2),
            vec![1, 2, 11, 12, 3, 4, 13, 14, 5, 6, 15, 16]
        );
        // One column: an activation row [gate | up].
        assert_eq!(interleave_halves(&[1, 2, 9, 8], 4, 1), vec![1, 9, 2, 8]);
    }
}
