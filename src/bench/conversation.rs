//! The multi-turn chat replay (`inflight bench multi-turn`): conversations whose every
//! turn sends the whole history so far (system prompt, earlier user messages and the
//! model's own answers) and a new user message, one turn at a time per conversation,
//! conversations side by side. The workload of KV cache reuse in chat: each turn's
//! prompt begins with the previous turn's prompt and answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use rand::rngs::StdRng;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::client::Target;
use super::dataset::{count_tokens, BenchRequest, PromptSynth};
use super::stats::{Dist, RequestRecord};
use super::BenchError;

/// The shape of a replay: every conversation has `turns` turns, a system prompt of
/// `system_len` tokens, user messages of `user_len` tokens and answers of `output_len`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MultiTurn {
    pub turns: usize,
    pub system_len: usize,
    pub user_len: usize,
    pub output_len: usize,
}

/// One conversation: its system prompt and each turn's user message (the answers come
/// from the server as the replay goes).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Conversation {
    pub system: String,
    pub users: Vec<String>,
    pub output_tokens: usize,
}

/// `n` conversations of random text, each with a system prompt of its own.
pub(crate) fn conversations(
    shape: MultiTurn,
    synth: &PromptSynth<'_>,
    n: usize,
    rng: &mut StdRng,
) -> Result<Vec<Conversation>, BenchError> {
    if shape.turns == 0 || shape.system_len == 0 || shape.user_len == 0 {
        return Err(BenchError::Setup(
            "multi-turn: --turns, --system-len and --user-len must be at least 1".into(),
        ));
    }
    (0..n)
        .map(|_| {
            let (system, _) = synth.prompt(shape.system_len, rng)?;
            let users = (0..shape.turns)
                .map(|_| synth.prompt(shape.user_len, rng).map(|(text, _)| text))
                .collect::<Result<_, _>>()?;
            Ok(Conversation {
                system,
                users,
                output_tokens: shape.output_len,
            })
        })
        .collect()
}

impl Conversation {
    /// Turn `t`'s request after the answers to the turns before it: the history as chat
    /// messages, and as plain text for the endpoints that take a prompt.
    pub fn turn(&self, t: usize, answers: &[String]) -> BenchRequest {
        let mut messages = vec![("system".to_owned(), self.system.clone())];
        let mut prompt = self.system.clone();
        for (i, user) in self.users[..=t].iter().enumerate() {
            messages.push(("user".into(), user.clone()));
            prompt.push_str("\n\nUser: ");
            prompt.push_str(user);
            prompt.push_str("\n\nAssistant:");
            if let Some(answer) = answers.get(i).filter(|_| i < t) {
                messages.push(("assistant".into(), answer.clone()));
                prompt.push_str(answer);
            }
        }
        BenchRequest {
            prompt,
            input_tokens: 0,
            output_tokens: self.output_tokens,
            messages,
        }
    }
}

/// Replays `conversations`: conversation `c` starts after the gaps up to `gaps[c]`, with
/// at most `concurrency` conversations under way; its turns go one after the other, each
/// with the answers before it. A failed turn ends its conversation (the turns after it
/// are recorded as failed, unsent). Records are in conversation, then turn, order
/// (`index = c * turns + t`); the duration runs from the first send to the last answer.
pub(crate) async fn replay(
    target: &Arc<Target>,
    http: &reqwest::Client,
    conversations: &[Conversation],
    gaps: &[Duration],
    concurrency: Option<usize>,
    bar: &ProgressBar,
) -> (Vec<RequestRecord>, Duration) {
    let slots = concurrency.map(|n| Arc::new(Semaphore::new(n.max(1))));
    let t0 = Instant::now();
    let mut due = tokio::time::Instant::now();
    let mut tasks = JoinSet::new();
    for (c, (conv, gap)) in conversations.iter().zip(gaps).enumerate() {
        due += *gap;
        tokio::time::sleep_until(due).await;
        let permit = match &slots {
            Some(s) => Some(s.clone().acquire_owned().await.expect("never closed")),
            None => None,
        };
        let (target, http, conv, bar) = (target.clone(), http.clone(), conv.clone(), bar.clone());
        tasks.spawn(async move {
            let records = converse(&target, &http, &conv, c, t0, &bar).await;
            drop(permit);
            records
        });
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(r) => records.extend(r),
            Err(e) => records.push(RequestRecord {
                // After every turn's index: a lost task's turns are not known.
                index: usize::MAX,
                error: Some(format!("conversation task failed: {e}")),
                ..Default::default()
            }),
        }
    }
    records.sort_by_key(|r| r.index);
    let span = super::runner::span(&records);
    (records, span)
}

/// One conversation's turns, in order.
async fn converse(
    target: &Target,
    http: &reqwest::Client,
    conv: &Conversation,
    c: usize,
    t0: Instant,
    bar: &ProgressBar,
) -> Vec<RequestRecord> {
    let turns = conv.users.len();
    let mut answers = Vec::with_capacity(turns);
    let mut records = Vec::with_capacity(turns);
    for t in 0..turns {
        let index = c * turns + t;
        if records.last().is_some_and(|r: &RequestRecord| !r.ok) {
            records.push(RequestRecord {
                index,
                expected_output_tokens: conv.output_tokens,
                error: Some("an earlier turn of its conversation failed".into()),
                ..Default::default()
            });
            bar.inc(1);
            continue;
        }
        let mut req = conv.turn(t, &answers);
        if let Some(tok) = &target.tokenizer {
            req.input_tokens = count_tokens(tok, &req.prompt).unwrap_or(0);
        }
        let (rec, answer) = target.send_for_text(http, index, &req, t0).await;
        answers.push(answer);
        records.push(rec);
        bar.inc(1);
    }
    records
}

/// Time to first token per turn (index `t` for turn `t + 1`), over the completed turns.
pub(crate) fn ttft_by_turn(records: &[RequestRecord], turns: usize) -> Vec<Option<Dist>> {
    (0..turns)
        .map(|t| {
            Dist::of_secs(
                records
                    .iter()
                    .filter(|r| r.ok && r.index % turns == t)
                    .filter_map(|r| r.ttft_s),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv() -> Conversation {
        Conversation {
            system: "You are terse.".into(),
            users: vec!["Hi".into(), "Why".into(), "Bye".into()],
            output_tokens: 4,
        }
    }

    #[test]
    fn a_turn_carries_every_earlier_turn_and_its_answer() {
        let c = conv();
        let first = c.turn(0, &[]);
        assert_eq!(first.prompt, "You are terse.\n\nUser: Hi\n\nAssistant:");
        assert_eq!(first.messages.len(), 2);
        let answers = vec![" Hello".to_owned(), " Because".to_owned()];
        let third = c.turn(2, &answers);
        assert_eq!(
            third.prompt,
            "You are terse.\n\nUser: Hi\n\nAssistant: Hello\n\nUser: Why\n\nAssistant: Because\
             \n\nUser: Bye\n\nAssistant:"
        );
        let roles: Vec<&str> = third.messages.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(
            roles,
            ["system", "user", "assistant", "user", "assistant", "user"]
        );
        assert_eq!(third.messages[4].1, " Because");
        // Each turn's prompt begins with the one before it and its answer.
        let second = c.turn(1, &answers[..1]);
        assert!(third.prompt.starts_with(&second.prompt));
        assert!(second
            .prompt
            .starts_with(&format!("{}{}", first.prompt, answers[0])));
    }

    #[test]
    fn ttft_is_split_by_turn() {
        let rec = |index, ttft| RequestRecord {
            index,
            ok: true,
            ttft_s: Some(ttft),
            ..Default::default()
        };
        let records = [rec(0, 0.5), rec(1, 0.1), rec(2, 0.7), rec(3, 0.3)];
        let by_turn = ttft_by_turn(&records, 2);
        assert_eq!(by_turn[0].unwrap().p50, 600.0);
        assert_eq!(by_turn[1].unwrap().p50, 200.0);
    }
}
