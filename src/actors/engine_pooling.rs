//! Embeddings inside the Engine actor: the chunks of sequences that generate nothing
//! (`GenerationParams::pooling`) are taken out of a step and run through the forward
//! pass's hidden-state variant (`ForwardPass::forward_hidden`), each asking for the rows
//! its pooling reads; a sequence's rows are summed across its chunks until the chunk that
//! reaches its prompt's end, whose step carries its embedding to the Scheduler
//! (`StepDone::pooled`). The state is one sum per such sequence, reset with the sequence
//! (`StepSeq::reset`) and dropped with it.

use std::collections::HashMap;

use super::messages::{Pooled, SeqId, StepSeq};
use crate::model::pooling::PoolSum;
use crate::model::SeqChunk;

/// The pooled rows of every embedding sequence an engine holds.
#[derive(Default)]
pub struct EnginePooling {
    seqs: HashMap<SeqId, PoolSum>,
}

impl EnginePooling {
    /// Splits a step's sequences into those that generate and those whose prompt is
    /// pooled into an embedding, each in the step's order.
    pub fn split(seqs: Vec<StepSeq>) -> (Vec<StepSeq>, Vec<StepSeq>) {
        seqs.into_iter().partition(|s| s.params.pooling.is_none())
    }

    /// Hidden-state rows an embedding chunk needs: its chunk's `logits`.
    pub fn rows(s: &StepSeq) -> usize {
        s.params
            .pooling
            .map_or(0, |p| p.rows(s.tokens.len(), s.sample))
    }

    /// The forward pass's view of embedding chunks over their block `tables`.
    pub fn chunks<'a>(seqs: &'a [StepSeq], tables: &'a [Vec<u32>]) -> Vec<SeqChunk<'a>> {
        seqs.iter()
            .zip(tables)
            .map(|(s, table)| SeqChunk {
                tokens: &s.tokens,
                start_pos: s.start_pos,
                block_table: table,
                logits: Self::rows(s),
                long_rope: s.long_rope,
            })
            .collect()
    }

    /// Adds each embedding chunk's hidden rows (`hidden[i]` for `seqs[i]`, row-major) to
    /// its sequence's sum; returns the embeddings of the sequences whose prompt ends here.
    pub fn absorb(&mut self, seqs: &[StepSeq], hidden: Vec<Vec<f32>>) -> Vec<Pooled> {
        let mut done = Vec::new();
        for (s, rows) in seqs.iter().zip(hidden) {
            let sum = self.seqs.entry(s.seq).or_default();
            if s.reset {
                *sum = PoolSum::default();
            }
            if let Some(width) = rows.len().checked_div(Self::rows(s)) {
                sum.add(&rows, width);
            }
            if s.sample {
                let sum = self.seqs.remove(&s.seq).unwrap_or_default();
                done.push((s.seq, sum.finish()));
            }
        }
        done
    }

    /// Forgets a sequence (finished, cancelled, or preempted: a recomputed one starts over).
    pub fn drop_seq(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::Pooling;
    use crate::request::GenerationParams;

    fn step(seq: SeqId, tokens: usize, sample: bool, reset: bool, pooling: Pooling) -> StepSeq {
        StepSeq {
            seq,
            prompt_len: 10,
            start_pos: 0,
            tokens: vec![1; tokens],
            reset,
            new_table: reset,
            new_blocks: Vec::new(),
            sample,
            params: Arc::new(GenerationParams::embedding(pooling)),
            max_draft: 0,
            draft: None,
            cached: Vec::new(),
            score: Vec::new(),
            long_rope: false,
        }
    }

    #[test]
    fn the_mean_runs_over_every_chunk_and_the_last_token_is_the_final_row() {
        let mut p = EnginePooling::default();
        let first = [
            step(1, 2, false, true, Pooling::Mean),
            step(2, 3, false, true, Pooling::Last),
        ];
        assert_eq!(EnginePooling::rows(&first[0]), 2);
        assert_eq!(EnginePooling::rows(&first[1]), 0);
        let out = p.absorb(&first, vec![vec![1.0, 0.0, 1.0, 0.0], Vec::new()]);
        assert!(out.is_empty(), "no prompt is complete yet");
        let last = [
            step(1, 1, true, false, Pooling::Mean),
            step(2, 1, true, false, Pooling::Last),
        ];
        let out = p.absorb(&last, vec![vec![-2.0, 3.0], vec![0.0, -5.0]]);
        // Mean of (1,0), (1,0), (-2,3) is (0,1); the last row (0,-5) normalizes to (0,-1).
        assert_eq!(out, vec![(1, vec![0.0, 1.0]), (2, vec![0.0, -1.0])]);
        assert!(p.seqs.is_empty(), "finished sums are dropped");
    }

    #[test]
    fn a_reset_starts_the_sum_over() {
        let mut p = EnginePooling::default();
        p.absorb(
            &[step(1, 1, false, true, Pooling::Mean)],
            vec![vec![5.0, 0.0]],
        );
        let out = p.absorb(
            &[step(1, 1, true, true, Pooling::Mean)],
            vec![vec![0.0, 2.0]],
        );
        assert_eq!(out, vec![(1, vec![0.0, 1.0])]);
        let (generate, embed) = EnginePooling::split(vec![
            StepSeq {
                params: Arc::new(GenerationParams::default()),
                ..step(3, 1, true, true, Pooling::Last)
            },
            step(4, 1, true, true, Pooling::Last),
        ]);
        assert_eq!((generate[0].seq, embed[0].seq), (3, 4));
    }
}
