//! Speculative decoding's two sampling halves: [`DraftSampler`] proposes tokens from a
//! draft model's logits, and [`SeqSampler::verify`] decides, from the target's logits at
//! every draft position, which of them to keep and what comes after.
//!
//! Acceptance, so that the output follows the target's distribution exactly:
//! - without the draft's probabilities (greedy requests, prompt lookup,
//!   `use_draft_logits` off) the target samples each position as it would without
//!   speculation, and a draft token is kept while it equals the target's token. Greedy,
//!   that is exact match; sampling, it draws the same tokens from the same seed as a run
//!   without speculation.
//! - with them (`use_draft_logits`, sampling), the standard rule: keep draft token `d`
//!   with probability `min(1, p(d) / q(d))`, otherwise draw from the residual
//!   `max(0, p - q)` normalised, and stop there.
//!
//! `p` and `q` are the distributions the samplers draw from (penalties and masks on the
//! target side, then temperature, top-k and top-p on both).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::math;
use super::select::{self, Cuts};
use super::seq::{Sampled, SeqSampler};
use crate::request::GenerationParams;

/// What verifying one sequence's draft gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Tokens to emit, in order: the accepted draft tokens, then the target's own (at
    /// most `draft + 1` tokens; fewer when a stop comes first).
    pub tokens: Vec<u32>,
    /// Their log-probabilities, when the request asked for them.
    pub log_probs: Vec<Option<f32>>,
    /// The last token ends the sequence.
    pub stop: bool,
    /// Draft tokens kept.
    pub accepted: usize,
}

/// The probability of keeping a draft token whose target probability is `p` and draft
/// probability `q`: the standard speculative sampling rule.
pub fn standard_rule(p: f32, q: f32) -> f32 {
    if q <= 0.0 {
        // The draft could not have drawn it; keep it only if the target could.
        return if p > 0.0 { 1.0 } else { 0.0 };
    }
    (p / q).min(1.0)
}

impl SeqSampler {
    /// Verifies `draft` against the target's logits: `rows` holds `draft.len() + 1` rows
    /// of `vocab` logits (the row after the last known token, then the row after each
    /// draft token). `draft_probs`, `[draft.len(), vocab]`, are the draft's distributions
    /// for the standard rule; without them tokens are matched. Every emitted token is
    /// recorded as if sampled. `rows` is scratch.
    pub fn verify(
        &mut self,
        rows: &mut [f32],
        vocab: usize,
        draft: &[u32],
        draft_probs: Option<&[f32]>,
    ) -> Verdict {
        self.verify_with(rows, vocab, draft, draft_probs, standard_rule)
    }

    /// [`verify`](Self::verify) with the acceptance probability given by `rule(p, q)`
    /// (tests break it on purpose to show the distribution check notices).
    pub fn verify_with(
        &mut self,
        rows: &mut [f32],
        vocab: usize,
        draft: &[u32],
        draft_probs: Option<&[f32]>,
        rule: fn(f32, f32) -> f32,
    ) -> Verdict {
        let mut verdict = Verdict {
            tokens: Vec::with_capacity(draft.len() + 1),
            log_probs: Vec::with_capacity(draft.len() + 1),
            stop: false,
            accepted: 0,
        };
        let use_q = draft_probs.filter(|q| !self.is_greedy() && q.len() == draft.len() * vocab);
        for (i, row) in rows
            .chunks_exact_mut(vocab)
            .take(draft.len() + 1)
            .enumerate()
        {
            let d = draft.get(i).copied();
            let (s, kept) = match (d, use_q) {
                (Some(d), Some(q)) => self.judge(row, d, &q[i * vocab..(i + 1) * vocab], rule),
                _ => {
                    let s = self.sample(row);
                    (s, Some(s.token) == d)
                }
            };
            verdict.tokens.push(s.token);
            verdict.log_probs.push(s.log_prob);
            verdict.stop = s.stop;
            if kept {
                verdict.accepted += 1;
            }
            if s.stop || !kept {
                break;
            }
        }
        verdict
    }

    /// One position under the standard rule: keeps `d` with probability `rule(p, q)`,
    /// otherwise draws from the residual. Returns the emitted token and whether it is `d`.
    fn judge(
        &mut self,
        row: &mut [f32],
        d: u32,
        q: &[f32],
        rule: fn(f32, f32) -> f32,
    ) -> (Sampled, bool) {
        self.process_logits(row);
        let Some((_, max)) = math::sanitize(row) else {
            return (self.no_token(), false);
        };
        let cuts = self.cuts();
        let logits = row.to_vec();
        let p = select::distribution(row, max, cuts);
        let di = d as usize;
        let keep_p = rule(
            p.get(di).copied().unwrap_or(0.0),
            q.get(di).copied().unwrap_or(0.0),
        );
        let u: f32 = self.rng().gen();
        let (token, kept) = if u < keep_p {
            (d, true)
        } else {
            (residual_draw(&p, q, self.rng()), false)
        };
        let log_prob = self.wants_log_probs().then(|| {
            let z = (logits[token as usize] - max) * cuts.inv_t;
            let mut row = logits;
            let total = math::exp_in_place(&mut row, max, cuts.inv_t);
            (z as f64 - total.ln()) as f32
        });
        (self.record_sampled(token, log_prob), kept)
    }
}

/// A token drawn from `max(0, p - q)` normalised; from `p` when that is all zero (the
/// distributions are equal up to rounding, so a rejection was a rounding artefact).
fn residual_draw(p: &[f32], q: &[f32], rng: &mut StdRng) -> u32 {
    let residual: Vec<f32> = p
        .iter()
        .zip(q.iter().chain(std::iter::repeat(&0.0)))
        .map(|(&a, &b)| (a - b).max(0.0))
        .collect();
    let mass: f64 = residual.iter().map(|&x| x as f64).sum();
    let (weights, mass) = if mass > 0.0 {
        (&residual[..], mass)
    } else {
        (p, p.iter().map(|&x| x as f64).sum())
    };
    math::find_cumulative(weights, rng.gen::<f64>() * mass)
        .or_else(|| weights.iter().rposition(|&w| w > 0.0))
        .unwrap_or(0) as u32
}

/// Draws draft tokens from a draft model's logits with a request's temperature, top-k
/// and top-p (no penalties: any proposal distribution keeps the output exact, as long as
/// the verifier knows it).
#[derive(Debug, Clone)]
pub struct DraftSampler {
    greedy: bool,
    cuts: Cuts,
    rng: StdRng,
}

impl DraftSampler {
    /// Seeded from the request's seed (mixed, so the draft's draws are not the target's)
    /// or from the OS.
    pub fn new(params: &GenerationParams) -> Self {
        let probe = SeqSampler::new(params, &[], &[]);
        DraftSampler {
            greedy: probe.is_greedy(),
            cuts: probe.cuts(),
            rng: StdRng::seed_from_u64(probe.seed() ^ 0x9e37_79b9_7f4a_7c15),
        }
    }

    /// The next draft token, and the distribution it was drawn from when `want_probs`
    /// (and the request samples). `logits` is scratch.
    pub fn propose(&mut self, logits: &mut [f32], want_probs: bool) -> (u32, Option<Vec<f32>>) {
        let Some((best, max)) = math::sanitize(logits) else {
            return (0, None);
        };
        if self.greedy {
            return (best as u32, None);
        }
        let q = select::distribution(logits, max, self.cuts);
        let mass: f64 = q.iter().map(|&x| x as f64).sum();
        let token = math::find_cumulative(&q, self.rng.gen::<f64>() * mass)
            .or_else(|| q.iter().rposition(|&w| w > 0.0))
            .unwrap_or(best) as u32;
        (token, want_probs.then_some(q))
    }
}
