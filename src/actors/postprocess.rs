//! Postprocess actor (one of a pool; a request always goes to the same worker): owns each
//! request's response stream and fans an iteration's outputs (`PostprocessMsg::Emit`, from
//! the Scheduler) out to them as `Chunk`s — incremental detokenization, stop strings,
//! prompt echo, batch_index, and an embedding request's vector on its last chunk.
//!
//! A stream whose receiver is gone (the client left) becomes
//! `SchedulerMsg::Cancel { Disconnected }`; a completed stop string becomes
//! `SchedulerMsg::EndSeq` after the final chunk is sent. A beam search answers on its
//! first sequence's stream: whole beams, each chunk replacing the last one's. A request's
//! stream closes when its last sequence ends. Supervised by ModelSupervisor.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc::UnboundedSender;

use super::messages::{CancelReason, PostprocessMsg, SchedulerMsg, SeqId, SeqOutput};
use crate::output::SeqOutputState;
use crate::request::{Chunk, FinishReason, RequestId};
use crate::scheduler::FinishReason as SeqFinish;
use crate::tokenizer::Tokenizer;

pub(crate) struct Postprocess;

pub struct PostprocessArgs {
    pub tokenizer: Arc<Tokenizer>,
}

struct OpenRequest {
    request: RequestId,
    stream: UnboundedSender<Chunk>,
    scheduler: ActorRef<SchedulerMsg>,
    live: usize,
}

pub struct PostprocessState {
    tokenizer: Arc<Tokenizer>,
    requests: HashMap<u64, OpenRequest>,
    seqs: HashMap<SeqId, (u64, SeqOutputState)>,
}

impl Actor for Postprocess {
    type Msg = PostprocessMsg;
    type State = PostprocessState;
    type Arguments = PostprocessArgs;

    async fn pre_start(
        &self,
        _: ActorRef<PostprocessMsg>,
        args: PostprocessArgs,
    ) -> Result<PostprocessState, ActorProcessingErr> {
        Ok(PostprocessState {
            tokenizer: args.tokenizer,
            requests: HashMap::new(),
            seqs: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<PostprocessMsg>,
        msg: PostprocessMsg,
        state: &mut PostprocessState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            PostprocessMsg::Open {
                rid,
                request,
                seqs,
                prompt_texts,
                stream,
                scheduler,
            } => {
                let end_ids = state.tokenizer.eos_token_ids().to_vec();
                for (s, text) in seqs.iter().zip(prompt_texts) {
                    let mut ends = end_ids.clone();
                    ends.extend(s.params.end_id);
                    let first = s.prompt.first().copied();
                    let out = SeqOutputState::new(
                        s.batch_index,
                        s.prompt.len(),
                        text,
                        &s.params,
                        ends,
                        first,
                    );
                    state.seqs.insert(s.seq, (rid, out));
                }
                let live = seqs.len();
                state.requests.insert(
                    rid,
                    OpenRequest {
                        request,
                        stream,
                        scheduler,
                        live,
                    },
                );
            }
            PostprocessMsg::Discard { rid } => {
                state.requests.remove(&rid);
                state.seqs.retain(|_, (r, _)| *r != rid);
            }
            PostprocessMsg::Emit(outputs) => {
                // A sequence that ends in this iteration sends its last tokens with its
                // final chunk, so the end comes with the last token, not as an empty
                // chunk after it (TRT-LLM's final response carries its last tokens).
                let ending: Vec<SeqId> = outputs
                    .iter()
                    .filter_map(|o| match o {
                        SeqOutput::Finished { seq, .. } => Some(*seq),
                        _ => None,
                    })
                    .collect();
                for o in outputs {
                    emit(state, o, &ending);
                }
            }
            PostprocessMsg::Flush(reply) => {
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

/// Applies one output to its sequence and sends what it produced.
/// Delivers one output; the token chunks of a sequence in `ending` are held for its
/// final chunk.
fn emit(state: &mut PostprocessState, output: SeqOutput, ending: &[SeqId]) {
    let seq = match &output {
        SeqOutput::Token { seq, .. }
        | SeqOutput::PromptLogprobs { seq, .. }
        | SeqOutput::Finished { seq, .. }
        | SeqOutput::Cancelled { seq, .. }
        | SeqOutput::Failed { seq, .. }
        | SeqOutput::Beams { seq, .. } => *seq,
    };
    let Some((rid, out)) = state.seqs.get_mut(&seq) else {
        return;
    };
    let rid = *rid;
    let (chunk, ends, stop_string) = match output {
        SeqOutput::PromptLogprobs {
            from, rows, logits, ..
        } => {
            out.note_prompt(from, rows, logits);
            return;
        }
        SeqOutput::Token {
            token,
            log_prob,
            top,
            queued,
            cached,
            drafted,
            accepted,
            logits,
            ..
        } => {
            out.note_draft(drafted, accepted);
            out.note_cached(cached);
            let pushed = out.push(&state.tokenizer, token, (log_prob, top), logits, queued);
            if pushed.stop_string {
                // The token's chunk (text before the stop string) and the final one, as one.
                let mut last = out.finish(FinishReason::Stop);
                if let Some(c) = out
                    .take_held()
                    .into_iter()
                    .chain(pushed.chunk)
                    .reduce(|a, b| b.after(a))
                {
                    last = last.after(c);
                }
                (Some(last), true, true)
            } else if ending.contains(&seq) {
                if let Some(c) = pushed.chunk {
                    out.hold(c);
                }
                return;
            } else {
                (pushed.chunk, false, false)
            }
        }
        SeqOutput::Finished {
            reason, embedding, ..
        } => {
            let reason = match reason {
                SeqFinish::Stop => FinishReason::Stop,
                SeqFinish::Length => FinishReason::Length,
            };
            let mut last = out.finish(reason);
            if let Some(c) = out.take_held() {
                last = last.after(c);
            }
            last.embedding = embedding;
            (Some(last), true, false)
        }
        SeqOutput::Beams {
            beams,
            last,
            queued,
            cached,
            context_row,
            ..
        } => {
            out.note_cached(cached);
            let last = last.map(|r| match r {
                SeqFinish::Stop => FinishReason::Stop,
                SeqFinish::Length => FinishReason::Length,
            });
            let ends = last.is_some();
            (
                Some(out.beams(&state.tokenizer, beams, last, queued, context_row)),
                ends,
                false,
            )
        }
        SeqOutput::Cancelled { .. } => (Some(out.finish(FinishReason::Cancelled)), true, false),
        SeqOutput::Failed { error, .. } => (Some(out.fail(error)), true, false),
    };
    let Some(req) = state.requests.get_mut(&rid) else {
        return;
    };
    let delivered = chunk.is_none_or(|c| req.stream.send(c).is_ok());
    if !delivered {
        let _ = req.scheduler.cast(SchedulerMsg::Cancel {
            request: req.request.clone(),
            rid: Some(rid),
            reason: CancelReason::Disconnected,
        });
        close_request(state, rid);
        return;
    }
    if stop_string {
        let _ = req.scheduler.cast(SchedulerMsg::EndSeq(seq));
    }
    if ends {
        state.seqs.remove(&seq);
        req.live -= 1;
        if req.live == 0 {
            close_request(state, rid);
        }
    }
}

/// Forgets a request; dropping its sender ends the client's stream.
fn close_request(state: &mut PostprocessState, rid: u64) {
    state.requests.remove(&rid);
    state.seqs.retain(|_, (r, _)| *r != rid);
}
