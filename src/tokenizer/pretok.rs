//! The byte-level pre-tokenizers' regexes as hand-written scanners: GPT-2's, Llama 3's and
//! Qwen2's (HF's and llama.cpp's spellings), and SmolLM's digits-then-GPT-2. Each gives
//! exactly the pieces HF `tokenizers` cuts with the regex (fancy-regex, leftmost-first
//! alternatives with backtracking), at a fraction of the cost; the character classes come
//! from the same Unicode tables the regexes read (`regex-syntax`).
//!
//! The scanners follow the alternatives in order. The one with a look-ahead, `\s+(?!\S)`,
//! matches a run of whitespace whole at the end of the text, and otherwise all of it but
//! its last character (which then leads the next piece), or nothing when the run is one
//! character long.

use std::sync::LazyLock;

use regex_syntax::hir::{Class, Hir, HirKind};
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

/// HF's GPT-2 byte-level regex (`ByteLevel` with `use_regex`); llama.cpp's spelling lacks
/// the final `|\s+`, whose matches Split then yields as the gaps between matches.
const HF_GPT2_RE: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's and Qwen2's regexes as their tokenizer.json files spell them: the
/// contractions match case-insensitively, by Unicode simple case folding.
pub(super) const HF_LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(super) const HF_QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a text is cut into pre-tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pretok {
    /// GPT-2's regex.
    Gpt2,
    /// Every digit alone first, then GPT-2's regex within the rest (SmolLM): digits as the
    /// regex `\p{N}` reads them (llama.cpp's spelling), or, with `std_numeric`, as HF's
    /// `Digits` pre-tokenizer does (`char::is_numeric`, the tokenizer.json spelling).
    DigitsThenGpt2 { std_numeric: bool },
    /// Llama 3's regex, with numbers of up to `digits` digits (Qwen2: 1); `fold`: the
    /// contractions' letters match by case folding (HF's `(?i:...)`) rather than in their
    /// two ASCII cases (llama.cpp's `'[sS]`).
    Llama3 { digits: usize, fold: bool },
}

/// How a contraction's letters match: GPT-2's in lower case only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Lower,
    Ascii,
    Fold,
}

impl Pretok {
    /// The scanner for a tokenizer's pre-tokenizer: byte-level (the mapping last, without
    /// a prefix space) behind one of the regexes above, split off whole ("isolated").
    pub fn from_hf(pre: Option<&PreTokenizerWrapper>) -> Option<Pretok> {
        match pre? {
            PreTokenizerWrapper::ByteLevel(b) if b.use_regex && !b.add_prefix_space => {
                Some(Pretok::Gpt2)
            }
            PreTokenizerWrapper::Sequence(seq) => {
                let parts: &[PreTokenizerWrapper] = seq.as_ref();
                if let [PreTokenizerWrapper::Digits(d), PreTokenizerWrapper::ByteLevel(b)] = parts {
                    return (d.individual_digits && b.use_regex && !b.add_prefix_space)
                        .then_some(Pretok::DigitsThenGpt2 { std_numeric: true });
                }
                let (last, splits) = parts.split_last()?;
                match last {
                    PreTokenizerWrapper::ByteLevel(b) if !b.use_regex && !b.add_prefix_space => {}
                    _ => return None,
                }
                let res = splits
                    .iter()
                    .map(isolated_regex)
                    .collect::<Option<Vec<_>>>()?;
                match res.as_slice() {
                    [re] if *re == super::GPT2_RE || *re == HF_GPT2_RE => Some(Pretok::Gpt2),
                    [d, re] if *d == r"\p{N}" && (*re == super::GPT2_RE || *re == HF_GPT2_RE) => {
                        Some(Pretok::DigitsThenGpt2 { std_numeric: false })
                    }
                    [re] if *re == super::LLAMA3_RE || *re == HF_LLAMA3_RE => {
                        Some(Pretok::Llama3 {
                            digits: 3,
                            fold: *re == HF_LLAMA3_RE,
                        })
                    }
                    [re] if *re == super::QWEN2_RE || *re == HF_QWEN2_RE => Some(Pretok::Llama3 {
                        digits: 1,
                        fold: *re == HF_QWEN2_RE,
                    }),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// Appends the byte ranges of `text`'s pre-tokens, in order, to `out`; together they
    /// cover the text.
    pub fn split(self, text: &str, out: &mut Vec<(usize, usize)>) {
        let s = Scan {
            t: text,
            c: &CLASSES,
        };
        match self {
            Pretok::Gpt2 => s.gpt2(0, text.len(), out),
            Pretok::DigitsThenGpt2 { std_numeric } => {
                let mut from = 0;
                let mut i = 0;
                while i < text.len() {
                    let (c, n) = s.char_at(i);
                    let digit = if std_numeric {
                        c.is_numeric()
                    } else {
                        s.c.class(c) == NUMBER
                    };
                    if digit {
                        s.gpt2(from, i, out);
                        out.push((i, i + n));
                        from = i + n;
                    }
                    i += n;
                }
                s.gpt2(from, text.len(), out);
            }
            Pretok::Llama3 { digits, fold } => {
                let mut i = 0;
                while i < text.len() {
                    let end = s.llama3_at(i, digits, fold);
                    out.push((i, end));
                    i = end;
                }
            }
        }
    }
}

fn isolated_regex(p: &PreTokenizerWrapper) -> Option<&str> {
    match p {
        PreTokenizerWrapper::Split(Split {
            pattern: SplitPattern::Regex(re),
            behavior: SplitDelimiterBehavior::Isolated,
            invert: false,
            ..
        }) => Some(re.as_str()),
        _ => None,
    }
}

const LETTER: u8 = 1;
const NUMBER: u8 = 2;
const SPACE: u8 = 3;
const OTHER: u8 = 4;

/// `\p{L}`, `\p{N}` and `\s` as regex-syntax defines them, and the case-folding sets of the
/// contractions' letters.
struct Classes {
    ascii: [u8; 128],
    letter: Vec<(char, char)>,
    number: Vec<(char, char)>,
    space: Vec<(char, char)>,
    /// For each of `s t r e v m l d`, every character `(?i)` matches it to.
    folds: Vec<(char, Vec<char>)>,
}

static CLASSES: LazyLock<Classes> = LazyLock::new(Classes::new);

fn ranges(re: &str) -> Vec<(char, char)> {
    let hir: Hir = regex_syntax::parse(re).expect("a Unicode class");
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => {
            c.ranges().iter().map(|r| (r.start(), r.end())).collect()
        }
        other => unreachable!("{re} parsed to {other:?}"),
    }
}

fn within(ranges: &[(char, char)], c: char) -> bool {
    let i = ranges.partition_point(|&(_, hi)| hi < c);
    ranges.get(i).is_some_and(|&(lo, _)| lo <= c)
}

impl Classes {
    fn new() -> Classes {
        let mut c = Classes {
            ascii: [0; 128],
            letter: ranges(r"\p{L}"),
            number: ranges(r"\p{N}"),
            space: ranges(r"\s"),
            folds: "strevmld"
                .chars()
                .map(|l| {
                    let set = ranges(&format!("(?i:{l})"));
                    (l, set.iter().flat_map(|&(a, b)| a..=b).collect())
                })
                .collect(),
        };
        for b in 0..128u8 {
            c.ascii[b as usize] = c.slow_class(b as char);
        }
        c
    }

    fn slow_class(&self, c: char) -> u8 {
        if within(&self.letter, c) {
            LETTER
        } else if within(&self.number, c) {
            NUMBER
        } else if within(&self.space, c) {
            SPACE
        } else {
            OTHER
        }
    }

    #[inline]
    fn class(&self, c: char) -> u8 {
        if (c as u32) < 128 {
            self.ascii[c as usize]
        } else {
            self.slow_class(c)
        }
    }

    /// Whether `c` matches contraction letter `l` (lowercase ASCII).
    fn matches(&self, l: char, c: char, case: Case) -> bool {
        match case {
            Case::Lower => return c == l,
            Case::Ascii => return c == l || c == l.to_ascii_uppercase(),
            Case::Fold => {}
        }
        self.folds
            .iter()
            .find(|(k, _)| *k == l)
            .is_some_and(|(_, set)| set.contains(&c))
    }
}

struct Scan<'a> {
    t: &'a str,
    c: &'a Classes,
}

impl Scan<'_> {
    /// The character at byte `i` (a char boundary, `i < len`) and its length in bytes.
    #[inline]
    fn char_at(&self, i: usize) -> (char, usize) {
        let b = self.t.as_bytes()[i];
        if b < 0x80 {
            return (b as char, 1);
        }
        let c = self.t[i..].chars().next().expect("a char");
        (c, c.len_utf8())
    }

    /// The class of the character at `i`, or 0 at or past `end`.
    #[inline]
    fn class_at(&self, i: usize, end: usize) -> u8 {
        if i >= end {
            0
        } else {
            self.c.class(self.char_at(i).0)
        }
    }

    /// The end of the run of class `k` from `i` (within `end`).
    #[inline]
    fn run(&self, mut i: usize, end: usize, k: u8) -> usize {
        while i < end {
            let (c, n) = self.char_at(i);
            if self.c.class(c) != k {
                break;
            }
            i += n;
        }
        i
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` after the apostrophe at `i`: the match's end.
    fn contraction(&self, i: usize, end: usize, case: Case) -> Option<usize> {
        let next = |at: usize| (at < end).then(|| self.char_at(at));
        let (c1, n1) = next(i + 1)?;
        for l in ['s', 't', 'm', 'd'] {
            if self.c.matches(l, c1, case) {
                return Some(i + 1 + n1);
            }
        }
        let (c2, n2) = next(i + 1 + n1)?;
        for (a, b) in [('r', 'e'), ('v', 'e'), ('l', 'l')] {
            if self.c.matches(a, c1, case) && self.c.matches(b, c2, case) {
                return Some(i + 1 + n1 + n2);
            }
        }
        None
    }

    /// `\s+(?!\S)|\s+` at the whitespace at `i`, within `end`.
    fn whitespace(&self, i: usize, end: usize) -> usize {
        let j = self.run(i, end, SPACE);
        if j == end {
            return j;
        }
        // The run's last character starts the next piece, if the run has another.
        let last = self.t[..j]
            .char_indices()
            .next_back()
            .map_or(i, |(at, _)| at);
        if last > i {
            last
        } else {
            j
        }
    }

    /// GPT-2's pieces of `t[from..end]`, the end being the text's for the look-ahead.
    fn gpt2(&self, from: usize, end: usize, out: &mut Vec<(usize, usize)>) {
        let mut i = from;
        while i < end {
            let (c, n) = self.char_at(i);
            let stop = if c == '\'' {
                self.contraction(i, end, Case::Lower)
            } else {
                None
            };
            let stop = stop.unwrap_or_else(|| {
                let k = self.c.class(c);
                let (at, k) = match (c, self.class_at(i + n, end)) {
                    (' ', next) if next != SPACE && next != 0 => (i + n, next),
                    _ => (i, k),
                };
                if k == SPACE {
                    self.whitespace(i, end)
                } else {
                    self.run(at, end, k)
                }
            });
            out.push((i, stop));
            i = stop;
        }
    }

    /// The end of Llama 3's piece at `i`.
    fn llama3_at(&self, i: usize, digits: usize, fold: bool) -> usize {
        let end = self.t.len();
        let (c, n) = self.char_at(i);
        if c == '\'' {
            let case = if fold { Case::Fold } else { Case::Ascii };
            if let Some(stop) = self.contraction(i, end, case) {
                return stop;
            }
        }
        let k = self.c.class(c);
        let next = self.class_at(i + n, end);
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if k == LETTER {
            return self.run(i + n, end, LETTER);
        }
        if k != NUMBER && c != '\r' && c != '\n' && next == LETTER {
            return self.run(i + n, end, LETTER);
        }
        // \p{N}{1,digits}
        if k == NUMBER {
            let mut j = i + n;
            for _ in 1..digits {
                if self.class_at(j, end) != NUMBER {
                    break;
                }
                j += self.char_at(j).1;
            }
            return j;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let other = if k == OTHER {
            Some(i)
        } else if c == ' ' && next == OTHER {
            Some(i + n)
        } else {
            None
        };
        if let Some(at) = other {
            let mut j = self.run(at, end, OTHER);
            while j < end && matches!(self.t.as_bytes()[j], b'\r' | b'\n') {
                j += 1;
            }
            return j;
        }
        // Whitespace: `\s*[\r\n]+` ends after the run's last line break, if any.
        let j = self.run(i, end, SPACE);
        if let Some(last) = self.t.as_bytes()[i..j]
            .iter()
            .rposition(|&b| b == b'\r' || b == b'\n')
        {
            return i + last + 1;
        }
        self.whitespace(i, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(p: Pretok, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        p.split(text, &mut out);
        out.iter().map(|&(a, b)| &text[a..b]).collect()
    }

    #[test]
    fn gpt2_pieces() {
        assert_eq!(
            pieces(Pretok::Gpt2, "Hello  world's 42!!\n\nok "),
            ["Hello", " ", " world", "'s", " 42", "!!", "\n", "\n", "ok", " "]
        );
        assert_eq!(pieces(Pretok::Gpt2, "a\nb"), ["a", "\n", "b"]);
        assert_eq!(
            pieces(Pretok::DigitsThenGpt2 { std_numeric: false }, "a 123b"),
            ["a", " ", "1", "2", "3", "b"]
        );
    }

    #[test]
    fn llama3_pieces() {
        let l3 = Pretok::Llama3 {
            digits: 3,
            fold: true,
        };
        assert_eq!(
            pieces(l3, "I'M here:\t12345 (ok)\r\n\n  x"),
            ["I", "'M", " here", ":", "\t", "123", "45", " (", "ok", ")\r\n\n", " ", " x"]
        );
        // U+017F folds to 's', so the case-folding spelling takes it as a contraction.
        assert_eq!(pieces(l3, "it'\u{17F}x"), ["it", "'\u{17F}", "x"]);
        let spelled = Pretok::Llama3 {
            digits: 3,
            fold: false,
        };
        assert_eq!(pieces(spelled, "it'\u{17F}"), ["it", "'\u{17F}"]);
        assert_eq!(pieces(spelled, "it'\u{17F}x"), ["it", "'\u{17F}x"]);
    }
}
