//! Choosing one token from a row of cleaned logits: greedy, or temperature, min-p, top-k,
//! top-p and a draw from the sequence's generator; plus the chosen token's log-softmax.
//!
//! Rows hold 49k-128k logits, so nothing here sorts a whole row: top-k keeps a small heap
//! (or partitions with `select_nth_unstable` when k is large) and sorts only its k
//! candidates; top-p alone tries the 64 best, then goes through a histogram (see
//! `nucleus`).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::math::{cut_below, exp_fast, exp_in_place, find_cumulative};
use super::nucleus::nucleus;

/// Largest k for which top-k keeps a heap instead of partitioning a copy of the row.
const HEAP_MAX_K: usize = 1024;
/// Top-p alone first tries this many best tokens (enough for the peaked rows of a
/// language model); only flatter rows go through the histogram.
const NUCLEUS_FIRST_K: usize = 64;

/// The chosen token and, when asked, its log-probability and the row's total weight
/// it was taken against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Choice {
    pub token: u32,
    pub log_prob: Option<f32>,
    pub total: Option<f64>,
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
    /// In `[0, 1]`: tokens whose weight (the most likely one's is 1) is below it are cut
    /// first; 0 keeps every token.
    pub min_p: f32,
}

/// `ln(weight / total)`: the drawn token's weight is positive, so this is finite.
pub(crate) fn log_prob(weight: f32, total: f64) -> f32 {
    ((weight as f64).ln() - total.ln()) as f32
}

/// Greedy choice of the token at `best` (the maximum, weight 1); its log-probability at
/// `1 / inv_t`. The row is scratch.
pub(crate) fn greedy(
    logits: &mut [f32],
    best: usize,
    max: f32,
    inv_t: f32,
    want_log_prob: bool,
) -> Choice {
    let total = want_log_prob.then(|| exp_in_place(logits, max, inv_t));
    Choice {
        token: best as u32,
        log_prob: total.map(|t| log_prob(1.0, t)),
        total,
    }
}

/// The tokens a draw chooses among after temperature, top-k and top-p, from [`cut`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kept {
    /// Every token that min-p keeps: the row now holds the weights (0 for those min-p
    /// cut), which sum to `kept`; `total` is the whole row's weight before the cut.
    All { kept: f64, total: f64 },
    /// Only these `(id, weight)`, from the most likely. `row_total` is the weight of the
    /// whole row when the row now holds the weights; None when it still holds the logits.
    Some {
        cands: Vec<(u32, f32)>,
        row_total: Option<f64>,
    },
}

/// Softmax weights of `(x - max) * inv_t`, then min-p (weights below `min_p`, that is
/// probabilities below `min_p` times the largest, are cut) and top-k (their intersection:
/// both keep the most likely tokens), renormalised over what they keep, as TensorRT-LLM
/// does, then top-p (the shortest run of most likely tokens whose mass reaches `top_p`,
/// ties to the lower id, at least one). `max` is the row's maximum as returned by
/// `math::sanitize`. The row is scratch (see [`Kept`]).
pub(crate) fn cut(logits: &mut [f32], max: f32, cuts: Cuts) -> Kept {
    let n = logits.len();
    let k = if cuts.top_k == 0 {
        n
    } else {
        cuts.top_k.min(n)
    };
    let weight_of = |x: f32| exp_fast((x - max) * cuts.inv_t);
    if k < n {
        let mut cands = top_candidates(logits, k);
        cands.iter_mut().for_each(|c| c.1 = weight_of(c.1));
        if cuts.min_p > 0.0 {
            // The most likely token has weight 1: at least it stays.
            cands.retain(|c| c.1 >= cuts.min_p);
        }
        let total: f64 = cands.iter().map(|c| c.1 as f64).sum();
        let keep = nucleus_len(&cands, total * cuts.top_p as f64).unwrap_or(cands.len());
        cands.truncate(keep);
        return Kept::Some {
            cands,
            row_total: None,
        };
    }
    let total = exp_in_place(logits, max, cuts.inv_t);
    let kept = if cuts.min_p > 0.0 {
        cut_below(logits, cuts.min_p)
    } else {
        total
    };
    if cuts.top_p >= 1.0 {
        return Kept::All { kept, total };
    }
    let target = kept * cuts.top_p as f64;
    // Ranked by weight, like the histogram: the same nucleus either way.
    let mut cands = top_candidates(logits, NUCLEUS_FIRST_K);
    match nucleus_len(&cands, target) {
        Some(keep) => cands.truncate(keep),
        None => cands = nucleus(logits, target),
    }
    Kept::Some {
        cands,
        row_total: Some(total),
    }
}

/// The weight of the whole row at `1 / inv_t` after [`cut`] (computing it, and turning
/// the row into weights, when the cut left the logits in place).
pub(crate) fn row_total(kept: &Kept, logits: &mut [f32], max: f32, inv_t: f32) -> f64 {
    match kept {
        Kept::All { total, .. }
        | Kept::Some {
            row_total: Some(total),
            ..
        } => *total,
        Kept::Some {
            row_total: None, ..
        } => exp_in_place(logits, max, inv_t),
    }
}

/// Draws a token from what [`cut`] keeps with the uniform `u` in `[0, 1)`: the first
/// kept token, in id order, whose running weight exceeds `u` times the kept weight (the
/// order the GPU kernel walks too, so both map a draw to the same token). The row is
/// scratch: on return its contents are unspecified.
pub(crate) fn draw(
    logits: &mut [f32],
    max: f32,
    cuts: Cuts,
    u: f64,
    want_log_prob: bool,
) -> Choice {
    let mut kept = cut(logits, max, cuts);
    let (token, weight) = match &mut kept {
        Kept::All { kept, .. } => {
            let i = find_cumulative(logits, u * *kept)
                .or_else(|| logits.iter().rposition(|&w| w > 0.0))
                .unwrap_or(0);
            (i as u32, logits[i])
        }
        Kept::Some { cands, .. } => {
            cands.sort_unstable_by_key(|c| c.0);
            cands[pick_candidate(cands, u)]
        }
    };
    let total = want_log_prob.then(|| row_total(&kept, logits, max, cuts.inv_t));
    Choice {
        token,
        log_prob: total.map(|t| log_prob(weight, t)),
        total,
    }
}

/// The distribution [`draw`] samples from, as a dense row of probabilities (zero outside
/// what the cuts keep). The row is scratch.
pub(crate) fn distribution(logits: &mut [f32], max: f32, cuts: Cuts) -> Vec<f32> {
    match cut(logits, max, cuts) {
        Kept::All { kept, .. } => {
            let inv = (1.0 / kept) as f32;
            logits.iter().map(|&w| w * inv).collect()
        }
        Kept::Some { cands, .. } => {
            let mass: f64 = cands.iter().map(|c| c.1 as f64).sum();
            let mut p = vec![0.0f32; logits.len()];
            for (id, w) in cands {
                p[id as usize] = (w as f64 / mass) as f32;
            }
            p
        }
    }
}

/// The length of the shortest prefix of `cands` (weights, from the most likely) whose sum
/// reaches `target`, at least 1; None when they all fall short.
fn nucleus_len(cands: &[(u32, f32)], target: f64) -> Option<usize> {
    let mut acc = 0.0f64;
    for (i, c) in cands.iter().enumerate() {
        acc += c.1 as f64;
        if acc >= target {
            return Some(i + 1);
        }
    }
    None
}

/// The index that the uniform `u` picks with probability proportional to `weight`
/// (non-negative, some positive, summing to `mass` up to rounding).
fn pick<T>(items: &[T], weight: impl Fn(&T) -> f32, mass: f64, u: f64) -> usize {
    let r = u * mass;
    let mut acc = 0.0f64;
    for (i, t) in items.iter().enumerate() {
        acc += weight(t) as f64;
        if r < acc {
            return i;
        }
    }
    // r rounded up to the mass: the last item that has weight.
    items.iter().rposition(|t| weight(t) > 0.0).unwrap_or(0)
}

/// An index into `(id, weight)` candidates picked by weight with the uniform `u`.
fn pick_candidate(cands: &[(u32, f32)], u: f64) -> usize {
    let mass: f64 = cands.iter().map(|c| c.1 as f64).sum();
    pick(cands, |c| c.1, mass, u)
}

/// The order of candidates `(id, logit or weight)`: larger first, ties to the lower id.
pub(crate) fn by_rank(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// A candidate ordered by [`by_rank`]: better is smaller, so a max-heap's top is the
/// worst one kept.
#[derive(Debug, Clone, Copy)]
struct Ranked((u32, f32));

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        by_rank(&self.0, &other.0)
    }
}

/// The `k` (clamped to 1..=len) largest logits of a cleaned row as `(id, logit)`, from
/// the largest, ties to the lower id.
pub(crate) fn top_candidates(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.clamp(1, logits.len().max(1));
    if k > HEAP_MAX_K {
        let mut all: Vec<(u32, f32)> = (0..).zip(logits.iter().copied()).collect();
        if k < all.len() {
            all.select_nth_unstable_by(k - 1, by_rank);
            all.truncate(k);
        }
        all.sort_unstable_by(by_rank);
        return all;
    }
    let mut heap = BinaryHeap::with_capacity(k);
    // The worst logit kept once the heap is full: most logits fail this one test.
    // Strictly greater, so on ties the earlier id stays.
    let mut floor = f32::NEG_INFINITY;
    for (i, &x) in (0..).zip(logits) {
        if heap.len() < k {
            heap.push(Ranked((i, x)));
            if heap.len() == k {
                floor = heap.peek().map_or(floor, |w| w.0 .1);
            }
        } else if x > floor {
            if let Some(mut worst) = heap.peek_mut() {
                *worst = Ranked((i, x));
            }
            floor = heap.peek().map_or(floor, |w| w.0 .1);
        }
    }
    heap.into_sorted_vec().into_iter().map(|r| r.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn reference_top(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
        let mut all: Vec<(u32, f32)> = (0..).zip(logits.iter().copied()).collect();
        all.sort_by(by_rank);
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
    fn nucleus_len_keeps_at_least_one_and_stops_at_the_target() {
        let c = [(0, 0.5), (1, 0.3), (2, 0.2)];
        assert_eq!(nucleus_len(&c, 0.0), Some(1));
        assert_eq!(nucleus_len(&c, 0.8), Some(2));
        assert_eq!(nucleus_len(&c, 0.81), Some(3));
        assert_eq!(nucleus_len(&c[..2], 0.9), None);
    }

    #[test]
    fn pick_never_returns_a_zero_weight() {
        let mut rng = StdRng::seed_from_u64(1);
        let w = [0.0f32, 2.0, 0.0, 1.0, 0.0];
        for _ in 0..1000 {
            let i = pick(&w, |&x| x, 3.0, rng.gen());
            assert!(i == 1 || i == 3);
        }
    }
}
