//! Reading the SSE events of each endpoint: what one event says (Triton
//! `generate_stream` objects with `text_output`; OpenAI completion or chat chunks, their
//! `usage`, `[DONE]`, error events), and the token timings of one request: time to first
//! token, the gaps between token events, and the output length.
//!
//! Output length: the server's `usage` when it sends one (ours, vLLM); else the events'
//! own counts when every event has one (Triton: the length of `output_log_probs`); else
//! the larger of the non-empty chunks (a floor: each carries at least one token) and the
//! answer re-tokenized with the run's tokenizer. Neither alone is right: llama-cpp-python
//! holds back the tokens of a split UTF-8 character and sends them in one chunk, and a
//! model's tokens need not be the canonical tokenization of their text, so re-tokenizing
//! alone under-counts about one answer in three by a token or two.

use std::time::Instant;

use serde_json::Value;

use super::client::Endpoint;
use super::dataset::count_tokens;
use super::stats::RequestRecord;
use crate::tokenizer::Tokenizer;

/// What one SSE event said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventInfo {
    pub text: String,
    /// Tokens the event carried, when it says (Triton: the length of `output_log_probs`).
    pub tokens: Option<usize>,
    /// OpenAI `usage`: (prompt tokens, completion tokens).
    pub usage: Option<(usize, usize)>,
    /// `[DONE]`.
    pub done: bool,
}

impl EventInfo {
    /// Tokens this event adds to the answer.
    fn token_count(&self) -> usize {
        self.tokens.unwrap_or(usize::from(!self.text.is_empty()))
    }
}

/// Token events of one request as they arrive.
pub struct TokenTimer<'a> {
    start: Instant,
    last: Option<Instant>,
    rec: &'a mut RequestRecord,
    usage: Option<(usize, usize)>,
    /// The answer's text so far.
    text: String,
    /// Every token event said how many tokens it carried.
    counted: bool,
}

impl<'a> TokenTimer<'a> {
    /// Times a request sent at `start` into `rec`.
    pub fn new(start: Instant, rec: &'a mut RequestRecord) -> Self {
        TokenTimer {
            start,
            last: None,
            rec,
            usage: None,
            text: String::new(),
            counted: true,
        }
    }

    /// Takes one event that arrived at `now`; true at `[DONE]`.
    pub fn event(&mut self, e: EventInfo, now: Instant) -> bool {
        self.usage = e.usage.or(self.usage);
        let k = e.token_count();
        if k > 0 {
            match self.last {
                None => self.rec.ttft_s = Some(now.duration_since(self.start).as_secs_f64()),
                Some(last) => {
                    let gap = now.duration_since(last).as_secs_f64() / k as f64;
                    self.rec.itl_s.extend(std::iter::repeat_n(gap, k));
                }
            }
            // The first event's extra tokens came with it: no gaps for them.
            self.last = Some(now);
            self.rec.output_tokens += k;
            self.counted &= e.tokens.is_some();
            self.text.push_str(&e.text);
        }
        e.done
    }

    /// The stream ended: settles the token counts (see the module's note) and returns the
    /// answer's text.
    pub fn close(self, tokenizer: Option<&Tokenizer>) -> String {
        if let Some((prompt, completion)) = self.usage {
            self.rec.input_tokens = prompt;
            self.rec.output_tokens = completion;
        } else if let (false, Some(tok)) = (self.counted, tokenizer) {
            if let Ok(n) = count_tokens(tok, &self.text) {
                self.rec.output_tokens = self.rec.output_tokens.max(n);
            }
        }
        self.text
    }
}

/// Reads one SSE event's data; an error event or an unreadable one is the request's error.
pub fn parse_event(endpoint: Endpoint, data: &str) -> Result<EventInfo, String> {
    if endpoint != Endpoint::GenerateStream && data.trim() == "[DONE]" {
        return Ok(EventInfo {
            done: true,
            ..Default::default()
        });
    }
    let v: Value = serde_json::from_str(data)
        .map_err(|e| format!("unreadable event ({e}): {}", snippet(data)))?;
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        let msg = err
            .get("message")
            .and_then(Value::as_str)
            .or(err.as_str())
            .map_or_else(|| err.to_string(), str::to_owned);
        return Err(format!("error event: {msg}"));
    }
    let text_of = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
        _ => String::new(),
    };
    let mut info = EventInfo::default();
    match endpoint {
        Endpoint::GenerateStream => {
            info.text = text_of(&v["text_output"]);
            if let Some(lp) = v.get("output_log_probs").and_then(Value::as_array) {
                info.tokens = Some(lp.len());
            }
        }
        Endpoint::OpenaiCompletions => info.text = text_of(&v["choices"][0]["text"]),
        Endpoint::OpenaiChat => {
            let delta = &v["choices"][0]["delta"];
            info.text = text_of(&delta["content"]) + &text_of(&delta["reasoning_content"]);
        }
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).map(|x| x as usize);
        if let (Some(p), Some(c)) = (n("prompt_tokens"), n("completion_tokens")) {
            info.usage = Some((p, c));
        }
    }
    Ok(info)
}

fn snippet(s: &str) -> String {
    s.chars().take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_events_of_each_endpoint() {
        let ev = |e, d: &str| parse_event(e, d).unwrap();
        let t = ev(
            Endpoint::GenerateStream,
            r#"{"model_name":"ensemble","text_output":" hi","output_log_probs":[0.0,0.0]}"#,
        );
        assert_eq!((t.text.as_str(), t.tokens), (" hi", Some(2)));
        assert_eq!(
            ev(Endpoint::GenerateStream, r#"{"text_output":["a","b"]}"#).text,
            "ab"
        );
        let c = ev(
            Endpoint::OpenaiCompletions,
            r#"{"choices":[{"text":"x","index":0}],"usage":null}"#,
        );
        assert_eq!((c.text.as_str(), c.token_count(), c.usage), ("x", 1, None));
        let u = ev(
            Endpoint::OpenaiCompletions,
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}"#,
        );
        assert_eq!((u.token_count(), u.usage), (0, Some((5, 9))));
        let role = ev(
            Endpoint::OpenaiChat,
            r#"{"choices":[{"delta":{"role":"assistant"}}]}"#,
        );
        assert_eq!(role.token_count(), 0);
        assert_eq!(
            ev(
                Endpoint::OpenaiChat,
                r#"{"choices":[{"delta":{"content":"y"}}]}"#
            )
            .text,
            "y"
        );
        assert!(ev(Endpoint::OpenaiChat, "[DONE]").done);
        let err = |e, d| parse_event(e, d).unwrap_err();
        assert_eq!(
            err(Endpoint::GenerateStream, r#"{"error":"engine restarted"}"#),
            "error event: engine restarted"
        );
        assert_eq!(
            err(
                Endpoint::OpenaiCompletions,
                r#"{"error":{"message":"boom","type":"x"}}"#
            ),
            "error event: boom"
        );
        assert!(err(Endpoint::GenerateStream, "[DONE]").starts_with("unreadable event"));
    }

    #[test]
    fn timer_takes_ttft_itl_and_usage_from_events() {
        let start = Instant::now();
        let mut rec = RequestRecord::default();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut t = TokenTimer::new(start, &mut rec);
        let text = |s: &str| EventInfo {
            text: s.into(),
            ..Default::default()
        };
        assert!(!t.event(
            EventInfo {
                text: String::new(),
                ..Default::default()
            },
            at(5)
        ));
        t.event(text("a"), at(50));
        t.event(text("b"), at(60));
        t.event(
            EventInfo {
                text: "cd".into(),
                tokens: Some(2),
                ..Default::default()
            },
            at(80),
        );
        t.event(
            EventInfo {
                usage: Some((7, 4)),
                ..Default::default()
            },
            at(81),
        );
        assert!(t.event(
            EventInfo {
                done: true,
                ..Default::default()
            },
            at(82)
        ));
        t.close(None);
        assert!((rec.ttft_s.unwrap() - 0.05).abs() < 1e-9);
        let ms: Vec<f64> = rec.itl_s.iter().map(|s| (s * 1e3).round()).collect();
        assert_eq!(ms, vec![10.0, 10.0, 10.0]);
        assert_eq!((rec.input_tokens, rec.output_tokens), (7, 4));
    }

    #[test]
    fn without_usage_merged_chunks_are_counted_by_re_tokenizing() {
        let path = crate::fetch::default_model_path().expect("default model");
        let tok = super::super::dataset::load_tokenizer(&path).unwrap();
        let now = Instant::now();
        let chunk = |s: &str, tokens: Option<usize>| EventInfo {
            text: s.into(),
            tokens,
            ..Default::default()
        };
        // A server that held back the tokens of a split character sends them in one chunk.
        let mut rec = RequestRecord::default();
        let mut t = TokenTimer::new(now, &mut rec);
        for c in ["Hello", " world", " 日本語", "!"] {
            t.event(chunk(c, None), now);
        }
        t.close(Some(&tok));
        assert_eq!(
            rec.output_tokens,
            count_tokens(&tok, "Hello world 日本語!").unwrap()
        );
        assert!(rec.output_tokens > 4);
        // Events that count their own tokens are trusted as they are.
        let mut rec = RequestRecord::default();
        let mut t = TokenTimer::new(now, &mut rec);
        t.event(chunk("Hello world", Some(1)), now);
        t.close(Some(&tok));
        assert_eq!(rec.output_tokens, 1);
    }
}
