//! Long texts cut where the byte-level pre-tokenizers split anyway, so that the pieces can
//! be encoded in parallel and give exactly the ids of the whole text.
//!
//! Why it is exact: each of these pre-tokenizers cuts the text with regexes (GPT-2's and
//! its relatives below), scanned leftmost-first, without look-behind or anchors. None of
//! their alternatives matches a character other than whitespace followed by a space. So
//! before a space that follows such a character, every scan has just ended a match, and
//! the scan from there on is the same whether or not the text before it is present. BPE
//! then runs within each pre-token. A 2,048-token prompt takes milliseconds to encode in
//! one thread (allocation-heavy regex and byte mapping), which lands directly in the time
//! to first token.

use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

/// Texts shorter than this are encoded whole: below it the threads cost more than they save.
pub const PARALLEL_MIN_BYTES: usize = 2048;
/// The shortest piece worth a task of its own.
const MIN_PIECE_BYTES: usize = 512;

/// About how many bytes each piece of a `len`-byte text gets: one piece per thread.
pub fn piece_bytes(len: usize, threads: usize) -> usize {
    len.div_ceil(threads.max(1)).max(MIN_PIECE_BYTES)
}

/// The pre-tokenizer regexes the cut is exact for: llama.cpp's spellings (the GGUF
/// tokenizers) and HF's tokenizer.json spellings of the same.
const KNOWN_REGEXES: &[&str] = &[
    super::GPT2_RE,
    super::LLAMA3_RE,
    super::QWEN2_RE,
    r"\p{N}",
    r"\p{N}+",
    "[0-9][0-9][0-9]",
    r"[\p{P}\$\+<=>\^~\|]+",
    // Llama 3's tokenizer.json
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    // Qwen2's tokenizer.json
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Whether cutting before a space is exact for this pre-tokenizer: GPT-2's byte-level one
/// (its built-in regex), or known regex splits followed by a byte-level mapping.
pub fn cuttable(pre: Option<&PreTokenizerWrapper>) -> bool {
    match pre {
        Some(PreTokenizerWrapper::ByteLevel(b)) => b.use_regex,
        Some(PreTokenizerWrapper::Sequence(seq)) => {
            let parts: &[PreTokenizerWrapper] = seq.as_ref();
            let splits = parts.iter().filter(|p| known_split(p)).count();
            let mapping = parts
                .iter()
                .all(|p| known_split(p) || matches!(p, PreTokenizerWrapper::ByteLevel(_)));
            splits > 0 && mapping
        }
        _ => false,
    }
}

fn known_split(p: &PreTokenizerWrapper) -> bool {
    let PreTokenizerWrapper::Split(Split {
        pattern: SplitPattern::Regex(re),
        behavior,
        invert,
        ..
    }) = p
    else {
        return false;
    };
    !invert && *behavior == SplitDelimiterBehavior::Isolated && KNOWN_REGEXES.contains(&re.as_str())
}

/// Byte offsets (ascending, none at 0 or the end) at which `text` may be cut: before a
/// space that follows a character other than whitespace, about every `piece` bytes.
pub fn cut_points(text: &str, piece: usize) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut cuts = Vec::new();
    let mut from = piece.max(1);
    while from < bytes.len() {
        let Some(i) = (from..bytes.len()).find(|&i| {
            bytes[i] == b' '
                && text[..i]
                    .chars()
                    .next_back()
                    .is_some_and(|c| !c.is_whitespace())
        }) else {
            break;
        };
        cuts.push(i);
        from = i + piece.max(1);
    }
    cuts
}

/// `text` cut at [`cut_points`] about every `piece` bytes.
pub fn pieces(text: &str, piece: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut from = 0;
    for cut in cut_points(text, piece) {
        out.push(&text[from..cut]);
        from = cut;
    }
    out.push(&text[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_fall_before_a_space_after_a_non_space() {
        let text = "alpha beta  gamma\n delta é epsilon";
        let cuts = cut_points(text, 1);
        assert!(!cuts.is_empty());
        for &i in &cuts {
            assert_eq!(text.as_bytes()[i], b' ');
            assert!(!text[..i].ends_with(char::is_whitespace), "cut at {i}");
        }
        // Not inside the double space nor after the newline.
        assert!(!cuts.contains(&11) && !cuts.contains(&18));
        assert!(cuts.windows(2).all(|w| w[0] < w[1]));
        assert!(cut_points("no_spaces_at_all", 1).is_empty());
        assert!(cut_points("short text", 100).is_empty());
    }

    #[test]
    fn a_piece_per_thread_but_not_too_short() {
        assert_eq!(piece_bytes(8192, 16), 512);
        assert_eq!(piece_bytes(8192, 2), 4096);
        assert_eq!(piece_bytes(3000, 64), MIN_PIECE_BYTES);
        assert_eq!(piece_bytes(3000, 0), 3000);
    }

    #[test]
    fn pieces_are_about_the_asked_size() {
        let text = "word ".repeat(1000);
        let cuts = cut_points(&text, 512);
        assert_eq!(cuts.len(), 9);
        assert!(cuts.iter().all(|&c| c % 5 == 4));
        let pieces = pieces(&text, 512);
        assert_eq!((pieces.len(), pieces.concat()), (10, text.clone()));
        assert!(pieces[1..].iter().all(|p| p.starts_with(" word")));
    }
}
