//! The HTTP side of a run, per endpoint: the URL and body each server is sent, the
//! reachability probe, and one request sent and timed into a [`RequestRecord`] (its events
//! read by [`super::events`]). Output length is forced where the server lets it be:
//! `ignore_eos` (ours, vLLM) and `min_tokens` = `max_tokens` (TensorRT-LLM's ensemble
//! input, vLLM, llama-cpp-python's server).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::dataset::BenchRequest;
use super::events::{parse_event, TokenTimer};
use super::sse::SseDecoder;
use super::stats::RequestRecord;
use super::BenchError;
use crate::tokenizer::Tokenizer;

/// The route a run drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Endpoint {
    /// Triton's `POST /v2/models/{model}/generate_stream`.
    #[value(name = "generate_stream", alias = "generate-stream")]
    #[serde(rename = "generate_stream")]
    GenerateStream,
    /// `POST /v1/completions`, streamed.
    OpenaiCompletions,
    /// `POST /v1/chat/completions`, streamed; the prompt is one user message.
    OpenaiChat,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.to_possible_value().expect("no variant is skipped");
        f.write_str(v.get_name())
    }
}

/// Where and how requests are sent.
#[derive(Debug, Clone)]
pub struct Target {
    /// Scheme, host and port, without a trailing slash.
    pub base: String,
    pub endpoint: Endpoint,
    /// The Triton model, or the OpenAI `model` field.
    pub model: String,
    pub temperature: f32,
    pub ignore_eos: bool,
    /// Merged over every body last, so it can add or override any field.
    pub extra: Map<String, Value>,
    /// Counts output tokens of servers that neither send `usage` nor count per event.
    pub tokenizer: Option<Arc<Tokenizer>>,
}

impl Target {
    pub fn url(&self) -> String {
        match self.endpoint {
            Endpoint::GenerateStream => {
                format!("{}/v2/models/{}/generate_stream", self.base, self.model)
            }
            Endpoint::OpenaiCompletions => format!("{}/v1/completions", self.base),
            Endpoint::OpenaiChat => format!("{}/v1/chat/completions", self.base),
        }
    }

    pub fn body(&self, req: &BenchRequest) -> Value {
        let n = req.output_tokens;
        let mut body = match self.endpoint {
            Endpoint::GenerateStream => {
                json!({ "text_input": req.prompt, "max_tokens": n, "stream": true })
            }
            Endpoint::OpenaiCompletions => {
                json!({ "model": self.model, "prompt": req.prompt, "max_tokens": n })
            }
            Endpoint::OpenaiChat if req.messages.is_empty() => json!({
                "model": self.model,
                "messages": [{ "role": "user", "content": req.prompt }],
                "max_tokens": n,
            }),
            Endpoint::OpenaiChat => json!({
                "model": self.model,
                "messages": req
                    .messages
                    .iter()
                    .map(|(role, content)| json!({ "role": role, "content": content }))
                    .collect::<Vec<_>>(),
                "max_tokens": n,
            }),
        };
        let m = body.as_object_mut().expect("bodies are objects");
        m.insert("temperature".into(), json!(self.temperature));
        if self.endpoint != Endpoint::GenerateStream {
            m.insert("stream".into(), json!(true));
            m.insert("stream_options".into(), json!({ "include_usage": true }));
        }
        if self.ignore_eos {
            m.insert("ignore_eos".into(), json!(true));
            m.insert("min_tokens".into(), json!(n));
        }
        m.extend(self.extra.clone());
        body
    }

    /// Checks that the server answers at all, and finds the OpenAI model name when none
    /// was given (the first of `GET /v1/models`). A refused connection is an error; an
    /// HTTP error is only a warning, since not every server has these routes.
    pub async fn probe(
        &mut self,
        http: &reqwest::Client,
        model_given: bool,
    ) -> Result<(), BenchError> {
        let path = match self.endpoint {
            Endpoint::GenerateStream => "/v2/health/ready",
            _ => "/v1/models",
        };
        let url = format!("{}{path}", self.base);
        let resp = http
            .get(&url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| BenchError::Unreachable {
                url: self.base.clone(),
                reason: error_chain(&e),
            })?;
        if !resp.status().is_success() {
            eprintln!("warning: GET {url} answered {}", resp.status());
            return Ok(());
        }
        if !model_given && self.endpoint != Endpoint::GenerateStream {
            let listed = resp.json::<Value>().await.ok();
            if let Some(id) = listed.as_ref().and_then(|v| v["data"][0]["id"].as_str()) {
                self.model = id.to_owned();
            }
        }
        Ok(())
    }

    /// Sends one request and times its stream. `t0` is the run's start.
    pub async fn send(
        &self,
        http: &reqwest::Client,
        index: usize,
        req: &BenchRequest,
        t0: Instant,
    ) -> RequestRecord {
        self.send_for_text(http, index, req, t0).await.0
    }

    /// [`send`](Self::send), also returning the answer's text (as far as it came).
    pub async fn send_for_text(
        &self,
        http: &reqwest::Client,
        index: usize,
        req: &BenchRequest,
        t0: Instant,
    ) -> (RequestRecord, String) {
        let start = Instant::now();
        let mut rec = RequestRecord {
            index,
            start_s: start.duration_since(t0).as_secs_f64(),
            input_tokens: req.input_tokens,
            expected_output_tokens: req.output_tokens,
            ..Default::default()
        };
        let outcome = self.stream(http, req, start, &mut rec).await;
        rec.latency_s = start.elapsed().as_secs_f64();
        let text = match outcome {
            Err(e) => {
                rec.error = Some(e);
                String::new()
            }
            Ok(_) if rec.output_tokens == 0 => {
                rec.error = Some("the answer carried no tokens".into());
                String::new()
            }
            Ok(text) => {
                rec.ok = true;
                text
            }
        };
        (rec, text)
    }

    async fn stream(
        &self,
        http: &reqwest::Client,
        req: &BenchRequest,
        start: Instant,
        rec: &mut RequestRecord,
    ) -> Result<String, String> {
        let resp = http
            .post(self.url())
            .json(&self.body(req))
            .send()
            .await
            .map_err(|e| error_chain(&e))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(format!(
                "HTTP {}: {}",
                status.as_u16(),
                body.trim().chars().take(200).collect::<String>()
            ));
        }
        let mut timing = TokenTimer::new(start, rec);
        let mut decoder = SseDecoder::new();
        let mut body = resp.bytes_stream();
        'read: while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| error_chain(&e))?;
            let now = Instant::now();
            for data in decoder.push(&chunk) {
                if timing.event(parse_event(self.endpoint, &data)?, now) {
                    break 'read;
                }
            }
        }
        if let Some(data) = decoder.finish() {
            timing.event(parse_event(self.endpoint, &data)?, Instant::now());
        }
        Ok(timing.close(self.tokenizer.as_deref()))
    }
}

/// An error with its causes ("error sending request: connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !msg.contains(&s) {
            msg.push_str(": ");
            msg.push_str(&s);
        }
        cause = c.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(endpoint: Endpoint) -> Target {
        Target {
            base: "http://127.0.0.1:1".into(),
            endpoint,
            model: "ensemble".into(),
            temperature: 0.0,
            ignore_eos: true,
            extra: Map::new(),
            tokenizer: None,
        }
    }

    fn req() -> BenchRequest {
        BenchRequest {
            prompt: "Hello there".into(),
            input_tokens: 2,
            output_tokens: 16,
            messages: Vec::new(),
        }
    }

    #[test]
    fn bodies_force_the_output_length_on_every_endpoint() {
        let t = target(Endpoint::GenerateStream);
        assert_eq!(
            t.url(),
            "http://127.0.0.1:1/v2/models/ensemble/generate_stream"
        );
        assert_eq!(
            t.body(&req()),
            json!({"text_input": "Hello there", "max_tokens": 16, "stream": true, "temperature": 0.0,
                   "ignore_eos": true, "min_tokens": 16})
        );
        let c = target(Endpoint::OpenaiCompletions).body(&req());
        assert_eq!(
            (
                c["prompt"].as_str(),
                c["max_tokens"].as_u64(),
                c["min_tokens"].as_u64()
            ),
            (Some("Hello there"), Some(16), Some(16))
        );
        assert_eq!(c["stream_options"], json!({"include_usage": true}));
        let mut chat = target(Endpoint::OpenaiChat);
        chat.ignore_eos = false;
        chat.extra.insert("top_k".into(), json!(1));
        chat.extra.insert("temperature".into(), json!(0.5));
        let b = chat.body(&req());
        assert_eq!(
            b["messages"],
            json!([{"role": "user", "content": "Hello there"}])
        );
        assert!(b.get("ignore_eos").is_none() && b.get("min_tokens").is_none());
        assert_eq!(
            (b["top_k"].as_i64(), b["temperature"].as_f64()),
            (Some(1), Some(0.5)),
            "extra fields win"
        );
        assert_eq!(chat.url(), "http://127.0.0.1:1/v1/chat/completions");
    }

    #[tokio::test]
    async fn a_refused_connection_is_an_error_not_a_panic() {
        let http = reqwest::Client::new();
        let mut t = target(Endpoint::OpenaiCompletions);
        assert!(matches!(
            t.probe(&http, false).await,
            Err(BenchError::Unreachable { .. })
        ));
        let rec = t.send(&http, 0, &req(), Instant::now()).await;
        assert!(!rec.ok && rec.error.is_some(), "{rec:?}");
    }
}
