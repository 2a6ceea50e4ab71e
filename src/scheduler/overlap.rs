//! The overlap and delta state machine between the scheduler and its engine, pure: which
//! iterations are in flight, when the next one is planned ahead of the last one's results,
//! when the engine is told to answer, and what each step carries as a delta (a sequence's
//! whole block table once, then only the blocks appended since; the sequences the engine
//! may forget; the block copies of preemption by swapping).
//!
//! Overlap: with an engine that samples on its device, the next iteration is planned while
//! the last one runs ([`Scheduler::schedule_ahead`]): decodes continue with the token that
//! iteration samples, which the engine takes on the device. Such a step goes out with
//! `hold` (the engine answers for the previous step once the next one is launched); when
//! nothing can be planned ahead the engine is told to answer (`finish`), and nothing is
//! planned ahead until that iteration's results are back. At most two iterations are in
//! flight.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::step::prompt_targets;
use super::{Batch, BlockCopy, Scheduler, SeqId, StepSeq};
use crate::request::GenerationParams;

/// What the engine is sent for one iteration.
#[derive(Debug, Clone)]
pub struct Step {
    pub iteration: u64,
    pub seqs: Vec<StepSeq>,
    /// Sequences whose engine state can go (finished, cancelled, preempted).
    pub dropped: Vec<SeqId>,
    /// Block copies before the step's forward pass, in order.
    pub swaps: Vec<BlockCopy>,
    /// The reply to the previous iteration's results (its wait is pipeline time).
    pub follows: bool,
    /// The engine holds its answer for the previous step until this one is launched.
    pub hold: bool,
}

/// What one [`Overlap::kick`] decided: the steps to send, in order, then whether the
/// engine is to answer for the iteration in flight.
#[derive(Debug, Default)]
pub struct Kick {
    pub steps: Vec<Step>,
    pub finish: bool,
}

/// What a step needs of a sequence that the scheduler's core does not know.
pub struct SeqInfo {
    pub prompt_len: usize,
    pub params: Arc<GenerationParams>,
}

/// In-flight iterations and the engine's view of each sequence.
#[derive(Debug)]
pub struct Overlap {
    /// Plan iterations ahead (the engine samples on its device; no draft source).
    overlap: bool,
    /// Iterations sent to the engine and not yet answered, oldest first (two at most).
    in_flight: VecDeque<Batch>,
    /// The engine was told to answer for the iteration in flight: nothing is planned
    /// ahead of it.
    finishing: bool,
    /// Iterations planned ahead since start.
    planned_ahead: u64,
    /// Blocks of its table the engine has, per sequence whose KV state it holds.
    sent_blocks: HashMap<SeqId, usize>,
    /// Sequences whose engine state can go, sent with the next step.
    dropped: Vec<SeqId>,
    /// Block copies of batches not sent (one that computed nothing), for the next step.
    swaps: Vec<BlockCopy>,
}

impl Overlap {
    pub fn new(overlap: bool) -> Self {
        Overlap {
            overlap,
            in_flight: VecDeque::new(),
            finishing: false,
            planned_ahead: 0,
            sent_blocks: HashMap::new(),
            dropped: Vec::new(),
            swaps: Vec::new(),
        }
    }

    /// Plans the next iteration when the engine is idle; `follows` when this is the reply
    /// to the previous iteration's results. With overlap, then plans the one after it
    /// ahead (sequences for which `continues` is true may go on with a token not yet
    /// known), or asks the engine to answer when there is none. `info` gives each
    /// scheduled sequence's prompt length and parameters (None is an error: a sequence
    /// the caller does not know).
    pub fn kick(
        &mut self,
        core: &mut Scheduler,
        follows: bool,
        continues: impl Fn(SeqId) -> bool,
        info: impl Fn(SeqId) -> Option<SeqInfo>,
    ) -> Result<Kick, String> {
        let mut kick = Kick::default();
        if self.in_flight.is_empty() {
            if !core.has_work() {
                return Ok(kick);
            }
            let batch = core.schedule();
            match self.step(batch, follows, &info)? {
                Some(step) => kick.steps.push(step),
                None => return Ok(kick),
            }
        }
        if !self.overlap || self.in_flight.len() != 1 || self.finishing {
            return Ok(kick);
        }
        let batch = core.schedule_ahead(continues);
        match self.step(batch, true, &info)? {
            Some(step) => {
                self.planned_ahead += 1;
                kick.steps.push(step);
            }
            None => {
                self.finishing = true;
                kick.finish = true;
            }
        }
        Ok(kick)
    }

    /// The step of a planned batch, now in flight; None (nothing in flight) when it
    /// computes nothing, whose block copies then go with the next step. Each chunk's cached
    /// prefix moves into its step (the batch kept in flight does not need it).
    fn step(
        &mut self,
        mut batch: Batch,
        follows: bool,
        info: &impl Fn(SeqId) -> Option<SeqInfo>,
    ) -> Result<Option<Step>, String> {
        for &id in &batch.preempted {
            self.reset(id);
        }
        self.swaps.extend_from_slice(&batch.swaps);
        if batch.seqs.is_empty() {
            return Ok(None);
        }
        let mut seqs = Vec::with_capacity(batch.seqs.len());
        for s in &mut batch.seqs {
            let seq = info(s.id).ok_or("scheduled a sequence with no metadata")?;
            let sent = self.sent_blocks.insert(s.id, s.block_table.len());
            let reset = sent.is_none();
            let new_table = reset || s.swapped_in;
            let from = if new_table { 0 } else { sent.unwrap_or(0) };
            seqs.push(StepSeq {
                seq: s.id,
                prompt_len: seq.prompt_len,
                start_pos: s.start_pos,
                tokens: s.tokens.clone(),
                reset,
                new_table,
                new_blocks: s.block_table[from..].to_vec(),
                sample: s.sample,
                score: match seq.params.prompt_log_probs || seq.params.return_context_logits {
                    true => prompt_targets(&s.tokens, s.start_pos, s.next, seq.prompt_len),
                    false => Vec::new(),
                },
                params: seq.params,
                max_draft: s.max_draft,
                draft: None,
                cached: if reset {
                    std::mem::take(&mut s.cached)
                } else {
                    Vec::new()
                },
                long_rope: s.long_rope,
            });
        }
        let step = Step {
            iteration: batch.iteration,
            seqs,
            dropped: std::mem::take(&mut self.dropped),
            swaps: std::mem::take(&mut self.swaps),
            follows,
            hold: self.overlap,
        };
        self.in_flight.push_back(batch);
        Ok(Some(step))
    }

    /// The batch of `iteration` whose results came back, if it is the oldest in flight
    /// (a late answer from an engine that failed since is ignored).
    pub fn answered(&mut self, iteration: u64) -> Option<Batch> {
        let batch = self.in_flight.pop_front_if(|b| b.iteration == iteration)?;
        if self.in_flight.is_empty() {
            self.finishing = false;
        }
        Some(batch)
    }

    /// The engine forgets `seq` with the next step (preempted, finished or cancelled); if
    /// it runs again it gets its whole table.
    pub fn reset(&mut self, seq: SeqId) {
        if self.sent_blocks.remove(&seq).is_some() {
            self.dropped.push(seq);
        }
    }

    /// Whether the engine holds KV state for `seq` (it has been in a batch).
    pub fn engine_holds(&self, seq: SeqId) -> bool {
        self.sent_blocks.contains_key(&seq)
    }

    /// The engine died: nothing is in flight, and it holds nothing.
    pub fn engine_failed(&mut self) {
        self.in_flight.clear();
        self.finishing = false;
        self.sent_blocks.clear();
        self.dropped.clear();
        self.swaps.clear();
    }

    /// Iterations planned ahead since start.
    pub fn planned_ahead(&self) -> u64 {
        self.planned_ahead
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{SampledToken, SchedulerConfig, SeqSpec, StepOutput};

    fn core() -> Scheduler {
        Scheduler::new(SchedulerConfig {
            num_blocks: 16,
            block_size: 4,
            max_num_tokens: 64,
            max_seq_len: 64,
            ..Default::default()
        })
        .unwrap()
    }

    fn add(core: &mut Scheduler, id: SeqId, prompt: usize, max_new_tokens: usize) {
        core.add(SeqSpec {
            id,
            prompt: (1..=prompt as u32).collect(),
            max_new_tokens,
            num_draft_tokens: 0,
            cache_salt: 0,
            priority: 0,
            beam_width: 1,
        })
        .unwrap();
    }

    fn info(_: SeqId) -> Option<SeqInfo> {
        Some(SeqInfo {
            prompt_len: 3,
            params: Arc::new(GenerationParams::default()),
        })
    }

    /// The engine's answer to `step`: token 7 for every chunk that samples.
    fn answer(core: &mut Scheduler, o: &mut Overlap, step: &Step) {
        let batch = o.answered(step.iteration).expect("in flight");
        let tokens = batch
            .seqs
            .iter()
            .filter(|c| c.sample)
            .map(|c| SampledToken {
                id: c.id,
                accepted: Vec::new(),
                token: 7,
                stop: false,
            })
            .collect();
        core.update(&batch, &StepOutput { tokens });
    }

    #[test]
    fn without_overlap_one_iteration_is_in_flight_at_a_time() {
        let (mut core, mut o) = (core(), Overlap::new(false));
        add(&mut core, 1, 3, 4);
        let k = o.kick(&mut core, false, |_| true, info).unwrap();
        assert_eq!((k.steps.len(), k.finish), (1, false));
        assert!(!k.steps[0].hold && !k.steps[0].follows);
        // Nothing more until its results are back.
        let again = o.kick(&mut core, false, |_| true, info).unwrap();
        assert!(again.steps.is_empty() && !again.finish);
        answer(&mut core, &mut o, &k.steps[0]);
        let next = o.kick(&mut core, true, |_| true, info).unwrap();
        assert_eq!(next.steps.len(), 1);
        assert!(next.steps[0].follows);
        assert_eq!(o.planned_ahead(), 0);
    }

    #[test]
    fn with_overlap_the_next_iteration_is_planned_ahead_and_held() {
        let (mut core, mut o) = (core(), Overlap::new(true));
        add(&mut core, 1, 3, 8);
        let k = o.kick(&mut core, false, |_| true, info).unwrap();
        assert_eq!((k.steps.len(), k.finish), (2, false));
        assert!(k.steps.iter().all(|s| s.hold));
        // The second is the first's pending token, planned before it is known.
        assert!(k.steps[1].seqs[0].is_pending());
        assert_eq!(o.planned_ahead(), 1);
        // Two in flight: nothing more, until the oldest is answered.
        let full = o.kick(&mut core, false, |_| true, info).unwrap();
        assert!(full.steps.is_empty() && !full.finish);
        answer(&mut core, &mut o, &k.steps[0]);
        let more = o.kick(&mut core, true, |_| true, info).unwrap();
        assert_eq!(more.steps.len(), 1);
        assert_eq!(o.planned_ahead(), 2);
    }

    #[test]
    fn where_nothing_continues_the_engine_is_told_to_answer_once() {
        let (mut core, mut o) = (core(), Overlap::new(true));
        add(&mut core, 1, 3, 8);
        let k = o.kick(&mut core, false, |_| false, info).unwrap();
        assert_eq!((k.steps.len(), k.finish), (1, true));
        // Finishing: no further plan ahead nor a second Finish while it is in flight.
        let wait = o.kick(&mut core, false, |_| false, info).unwrap();
        assert!(wait.steps.is_empty() && !wait.finish);
        answer(&mut core, &mut o, &k.steps[0]);
        let next = o.kick(&mut core, true, |_| false, info).unwrap();
        assert_eq!((next.steps.len(), next.finish), (1, true));
    }

    #[test]
    fn steps_carry_the_table_once_then_only_new_blocks() {
        let (mut core, mut o) = (core(), Overlap::new(false));
        // 3 prompt tokens in blocks of 4: one block, then a second at position 4.
        add(&mut core, 1, 3, 8);
        let mut steps = Vec::new();
        for _ in 0..3 {
            let k = o
                .kick(&mut core, !steps.is_empty(), |_| true, info)
                .unwrap();
            let step = k.steps.into_iter().next().unwrap();
            answer(&mut core, &mut o, &step);
            steps.push(step);
        }
        let s: Vec<&StepSeq> = steps.iter().map(|s| &s.seqs[0]).collect();
        assert!(s[0].reset && s[0].new_table && s[0].new_blocks.len() == 1);
        // Position 3 still fits the first block; position 4 needs one more.
        assert!(!s[1].reset && s[1].new_blocks.is_empty());
        assert!(!s[2].reset && s[2].new_blocks.len() == 1);
        assert!(o.engine_holds(1));
        // Once gone, the engine is told to forget it with the next step.
        o.reset(1);
        assert!(!o.engine_holds(1));
        add(&mut core, 2, 3, 8);
        core.cancel(1);
        let k = o.kick(&mut core, false, |_| true, info).unwrap();
        assert_eq!(k.steps[0].dropped, vec![1]);
        assert!(k.steps[0].seqs[0].reset);
    }

    #[test]
    fn an_unknown_sequence_is_an_error_and_a_failed_engine_holds_nothing() {
        let (mut core, mut o) = (core(), Overlap::new(true));
        add(&mut core, 1, 3, 8);
        assert!(o.kick(&mut core, false, |_| true, |_| None).is_err());
        let (mut core, mut o) = (self::core(), Overlap::new(true));
        add(&mut core, 1, 3, 8);
        let k = o.kick(&mut core, false, |_| true, info).unwrap();
        o.engine_failed();
        assert!(!o.engine_holds(1));
        assert!(o.answered(k.steps[0].iteration).is_none());
    }
}
