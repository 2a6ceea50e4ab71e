//! Preprocess actor (one of a pool): takes a submitted request (`PreprocessMsg::Submit`,
//! from the ModelHandle), validates its parameters, renders chat prompts through the
//! model's template and tokenizes, then opens its stream on a Postprocess worker
//! (`PostprocessMsg::Open`) and queues its sequences with the Scheduler (`Enqueue`): `n`
//! per prompt (`batch_index` `prompt * n + j`, the `j`-th seeded by `choice_seed`), or,
//! for beam search, `beam_width` per prompt, the first of which answers. A
//! refusal travels back in the reply, never as an actor error. Supervised by
//! ModelSupervisor.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::{call, Actor, ActorProcessingErr, ActorRef};

use super::messages::{
    CancelReason, PostprocessMsg, PreprocessMsg, SchedulerMsg, SeqInit, SubmitError,
};
use crate::guide::Guides;
use crate::request::{GenerationParams, Prompt};
use crate::sampling::{choice_seed, MAX_TOP_LOG_PROBS};
use crate::tokenizer::chat::ChatTemplate;
use crate::tokenizer::Tokenizer;

pub(crate) struct Preprocess;

pub struct PreprocessArgs {
    pub tokenizer: Arc<Tokenizer>,
    /// Compiles requests' structured-output constraints (shared by the pool).
    pub guides: Arc<Guides>,
    pub vocab_size: usize,
    pub max_seq_len: usize,
    /// A draft source is configured: requests may ask for `num_draft_tokens`.
    pub speculative: bool,
    pub scheduler: ActorRef<SchedulerMsg>,
    pub postprocess: Vec<ActorRef<PostprocessMsg>>,
    /// Sequence ids, unique across the pool.
    pub next_seq: Arc<AtomicU64>,
}

pub struct PreprocessState {
    args: PreprocessArgs,
    template: Result<ChatTemplate, String>,
}

impl Actor for Preprocess {
    type Msg = PreprocessMsg;
    type State = PreprocessState;
    type Arguments = PreprocessArgs;

    async fn pre_start(
        &self,
        _: ActorRef<PreprocessMsg>,
        args: PreprocessArgs,
    ) -> Result<PreprocessState, ActorProcessingErr> {
        let template = ChatTemplate::for_tokenizer(&args.tokenizer).map_err(|e| e.to_string());
        Ok(PreprocessState { args, template })
    }

    async fn handle(
        &self,
        _: ActorRef<PreprocessMsg>,
        msg: PreprocessMsg,
        state: &mut PreprocessState,
    ) -> Result<(), ActorProcessingErr> {
        let PreprocessMsg::Submit {
            rid,
            request,
            prompts,
            params,
            stream,
            reply,
        } = msg;
        let prepared = state.prepare(&prompts, &params);
        let (token_lists, prompt_texts) = match prepared {
            Ok(p) => p,
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(());
            }
        };
        let a = &state.args;
        let mut params = params;
        if let Some(guide) = &params.guide {
            match a.guides.compile(guide) {
                Ok(c) => params.compiled_guide = Some(c),
                Err(e) => {
                    let _ = reply.send(Err(SubmitError::Invalid(format!(
                        "invalid {} constraint: {e}",
                        guide.kind()
                    ))));
                    return Ok(());
                }
            }
        }
        let prompt_tokens: Vec<usize> = token_lists.iter().map(Vec::len).collect();
        let n = params.n.max(1);
        let choices = choice_params(params);
        let stop_after_ms = choices[0].stop_after_ms;
        // A beam search's beams are sequences of consecutive ids; the first answers.
        let width = choices[0].beam_width.max(1);
        let mut seqs = Vec::with_capacity(token_lists.len() * n * width);
        for (i, prompt) in token_lists.into_iter().enumerate() {
            for (j, params) in choices.iter().enumerate() {
                let first = a.next_seq.fetch_add(width as u64, Ordering::Relaxed);
                for b in 0..width as u64 {
                    seqs.push(SeqInit {
                        seq: first + b,
                        rid,
                        request: request.clone(),
                        batch_index: i * n + j,
                        prompt: prompt.clone(),
                        params: params.clone(),
                        beam_of: (width > 1).then_some(first),
                    });
                }
            }
        }
        let answers: Vec<SeqInit> = seqs
            .iter()
            .filter(|s| s.beam_of.is_none_or(|first| first == s.seq))
            .cloned()
            .collect();
        let prompt_texts: Vec<Option<String>> = prompt_texts
            .into_iter()
            .flat_map(|t| std::iter::repeat_n(t, n))
            .collect();
        let worker = &a.postprocess[(rid % a.postprocess.len() as u64) as usize];
        worker.cast(PostprocessMsg::Open {
            rid,
            request: request.clone(),
            seqs: answers,
            prompt_texts,
            stream,
            scheduler: a.scheduler.clone(),
        })?;
        let queued = call!(a.scheduler, |reply| SchedulerMsg::Enqueue { seqs, reply })
            .unwrap_or_else(|e| {
                Err(SubmitError::Unavailable(format!(
                    "scheduler unavailable: {e}"
                )))
            });
        if queued.is_err() {
            worker.cast(PostprocessMsg::Discard { rid })?;
        } else if let Some(ms) = stop_after_ms {
            let cancel = SchedulerMsg::Cancel {
                request,
                rid: Some(rid),
                reason: CancelReason::Timeout,
            };
            a.scheduler
                .send_after(Duration::from_millis(ms), move || cancel);
        }
        let _ = reply.send(queued.map(|()| prompt_tokens));
        Ok(())
    }
}

/// Each of the `n` sequences' parameters: the request's, with, when it is seeded, the
/// `j`-th sequence's seed derived from it (`choice_seed`), so that seeded sequences of one
/// prompt draw apart and repeat across requests.
fn choice_params(params: GenerationParams) -> Vec<Arc<GenerationParams>> {
    let n = params.n.max(1);
    let first = Arc::new(params);
    let mut out = vec![first.clone()];
    for j in 1..n {
        out.push(match first.random_seed {
            Some(seed) => Arc::new(GenerationParams {
                random_seed: Some(choice_seed(seed, j)),
                ..(*first).clone()
            }),
            None => first.clone(),
        });
    }
    out
}

impl PreprocessState {
    /// Token ids of every prompt, and the text echoed before a non-streamed answer.
    #[allow(clippy::type_complexity)]
    fn prepare(
        &self,
        prompts: &[Prompt],
        params: &GenerationParams,
    ) -> Result<(Vec<Vec<u32>>, Vec<Option<String>>), SubmitError> {
        let a = &self.args;
        validate(params, a.vocab_size, a.speculative)?;
        if prompts.is_empty() {
            return Err(SubmitError::Invalid("the request has no prompt".into()));
        }
        let mut ids = Vec::with_capacity(prompts.len());
        let mut texts = Vec::with_capacity(prompts.len());
        for (i, p) in prompts.iter().enumerate() {
            let (tokens, text) = match p {
                Prompt::Text(t) => (self.encode(t)?, Some(t.clone())),
                Prompt::Tokens(t) => {
                    if let Some(bad) = t.iter().find(|&&id| id as usize >= a.vocab_size) {
                        return Err(SubmitError::Invalid(format!(
                            "input token id {bad} is outside the vocabulary ({} tokens)",
                            a.vocab_size
                        )));
                    }
                    (t.clone(), a.tokenizer.decode(t, true).ok())
                }
                Prompt::Chat {
                    messages,
                    template_vars,
                } => {
                    let template = self
                        .template
                        .as_ref()
                        .map_err(|e| SubmitError::Invalid(e.clone()))?;
                    let text = template
                        .apply_with(messages, true, template_vars)
                        .map_err(|e| SubmitError::Invalid(e.to_string()))?;
                    (self.encode(&text)?, Some(text))
                }
            };
            if tokens.is_empty() {
                return Err(SubmitError::Invalid(format!("prompt {i} is empty")));
            }
            if tokens.len() >= a.max_seq_len {
                let why = match params.pooling {
                    Some(_) => "at most one less fits",
                    None => "so it leaves no room to generate",
                };
                return Err(SubmitError::Invalid(format!(
                    "prompt {i} has {} tokens; the model's context is {} tokens, {why}",
                    tokens.len(),
                    a.max_seq_len
                )));
            }
            ids.push(tokens);
            texts.push(text);
        }
        Ok((ids, texts))
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, SubmitError> {
        self.args
            .tokenizer
            .encode(text, true)
            .map_err(|e| SubmitError::Invalid(e.to_string()))
    }
}

pub(crate) use crate::speculative::MAX_DRAFT_TOKENS;

/// The most sequences a request may generate per prompt (`n`).
pub const MAX_CHOICES: usize = 16;
/// The most beams of a beam search (TensorRT-LLM's usual `max_beam_width` range).
pub const MAX_BEAM_WIDTH: usize = 8;
/// The largest logit bias, either way (OpenAI's range).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// Checks every parameter against what the sampler and model can do.
pub fn validate(
    p: &GenerationParams,
    vocab_size: usize,
    speculative: bool,
) -> Result<(), SubmitError> {
    let bad = |m: String| Err(SubmitError::Invalid(m));
    match (p.max_tokens, p.pooling) {
        (0, None) => return bad("max_tokens must be at least 1".into()),
        (n, Some(_)) if n > 0 => {
            return bad(format!(
                "an embedding request generates nothing: max_tokens must be 0, got {n}"
            ))
        }
        _ => {}
    }
    match p.num_draft_tokens {
        Some(n) if n > 0 && p.wants_logit_rows() => {
            return bad(format!(
                "num_draft_tokens {n} cannot go with return_context_logits or \
                 return_generation_logits: a sequence whose logits are returned does not \
                 speculate"
            ));
        }
        Some(n) if n > 0 && !speculative => {
            return bad(format!(
                "num_draft_tokens {n} needs speculative decoding, and this model has no draft \
                 source (configure [speculative] in the model's config)"
            ));
        }
        Some(n) if n > MAX_DRAFT_TOKENS => {
            return bad(format!(
                "num_draft_tokens must be at most {MAX_DRAFT_TOKENS}, got {n}"
            ));
        }
        _ => {}
    }
    if !p.temperature.is_finite() || p.temperature < 0.0 {
        return bad(format!(
            "temperature must be a finite number >= 0, got {}",
            p.temperature
        ));
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return bad(format!("top_p must be in (0, 1], got {}", p.top_p));
    }
    if !p.repetition_penalty.is_finite() || p.repetition_penalty <= 0.0 {
        return bad(format!(
            "repetition_penalty must be > 0, got {}",
            p.repetition_penalty
        ));
    }
    for (name, v) in [
        ("presence_penalty", p.presence_penalty),
        ("frequency_penalty", p.frequency_penalty),
    ] {
        if !v.is_finite() {
            return bad(format!("{name} must be a finite number, got {v}"));
        }
    }
    if !(1..=MAX_CHOICES).contains(&p.n) {
        return bad(format!(
            "n must be between 1 and {MAX_CHOICES} sequences per prompt, got {}",
            p.n
        ));
    }
    if p.top_log_probs > MAX_TOP_LOG_PROBS {
        return bad(format!(
            "top_log_probs must be at most {MAX_TOP_LOG_PROBS}, got {}",
            p.top_log_probs
        ));
    }
    if !(0.0..=1.0).contains(&p.min_p) {
        return bad(format!("min_p must be in [0, 1], got {}", p.min_p));
    }
    for &(id, bias) in &p.logit_bias {
        if id as usize >= vocab_size {
            return bad(format!(
                "logit_bias names token id {id}, outside the vocabulary ({vocab_size} tokens)"
            ));
        }
        if !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&bias) {
            return bad(format!(
                "logit_bias for token {id} must be between -{MAX_LOGIT_BIAS} and {MAX_LOGIT_BIAS}, got {bias}"
            ));
        }
    }
    let ids = p
        .end_id
        .iter()
        .chain(p.pad_id.iter())
        .chain(p.bad_words.iter().flatten())
        .chain(p.stop_words.iter().flatten());
    for &id in ids {
        if id as usize >= vocab_size {
            return bad(format!(
                "token id {id} is outside the vocabulary ({vocab_size} tokens)"
            ));
        }
    }
    validate_beams(p)
}

/// Beam search's own limits, and the options it does not go with.
fn validate_beams(p: &GenerationParams) -> Result<(), SubmitError> {
    let bad = |m: String| Err(SubmitError::Invalid(m));
    let w = p.beam_width;
    if !(1..=MAX_BEAM_WIDTH).contains(&w) {
        return bad(format!(
            "beam_width must be between 1 and {MAX_BEAM_WIDTH}, got {w}"
        ));
    }
    if w == 1 {
        return Ok(());
    }
    if p.beams_returned > w {
        return bad(format!(
            "num_return_sequences {} is more than beam_width {w}: beam search returns at most its beams",
            p.beams_returned
        ));
    }
    if !p.length_penalty.is_finite() {
        return bad(format!(
            "length_penalty must be a finite number, got {}",
            p.length_penalty
        ));
    }
    if p.early_stopping < 0 {
        return bad(format!(
            "early_stopping must be 0, 1 or more, got {}",
            p.early_stopping
        ));
    }
    let refused = [
        (p.n > 1, "n (several sampled sequences)"),
        (p.guide.is_some(), "guided decoding"),
        (
            p.num_draft_tokens.is_some_and(|n| n > 0),
            "num_draft_tokens (speculative decoding)",
        ),
        (p.top_log_probs > 0, "top_log_probs"),
        (
            !p.stop_strings.is_empty() || !p.stop_words.is_empty(),
            "stop words",
        ),
        (p.return_generation_logits, "return_generation_logits"),
        (p.pooling.is_some(), "pooling"),
    ];
    match refused.iter().find(|r| r.0) {
        Some((_, what)) => bad(format!(
            "{what} cannot go with beam search (beam_width {w})"
        )),
        None => Ok(()),
    }
}
