//! [`SeqSampler`]: the sampling state of one sequence (its generator, penalty counts,
//! word rules and generated tokens) and the step that turns its row of logits into the
//! next token.

use std::sync::Arc;

use rand::rngs::OsRng;
use rand::RngCore;

use super::penalties::Penalties;
use super::plan::{Edit, RowChoice, RowPlan, StepRng, MAX_TOP_LOG_PROBS};
use super::select::Cuts;
use super::words::WordRules;
use super::TokenMask;
use crate::guide::GuideState;
use crate::request::{GenerationParams, TokenLogprob};

/// The outcome of one sampling step.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The chosen token, already appended to the sampler's generated tokens.
    pub token: u32,
    /// Its log-probability, when `return_log_probs` was asked for (see
    /// [`SeqSampler::sample`] for which distribution).
    pub log_prob: Option<f32>,
    /// The sequence ends here: an end token (see [`SeqSampler::is_end_token`]), a stop
    /// word, or a row with no allowed token.
    pub stop: bool,
    /// The most likely tokens with their log-probabilities (as `log_prob` is taken),
    /// when `top_log_probs` asked for them.
    pub top: Vec<TokenLogprob>,
}

/// The sampling state of one sequence. Its draws are keyed by its seed and the number of
/// tokens generated so far (see `plan::step_uniform`), so a seeded sequence draws the
/// same tokens whatever else shares its batch, with or without speculation, on the host
/// or on a device.
#[derive(Debug, Clone)]
pub struct SeqSampler {
    /// Temperature 0 (or NaN, or negative), or top_k 1: argmax, no draw.
    greedy: bool,
    /// `inv_t` is 1 when the temperature is not positive.
    cuts: Cuts,
    want_log_probs: bool,
    /// Alternatives per token (`top_log_probs`, at most 20).
    top: usize,
    /// Added to the logits first: sorted by token, one per token, finite.
    logit_bias: Vec<(u32, f32)>,
    penalties: Penalties,
    words: WordRules,
    seed: u64,
    /// The last `words.context_len()` prompt tokens, then every generated token.
    history: Vec<u32>,
    prompt_tail: usize,
    /// Structured output: the grammar's state, or `Err` for a guide that was never
    /// compiled (nothing may be generated).
    guide: Option<Result<GuideState, ()>>,
    /// One beam of a beam search: a step offers the row's `2 x beam_width` likeliest
    /// tokens (`Sampled::top`, log-probabilities after penalties and temperature) and
    /// records nothing; the search chooses, and the chosen token is recorded with
    /// [`replay`](Self::replay) (a beam forked from another takes a copy of its sampler).
    beam: bool,
}

impl SeqSampler {
    /// A sampler for a sequence with this prompt. `eos_ids` are the model's end tokens,
    /// used when `params.end_id` is None. `random_seed` None draws a seed from the OS.
    ///
    /// Parameters are made safe rather than refused: a temperature that is NaN or not
    /// positive means greedy, a positive one is clamped to `[f32::MIN_POSITIVE, 1e30]` so
    /// that `1 / temperature` is finite and positive; a NaN top_p is 1 (off); top_k beyond
    /// the vocabulary keeps it all; invalid penalties are off (see `Penalties`); empty
    /// bad or stop words are dropped and ids outside the vocabulary are never masked; a
    /// min_p outside `[0, 1]` (or NaN) is clamped (NaN: off); biases that are not finite
    /// are dropped (the last of a token's counts); more than 20 alternatives are 20.
    pub fn new(params: &GenerationParams, prompt: &[u32], eos_ids: &[u32]) -> Self {
        let seed = seed_of(params);
        let words = WordRules::new(params, eos_ids);
        let prompt_tail = words.context_len().min(prompt.len());
        let beam = params.is_beam_search();
        let guide = match (&params.guide, &params.compiled_guide) {
            (_, Some(c)) => Some(Ok(GuideState::new(c, words.end_ids().to_vec()))),
            (Some(_), None) => Some(Err(())),
            (None, None) => None,
        };
        SeqSampler {
            guide,
            greedy: beam || is_greedy(params),
            cuts: match beam {
                // Beams rank by log-probability: no truncation applies.
                true => Cuts {
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    ..Cuts::of(params)
                },
                false => Cuts::of(params),
            },
            want_log_probs: beam || params.return_log_probs,
            top: match beam {
                true => 2 * params.beam_width,
                false => params.top_log_probs,
            }
            .min(MAX_TOP_LOG_PROBS),
            beam,
            logit_bias: clean_bias(&params.logit_bias),
            penalties: Penalties::new(params, prompt),
            history: prompt[prompt.len() - prompt_tail..].to_vec(),
            prompt_tail,
            words,
            seed,
        }
    }

    /// Chooses the next token from this sequence's row of logits and records it.
    ///
    /// Order: the logit bias, then penalties, then masks (bad words, `min_length`), then
    /// NaN to -inf; then greedy (the first maximum) when temperature is 0 or top_k is 1,
    /// else temperature, min-p, top-k, top-p and a draw from this sequence's generator. Bad and stop
    /// words are matched against the prompt's tail and the generated tokens together, as
    /// in TensorRT-LLM (a stop word may begin in the prompt; it always ends at the new
    /// token).
    ///
    /// `log_prob` is the log-softmax of the logits after penalties, masks and temperature
    /// (temperature 1 when it is 0), before the top-k/top-p cuts: the probability of the
    /// token under the request's penalties, which truncation would otherwise inflate (a
    /// top_k of 1 would give every token a log-probability of 0). The alternatives
    /// (`top_log_probs`) are the most likely tokens by those same logits, with their
    /// log-probabilities taken the same way.
    ///
    /// A row with no allowed token (empty, or all -inf/NaN after masking) cannot go on: it
    /// gives the lowest end token id (even with `ignore_eos`; 0 when there is none) with
    /// `stop` set and a log-probability of -inf.
    ///
    /// `logits` is scratch: its contents on return are unspecified.
    pub fn sample(&mut self, logits: &mut [f32]) -> Sampled {
        let choice = self.row_plan(&[]).choose(logits);
        self.take(choice)
    }

    /// How a prompt token of this sequence is scored (`prompt_log_probs`): its raw
    /// log-softmax, with this sequence's number of alternatives.
    pub fn score_plan(&self, target: u32) -> RowPlan {
        RowPlan::score(target, self.top)
    }

    /// Records a choice made from this sequence's [`plan`](Self::plan) (on the host or a
    /// device) as [`sample`](Self::sample) would have.
    pub fn take(&mut self, choice: RowChoice) -> Sampled {
        if self.beam {
            // The search chooses; nothing is recorded until it has.
            return Sampled {
                token: choice.token.unwrap_or(0),
                log_prob: Some(choice.log_prob),
                stop: false,
                top: choice.top,
            };
        }
        match choice.token {
            None => self.no_token(),
            Some(token) => {
                let log_prob = self.want_log_probs.then_some(choice.log_prob);
                let mut s = self.record_sampled(token, log_prob);
                if self.top > 0 {
                    s.top = choice.top;
                }
                s
            }
        }
    }

    /// How to choose the next token, and, after each of `drafts` in turn (as if it had
    /// been chosen), the one after it: `1 + drafts.len()` plans, for a device that
    /// samples every row of a step at once.
    pub fn plan(&mut self, drafts: &[u32]) -> Vec<RowPlan> {
        let masks = match &mut self.guide {
            Some(Ok(g)) if !drafts.is_empty() => Some(g.masks_after(drafts)),
            _ => None,
        };
        let mut plans: Vec<RowPlan> = (0..=drafts.len())
            .map(|i| self.row_plan_unmasked(&drafts[..i]))
            .collect();
        match masks {
            Some(masks) => {
                for (p, m) in plans.iter_mut().zip(masks) {
                    p.mask = Some(m);
                }
            }
            None => {
                if let Some(p) = plans.first_mut() {
                    p.mask = self.next_mask();
                }
            }
        }
        plans
    }

    /// The mask of the next token under the request's guide (None without one).
    fn next_mask(&mut self) -> Option<Arc<TokenMask>> {
        match self.guide.as_mut()? {
            Ok(g) => Some(g.mask()),
            Err(()) => Some(Arc::new(TokenMask::none(0))),
        }
    }

    /// Computes the next token's grammar mask now, if the request has a guide and it is
    /// not known yet: called between steps, while the forward pass runs, so the step
    /// that samples finds it ready. True when a mask was computed.
    pub fn prepare(&mut self) -> bool {
        match &mut self.guide {
            Some(Ok(g)) if !g.is_prepared() => {
                g.prepare();
                true
            }
            _ => false,
        }
    }

    /// Whether the request constrains its output with a guide.
    pub fn is_guided(&self) -> bool {
        self.guide.is_some()
    }

    /// Whether a sequence with these parameters can be planned a step ahead
    /// ([`plan_ahead`](Self::plan_ahead)): no penalty counts the token not yet known, and
    /// no word rule looks back at it (bad words; stop words while `min_length` bans
    /// their last tokens).
    pub fn plans_ahead(params: &GenerationParams) -> bool {
        let words = WordRules::new(params, &[]);
        !Penalties::new(params, &[]).is_active()
            && !words.looks_back()
            && params.guide.is_none()
            && !params.is_beam_search()
    }

    /// The plan for the token after the next one, before the next one is known: what
    /// [`plan`](Self::plan) will give once it is recorded, when
    /// [`plans_ahead`](Self::plans_ahead) holds for the request (None otherwise).
    pub fn plan_ahead(&self) -> Option<RowPlan> {
        if self.penalties.is_active()
            || self.words.looks_back()
            || self.guide.is_some()
            || self.beam
        {
            return None;
        }
        let generated = self.history.len() - self.prompt_tail + 1;
        let mut edits = Vec::new();
        // The rules look only at the count here: `history` is not read.
        self.words
            .banned(&[], generated, |t| edits_ban(&mut edits, t));
        edits.sort_unstable_by_key(|e| e.token);
        merge_edits(&mut edits);
        Some(RowPlan {
            step: generated as u64,
            edits,
            ..self.row_plan_unmasked(&[])
        })
    }

    /// The plan for the next token, with its grammar mask.
    fn row_plan(&mut self, extra: &[u32]) -> RowPlan {
        let mut plan = self.row_plan_unmasked(extra);
        plan.mask = self.next_mask();
        plan
    }

    /// The plan for the token after the generated ones and then `extra`, without the
    /// guide's mask.
    fn row_plan_unmasked(&self, extra: &[u32]) -> RowPlan {
        let generated = self.history.len() - self.prompt_tail + extra.len();
        let mut edits = Vec::new();
        self.penalties.edits(extra, &mut edits);
        let ban = |t: u32| edits_ban(&mut edits, t);
        if extra.is_empty() {
            self.words.banned(&self.history, generated, ban);
        } else {
            // The rules look back at most `context_len` tokens: that much history, then
            // the extra tokens, not a copy of the whole sequence per draft row.
            let keep = self.words.context_len().min(self.history.len());
            let tail = &self.history[self.history.len() - keep..];
            let history: Vec<u32> = tail.iter().chain(extra).copied().collect();
            self.words.banned(&history, generated, ban);
        }
        edits.sort_unstable_by_key(|e| e.token);
        merge_edits(&mut edits);
        RowPlan {
            greedy: self.greedy,
            inv_t: self.cuts.inv_t,
            top_k: self.cuts.top_k,
            top_p: self.cuts.top_p,
            seed: self.seed,
            step: generated as u64,
            want_log_prob: self.want_log_probs,
            repetition: self.penalties.repetition(),
            presence: self.penalties.presence(),
            frequency: self.penalties.frequency(),
            edits,
            mask: None,
            logit_bias: self.logit_bias.clone(),
            min_p: self.cuts.min_p,
            top_log_probs: self.top,
            target: None,
        }
    }

    /// What a row with no allowed token gives: the lowest end token, stopping.
    pub(super) fn no_token(&mut self) -> Sampled {
        let token = self.words.first_end_id().unwrap_or(0);
        self.record(token);
        Sampled {
            token,
            log_prob: self.want_log_probs.then_some(f32::NEG_INFINITY),
            stop: true,
            top: Vec::new(),
        }
    }

    /// Records `token` as chosen and says whether the sequence stops with it.
    pub(super) fn record_sampled(&mut self, token: u32, log_prob: Option<f32>) -> Sampled {
        self.record(token);
        Sampled {
            token,
            log_prob,
            stop: self.words.stops(&self.history),
            top: Vec::new(),
        }
    }

    /// Whether this sampler is a beam's (see [`SeqSampler::take`]).
    pub fn is_beam(&self) -> bool {
        self.beam
    }

    /// Whether this sequence chooses by argmax.
    pub fn is_greedy(&self) -> bool {
        self.greedy
    }

    pub(super) fn cuts(&self) -> Cuts {
        self.cuts
    }

    /// The random words of the next draw.
    pub(super) fn step_rng(&self) -> StepRng {
        StepRng::new(self.seed, (self.history.len() - self.prompt_tail) as u64)
    }

    pub(super) fn wants_log_probs(&self) -> bool {
        self.want_log_probs
    }

    /// Alternatives wanted per token.
    pub(super) fn top_log_probs(&self) -> usize {
        self.top
    }

    /// Applies penalties and masks in place: the logits [`sample`](Self::sample) chooses
    /// from, before temperature. The CPU twin of a GPU logits processor, and what tests
    /// check exact values on.
    pub fn process_logits(&mut self, logits: &mut [f32]) {
        self.row_plan(&[]).apply_edits(logits);
    }

    /// Records a token generated before this sampler existed (an engine rebuilding a
    /// preempted sequence's state from its tokens), or the token a beam search chose for
    /// this beam: counted, never a stop.
    pub fn replay(&mut self, token: u32) {
        self.record(token);
    }

    fn record(&mut self, token: u32) {
        if let Some(Ok(g)) = &mut self.guide {
            g.advance(token);
        }
        self.penalties.record(token);
        self.history.push(token);
    }

    /// The tokens chosen so far, in order (every one, the stopping token included).
    #[cfg(test)]
    pub fn generated(&self) -> &[u32] {
        &self.history[self.prompt_tail..]
    }

    /// Whether `token` is an end token of this request (`end_id`, else the model's eos
    /// ids; never with `ignore_eos`), e.g. to leave it out of the returned text.
    pub fn is_end_token(&self, token: u32) -> bool {
        self.words.is_end(token)
    }

    /// The seed of this sequence's generator: `random_seed`, or the one drawn for it.
    #[cfg(test)]
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

/// The finite biases of `bias`, sorted by token, the last one given for a token kept.
fn clean_bias(bias: &[(u32, f32)]) -> Vec<(u32, f32)> {
    let mut out: Vec<(u32, f32)> = bias.iter().copied().filter(|b| b.1.is_finite()).collect();
    // Stable: a token's entries keep their order, and the last one wins.
    out.sort_by_key(|b| b.0);
    out.reverse();
    out.dedup_by_key(|b| b.0);
    out.reverse();
    out
}

/// Adds a ban on `token` (merged with its penalty edit by `merge_edits`).
fn edits_ban(edits: &mut Vec<Edit>, token: u32) {
    edits.push(Edit {
        token,
        info: super::plan::EDIT_BAN,
    });
}

/// Merges edits of the same token (sorted by token): a banned token may also be penalised.
fn merge_edits(edits: &mut Vec<Edit>) {
    edits.dedup_by(|later, first| {
        let same = later.token == first.token;
        if same {
            first.info |= later.info;
        }
        same
    });
}

/// Whether `params` choose by argmax: temperature 0 (or NaN, or negative), or top_k 1.
pub(super) fn is_greedy(params: &GenerationParams) -> bool {
    let t = params.temperature;
    t.is_nan() || t <= 0.0 || params.top_k == 1
}

/// The request's seed, or one from the operating system.
pub(super) fn seed_of(params: &GenerationParams) -> u64 {
    params.random_seed.unwrap_or_else(os_seed)
}

impl Cuts {
    /// The cuts of `params`, made safe (see [`SeqSampler::new`]).
    pub(super) fn of(params: &GenerationParams) -> Self {
        let t = params.temperature;
        Cuts {
            inv_t: if t > 0.0 {
                1.0 / t.clamp(f32::MIN_POSITIVE, 1e30)
            } else {
                1.0
            },
            top_k: params.top_k,
            top_p: if params.top_p.is_nan() {
                1.0
            } else {
                params.top_p
            },
            // NaN fails the comparison: off.
            min_p: if params.min_p > 0.0 {
                params.min_p.min(1.0)
            } else {
                0.0
            },
        }
    }
}

/// A seed from the operating system; the thread-local generator (itself seeded from the
/// OS) if that fails, so that building a sampler never panics.
fn os_seed() -> u64 {
    let mut bytes = [0u8; 8];
    match OsRng.try_fill_bytes(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => rand::random(),
    }
}
