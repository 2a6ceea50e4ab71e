//! The OpenAI-compatible API on the inference port, as vLLM serves it beside its own:
//! `GET /v1/models`, `GET /v1/models/{model}`, `POST /v1/completions` and
//! `POST /v1/chat/completions`, answered whole or streamed as SSE (`data: {chunk}`, then
//! `data: [DONE]`). Any served name is a valid `model`; an unknown one is a 404.
//! Chat messages go to the pipeline as [`Prompt::Chat`], so the model's own template
//! renders them. Errors use the server-wide `{"error": "..."}` body (the official
//! client raises on the status alone); a failure in mid-stream is an
//! `{"error": {...}}` event, which the client raises as `APIError`, and ends the stream.
//!
//! Log-probabilities are those of the sampled tokens only: no alternatives are computed,
//! so completions' `top_logprobs` is null and chat's is empty (`top_logprobs` > 0 is
//! refused). Output constraints come from src/http/guided.rs; tools and their calls from
//! src/http/tools.rs.

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
use serde_json::json;

use super::openai_types::*;
use super::tracked::TrackedStream;
use super::{parse_json, ApiError, ApiResult, AppState};
use crate::request::{Chunk, Prompt, Request};
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
pub(super) fn context(state: &AppState) -> usize {
    state.model().config().max_position_embeddings
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

/// The answer of each prompt, merged from its chunks; an engine failure is an error.
async fn collect(stream: TrackedStream, prompts: usize) -> ApiResult<Vec<Chunk>> {
    let mut merged = vec![Chunk::default(); prompts];
    let chunks: Vec<Chunk> = stream.collect().await;
    for c in chunks {
        if let Some(e) = c.error {
            return Err(ApiError::EngineFailed(e));
        }
        let slot = &mut merged[c.batch_index.min(prompts - 1)];
        slot.text.push_str(&c.text);
        slot.token_ids.extend(c.token_ids);
        slot.log_probs.extend(c.log_probs);
        slot.finish_reason = c.finish_reason.or(slot.finish_reason);
        if c.finish_reason.is_some() {
            slot.prompt_tokens = c.prompt_tokens;
            slot.output_tokens = c.output_tokens;
            slot.cached_tokens = c.cached_tokens;
        }
    }
    Ok(merged)
}

/// Completions' `logprobs` for a chunk's tokens; `offset` is the choice's text so far,
/// in characters, and advances past them.
fn completion_logprobs(tok: &Tokenizer, c: &Chunk, offset: &mut usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for (&id, &lp) in c.token_ids.iter().zip(&c.log_probs) {
        let text = tok.token_text(id).unwrap_or_default();
        out.text_offset.push(*offset);
        *offset += text.chars().count();
        out.tokens.push(text);
        out.token_logprobs.push(lp);
    }
    out
}

fn chat_logprobs(tok: &Tokenizer, c: &Chunk) -> ChatLogprobs {
    let content = c
        .token_ids
        .iter()
        .zip(&c.log_probs)
        .map(|(&id, &logprob)| ChatTokenLogprob {
            token: tok.token_text(id).unwrap_or_default(),
            logprob,
            bytes: tok.token_bytes(id).unwrap_or_default(),
            top_logprobs: Vec::new(),
        })
        .collect();
    ChatLogprobs { content }
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
    let req = completion_request(&body, context(&state))?;
    check_model(&state, &req.model)?;
    let tok = state.model().tokenizer();
    let echoes: Vec<String> = match req.echo {
        true => req.prompts.iter().map(|p| prompt_text(tok, p)).collect(),
        false => vec![String::new(); req.prompts.len()],
    };
    let prompts = req.prompts.len();
    let streamed = req.params.stream;
    let request = Request {
        id: request_id(&headers)?,
        prompts: req.prompts,
        params: req.params,
    };
    let stream = state.submit(&req.model, request).await?;
    let rid = stream.id().to_owned();
    let id = format!("cmpl-{rid}");
    let meta = Meta {
        id,
        model: req.model,
        created: unix_now(),
    };
    if streamed {
        let events = stream_completion(
            state,
            meta,
            stream,
            echoes,
            req.logprobs.is_some(),
            req.include_usage,
        );
        return Ok(with_request_id(sse(events), &rid));
    }
    let answers = collect(stream, prompts).await?;
    let tok = state.model().tokenizer();
    let mut usage = Usage::default();
    let choices = answers
        .into_iter()
        .zip(echoes)
        .enumerate()
        .map(|(index, (c, echo))| {
            usage.add(&c);
            let logprobs = req.logprobs.map(|_| completion_logprobs(tok, &c, &mut 0));
            let finish_reason = c.finish_reason.map(finish_reason);
            CompletionChoice {
                index,
                text: echo + &c.text,
                logprobs,
                finish_reason,
            }
        })
        .collect();
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

fn stream_completion(
    state: AppState,
    meta: Meta,
    mut stream: TrackedStream,
    echoes: Vec<String>,
    logprobs: bool,
    include_usage: bool,
) -> impl Stream<Item = Event> + Send + 'static {
    // With include_usage every chunk carries `usage: null` but the last, as OpenAI's do.
    let usage_field: Option<Option<Usage>> = include_usage.then_some(None);
    async_stream::stream! {
        let mut offsets = vec![0usize; echoes.len()];
        for (index, text) in echoes.into_iter().enumerate().filter(|(_, t)| !t.is_empty()) {
            offsets[index] = text.chars().count();
            let choice = CompletionChoice { index, text, logprobs: None, finish_reason: None };
            yield meta.completion(vec![choice], usage_field);
        }
        let mut usage = Usage::default();
        while let Some(c) = stream.next().await {
            if let Some(e) = &c.error {
                yield error_event(e);
                return;
            }
            if c.finish_reason.is_some() {
                usage.add(&c);
            }
            if !worth_sending(&c, logprobs) {
                continue;
            }
            let index = c.batch_index;
            let offset = offsets.get_mut(index);
            let lp = match (logprobs, offset) {
                (true, Some(offset)) => Some(completion_logprobs(state.model().tokenizer(), &c, offset)),
                _ => None,
            };
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
    let mut req = chat_request(&body, context(&state))?;
    check_model(&state, &req.model)?;
    let tok = state.model().tokenizer();
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
    let stream = state.submit(&req.model, request).await?;
    let rid = stream.id().to_owned();
    let meta = Meta {
        id: format!("chatcmpl-{rid}"),
        model: req.model,
        created: unix_now(),
    };
    if streamed {
        let events = stream_chat(
            state,
            meta,
            stream,
            req.logprobs,
            req.include_usage,
            tools,
            rid.clone(),
        );
        return Ok(with_request_id(sse(events), &rid));
    }
    let c = collect(stream, 1).await?.remove(0);
    let mut usage = Usage::default();
    usage.add(&c);
    let logprobs = req
        .logprobs
        .then(|| chat_logprobs(state.model().tokenizer(), &c));
    let mut finish = c.finish_reason.map_or("stop", finish_reason);
    let (content, calls) = match tools {
        Some(format) => super::tools::parse(&c.text, format),
        None => (c.text, Vec::new()),
    };
    let tool_calls = (!calls.is_empty()).then(|| {
        if finish == "stop" {
            finish = "tool_calls";
        }
        super::tools::calls_out(calls, &rid, false)
    });
    let choice = ChatChoice {
        index: 0,
        message: ChatMessageOut {
            role: "assistant",
            content: (tool_calls.is_none() || !content.is_empty()).then_some(content),
            tool_calls,
        },
        logprobs,
        finish_reason: finish,
    };
    let answer = ChatCompletion {
        id: &meta.id,
        object: "chat.completion",
        created: meta.created,
        model: &meta.model,
        choices: vec![choice],
        usage,
    };
    Ok(with_request_id(Json(answer).into_response(), &rid))
}

fn stream_chat(
    state: AppState,
    meta: Meta,
    mut stream: TrackedStream,
    logprobs: bool,
    include_usage: bool,
    tools: Option<super::tools::ToolFormat>,
    rid: String,
) -> impl Stream<Item = Event> + Send + 'static {
    let usage_field: Option<Option<Usage>> = include_usage.then_some(None);
    let choice = |delta: ChatDelta,
                  logprobs: Option<ChatLogprobs>,
                  finish_reason: Option<&'static str>| ChatChunkChoice {
        index: 0,
        delta,
        logprobs,
        finish_reason,
    };
    async_stream::stream! {
        let first = ChatDelta { role: Some("assistant"), content: Some(String::new()), tool_calls: None };
        yield meta.chat_chunk(vec![choice(first, None, None)], usage_field);
        let mut usage = Usage::default();
        let mut calls = tools.map(super::tools::ToolStream::new);
        while let Some(c) = stream.next().await {
            if let Some(e) = &c.error {
                yield error_event(e);
                return;
            }
            let text = match calls.as_mut() {
                Some(s) => s.push(&c.text),
                None => c.text.clone(),
            };
            if !text.is_empty() || (logprobs && !c.token_ids.is_empty()) {
                let lp = logprobs.then(|| chat_logprobs(state.model().tokenizer(), &c));
                let delta = ChatDelta { role: None, content: Some(text), tool_calls: None };
                yield meta.chat_chunk(vec![choice(delta, lp, None)], usage_field);
            }
            if let Some(r) = c.finish_reason {
                usage.add(&c);
                let mut reason = finish_reason(r);
                if let Some(s) = calls.as_mut() {
                    let (rest, found) = s.finish();
                    if !rest.is_empty() {
                        let delta = ChatDelta { role: None, content: Some(rest), tool_calls: None };
                        yield meta.chat_chunk(vec![choice(delta, None, None)], usage_field);
                    }
                    if !found.is_empty() {
                        if reason == "stop" {
                            reason = "tool_calls";
                        }
                        let out = super::tools::calls_out(found, &rid, true);
                        let delta = ChatDelta { role: None, content: None, tool_calls: Some(out) };
                        yield meta.chat_chunk(vec![choice(delta, None, None)], usage_field);
                    }
                }
                yield meta.chat_chunk(vec![choice(ChatDelta::default(), None, Some(reason))], usage_field);
            }
        }
        if include_usage {
            yield meta.chat_chunk(Vec::new(), Some(Some(usage)));
        }
        yield Event::default().data("[DONE]");
    }
}
