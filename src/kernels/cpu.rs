//! CPU kernels of the forward pass: RMSNorm, LayerNorm, RoPE, SwiGLU, GeGLU, GELU,
//! soft-capping and paged attention (causal, optionally windowed and soft-capped). Each is
//! the CPU twin of a CUDA kernel and the production CPU path.

use rayon::prelude::*;

/// `out[r] = x[r] / sqrt(mean(x[r]²) + eps) * w` for every row of width `w.len()`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let scale = 1.0 / (ss / d as f32 + eps).sqrt();
        for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// [`rms_norm`] in place: every row of width `w.len()` of `x` (per head, for q/k norms).
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for xr in x.chunks_exact_mut(d) {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let scale = 1.0 / (ss / d as f32 + eps).sqrt();
        for (v, g) in xr.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// `out[r] = (x[r] - mean) / sqrt(var + eps) * w + b` for every row of width `w.len()`.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean = xr.iter().sum::<f32>() / d as f32;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let scale = 1.0 / (var + eps).sqrt();
        for (((o, v), g), b) in or.iter_mut().zip(xr).zip(w).zip(b) {
            *o = (v - mean) * scale * g + b;
        }
    }
}

/// GELU, tanh approximation (`gelu_pytorch_tanh`, GPT-2's `gelu_new`).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

/// GeGLU on a fused `[n, 2 * f]` gate‖up product: `out = gelu_tanh(gate) * up`, `[n, f]`.
pub fn gelu_mul(gate_up: &[f32], f: usize, out: &mut [f32]) {
    for (gu, o) in gate_up.chunks_exact(2 * f).zip(out.chunks_exact_mut(f)) {
        let (g, u) = gu.split_at(f);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = gelu_tanh(g) * u;
        }
    }
}

/// `out = gelu_tanh(x)` elementwise (GPT-2's ungated MLP).
pub fn gelu(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = gelu_tanh(v);
    }
}

/// `x = cap * tanh(x / cap)` elementwise (Gemma 2's logit soft-capping).
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

/// Rotary embedding in the HF ("rotate half") layout: within each head of `head_dim`,
/// element `i` pairs with element `i + head_dim/2`. `x` is `[n, heads * head_dim]` and row
/// `r` sits at position `positions[r]`.
pub fn rope(x: &mut [f32], positions: &[usize], head_dim: usize, inv_freq: &[f32]) {
    let half = head_dim / 2;
    let row = x.len() / positions.len().max(1);
    for (xr, &pos) in x.chunks_exact_mut(row).zip(positions) {
        for i in 0..half {
            let (sin, cos) = (pos as f64 * inv_freq[i] as f64).sin_cos();
            let (sin, cos) = (sin as f32, cos as f32);
            for head in xr.chunks_exact_mut(head_dim) {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos - b * sin;
                head[i + half] = b * cos + a * sin;
            }
        }
    }
}

/// SwiGLU on a fused `[n, 2 * f]` gate‖up product: `out = silu(gate) * up`, `[n, f]`.
pub fn silu_mul(gate_up: &[f32], f: usize, out: &mut [f32]) {
    for (gu, o) in gate_up.chunks_exact(2 * f).zip(out.chunks_exact_mut(f)) {
        let (g, u) = gu.split_at(f);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// An element type the KV cache can hold.
pub trait KvElem: Copy + Send + Sync {
    fn from_f32(v: f32) -> Self;
    /// Converts a row (vectorized where the CPU allows).
    fn row_to_f32(src: &[Self], dst: &mut [f32]);
    /// Rounds values to this type's precision, in place.
    fn round(values: &mut [f32]);
}

impl KvElem for f32 {
    #[inline]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline]
    fn row_to_f32(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn round(_: &mut [f32]) {}
}

impl KvElem for half::f16 {
    #[inline]
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
    #[inline]
    fn row_to_f32(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    fn round(values: &mut [f32]) {
        for v in values {
            *v = half::f16::from_f32(*v).to_f32();
        }
    }
}

/// One layer's paged K or V storage: `[num_blocks, block_size, kv_dim]`.
pub struct PagedView<'a, T> {
    pub data: &'a [T],
    pub block_size: usize,
    pub kv_dim: usize,
}

impl<T: KvElem> PagedView<'_, T> {
    /// The `kv_dim` values stored for token position `pos` of a sequence.
    #[inline]
    fn at(&self, block_table: &[u32], pos: usize) -> &[T] {
        let block = block_table[pos / self.block_size] as usize;
        let s = (block * self.block_size + pos % self.block_size) * self.kv_dim;
        &self.data[s..s + self.kv_dim]
    }
}

/// What one query row attends to: its sequence's blocks and its own position (causal:
/// it sees positions `0..=pos`).
#[derive(Clone, Copy)]
pub struct AttnRow<'a> {
    pub block_table: &'a [u32],
    pub pos: usize,
}

/// How scores are formed: `scale · q·k`, then soft-capped where `softcap` is set; a
/// query at position `p` sees keys `p - window + 1 ..= p` where `window` is set.
#[derive(Clone, Copy, Debug)]
pub struct AttnOpts {
    pub scale: f32,
    pub softcap: Option<f32>,
    pub window: Option<usize>,
}

impl AttnOpts {
    /// Plain causal attention scaled by `1/sqrt(head_dim)`.
    #[cfg_attr(not(any(test, feature = "gpu-tools")), allow(dead_code))]
    pub fn plain(head_dim: usize) -> Self {
        AttnOpts {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            window: None,
        }
    }
}

/// Causal paged attention with grouped KV heads. `q` is `[n, heads * head_dim]`, `out`
/// the same shape; query head `h` reads KV head `h / (heads / kv_heads)`. The query is
/// rounded to the cache's element type before the scores, so `q·k` is computed at the
/// precision the keys are stored in (with an f16 cache this is what llama.cpp does too).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<T: KvElem>(
    q: &[f32],
    rows: &[AttnRow<'_>],
    k: &PagedView<'_, T>,
    v: &PagedView<'_, T>,
    heads: usize,
    head_dim: usize,
    opts: &AttnOpts,
    out: &mut [f32],
) {
    let kv_heads = k.kv_dim / head_dim;
    let group = heads / kv_heads;
    let scale = opts.scale;
    // One job per (row, KV head): the query heads of a group are contiguous, and each K/V
    // row is converted once for all of them.
    let span = group * head_dim;
    out.par_chunks_mut(span).enumerate().for_each(|(idx, o)| {
        let (r, g) = (idx / kv_heads, idx % kv_heads);
        let row = &rows[r];
        let mut qg = q[idx * span..(idx + 1) * span].to_vec();
        T::round(&mut qg);
        let kvo = g * head_dim;
        let first = opts.window.map_or(0, |w| (row.pos + 1).saturating_sub(w));
        let n = row.pos + 1 - first;
        let mut buf = vec![0f32; head_dim];
        let mut scores = vec![0f32; group * n];
        for i in 0..n {
            T::row_to_f32(
                &k.at(row.block_table, first + i)[kvo..kvo + head_dim],
                &mut buf,
            );
            for h in 0..group {
                scores[h * n + i] = dot(&qg[h * head_dim..(h + 1) * head_dim], &buf) * scale;
            }
        }
        if let Some(cap) = opts.softcap {
            scores.iter_mut().for_each(|s| *s = cap * (*s / cap).tanh());
        }
        for s in scores.chunks_exact_mut(n) {
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for x in s.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            s.iter_mut().for_each(|x| *x /= sum);
        }
        o.fill(0.0);
        for i in 0..n {
            T::row_to_f32(
                &v.at(row.block_table, first + i)[kvo..kvo + head_dim],
                &mut buf,
            );
            for h in 0..group {
                let w = scores[h * n + i];
                for (a, b) in o[h * head_dim..(h + 1) * head_dim].iter_mut().zip(&buf) {
                    *a += w * b;
                }
            }
        }
    });
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0, 4.0, 0.0, 0.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0, 2.0], 1e-12, &mut out);
        let s = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / s).abs() < 1e-6 && (out[1] - 8.0 / s).abs() < 1e-6);
        assert_eq!(&out[2..], &[0.0, 0.0]);
    }

    #[test]
    fn rope_rotates_pairs_by_position() {
        // head_dim 4: pairs (0,2) with freq 1, (1,3) with freq 0.5.
        let mut x = vec![1.0, 1.0, 0.0, 0.0];
        rope(&mut x, &[2], 4, &[1.0, 0.5]);
        assert!((x[0] - 2f32.cos()).abs() < 1e-6 && (x[2] - 2f32.sin()).abs() < 1e-6);
        assert!((x[1] - 1f32.cos()).abs() < 1e-6 && (x[3] - 1f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn attention_reads_blocks_through_the_table() {
        // One KV head of dim 2, block size 2, three positions stored in blocks 3 and 1.
        let block_size = 2;
        let mut kd = vec![0f32; 4 * block_size * 2];
        let mut vd = kd.clone();
        let table = [3u32, 1];
        let keys = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
        let vals = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]];
        for p in 0..3 {
            let s = (table[p / 2] as usize * block_size + p % 2) * 2;
            kd[s..s + 2].copy_from_slice(&keys[p]);
            vd[s..s + 2].copy_from_slice(&vals[p]);
        }
        let k = PagedView::<f32> {
            data: &kd,
            block_size,
            kv_dim: 2,
        };
        let v = PagedView::<f32> {
            data: &vd,
            block_size,
            kv_dim: 2,
        };
        let q = [2.0f32, 0.0];
        let mut out = [0f32; 2];
        paged_attention(
            &q,
            &[AttnRow {
                block_table: &table,
                pos: 2,
            }],
            &k,
            &v,
            1,
            2,
            &AttnOpts::plain(2),
            &mut out,
        );
        let s: Vec<f32> = keys.iter().map(|kk| (2.0 * kk[0]) / 2f32.sqrt()).collect();
        let e: Vec<f32> = s.iter().map(|x| x.exp()).collect();
        let z: f32 = e.iter().sum();
        let want0: f32 = (0..3).map(|p| e[p] / z * vals[p][0]).sum();
        assert!((out[0] - want0).abs() < 1e-5, "{} vs {want0}", out[0]);
    }
}
