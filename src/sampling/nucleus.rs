//! Top-p over a whole row without sorting it: a histogram of the weights, bucketed by
//! their float bits, finds the bucket where the nucleus ends, and only that bucket is
//! sorted (the radix-select idea of GPU top-p kernels).

use super::select::by_rank;

/// Bits dropped from a weight's f32 pattern to make its bucket: the exponent and 7
/// mantissa bits remain, so a bucket spans under 1% of weight.
const SHIFT: u32 = 16;
/// Weights below 2^-30 (of the largest, which is 1) share the lowest bucket.
const FLOOR_KEY: u32 = (127 - 30) << (23 - SHIFT);
/// The bucket of weight 1, the highest.
const TOP_BUCKET: usize = ((1.0f32.to_bits() >> SHIFT) - FLOOR_KEY) as usize;
/// Sub-histograms filled in turn, so that runs of equal buckets do not wait on each
/// other's stores.
const WAYS: usize = 4;

/// The bucket of a weight in `[0, 1]` (clamped); larger weights never get lower buckets.
#[inline(always)]
fn bucket(w: f32) -> usize {
    ((w.to_bits() >> SHIFT).saturating_sub(FLOOR_KEY) as usize).min(TOP_BUCKET)
}

/// The weight in each bucket.
fn histogram(weights: &[f32]) -> Vec<f64> {
    let nb = TOP_BUCKET + 1;
    let mut ways = vec![0.0f64; WAYS * nb];
    let (chunks, tail) = weights.as_chunks::<WAYS>();
    for chunk in chunks {
        for (way, &w) in chunk.iter().enumerate() {
            ways[way * nb + bucket(w)] += w as f64;
        }
    }
    for &w in tail {
        ways[bucket(w)] += w as f64;
    }
    (0..nb)
        .map(|b| (0..WAYS).map(|way| ways[way * nb + b]).sum())
        .collect()
}

/// The nucleus of a row of weights (in `[0, 1]`, the largest 1): the tokens of the
/// shortest run of largest weights, ties to the lower id, whose sum reaches `target`;
/// at least one. Returned as `(id, weight)`: first those of the buckets above the
/// boundary in id order, then the boundary's kept ones from the largest.
pub(crate) fn nucleus(weights: &[f32], target: f64) -> Vec<(u32, f32)> {
    let mass = histogram(weights);
    // The boundary: the first bucket from the top, holding some weight, where the running
    // sum reaches the target (the lowest if rounding leaves the whole row short).
    let mut acc = 0.0f64;
    let edge = (0..mass.len())
        .rev()
        .find(|&b| {
            acc += mass[b];
            mass[b] > 0.0 && acc >= target
        })
        .unwrap_or(0);
    let mut kept = Vec::new();
    let mut border = Vec::new();
    for (i, &w) in weights.iter().enumerate() {
        match bucket(w).cmp(&edge) {
            std::cmp::Ordering::Greater => kept.push((i as u32, w)),
            std::cmp::Ordering::Equal => border.push((i as u32, w)),
            std::cmp::Ordering::Less => {}
        }
    }
    let mut acc: f64 = kept.iter().map(|c| c.1 as f64).sum();
    border.sort_unstable_by(by_rank);
    for c in border {
        kept.push(c);
        acc += c.1 as f64;
        if acc >= target {
            break;
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The nucleus by a full sort, as a sorted id list.
    fn reference(weights: &[f32], target: f64) -> Vec<u32> {
        let mut all: Vec<(u32, f32)> = (0..).zip(weights.iter().copied()).collect();
        all.sort_by(by_rank);
        let mut acc = 0.0f64;
        let mut ids = Vec::new();
        for (i, w) in all {
            ids.push(i);
            acc += w as f64;
            if acc >= target {
                break;
            }
        }
        ids.sort();
        ids
    }

    fn ids(cands: &[(u32, f32)]) -> Vec<u32> {
        let mut ids: Vec<u32> = cands.iter().map(|c| c.0).collect();
        ids.sort();
        ids
    }

    #[test]
    fn matches_a_full_sort_on_peaked_flat_and_tied_rows() {
        let mut rng = StdRng::seed_from_u64(3);
        let peaked: Vec<f32> = (0..20_000)
            .map(|_| (-rng.gen_range(0.0f32..30.0)).exp())
            .collect();
        let flat: Vec<f32> = (0..20_000).map(|_| rng.gen_range(0.9f32..1.0)).collect();
        // Few distinct values: ties straddle every boundary.
        let tied: Vec<f32> = (0..5000)
            .map(|_| rng.gen_range(1..5) as f32 / 4.0)
            .collect();
        for mut row in [peaked, flat, tied] {
            let top = row.iter().copied().fold(0.0, f32::max);
            row.iter_mut().for_each(|w| *w /= top);
            let total: f64 = row.iter().map(|&w| w as f64).sum();
            for top_p in [0.0, 0.1, 0.5, 0.9, 0.99, 0.999_999] {
                let target = total * top_p;
                let got = nucleus(&row, target);
                assert_eq!(ids(&got), reference(&row, target), "top_p {top_p}");
            }
        }
    }

    #[test]
    fn zero_weights_are_kept_only_when_the_target_needs_everything() {
        assert_eq!(bucket(2.0), TOP_BUCKET);
        assert_eq!(bucket(0.0), 0);
        let row = [1.0, 0.0, 0.5, 0.0];
        assert_eq!(ids(&nucleus(&row, 1.2)), vec![0, 2]);
        assert_eq!(ids(&nucleus(&row, 0.0)), vec![0]);
        assert_eq!(nucleus(&row, 9.0).len(), 4);
    }
}
