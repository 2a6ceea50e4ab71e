//! Choosing one token from a row of processed logits: greedy, or temperature, top-k,
//! top-p and a draw from the sequence's generator; plus the chosen token's log-softmax.
//!
//! Rows hold 49k-128k logits, so nothing here sorts a whole row: top-k keeps a small heap
//! (or partitions with `select_nth_unstable` when k is large) and sorts only its k
//! candidates; top-p alone grows its candidate set by doubling until it holds the nucleus.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rand::Rng;

/// Largest k for which top-k keeps a heap instead of partitioning a copy of the row.
const HEAP_MAX_K: usize = 1024;
/// First candidate count tried by top-p without top-k.
const NUCLEUS_FIRST_K: usize = 64;

/// The chosen token and, when asked, its log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Choice {
    pub token: u32,
    pub log_prob: Option<f32>,
}

/// Makes a row safe to rank and exponentiate: NaN becomes -inf, +inf becomes `f32::MAX`
/// (so that `x - max` is never NaN) and -0 becomes +0 (so `total_cmp` agrees with `==`).
/// Returns the first index of the maximum and the maximum, or None when every logit is
/// -inf (or the row is empty).
pub(crate) fn sanitize(logits: &mut [f32]) -> Option<(usize, f32)> {
    for x in logits.iter_mut() {
        *x = if x.is_nan() {
            f32::NEG_INFINITY
        } else {
            x.min(f32::MAX) + 0.0
        };
    }
    let best = super::argmax(logits) as usize;
    let max = *logits.get(best)?;
    (max > f32::NEG_INFINITY).then_some((best, max))
}

/// `sum(exp((x - max) * inv_t))` over the row, in f64.
fn sum_exp(logits: &[f32], max: f32, inv_t: f32) -> f64 {
    logits
        .iter()
        .map(|&x| ((x - max) * inv_t).exp() as f64)
        .sum()
}

/// Greedy choice of the token at `best` (the maximum); its log-probability at `1 / inv_t`.
pub(crate) fn greedy(
    logits: &[f32],
    best: usize,
    max: f32,
    inv_t: f32,
    want_log_prob: bool,
) -> Choice {
    Choice {
        token: best as u32,
        log_prob: want_log_prob.then(|| (-sum_exp(logits, max, inv_t).ln()) as f32),
    }
}

/// The cuts applied before a draw, already validated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cuts {
    /// 1 / temperature: finite and positive.
    pub inv_t: f32,
    /// 0 keeps every token.
    pub top_k: usize,
    /// Not NaN; 1 or more keeps every token, 0 or less keeps the most likely one.
    pub top_p: f32,
}

/// Draws a token: softmax of `(x - max) * inv_t`, then top-k (renormalised over the k
/// best, as TensorRT-LLM does when both are set), then top-p (the shortest run of most
/// likely tokens whose mass reaches `top_p`, at least one), then one uniform draw.
/// `max` must be the row's maximum as returned by [`sanitize`]. The row is scratch: on
/// return its contents are unspecified.
pub(crate) fn draw(
    logits: &mut [f32],
    max: f32,
    cuts: Cuts,
    rng: &mut impl Rng,
    want_log_prob: bool,
) -> Choice {
    let n = logits.len();
    let k = if cuts.top_k == 0 {
        n
    } else {
        cuts.top_k.min(n)
    };
    if k == n && cuts.top_p >= 1.0 {
        return draw_full_row(logits, max, cuts.inv_t, rng, want_log_prob);
    }
    let weight = |x: f32| ((x - max) * cuts.inv_t).exp();
    let mut row_sum = None;
    let (cands, weights) = if k < n {
        let cands = top_candidates(logits, k);
        let mut weights: Vec<f32> = cands.iter().map(|c| weight(c.1)).collect();
        let total: f64 = weights.iter().map(|&w| w as f64).sum();
        weights.truncate(nucleus_len(&weights, total * cuts.top_p as f64).unwrap_or(k));
        (cands, weights)
    } else {
        let total = sum_exp(logits, max, cuts.inv_t);
        row_sum = Some(total);
        nucleus_by_doubling(logits, weight, total * cuts.top_p as f64)
    };
    let mass: f64 = weights.iter().map(|&w| w as f64).sum();
    let (token, logit) = cands[pick(&weights, mass, rng)];
    Choice {
        token,
        log_prob: want_log_prob.then(|| {
            let total = row_sum.unwrap_or_else(|| sum_exp(logits, max, cuts.inv_t));
            (((logit - max) * cuts.inv_t) as f64 - total.ln()) as f32
        }),
    }
}

/// Temperature sampling over the whole row, exponentiating it in place.
fn draw_full_row(
    logits: &mut [f32],
    max: f32,
    inv_t: f32,
    rng: &mut impl Rng,
    want_log_prob: bool,
) -> Choice {
    for x in logits.iter_mut() {
        *x = ((*x - max) * inv_t).exp();
    }
    let total: f64 = logits.iter().map(|&w| w as f64).sum();
    let i = pick(logits, total, rng);
    Choice {
        token: i as u32,
        // The drawn token's weight is positive, so its logarithm is finite.
        log_prob: want_log_prob.then(|| ((logits[i] as f64).ln() - total.ln()) as f32),
    }
}

/// Top-p over the whole row: the best 64, 128, ... candidates until their weights reach
/// `target`. Returns the candidates and the weights of those kept.
fn nucleus_by_doubling(
    logits: &[f32],
    weight: impl Fn(f32) -> f32,
    target: f64,
) -> (Vec<(u32, f32)>, Vec<f32>) {
    let n = logits.len();
    let mut k = NUCLEUS_FIRST_K.min(n);
    loop {
        let cands = top_candidates(logits, k);
        let mut weights: Vec<f32> = cands.iter().map(|c| weight(c.1)).collect();
        // Rounding can leave the whole row short of the target: then keep it all.
        if let Some(keep) = nucleus_len(&weights, target).or((k == n).then_some(n)) {
            weights.truncate(keep);
            return (cands, weights);
        }
        k = (2 * k).min(n);
    }
}

/// The length of the shortest prefix of `weights` (sorted from most likely) whose sum
/// reaches `target`, at least 1; None when the whole slice falls short.
fn nucleus_len(weights: &[f32], target: f64) -> Option<usize> {
    let mut acc = 0.0f64;
    for (i, &w) in weights.iter().enumerate() {
        acc += w as f64;
        if acc >= target {
            return Some(i + 1);
        }
    }
    None
}

/// An index drawn with probability proportional to `weights` (non-negative, summing to
/// `mass`; the first is positive when called from here).
fn pick(weights: &[f32], mass: f64, rng: &mut impl Rng) -> usize {
    let r = rng.gen::<f64>() * mass;
    let mut acc = 0.0f64;
    for (i, &w) in weights.iter().enumerate() {
        acc += w as f64;
        if r < acc {
            return i;
        }
    }
    // r rounded up to the mass: the last token that has weight.
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0)
}

/// Candidate `(id, logit)` ordered from most likely, ties to the lower id.
#[derive(Debug, Clone, Copy)]
struct Ranked(u32, f32);

impl Ranked {
    fn rank(&self, other: &Self) -> Ordering {
        other.1.total_cmp(&self.1).then(self.0.cmp(&other.0))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.rank(other) == Ordering::Equal
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
/// Better candidates are smaller, so a max-heap's top is the worst one kept.
impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank(other)
    }
}

/// The `k` (clamped to 1..=len) largest logits of a sanitized row as `(id, logit)`, from
/// the largest, ties to the lower id.
pub(crate) fn top_candidates(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.clamp(1, logits.len().max(1));
    let ranked: Vec<Ranked> = if k <= HEAP_MAX_K {
        let mut heap = BinaryHeap::with_capacity(k);
        // The worst logit kept once the heap is full: most logits fail this one test.
        // Strictly greater, so on ties the earlier id stays.
        let mut floor = f32::NEG_INFINITY;
        for (i, &x) in logits.iter().enumerate() {
            if heap.len() < k {
                heap.push(Ranked(i as u32, x));
                if heap.len() == k {
                    floor = heap.peek().map_or(floor, |w| w.1);
                }
            } else if x > floor {
                if let Some(mut worst) = heap.peek_mut() {
                    *worst = Ranked(i as u32, x);
                }
                floor = heap.peek().map_or(floor, |w| w.1);
            }
        }
        heap.into_sorted_vec()
    } else {
        let mut all: Vec<Ranked> = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| Ranked(i as u32, x))
            .collect();
        if k < all.len() {
            all.select_nth_unstable(k - 1);
            all.truncate(k);
        }
        all.sort_unstable();
        all
    };
    ranked.into_iter().map(|r| (r.0, r.1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn reference_top(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
        let mut all: Vec<(u32, f32)> = (0..).zip(logits.iter().copied()).collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(k);
        all
    }

    #[test]
    fn top_candidates_match_a_full_sort_with_ties_on_both_paths() {
        let mut rng = StdRng::seed_from_u64(7);
        // Few distinct values, so ties are everywhere.
        let row: Vec<f32> = (0..5000).map(|_| rng.gen_range(0..40) as f32).collect();
        for k in [1, 2, 50, HEAP_MAX_K, HEAP_MAX_K + 1, 3000, 5000, 9000] {
            assert_eq!(top_candidates(&row, k), reference_top(&row, k), "k = {k}");
        }
        assert_eq!(top_candidates(&[], 3), vec![]);
    }

    #[test]
    fn sanitize_turns_nan_to_neg_inf_and_finds_the_first_max() {
        let mut row = [f32::NAN, 1.0, f32::INFINITY, f32::INFINITY, -0.0];
        assert_eq!(sanitize(&mut row), Some((2, f32::MAX)));
        assert_eq!(row[0], f32::NEG_INFINITY);
        assert!(row[4].is_sign_positive());
        assert_eq!(sanitize(&mut [f32::NAN, f32::NEG_INFINITY]), None);
        assert_eq!(sanitize(&mut []), None);
    }

    #[test]
    fn nucleus_keeps_at_least_one_and_stops_at_the_target() {
        assert_eq!(nucleus_len(&[0.5, 0.3, 0.2], 0.0), Some(1));
        assert_eq!(nucleus_len(&[0.5, 0.3, 0.2], 0.8), Some(2));
        assert_eq!(nucleus_len(&[0.5, 0.3, 0.2], 0.81), Some(3));
        assert_eq!(nucleus_len(&[0.5, 0.3], 0.9), None);
    }

    #[test]
    fn top_p_by_doubling_grows_past_the_first_candidates() {
        // A flat row of 1000: a 0.5 nucleus needs 500 tokens, beyond the first 64.
        let row = vec![0.0f32; 1000];
        let (cands, kept) = nucleus_by_doubling(&row, |x| x.exp(), 500.0);
        assert_eq!(kept.len(), 500);
        assert_eq!(
            cands[..500].iter().map(|c| c.0).collect::<Vec<_>>(),
            (0..500).collect::<Vec<_>>()
        );
    }
}
