//! Token-sequence rules of one request: end tokens, `min_length`, bad words and stop
//! words; which tokens they forbid next and whether the sequence just stopped.
//!
//! Words are matched against the whole sequence, prompt included, as TensorRT-LLM's
//! `stop_words_criterion` and `banBadWords` kernels do: the match always ends with the
//! token being chosen (masking) or just chosen (stopping), but its earlier tokens may lie
//! in the prompt. The caller therefore keeps the last [`WordRules::context_len`] prompt
//! tokens in front of the generated ones.

use crate::request::GenerationParams;

/// The rules of one request, validated once: empty words are dropped.
#[derive(Debug, Clone)]
pub(crate) struct WordRules {
    /// `end_id` when given, else the model's end-of-sequence ids.
    end_ids: Vec<u32>,
    /// End tokens neither stop nor are masked (they are ordinary tokens).
    ignore_eos: bool,
    min_length: usize,
    bad_words: Vec<Vec<u32>>,
    stop_words: Vec<Vec<u32>>,
}

/// A request's end tokens, sorted: its `end_id`, else the model's `eos_ids` (whether or
/// not `ignore_eos` disables them).
fn end_tokens(params: &GenerationParams, eos_ids: &[u32]) -> Vec<u32> {
    let mut ids = match params.end_id {
        Some(id) => vec![id],
        None => eos_ids.to_vec(),
    };
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The tokens that end a sequence of `params` (none with `ignore_eos`), as its sampler
/// takes them.
pub(crate) fn end_ids(params: &GenerationParams, eos_ids: &[u32]) -> Vec<u32> {
    match params.ignore_eos {
        true => Vec::new(),
        false => end_tokens(params, eos_ids),
    }
}

impl WordRules {
    pub(crate) fn new(params: &GenerationParams, eos_ids: &[u32]) -> Self {
        let end_ids = end_tokens(params, eos_ids);
        let non_empty = |words: &[Vec<u32>]| -> Vec<Vec<u32>> {
            words.iter().filter(|w| !w.is_empty()).cloned().collect()
        };
        WordRules {
            end_ids,
            ignore_eos: params.ignore_eos,
            min_length: params.min_length,
            bad_words: non_empty(&params.bad_words),
            stop_words: non_empty(&params.stop_words),
        }
    }

    /// How many tokens before the next one the rules can look at: the longest word but one.
    pub(crate) fn context_len(&self) -> usize {
        self.bad_words
            .iter()
            .chain(&self.stop_words)
            .map(|w| w.len() - 1)
            .max()
            .unwrap_or(0)
    }

    /// Whether the tokens `banned` forbids depend on the tokens before (bad words, or stop
    /// words while `min_length` holds their last tokens back), not only on their count.
    pub(crate) fn looks_back(&self) -> bool {
        !self.bad_words.is_empty() || (self.min_length > 0 && !self.stop_words.is_empty())
    }

    /// Whether `token` ends the sequence (never with `ignore_eos`).
    pub(crate) fn is_end(&self, token: u32) -> bool {
        !self.ignore_eos && self.end_ids.binary_search(&token).is_ok()
    }

    /// The tokens that end the sequence (none with `ignore_eos`).
    pub(crate) fn end_ids(&self) -> &[u32] {
        if self.ignore_eos {
            &[]
        } else {
            &self.end_ids
        }
    }

    /// The lowest end token id, if any (whether or not `ignore_eos` disables it).
    pub(crate) fn first_end_id(&self) -> Option<u32> {
        self.end_ids.first().copied()
    }

    /// Sets to -inf the logit of every token that may not follow `history` (the prompt
    /// tail and the `generated` tokens so far):
    /// - a one-token bad word, always; a longer one's last token when `history` ends with
    ///   its other tokens;
    /// - while fewer than `min_length` tokens were generated: the end tokens (unless
    ///   `ignore_eos`), and stop words the way bad words are masked, so that neither can
    ///   end the sequence early (vLLM's `min_tokens` also holds back stop tokens).
    ///
    /// Ids outside the row are ignored.
    #[cfg(test)]
    pub(crate) fn mask(&self, history: &[u32], generated: usize, logits: &mut [f32]) {
        self.banned(history, generated, |token| {
            if let Some(x) = logits.get_mut(token as usize) {
                *x = f32::NEG_INFINITY;
            }
        });
    }

    /// Calls `ban` with each token [`mask`](Self::mask) sets to -inf (a token may come
    /// more than once).
    pub(crate) fn banned(&self, history: &[u32], generated: usize, mut ban: impl FnMut(u32)) {
        if self.bad_words.is_empty() && generated >= self.min_length {
            return;
        }
        let completes = |word: &[u32]| history.ends_with(&word[..word.len() - 1]);
        for word in &self.bad_words {
            if completes(word) {
                ban(word[word.len() - 1]);
            }
        }
        if generated < self.min_length {
            if !self.ignore_eos {
                self.end_ids.iter().for_each(|&t| ban(t));
            }
            for word in &self.stop_words {
                if completes(word) {
                    ban(word[word.len() - 1]);
                }
            }
        }
    }

    /// Whether the sequence stops now that `history` ends with the token just chosen: it
    /// is an end token, or `history` ends with a stop word.
    pub(crate) fn stops(&self, history: &[u32]) -> bool {
        let Some(&last) = history.last() else {
            return false;
        };
        self.is_end(last) || self.stop_words.iter().any(|w| history.ends_with(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEG: f32 = f32::NEG_INFINITY;

    fn rules(f: impl FnOnce(&mut GenerationParams)) -> WordRules {
        let mut p = GenerationParams::default();
        f(&mut p);
        WordRules::new(&p, &[9, 8])
    }

    fn masked(r: &WordRules, history: &[u32], generated: usize) -> Vec<f32> {
        let mut row = vec![0.0; 10];
        r.mask(history, generated, &mut row);
        row
    }

    #[test]
    fn single_bad_word_always_masked_multi_only_after_its_prefix() {
        let r = rules(|p| p.bad_words = vec![vec![1], vec![2, 3, 4], vec![], vec![50]]);
        assert_eq!(r.context_len(), 2);
        let row = masked(&r, &[], 0);
        assert_eq!(row[1], NEG);
        assert!(row.iter().enumerate().all(|(i, &x)| i == 1 || x == 0.0));
        // Prefix [2, 3] matched: 4 masked; a partial prefix masks nothing more.
        assert_eq!(masked(&r, &[7, 2, 3], 2)[4], NEG);
        assert_eq!(masked(&r, &[2, 7, 3], 2)[4], 0.0);
        assert_eq!(masked(&r, &[3], 1)[4], 0.0);
    }

    #[test]
    fn end_tokens_and_stop_words_masked_below_min_length() {
        let r = rules(|p| {
            p.min_length = 2;
            p.stop_words = vec![vec![5], vec![6, 7]];
        });
        for generated in 0..2 {
            let row = masked(&r, &[6], generated);
            assert_eq!((row[9], row[8], row[5], row[7]), (NEG, NEG, NEG, NEG));
            assert_eq!(masked(&r, &[1], generated)[7], 0.0);
        }
        assert!(masked(&r, &[6], 2).iter().all(|&x| x == 0.0));
    }

    #[test]
    fn ignore_eos_neither_masks_nor_stops() {
        let r = rules(|p| {
            p.min_length = 3;
            p.ignore_eos = true;
        });
        assert!(masked(&r, &[], 0).iter().all(|&x| x == 0.0));
        assert!(!r.stops(&[9]));
        assert!(!r.is_end(9));
        assert_eq!(r.first_end_id(), Some(8));
    }

    #[test]
    fn end_id_replaces_the_eos_ids() {
        let r = rules(|p| p.end_id = Some(3));
        assert!(r.stops(&[3]) && !r.stops(&[9]) && !r.stops(&[8]));
        let r = rules(|_| {});
        assert!(r.stops(&[9]) && r.stops(&[8]) && !r.stops(&[3]));
    }

    #[test]
    fn stop_words_match_across_tokens_and_only_at_the_end() {
        let r = rules(|p| p.stop_words = vec![vec![1, 2, 3], vec![4]]);
        assert!(r.stops(&[0, 1, 2, 3]));
        assert!(r.stops(&[4]));
        assert!(!r.stops(&[1, 2, 3, 0]));
        assert!(!r.stops(&[2, 3]));
        assert!(!r.stops(&[]));
    }
}
