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
use super::plan::{log_softmax, RowChoice};
use super::select::{self, Cuts};
use super::seq::{self, Sampled, SeqSampler};
use crate::request::{GenerationParams, TokenLogprob};

/// What verifying one sequence's draft gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Tokens to emit, in order: the accepted draft tokens, then the target's own (at
    /// most `draft + 1` tokens; fewer when a stop comes first).
    pub tokens: Vec<u32>,
    /// Their log-probabilities, when the request asked for them.
    pub log_probs: Vec<Option<f32>>,
    /// Their alternatives (`top_log_probs`; empty lists when not asked for).
    pub tops: Vec<Vec<TokenLogprob>>,
    /// The last token ends the sequence.
    pub stop: bool,
    /// Draft tokens kept.
    pub accepted: usize,
}

impl Verdict {
    fn with_capacity(n: usize) -> Self {
        Verdict {
            tokens: Vec::with_capacity(n),
            log_probs: Vec::with_capacity(n),
            tops: Vec::with_capacity(n),
            stop: false,
            accepted: 0,
        }
    }

    /// Adds an emitted token (`kept`: it was the draft's); true when verification ends
    /// here (a stop, or a rejected draft).
    fn push(&mut self, s: Sampled, kept: bool) -> bool {
        self.tokens.push(s.token);
        self.log_probs.push(s.log_prob);
        self.tops.push(s.top);
        self.stop = s.stop;
        if kept {
            self.accepted += 1;
        }
        s.stop || !kept
    }
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
        let mut verdict = Verdict::with_capacity(draft.len() + 1);
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
                    let kept = Some(s.token) == d;
                    (s, kept)
                }
            };
            if verdict.push(s, kept) {
                break;
            }
        }
        verdict
    }

    /// [`verify`](Self::verify) by token matching from the choices a device made with
    /// this sequence's [`plan`](Self::plan) for `draft` (one per row): each row's choice
    /// is what sampling that row here would have given, so the verdict is the same.
    pub fn verify_choices(&mut self, draft: &[u32], choices: &[RowChoice]) -> Verdict {
        let mut verdict = Verdict::with_capacity(draft.len() + 1);
        for (i, choice) in choices.iter().take(draft.len() + 1).enumerate() {
            let s = self.take(choice.clone());
            let kept = Some(s.token) == draft.get(i).copied();
            if verdict.push(s, kept) {
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
        // The processed logits, for the log-probability and the alternatives (the cut
        // below scratches the row).
        let top = self.top_log_probs();
        let logits = (self.wants_log_probs() || top > 0).then(|| row.to_vec());
        let p = select::distribution(row, max, cuts);
        let di = d as usize;
        let keep_p = rule(
            p.get(di).copied().unwrap_or(0.0),
            q.get(di).copied().unwrap_or(0.0),
        );
        let mut rng = self.step_rng();
        let u: f32 = rng.gen();
        let (token, kept) = if u < keep_p {
            (d, true)
        } else {
            (residual_draw(&p, q, &mut rng), false)
        };
        let mut alternatives = Vec::new();
        let mut log_prob = None;
        if let Some(mut row) = logits {
            let ranked = if top > 0 {
                select::top_candidates(&row, top)
            } else {
                Vec::new()
            };
            let x = row[token as usize];
            let total = math::exp_in_place(&mut row, max, cuts.inv_t);
            alternatives = ranked
                .into_iter()
                .filter(|&(_, x)| x > f32::NEG_INFINITY)
                .map(|(token, x)| TokenLogprob {
                    token,
                    log_prob: log_softmax(x, max, cuts.inv_t, total),
                })
                .collect();
            log_prob = self
                .wants_log_probs()
                .then(|| log_softmax(x, max, cuts.inv_t, total));
        }
        let mut s = self.record_sampled(token, log_prob);
        s.top = alternatives;
        (s, kept)
    }
}

/// A token drawn from `max(0, p - q)` normalised; from `p` when that is all zero (the
/// distributions are equal up to rounding, so a rejection was a rounding artefact).
fn residual_draw(p: &[f32], q: &[f32], rng: &mut impl Rng) -> u32 {
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
        DraftSampler {
            greedy: seq::is_greedy(params),
            cuts: Cuts::of(params),
            rng: StdRng::seed_from_u64(seq::seed_of(params) ^ 0x9e37_79b9_7f4a_7c15),
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

#[cfg(test)]
mod tests {
    use super::*;

    const V: usize = 12;
    const TRIALS: usize = 20_000;

    fn params(temperature: f32, top_k: usize, seed: u64) -> GenerationParams {
        GenerationParams {
            temperature,
            top_k,
            random_seed: Some(seed),
            ..GenerationParams::default()
        }
    }

    fn logits(seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..V).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
    }

    /// `ln Γ(x)` (Lanczos, g = 7), for the chi-square tail.
    fn ln_gamma(x: f64) -> f64 {
        const C: [f64; 9] = [
            0.999_999_999_999_809_9,
            676.520_368_121_885_1,
            -1_259.139_216_722_402_8,
            771.323_428_777_653_1,
            -176.615_029_162_140_6,
            12.507_343_278_686_905,
            -0.138_571_095_265_720_12,
            9.984_369_578_019_572e-6,
            1.505_632_735_149_311_6e-7,
        ];
        let x = x - 1.0;
        let t = x + 7.5;
        let s: f64 = C[0] + (1..9).map(|i| C[i] / (x + i as f64)).sum::<f64>();
        0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + s.ln()
    }

    /// P(X >= x) for X ~ chi-square with `df` degrees of freedom: the regularised upper
    /// incomplete gamma Q(df/2, x/2), by its series below a + 1 and its continued
    /// fraction above.
    fn chi_square_tail(x: f64, df: usize) -> f64 {
        let (a, x) = (df as f64 / 2.0, x / 2.0);
        let front = (-x + a * x.ln() - ln_gamma(a)).exp();
        if x < a + 1.0 {
            let (mut term, mut sum, mut n) = (1.0 / a, 1.0 / a, a);
            while term.abs() > sum.abs() * 1e-15 {
                n += 1.0;
                term *= x / n;
                sum += term;
            }
            1.0 - sum * front
        } else {
            // Lentz's method on the continued fraction of Q.
            let tiny = 1e-300;
            let mut b = x + 1.0 - a;
            let mut c = 1.0 / tiny;
            let mut d = 1.0 / b;
            let mut h = d;
            for i in 1..500 {
                let an = -(i as f64) * (i as f64 - a);
                b += 2.0;
                d = an * d + b;
                d = if d.abs() < tiny { tiny } else { d };
                c = b + an / c;
                c = if c.abs() < tiny { tiny } else { c };
                d = 1.0 / d;
                let delta = d * c;
                h *= delta;
                if (delta - 1.0).abs() < 1e-15 {
                    break;
                }
            }
            front * h
        }
    }

    #[test]
    fn chi_square_tail_matches_tables() {
        // Critical values at p = 0.01 and 0.5 from standard tables.
        assert!((chi_square_tail(24.725, 11) - 0.01).abs() < 2e-4);
        assert!((chi_square_tail(10.341, 11) - 0.5).abs() < 2e-3);
        assert!((chi_square_tail(6.635, 1) - 0.01).abs() < 2e-4);
    }

    /// The first token emitted by verifying a one-token draft, over `TRIALS` seeds, and
    /// the p-value of a chi-square test against `want`.
    fn first_token_p_value(
        p: &GenerationParams,
        target: &[f32],
        draft_logits: &[f32],
        use_q: bool,
        rule: fn(f32, f32) -> f32,
        want: &[f32],
    ) -> f64 {
        let mut counts = [0usize; V];
        for trial in 0..TRIALS as u64 {
            let params = GenerationParams {
                random_seed: Some(trial),
                ..p.clone()
            };
            let mut drafter = DraftSampler::new(&params);
            let (d, q) = drafter.propose(&mut draft_logits.to_vec(), use_q);
            let mut rows = target.to_vec();
            rows.extend_from_slice(&logits(99));
            let mut sampler = SeqSampler::new(&params, &[1, 2, 3], &[]);
            let verdict = sampler.verify_with(&mut rows, V, &[d], q.as_deref(), rule);
            assert!(!verdict.tokens.is_empty() && verdict.tokens.len() <= 2);
            assert_eq!(
                verdict.accepted,
                usize::from(verdict.tokens[0] == d && verdict.tokens.len() == 2)
            );
            counts[verdict.tokens[0] as usize] += 1;
        }
        let n = TRIALS as f64;
        let chi2: f64 = counts
            .iter()
            .zip(want)
            .filter(|(_, &w)| w > 0.0)
            .map(|(&c, &w)| {
                let e = n * w as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum();
        let df = want.iter().filter(|&&w| w > 0.0).count() - 1;
        // A token the target never draws must never come out.
        for (c, w) in counts.iter().zip(want) {
            if *w == 0.0 {
                assert_eq!(*c, 0, "a token outside the target's support came out");
            }
        }
        chi_square_tail(chi2, df)
    }

    /// The distribution the target samples from for these parameters.
    fn target_distribution(p: &GenerationParams, row: &[f32]) -> Vec<f32> {
        let s = SeqSampler::new(p, &[], &[]);
        let mut row = row.to_vec();
        let (_, max) = math::sanitize(&mut row).unwrap();
        select::distribution(&mut row, max, s.cuts())
    }

    #[test]
    fn the_standard_rule_keeps_the_target_distribution() {
        let (target, draft) = (logits(1), logits(2));
        for p in [params(1.0, 0, 0), params(0.7, 6, 0)] {
            let want = target_distribution(&p, &target);
            let rejection = first_token_p_value(&p, &target, &draft, true, standard_rule, &want);
            assert!(rejection > 0.01, "standard rule rejected: p = {rejection}");
            let matching = first_token_p_value(&p, &target, &draft, false, standard_rule, &want);
            eprintln!(
                "T {} top_k {}: standard rule p = {rejection:.3}, token matching p = {matching:.3}",
                p.temperature, p.top_k
            );
            assert!(matching > 0.01, "token matching rejected: p = {matching}");
        }
    }

    #[test]
    fn a_broken_rule_is_caught() {
        let (target, draft) = (logits(1), logits(2));
        let p = params(1.0, 0, 0);
        let want = target_distribution(&p, &target);
        // Always keeping the draft token gives the draft's distribution.
        let always = first_token_p_value(&p, &target, &draft, true, |_, _| 1.0, &want);
        assert!(always < 0.01, "always-accept not caught: p = {always}");
        // Ignoring q (prompt lookup's rule, where q is certain) with a real draft model.
        let no_q = first_token_p_value(&p, &target, &draft, true, |p, _| p, &want);
        eprintln!("broken rules: always accept p = {always:.3e}, ignore q p = {no_q:.3e}");
        assert!(no_q < 0.01, "ignoring q not caught: p = {no_q}");
    }

    #[test]
    fn greedy_verification_is_exact_match() {
        let mut target = vec![0.0f32; 3 * V];
        target[5] = 3.0; // row 0: argmax 5
        target[V + 7] = 3.0; // row 1: argmax 7
        target[2 * V + 9] = 3.0; // row 2: argmax 9
        let mut s = SeqSampler::new(&params(0.0, 0, 1), &[1], &[]);
        let v = s.verify(&mut target.clone(), V, &[5, 7], None);
        assert_eq!(
            (v.tokens, v.accepted),
            (vec![5, 7, 9], 2),
            "all kept, plus one"
        );
        let mut s = SeqSampler::new(&params(0.0, 0, 1), &[1], &[]);
        let v = s.verify(&mut target.clone(), V, &[5, 8], None);
        assert_eq!(
            (v.tokens, v.accepted),
            (vec![5, 7], 1),
            "stops at the mismatch"
        );
        assert_eq!(s.generated(), [5, 7]);
    }

    #[test]
    fn a_stop_inside_the_draft_ends_verification() {
        let mut target = vec![0.0f32; 3 * V];
        target[5] = 3.0;
        target[V + 11] = 3.0; // 11 is the end token
        target[2 * V + 9] = 3.0;
        let mut s = SeqSampler::new(&params(0.0, 0, 1), &[1], &[11]);
        let v = s.verify(&mut target, V, &[5, 11], None);
        assert_eq!((v.tokens, v.stop, v.accepted), (vec![5, 11], true, 2));
    }
}
