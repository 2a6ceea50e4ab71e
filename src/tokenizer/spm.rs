//! SentencePiece vocabularies from GGUF (`tokenizer.ggml.model = "llama"`: Llama-2,
//! Mistral, Gemma, Phi-3), encoded and decoded as llama.cpp's SPM tokenizer does.
//!
//! Encoding: special tokens are split out of the text first (longest text first, as
//! llama.cpp's partition does); each remaining piece of text gets a leading space when
//! `add_space_prefix` holds and it opens the text or follows a special token, has its
//! spaces replaced by `▁`, starts as one symbol per character, and merges, again and
//! again, the adjacent pair whose joined text is a token of the highest score (ties: the
//! leftmost pair). Symbols that are no token come out as byte tokens (`<0xE4>`).
//!
//! Decoding: normal tokens read `▁` as a space, byte tokens are their byte, control,
//! unknown and user-defined tokens their text, unused tokens nothing; [`Spm::pieces`]
//! gives every id's bytes, as llama.cpp's `token_to_piece(special = true)`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use aho_corasick::{AhoCorasick, MatchKind};

use super::{GgufVocab, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED};
use crate::error::{Error, Result};

/// GGUF token types past the ones the byte-level path knows.
const TOKEN_UNUSED: i32 = 5;
const TOKEN_BYTE: i32 = 6;

/// llama.cpp's token attributes (`llama_token_attr`), as bits: a GGUF type gives one, and
/// llama.cpp adds `CONTROL` to end-of-generation tokens of another type.
const ATTR_UNKNOWN: u8 = 1;
const ATTR_UNUSED: u8 = 2;
const ATTR_NORMAL: u8 = 4;
const ATTR_CONTROL: u8 = 8;
const ATTR_USER_DEFINED: u8 = 16;
const ATTR_BYTE: u8 = 32;

/// Texts llama.cpp also treats as end-of-generation tokens in SentencePiece vocabularies,
/// beside the turn ends every vocabulary has (`super::EOG_TEXTS`).
const SPM_EXTRA_EOG_TEXTS: &[&str] = &["</s>", "<eos>", "_<EOT>", "<end_of_utterance>"];

/// Whether llama.cpp treats `text` as an end-of-generation token in a SentencePiece
/// vocabulary, making it a control token whatever its GGUF type (Phi-3's `</s>` is
/// user-defined).
pub(super) fn is_spm_eog(text: &str) -> bool {
    super::EOG_TEXTS.contains(&text) || SPM_EXTRA_EOG_TEXTS.contains(&text)
}

/// `▁` (U+2581), SentencePiece's visible space.
const SPACE_MARK: &str = "\u{2581}";

/// A token that [`Spm::encode`] splits out of the text before merging.
#[derive(Debug)]
struct Special {
    id: u32,
    text: Box<str>,
    /// Control or unknown: split out only when special tokens are parsed (user-defined
    /// tokens always are).
    control: bool,
    /// Whitespace before the token is dropped.
    lstrip: bool,
    /// Whitespace after the token is dropped (Phi-3's tokens).
    rstrip: bool,
}

/// A SentencePiece vocabulary and llama.cpp's SPM encoder over it.
#[derive(Debug)]
pub(super) struct Spm {
    /// Every token's text (control and byte tokens too), as llama.cpp looks merges up.
    ids: ahash::AHashMap<Box<str>, u32>,
    texts: Vec<Box<str>>,
    scores: Vec<f32>,
    attrs: Vec<u8>,
    /// The token each byte falls back to: `<0xXX>`, else the byte's own one-char token.
    byte_ids: [Option<u32>; 256],
    add_space_prefix: bool,
    /// Longest text first: the order llama.cpp splits them out in.
    specials: Vec<Special>,
    /// Finds which of `specials` occur in a text, so only those are split for.
    finder: Option<AhoCorasick>,
}

impl Spm {
    /// The vocabulary of a `llama` GGUF, with llama.cpp's reading of its types: the
    /// `tokenizer.ggml.add_space_prefix` flag (default on), end-of-generation texts made
    /// control tokens, and Phi-3's special tokens taking no whitespace after them.
    pub(super) fn new(v: &GgufVocab) -> Result<Spm> {
        let n = v.tokens.len();
        if v.token_types.len() != n {
            return Err(Error::Tokenizer(format!(
                "{n} tokens but {} token types",
                v.token_types.len()
            )));
        }
        if !v.scores.is_empty() && v.scores.len() < n {
            return Err(Error::Tokenizer(format!(
                "{n} tokens but {} scores",
                v.scores.len()
            )));
        }
        // llama.cpp names an empty token text so that it can never match.
        let texts: Vec<Box<str>> = v
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| match t.is_empty() {
                true => format!("[EMPTY_{i}]").into(),
                false => t.as_str().into(),
            })
            .collect();
        let mut attrs: Vec<u8> = v
            .token_types
            .iter()
            .map(|&ty| match ty {
                TOKEN_NORMAL => ATTR_NORMAL,
                TOKEN_UNKNOWN => ATTR_UNKNOWN,
                TOKEN_CONTROL => ATTR_CONTROL,
                TOKEN_USER_DEFINED => ATTR_USER_DEFINED,
                TOKEN_UNUSED => ATTR_UNUSED,
                TOKEN_BYTE => ATTR_BYTE,
                _ => 0,
            })
            .collect();
        for (attr, text) in attrs.iter_mut().zip(&texts) {
            if is_spm_eog(text) {
                *attr |= ATTR_CONTROL;
            }
        }
        let mut ids = ahash::AHashMap::with_capacity(n);
        for (text, id) in texts.iter().zip(0u32..) {
            ids.insert(text.clone(), id);
        }
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let own = (b < 0x80).then(|| char::from(b as u8).to_string());
            *slot = ids
                .get(format!("<0x{b:02X}>").as_str())
                .or_else(|| ids.get(own?.as_str()))
                .copied();
        }

        // Phi-3's GGUFs are known by name: llama.cpp strips the whitespace after their
        // special tokens, except after <unk>, <s> and <|endoftext|>.
        let name = v.general_name.as_deref().unwrap_or("").to_lowercase();
        let phi3 = name.contains("phi-3") || name.contains("phi3");
        let mut specials: Vec<Special> = texts
            .iter()
            .zip(&attrs)
            .zip(0u32..)
            .filter(|((_, &a), _)| a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0)
            .map(|((text, &a), id)| Special {
                id,
                text: text.clone(),
                control: a & (ATTR_CONTROL | ATTR_UNKNOWN) != 0,
                lstrip: false,
                rstrip: phi3 && !matches!(&**text, "<unk>" | "<s>" | "<|endoftext|>"),
            })
            .collect();
        specials.sort_by_key(|s| (std::cmp::Reverse(s.text.len()), s.id));
        let finder = match specials.is_empty() {
            true => None,
            false => Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::Standard)
                    .build(specials.iter().map(|s| s.text.as_bytes()))
                    .map_err(|e| Error::Tokenizer(format!("special tokens: {e}")))?,
            ),
        };
        Ok(Spm {
            ids,
            scores: match v.scores.is_empty() {
                true => vec![0.0; n],
                false => v.scores[..n].to_vec(),
            },
            texts,
            attrs,
            byte_ids,
            add_space_prefix: v.add_space_prefix.unwrap_or(true),
            specials,
            finder,
        })
    }

    /// Whether decoding strips one leading space from the first token's text (llama.cpp's
    /// detokenize does when the vocabulary adds a space prefix).
    pub(super) fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// The id of a token's text (`▁the`, `<0x0A>`, `<s>`).
    pub(super) fn token_to_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Control and unknown tokens: what `decode(skip_special = true)` drops.
    pub(super) fn special_flags(&self) -> Vec<bool> {
        self.attrs
            .iter()
            .map(|a| a & (ATTR_CONTROL | ATTR_UNKNOWN) != 0)
            .collect()
    }

    /// Every id's bytes, as llama.cpp's `token_to_piece(special = true)` gives them.
    pub(super) fn pieces(&self) -> Vec<Box<[u8]>> {
        self.texts
            .iter()
            .zip(&self.attrs)
            .map(|(text, &attr)| {
                if attr & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED) != 0 {
                    text.as_bytes().into()
                } else if attr & ATTR_NORMAL != 0 {
                    text.replace(SPACE_MARK, " ").into_bytes().into()
                } else if attr & ATTR_BYTE != 0 {
                    vec![byte_token_value(text)].into_boxed_slice()
                } else {
                    Box::default()
                }
            })
            .collect()
    }

    /// Text to ids (no BOS). `parse_special`: control tokens written in the text become
    /// their ids; user-defined tokens always do.
    pub(super) fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        // llama.cpp prefixes a space to text that opens the input or follows a special token.
        let mut after_special = true;
        let mut piece = String::new();
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(start, end) => {
                    piece.clear();
                    if self.add_space_prefix && after_special {
                        piece.push_str(SPACE_MARK);
                    }
                    for c in text[start..end].chars() {
                        match c {
                            ' ' => piece.push_str(SPACE_MARK),
                            c => piece.push(c),
                        }
                    }
                    self.merge(&piece, &mut out)?;
                    after_special = false;
                }
            }
        }
        Ok(out)
    }

    /// Splits the special tokens out of `text` as llama.cpp's `tokenizer_st_partition`:
    /// for each special token, longest text first, every occurrence in each piece of text
    /// left so far, from the left, becomes a token, with the text around it kept (less the
    /// whitespace the token strips).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(0, text.len()));
        let Some(finder) = &self.finder else {
            return fragments;
        };
        let mut present = vec![false; self.specials.len()];
        for m in finder.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }
        let bytes = text.as_bytes();
        for (special, _) in self.specials.iter().zip(&present).filter(|(_, &p)| p) {
            if special.control && !parse_special {
                continue;
            }
            let needle = &*special.text;
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut start, end) = fragment else {
                    next.push(fragment);
                    continue;
                };
                while let Some(at) = text[start..end].find(needle).map(|i| start + i) {
                    let mut left_end = at;
                    if special.lstrip {
                        while left_end > start && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start, left_end));
                    }
                    next.push(Fragment::Token(special.id));
                    start = at + needle.len();
                    if special.rstrip {
                        while start < end && is_c_space(bytes[start]) {
                            start += 1;
                        }
                    }
                }
                if start < end {
                    next.push(Fragment::Text(start, end));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// llama.cpp's SPM merge of one escaped piece of text, ids appended to `out`.
    fn merge(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let i = symbols.len();
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: Some(i + 1).filter(|_| start + c.len_utf8() < text.len()),
            });
        }
        let mut queue = BinaryHeap::new();
        for left in 1..symbols.len() {
            self.push_bigram(text, &symbols, left - 1, left, &mut queue);
        }
        while let Some(bigram) = queue.pop() {
            let (l, r) = (&symbols[bigram.left], &symbols[bigram.right]);
            // Either side already merged into something else: a stale pair.
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue;
            }
            let right_next = r.next;
            symbols[bigram.left].len += symbols[bigram.right].len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = right_next;
            if let Some(after) = right_next {
                symbols[after].prev = Some(bigram.left);
            }
            if let Some(before) = symbols[bigram.left].prev {
                self.push_bigram(text, &symbols, before, bigram.left, &mut queue);
            }
            if let Some(after) = right_next {
                self.push_bigram(text, &symbols, bigram.left, after, &mut queue);
            }
        }
        let mut at = Some(0).filter(|_| !symbols.is_empty());
        while let Some(i) = at {
            let s = &symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        out.push(self.byte_ids[b as usize].ok_or_else(|| {
                            Error::Tokenizer(format!("no byte token for 0x{b:02X}"))
                        })?);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    /// Queues the merge of two adjacent symbols when their joined text is a token.
    fn push_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (l, r) = (&symbols[left], &symbols[right]);
        let joined = &text[l.start..r.start + r.len];
        if let Some(&id) = self.ids.get(joined) {
            queue.push(Bigram {
                score: self.scores[id as usize],
                left,
                right,
                size: joined.len(),
            });
        }
    }
}

/// A piece of the input: text (a byte range) still to merge, or a special token's id.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// One symbol of the merge: a byte range of the escaped text, linked to its neighbours;
/// `len` 0 once merged into the symbol before it.
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: the higher score first, then the leftmost.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Bytes of the joined text when queued: a pair whose sides changed since is stale.
    size: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // As llama.cpp's comparator: scores compare as floats (-0 == 0, NaN equal to all).
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// C's `isspace` in the "C" locale, which llama.cpp strips around special tokens with.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// A byte token's value: the hex digits after `<0x`, read as C's `strtol` reads them
/// (the leading hex digits of two characters; 0 when there are none).
fn byte_token_value(text: &str) -> u8 {
    let digits = text.get(3..5).unwrap_or("");
    let hex: String = digits.chars().take_while(char::is_ascii_hexdigit).collect();
    u8::from_str_radix(&hex, 16).unwrap_or(0)
}
