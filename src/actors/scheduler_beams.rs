//! The Scheduler actor's beam searches: each search's pure state ([`BeamSearch`]) and its
//! beams' sequences, the sampled candidates it takes, the forks it makes in the scheduler
//! core, the sampler and the engine, and the answers it sends (`SeqOutput::Beams`: every
//! step when streaming, as TensorRT-LLM streams whole beams, and at its end).

use super::{SchedulerState, SeqMeta};
use crate::actors::messages::{SamplerMsg, SeqId, SeqInit, SeqOutput};
use crate::request::TokenLogprob;
use crate::sampling::{end_ids, BeamSearch, BeamSettings, Selection};
use crate::scheduler::{BeamFork, FinishReason};

/// One prompt's search: its state, and the sequence of each slot (consecutive ids from
/// the first).
pub(super) struct Search {
    state: BeamSearch,
    first: SeqId,
    stream: bool,
    /// The last prompt position's logits row (`return_context_logits`), from the first
    /// beam's first step, until an answer carries it.
    context_row: Option<Vec<f32>>,
}

impl Search {
    /// The search whose first sequence is `s`, for a model with these end tokens and
    /// context length.
    pub(super) fn new(s: &SeqInit, eos_ids: &[u32], max_seq_len: usize) -> Self {
        let p = &s.params;
        let width = p.beam_width.max(1);
        Search {
            state: BeamSearch::new(BeamSettings {
                width,
                returned: match p.beams_returned {
                    0 => width,
                    n => n.min(width),
                },
                length_penalty: p.length_penalty,
                early_stopping: p.early_stopping,
                max_new: p
                    .max_tokens
                    .min(max_seq_len.saturating_sub(s.prompt.len()))
                    .max(1),
                end_ids: end_ids(p, eos_ids),
            }),
            first: s.seq,
            stream: p.stream,
            context_row: None,
        }
    }

    fn seq(&self, slot: usize) -> SeqId {
        self.first + slot as u64
    }
}

impl SchedulerState {
    /// Takes beam `seq`'s candidates from its step (and the logits row it kept, the last
    /// prompt position's on the first beam's first step); when its search has them all,
    /// applies the search's choice: forks the beams (or ends the search) and answers.
    pub(super) fn beam_sampled(
        &mut self,
        seq: SeqId,
        offer: &[TokenLogprob],
        row: Option<Vec<f32>>,
        outs: &mut Vec<(u64, SeqOutput)>,
    ) {
        let Some(&SeqMeta {
            beam_of: Some(first),
            ..
        }) = self.seqs.get(&seq)
        else {
            return;
        };
        let slot = (seq - first) as usize;
        let Some(search) = self.searches.get_mut(&first) else {
            return;
        };
        if seq == first && search.context_row.is_none() {
            search.context_row = row.filter(|r| !r.is_empty());
        }
        let offer: Vec<(u32, f32)> = offer.iter().map(|t| (t.token, t.log_prob)).collect();
        let Some(selection) = search.state.offer(slot, &offer) else {
            return;
        };
        self.apply(first, selection, outs);
    }

    fn apply(&mut self, first: SeqId, sel: Selection, outs: &mut Vec<(u64, SeqOutput)>) {
        let Some(search) = self.searches.get_mut(&first) else {
            return;
        };
        // It goes with the first answer sent.
        let context_row = match sel.done || search.stream {
            true => search.context_row.take(),
            false => None,
        };
        let forks: Vec<BeamFork> = sel
            .moves
            .iter()
            .map(|m| BeamFork {
                slot: search.seq(m.slot),
                parent: search.seq(m.parent),
                token: m.token,
            })
            .collect();
        let dead: Vec<SeqId> = sel.dead.iter().map(|&d| search.seq(d)).collect();
        let width = search.state.settings().width;
        let stream = search.stream;
        let best = search.state.best();
        let rid = self.rid(first);
        let (queued, cached) = self
            .seqs
            .get_mut(&first)
            .map_or((None, 0), |m| (m.queued.take(), m.cached));
        if sel.done {
            let last = match best.first().is_some_and(|h| h.ended) {
                true => FinishReason::Stop,
                false => FinishReason::Length,
            };
            outs.push((
                rid,
                SeqOutput::Beams {
                    seq: first,
                    beams: best,
                    last: Some(last),
                    queued,
                    cached,
                    context_row,
                },
            ));
            self.end_search(first, width);
            return;
        }
        if let Err(e) = self.core.fork_beams(&forks) {
            // Not reachable while the core and the search agree; the request fails whole.
            outs.push((
                rid,
                SeqOutput::Failed {
                    seq: first,
                    error: format!("beam search: {e}"),
                },
            ));
            self.end_search(first, width);
            return;
        }
        for f in forks.iter().filter(|f| f.slot != f.parent) {
            // The engine rebuilds a forked beam's state from its tokens (its next chunk).
            self.overlap.reset(f.slot);
        }
        for &d in &dead {
            self.core.cancel(d);
            self.overlap.reset(d);
        }
        let _ = self.sampler.cast(SamplerMsg::Fork(forks));
        if stream {
            outs.push((
                rid,
                SeqOutput::Beams {
                    seq: first,
                    beams: best,
                    last: None,
                    queued,
                    cached,
                    context_row,
                },
            ));
        }
    }

    /// Drops every beam of the search that begins at `first` (its answer is out).
    fn end_search(&mut self, first: SeqId, width: usize) {
        let Some(request) = self.seqs.get(&first).map(|m| m.request.clone()) else {
            return;
        };
        for seq in (first..).take(width) {
            self.core.cancel(seq);
            self.forget(seq);
        }
        if let Some(ids) = self.requests.get_mut(&request) {
            ids.retain(|s| !(first..first + width as u64).contains(s));
            if ids.is_empty() {
                self.requests.remove(&request);
            }
        }
    }
}
