//! Byte-level BPE encoding without HF `tokenizers`' per-call machinery: the same ids, for
//! the tokenizers whose every step it knows (no normalizer, a pre-tokenizer [`Pretok`]
//! scans, a BPE model without dropout or affixes over all 256 bytes, added tokens without
//! strip or word rules, a post-processor that only adds ids around the text). HF's encode
//! builds offset-aligned strings for every piece and runs a backtracking regex; this runs
//! over the text's bytes once, so a 2,048-token prompt no longer costs milliseconds of its
//! time to first token. Tokenizers it does not know stay on HF's path.
//!
//! Merges follow HF's `Word::merge_all` exactly, a heap of (rank, position) including the
//! way it drops a stale entry: by the merged id alone, which matters for vocabularies (as
//! converted from tiktoken) where two pairs merge into the same token.

use std::collections::BinaryHeap;

use rayon::prelude::*;

use ahash::AHashMap;
use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;
use tokenizers::ModelWrapper;

use super::pretok::Pretok;

/// An id no vocabulary holds, to find where a post-processor puts the text's ids.
const PROBE: u32 = u32::MAX - 7;
const NO_ID: u32 = u32::MAX;

/// Added tokens matched in one pass (HF matches those it does not normalize first, then
/// the others in what is left): leftmost-longest, each pattern's id and whether it is
/// special (skipped when special tokens are read as text).
struct AddedPass {
    trie: AhoCorasick,
    tokens: Vec<(u32, bool)>,
}

pub struct FastBpe {
    pretok: Pretok,
    /// Byte strings of the vocabulary (byte-level characters mapped back to bytes): the
    /// id, and whether merging the string's own bytes gives that one token. Most words of
    /// a text are tokens of the vocabulary, and this spares them their merges (found for
    /// every entry at construction, by the same merges).
    vocab: AHashMap<Box<[u8]>, (u32, bool)>,
    /// (left << 32 | right) -> (rank, merged id).
    merges: AHashMap<u64, (u32, u32)>,
    /// The id of each single byte; [`NO_ID`] for a byte the vocabulary lacks, which HF
    /// drops (a BPE without an unknown token), its neighbours then merging across it.
    bytes: [u32; 256],
    /// A piece found whole in the vocabulary is that id, unmerged (Llama 3).
    ignore_merges: bool,
    passes: Vec<AddedPass>,
    /// What the post-processor puts before and after the text's ids.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
}

impl std::fmt::Debug for FastBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastBpe")
            .field("pretok", &self.pretok)
            .field("vocab", &self.vocab.len())
            .field("merges", &self.merges.len())
            .finish_non_exhaustive()
    }
}

#[inline]
fn pair(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

impl FastBpe {
    /// The fast encoder for `tk`, or why not: a step of its encode this does not
    /// reproduce. `post_process`: whether encode runs the post-processor.
    pub fn new(tk: &tokenizers::Tokenizer, post_process: bool) -> Result<FastBpe, String> {
        if tk.get_normalizer().is_some()
            || tk.get_truncation().is_some()
            || tk.get_padding().is_some()
        {
            return Err("a normalizer, truncation or padding".into());
        }
        let pretok = Pretok::from_hf(tk.get_pre_tokenizer()).ok_or("another pre-tokenizer")?;
        let ModelWrapper::BPE(bpe) = tk.get_model() else {
            return Err("not a BPE model".into());
        };
        if bpe.dropout.is_some()
            || bpe.continuing_subword_prefix.is_some()
            || bpe.end_of_word_suffix.is_some()
        {
            return Err("BPE with dropout or affixes".into());
        }
        // The model's own text-to-id map: every spelling, where two share an id.
        let by_text = bpe.get_vocab();
        let vocab: AHashMap<Box<[u8]>, (u32, bool)> = by_text
            .iter()
            .filter_map(|(t, &id)| {
                Some((super::byte_level_bytes(t)?.into_boxed_slice(), (id, false)))
            })
            .collect();
        let mut bytes = [0u32; 256];
        for (b, slot) in bytes.iter_mut().enumerate() {
            *slot = vocab.get(&[b as u8][..]).map_or(NO_ID, |v| v.0);
        }
        if bytes.contains(&NO_ID) && (bpe.unk_token.is_some() || bpe.byte_fallback) {
            return Err(
                "an unknown token or byte fallback for bytes outside the vocabulary".into(),
            );
        }
        // The merges in rank order: only the model's serialized form lists them.
        let model = serde_json::to_value(bpe).map_err(|e| e.to_string())?;
        let mut merges = AHashMap::default();
        let list = model
            .get("merges")
            .and_then(Value::as_array)
            .ok_or("no merges")?;
        for (rank, m) in list.iter().enumerate() {
            let (a, b) = match m {
                Value::String(s) => s.split_once(' '),
                Value::Array(v) if v.len() == 2 => v[0].as_str().zip(v[1].as_str()),
                _ => None,
            }
            .ok_or_else(|| format!("merge {m}"))?;
            let id = |t: &str| {
                by_text
                    .get(t)
                    .copied()
                    .ok_or_else(|| format!("merge {m}: no {t:?}"))
            };
            merges.insert(pair(id(a)?, id(b)?), (rank as u32, id(&format!("{a}{b}"))?));
        }

        let mut added: Vec<_> = tk.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        if added
            .iter()
            .any(|(_, t)| t.lstrip || t.rstrip || t.single_word)
        {
            return Err("an added token that strips or matches whole words".into());
        }
        let mut passes = Vec::new();
        for normalized in [false, true] {
            let (texts, tokens): (Vec<&str>, Vec<(u32, bool)>) = added
                .iter()
                .filter(|(_, t)| t.normalized == normalized && !t.content.is_empty())
                .map(|(id, t)| (t.content.as_str(), (*id, t.special)))
                .unzip();
            if !texts.is_empty() {
                let trie = AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(&texts)
                    .map_err(|e| e.to_string())?;
                passes.push(AddedPass { trie, tokens });
            }
        }

        let (prefix, suffix) = if post_process {
            let probe = tokenizers::Encoding::from_tokens(
                vec![tokenizers::Token::new(PROBE, String::new(), (0, 0))],
                0,
            );
            let ids = tk
                .post_process(probe, None, true)
                .map_err(|e| e.to_string())?
                .get_ids()
                .to_vec();
            let at = ids.iter().position(|&i| i == PROBE);
            let (Some(at), 1) = (at, ids.iter().filter(|&&i| i == PROBE).count()) else {
                return Err("a post-processor that does more than add ids around the text".into());
            };
            (ids[..at].to_vec(), ids[at + 1..].to_vec())
        } else {
            (Vec::new(), Vec::new())
        };
        let mut fast = FastBpe {
            pretok,
            vocab,
            merges,
            bytes,
            ignore_merges: bpe.ignore_merges,
            passes,
            prefix,
            suffix,
        };
        let whole: Vec<Box<[u8]>> = fast
            .vocab
            .par_iter()
            .map_init(Work::default, |work, (w, &(id, _))| {
                let mut got = Vec::new();
                fast.merge(w, work, &mut got);
                (got == [id]).then(|| w.clone())
            })
            .flatten()
            .collect();
        for w in whole {
            if let Some(entry) = fast.vocab.get_mut(&w) {
                entry.1 = true;
            }
        }
        Ok(fast)
    }

    /// The ids of `text`, with what the post-processor adds. `parse_special`: special
    /// added tokens written in the text are their ids (otherwise plain text).
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut ids = Vec::with_capacity(self.prefix.len() + text.len() / 3 + self.suffix.len());
        ids.extend_from_slice(&self.prefix);
        self.added(0, text, parse_special, &mut Work::default(), &mut ids);
        ids.extend_from_slice(&self.suffix);
        ids
    }

    /// Splits `text` by added-token pass `p` and onwards; what no pass matches is BPE'd.
    fn added(
        &self,
        p: usize,
        text: &str,
        parse_special: bool,
        work: &mut Work,
        ids: &mut Vec<u32>,
    ) {
        let Some(pass) = self.passes.get(p) else {
            return self.plain(text, work, ids);
        };
        let mut from = 0;
        for m in pass.trie.find_iter(text) {
            let (id, special) = pass.tokens[m.pattern().as_usize()];
            if special && !parse_special {
                continue;
            }
            if from < m.start() {
                self.added(p + 1, &text[from..m.start()], parse_special, work, ids);
            }
            ids.push(id);
            from = m.end();
        }
        if from < text.len() {
            self.added(p + 1, &text[from..], parse_special, work, ids);
        }
    }

    fn plain(&self, text: &str, work: &mut Work, ids: &mut Vec<u32>) {
        work.pieces.clear();
        self.pretok.split(text, &mut work.pieces);
        let b = text.as_bytes();
        for i in 0..work.pieces.len() {
            let (s, e) = work.pieces[i];
            self.word(&b[s..e], work, ids);
        }
    }

    /// The ids of one pre-token.
    fn word(&self, w: &[u8], work: &mut Work, ids: &mut Vec<u32>) {
        if let [b] = w {
            let id = self.bytes[*b as usize];
            if id != NO_ID {
                ids.push(id);
            }
            return;
        }
        match self.vocab.get(w) {
            Some(&(id, whole)) if whole || self.ignore_merges => ids.push(id),
            _ => self.merge(w, work, ids),
        }
    }

    /// The merges of one pre-token, as HF's `Word::merge_all` makes them.
    fn merge(&self, w: &[u8], work: &mut Work, ids: &mut Vec<u32>) {
        let Work { syms, queue, .. } = work;
        syms.clear();
        let known = w
            .iter()
            .map(|&b| self.bytes[b as usize])
            .filter(|&id| id != NO_ID);
        syms.extend(known.enumerate().map(|(i, id)| Sym {
            id,
            prev: i as i32 - 1,
            next: i as i32 + 1,
            alive: true,
        }));
        let n = syms.len();
        let Some(last) = syms.last_mut() else { return };
        last.next = -1;
        queue.clear();
        let merge_at = |syms: &[Sym], at: usize, right: usize| {
            let (l, r) = (syms[at].id, syms[right].id);
            self.merges.get(&pair(l, r)).map(|&(rank, new)| Entry {
                rank,
                pos: at as u32,
                new,
                pair: pair(l, r),
            })
        };
        for i in 0..n - 1 {
            if let Some(e) = merge_at(syms, i, i + 1) {
                queue.push(e);
            }
        }
        while let Some(e) = queue.pop() {
            let pos = e.pos as usize;
            if !syms[pos].alive || syms[pos].next < 0 {
                continue;
            }
            let nx = syms[pos].next as usize;
            // A stale entry (its pair changed) still merges if the pair there now makes the
            // same id: HF checks the merged id, not the rank.
            let now = pair(syms[pos].id, syms[nx].id);
            if now != e.pair && self.merges.get(&now).is_none_or(|m| m.1 != e.new) {
                continue;
            }
            syms[pos].id = e.new;
            syms[nx].alive = false;
            let after = syms[nx].next;
            syms[pos].next = after;
            if after >= 0 {
                syms[after as usize].prev = pos as i32;
            }
            let before = syms[pos].prev;
            if before >= 0 {
                if let Some(e) = merge_at(syms, before as usize, pos) {
                    queue.push(e);
                }
            }
            if after >= 0 {
                if let Some(e) = merge_at(syms, pos, after as usize) {
                    queue.push(e);
                }
            }
        }
        ids.extend(syms.iter().filter(|s| s.alive).map(|s| s.id));
    }
}

/// A pending merge: its rank, its left symbol, the id it makes, and the pair as it was.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Entry {
    rank: u32,
    pos: u32,
    new: u32,
    pair: u64,
}

impl Ord for Entry {
    /// Lowest rank first, then leftmost (HF's `Merge` order); `BinaryHeap` pops the
    /// greatest, so reversed.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.rank, other.pos).cmp(&(self.rank, self.pos))
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: i32,
    next: i32,
    alive: bool,
}

/// Buffers one encode reuses across its pieces.
#[derive(Default)]
struct Work {
    pieces: Vec<(usize, usize)>,
    syms: Vec<Sym>,
    /// Pending merges, popped lowest rank first, then leftmost.
    queue: BinaryHeap<Entry>,
}
