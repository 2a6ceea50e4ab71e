//! Repetition, presence and frequency penalties of one sequence: the token counts they
//! need and their application to a row of logits, touching only tokens already seen.

use std::collections::HashMap;

use super::plan::{Edit, EDIT_COUNT, EDIT_REPEAT};
use crate::request::GenerationParams;

/// What the penalties know about one token of the sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    in_prompt: bool,
    /// Occurrences among the generated tokens.
    generated: u32,
}

/// The penalties of one sequence and the counts they apply to.
///
/// Semantics (those of TensorRT-LLM, HF and OpenAI; applied to the raw logits, before
/// temperature, as HF and vLLM do, so a penalty's strength does not depend on the
/// temperature):
/// - repetition penalty `r`, over prompt and generated tokens: a positive logit is divided
///   by `r`, a negative one multiplied by `r`, once per distinct token whatever its count;
/// - presence penalty `p`, over generated tokens only: `p` is subtracted once;
/// - frequency penalty `f`, over generated tokens only: `f * count` is subtracted.
///
/// A repetition penalty that is not finite and positive is off (1.0); a presence or
/// frequency penalty that is not finite is off (0.0). Negative presence and frequency
/// penalties are allowed (they encourage repetition, as in OpenAI's API).
#[derive(Debug, Clone)]
pub(crate) struct Penalties {
    repetition: f32,
    presence: f32,
    frequency: f32,
    /// Every distinct token the active penalties look at; empty when all are off.
    seen: HashMap<u32, Seen>,
}

impl Penalties {
    pub(crate) fn new(params: &GenerationParams, prompt: &[u32]) -> Self {
        let repetition = match params.repetition_penalty {
            r if r.is_finite() && r > 0.0 => r,
            _ => 1.0,
        };
        let finite_or_zero = |x: f32| if x.is_finite() { x } else { 0.0 };
        let mut penalties = Penalties {
            repetition,
            presence: finite_or_zero(params.presence_penalty),
            frequency: finite_or_zero(params.frequency_penalty),
            seen: HashMap::new(),
        };
        if penalties.repetition != 1.0 {
            for &t in prompt {
                penalties.seen.entry(t).or_default().in_prompt = true;
            }
        }
        penalties
    }

    pub(crate) fn is_active(&self) -> bool {
        self.repetition != 1.0 || self.presence != 0.0 || self.frequency != 0.0
    }

    /// Counts a newly generated token.
    pub(crate) fn record(&mut self, token: u32) {
        if self.is_active() {
            self.seen.entry(token).or_default().generated += 1;
        }
    }

    pub(crate) fn repetition(&self) -> f32 {
        self.repetition
    }

    pub(crate) fn presence(&self) -> f32 {
        self.presence
    }

    pub(crate) fn frequency(&self) -> f32 {
        self.frequency
    }

    /// The edits that apply the penalties as if `extra` had been generated after the
    /// tokens counted so far: one per token seen (unsorted, for the caller to sort).
    pub(crate) fn edits(&self, extra: &[u32], out: &mut Vec<Edit>) {
        if !self.is_active() {
            return;
        }
        let repeat = if self.repetition != 1.0 {
            EDIT_REPEAT
        } else {
            0
        };
        let extra_count = |t: u32| extra.iter().filter(|&&x| x == t).count() as u32;
        for (&token, seen) in &self.seen {
            let count = (seen.generated + extra_count(token)).min(EDIT_COUNT);
            out.push(Edit {
                token,
                info: repeat | count,
            });
        }
        for (i, &token) in extra.iter().enumerate() {
            if !self.seen.contains_key(&token) && !extra[..i].contains(&token) {
                out.push(Edit {
                    token,
                    info: repeat | extra_count(token).min(EDIT_COUNT),
                });
            }
        }
    }

    /// Applies the penalties in place; ids outside the row are ignored.
    #[cfg(test)]
    pub(crate) fn apply(&self, logits: &mut [f32]) {
        if !self.is_active() {
            return;
        }
        for (&token, seen) in &self.seen {
            let Some(x) = logits.get_mut(token as usize) else {
                continue;
            };
            if self.repetition != 1.0 {
                *x = if *x > 0.0 {
                    *x / self.repetition
                } else {
                    *x * self.repetition
                };
            }
            if seen.generated > 0 {
                *x -= self.presence + self.frequency * seen.generated as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(rep: f32, presence: f32, frequency: f32) -> GenerationParams {
        GenerationParams {
            repetition_penalty: rep,
            presence_penalty: presence,
            frequency_penalty: frequency,
            ..Default::default()
        }
    }

    fn penalized(p: &Penalties, row: &[f32]) -> Vec<f32> {
        let mut row = row.to_vec();
        p.apply(&mut row);
        row
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative_over_prompt_and_output() {
        // Prompt holds 0 (twice) and 1; 3 is generated; 2 and 4 are never seen.
        let mut p = Penalties::new(&params(2.0, 0.0, 0.0), &[0, 1, 0]);
        p.record(3);
        p.record(3);
        let row = [4.0, -3.0, 5.0, 1.5, -1.0];
        assert_eq!(penalized(&p, &row), vec![2.0, -6.0, 5.0, 0.75, -1.0]);
    }

    #[test]
    fn presence_is_once_and_frequency_per_occurrence_over_generated_only() {
        // The prompt token 0 is not penalised by presence or frequency.
        let mut p = Penalties::new(&params(1.0, 0.5, 0.25), &[0]);
        for t in [1, 2, 2, 2] {
            p.record(t);
        }
        let row = [1.0, 1.0, 1.0, 1.0];
        // 1: 1 - 0.5 - 0.25; 2: 1 - 0.5 - 0.75.
        assert_eq!(penalized(&p, &row), vec![1.0, 0.25, -0.25, 1.0]);
    }

    #[test]
    fn penalties_combine_repetition_first() {
        let mut p = Penalties::new(&params(1.25, 1.0, 0.5), &[7]);
        p.record(1);
        p.record(1);
        p.record(0);
        let row = [-2.0, 5.0, 3.0];
        // 0: -2 * 1.25 - 1 - 0.5; 1: 5 / 1.25 - 1 - 1.0; 7 is outside the row.
        assert_eq!(penalized(&p, &row), vec![-4.0, 2.0, 3.0]);
    }

    #[test]
    fn invalid_penalties_are_off_and_touch_nothing() {
        for (r, pr, f) in [
            (0.0, f32::NAN, f32::INFINITY),
            (-1.0, 0.0, 0.0),
            (f32::NAN, 0.0, 0.0),
        ] {
            let mut p = Penalties::new(&params(r, pr, f), &[0, 1]);
            p.record(1);
            assert!(!p.is_active());
            assert!(p.seen.is_empty());
            assert_eq!(penalized(&p, &[1.0, -1.0]), vec![1.0, -1.0]);
        }
    }
}
