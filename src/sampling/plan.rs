//! [`RowPlan`]: everything needed to choose one token from one row of logits, as plain
//! data a device can run (the GPU's `sample_rows` kernel) and the host runs as its CPU
//! twin ([`RowPlan::choose`], what [`SeqSampler::sample`](super::SeqSampler::sample)
//! does). Also the per-step uniform draw both sides share, so a seed gives the same
//! tokens on either.
//!
//! The row's penalties and masks travel as sparse [`Edit`]s (only tokens the sequence
//! has seen or may not produce), so the device never needs a sequence's history.

use std::sync::Arc;

use rand::RngCore;

use super::math;
use super::select::{self, Cuts};
use super::TokenMask;

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
}

/// What choosing from one row gave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowChoice {
    /// None when no token is allowed (every logit -inf or NaN after the edits).
    pub token: Option<u32>,
    /// The chosen token's log-probability (see `SeqSampler::sample`); -inf with no token,
    /// 0 when not asked for.
    pub log_prob: f32,
}

impl RowPlan {
    /// Greedy without the token's log-probability: the device's sampler may then split the
    /// row over blocks (kernels/sample.cu), since only the maximum's first id is needed.
    pub fn greedy_without_log_prob(&self) -> bool {
        self.greedy && !self.want_log_prob
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
        }
    }

    /// The cuts of this plan.
    pub(crate) fn cuts(&self) -> Cuts {
        Cuts {
            inv_t: self.inv_t,
            top_k: self.top_k,
            top_p: self.top_p,
        }
    }

    /// Applies the edits in place: the CPU twin of the kernel's first phase.
    pub fn apply_edits(&self, logits: &mut [f32]) {
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
    /// edits, then greedy or temperature, top-k, top-p and the draw `step_uniform(seed,
    /// step)` over the kept tokens in id order. The CPU twin of `sample_rows`.
    pub fn choose(&self, logits: &mut [f32]) -> RowChoice {
        self.apply_edits(logits);
        let Some((best, max)) = math::sanitize(logits) else {
            return RowChoice {
                token: None,
                log_prob: f32::NEG_INFINITY,
            };
        };
        let choice = if self.greedy {
            select::greedy(logits, best, max, self.inv_t, self.want_log_prob)
        } else {
            let u = step_uniform(self.seed, self.step);
            select::draw(logits, max, self.cuts(), u, self.want_log_prob)
        };
        RowChoice {
            token: Some(choice.token),
            log_prob: choice.log_prob.unwrap_or(0.0),
        }
    }
}

/// Words per row in [`pack`]'s parameter layout.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const PLAN_WORDS: usize = 16;

/// Plans laid out for the `sample_rows` kernel: per row [`PLAN_WORDS`] words (flags: 1
/// greedy, 2 log-prob; inv_t; top_k, 0 for all; top_p; seed lo, hi; step lo, hi;
/// repetition; presence; frequency; first edit; end of edits; mask; mask bits; one spare),
/// and every row's edits as (token, info) pairs followed by the rows' token masks
/// ([`TokenMask::words`]). A row's mask word is 1 + the offset of its mask's first word in
/// `edits`, 0 when it has none; rows sharing one mask share its words.
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
        let flags = p.greedy as u32 | (p.want_log_prob as u32) << 1;
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
            mask: None,
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
        assert_eq!(
            only_banned.choose(&mut dead),
            RowChoice {
                token: None,
                log_prob: f32::NEG_INFINITY
            }
        );
    }
}
