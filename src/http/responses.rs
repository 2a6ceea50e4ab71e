//! `POST /v1/responses`, a minimal stateless OpenAI Responses API: the input (text, or
//! message items) and `instructions` become a chat conversation rendered by the model's
//! template; the answer is a response object whose output is one assistant message of
//! one `output_text` part, whole or streamed as OpenAI's typed SSE events
//! (`event: <type>` and `data: {json}`): `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`, one
//! `response.output_text.delta` per piece of text, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, then
//! `response.completed` (or `response.incomplete` when `max_output_tokens` cut it;
//! `response.failed` when the engine failed). Requests are checked in
//! `responses_types`; nothing is stored.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::json;

use super::json_body::parse;
use super::openai::{context, named_model, request_id, sse, unix_now, with_request_id};
use super::responses_types::*;
use super::tracked::TrackedStream;
use super::{ApiError, ApiResult, AppState};
use crate::request::{FinishReason, Prompt, Request};

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/responses", post(responses))
}

async fn responses(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let req: ResponsesRequest = parse(&body)?;
    req.check()?;
    let model = named_model(&state, Some(&req.model))?;
    let messages = req.messages()?;
    let params = req.params(context(&model))?;
    let streamed = params.stream;
    let request = Request {
        id: request_id(&headers)?,
        prompts: vec![Prompt::chat(messages)],
        params: params.clone(),
    };
    let stream = state.submit(&model, &req.model, request).await?;
    let rid = stream.id().to_owned();
    let shell = ResponseObject {
        id: format!("resp_{rid}"),
        object: "response",
        created_at: unix_now(),
        status: "in_progress",
        error: None,
        incomplete_details: None,
        instructions: req.instructions,
        max_output_tokens: req.max_output_tokens,
        model: req.model,
        output: Vec::new(),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        previous_response_id: None,
        store: false,
        temperature: params.temperature,
        top_p: params.top_p,
        tool_choice: match req.tool_choice.as_ref().and_then(|c| c.as_str()) {
            Some("none") => "none",
            _ => "auto",
        },
        tools: Vec::new(),
        text: TextOut {
            format: FormatOut { kind: "text" },
        },
        truncation: "disabled",
        metadata: req.metadata.unwrap_or_default(),
        usage: None,
    };
    let item = format!("msg_{rid}");
    if streamed {
        return Ok(with_request_id(sse(events(shell, item, stream)), &rid));
    }
    let mut text = String::new();
    let mut last = None;
    let chunks: Vec<_> = stream.collect().await;
    for c in chunks {
        if let Some(e) = c.error {
            return Err(ApiError::EngineFailed(e));
        }
        text.push_str(&c.text);
        if c.finish_reason.is_some() {
            last = Some(c);
        }
    }
    let reason = last.as_ref().and_then(|c| c.finish_reason);
    let answer = finished(
        shell,
        &item,
        text,
        reason,
        last.as_ref().map(ResponseUsage::of),
    );
    Ok(with_request_id(Json(answer).into_response(), &rid))
}

/// The response object once its generation ended (`reason`) with `text`.
fn finished(
    mut shell: ResponseObject,
    item: &str,
    text: String,
    reason: Option<FinishReason>,
    usage: Option<ResponseUsage>,
) -> ResponseObject {
    let (status, incomplete) = status_of(reason);
    shell.status = status;
    shell.incomplete_details = incomplete;
    shell.output = vec![message(item, status, vec![OutputText::new(text)])];
    shell.usage = usage;
    shell
}

fn message(id: &str, status: &'static str, content: Vec<OutputText>) -> OutputMessage {
    OutputMessage {
        kind: "message",
        id: id.to_owned(),
        status,
        role: "assistant",
        content,
    }
}

/// Numbers the events of one stream and writes each as `event: <type>` with its JSON.
struct Events {
    next: u64,
}

impl Events {
    fn event<T: Serialize>(&mut self, kind: &str, fields: T) -> Event {
        let mut data =
            serde_json::to_value(fields).unwrap_or_else(|e| json!({"error": e.to_string()}));
        if let Some(o) = data.as_object_mut() {
            o.insert("type".into(), json!(kind));
            o.insert("sequence_number".into(), json!(self.next));
        }
        self.next += 1;
        Event::default().event(kind).data(data.to_string())
    }
}

/// The streamed answer: the events of the module's note, around one delta per chunk of
/// text.
fn events(
    shell: ResponseObject,
    item: String,
    mut stream: TrackedStream,
) -> impl Stream<Item = Event> + Send + 'static {
    async_stream::stream! {
        let mut ev = Events { next: 0 };
        yield ev.event("response.created", json!({"response": &shell}));
        yield ev.event("response.in_progress", json!({"response": &shell}));
        let at = json!({"item_id": &item, "output_index": 0, "content_index": 0});
        let open = message(&item, "in_progress", Vec::new());
        yield ev.event("response.output_item.added", json!({"output_index": 0, "item": open}));
        let mut part = json!({"part": OutputText::new(String::new())});
        merge(&mut part, &at);
        yield ev.event("response.content_part.added", part);
        let mut text = String::new();
        let mut last = None;
        while let Some(c) = stream.next().await {
            if let Some(e) = &c.error {
                let mut failed = shell.clone();
                failed.status = "failed";
                failed.error = Some(ResponseError {
                    code: "server_error",
                    message: ApiError::EngineFailed(e.clone()).to_string(),
                });
                yield ev.event("response.failed", json!({"response": failed}));
                return;
            }
            if !c.text.is_empty() {
                text.push_str(&c.text);
                let mut delta = json!({"delta": &c.text, "logprobs": []});
                merge(&mut delta, &at);
                yield ev.event("response.output_text.delta", delta);
            }
            if c.finish_reason.is_some() {
                last = Some(c);
            }
        }
        let reason = last.as_ref().and_then(|c| c.finish_reason);
        let usage = last.as_ref().map(ResponseUsage::of);
        let done = finished(shell, &item, text.clone(), reason, usage);
        let mut text_done = json!({"text": &text, "logprobs": []});
        merge(&mut text_done, &at);
        yield ev.event("response.output_text.done", text_done);
        let mut part_done = json!({"part": OutputText::new(text)});
        merge(&mut part_done, &at);
        yield ev.event("response.content_part.done", part_done);
        let item_done = json!({"output_index": 0, "item": &done.output[0]});
        yield ev.event("response.output_item.done", item_done);
        let kind = match done.status {
            "incomplete" => "response.incomplete",
            _ => "response.completed",
        };
        yield ev.event(kind, json!({"response": done}));
    }
}

/// Adds `extra`'s fields to the object `v`.
fn merge(v: &mut serde_json::Value, extra: &serde_json::Value) {
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
}
