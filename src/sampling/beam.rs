//! Beam search's choices for one prompt, TensorRT-LLM's rules, as a pure state machine:
//! each live beam offers its most likely next tokens (`2 x width`, with their
//! log-probabilities); once every live beam has offered, the candidates are ranked by
//! cumulative log-probability and the next beams chosen ([`Selection`]), finished
//! hypotheses kept and the search's end decided. The Scheduler actor drives it; the
//! sequences that carry the beams are forked to match ([`Move`]).
//!
//! The rules: beam 0 alone offers at the first step (the others would repeat it). Walking
//! the candidates best first, an end token among the first `width` of them finishes a
//! hypothesis (kept if fewer than `width` are, or if it beats the worst one kept), one
//! further down is dropped; any other candidate becomes a next beam until `width` are
//! chosen; a beam whose row allows no token is kept as it is among the finished
//! hypotheses. A hypothesis scores `cum_log_prob / length ^ length_penalty` over its
//! generated tokens (its end token included); `length_penalty` 0 scores by the sum alone.
//! The search ends at the length limit, when no beam is left, or per `early_stopping`: 1,
//! once `width` hypotheses are finished; 0, once none of the running beams could beat the
//! worst of them at its current length; 2 or more, likewise at the longest length it may
//! reach (with a positive `length_penalty`). The answer is the best of the finished
//! hypotheses and the running beams, by score.

/// What a search is asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamSettings {
    /// Beams kept at each step (2 or more).
    pub width: usize,
    /// Hypotheses returned, best first (1..=width).
    pub returned: usize,
    /// Scores divide by `length ^ length_penalty` (0: the sum alone).
    pub length_penalty: f32,
    /// When the search ends (see the module's rules).
    pub early_stopping: i32,
    /// Most tokens a beam generates.
    pub max_new: usize,
    /// Tokens that end a hypothesis (none with `ignore_eos`).
    pub end_ids: Vec<u32>,
}

impl BeamSettings {
    /// Candidates each beam offers per step.
    pub fn candidates(&self) -> usize {
        2 * self.width
    }

    /// The score of a hypothesis of `len` generated tokens with this sum.
    pub fn score(&self, cum_log_prob: f32, len: usize) -> f32 {
        if self.length_penalty == 0.0 || len <= 1 {
            cum_log_prob
        } else {
            cum_log_prob / (len as f32).powf(self.length_penalty)
        }
    }
}

/// One beam or finished hypothesis: its generated tokens (an end token last when it
/// ended), each one's log-probability and their sum.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Hypothesis {
    /// Its generated tokens.
    pub tokens: Vec<u32>,
    /// Each token's log-probability.
    pub log_probs: Vec<f32>,
    /// Their sum.
    pub cum_log_prob: f32,
    /// It ended with an end token.
    pub ended: bool,
}

/// Slot `slot`'s sequence becomes a copy of slot `parent`'s (as it was before this
/// selection) followed by `token`. `parent == slot` continues a beam as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The slot whose sequence changes.
    pub slot: usize,
    /// The slot it copies.
    pub parent: usize,
    /// The token after the copy.
    pub token: u32,
}

/// One step's outcome, once every live beam has offered.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selection {
    /// The next beams, in slot order: a slot keeps its own beam (as its parent) when it
    /// continues it, so that a fork happens only where beams split.
    pub moves: Vec<Move>,
    /// Slots with no beam from now on (fewer candidates than slots).
    pub dead: Vec<usize>,
    /// The search is over: [`BeamSearch::best`] is the answer.
    pub done: bool,
}

/// The state of one prompt's search.
#[derive(Debug, Clone)]
pub struct BeamSearch {
    settings: BeamSettings,
    /// Each slot's beam; None for a slot with no beam (before the first step, or dead).
    beams: Vec<Option<Hypothesis>>,
    /// Each slot's offer this step.
    offers: Vec<Option<Vec<(u32, f32)>>>,
    finished: Vec<Hypothesis>,
    done: bool,
}

impl BeamSearch {
    /// A search about to take its first step: slot 0 holds the empty beam.
    pub fn new(settings: BeamSettings) -> Self {
        let width = settings.width.max(1);
        let mut beams = vec![None; width];
        beams[0] = Some(Hypothesis::default());
        BeamSearch {
            offers: vec![None; width],
            beams,
            finished: Vec::new(),
            done: false,
            settings,
        }
    }

    /// What it was asked for.
    pub fn settings(&self) -> &BeamSettings {
        &self.settings
    }

    /// Whether `slot` holds a beam.
    pub fn is_live(&self, slot: usize) -> bool {
        self.beams.get(slot).is_some_and(Option::is_some)
    }

    /// Whether it has ended ([`best`](Self::best) is its answer).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Takes live slot `slot`'s candidates for its next token (token, log-probability;
    /// any order, the non-finite ones ignored). Once every live slot has offered, the
    /// step's selection; None before, and for a slot that is not live or a search that
    /// is over.
    pub fn offer(&mut self, slot: usize, candidates: &[(u32, f32)]) -> Option<Selection> {
        if self.done || !self.is_live(slot) {
            return None;
        }
        let mut c: Vec<(u32, f32)> = candidates
            .iter()
            .copied()
            .filter(|c| c.1.is_finite())
            .collect();
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        c.truncate(self.settings.candidates());
        self.offers[slot] = Some(c);
        let waiting = (0..self.beams.len()).any(|s| self.is_live(s) && self.offers[s].is_none());
        (!waiting).then(|| self.select())
    }

    fn select(&mut self) -> Selection {
        let width = self.beams.len();
        // (score, slot, rank in its offer): best first; ties by slot, then rank.
        let mut ranked: Vec<(f32, usize, usize)> = Vec::new();
        for (slot, offer) in self.offers.iter().enumerate() {
            let (Some(beam), Some(offer)) = (&self.beams[slot], offer) else {
                continue;
            };
            for (rank, &(_, lp)) in offer.iter().enumerate() {
                ranked.push((beam.cum_log_prob + lp, slot, rank));
            }
        }
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        // A beam with no token it may take (a row all masked) cannot go on: it is kept as
        // it is, among the finished hypotheses.
        for slot in 0..width {
            if self.offers[slot].as_ref().is_some_and(Vec::is_empty) {
                if let Some(h) = self.beams[slot].clone() {
                    self.keep_finished(h);
                }
            }
        }
        let mut next: Vec<(usize, u32, f32)> = Vec::with_capacity(width);
        for (r, &(_, slot, rank)) in ranked.iter().enumerate() {
            if next.len() == width {
                break;
            }
            let (token, lp) = self.offers[slot].as_ref().expect("ranked from an offer")[rank];
            if self.settings.end_ids.contains(&token) {
                if r < width {
                    let mut h = self.beams[slot].clone().expect("a live slot");
                    push(&mut h, token, lp);
                    h.ended = true;
                    self.keep_finished(h);
                }
            } else {
                next.push((slot, token, lp));
            }
        }
        // A slot continues its own beam where it can; the other beams take free slots.
        let mut slot_of: Vec<Option<usize>> = vec![None; next.len()];
        let mut taken = vec![false; width];
        for (k, &(parent, ..)) in next.iter().enumerate() {
            if !taken[parent] {
                taken[parent] = true;
                slot_of[k] = Some(parent);
            }
        }
        for s in slot_of.iter_mut().filter(|s| s.is_none()) {
            let free = taken.iter().position(|t| !t).expect("a free slot per beam");
            taken[free] = true;
            *s = Some(free);
        }
        let old = std::mem::replace(&mut self.beams, vec![None; width]);
        let mut moves: Vec<Move> = Vec::with_capacity(next.len());
        for (&(parent, token, lp), slot) in next.iter().zip(slot_of) {
            let slot = slot.expect("assigned above");
            let mut h = old[parent].clone().expect("a live parent");
            push(&mut h, token, lp);
            self.beams[slot] = Some(h);
            moves.push(Move {
                slot,
                parent,
                token,
            });
        }
        moves.sort_by_key(|m| m.slot);
        self.offers = vec![None; width];
        let dead = (0..width).filter(|&s| !taken[s]).collect();
        self.done = self.over();
        Selection {
            moves,
            dead,
            done: self.done,
        }
    }

    /// Whether the search ends after the step just selected.
    fn over(&self) -> bool {
        let live: Vec<&Hypothesis> = self.beams.iter().flatten().collect();
        let Some(len) = live.first().map(|h| h.tokens.len()) else {
            return true;
        };
        if len >= self.settings.max_new {
            return true;
        }
        if self.finished.len() < self.beams.len() {
            return false;
        }
        let s = &self.settings;
        let worst = self
            .finished
            .iter()
            .map(|h| s.score(h.cum_log_prob, h.tokens.len()))
            .fold(f32::INFINITY, f32::min);
        let best_cum = live
            .iter()
            .map(|h| h.cum_log_prob)
            .fold(f32::NEG_INFINITY, f32::max);
        match s.early_stopping {
            1 => true,
            0 => worst >= s.score(best_cum, len),
            _ => {
                let at = if s.length_penalty > 0.0 {
                    s.max_new
                } else {
                    len
                };
                worst >= s.score(best_cum, at)
            }
        }
    }

    /// Keeps a finished hypothesis: while fewer than `width` are kept, or in place of the
    /// worst one when it scores better.
    fn keep_finished(&mut self, h: Hypothesis) {
        let s = &self.settings;
        if self.finished.len() < self.beams.len() {
            self.finished.push(h);
            return;
        }
        let score = |h: &Hypothesis| s.score(h.cum_log_prob, h.tokens.len());
        let worst = (0..self.finished.len())
            .min_by(|&a, &b| score(&self.finished[a]).total_cmp(&score(&self.finished[b])));
        if let Some(w) = worst {
            if score(&h) > score(&self.finished[w]) {
                self.finished[w] = h;
            }
        }
    }

    /// The answer so far, best first: the finished hypotheses and the live beams ranked
    /// by score, `returned` of them.
    pub fn best(&self) -> Vec<Hypothesis> {
        let s = &self.settings;
        let mut all: Vec<&Hypothesis> = self
            .finished
            .iter()
            .chain(self.beams.iter().flatten())
            .collect();
        // Stable: on equal scores, finished hypotheses first.
        all.sort_by(|a, b| {
            s.score(b.cum_log_prob, b.tokens.len())
                .total_cmp(&s.score(a.cum_log_prob, a.tokens.len()))
        });
        all.into_iter().take(s.returned.max(1)).cloned().collect()
    }
}

fn push(h: &mut Hypothesis, token: u32, lp: f32) {
    h.tokens.push(token);
    h.log_probs.push(lp);
    h.cum_log_prob += lp;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(width: usize, max_new: usize) -> BeamSettings {
        BeamSettings {
            width,
            returned: width,
            length_penalty: 0.0,
            early_stopping: 1,
            max_new,
            end_ids: vec![0],
        }
    }

    #[test]
    fn the_first_step_expands_beam_zero_alone() {
        let mut b = BeamSearch::new(settings(2, 5));
        assert!(b.is_live(0) && !b.is_live(1));
        assert_eq!(b.offer(1, &[(5, -0.1)]), None, "slot 1 holds no beam yet");
        let sel = b.offer(0, &[(7, -0.5), (5, -0.2), (9, -3.0)]).unwrap();
        assert_eq!(
            sel.moves,
            vec![
                Move {
                    slot: 0,
                    parent: 0,
                    token: 5
                },
                Move {
                    slot: 1,
                    parent: 0,
                    token: 7
                },
            ]
        );
        assert!(sel.dead.is_empty() && !sel.done);
        let best = b.best();
        assert_eq!(best[0].tokens, [5]);
        assert_eq!(best[1].tokens, [7]);
    }

    #[test]
    fn beams_split_and_a_slot_keeps_its_own_beam() {
        let mut b = BeamSearch::new(settings(2, 5));
        b.offer(0, &[(5, -0.1), (7, -0.2)]).unwrap();
        assert_eq!(
            b.offer(1, &[(3, -0.3), (8, -0.4)]),
            None,
            "slot 0 has not offered"
        );
        // Both next beams descend from slot 1's beam [7]: slot 1 continues it, slot 0 forks.
        let sel = b.offer(0, &[(4, -5.0), (6, -6.0)]).unwrap();
        assert_eq!(
            sel.moves,
            vec![
                Move {
                    slot: 0,
                    parent: 1,
                    token: 8
                },
                Move {
                    slot: 1,
                    parent: 1,
                    token: 3
                },
            ]
        );
        let best = b.best();
        assert_eq!(best[0].tokens, [7, 3]);
        assert!((best[0].cum_log_prob + 0.5).abs() < 1e-6);
        assert_eq!(best[1].tokens, [7, 8]);
        assert_eq!(best[1].log_probs, [-0.2, -0.4]);
    }

    #[test]
    fn an_end_token_in_the_first_ranks_finishes_a_hypothesis() {
        let mut b = BeamSearch::new(settings(2, 5));
        b.offer(0, &[(5, -0.1), (7, -0.2)]).unwrap();
        b.offer(0, &[(0, -0.05), (6, -1.0)]);
        let sel = b.offer(1, &[(3, -0.3), (0, -9.0)]).unwrap();
        // Ranked: [5,0] -0.15 (ends), [7,3] -0.5, [5,6] -1.1, [7,0] -9.2 (too far down).
        assert_eq!(sel.moves.len(), 2);
        assert!(!sel.done, "one hypothesis of two");
        let best = b.best();
        assert_eq!(best[0].tokens, [5, 0]);
        assert!(best[0].ended);
        assert_eq!(best[1].tokens, [7, 3]);
    }

    #[test]
    fn early_stopping_one_ends_with_width_hypotheses_and_the_length_limit_ends_all() {
        let mut b = BeamSearch::new(settings(2, 9));
        b.offer(0, &[(5, -0.1), (7, -0.2)]).unwrap();
        b.offer(0, &[(0, -0.05), (6, -1.0)]);
        let sel = b.offer(1, &[(0, -0.01), (8, -2.0)]).unwrap();
        assert!(sel.done, "two hypotheses finished");
        assert!(b.best().iter().all(|h| h.ended));
        let mut b = BeamSearch::new(settings(2, 1));
        let sel = b.offer(0, &[(5, -0.1), (7, -0.2)]).unwrap();
        assert!(sel.done, "max_new 1");
        assert_eq!(b.best().len(), 2);
    }

    #[test]
    fn early_stopping_zero_waits_while_a_running_beam_could_win() {
        let run = |early_stopping| {
            let mut s = settings(2, 9);
            s.early_stopping = early_stopping;
            let mut b = BeamSearch::new(s);
            // [5] runs, [0] ends at -0.2, [7] runs.
            let sel = b.offer(0, &[(5, -0.1), (0, -0.2), (7, -0.3)]).unwrap();
            assert!(!sel.done, "one hypothesis of two");
            b.offer(0, &[(0, -0.05), (6, -0.05)]);
            // [5, 0] ends at -0.15 (the second hypothesis); [5, 6] runs at -0.15.
            b.offer(1, &[(8, -1.0), (0, -2.0)]).unwrap().done
        };
        assert!(run(1), "two hypotheses: done");
        assert!(
            !run(0),
            "the worst kept, -0.2, is below the best running beam's -0.15"
        );
    }

    #[test]
    fn length_penalty_divides_by_generated_length() {
        let mut s = settings(2, 9);
        s.length_penalty = 1.0;
        assert_eq!(s.score(-6.0, 3), -2.0);
        assert_eq!(s.score(-6.0, 1), -6.0);
        s.length_penalty = 0.0;
        assert_eq!(s.score(-6.0, 3), -6.0);
    }

    #[test]
    fn a_beam_with_no_candidates_leaves_its_slot_dead() {
        let mut b = BeamSearch::new(settings(3, 9));
        let sel = b.offer(0, &[(5, -0.1), (7, f32::NEG_INFINITY)]).unwrap();
        assert_eq!(sel.moves.len(), 1);
        assert_eq!(sel.dead, [1, 2]);
        assert!(!b.is_live(1));
        let sel = b.offer(0, &[]).unwrap();
        assert!(sel.done && sel.moves.is_empty());
        let best = b.best();
        assert_eq!(best.len(), 1, "the beam that could not go on is the answer");
        assert_eq!((best[0].tokens.clone(), best[0].ended), (vec![5], false));
        // Nothing at all at the first step: the empty hypothesis.
        let mut b = BeamSearch::new(settings(2, 9));
        assert!(b.offer(0, &[]).unwrap().done);
        assert_eq!(b.best(), [Hypothesis::default()]);
    }
}
