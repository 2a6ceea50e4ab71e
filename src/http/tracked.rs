//! A request's stream as the HTTP layer serves it: counts tokens and times them as they
//! pass, and when the stream ends — finished, failed, or dropped because the client left —
//! records the request's metrics and writes its one log line.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;

use super::AppState;
use crate::handle::ResponseStream;
use crate::metrics::{Outcome, RequestTiming};
use crate::request::{Chunk, FinishReason};

pub struct TrackedStream {
    inner: ResponseStream,
    state: AppState,
    model: Arc<str>,
    /// The composing model its requests also count for (Triton's ensemble accounting).
    composing: Option<Arc<str>>,
    timing: RequestTiming,
    prompts: usize,
    /// Prompt tokens of all its prompts, known from submission (a request the client leaves
    /// before its answer, streamed or not, still logs them).
    tokens_in: usize,
    open: usize,
    reason: Option<FinishReason>,
    /// The longest time one of its prompts waited to be scheduled; `None` until one was.
    queue: Option<Duration>,
    /// Prompt tokens found in the prefix cache, summed over its prompts (their last chunks).
    cached: usize,
    done: bool,
    /// Beam search: output tokens counted so far per prompt (its chunks carry whole beams).
    beam_tokens: Vec<usize>,
}

impl TrackedStream {
    pub fn new(
        inner: ResponseStream,
        state: AppState,
        (model, composing): (&str, Option<String>),
        prompts: usize,
        timing: RequestTiming,
    ) -> Self {
        let tokens_in = inner.prompt_tokens().iter().sum();
        let answers = inner.answers();
        TrackedStream {
            inner,
            state,
            model: model.into(),
            composing: composing.map(Into::into),
            timing,
            prompts,
            tokens_in,
            open: answers,
            reason: None,
            queue: None,
            cached: 0,
            done: false,
            beam_tokens: Vec::new(),
        }
    }

    pub fn id(&self) -> &str {
        self.inner.id()
    }

    fn observe(&mut self, c: &Chunk) {
        let new_tokens = match c.beams.is_empty() {
            true => c.token_ids.len(),
            false => {
                // Whole beams: the tokens past the longest this prompt had.
                if self.beam_tokens.len() <= c.batch_index {
                    self.beam_tokens.resize(c.batch_index + 1, 0);
                }
                let seen = &mut self.beam_tokens[c.batch_index];
                let new = c.output_tokens.saturating_sub(*seen);
                *seen = (*seen).max(c.output_tokens);
                new
            }
        };
        self.timing.tokens(new_tokens, c.first_token_at);
        if let Some(q) = c.queue_time {
            self.queue = self.queue.max(Some(q));
        }
        if let Some(r) = c.finish_reason {
            self.open = self.open.saturating_sub(1);
            self.cached += c.cached_tokens;
            self.state.metrics().speculative(
                &self.model,
                c.draft_steps,
                c.draft_tokens,
                c.accepted_draft_tokens,
            );
            // The request's outcome is its worst prompt's.
            self.reason = match (self.reason, r) {
                (Some(FinishReason::Error), _) | (_, FinishReason::Error) => {
                    Some(FinishReason::Error)
                }
                (Some(FinishReason::Cancelled), _) | (_, FinishReason::Cancelled) => {
                    Some(FinishReason::Cancelled)
                }
                _ => Some(r),
            };
        }
    }

    fn finish(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let reason = if self.open > 0 {
            Some(FinishReason::Cancelled)
        } else {
            self.reason
        };
        self.state.metrics().request_done(
            (&self.model, self.composing.as_deref()),
            Outcome::of(reason),
            self.prompts,
            &self.timing,
            self.queue.unwrap_or_default(),
        );
        let t = &self.timing;
        tracing::info!(
            id = %self.inner.id(),
            model = %self.model,
            prompts = self.prompts,
            tokens_in = self.tokens_in,
            cached_tokens = self.cached,
            tokens_out = t.output_tokens,
            ttft_ms = t.ttft().map(millis),
            queue_ms = self.queue.map(millis),
            latency_ms = millis(t.arrived.elapsed()),
            outcome = %reason.map_or("none", FinishReason::as_str),
            "request"
        );
    }
}

/// A duration for the request log: milliseconds, rounded to the microsecond.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl Stream for TrackedStream {
    type Item = Chunk;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Chunk>> {
        match Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(Some(c)) => {
                self.observe(&c);
                Poll::Ready(Some(c))
            }
            Poll::Ready(None) => {
                self.finish();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for TrackedStream {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_durations_read_as_milliseconds_to_the_microsecond() {
        assert_eq!(
            millis(Duration::from_nanos(15_981_174)).to_string(),
            "15.981"
        );
        assert_eq!(millis(Duration::from_nanos(5_600)).to_string(), "0.006");
        assert_eq!(millis(Duration::from_secs(2)).to_string(), "2000");
    }
}
