//! Triton's generate extension: `POST /v2/models/{model}/generate` (one JSON answer) and
//! `.../generate_stream` (SSE, `data: {json}` per response, no `[DONE]`). Text models
//! (`ensemble`, `tensorrt_llm_bls`) take `text_input`, the core model (`tensorrt_llm`)
//! takes `input_ids`. A list of prompts is a batch answered with `batch_index`.
//! `{"id": X, "stop": true}` cancels request X, as TRT-LLM's stop request does.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{json, Map, Value};

use super::fields::{build_request, stop_target, Fields};
use super::{parse_json, versioned_post, ApiError, ApiResult, AppState, ModelKind};
use crate::request::Chunk;

pub fn routes() -> Router<AppState> {
    let r = Router::new();
    let r = versioned_post(r, "/v2/models/{model}/generate", generate);
    versioned_post(r, "/v2/models/{model}/generate_stream", generate_stream)
}

#[derive(serde::Deserialize)]
pub struct ModelPath {
    model: String,
    #[allow(dead_code)]
    version: Option<String>,
}

/// A stop request, when the body is one: cancels and answers with an empty response.
fn stop_request(state: &AppState, model: &str, fields: &Fields<'_>) -> ApiResult<Option<Value>> {
    let Some(id) = stop_target(fields)? else {
        return Ok(None);
    };
    // Every instance of the model: a reload's draining one may run the target.
    state.models().cancel(model, &id);
    Ok(Some(
        json!({"model_name": model, "model_version": "1", "id": id}),
    ))
}

async fn generate(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
    body: Bytes,
) -> ApiResult<Response> {
    let (handle, kind) = state.route(&p.model)?;
    let body = parse_json(&body)?;
    let fields = Fields::new(&body)?;
    if let Some(answer) = stop_request(&state, &p.model, &fields)? {
        return Ok(Json(answer).into_response());
    }
    let mut request = build_request(
        &fields,
        kind,
        handle.tokenizer(),
        handle.config().max_position_embeddings,
    )?;
    request.params.stream = false;
    let id = request.id.clone();
    let n = request.params.n;
    let answers = request.prompts.len() * n;
    let want_logprobs = request.params.return_log_probs;
    let stream = state.submit(&handle, &p.model, request).await?;
    let chunks: Vec<Chunk> = stream.collect().await;
    if let Some(err) = chunks.iter().find_map(|c| c.error.clone()) {
        return Err(ApiError::EngineFailed(err));
    }
    let per_prompt = crate::request::answers(chunks, answers);
    let objects: Vec<Map<String, Value>> = per_prompt
        .iter()
        .map(|c| response(&p.model, id.as_deref(), kind, c, (want_logprobs, n)))
        .collect();
    Ok(Json(merge_batch(objects)).into_response())
}

async fn generate_stream(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
    body: Bytes,
) -> ApiResult<Response> {
    let (handle, kind) = state.route(&p.model)?;
    let body = parse_json(&body)?;
    let fields = Fields::new(&body)?;
    if let Some(answer) = stop_request(&state, &p.model, &fields)? {
        let once = futures::stream::once(async move {
            Ok::<_, Infallible>(Event::default().data(answer.to_string()))
        });
        return Ok(Sse::new(once).into_response());
    }
    let request = build_request(
        &fields,
        kind,
        handle.tokenizer(),
        handle.config().max_position_embeddings,
    )?;
    let id = request.id.clone();
    let want_logprobs = request.params.return_log_probs;
    let n = request.params.n;
    let model = p.model.clone();
    let stream = state.submit(&handle, &p.model, request).await?;
    let events = stream.map(move |c| {
        let body = match &c.error {
            Some(e) => json!({ "error": ApiError::EngineFailed(e.clone()).to_string() }),
            None => Value::Object(response(
                &model,
                id.as_deref(),
                kind,
                &c,
                (want_logprobs, n),
            )),
        };
        Ok::<_, Infallible>(Event::default().data(body.to_string()))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// One response object: TRT-LLM's output tensors as keys (single values as scalars).
fn response(
    model: &str,
    id: Option<&str>,
    kind: ModelKind,
    c: &Chunk,
    (logprobs, n): (bool, usize),
) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("model_name".into(), json!(model));
    m.insert("model_version".into(), json!("1"));
    if let Some(id) = id {
        m.insert("id".into(), json!(id));
    }
    match c.beams.is_empty() {
        true => m.extend(sequence_fields(kind, c, logprobs)),
        false => {
            // Beam search: each key a list over the beams, best first ([beam, ...]).
            let beams: Vec<Map<String, Value>> = c
                .beams
                .iter()
                .map(|b| sequence_fields(kind, b, logprobs))
                .collect();
            for key in beams[0].keys() {
                let list = beams.iter().map(|b| b[key].clone()).collect();
                m.insert(key.clone(), Value::Array(list));
            }
        }
    }
    // With num_return_sequences n, answer `i` is prompt i / n's sequence i % n.
    let n = n.max(1);
    m.insert("batch_index".into(), json!(c.batch_index / n));
    m.insert("sequence_index".into(), json!(c.batch_index % n));
    // Asked-for logits, flattened row-major as Triton's generate extension sends tensors:
    // context_logits [prompt positions, vocab], generation_logits [1 beam, tokens, vocab].
    for (key, rows) in [
        ("context_logits", &c.context_logits),
        ("generation_logits", &c.generation_logits),
    ] {
        if !rows.is_empty() {
            m.insert(key.into(), json!(rows.concat()));
        }
    }
    if let Some(r) = c.finish_reason {
        m.insert("finish_reason".into(), json!(r.as_str()));
    }
    m
}

/// One sequence's (or beam's) output keys: its text or ids, and its log-probabilities
/// (zeros when not asked for, as TRT-LLM sends).
fn sequence_fields(kind: ModelKind, c: &Chunk, logprobs: bool) -> Map<String, Value> {
    let mut m = Map::new();
    match kind {
        ModelKind::Text => m.insert("text_output".into(), json!(c.text)),
        ModelKind::Ids => {
            m.insert("sequence_length".into(), json!(c.token_ids.len()));
            m.insert("output_ids".into(), json!(c.token_ids))
        }
    };
    let output_log_probs = if logprobs {
        c.log_probs.clone()
    } else {
        vec![0.0; c.token_ids.len()]
    };
    m.insert("output_log_probs".into(), json!(output_log_probs));
    m.insert(
        "cum_log_probs".into(),
        json!(c.cum_log_prob.filter(|_| logprobs).unwrap_or(0.0)),
    );
    m
}

/// One prompt: its object. Several: one object whose per-prompt keys are lists, as a
/// batched Triton response carries `[batch, ...]` tensors.
fn merge_batch(mut objects: Vec<Map<String, Value>>) -> Value {
    if objects.len() == 1 {
        return Value::Object(objects.remove(0));
    }
    let mut out = Map::new();
    for key in ["model_name", "model_version", "id"] {
        if let Some(v) = objects[0].get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    // Every key any answer has (one answer may lack a key another has, such as the
    // logits of a sequence whose only token was its end).
    let mut keys: Vec<String> = Vec::new();
    for o in &objects {
        keys.extend(
            o.keys()
                .filter(|k| !keys.contains(k))
                .cloned()
                .collect::<Vec<_>>(),
        );
    }
    for k in keys {
        if !out.contains_key(&k) {
            out.insert(
                k.clone(),
                Value::Array(
                    objects
                        .iter()
                        .map(|o| o.get(&k).cloned().unwrap_or(Value::Null))
                        .collect(),
                ),
            );
        }
    }
    Value::Object(out)
}
