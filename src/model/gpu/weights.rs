//! Llama weights on the GPU: every matrix in the model's 16-bit type (f16 by default:
//! HF checkpoints' bf16 values, which f16 holds exactly in its range, and GGUF's quantized
//! tensors dequantized here, exactly as the CPU engine holds them; bf16 on request or when
//! a weight overflows f16), norms, biases and RoPE frequencies in fp32.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::kernels::cuda::{DevBuf, Gpu, Half};
use crate::kernels::matmul::Matrix;
use crate::model::weights::Linear;
use crate::model::Llama;

/// A linear layer `y = x · Wᵀ (+ b)`, `w` row-major `[rows, cols]` (16-bit).
pub struct GpuLinear {
    pub w: DevBuf<u16>,
    pub b: Option<DevBuf<f32>>,
}

pub struct GpuLayer {
    pub attn_norm: DevBuf<f32>,
    pub qkv: GpuLinear,
    pub o: GpuLinear,
    pub ffn_norm: DevBuf<f32>,
    /// Gate and up rows interleaved ([`interleave_halves`]): gate i at row 2i, up i at
    /// 2i + 1, so that the GEMV kernel's pair of rows is one SwiGLU input.
    pub gate_up: GpuLinear,
    pub down: GpuLinear,
}

pub struct GpuWeights {
    /// The 16-bit type of the matrices (and of the GEMM inputs and KV cache).
    pub half: Half,
    /// `[vocab, hidden]`, also the LM head when tied.
    pub embed: DevBuf<u16>,
    pub layers: Vec<GpuLayer>,
    pub final_norm: DevBuf<f32>,
    pub lm_head: Option<GpuLinear>,
    pub inv_freq: DevBuf<f32>,
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

/// How a linear layer's rows are laid out on the GPU.
#[derive(Clone, Copy, PartialEq)]
enum Rows {
    AsIs,
    /// [`interleave_halves`]: the MLP's gate|up layer.
    HalvesInterleaved,
}

fn arranged<T: Copy>(v: Vec<T>, rows: usize, cols: usize, order: Rows) -> Vec<T> {
    match order {
        Rows::AsIs => v,
        Rows::HalvesInterleaved => interleave_halves(&v, rows, cols),
    }
}

fn linear(gpu: &Gpu, l: &Linear, half: Half, order: Rows) -> Result<GpuLinear> {
    let bits = to_half_checked(&l.w, l.rows, l.cols, half, "a linear layer")?;
    Ok(GpuLinear {
        w: gpu.upload(&arranged(bits, l.rows, l.cols, order))?,
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
        let embed = gpu.upload(&to_half_checked(
            &w.embed,
            cfg.vocab_size,
            cfg.hidden_size,
            half,
            "the embedding",
        )?)?;
        let mut layers = Vec::with_capacity(w.layers.len());
        for lw in &w.layers {
            layers.push(GpuLayer {
                attn_norm: gpu.upload(&lw.attn_norm)?,
                qkv: linear(gpu, &lw.qkv, half, Rows::AsIs)?,
                o: linear(gpu, &lw.o, half, Rows::AsIs)?,
                ffn_norm: gpu.upload(&lw.ffn_norm)?,
                gate_up: linear(gpu, &lw.gate_up, half, Rows::HalvesInterleaved)?,
                down: linear(gpu, &lw.down, half, Rows::AsIs)?,
            });
        }
        let weights = GpuWeights {
            half,
            embed,
            layers,
            final_norm: gpu.upload(&w.final_norm)?,
            lm_head: w
                .lm_head
                .as_ref()
                .map(|l| linear(gpu, l, half, Rows::AsIs))
                .transpose()?,
            inv_freq: gpu.upload(model.inv_freq())?,
        };
        gpu.sync()?;
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
