//! Matrix product with block-quantized weights, `y = x · Wᵀ`, the way llama.cpp's CPU
//! backend computes it: each row of `x` is quantized to int8 in blocks of 32 (one f32
//! scale per block; blocks of 256 for the K-quants), and every weight block meets its
//! activation block in an exact integer dot product, scaled once per block. Weights stay
//! near their GGUF size in memory (Q4: 6 bits per weight with f32 scales, Q8: 9; Q4_K,
//! Q5_K and Q6_K: their GGUF super-blocks as stored, 4.5, 5.5 and 6.56 bits), so a decode
//! step reads 1.8 to 7 times fewer bytes than with f16 or f32 weights. The K-quant kernels
//! are in `kquant`; the other GGUF types (Q2_K, Q3_K, Q5_0, Q5_1, IQ4_NL, IQ4_XS) are not
//! kept here: the loader dequantizes them to f16.

use half::f16;

use super::parallel::{add_bias, for_row_ranges, SendPtr};

use crate::model::kquant::{self as kq, QK_K};
use crate::model::quant::{q5_codes, GgmlType, QK};

mod kquant;

/// How a weight block's values are coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QFormat {
    /// 4-bit codes `q` in 0..=15, value `d·q + m` (ggml's Q4_1; Q4_0 is `m = -8d`).
    Q4,
    /// 8-bit signed codes, value `d·q` (ggml's Q8_0; Q5_0 widened: `q - 16`).
    Q8,
    /// 8-bit codes plus a minimum, value `d·q + m` (ggml's Q5_1 widened to a byte a code).
    Q8M,
    /// ggml's Q4_K super-blocks of 256, as stored.
    Q4K,
    /// ggml's Q5_K super-blocks of 256, as stored.
    Q5K,
    /// ggml's Q6_K super-blocks of 256, as stored.
    Q6K,
}

impl QFormat {
    /// Formats whose blocks add a minimum `m` (times the activation block's sum).
    fn has_min(self) -> bool {
        matches!(self, QFormat::Q4 | QFormat::Q8M)
    }

    /// The K-quant formats, kept as GGUF super-blocks (no separate scale arrays).
    fn super_blocks(self) -> Option<GgmlType> {
        match self {
            QFormat::Q4 | QFormat::Q8 | QFormat::Q8M => None,
            QFormat::Q4K => Some(GgmlType::Q4_K),
            QFormat::Q5K => Some(GgmlType::Q5_K),
            QFormat::Q6K => Some(GgmlType::Q6_K),
        }
    }
}

/// A `[rows, cols]` weight matrix quantized in blocks along each row: bands of rows of
/// one format each. A matrix read from one GGUF tensor is one band; `concat` may stack
/// bands of different formats (llama.cpp's Q4_K_M gives some layers a Q6_K `v` beside
/// Q4_K `q` and `k`), and each band runs its own kernel.
pub struct QMatrix {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    parts: Vec<QPart>,
}

/// Rows of one format.
struct QPart {
    format: QFormat,
    rows: usize,
    cols: usize,
    /// Q4 and Q8, per block of 32: scale.
    d: Vec<f32>,
    /// Q4 only, per block of 32: offset.
    m: Vec<f32>,
    /// Q4: 16 bytes per block, value j in the low nibble of byte j, value j+16 in the high
    /// nibble (ggml's layout). Q8: 32 bytes per block. K-quants: the GGUF super-blocks,
    /// scales included.
    qs: Vec<u8>,
}

impl QMatrix {
    /// Wraps GGUF blocks of `ty` (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K or Q6_K) holding a
    /// `[rows, cols]` matrix; None for other types or sizes that do not fit.
    pub fn from_ggml(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        let part = QPart::from_ggml(ty, bytes, rows, cols)?;
        Some(QMatrix {
            rows,
            cols,
            parts: vec![part],
        })
    }

    /// Bytes the matrix takes in memory, all of which a product reads once.
    pub fn weight_bytes(&self) -> usize {
        self.parts.iter().map(QPart::weight_bytes).sum()
    }

    /// The band holding row `r`, and the row's index within it.
    fn locate(&self, mut r: usize) -> (&QPart, usize) {
        for p in &self.parts {
            if r < p.rows {
                return (p, r);
            }
            r -= p.rows;
        }
        panic!("row {r} past the matrix's {} rows", self.rows)
    }

    /// Reorders rows: row `r` of the result is row `order[r]` of `self`.
    pub(crate) fn permute_rows(&mut self, order: &[usize]) {
        let mut parts: Vec<QPart> = Vec::new();
        for &r in order {
            let (src, lr) = self.locate(r);
            match parts.last_mut() {
                Some(p) if p.format == src.format => p.push_row(src, lr),
                _ => {
                    let mut p = QPart::empty(src.format, self.cols);
                    p.push_row(src, lr);
                    parts.push(p);
                }
            }
        }
        self.rows = order.len();
        self.parts = parts;
    }

    /// Stacks matrices of the same width (fused QKV, gate‖up); bands of one format that
    /// meet are merged.
    pub(crate) fn concat(parts: Vec<QMatrix>) -> Option<QMatrix> {
        let mut it = parts.into_iter();
        let mut out = it.next()?;
        for q in it {
            if q.cols != out.cols {
                return None;
            }
            out.rows += q.rows;
            for p in q.parts {
                match out.parts.last_mut() {
                    Some(last) if last.format == p.format => last.append(p),
                    _ => out.parts.push(p),
                }
            }
        }
        Some(out)
    }

    /// The matrix's bands, top to bottom, as the GPU engine copies them.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn bands(&self) -> impl Iterator<Item = QBand<'_>> {
        self.parts.iter().map(|p| QBand {
            format: p.format,
            rows: p.rows,
            cols: p.cols,
            d: &p.d,
            m: &p.m,
            qs: &p.qs,
        })
    }

    /// Dequantizes row `r` into `out` (`cols` values), bit for bit as `quant::dequantize`.
    pub(crate) fn row_into(&self, r: usize, out: &mut [f32]) {
        let (p, lr) = self.locate(r);
        p.row_into(lr, out);
    }
}

/// A band of a [`QMatrix`] as stored: rows of one format, their codes `qs` (for K-quants
/// the GGUF super-blocks) and, for the 32-value formats, a scale `d` and, where the format
/// has one, a minimum `m` per block of 32 (f32, each exactly an f16 of the file's, or
/// -8·d for Q4_0).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct QBand<'a> {
    pub format: QFormat,
    pub rows: usize,
    pub cols: usize,
    pub d: &'a [f32],
    pub m: &'a [f32],
    pub qs: &'a [u8],
}

impl QPart {
    fn from_ggml(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        if !cols.is_multiple_of(ty.block_len()) || ty.bytes_for(rows * cols)? != bytes.len() {
            return None;
        }
        let format = match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => QFormat::Q4,
            GgmlType::Q8_0 | GgmlType::Q5_0 => QFormat::Q8,
            GgmlType::Q5_1 => QFormat::Q8M,
            GgmlType::Q4_K => QFormat::Q4K,
            GgmlType::Q5_K => QFormat::Q5K,
            GgmlType::Q6_K => QFormat::Q6K,
            _ => return None,
        };
        let mut q = QPart::empty(format, cols);
        q.rows = rows;
        if format.super_blocks().is_some() {
            q.qs = bytes.to_vec();
            return Some(q);
        }
        let h = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        let blocks = bytes.chunks_exact(ty.block_bytes());
        q.d.reserve(blocks.len());
        q.qs.reserve(rows * cols);
        for b in blocks {
            match ty {
                GgmlType::Q4_0 => {
                    q.d.push(h(b, 0));
                    q.m.push(-8.0 * h(b, 0));
                    q.qs.extend_from_slice(&b[2..]);
                }
                GgmlType::Q4_1 => {
                    q.d.push(h(b, 0));
                    q.m.push(h(b, 2));
                    q.qs.extend_from_slice(&b[4..]);
                }
                // Q5 codes widened to a byte each: exact, and the Q8 kernels run them.
                GgmlType::Q5_0 => {
                    q.d.push(h(b, 0));
                    let codes = q5_codes(&b[2..6], &b[6..]);
                    q.qs.extend(codes.iter().map(|&c| (c as i8 - 16) as u8));
                }
                GgmlType::Q5_1 => {
                    q.d.push(h(b, 0));
                    q.m.push(h(b, 2));
                    q.qs.extend_from_slice(&q5_codes(&b[4..8], &b[8..]));
                }
                _ => {
                    q.d.push(h(b, 0));
                    q.qs.extend_from_slice(&b[2..]);
                }
            }
        }
        Some(q)
    }

    /// No rows yet.
    fn empty(format: QFormat, cols: usize) -> Self {
        QPart {
            format,
            rows: 0,
            cols,
            d: Vec::new(),
            m: Vec::new(),
            qs: Vec::new(),
        }
    }

    /// Bytes of `qs` per block of 32 (Q4 and Q8).
    fn block_bytes(&self) -> usize {
        match self.format {
            QFormat::Q4 => QK / 2,
            QFormat::Q8 | QFormat::Q8M => QK,
            QFormat::Q4K | QFormat::Q5K | QFormat::Q6K => {
                unreachable!("K-quant rows are whole super-blocks")
            }
        }
    }

    /// Bytes of `qs` per row.
    fn row_bytes(&self) -> usize {
        match self.format.super_blocks() {
            Some(ty) => self.cols / QK_K * ty.block_bytes(),
            None => self.cols / QK * self.block_bytes(),
        }
    }

    fn weight_bytes(&self) -> usize {
        self.qs.len() + 4 * (self.d.len() + self.m.len())
    }

    /// Appends row `r` of `src` (of this format and width).
    fn push_row(&mut self, src: &QPart, r: usize) {
        // Per-block scales (Q4, Q8): one per 32 values of a row; none for K-quants.
        let spr = self.cols / QK;
        if !src.d.is_empty() {
            self.d.extend_from_slice(&src.d[r * spr..(r + 1) * spr]);
        }
        if !src.m.is_empty() {
            self.m.extend_from_slice(&src.m[r * spr..(r + 1) * spr]);
        }
        let rb = src.row_bytes();
        self.qs.extend_from_slice(&src.qs[r * rb..(r + 1) * rb]);
        self.rows += 1;
    }

    /// Appends all rows of `p` (of this format and width).
    fn append(&mut self, p: QPart) {
        self.rows += p.rows;
        self.d.extend(p.d);
        self.m.extend(p.m);
        self.qs.extend(p.qs);
    }

    fn row_into(&self, r: usize, out: &mut [f32]) {
        if let Some(ty) = self.format.super_blocks() {
            let rb = self.row_bytes();
            let block: fn(&[u8], &mut [f32]) = match ty {
                GgmlType::Q4_K => kq::dequantize_q4_k,
                GgmlType::Q5_K => kq::dequantize_q5_k,
                _ => kq::dequantize_q6_k,
            };
            let row = &self.qs[r * rb..(r + 1) * rb];
            for (b, o) in row
                .chunks_exact(ty.block_bytes())
                .zip(out.chunks_exact_mut(QK_K))
            {
                block(b, o);
            }
            return;
        }
        let bpr = self.cols / QK;
        let bb = self.block_bytes();
        for (b, o) in out.chunks_exact_mut(QK).enumerate() {
            let blk = r * bpr + b;
            let qs = &self.qs[blk * bb..(blk + 1) * bb];
            let d = self.d[blk];
            if self.format == QFormat::Q4 {
                let m = self.m[blk];
                for j in 0..QK / 2 {
                    o[j] = (qs[j] & 0x0f) as f32 * d + m;
                    o[j + QK / 2] = (qs[j] >> 4) as f32 * d + m;
                }
            } else if self.format == QFormat::Q8M {
                let m = self.m[blk];
                for (v, &q) in o.iter_mut().zip(qs) {
                    *v = q as f32 * d + m;
                }
            } else {
                for (v, &q) in o.iter_mut().zip(qs) {
                    *v = q as i8 as f32 * d;
                }
            }
        }
    }
}

/// Rows of activations quantized to int8 in blocks of 32.
struct QActs {
    q: Vec<i8>,
    d: Vec<f32>,
    /// `d · Σq` per block, for the Q4 offset term.
    s: Vec<f32>,
}

fn quantize_acts(x: &[f32]) -> QActs {
    let nb = x.len() / QK;
    let mut a = QActs {
        q: vec![0; x.len()],
        d: Vec::with_capacity(nb),
        s: Vec::with_capacity(nb),
    };
    for (xb, qb) in x.chunks_exact(QK).zip(a.q.chunks_exact_mut(QK)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        a.d.push(d);
        a.s.push(d * sum as f32);
    }
    a
}

const ROWS_PER_JOB: usize = 32;
/// Activation rows sharing one unpacked weight block.
const TOKENS: usize = 4;

/// `y[t, o] = Σ_i x[t, i] · w[o, i] (+ bias[o])` with `x` `[n, w.cols]`, `y` `[n, w.rows]`.
pub(crate) fn qlinear(x: &[f32], w: &QMatrix, bias: Option<&[f32]>, n: usize, y: &mut [f32]) {
    let (k, m) = (w.cols, w.rows);
    assert_eq!(x.len(), n * k, "x is not [n, k]");
    assert_eq!(y.len(), n * m, "y is not [n, m]");
    // Activations as each band's format meets them: int8 blocks of 32 for Q4/Q8, of 256
    // for the K-quants.
    let is_k = |p: &QPart| p.format.super_blocks().is_some();
    let acts = w.parts.iter().any(|p| !is_k(p)).then(|| quantize_acts(x));
    let kacts = w.parts.iter().any(is_k).then(|| kquant::quantize_acts(x));
    let avx = has_avx2();
    let out = SendPtr::new(y);
    for_row_ranges(m, ROWS_PER_JOB, n * m * k, |o0, o1| {
        for o in o0..o1 {
            let (part, po) = w.locate(o);
            // Up to TOKENS rows of x per pass, so each weight block is unpacked once for
            // all of them; every row's sum is formed in the same order whatever the group.
            let mut t = 0;
            while t < n {
                let rows = (n - t).min(TOKENS);
                let mut v = [0f32; TOKENS];
                match (&acts, &kacts) {
                    (_, Some(ka)) if is_k(part) => {
                        kquant::dot_rows(part, po, ka, t, rows, avx, &mut v)
                    }
                    (Some(a), _) => dot_rows(part, po, a, t, rows, avx, &mut v),
                    _ => unreachable!("activations are quantized for every band's format"),
                }
                for (r, value) in v[..rows].iter().enumerate() {
                    // SAFETY: t + r < n and o < m; only this job writes column o.
                    unsafe { *out.get().add((t + r) * m + o) = *value };
                }
                t += rows;
            }
        }
    });
    add_bias(y, bias);
}

/// Whether the AVX2 kernels run: AVX2, FMA and F16C (which the K-quant kernels use to
/// read their f16 scales; every AVX2 CPU has it).
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Dot products of Q4/Q8 weight row `o` with activation rows `t..t + rows` (rows <= TOKENS).
#[inline]
fn dot_rows(
    w: &QPart,
    o: usize,
    a: &QActs,
    t: usize,
    rows: usize,
    avx: bool,
    out: &mut [f32; TOKENS],
) {
    #[cfg(target_arch = "x86_64")]
    if avx {
        let bpr = w.cols / QK;
        // SAFETY: AVX2 and FMA are present (checked at run time); rows <= TOKENS.
        unsafe {
            match rows {
                1 => dot_rows_avx2::<1>(w, o, a, t, bpr, out),
                2 => dot_rows_avx2::<2>(w, o, a, t, bpr, out),
                3 => dot_rows_avx2::<3>(w, o, a, t, bpr, out),
                _ => dot_rows_avx2::<4>(w, o, a, t, bpr, out),
            }
        }
        return;
    }
    for (r, o_r) in out.iter_mut().enumerate().take(rows) {
        *o_r = dot_row(w, o, a, t + r, avx);
    }
}

/// Dot product of Q4/Q8 weight row `o` with activation row `t`.
#[inline]
fn dot_row(w: &QPart, o: usize, a: &QActs, t: usize, avx: bool) -> f32 {
    let bpr = w.cols / QK;
    #[cfg(target_arch = "x86_64")]
    if avx {
        let mut v = [0f32; TOKENS];
        // SAFETY: AVX2 and FMA are present (checked at run time).
        unsafe { dot_rows_avx2::<1>(w, o, a, t, bpr, &mut v) };
        return v[0];
    }
    let _ = avx;
    let bb = w.block_bytes();
    let mut acc = 0f32;
    for b in 0..bpr {
        let (wb, ab) = (o * bpr + b, t * bpr + b);
        let qs = &w.qs[wb * bb..(wb + 1) * bb];
        let qx = &a.q[ab * QK..(ab + 1) * QK];
        let isum: i32 = match w.format {
            QFormat::Q4 => (0..QK / 2)
                .map(|j| {
                    (qs[j] & 0x0f) as i32 * qx[j] as i32
                        + (qs[j] >> 4) as i32 * qx[j + QK / 2] as i32
                })
                .sum(),
            // Q8 (K-quant rows go to `kquant`).
            _ => qs
                .iter()
                .zip(qx)
                .map(|(&q, &x)| q as i8 as i32 * x as i32)
                .sum(),
        };
        acc += w.d[wb] * a.d[ab] * isum as f32;
        if w.format.has_min() {
            acc += w.m[wb] * a.s[ab];
        }
    }
    acc
}

/// The AVX2 kernel for `R` activation rows: per block, the weights are unpacked once and
/// met with each row's int8 values. Each row accumulates exactly as a single row would.
///
/// Safety: the CPU has AVX2 and FMA, `o < w.rows`, `bpr == w.cols / QK`, and `a` holds
/// activation rows `t..t + R` of `bpr` blocks each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_avx2<const R: usize>(
    w: &QPart,
    o: usize,
    a: &QActs,
    t: usize,
    bpr: usize,
    out: &mut [f32; TOKENS],
) {
    use std::arch::x86_64::*;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut offset = [0f32; R];
    // SAFETY: rows t..t + R of `a` exist (the caller's guarantee): each start is inside a.q.
    let qx: [*const i8; R] =
        std::array::from_fn(|r| unsafe { a.q.as_ptr().add((t + r) * bpr * QK) });
    let ad: [&[f32]; R] = std::array::from_fn(|r| &a.d[(t + r) * bpr..(t + r + 1) * bpr]);
    let wd = &w.d[o * bpr..(o + 1) * bpr];
    match w.format {
        QFormat::Q4 => {
            // SAFETY: o < w.rows: the row's QK / 2 bytes per block are inside w.qs.
            let qs = unsafe { w.qs.as_ptr().add(o * bpr * QK / 2) };
            let wm = &w.m[o * bpr..(o + 1) * bpr];
            let low = _mm_set1_epi8(0x0f);
            for b in 0..bpr {
                // SAFETY: b < bpr: block b's 16 bytes are within the row (unaligned load).
                let packed = unsafe { _mm_loadu_si128(qs.add(b * QK / 2) as *const __m128i) };
                let lo = _mm_and_si128(packed, low);
                let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
                let wq = _mm256_set_m128i(hi, lo);
                for r in 0..R {
                    // SAFETY: b < bpr: block b's QK int8 values are within activation row
                    // t + r (unaligned load).
                    let xq = unsafe { _mm256_loadu_si256(qx[r].add(b * QK) as *const __m256i) };
                    let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), ones);
                    let scale = _mm256_set1_ps(wd[b] * ad[r][b]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[r]);
                    offset[r] += wm[b] * a.s[(t + r) * bpr + b];
                }
            }
        }
        // Q8 (K-quant rows go to `kquant`).
        _ => {
            // SAFETY: o < w.rows: the row's QK bytes per block are inside w.qs.
            let qs = unsafe { w.qs.as_ptr().add(o * bpr * QK) };
            for b in 0..bpr {
                // SAFETY: b < bpr: block b's 32 bytes are within the row (unaligned load).
                let wq = unsafe { _mm256_loadu_si256(qs.add(b * QK) as *const __m256i) };
                // maddubs takes unsigned × signed: move w's sign onto x.
                let wabs = _mm256_sign_epi8(wq, wq);
                for r in 0..R {
                    // SAFETY: as for Q4: block b of activation row t + r.
                    let xq = unsafe { _mm256_loadu_si256(qx[r].add(b * QK) as *const __m256i) };
                    let sums = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xq, wq)),
                        ones,
                    );
                    let scale = _mm256_set1_ps(wd[b] * ad[r][b]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[r]);
                }
            }
            if w.format == QFormat::Q8M {
                // Widened Q5_1: each block's minimum times the activation block's sum.
                let wm = &w.m[o * bpr..(o + 1) * bpr];
                for (r, off) in offset.iter_mut().enumerate() {
                    let s = &a.s[(t + r) * bpr..(t + r + 1) * bpr];
                    *off = wm.iter().zip(s).map(|(m, s)| m * s).sum();
                }
            }
        }
    }
    for r in 0..R {
        // SAFETY: an `__m256` is eight f32 lanes, and every bit pattern is an f32.
        let lanes: [f32; 8] = unsafe { std::mem::transmute(acc[r]) };
        out[r] = lanes.iter().sum::<f32>() + offset[r];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf_writer::encode;
    use rand::{Rng, SeedableRng};

    #[test]
    fn integer_path_matches_dequantized_product() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
        ] {
            for &(n, k, m) in &[(1, 32, 1), (3, 64, 5), (5, 576, 70)] {
                let wf: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let x: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let q = QMatrix::from_ggml(ty, &encode(ty, &wf), m, k).unwrap();
                let mut deq = vec![0f32; m * k];
                for r in 0..m {
                    q.row_into(r, &mut deq[r * k..(r + 1) * k]);
                }
                // Rows come back equal to the file's values (Q5 widened exactly; Q4_0's
                // `d·q - 8d` may give +0 where `d·(q - 8)` gives -0).
                let want = crate::model::quant::dequantize(ty, &encode(ty, &wf), m * k).unwrap();
                assert!(deq == want, "{ty:?}: rows differ from the dequantized file");
                let mut y = vec![f32::NAN; n * m];
                qlinear(&x, &q, None, n, &mut y);
                for t in 0..n {
                    for o in 0..m {
                        let exact: f32 = (0..k).map(|i| x[t * k + i] * deq[o * k + i]).sum();
                        let got = y[t * m + o];
                        // Activation quantization error: about amax/254 per element.
                        let tol = 0.02 * (k as f32).sqrt();
                        assert!(
                            (got - exact).abs() < tol,
                            "{ty:?} ({n},{k},{m}) [{t},{o}]: {got} vs {exact}"
                        );
                    }
                }
                // The portable and AVX2 paths agree exactly (integer sums, same order of scales)
                // up to f32 summation order.
                let acts = quantize_acts(&x);
                for o in 0..m {
                    let a = dot_row(&q.parts[0], o, &acts, 0, false);
                    let b = dot_row(&q.parts[0], o, &acts, 0, has_avx2());
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                        "{ty:?}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn grouped_rows_equal_single_rows_exactly() {
        // Batch invariance: a token's result must not depend on which tokens share its pass.
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_1] {
            let (n, k, m) = (7, 96, 5);
            let wf: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let x: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let q = QMatrix::from_ggml(ty, &encode(ty, &wf), m, k).unwrap();
            let mut batched = vec![0f32; n * m];
            qlinear(&x, &q, None, n, &mut batched);
            for t in 0..n {
                let mut alone = vec![0f32; m];
                qlinear(&x[t * k..(t + 1) * k], &q, None, 1, &mut alone);
                assert_eq!(&batched[t * m..(t + 1) * m], &alone[..], "{ty:?} token {t}");
            }
        }
    }

    #[test]
    fn permute_and_concat_move_whole_rows() {
        let wf: Vec<f32> = (0..4 * 32).map(|i| (i / 32) as f32).collect();
        let mut q =
            QMatrix::from_ggml(GgmlType::Q8_0, &encode(GgmlType::Q8_0, &wf), 4, 32).unwrap();
        q.permute_rows(&[3, 1, 2, 0]);
        let mut row = vec![0f32; 32];
        q.row_into(0, &mut row);
        assert!(row.iter().all(|&v| (v - 3.0).abs() < 0.03));
        let q2 =
            QMatrix::from_ggml(GgmlType::Q8_0, &encode(GgmlType::Q8_0, &wf[..32]), 1, 32).unwrap();
        let c = QMatrix::concat(vec![q, q2]).unwrap();
        assert_eq!(c.rows, 5);
        c.row_into(4, &mut row);
        assert!(row.iter().all(|&v| v.abs() < 0.03));
    }
}
