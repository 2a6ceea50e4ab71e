//! Whole-row kernels of the sampler (the CPU twins of the GPU sampling kernels), written
//! as element-wise loops and lane reductions so the compiler vectorises them (and built
//! a second time for AVX2 when the CPU has it): cleaning a row and finding its maximum,
//! a fast `exp` for the non-positive scaled logits, and their sum.

/// Lanes of the hand-unrolled loops: independent accumulators the compiler can keep in
/// vector registers (floating-point sums are not reassociated otherwise).
const LANES: usize = 8;

/// Block length of the reductions that skip ahead: long enough to amortise the check,
/// short enough that an f32 partial sum of weights (at most 1 each) stays accurate.
const BLOCK: usize = 512;

/// Below this `exp` is 0: `exp(-87)` is still a normal f32, `exp(-88)` is not.
const EXP_MIN: f32 = -87.0;

/// `a > b ? a : b`, the form that compiles to one vector max (inputs are never NaN here).
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// NaN becomes -inf, +inf becomes `f32::MAX` (so `x - max` is never NaN) and -0 becomes
/// +0 (so `total_cmp` agrees with `==`). Selects only, no branch.
#[inline(always)]
fn clean(x: f32) -> f32 {
    // NaN fails the comparison.
    let x = if x > f32::NEG_INFINITY {
        x
    } else {
        f32::NEG_INFINITY
    };
    (if x < f32::MAX { x } else { f32::MAX }) + 0.0
}

/// Cleans the row in place (see `clean`) and returns the first index of its maximum and
/// the maximum, or None when every logit is -inf or NaN (or the row is empty).
pub(crate) fn sanitize(logits: &mut [f32]) -> Option<(usize, f32)> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { sanitize_avx2(logits) };
    }
    sanitize_lanes(logits)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sanitize_avx2(logits: &mut [f32]) -> Option<(usize, f32)> {
    sanitize_lanes(logits)
}

#[inline(always)]
fn sanitize_lanes(logits: &mut [f32]) -> Option<(usize, f32)> {
    // An element-wise pass and a lane reduction: each form vectorises on its own.
    for x in logits.iter_mut() {
        *x = clean(*x);
    }
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let (chunks, tail) = logits.as_chunks::<LANES>();
    for chunk in chunks {
        for j in 0..LANES {
            lanes[j] = max(lanes[j], chunk[j]);
        }
    }
    let top = tail
        .iter()
        .copied()
        .fold(lanes.into_iter().fold(f32::NEG_INFINITY, max), max);
    if top == f32::NEG_INFINITY {
        return None;
    }
    // The first block holding the maximum, by an OR over each block (vectorised), then
    // the first index in it.
    let block = logits
        .chunks(BLOCK)
        .position(|b| b.iter().fold(false, |hit, &x| hit | (x == top)))?;
    let start = block * BLOCK;
    logits[start..]
        .iter()
        .position(|&x| x == top)
        .map(|i| (start + i, top))
}

/// `exp(x)` for `x <= 0` (and up to 88), relative error about 1e-7; exactly 0 below
/// -87 and for -inf, exactly 1 at 0.
///
/// Cody-Waite range reduction, `x = n ln2 + r` with `|r| <= ln2 / 2` (ln2 split in a
/// short high part and a correction, the constants of Cephes' `expf`), a degree-7 Taylor
/// polynomial for `e^r` (truncation error below 6e-9), and `2^n` built in the exponent
/// bits. Unlike the libm call it has no branches, so loops over it vectorise.
#[inline(always)]
pub(crate) fn exp_fast(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits (the sum stays
    // in [2^23, 2^24), where the spacing is 1): n without a float-to-int conversion.
    const ROUND: f32 = 12_582_912.0;
    let xc = max(x, EXP_MIN);
    let xc = if xc < 88.0 { xc } else { 88.0 };
    let shifted = xc * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let n_int = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // n is in [-126, 127], so n + 127 is a normal exponent.
    let scale = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
    if x < EXP_MIN {
        0.0
    } else {
        p * scale
    }
}

/// Replaces each logit `x` by its weight `exp((x - max) * inv_t)` and returns their sum.
/// Bit-identical with and without AVX2: the same operations in the same order, only
/// wider (no fused multiply-add), so seeded draws do not depend on the CPU.
pub(crate) fn exp_in_place(row: &mut [f32], max: f32, inv_t: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { exp_in_place_avx2(row, max, inv_t) };
    }
    exp_in_place_lanes(row, max, inv_t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_in_place_avx2(row: &mut [f32], max: f32, inv_t: f32) -> f64 {
    exp_in_place_lanes(row, max, inv_t)
}

#[inline(always)]
fn exp_in_place_lanes(row: &mut [f32], max: f32, inv_t: f32) -> f64 {
    for x in row.iter_mut() {
        *x = exp_fast((*x - max) * inv_t);
    }
    row.chunks(BLOCK).map(block_sum).sum()
}

/// Sets the weights below `min` to 0 and returns the sum of those left (min-p's cut).
pub(crate) fn cut_below(weights: &mut [f32], min: f32) -> f64 {
    for w in weights.iter_mut() {
        *w = if *w < min { 0.0 } else { *w };
    }
    weights.chunks(BLOCK).map(block_sum).sum()
}

/// The sum of a block of weights in f32 lanes (an f32 partial sum then holds only
/// `BLOCK / LANES` weights, so its relative error stays near 1e-7), finished in f64.
#[inline(always)]
fn block_sum(block: &[f32]) -> f64 {
    let mut lanes = [0.0f32; LANES];
    let (chunks, tail) = block.as_chunks::<LANES>();
    for chunk in chunks {
        for j in 0..LANES {
            lanes[j] += chunk[j];
        }
    }
    lanes.iter().map(|&l| l as f64).sum::<f64>() + tail.iter().map(|&w| w as f64).sum::<f64>()
}

/// The first index at which the running sum of `weights` exceeds `target`, or None when
/// rounding leaves the target beyond the whole sum. Blocks entirely below the target are
/// skipped by their [`block_sum`]; the running sum is exact only up to that rounding,
/// which moves probabilities by about 1e-7 of their value.
pub(crate) fn find_cumulative(weights: &[f32], target: f64) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { find_cumulative_avx2(weights, target) };
    }
    find_cumulative_lanes(weights, target)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn find_cumulative_avx2(weights: &[f32], target: f64) -> Option<usize> {
    find_cumulative_lanes(weights, target)
}

#[inline(always)]
fn find_cumulative_lanes(weights: &[f32], target: f64) -> Option<usize> {
    let mut acc = 0.0f64;
    for (b, block) in weights.chunks(BLOCK).enumerate() {
        let sum = block_sum(block);
        if acc + sum <= target {
            acc += sum;
            continue;
        }
        for (i, &w) in block.iter().enumerate() {
            acc += w as f64;
            if target < acc {
                return Some(b * BLOCK + i);
            }
        }
    }
    None
}

/// Whether the AVX2 build of the kernels runs here.
#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_fast_is_within_2e7_relative_and_exact_at_the_ends() {
        let mut worst = 0.0f64;
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let want = (x as f64).exp();
            let got = exp_fast(x) as f64;
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 2e-7, "worst relative error {worst}");
        assert_eq!(exp_fast(0.0), 1.0);
        assert_eq!(exp_fast(-87.5), 0.0);
        assert_eq!(exp_fast(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_fast(-f32::MAX), 0.0);
        assert!((exp_fast(3.0) as f64 / 3f64.exp() - 1.0).abs() < 2e-7);
    }

    #[test]
    fn sanitize_turns_nan_to_neg_inf_and_finds_the_first_max() {
        let mut row = [f32::NAN, 1.0, f32::INFINITY, f32::INFINITY, -0.0];
        assert_eq!(sanitize(&mut row), Some((2, f32::MAX)));
        assert_eq!(row[0], f32::NEG_INFINITY);
        assert!(row[4].is_sign_positive());
        // Past the lanes, into the remainder.
        let mut row: Vec<f32> = (0..21).map(|i| (i % 10) as f32).collect();
        row[20] = 12.0;
        assert_eq!(sanitize(&mut row), Some((20, 12.0)));
        row[3] = 12.0;
        assert_eq!(sanitize(&mut row), Some((3, 12.0)));
        assert_eq!(sanitize(&mut [f32::NAN, f32::NEG_INFINITY]), None);
        assert_eq!(sanitize(&mut []), None);
    }

    #[test]
    fn find_cumulative_matches_a_linear_walk_across_blocks() {
        let w: Vec<f32> = (0..3000).map(|i| ((i * 37) % 11) as f32 / 10.0).collect();
        let walk = |target: f64| {
            let mut acc = 0.0f64;
            w.iter().position(|&x| {
                acc += x as f64;
                target < acc
            })
        };
        let total: f64 = w.iter().map(|&x| x as f64).sum();
        for k in 0..200 {
            // Targets away from block edges, where rounding could differ.
            let target = total * (k as f64 + 0.37) / 200.0;
            assert_eq!(find_cumulative(&w, target), walk(target), "target {target}");
            assert_eq!(find_cumulative_lanes(&w, target), walk(target));
        }
        assert_eq!(find_cumulative(&w, 0.0), Some(1));
        assert_eq!(find_cumulative(&w, total * 2.0), None);
    }

    #[test]
    fn exp_in_place_sums_match_a_plain_f64_sum_on_every_path() {
        let row: Vec<f32> = (0..1003)
            .map(|i| -((i * 7919) % 1000) as f32 / 100.0)
            .collect();
        let want: f64 = row.iter().map(|&x| ((x as f64 - 0.5) / 0.7).exp()).sum();
        let inv_t = 1.0 / 0.7;
        let mut w = row.clone();
        let got = exp_in_place_lanes(&mut w, 0.5, inv_t);
        assert!((got / want - 1.0).abs() < 1e-6, "{got} vs {want}");
        assert_eq!(w[1002], exp_fast((row[1002] - 0.5) * inv_t));
        let mut w2 = row.clone();
        assert_eq!(exp_in_place(&mut w2, 0.5, inv_t), got);
        assert_eq!(w2, w);
        let mut dirty = vec![f32::NAN, -0.0, f32::INFINITY, 1.0, 2.0, 0.0, 3.0, 1.0, 5.0];
        let mut dirty2 = dirty.clone();
        assert_eq!(sanitize(&mut dirty), sanitize_lanes(&mut dirty2));
        assert_eq!(format!("{dirty:?}"), format!("{dirty2:?}"));
    }
}
