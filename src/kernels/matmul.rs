//! Multi-threaded matrix product `y = x · Wᵀ (+ b)` for linear layers: `x` and `y` f32,
//! `W` row-major `[out, in]` (the HF layout) stored as f32 or f16, accumulated in f32.
//! Register-tiled, and dispatched at run time to an AVX2+FMA+F16C build of the same code
//! where the CPU has it.
//!
//! Decode reads every weight once per token, so it is bound by memory bandwidth: f16
//! storage halves the bytes moved for weights that came from half or quantized sources.

use super::parallel::{add_bias, for_row_ranges, SendPtr};
use super::qmatmul::{qlinear, QMatrix};
use crate::model::stored::Stored;
use half::f16;

/// A weight matrix's storage.
pub enum Matrix {
    /// Row-major f32 values.
    F32(Vec<f32>),
    /// Row-major f16 values, widened to f32 as they are multiplied.
    F16(Vec<f16>),
    /// Block-quantized (from GGUF Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K), multiplied with int8
    /// activations.
    Quant(QMatrix),
    /// 16-bit values left in a checkpoint's memory map, for the GPU engine's upload
    /// ([`Stored`]); multiplied here only after converting them all (a host copy of a GPU
    /// model is never run by the CPU engine).
    Stored(Stored),
}

impl Matrix {
    /// Copies row `r` (of width `cols`) out as f32.
    pub(crate) fn row_into(&self, r: usize, cols: usize, out: &mut [f32]) {
        match self {
            Matrix::F32(v) => out.copy_from_slice(&v[r * cols..(r + 1) * cols]),
            Matrix::F16(v) => {
                for (o, x) in out.iter_mut().zip(&v[r * cols..(r + 1) * cols]) {
                    *o = x.to_f32();
                }
            }
            Matrix::Quant(q) => q.row_into(r, out),
            Matrix::Stored(s) => s.row_into(r, out),
        }
    }
}

/// An element type weights can be stored in.
trait Elem: Copy + Send + Sync {
    /// Eight consecutive values as f32, portably.
    ///
    /// Safety: `p` points at `LANES` readable values (no alignment needed).
    unsafe fn load8(p: *const Self) -> [f32; LANES];
    /// Eight consecutive values as f32 in an AVX register.
    ///
    /// Safety: as `load8`, and the CPU has AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8_avx(p: *const Self) -> std::arch::x86_64::__m256;
    fn to_f32(self) -> f32;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> [f32; LANES] {
        // SAFETY: the caller guarantees `p` points at LANES readable values.
        unsafe { std::ptr::read_unaligned(p as *const [f32; LANES]) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees `p` points at LANES readable values and that the
        // CPU has AVX2 (an unaligned load).
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Elem for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> [f32; LANES] {
        // SAFETY: the caller guarantees `p` points at LANES readable values.
        let v = unsafe { std::ptr::read_unaligned(p as *const [f16; LANES]) };
        v.map(|x| x.to_f32())
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm256_cvtph_ps, _mm_loadu_si128};
        // SAFETY: the caller guarantees `p` points at LANES readable values (16 bytes, an
        // unaligned load) and that the CPU has AVX2 and F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const _)) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

/// Lanes of one accumulator; 8 f32 fill an AVX register, two SSE ones.
const LANES: usize = 8;
/// Token rows per register tile.
const TX: usize = 4;
/// Weight rows per register tile.
const TW: usize = 3;
/// Weight rows per parallel job (a multiple of TW): 48 rows of 576 floats fit in L2.
const ROWS_PER_JOB: usize = 48;

/// One product's operands: `x` `[n, k]`, `w` `[m, k]`, output `y` `[n, m]`.
#[derive(Clone, Copy)]
struct Gemm<'a, W> {
    x: &'a [f32],
    w: &'a [W],
    n: usize,
    k: usize,
    m: usize,
    y: SendPtr,
}

/// `y[t, o] = Σ_i x[t, i] · w[o, i] + bias[o]` for `n` rows of `x` (`[n, k]`), `w` `[m, k]`,
/// `y` `[n, m]`.
pub fn linear(
    x: &[f32],
    w: &Matrix,
    bias: Option<&[f32]>,
    n: usize,
    k: usize,
    m: usize,
    y: &mut [f32],
) {
    match w {
        Matrix::F32(w) => linear_t(x, w, bias, n, k, m, y),
        Matrix::F16(w) => linear_t(x, w, bias, n, k, m, y),
        Matrix::Quant(q) => {
            assert_eq!((q.rows, q.cols), (m, k), "quantized matrix is not [m, k]");
            qlinear(x, q, bias, n, y)
        }
        Matrix::Stored(s) => linear_t(x, &s.to_f32(), bias, n, k, m, y),
    }
}

fn linear_t<W: Elem>(
    x: &[f32],
    w: &[W],
    bias: Option<&[f32]>,
    n: usize,
    k: usize,
    m: usize,
    y: &mut [f32],
) {
    assert_eq!(x.len(), n * k, "x is not [n, k]");
    assert_eq!(w.len(), m * k, "w is not [m, k]");
    assert_eq!(y.len(), n * m, "y is not [n, m]");
    if let Some(b) = bias {
        assert_eq!(b.len(), m, "bias is not [m]");
    }
    let fma = has_fma();
    let g = Gemm {
        x,
        w,
        n,
        k,
        m,
        y: SendPtr::new(y),
    };
    for_row_ranges(m, ROWS_PER_JOB, n * m * k, |o0, o1| {
        // SAFETY: this job writes only columns o0..o1 of y, which no other job touches, and
        // `y` outlives the parallel loop.
        unsafe {
            if fma {
                rows_fma(g, o0, o1)
            } else {
                rows_generic(g, o0, o1)
            }
        }
    });
    add_bias(y, bias);
}

/// Whether the AVX2+FMA+F16C build runs here.
fn has_fma() -> bool {
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

/// [`rows`] on the AVX2 tiles.
///
/// Safety: as [`rows`], and the CPU has AVX2, FMA and F16C ([`has_fma`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_fma<W: Elem>(g: Gemm<'_, W>, o0: usize, o1: usize) {
    // SAFETY: the caller's guarantees are `rows`'s, and the features FMA needs.
    unsafe { rows::<W, true>(g, o0, o1) }
}

/// The AVX2 tile: the same sums as [`tile`], one `__m256` accumulator per (row, weight).
///
/// Safety: as [`tile`], and the CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_avx<W: Elem, const RX: usize, const RW: usize>(
    x: &[f32],
    w: &[W],
    k: usize,
    m: usize,
    t: usize,
    o: usize,
    y: *mut f32,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees AVX2, FMA and F16C (`has_fma`, checked before
    // dispatch), which every intrinsic below needs.
    let mut acc = [[unsafe { _mm256_setzero_ps() }; RW]; RX];
    // SAFETY: the caller guarantees rows t..t + RX of x and o..o + RW of w exist, k
    // values each: each row's start is inside its slice.
    let xp: [*const f32; RX] = std::array::from_fn(|i| unsafe { x.as_ptr().add((t + i) * k) });
    let wp: [*const W; RW] = std::array::from_fn(|j| unsafe { w.as_ptr().add((o + j) * k) });
    let full = k / LANES * LANES;
    let mut c = 0;
    while c < full {
        // SAFETY: c + LANES <= full <= k, so each load reads within its row; the
        // features are present (above).
        unsafe {
            let wv: [__m256; RW] = std::array::from_fn(|j| W::load8_avx(wp[j].add(c)));
            for i in 0..RX {
                let xv = _mm256_loadu_ps(xp[i].add(c));
                for j in 0..RW {
                    acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
                }
            }
        }
        c += LANES;
    }
    for i in 0..RX {
        for j in 0..RW {
            // SAFETY: an `__m256` is eight f32 lanes, and every bit pattern is an f32.
            let lanes: [f32; LANES] = unsafe { std::mem::transmute(acc[i][j]) };
            let mut s: f32 = lanes.iter().sum();
            for cc in full..k {
                // SAFETY: cc < k: within row t + i of x and row o + j of w.
                s += unsafe { *xp[i].add(cc) * (*wp[j].add(cc)).to_f32() };
            }
            // SAFETY: the caller guarantees (t + i) < n and (o + j) < m, so the index is
            // inside y ([n, m]), and that no one else writes these columns meanwhile.
            unsafe { *y.add((t + i) * m + o + j) = s };
        }
    }
}

/// [`rows`] on the portable tiles (no AVX2 build off x86-64).
///
/// Safety: as [`rows`].
#[cfg(not(target_arch = "x86_64"))]
unsafe fn rows_fma<W: Elem>(g: Gemm<'_, W>, o0: usize, o1: usize) {
    // SAFETY: the caller's guarantees are `rows`'s.
    unsafe { rows::<W, false>(g, o0, o1) }
}

/// [`rows`] on the portable tiles.
///
/// Safety: as [`rows`].
unsafe fn rows_generic<W: Elem>(g: Gemm<'_, W>, o0: usize, o1: usize) {
    // SAFETY: the caller's guarantees are `rows`'s.
    unsafe { rows::<W, false>(g, o0, o1) }
}

/// Computes output columns `o0..o1` for every token row, tile by tile.
///
/// Safety: `g`'s slices have the shapes `linear_t` checks (x `[n, k]`, w `[m, k]`), its
/// `y` points at `[n, m]` f32s that outlive the call, `o0 <= o1 <= m`, nothing else
/// reads or writes columns `o0..o1` of y meanwhile, and with `FMA` the CPU has AVX2, FMA
/// and F16C.
#[inline(always)]
unsafe fn rows<W: Elem, const FMA: bool>(g: Gemm<'_, W>, o0: usize, o1: usize) {
    let Gemm { x, w, n, k, m, y } = g;
    let y = y.get();
    let mut t = 0;
    while t < n {
        let tx = (n - t).min(TX);
        let mut o = o0;
        while o < o1 {
            let tw = (o1 - o).min(TW);
            // SAFETY: the tile's rows t..t + tx < n and columns o..o + tw <= o1 lie within
            // the shapes and the columns the caller gave this job; FMA's features are the
            // caller's to guarantee.
            unsafe {
                match (tx, tw) {
                    (4, 3) => tile::<W, 4, 3, FMA>(x, w, k, m, t, o, y),
                    (4, 2) => tile::<W, 4, 2, FMA>(x, w, k, m, t, o, y),
                    (4, 1) => tile::<W, 4, 1, FMA>(x, w, k, m, t, o, y),
                    (3, 3) => tile::<W, 3, 3, FMA>(x, w, k, m, t, o, y),
                    (3, 2) => tile::<W, 3, 2, FMA>(x, w, k, m, t, o, y),
                    (3, 1) => tile::<W, 3, 1, FMA>(x, w, k, m, t, o, y),
                    (2, 3) => tile::<W, 2, 3, FMA>(x, w, k, m, t, o, y),
                    (2, 2) => tile::<W, 2, 2, FMA>(x, w, k, m, t, o, y),
                    (2, 1) => tile::<W, 2, 1, FMA>(x, w, k, m, t, o, y),
                    (1, 3) => tile::<W, 1, 3, FMA>(x, w, k, m, t, o, y),
                    (1, 2) => tile::<W, 1, 2, FMA>(x, w, k, m, t, o, y),
                    _ => tile::<W, 1, 1, FMA>(x, w, k, m, t, o, y),
                }
            }
            o += tw;
        }
        t += tx;
    }
}

/// One register tile: RX token rows against RW weight rows, full dot products over k.
///
/// Safety: rows `t..t + RX` of x (`[n, k]`) and `o..o + RW` of w (`[m, k]`) exist, `y`
/// points at `[n, m]` f32s of which nothing else touches these rows' columns
/// `o..o + RW` meanwhile, and with `FMA` the CPU has AVX2, FMA and F16C.
#[inline(always)]
unsafe fn tile<W: Elem, const RX: usize, const RW: usize, const FMA: bool>(
    x: &[f32],
    w: &[W],
    k: usize,
    m: usize,
    t: usize,
    o: usize,
    y: *mut f32,
) {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: the caller's guarantees, AVX2, FMA and F16C included.
        return unsafe { tile_avx::<W, RX, RW>(x, w, k, m, t, o, y) };
    }
    let mut acc = [[[0f32; LANES]; RW]; RX];
    let xs: [&[f32]; RX] = std::array::from_fn(|i| &x[(t + i) * k..(t + i + 1) * k]);
    let ws: [&[W]; RW] = std::array::from_fn(|j| &w[(o + j) * k..(o + j + 1) * k]);
    let full = k / LANES * LANES;
    let mut c = 0;
    while c < full {
        // SAFETY: c + LANES <= k, the length of each weight row.
        let wv: [[f32; LANES]; RW] =
            std::array::from_fn(|j| unsafe { W::load8(ws[j].as_ptr().add(c)) });
        for i in 0..RX {
            let xv: &[f32; LANES] = xs[i][c..c + LANES].try_into().unwrap();
            for j in 0..RW {
                for l in 0..LANES {
                    acc[i][j][l] += xv[l] * wv[j][l];
                }
            }
        }
        c += LANES;
    }
    for i in 0..RX {
        for j in 0..RW {
            let mut s: f32 = acc[i][j].iter().sum();
            for cc in full..k {
                s += xs[i][cc] * ws[j][cc].to_f32();
            }
            // SAFETY: (t + i) < n and (o + j) < m, so the index is inside y ([n, m]).
            unsafe { *y.add((t + i) * m + o + j) = s };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn naive(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * m];
        for t in 0..n {
            for o in 0..m {
                y[t * m + o] = (0..k)
                    .map(|i| x[t * k + i] as f64 * w[o * k + i] as f64)
                    .sum::<f64>() as f32;
            }
        }
        y
    }

    #[test]
    fn matches_naive_on_odd_shapes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for &(n, k, m) in &[
            (1, 1, 1),
            (1, 576, 192),
            (5, 13, 7),
            (7, 64, 101),
            (33, 200, 97),
            (4, 24, 48),
        ] {
            let x: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let w: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..m).map(|_| rng.gen_range(-1.0..1.0)).collect();
            // f16 storage: compare against the product of the rounded weights.
            let w16: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            let w16_as_f32: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
            for (mat, wref) in [
                (Matrix::F32(w.clone()), &w),
                (Matrix::F16(w16), &w16_as_f32),
            ] {
                let mut y = vec![f32::NAN; n * m];
                linear(&x, &mat, Some(&b), n, k, m, &mut y);
                let want = naive(&x, wref, n, k, m);
                for (i, (a, e)) in y.iter().zip(&want).enumerate() {
                    let e = e + b[i % m];
                    assert!(
                        (a - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "({n},{k},{m})[{i}]: {a} vs {e}"
                    );
                }
            }
        }
    }
}
