//! The fast encoder ([`super::bpe`], [`super::pretok`]) against HF `tokenizers` on the same
//! tokenizers: every id equal, over texts built to reach each regex alternative's edges,
//! added tokens, both readings of special tokens, and merges that reach one token two ways.

use serde_json::{json, Value};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::Trainer;

use super::pretok::Pretok;
use super::*;

const CORPUS: &str = "The quick brown fox jumps over the lazy dog. It's 2024, and we'll see \
    what they've done: 3.14159 isn't 22/7! Don't you think? I'M SURE THEY'RE RIGHT.\n\n\
    fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n\
    Über naïve café façade — résumé; 東京 is 日本's capital. Привет, мир! 123456789 \
    numbers 0001 and ٣٤٥ and ½ and ①②. Tabs\there\tand  double  spaces   triple.\r\n\
    Emoji 😀😀 and 👍🏽 mixed with text_with_underscores and CamelCaseWords. \
    \"Quoted\" 'single' (parens) [brackets] {braces} <angle> #hash @at $dollar %pct ^caret \
    &amp *star +plus =eq |pipe ~tilde `tick`. ";

/// Fragments the random texts are made of: every class the scanners tell apart, the
/// contractions in each case (and U+017F, which folds to 's'), line breaks alone and in
/// runs, Unicode spaces, combining marks, and the added tokens.
const FRAGMENTS: &[&str] = &[
    "a",
    "Z",
    "é",
    "ſ",
    "ǅ",
    "ʰ",
    "\u{301}",
    "中",
    "文",
    "😀",
    "'",
    "'s",
    "'S",
    "'ll",
    "'LL",
    "'re",
    "'vE",
    "'d",
    "'m",
    "'t",
    "'x",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\r",
    "\r\n",
    "\n\n",
    " \n",
    "\u{a0}",
    "\u{2028}",
    "\u{3000}",
    "1",
    "23",
    "4567",
    "٣",
    "½",
    "Ⅻ",
    "!",
    "?",
    "(",
    ")",
    "...",
    "\"",
    "_",
    "-",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<tool>",
    "mid word",
    "<|im",
    "hello",
    " world",
    "quick",
    " the",
    "The",
    " It's",
    "don't",
    "fox",
    // Pieces longer than the merge queue's short list (its heap).
    "abcdefghijklmnopqrstuvwxyzabcdefghijklm",
    "😀😀😀😀😀😀😀😀😀😀",
    "                                        ",
    // A byte one vocabulary lacks, and a token no merge makes (see `from_gguf`).
    "\u{1}",
    " zzqx",
];

fn texts(seed: u64, n: usize) -> Vec<String> {
    let mut k = seed;
    let mut next = move || {
        k = k
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (k >> 33) as usize
    };
    let mut out: Vec<String> = (0..n)
        .map(|_| {
            let len = next() % 24;
            (0..len)
                .map(|_| FRAGMENTS[next() % FRAGMENTS.len()])
                .collect()
        })
        .collect();
    out.push(String::new());
    out.push(CORPUS.repeat(3));
    out
}

/// A byte-level BPE trained on [`CORPUS`] (HF's trainer), as a vocabulary and merges, with
/// extra merges that reach an existing token a second way (as vocabularies converted
/// from tiktoken have).
fn trained() -> (Vec<String>, Vec<(String, String)>) {
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(700)
        .min_frequency(1)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let chars = byte_to_char();
    let words = |s: &str| -> tokenizers::Result<Vec<String>> {
        let mut pieces = Vec::new();
        Pretok::Llama3 {
            digits: 3,
            fold: true,
        }
        .split(s, &mut pieces);
        Ok(pieces
            .iter()
            .map(|&(a, b)| {
                s.as_bytes()[a..b]
                    .iter()
                    .map(|&x| chars[x as usize])
                    .collect()
            })
            .collect())
    };
    trainer.feed(CORPUS.lines(), words).unwrap();
    let mut model = BPE::default();
    trainer.train(&mut model).unwrap();
    let v = serde_json::to_value(&model).unwrap();
    let mut vocab: Vec<(String, u64)> = v["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(t, id)| (t.clone(), id.as_u64().unwrap()))
        .collect();
    vocab.sort_by_key(|(_, id)| *id);
    let vocab: Vec<String> = vocab.into_iter().map(|(t, _)| t).collect();
    let mut merges: Vec<(String, String)> = v["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => {
                let (a, b) = s.split_once(' ').unwrap();
                (a.to_owned(), b.to_owned())
            }
            m => (m[0].as_str().unwrap().into(), m[1].as_str().unwrap().into()),
        })
        .collect();
    assert!(merges.len() > 300, "{}", merges.len());
    let known: std::collections::HashSet<&str> = vocab.iter().map(String::as_str).collect();
    let pairs: std::collections::HashSet<(String, String)> = merges.iter().cloned().collect();
    let mut extra = Vec::new();
    for (a, b) in &merges {
        let whole: Vec<char> = format!("{a}{b}").chars().collect();
        for cut in 1..whole.len() {
            let (c, d): (String, String) =
                (whole[..cut].iter().collect(), whole[cut..].iter().collect());
            if known.contains(c.as_str())
                && known.contains(d.as_str())
                && !pairs.contains(&(c.clone(), d.clone()))
            {
                extra.push((c, d));
            }
        }
    }
    assert!(extra.len() >= 5, "{}", extra.len());
    merges.extend(extra);
    (vocab, merges)
}

const ADDED: &[(&str, bool, bool)] = &[
    // content, special, normalized
    ("<|begin_of_text|>", true, false),
    ("<|im_start|>", true, false),
    ("<|im_end|>", true, false),
    ("<tool>", false, false),
    ("mid word", false, true),
    ("<|im", false, true),
];

fn split(re: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false})
}

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

/// What the post-processor adds around the text's ids.
#[derive(Clone, Copy, PartialEq)]
enum Post {
    /// Nothing (byte-level).
    Nothing,
    /// BOS before (Llama 3's template).
    Bos,
    /// `<|im_end|>` after.
    ImEnd,
}

/// An HF tokenizer.json over the trained vocabulary, loaded through `from_files`.
fn from_json(pre: Value, ignore_merges: bool, post: Post) -> Tokenizer {
    let (vocab, merges) = trained();
    let n = vocab.len();
    let vocab: serde_json::Map<String, Value> = vocab
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, json!(i)))
        .collect();
    let added: Vec<Value> = ADDED
        .iter()
        .enumerate()
        .map(|(i, &(content, special, normalized))| {
            json!({"id": n + i, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": normalized, "special": special})
        })
        .collect();
    let template = |name: &str, id: usize, before: bool| {
        let special = json!({"SpecialToken": {"id": name, "type_id": 0}});
        let text = json!({"Sequence": {"id": "A", "type_id": 0}});
        let single = if before {
            [special, text]
        } else {
            [text, special]
        };
        json!({"type": "TemplateProcessing", "single": single,
               "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
               "special_tokens": {name: {"id": name, "ids": [id], "tokens": [name]}}})
    };
    let post = match post {
        Post::Nothing => byte_level(true),
        Post::Bos => template("<|begin_of_text|>", n, true),
        Post::ImEnd => template("<|im_end|>", n + 2, false),
    };
    let merges: Vec<Value> = merges.into_iter().map(|(a, b)| json!([a, b])).collect();
    let doc = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": pre, "post_processor": post,
        "decoder": byte_level(true),
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
                  "vocab": vocab, "merges": merges},
    });
    let dir = std::env::temp_dir().join(format!(
        "inflight-fast-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    let tok = Tokenizer::from_files(&path, None).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    tok
}

/// A GGUF vocabulary over the trained BPE, with byte 0x01 missing (HF drops it from the
/// text, its neighbours merging across it) and a token no merge makes (" zzqx": its own
/// merges split it, unless the pre-tokenizer ignores merges for whole words).
fn from_gguf(pre: &str) -> Tokenizer {
    let (mut tokens, merges) = trained();
    let missing = byte_to_char()[1].to_string();
    let slot = tokens
        .iter()
        .position(|t| *t == missing)
        .expect("byte 0x01");
    tokens[slot] = "<unused-0x01>".into();
    let merges: Vec<_> = merges
        .into_iter()
        .filter(|(a, b)| !a.contains(&missing) && !b.contains(&missing))
        .collect();
    tokens.push(format!("{}zzqx", byte_to_char()[b' ' as usize]));
    let mut token_types = vec![TOKEN_NORMAL; tokens.len()];
    for &(content, special, _) in ADDED {
        tokens.push(content.into());
        token_types.push(if special {
            TOKEN_CONTROL
        } else {
            TOKEN_USER_DEFINED
        });
    }
    Tokenizer::from_gguf_vocab(&GgufVocab {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types,
        merges: merges.iter().map(|(a, b)| format!("{a} {b}")).collect(),
        bos_token_id: Some(0),
        eos_token_id: Some(1),
        ..GgufVocab::default()
    })
    .unwrap()
}

/// Every text gives HF's ids on the fast path, reading special tokens both ways.
fn assert_parity(name: &str, tok: &Tokenizer) {
    if let Err(why) = bpe::FastBpe::new(&tok.hf().inner, tok.hf().post_process) {
        panic!("{name}: no fast path: {why}");
    }
    assert!(tok.hf().fast.is_some(), "{name}");
    let seed = name
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    let mut merged = 0;
    for text in texts(seed, 3000) {
        for special in [true, false] {
            let hf = tok.encode_hf(&text, special, false).unwrap();
            let fast = tok.encode(&text, special).unwrap();
            assert_eq!(fast, hf, "{name}, parse_special {special}, text {text:?}");
            merged += hf
                .iter()
                .filter(|&&id| tok.token_bytes(id).is_some_and(|b| b.len() > 1))
                .count();
        }
    }
    assert!(merged > 1000, "{name}: only {merged} merged ids");
}

#[test]
fn llama3_and_qwen2_tokenizer_json() {
    let l3 = super::pretok::HF_LLAMA3_RE;
    let q2 = super::pretok::HF_QWEN2_RE;
    let tok = from_json(
        json!({"type": "Sequence", "pretokenizers": [split(l3), byte_level(false)]}),
        true,
        Post::Bos,
    );
    assert_eq!(
        tok.encode("", false).unwrap(),
        vec![tok.vocab_size() as u32 - ADDED.len() as u32]
    );
    assert_parity("llama3.json", &tok);
    let tok = from_json(
        json!({"type": "Sequence", "pretokenizers": [split(q2), byte_level(false)]}),
        false,
        Post::ImEnd,
    );
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert_eq!(tok.encode("", false).unwrap(), vec![im_end]);
    assert_parity("qwen2.json", &tok);
}

#[test]
fn gpt2_byte_level_tokenizer_json() {
    assert_parity(
        "gpt2.json",
        &from_json(byte_level(true), false, Post::Nothing),
    );
    assert_parity(
        "gpt2.json, ignore_merges",
        &from_json(byte_level(true), true, Post::Nothing),
    );
    // SmolLM2's tokenizer.json: HF's Digits pre-tokenizer, then GPT-2's.
    let digits = json!({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true}, byte_level(true)]});
    let tok = from_json(digits, false, Post::Nothing);
    assert_eq!(tok.encode("123", false).unwrap().len(), 3);
    assert_parity("smollm.json", &tok);
}

#[test]
fn gguf_pre_tokenizers() {
    for pre in ["gpt-2", "smollm", "llama3", "qwen2"] {
        let tok = from_gguf(pre);
        // The missing byte is dropped; the token no merge makes is one id only where
        // whole words skip the merges.
        assert_eq!(
            tok.encode("\u{1}", false).unwrap(),
            Vec::<u32>::new(),
            "{pre}"
        );
        let zzqx = tok.encode(" zzqx", false).unwrap();
        assert_eq!(zzqx.len() == 1, pre == "llama3", "{pre}: {zzqx:?}");
        assert_parity(pre, &tok);
    }
    // llama.cpp's default runs four regexes in turn: HF's path.
    assert!(from_gguf("default").hf().fast.is_none());
}

#[test]
fn default_model() {
    let path = crate::fetch::default_model_path().expect("default model");
    let tok = crate::bench::dataset::load_tokenizer(&path).unwrap();
    assert_parity("SmolLM2 GGUF", &tok);
}
