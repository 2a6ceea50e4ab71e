//! Multi-threaded f32 matrix product `y = x · Wᵀ (+ b)` for linear layers, with `W` stored
//! row-major as `[out, in]` (the HF layout), register-tiled and dispatched at run time to
//! an AVX2+FMA build of the same code where the CPU has it.

use rayon::prelude::*;

/// Lanes of one accumulator; 8 f32 fill an AVX register, two SSE ones.
const LANES: usize = 8;
/// Token rows per register tile.
const TX: usize = 4;
/// Weight rows per register tile.
const TW: usize = 3;
/// Weight rows per parallel job (a multiple of TW): 48 rows of 576 floats fit in L2.
const ROWS_PER_JOB: usize = 48;

/// A raw pointer handed to parallel jobs that each write a disjoint set of elements.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: jobs write disjoint elements (distinct weight rows → distinct output columns).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// `y[t, o] = Σ_i x[t, i] · w[o, i] + bias[o]` for `n` rows of `x` (`[n, k]`), `w` `[m, k]`,
/// `y` `[n, m]`.
pub fn linear(x: &[f32], w: &[f32], bias: Option<&[f32]>, n: usize, k: usize, m: usize, y: &mut [f32]) {
    assert_eq!(x.len(), n * k, "x is not [n, k]");
    assert_eq!(w.len(), m * k, "w is not [m, k]");
    assert_eq!(y.len(), n * m, "y is not [n, m]");
    if let Some(b) = bias {
        assert_eq!(b.len(), m, "bias is not [m]");
    }
    let fma = has_fma();
    let out = SendPtr(y.as_mut_ptr());
    let jobs = m.div_ceil(ROWS_PER_JOB);
    let run = |job: usize| {
        let o0 = job * ROWS_PER_JOB;
        let o1 = (o0 + ROWS_PER_JOB).min(m);
        let out = out;
        // SAFETY: this job writes only columns o0..o1 of y, which no other job touches, and
        // `y` outlives the parallel loop.
        unsafe {
            if fma {
                rows_fma(x, w, n, k, m, o0, o1, out.0)
            } else {
                rows_generic(x, w, n, k, m, o0, o1, out.0)
            }
        }
    };
    if n * m * k < 1 << 16 {
        (0..jobs).for_each(run);
    } else {
        (0..jobs).into_par_iter().for_each(run);
    }
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(m) {
            for (v, bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
}

fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_fma(x: &[f32], w: &[f32], n: usize, k: usize, m: usize, o0: usize, o1: usize, y: *mut f32) {
    rows::<true>(x, w, n, k, m, o0, o1, y)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn rows_fma(x: &[f32], w: &[f32], n: usize, k: usize, m: usize, o0: usize, o1: usize, y: *mut f32) {
    rows::<false>(x, w, n, k, m, o0, o1, y)
}

unsafe fn rows_generic(x: &[f32], w: &[f32], n: usize, k: usize, m: usize, o0: usize, o1: usize, y: *mut f32) {
    rows::<false>(x, w, n, k, m, o0, o1, y)
}

/// Computes output columns `o0..o1` for every token row, tile by tile.
#[inline(always)]
unsafe fn rows<const FMA: bool>(x: &[f32], w: &[f32], n: usize, k: usize, m: usize, o0: usize, o1: usize, y: *mut f32) {
    let mut t = 0;
    while t < n {
        let tx = (n - t).min(TX);
        let mut o = o0;
        while o < o1 {
            let tw = (o1 - o).min(TW);
            match (tx, tw) {
                (4, 3) => tile::<4, 3, FMA>(x, w, k, m, t, o, y),
                (4, 2) => tile::<4, 2, FMA>(x, w, k, m, t, o, y),
                (4, 1) => tile::<4, 1, FMA>(x, w, k, m, t, o, y),
                (3, 3) => tile::<3, 3, FMA>(x, w, k, m, t, o, y),
                (3, 2) => tile::<3, 2, FMA>(x, w, k, m, t, o, y),
                (3, 1) => tile::<3, 1, FMA>(x, w, k, m, t, o, y),
                (2, 3) => tile::<2, 3, FMA>(x, w, k, m, t, o, y),
                (2, 2) => tile::<2, 2, FMA>(x, w, k, m, t, o, y),
                (2, 1) => tile::<2, 1, FMA>(x, w, k, m, t, o, y),
                (1, 3) => tile::<1, 3, FMA>(x, w, k, m, t, o, y),
                (1, 2) => tile::<1, 2, FMA>(x, w, k, m, t, o, y),
                _ => tile::<1, 1, FMA>(x, w, k, m, t, o, y),
            }
            o += tw;
        }
        t += tx;
    }
}

/// One register tile: RX token rows against RW weight rows, full dot products over k.
#[inline(always)]
unsafe fn tile<const RX: usize, const RW: usize, const FMA: bool>(
    x: &[f32],
    w: &[f32],
    k: usize,
    m: usize,
    t: usize,
    o: usize,
    y: *mut f32,
) {
    let mut acc = [[[0f32; LANES]; RW]; RX];
    let xs: [&[f32]; RX] = std::array::from_fn(|i| &x[(t + i) * k..(t + i + 1) * k]);
    let ws: [&[f32]; RW] = std::array::from_fn(|j| &w[(o + j) * k..(o + j + 1) * k]);
    let full = k / LANES * LANES;
    let mut c = 0;
    while c < full {
        let wv: [[f32; LANES]; RW] = std::array::from_fn(|j| ws[j][c..c + LANES].try_into().unwrap());
        for i in 0..RX {
            let xv: &[f32; LANES] = xs[i][c..c + LANES].try_into().unwrap();
            for j in 0..RW {
                for l in 0..LANES {
                    acc[i][j][l] = if FMA {
                        xv[l].mul_add(wv[j][l], acc[i][j][l])
                    } else {
                        acc[i][j][l] + xv[l] * wv[j][l]
                    };
                }
            }
        }
        c += LANES;
    }
    for i in 0..RX {
        for j in 0..RW {
            let mut s: f32 = acc[i][j].iter().sum();
            for cc in full..k {
                s += xs[i][cc] * ws[j][cc];
            }
            // SAFETY: (t + i) < n and (o + j) < m, so the index is inside y ([n, m]).
            *y.add((t + i) * m + o + j) = s;
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
                y[t * m + o] = (0..k).map(|i| x[t * k + i] as f64 * w[o * k + i] as f64).sum::<f64>() as f32;
            }
        }
        y
    }

    #[test]
    fn matches_naive_on_odd_shapes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for &(n, k, m) in &[(1, 1, 1), (1, 576, 192), (5, 13, 7), (7, 64, 101), (33, 200, 97), (4, 24, 48)] {
            let x: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let w: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..m).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let mut y = vec![f32::NAN; n * m];
            linear(&x, &w, Some(&b), n, k, m, &mut y);
            let want = naive(&x, &w, n, k, m);
            for (i, (a, e)) in y.iter().zip(&want).enumerate() {
                let e = e + b[i % m];
                assert!((a - e).abs() <= 1e-4 * (1.0 + e.abs()), "({n},{k},{m})[{i}]: {a} vs {e}");
            }
        }
    }
}
