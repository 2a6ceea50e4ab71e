//! The default model's tokenizer, built from its GGUF metadata, against llama.cpp:
//! ids for every string of tests/fixtures/tokenize_llamacpp.json (special tokens parsed
//! and not), detokenized text, the same strings under other `tokenizer.ggml.pre` values,
//! BOS/EOS/EOG ids, and the chat template rendering the prompt of greedy_llamacpp.json.
//! Fixtures come from scripts/llama_ref.py.

use std::sync::OnceLock;

use inflight::model::gguf::GgufFile;
use inflight::tokenizer::chat::{ChatMessage, ChatTemplate};
use inflight::tokenizer::{GgufVocab, Tokenizer};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    read_json(&path)
}

/// tokenize_llamacpp.json, or a larger file in its format named by
/// `INFLIGHT_TOKENIZE_FIXTURE` (scripts/llama_ref.py can write one from any string list).
fn tokenize_fixture() -> Value {
    match std::env::var_os("INFLIGHT_TOKENIZE_FIXTURE") {
        Some(path) => read_json(std::path::Path::new(&path)),
        None => fixture("tokenize_llamacpp.json"),
    }
}

fn read_json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn vocab() -> &'static GgufVocab {
    static VOCAB: OnceLock<GgufVocab> = OnceLock::new();
    VOCAB.get_or_init(|| {
        let path = inflight::fetch::default_model_path().expect("default model");
        GgufVocab::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
    })
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_gguf_vocab(vocab()).unwrap())
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn cases() -> Vec<Value> {
    tokenize_fixture()["cases"].as_array().unwrap().clone()
}

#[test]
fn ids_match_llamacpp() {
    let tok = tokenizer();
    let cases = cases();
    assert!(cases.len() >= 70);
    let (mut special_ok, mut plain_ok, mut plain_total) = (0, 0, 0);
    let mut failures = Vec::new();
    for case in &cases {
        let text = case["text"].as_str().unwrap();
        let ours = tok.encode(text, true).unwrap();
        if ours == ids(&case["ids"]) {
            special_ok += 1;
        } else {
            failures.push(format!(
                "special {text:?}: ours {ours:?} llama.cpp {}",
                case["ids"]
            ));
        }
        if let Some(want) = case.get("ids_plain") {
            plain_total += 1;
            let ours = tok.encode(text, false).unwrap();
            if ours == ids(want) {
                plain_ok += 1;
            } else {
                failures.push(format!("plain {text:?}: ours {ours:?} llama.cpp {want}"));
            }
        }
    }
    println!(
        "{special_ok}/{} strings identical with special tokens parsed, {plain_ok}/{plain_total} \
         with special tokens as text",
        cases.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn decode_matches_llamacpp_and_round_trips() {
    let tok = tokenizer();
    for case in cases() {
        let text = case["text"].as_str().unwrap();
        let ids = ids(&case["ids"]);
        assert_eq!(
            tok.decode(&ids, true).unwrap(),
            case["detok"].as_str().unwrap(),
            "{text:?}"
        );
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            case["detok_special"].as_str().unwrap()
        );
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
        // Token bytes concatenate to the text even where a character spans tokens.
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| tok.token_bytes(id).unwrap())
            .collect();
        assert_eq!(bytes, text.as_bytes(), "{text:?}");
        if let Some(plain) = case.get("ids_plain") {
            assert_eq!(tok.decode(&self::ids(plain), true).unwrap(), text);
        }
    }
}

#[test]
fn other_pre_tokenizers_match_llamacpp() {
    let fx = tokenize_fixture();
    let texts: Vec<&str> = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    let variants = fx["pre_variants"].as_object().unwrap();
    assert!(variants.len() >= 4);
    for (pre, want) in variants {
        let mut v = vocab().clone();
        v.pre = Some(pre.clone());
        let tok = Tokenizer::from_gguf_vocab(&v).unwrap();
        let want = want.as_array().unwrap();
        let ok = texts
            .iter()
            .zip(want)
            .filter(|(text, want)| {
                let ours = tok.encode(text, true).unwrap();
                let same = ours == ids(want);
                if !same {
                    eprintln!("pre={pre} {text:?}: ours {ours:?} llama.cpp {want}");
                }
                same
            })
            .count();
        println!("pre={pre}: {ok}/{} strings identical", texts.len());
        assert_eq!(ok, texts.len(), "pre={pre}");
    }
}

#[test]
fn special_ids_match_llamacpp() {
    let tok = tokenizer();
    let fx = tokenize_fixture();
    let v = &fx["vocab"];
    assert_eq!(tok.vocab_size() as u64, v["n_vocab"].as_u64().unwrap());
    assert_eq!(tok.bos_token_id().map(u64::from), v["bos"].as_u64());
    assert_eq!(tok.add_bos(), v["add_bos"].as_bool().unwrap());
    let eos = v["eos"].as_u64().unwrap() as u32;
    assert_eq!(tok.eos_token_ids()[0], eos);
    // llama.cpp's EOG set also holds FIM tokens (<reponame>); ours is the turn enders.
    let eog = ids(&v["eog_ids"]);
    assert!(
        tok.eos_token_ids().iter().all(|id| eog.contains(id)),
        "{:?} ⊄ {eog:?}",
        tok.eos_token_ids()
    );
    assert_eq!(tok.eos_token_ids(), &[2, 0]);
    assert!((0..=16).all(|id| tok.is_special(id)) && !tok.is_special(17));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
}

#[test]
fn chat_template_renders_the_greedy_fixture_prompt() {
    let tok = tokenizer();
    let fx = fixture("greedy_llamacpp.json");
    let cases = fx["cases"].as_array().unwrap();
    let template = ChatTemplate::for_tokenizer(tok).unwrap();
    let rendered = template
        .apply(
            &[ChatMessage::new("user", "Write a haiku about the sea.")],
            true,
        )
        .unwrap();
    assert!(
        cases
            .iter()
            .any(|c| c["prompt"].as_str() == Some(rendered.as_str())),
        "rendered {rendered:?} matches no fixture prompt"
    );
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(
            tok.encode(prompt, true).unwrap(),
            ids(&case["prompt_ids"]),
            "{prompt:?}"
        );
    }
}

#[test]
fn a_long_prompt_encodes_as_its_sentences_do() {
    // Long texts are cut into pieces encoded in parallel (src/tokenizer/split.rs). Built
    // from the fixture strings as sentences that start with a space and end with a
    // non-space, the text's ids must be each sentence's ids in turn, whatever the cuts.
    let tok = tokenizer();
    let mut text = String::new();
    let mut want = Vec::new();
    for (i, case) in cases().iter().cycle().take(300).enumerate() {
        let sentence = format!(" {i}:{}.", case["text"].as_str().unwrap());
        want.extend(tok.encode(&sentence, true).unwrap());
        text.push_str(&sentence);
    }
    assert!(text.len() > 8192, "{} bytes", text.len());
    // Both begin with BOS when the model adds one; drop the sentences' other BOS ids.
    let bos = tok.bos_token_id();
    let mut expect: Vec<u32> = Vec::new();
    for (i, &id) in want.iter().enumerate() {
        if i == 0 || Some(id) != bos || !tok.add_bos() {
            expect.push(id);
        }
    }
    assert_eq!(tok.encode(&text, true).unwrap(), expect);
}
