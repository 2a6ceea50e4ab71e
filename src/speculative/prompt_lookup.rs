//! Prompt-lookup drafting: the next tokens are guessed by finding the sequence's latest
//! n-gram earlier in its own tokens (prompt and output so far) and copying what followed
//! it. No second model; it pays off when the answer quotes its input (edits, code, RAG).

/// Looks for the last `n` tokens of `tokens`, for `n` from `max_ngram` down to
/// `min_ngram`, at an earlier place (the most recent one wins) and returns up to `k`
/// tokens that followed it there. Empty when nothing matches.
pub fn propose(tokens: &[u32], k: usize, min_ngram: usize, max_ngram: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 || min_ngram == 0 {
        return Vec::new();
    }
    for n in (min_ngram..=max_ngram.min(len.saturating_sub(1))).rev() {
        let tail = &tokens[len - n..];
        // Start positions of earlier occurrences, latest first; one that ends right
        // before the tail still has its continuation (the tail itself).
        if let Some(start) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == tail) {
            let from = start + n;
            let to = (from + k).min(len);
            return tokens[from..to].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_what_followed_the_latest_match_of_the_longest_ngram() {
        //            0  1  2  3  4  5  6  7  8  9 10
        let tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2];
        // "1 2" occurs at 0: 3 4 5 follows. ("2" alone also matches at 6, but the
        // longer n-gram wins.)
        assert_eq!(propose(&tokens, 3, 1, 3), vec![3, 4, 5]);
        // Only unigrams: the latest earlier "2" is at 6, followed by 3 7 1.
        assert_eq!(propose(&tokens, 3, 1, 1), vec![3, 7, 1]);
        // Fewer tokens than asked when the match is near the end.
        assert_eq!(propose(&[5, 6, 5], 4, 1, 2), vec![6, 5]);
    }

    #[test]
    fn nothing_without_a_match_or_room() {
        assert!(propose(&[1, 2, 3, 4], 3, 1, 3).is_empty());
        assert!(propose(&[1, 2, 1, 2], 0, 1, 3).is_empty());
        assert!(propose(&[], 3, 1, 3).is_empty());
        assert!(propose(&[7], 3, 1, 3).is_empty());
        // min_ngram 2: a lone repeated token is not enough.
        assert!(propose(&[1, 5, 2, 5], 3, 2, 3).is_empty());
    }
}
