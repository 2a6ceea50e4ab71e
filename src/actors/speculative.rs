//! Speculative orchestrator actor: stands between the Scheduler and the target Engine
//! and speaks the Engine's messages, so the scheduler drives it like any engine. For each
//! `EngineMsg::Step` it proposes draft tokens for the sequences the scheduler gave room
//! to (`StepSeq::max_draft`), appends them to their chunks and forwards the step to the
//! target engine, which returns logits for the last known token and every draft token
//! to the Sampler, which verifies them (`SeqSampler::verify`). Sequences without room
//! (prefill, no speculation, near their length limit) pass through untouched, in the
//! same batch. How many tokens each sequence drafts follows how many it has been
//! keeping (`SeqTrack::draft_len`).
//!
//! Drafts come from a draft model, run by a second Engine actor through
//! `EngineMsg::Forward` (one catch-up pass over the tokens it has not seen, then one pass
//! per further draft token, all sequences batched), or from prompt lookup. The draft
//! model's K/V uses the target's block tables: the scheduler's blocks cover the draft
//! positions for both models, and rolling rejected drafts back is only forgetting them
//! (`SeqTrack`).
//!
//! Supervised by ModelSupervisor, which restarts it with the target engine.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::messages::{Draft, EngineMsg, SeqId, StepSeq};
use crate::request::GenerationParams;
use crate::sampling::DraftSampler;
use crate::speculative::{prompt_lookup, SeqTrack};

pub(crate) struct Speculative;

/// How the orchestrator gets its drafts.
pub enum Drafter {
    /// A draft model's engine (answers `EngineMsg::Forward`).
    Engine(ActorRef<EngineMsg>),
    PromptLookup {
        min_ngram: usize,
        max_ngram: usize,
    },
}

pub struct SpeculativeArgs {
    pub target: ActorRef<EngineMsg>,
    pub drafter: Drafter,
    pub vocab_size: usize,
}

struct Tracked {
    track: SeqTrack,
    sampler: DraftSampler,
    /// False after a chunk that did not follow from the track, until the next reset.
    in_sync: bool,
}

pub struct SpeculativeState {
    target: ActorRef<EngineMsg>,
    drafter: Drafter,
    vocab_size: usize,
    seqs: HashMap<SeqId, Tracked>,
}

impl Actor for Speculative {
    type Msg = EngineMsg;
    type State = SpeculativeState;
    type Arguments = SpeculativeArgs;

    async fn pre_start(
        &self,
        _: ActorRef<EngineMsg>,
        args: SpeculativeArgs,
    ) -> Result<SpeculativeState, ActorProcessingErr> {
        Ok(SpeculativeState {
            target: args.target,
            drafter: args.drafter,
            vocab_size: args.vocab_size,
            seqs: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<EngineMsg>,
        msg: EngineMsg,
        state: &mut SpeculativeState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            EngineMsg::Step {
                iteration,
                mut seqs,
                dropped,
                swaps,
                follows,
                reply_to,
                hold,
            } => {
                for id in &dropped {
                    state.seqs.remove(id);
                }
                state.track(&seqs);
                let drafts = state.propose(&seqs, &dropped).await?;
                for (i, draft) in drafts {
                    let s = &mut seqs[i];
                    s.tokens.extend_from_slice(&draft.tokens);
                    if let Some(t) = state.seqs.get_mut(&s.seq) {
                        t.track.drafts = draft.tokens.clone();
                    }
                    s.draft = Some(draft);
                }
                state.target.cast(EngineMsg::Step {
                    iteration,
                    seqs,
                    dropped,
                    swaps,
                    follows,
                    reply_to,
                    hold,
                })?;
            }
            EngineMsg::Finish => state.target.cast(EngineMsg::Finish)?,
            EngineMsg::InjectFault(f) => state.target.cast(EngineMsg::InjectFault(f))?,
            EngineMsg::Forward { .. } => {
                return Err("the speculative orchestrator takes steps, not forward passes".into())
            }
        }
        Ok(())
    }
}

impl SpeculativeState {
    /// Brings every scheduled sequence's track up to date with its chunk (requests that
    /// turned speculation off are not tracked).
    fn track(&mut self, seqs: &[StepSeq]) {
        for s in seqs
            .iter()
            .filter(|s| s.params.num_draft_tokens != Some(0) && !s.params.wants_logit_rows())
        {
            let t = self.seqs.entry(s.seq).or_insert_with(|| Tracked {
                track: SeqTrack::default(),
                sampler: DraftSampler::new(&s.params),
                in_sync: true,
            });
            if s.reset {
                t.sampler = DraftSampler::new(&s.params);
                t.in_sync = true;
            }
            t.in_sync &= t.track.advance(s);
        }
    }

    /// Drafts for the sequences with room for them: `(index in seqs, draft)`.
    async fn propose(
        &mut self,
        seqs: &[StepSeq],
        dropped: &[SeqId],
    ) -> Result<Vec<(usize, Draft)>, ActorProcessingErr> {
        let wanted: Vec<usize> = (0..seqs.len())
            .filter(|&i| {
                let s = &seqs[i];
                s.sample && s.max_draft > 0 && self.seqs.get(&s.seq).is_some_and(|t| t.in_sync)
            })
            .collect();
        match &self.drafter {
            Drafter::PromptLookup {
                min_ngram,
                max_ngram,
            } => Ok(wanted
                .into_iter()
                .filter_map(|i| {
                    let s = &seqs[i];
                    let t = &self.seqs[&s.seq].track;
                    let k = t.draft_len(s.max_draft);
                    let tokens = prompt_lookup::propose(&t.tokens, k, *min_ngram, *max_ngram);
                    (!tokens.is_empty()).then_some((
                        i,
                        Draft {
                            tokens,
                            probs: None,
                        },
                    ))
                })
                .collect()),
            Drafter::Engine(engine) => {
                let engine = engine.clone();
                self.run_draft_model(&engine, seqs, &wanted, dropped).await
            }
        }
    }

    /// Runs the draft model: a catch-up pass that ends with the first draft token's
    /// logits, then one pass per further draft token, each batched over the sequences
    /// that still want one.
    async fn run_draft_model(
        &mut self,
        engine: &ActorRef<EngineMsg>,
        seqs: &[StepSeq],
        wanted: &[usize],
        dropped: &[SeqId],
    ) -> Result<Vec<(usize, Draft)>, ActorProcessingErr> {
        let v = self.vocab_size;
        // Per wanted sequence: its drafts and, when the rule needs them, their q rows.
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); wanted.len()];
        let mut probs: Vec<Option<Vec<f32>>> = wanted
            .iter()
            .map(|&i| wants_probs(&seqs[i].params).then(Vec::new))
            .collect();
        let lens: Vec<usize> = wanted
            .iter()
            .map(|&i| self.seqs[&seqs[i].seq].track.draft_len(seqs[i].max_draft))
            .collect();
        let rounds = lens.iter().copied().max().unwrap_or(0);
        let mut dropped = dropped.to_vec();
        for round in 0..rounds {
            let mut batch = Vec::new();
            let mut who = Vec::new();
            for (w, &i) in wanted.iter().enumerate() {
                let s = &seqs[i];
                if round >= lens[w] {
                    continue;
                }
                let t = &self.seqs[&s.seq].track;
                let (start_pos, chunk) = if round == 0 {
                    (t.draft_kv, t.draft_catch_up().to_vec())
                } else {
                    (t.tokens.len() + round - 1, vec![tokens[w][round - 1]])
                };
                batch.push(StepSeq {
                    seq: s.seq,
                    prompt_len: s.prompt_len,
                    start_pos,
                    tokens: chunk,
                    reset: round == 0,
                    new_table: round == 0,
                    new_blocks: if round == 0 {
                        t.table.clone()
                    } else {
                        Vec::new()
                    },
                    sample: true,
                    params: s.params.clone(),
                    max_draft: 0,
                    draft: None,
                    cached: Vec::new(),
                    score: Vec::new(),
                    long_rope: s.long_rope,
                });
                who.push(w);
            }
            let rows = ractor::call!(engine, |reply| EngineMsg::Forward {
                seqs: batch,
                dropped: std::mem::take(&mut dropped),
                reply,
            })?;
            for (w, mut row) in who.into_iter().zip(rows) {
                let s = &seqs[wanted[w]];
                let tracked = self
                    .seqs
                    .get_mut(&s.seq)
                    .ok_or("draft for an unknown sequence")?;
                tracked.track.draft_kv = tracked.track.tokens.len() + round;
                if row.len() != v {
                    return Err(
                        format!("the draft engine returned {} logits, not {v}", row.len()).into(),
                    );
                }
                let (token, q) = tracked.sampler.propose(&mut row, probs[w].is_some());
                tokens[w].push(token);
                if let (Some(all), Some(q)) = (probs[w].as_mut(), q) {
                    all.extend_from_slice(&q);
                }
            }
        }
        Ok(wanted
            .iter()
            .zip(tokens)
            .zip(probs)
            .filter(|((_, t), _)| !t.is_empty())
            .map(|((&i, tokens), probs)| {
                // A greedy draft gives no distributions: then tokens are matched.
                let probs = probs.filter(|p| p.len() == tokens.len() * v);
                (i, Draft { tokens, probs })
            })
            .collect())
    }
}

/// Whether the acceptance rule needs the draft's distributions for this request.
fn wants_probs(params: &Arc<GenerationParams>) -> bool {
    params.use_draft_logits && params.temperature > 0.0 && params.top_k != 1
}
