//! The OpenAI-compatible API on the inference port, as vLLM serves it beside its own:
//! `GET /v1/models`, `GET /v1/models/{model}`, `POST /v1/completions` and
//! `POST /v1/chat/completions`, answered whole or streamed as SSE (`data: {chunk}`, then
//! `data: [DONE]`). Any served name is a valid `model`; an unknown one is a 404.
//! Chat messages go to the pipeline as [`Prompt::Chat`], so the model's own template
//! renders them. Errors use the server-wide `{"error": "..."}` body (the official
//! client raises on the status alone); a failure in mid-stream is an
//! `{"error": {...}}` event, which the client raises as `APIError`, and ends the stream.
//!
//! Sampling: `n` choices per prompt (`index` `prompt * n + j`; streamed deltas carry
//! their choice's index), `best_of` (completions, not streamed: the `n` of `best_of`
//! sequences with the highest cumulative log-probability), per-choice seeds, `logit_bias`,
//! `min_p`. Log-probabilities: the sampled token's with `logprobs` (completions) or
//! `logprobs: true` (chat), the most likely alternatives (completions' `logprobs` of them,
//! chat's `top_logprobs`), and with `echo` and `logprobs` the prompt's (its first token's
//! null). Usage counts each prompt's tokens once, however many choices it has. Output
//! constraints come from src/http/guided.rs; tools and their calls from src/http/tools.rs.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::{json, Value};

use super::openai_types::*;
use super::tracked::TrackedStream;
use super::{parse_json, ApiError, ApiResult, AppState};
use crate::handle::ModelHandle;
use crate::request::{Chunk, Prompt, PromptLogprob, Request, TokenLogprob};
use crate::tokenizer::Tokenizer;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/models/{*model}", get(get_model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The unknown-model error OpenAI gives, as a 404.
pub(super) fn check_model(state: &AppState, name: &str) -> ApiResult<()> {
    if state.served_names().iter().any(|n| n == name) {
        Ok(())
    } else {
        Err(ApiError::NotFound(format!(
            "The model `{name}` does not exist."
        )))
    }
}

fn card(name: &str, created: u64) -> ModelCard<'_> {
    ModelCard {
        id: name,
        object: "model",
        created,
        owned_by: "inflight",
    }
}

fn started(state: &AppState) -> u64 {
    unix_now().saturating_sub(state.uptime().as_secs())
}

async fn list_models(State(state): State<AppState>) -> Response {
    let names = state.served_names();
    let created = started(&state);
    let data = names.iter().map(|n| card(n, created)).collect();
    Json(ModelList {
        object: "list",
        data,
    })
    .into_response()
}

async fn get_model(
    State(state): State<AppState>,
    Path(model): Path<String>,
) -> ApiResult<Response> {
    check_model(&state, &model)?;
    Ok(Json(card(&model, started(&state))).into_response())
}

/// The context length that `max_tokens` must leave room in.
pub(super) fn context(model: &ModelHandle) -> usize {
    model.config().max_position_embeddings
}

/// The serving model a body names (`model`: OpenAI's 404 for a name not served, a 503
/// while its model is not serving), or when it names none the only one served.
pub(super) fn named_model(state: &AppState, name: Option<&str>) -> ApiResult<ModelHandle> {
    if let Some(n) = name {
        check_model(state, n)?;
    }
    state.model_or_only(name)
}

/// [`named_model`] for a JSON body's `model` field.
fn body_model(state: &AppState, body: &Value) -> ApiResult<ModelHandle> {
    named_model(state, body.get("model").and_then(Value::as_str))
}

/// One SSE `data:` event holding `v` as JSON.
fn data<T: Serialize>(v: &T) -> Event {
    let text = serde_json::to_string(v)
        .unwrap_or_else(|e| json!({"error": {"message": e.to_string()}}).to_string());
    Event::default().data(text)
}

/// The event that reports an engine failure in mid-stream (the official client raises on
/// it), with the status [`ApiError`] gives it.
fn error_event(message: &str) -> Event {
    let e = ApiError::EngineFailed(message.to_string());
    let code = e.status().as_u16();
    data(&json!({"error": {"message": e.to_string(), "type": "server_error", "code": code}}))
}

pub(super) fn sse(events: impl Stream<Item = Event> + Send + 'static) -> Response {
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Each answer (`answers`: the prompts times the sequences of each), merged from its
/// chunks; an engine failure is an error.
async fn collect(stream: TrackedStream, answers: usize) -> ApiResult<Vec<Chunk>> {
    let mut merged = vec![Chunk::default(); answers];
    let chunks: Vec<Chunk> = stream.collect().await;
    for c in chunks {
        if let Some(e) = c.error {
            return Err(ApiError::EngineFailed(e));
        }
        let slot = &mut merged[c.batch_index.min(answers - 1)];
        slot.batch_index = c.batch_index;
        slot.text.push_str(&c.text);
        slot.token_ids.extend(c.token_ids);
        slot.log_probs.extend(c.log_probs);
        slot.top_log_probs.extend(c.top_log_probs);
        slot.prompt_log_probs.extend(c.prompt_log_probs);
        slot.finish_reason = c.finish_reason.or(slot.finish_reason);
        if c.finish_reason.is_some() {
            slot.prompt_tokens = c.prompt_tokens;
            slot.output_tokens = c.output_tokens;
            slot.cached_tokens = c.cached_tokens;
        }
    }
    Ok(merged)
}

/// Completions' alternatives of one token: the `k` likeliest, and the token itself when
/// it is not among them (so up to `k + 1`, as OpenAI's).
fn completion_top(
    tok: &Tokenizer,
    id: u32,
    lp: f32,
    top: &[TokenLogprob],
    k: usize,
) -> TopLogprobs {
    let mut out = TopLogprobs::default();
    for a in top.iter().take(k) {
        out.push(tok.token_text(a.token).unwrap_or_default(), a.log_prob);
    }
    if !top.iter().take(k).any(|a| a.token == id) {
        out.push(tok.token_text(id).unwrap_or_default(), lp);
    }
    out
}

/// Completions' `logprobs` for a chunk's tokens, with `k` alternatives each (`top_logprobs`
/// null when `k` is 0); `offset` is the choice's text so far, in characters, and advances
/// past them.
fn completion_logprobs(
    tok: &Tokenizer,
    c: &Chunk,
    offset: &mut usize,
    k: usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    let mut tops = Vec::new();
    for (i, (&id, &lp)) in c.token_ids.iter().zip(&c.log_probs).enumerate() {
        let text = tok.token_text(id).unwrap_or_default();
        out.text_offset.push(*offset);
        *offset += text.chars().count();
        out.tokens.push(text);
        out.token_logprobs.push(Some(finite(lp)));
        let top = c.top_log_probs.get(i).map_or(&[][..], Vec::as_slice);
        tops.push(Some(completion_top(tok, id, lp, top, k)));
    }
    out.top_logprobs = (k > 0).then_some(tops);
    out
}

/// Completions' `logprobs` for an echoed prompt: its tokens from offset 0, the first one's
/// log-probability and alternatives null.
fn prompt_logprobs(tok: &Tokenizer, prompt: &[PromptLogprob], k: usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    let mut tops = Vec::new();
    let mut offset = 0;
    for p in prompt {
        let text = tok.token_text(p.token).unwrap_or_default();
        out.text_offset.push(offset);
        offset += text.chars().count();
        out.tokens.push(text);
        out.token_logprobs.push(p.log_prob.map(finite));
        tops.push(
            p.log_prob
                .map(|lp| completion_top(tok, p.token, lp, &p.top, k)),
        );
    }
    out.top_logprobs = (k > 0).then_some(tops);
    out
}

fn chat_logprobs(tok: &Tokenizer, c: &Chunk) -> ChatLogprobs {
    let content = c
        .token_ids
        .iter()
        .zip(&c.log_probs)
        .enumerate()
        .map(|(i, (&id, &logprob))| ChatTokenLogprob {
            token: tok.token_text(id).unwrap_or_default(),
            logprob: finite(logprob),
            bytes: tok.token_bytes(id).unwrap_or_default(),
            top_logprobs: c
                .top_log_probs
                .get(i)
                .map(|top| {
                    top.iter()
                        .map(|a| ChatTopLogprob {
                            token: tok.token_text(a.token).unwrap_or_default(),
                            logprob: finite(a.log_prob),
                            bytes: tok.token_bytes(a.token).unwrap_or_default(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    ChatLogprobs { content }
}

/// The sequences of one prompt to return, by place among its sequences: the `n` with the
/// highest cumulative log-probability (the first on ties), in their order, or all of them
/// when there is no choosing.
fn best(group: &[Chunk], n: usize) -> Vec<usize> {
    if group.len() <= n {
        return (0..group.len()).collect();
    }
    let cum = |c: &Chunk| c.log_probs.iter().map(|&l| l as f64).sum::<f64>();
    let mut order: Vec<usize> = (0..group.len()).collect();
    order.sort_by(|&a, &b| cum(&group[b]).total_cmp(&cum(&group[a])).then(a.cmp(&b)));
    order.truncate(n);
    order.sort_unstable();
    order
}

/// The text `echo` puts before a prompt's answer.
fn prompt_text(tok: &Tokenizer, p: &Prompt) -> String {
    match p {
        Prompt::Text(t) => t.clone(),
        Prompt::Tokens(ids) => tok.decode(ids, false).unwrap_or_default(),
        Prompt::Chat { .. } => String::new(),
    }
}

/// The header that names a request: taken from the client when it sends one (so it can
/// stop the request by that id), returned on every answer.
const REQUEST_ID: &str = "x-request-id";

/// The client's request id, if it sent a usable one.
pub(super) fn request_id(headers: &HeaderMap) -> ApiResult<Option<String>> {
    match headers.get(REQUEST_ID) {
        None => Ok(None),
        Some(v) => match v.to_str().map(str::trim) {
            Ok(id) if !id.is_empty() && id.len() <= 256 => Ok(Some(id.to_owned())),
            _ => Err(ApiError::BadRequest(format!(
                "the {REQUEST_ID} header must be 1-256 visible ASCII characters"
            ))),
        },
    }
}

/// `response` with the request's id in its headers.
pub(super) fn with_request_id(mut response: Response, id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(id) {
        response.headers_mut().insert(REQUEST_ID, v);
    }
    response
}

async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let body = parse_json(&body)?;
    let model = body_model(&state, &body)?;
    let req = completion_request(&body, context(&model))?;
    let tok = model.tokenizer();
    let echoes: Vec<String> = match req.echo {
        true => req.prompts.iter().map(|p| prompt_text(tok, p)).collect(),
        false => vec![String::new(); req.prompts.len()],
    };
    let prompts = req.prompts.len();
    let streamed = req.params.stream;
    let (n, best_of) = (req.n, req.best_of);
    let request = Request {
        id: request_id(&headers)?,
        prompts: req.prompts,
        params: req.params,
    };
    let stream = state.submit(&model, &req.model, request).await?;
    let rid = stream.id().to_owned();
    let id = format!("cmpl-{rid}");
    let meta = Meta {
        id,
        model: req.model,
        created: unix_now(),
    };
    let k = req.logprobs.map_or(0, usize::from);
    if streamed {
        // No best_of when streamed: each sequence is a choice.
        let events = stream_completion(
            model,
            meta,
            stream,
            echoes,
            n,
            req.logprobs.map(|_| k),
            req.include_usage,
        );
        return Ok(with_request_id(sse(events), &rid));
    }
    let answers = collect(stream, prompts * best_of).await?;
    let tok = model.tokenizer();
    let mut usage = Usage::default();
    let mut choices = Vec::with_capacity(prompts * n);
    for (i, (group, echo)) in answers.chunks(best_of).zip(echoes).enumerate() {
        // Every sequence generated counts, returned or not.
        for (j, c) in group.iter().enumerate() {
            usage.add_choice(c, j == 0);
        }
        for (j, at) in best(group, n).into_iter().enumerate() {
            let c = &group[at];
            let logprobs = req.logprobs.map(|_| {
                // An echoed prompt's own log-probabilities come first.
                let mut lp = match req.echo {
                    true => prompt_logprobs(tok, &c.prompt_log_probs, k),
                    false => CompletionLogprobs::default(),
                };
                let mut offset = echo.chars().count();
                lp.extend(completion_logprobs(tok, c, &mut offset, k));
                lp
            });
            choices.push(CompletionChoice {
                index: i * n + j,
                text: echo.clone() + &c.text,
                logprobs,
                finish_reason: c.finish_reason.map(finish_reason),
            });
        }
    }
    let answer = Completion {
        id: &meta.id,
        object: "text_completion",
        created: meta.created,
        model: &meta.model,
        choices,
        usage: Some(Some(usage)),
    };
    Ok(with_request_id(Json(answer).into_response(), &rid))
}

/// What every chunk of one answer repeats.
struct Meta {
    id: String,
    model: String,
    created: u64,
}

impl Meta {
    fn completion(&self, choices: Vec<CompletionChoice>, usage: Option<Option<Usage>>) -> Event {
        data(&Completion {
            id: &self.id,
            object: "text_completion",
            created: self.created,
            model: &self.model,
            choices,
            usage,
        })
    }

    fn chat_chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Option<Usage>>) -> Event {
        data(&ChatCompletionChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices,
            usage,
        })
    }
}

/// A chunk worth sending: new text, new log-probabilities, or the end of a choice.
fn worth_sending(c: &Chunk, logprobs: bool) -> bool {
    !c.text.is_empty() || c.finish_reason.is_some() || (logprobs && !c.token_ids.is_empty())
}

/// A streamed completion: each prompt's `n` choices (`index` `prompt * n + j`), each
/// echoed first when asked (with the prompt's log-probabilities, once they are known, when
/// `logprobs` asks for `k` alternatives each too).
fn stream_completion(
    model: ModelHandle,
    meta: Meta,
    mut stream: TrackedStream,
    echoes: Vec<String>,
    n: usize,
    logprobs: Option<usize>,
    include_usage: bool,
) -> impl Stream<Item = Event> + Send + 'static {
    // With include_usage every chunk carries `usage: null` but the last, as OpenAI's do.
    let usage_field: Option<Option<Usage>> = include_usage.then_some(None);
    // Each choice's echo, its prompt's text.
    let echoes: Vec<String> = echoes
        .into_iter()
        .flat_map(|e| std::iter::repeat_n(e, n))
        .collect();
    async_stream::stream! {
        let mut offsets = vec![0usize; echoes.len()];
        // An echo with log-probabilities waits for the prompt's, on its choice's first chunk.
        let mut echo_pending = vec![false; echoes.len()];
        for (index, text) in echoes.iter().enumerate().filter(|(_, t)| !t.is_empty()) {
            if logprobs.is_some() {
                echo_pending[index] = true;
                continue;
            }
            offsets[index] = text.chars().count();
            let choice = CompletionChoice { index, text: text.clone(), logprobs: None, finish_reason: None };
            yield meta.completion(vec![choice], usage_field);
        }
        let mut usage = Usage::default();
        while let Some(mut c) = stream.next().await {
            if let Some(e) = &c.error {
                yield error_event(e);
                return;
            }
            let index = c.batch_index;
            if c.finish_reason.is_some() {
                usage.add_choice(&c, index % n == 0);
            }
            let mut lp = None;
            if let (Some(k), Some(offset)) = (logprobs, offsets.get_mut(index)) {
                let tok = model.tokenizer();
                let mut all = CompletionLogprobs::default();
                if echo_pending.get(index).copied().unwrap_or(false) {
                    echo_pending[index] = false;
                    let echo = &echoes[index];
                    all = prompt_logprobs(tok, &c.prompt_log_probs, k);
                    c.text.insert_str(0, echo);
                    *offset = echo.chars().count();
                }
                all.extend(completion_logprobs(tok, &c, offset, k));
                lp = Some(all);
            }
            if !worth_sending(&c, logprobs.is_some()) {
                continue;
            }
            let choice = CompletionChoice { index, text: c.text, logprobs: lp, finish_reason: c.finish_reason.map(finish_reason) };
            yield meta.completion(vec![choice], usage_field);
        }
        if include_usage {
            yield meta.completion(Vec::new(), Some(Some(usage)));
        }
        yield Event::default().data("[DONE]");
    }
}

async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let body = parse_json(&body)?;
    let model = body_model(&state, &body)?;
    let mut req = chat_request(&body, context(&model))?;
    let tok = model.tokenizer();
    let tools = super::tools::prepare_chat(
        &mut req,
        tok.chat_template(),
        tok.token_to_id("[TOOL_CALLS]"),
    )?;
    let streamed = req.params.stream;
    let request = Request {
        id: request_id(&headers)?,
        prompts: vec![Prompt::Chat {
            messages: req.messages,
            template_vars: req.template_vars,
        }],
        params: req.params,
    };
    let n = req.n;
    let stream = state.submit(&model, &req.model, request).await?;
    let rid = stream.id().to_owned();
    let meta = Meta {
        id: format!("chatcmpl-{rid}"),
        model: req.model,
        created: unix_now(),
    };
    if streamed {
        let events = stream_chat(
            model,
            meta,
            stream,
            n,
            req.logprobs,
            req.include_usage,
            tools,
        );
        return Ok(with_request_id(sse(events), &rid));
    }
    let answers = collect(stream, n).await?;
    let tok = model.tokenizer();
    let mut usage = Usage::default();
    let choices = answers
        .into_iter()
        .enumerate()
        .map(|(index, c)| {
            usage.add_choice(&c, index == 0);
            let logprobs = req.logprobs.then(|| chat_logprobs(tok, &c));
            let mut finish = c.finish_reason.map_or("stop", finish_reason);
            let (content, calls) = match tools {
                Some(format) => super::tools::parse(&c.text, format),
                None => (c.text, Vec::new()),
            };
            let tool_calls = (!calls.is_empty()).then(|| {
                if finish == "stop" {
                    finish = "tool_calls";
                }
                super::tools::calls_out(calls, &meta.id, index, false)
            });
            ChatChoice {
                index,
                logprobs,
                message: ChatMessageOut {
                    role: "assistant",
                    content: (tool_calls.is_none() || !content.is_empty()).then_some(content),
                    tool_calls,
                },
                finish_reason: finish,
            }
        })
        .collect();
    let answer = ChatCompletion {
        id: &meta.id,
        object: "chat.completion",
        created: meta.created,
        model: &meta.model,
        choices,
        usage,
    };
    Ok(with_request_id(Json(answer).into_response(), &rid))
}

/// A streamed chat completion: each of the `n` choices opens with its role, then its
/// deltas and its finish, each under its `index`.
fn stream_chat(
    model: ModelHandle,
    meta: Meta,
    mut stream: TrackedStream,
    n: usize,
    logprobs: bool,
    include_usage: bool,
    tools: Option<super::tools::ToolFormat>,
) -> impl Stream<Item = Event> + Send + 'static {
    let usage_field: Option<Option<Usage>> = include_usage.then_some(None);
    let choice = |index: usize,
                  delta: ChatDelta,
                  logprobs: Option<ChatLogprobs>,
                  finish_reason: Option<&'static str>| ChatChunkChoice {
        index,
        delta,
        logprobs,
        finish_reason,
    };
    async_stream::stream! {
        for index in 0..n {
            let first = ChatDelta { role: Some("assistant"), content: Some(String::new()), tool_calls: None };
            yield meta.chat_chunk(vec![choice(index, first, None, None)], usage_field);
        }
        let mut usage = Usage::default();
        let mut calls: Vec<super::tools::ToolStream> = tools.map_or_else(Vec::new, |f| (0..n).map(|_| super::tools::ToolStream::new(f)).collect());
        while let Some(c) = stream.next().await {
            if let Some(e) = &c.error {
                yield error_event(e);
                return;
            }
            let index = c.batch_index;
            let text = match calls.get_mut(index) {
                Some(s) => s.push(&c.text),
                None => c.text.clone(),
            };
            if !text.is_empty() || (logprobs && !c.token_ids.is_empty()) {
                let lp = logprobs.then(|| chat_logprobs(model.tokenizer(), &c));
                let delta = ChatDelta { role: None, content: Some(text), tool_calls: None };
                yield meta.chat_chunk(vec![choice(index, delta, lp, None)], usage_field);
            }
            if let Some(r) = c.finish_reason {
                usage.add_choice(&c, index == 0);
                let mut reason = finish_reason(r);
                if let Some(s) = calls.get_mut(index) {
                    let (rest, found) = s.finish();
                    if !rest.is_empty() {
                        let delta = ChatDelta { role: None, content: Some(rest), tool_calls: None };
                        yield meta.chat_chunk(vec![choice(index, delta, None, None)], usage_field);
                    }
                    if !found.is_empty() {
                        if reason == "stop" {
                            reason = "tool_calls";
                        }
                        let out = super::tools::calls_out(found, &meta.id, index, true);
                        let delta = ChatDelta { role: None, content: None, tool_calls: Some(out) };
                        yield meta.chat_chunk(vec![choice(index, delta, None, None)], usage_field);
                    }
                }
                yield meta.chat_chunk(vec![choice(index, ChatDelta::default(), None, Some(reason))], usage_field);
            }
        }
        if include_usage {
            yield meta.chat_chunk(Vec::new(), Some(Some(usage)));
        }
        yield Event::default().data("[DONE]");
    }
}
