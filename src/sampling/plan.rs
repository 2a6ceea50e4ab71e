//! [`RowPlan`]: everything needed to choose one token from one row of logits, as plain
//! data a device can run (the GPU's `sample_rows` kernel) and the host runs as its CPU
//! twin ([`RowPlan::choose`], what [`SeqSampler::sample`](super::SeqSampler::sample)
//! does). Also the per-step uniform draw both sides share, so a seed gives the same
//! tokens on either.
//!
//! The row's penalties and masks travel as sparse [`Edit`]s (only tokens the sequence
//! has seen or may not produce), so the device never needs a sequence's history; its
//! logit bias as sparse `(token, bias)` pairs.
//!
//! A plan may also ask for the row's most likely tokens with their log-probabilities
//! (`top_log_probs`), or score a given token instead of choosing one (`target`: a prompt
//! token's log-probability).

use std::sync::Arc;

use rand::RngCore;

use super::math;
use super::select::{self, Cuts};
use super::TokenMask;
use crate::request::TokenLogprob;

/// The most alternatives a row returns (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOG_PROBS: usize = 20;

/// `Edit::info` bit: apply the repetition penalty to this token.
pub const EDIT_REPEAT: u32 = 1 << 30;
/// `Edit::info` bit: this token may not come next (its logit becomes -inf).
pub const EDIT_BAN: u32 = 1 << 31;
/// `Edit::info` bits holding the token's count among the generated tokens.
pub const EDIT_COUNT: u32 = EDIT_REPEAT - 1;

/// One token's change to a row, in the order the CPU sampler applies them: repetition
/// penalty, then presence and frequency by its generated count, then the ban.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Edit {
    /// The token whose logit changes.
    pub token: u32,
    /// Generated count (`EDIT_COUNT` bits) | `EDIT_REPEAT` | `EDIT_BAN`.
    pub info: u32,
}

/// How to choose one token from one row of logits.
#[derive(Debug, Clone, PartialEq)]
pub struct RowPlan {
    /// Argmax (temperature 0 or top_k 1); otherwise a draw.
    pub greedy: bool,
    /// 1 / temperature, finite and positive.
    pub inv_t: f32,
    /// 0 keeps every token.
    pub top_k: usize,
    /// Not NaN; 1 or more keeps every token.
    pub top_p: f32,
    /// The sequence's seed: with `step`, picks the draw.
    pub seed: u64,
    /// Tokens generated before this one: with `seed`, picks the draw.
    pub step: u64,
    /// Compute the chosen token's log-probability.
    pub want_log_prob: bool,
    /// Repetition penalty for tokens with `EDIT_REPEAT` (divides positive logits,
    /// multiplies negative ones); 1 is off.
    pub repetition: f32,
    /// Subtracted once from tokens with a generated count.
    pub presence: f32,
    /// Subtracted per generated occurrence.
    pub frequency: f32,
    /// At most one per token, sorted by token.
    pub edits: Vec<Edit>,
    /// Structured output: only these tokens may come next (after the edits).
    pub mask: Option<Arc<TokenMask>>,
    /// Added to these tokens' logits before the edits: at most one per token, sorted by
    /// token, finite.
    pub logit_bias: Vec<(u32, f32)>,
    /// Tokens whose weight after temperature (the most likely one's is 1) is below it are
    /// not drawn; 0 keeps every token.
    pub min_p: f32,
    /// Alternatives to return: the row's most likely tokens (after the edits) with their
    /// log-probabilities, at most [`MAX_TOP_LOG_PROBS`].
    pub top_log_probs: usize,
    /// Score this token instead of choosing one: the choice is `target` with its
    /// log-probability (a prompt token's, for `prompt_log_probs`).
    pub target: Option<u32>,
}

/// What choosing from one row gave.
#[derive(Debug, Clone, PartialEq)]
pub struct RowChoice {
    /// None when no token is allowed (every logit -inf or NaN after the edits).
    pub token: Option<u32>,
    /// The chosen token's log-probability (see `SeqSampler::sample`); -inf with no token,
    /// 0 when neither it nor alternatives were asked for.
    pub log_prob: f32,
    /// The plan's `top_log_probs` most likely tokens, from the most likely (ties to the
    /// lower id), tokens with a logit of -inf left out.
    pub top: Vec<TokenLogprob>,
}

impl RowChoice {
    /// The choice of a row with no allowed token.
    pub fn none() -> Self {
        RowChoice {
            token: None,
            log_prob: f32::NEG_INFINITY,
            top: Vec::new(),
        }
    }
}

/// `(x - max) * inv_t - ln(total)`: the log-softmax of a cleaned logit at `1 / inv_t`,
/// `total` being the row's weight (both sides compute it this way, the device in the
/// same f32 steps).
pub fn log_softmax(x: f32, max: f32, inv_t: f32, total: f64) -> f32 {
    (((x - max) * inv_t) as f64 - total.ln()) as f32
}

impl RowPlan {
    /// Greedy without the token's log-probability: the device's sampler may then split the
    /// row over blocks (kernels/sample.cu), since only the maximum's first id is needed.
    pub fn greedy_without_log_prob(&self) -> bool {
        self.greedy && !self.wants_total()
    }

    /// Whether the row's total weight is needed: for the chosen token's log-probability,
    /// alternatives, or a score.
    pub fn wants_total(&self) -> bool {
        self.want_log_prob || self.top_log_probs > 0 || self.target.is_some()
    }

    /// The plan that scores `target` (a prompt token) under the raw logits, with `top`
    /// alternatives.
    pub fn score(target: u32, top: usize) -> Self {
        RowPlan {
            want_log_prob: true,
            top_log_probs: top.min(MAX_TOP_LOG_PROBS),
            target: Some(target),
            ..RowPlan::argmax()
        }
    }

    /// The plan that takes the argmax and nothing else.
    pub fn argmax() -> Self {
        RowPlan {
            greedy: true,
            inv_t: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            step: 0,
            want_log_prob: false,
            repetition: 1.0,
            presence: 0.0,
            frequency: 0.0,
            edits: Vec::new(),
            mask: None,
            logit_bias: Vec::new(),
            min_p: 0.0,
            top_log_probs: 0,
            target: None,
        }
    }

    /// The cuts of this plan.
    pub(crate) fn cuts(&self) -> Cuts {
        Cuts {
            inv_t: self.inv_t,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
        }
    }

    /// Applies the logit bias, then the edits, in place: the CPU twin of the kernel's
    /// first phase.
    pub fn apply_edits(&self, logits: &mut [f32]) {
        for &(token, bias) in &self.logit_bias {
            if let Some(x) = logits.get_mut(token as usize) {
                *x += bias;
            }
        }
        for e in &self.edits {
            let Some(x) = logits.get_mut(e.token as usize) else {
                continue;
            };
            if e.info & EDIT_REPEAT != 0 {
                *x = if *x > 0.0 {
                    *x / self.repetition
                } else {
                    *x * self.repetition
                };
            }
            let count = e.info & EDIT_COUNT;
            if count > 0 {
                *x -= self.presence + self.frequency * count as f32;
            }
            if e.info & EDIT_BAN != 0 {
                *x = f32::NEG_INFINITY;
            }
        }
        if let Some(m) = &self.mask {
            m.apply(logits);
        }
    }

    /// Chooses a token from `logits` (scratch: its contents on return are unspecified):
    /// logit bias and edits, then greedy or temperature, min-p, top-k, top-p and the draw
    /// `step_uniform(seed, step)` over the kept tokens in id order; or, with a `target`,
    /// that token. The alternatives are the most likely tokens after the edits, scored
    /// like the chosen token (before the cuts). The CPU twin of `sample_rows`.
    pub fn choose(&self, logits: &mut [f32]) -> RowChoice {
        self.apply_edits(logits);
        let Some((best, max)) = math::sanitize(logits) else {
            return RowChoice::none();
        };
        let want_total = self.wants_total();
        // Ranked before the choice scratches the row.
        let top = match self.top_log_probs.min(MAX_TOP_LOG_PROBS) {
            0 => Vec::new(),
            k => select::top_candidates(logits, k),
        };
        let choice = match self.target {
            Some(t) => {
                let Some(&x) = logits.get(t as usize) else {
                    return RowChoice::none();
                };
                let total = math::exp_in_place(logits, max, self.inv_t);
                select::Choice {
                    token: t,
                    log_prob: Some(log_softmax(x, max, self.inv_t, total)),
                    total: Some(total),
                }
            }
            None if self.greedy => select::greedy(logits, best, max, self.inv_t, want_total),
            None => {
                let u = step_uniform(self.seed, self.step);
                select::draw(logits, max, self.cuts(), u, want_total)
            }
        };
        let top = match choice.total {
            Some(total) => top
                .into_iter()
                .filter(|&(_, x)| x > f32::NEG_INFINITY)
                .map(|(token, x)| TokenLogprob {
                    token,
                    log_prob: log_softmax(x, max, self.inv_t, total),
                })
                .collect(),
            None => Vec::new(),
        };
        RowChoice {
            token: Some(choice.token),
            log_prob: choice.log_prob.unwrap_or(0.0),
            top,
        }
    }
}

/// Derives the seed of sequence `j` of a prompt generating several (`n`, `best_of`) from
/// the request's seed: `seed` itself for the first, so a request of one sequence draws as
/// before; the others apart from it and from each other.
pub fn choice_seed(seed: u64, j: usize) -> u64 {
    if j == 0 {
        seed
    } else {
        mix(seed ^ mix(0x6e5f_6368_6f69_6365 ^ j as u64))
    }
}

/// Words per row in [`pack`]'s parameter layout.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const PLAN_WORDS: usize = 24;

/// Words per row of the alternatives the kernel writes after the tokens and
/// log-probabilities in the host's buffer: (token, log-probability bits) pairs.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const TOP_WORDS: usize = 2 * MAX_TOP_LOG_PROBS;

/// Plans laid out for the `sample_rows` kernel: per row [`PLAN_WORDS`] words (0 flags: 1
/// greedy, 2 the row's total (log-probabilities), 4 score the target; 1 inv_t; 2 top_k, 0
/// for all; 3 top_p; 4, 5 seed lo, hi; 6, 7 step lo, hi; 8 repetition; 9 presence; 10
/// frequency; 11 first edit; 12 end of edits; 13 mask; 14 mask bits; 15 spare; 16 first
/// bias; 17 end of biases; 18 min_p; 19 alternatives; 20 target; 21-23 spare), and every
/// row's edits as (token, info) pairs followed by its biases as (token, bias bits) pairs,
/// indexed as pairs of the same array; after every row's pairs, the rows' token masks
/// ([`TokenMask::words`]). A row's mask word is 1 + the offset of its mask's first word
/// in `edits`, 0 when it has none; rows sharing one mask share its words.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct PackedPlans {
    pub params: Vec<u32>,
    pub edits: Vec<u32>,
}

/// Packs one plan per row, in row order.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn pack<'a>(plans: impl IntoIterator<Item = &'a RowPlan>) -> PackedPlans {
    let mut out = PackedPlans::default();
    let mut masks: Vec<(usize, &'a Arc<TokenMask>)> = Vec::new();
    for (row, p) in plans.into_iter().enumerate() {
        let first = (out.edits.len() / 2) as u32;
        for e in &p.edits {
            out.edits.extend([e.token, e.info]);
        }
        let end = (out.edits.len() / 2) as u32;
        for &(token, bias) in &p.logit_bias {
            out.edits.extend([token, bias.to_bits()]);
        }
        let bias_end = (out.edits.len() / 2) as u32;
        let flags =
            p.greedy as u32 | (p.wants_total() as u32) << 1 | (p.target.is_some() as u32) << 2;
        if let Some(m) = &p.mask {
            masks.push((row, m));
        }
        out.params.extend([
            flags,
            p.inv_t.to_bits(),
            p.top_k.min(u32::MAX as usize) as u32,
            p.top_p.to_bits(),
            p.seed as u32,
            (p.seed >> 32) as u32,
            p.step as u32,
            (p.step >> 32) as u32,
            p.repetition.to_bits(),
            p.presence.to_bits(),
            p.frequency.to_bits(),
            first,
            end,
            0,
            p.mask
                .as_ref()
                .map_or(0, |m| m.bits().min(u32::MAX as usize) as u32),
            0,
            end,
            bias_end,
            p.min_p.to_bits(),
            p.top_log_probs.min(MAX_TOP_LOG_PROBS) as u32,
            p.target.unwrap_or(0),
            0,
            0,
            0,
        ]);
    }
    let mut placed: Vec<(&Arc<TokenMask>, u32)> = Vec::new();
    for (row, m) in masks {
        let at = match placed.iter().find(|(q, _)| Arc::ptr_eq(q, m)) {
            Some(&(_, at)) => at,
            None => {
                let at = out.edits.len() as u32 + 1;
                out.edits.extend_from_slice(m.words());
                placed.push((m, at));
                at
            }
        };
        out.params[row * PLAN_WORDS + 13] = at;
    }
    out
}

/// The splitmix64 finaliser: a bijection of u64 that mixes every bit into every other.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `k`-th 64 random bits of draw `step` of a sequence seeded `seed`: a counter-based
/// generator, so any step's draws can be made anywhere (host or device, any batch, any
/// order) and always agree.
pub(crate) fn step_bits(seed: u64, step: u64, k: u64) -> u64 {
    mix(mix(seed ^ mix(step)).wrapping_add(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
}

/// The uniform in `[0, 1)` a sampling step draws with: the top 53 bits of its first
/// random word.
pub fn step_uniform(seed: u64, step: u64) -> f64 {
    (step_bits(seed, step, 0) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The random words of one step, for rules that need more than one draw (the standard
/// speculative rule); the first is the one `step_uniform` uses.
#[derive(Debug, Clone)]
pub(crate) struct StepRng {
    seed: u64,
    step: u64,
    k: u64,
}

impl StepRng {
    pub(crate) fn new(seed: u64, step: u64) -> Self {
        StepRng { seed, step, k: 0 }
    }
}

impl RngCore for StepRng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        let bits = step_bits(self.seed, self.step, self.k);
        self.k += 1;
        bits
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bits = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bits[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_uniforms_are_spread_and_differ_by_seed_and_step() {
        let n = 100_000;
        let mean: f64 = (0..n).map(|s| step_uniform(7, s)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        let below: usize = (0..n).filter(|&s| step_uniform(7, s) < 0.1).count();
        assert!((9_000..11_000).contains(&below), "{below} below 0.1");
        assert_ne!(step_uniform(7, 3), step_uniform(8, 3));
        assert_ne!(step_uniform(7, 3), step_uniform(7, 4));
        assert!((0..n).all(|s| (0.0..1.0).contains(&step_uniform(s, s))));
        let mut rng = StepRng::new(7, 3);
        assert_eq!(
            (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64,
            step_uniform(7, 3)
        );
        assert_ne!(rng.next_u64(), step_bits(7, 3, 0));
    }

    #[test]
    fn pack_lays_rows_and_their_edits_out_in_order() {
        let mut a = RowPlan {
            greedy: false,
            inv_t: 2.0,
            top_k: usize::MAX,
            top_p: 0.5,
            seed: 0x1_0000_0002,
            step: 7,
            want_log_prob: true,
            repetition: 1.5,
            presence: 0.0,
            frequency: 0.0,
            edits: vec![Edit {
                token: 4,
                info: EDIT_BAN,
            }],
            ..RowPlan::argmax()
        };
        let b = RowPlan {
            greedy: true,
            edits: vec![],
            ..a.clone()
        };
        a.edits.push(Edit { token: 9, info: 3 });
        let packed = pack([&a, &b]);
        assert_eq!(packed.params.len(), 2 * PLAN_WORDS);
        assert_eq!(packed.edits, vec![4, EDIT_BAN, 9, 3]);
        let (ra, rb) = packed.params.split_at(PLAN_WORDS);
        assert_eq!(
            ra[..8],
            [2, 2f32.to_bits(), u32::MAX, 0.5f32.to_bits(), 2, 1, 7, 0]
        );
        assert_eq!(ra[8], 1.5f32.to_bits());
        assert_eq!((ra[11], ra[12]), (0, 2));
        assert_eq!((rb[0], rb[11], rb[12]), (3, 2, 2));
        assert_eq!((ra[13], rb[13]), (0, 0));
    }

    #[test]
    fn pack_appends_each_mask_once_after_the_edits() {
        let mut m = TokenMask::none(40);
        m.allow(1);
        m.allow(39);
        let m = Arc::new(m);
        let masked = RowPlan {
            edits: vec![Edit {
                token: 2,
                info: EDIT_BAN,
            }],
            mask: Some(m.clone()),
            ..RowPlan::argmax()
        };
        let packed = pack([&masked, &RowPlan::argmax(), &masked]);
        assert_eq!(&packed.edits[..4], &[2, EDIT_BAN, 2, EDIT_BAN]);
        assert_eq!(&packed.edits[4..], m.words());
        let word = |row: usize, w: usize| packed.params[row * PLAN_WORDS + w];
        assert_eq!((word(0, 13), word(0, 14)), (5, 40));
        assert_eq!((word(1, 13), word(1, 14)), (0, 0));
        assert_eq!(word(2, 13), 5);
    }

    #[test]
    fn edits_apply_repetition_then_counts_then_bans() {
        let plan = RowPlan {
            repetition: 2.0,
            presence: 0.5,
            frequency: 0.25,
            edits: vec![
                Edit {
                    token: 0,
                    info: EDIT_REPEAT,
                },
                Edit {
                    token: 1,
                    info: EDIT_REPEAT | 2,
                },
                Edit { token: 2, info: 1 },
                Edit {
                    token: 3,
                    info: EDIT_BAN,
                },
                Edit {
                    token: 99,
                    info: EDIT_BAN,
                },
            ],
            ..RowPlan::argmax()
        };
        let mut row = vec![4.0, -3.0, 1.0, 9.0, 0.0];
        plan.apply_edits(&mut row);
        assert_eq!(row, vec![2.0, -7.0, 0.25, f32::NEG_INFINITY, 0.0]);
        let mut row = vec![4.0, -3.0, 1.0, 9.0, 0.0];
        assert_eq!(plan.choose(&mut row).token, Some(0));
        let mut dead = vec![f32::NAN, f32::NEG_INFINITY, 0.0, 9.0];
        dead[2] = f32::NAN;
        let mut only_banned = plan.clone();
        only_banned.edits = vec![Edit {
            token: 3,
            info: EDIT_BAN,
        }];
        assert_eq!(only_banned.choose(&mut dead), RowChoice::none());
    }
}
