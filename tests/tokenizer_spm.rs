//! SentencePiece (GGUF `llama`) tokenizers against llama.cpp, on the vocab-only GGUF of
//! llama.cpp's own tokenizer tests (Llama-2's vocabulary, tests/fixtures/spm/): its
//! test-tokenizer-0 strings and expected ids (`.inp`/`.out`, copied from llama.cpp), and
//! the fixture scripts/spm_ref.py writes from llama.cpp for three vocabularies — that
//! file, the same with `add_space_prefix = false` (as Gemma's GGUFs), and Phi-3's
//! (rebuilt from phi3_vocab.json): every id with special tokens parsed and not, with BOS,
//! the detokenized text three ways, streamed text, every id's bytes, and BOS/EOS/EOG.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use inflight::model::gguf::GgufFile;
use inflight::tokenizer::detok::Detokenizer;
use inflight::tokenizer::{GgufVocab, Tokenizer};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/spm")
        .join(name)
}

fn json(name: &str) -> Value {
    let path = fixture_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| json("tokenize_spm_llamacpp.json"))
}

fn llama_vocab() -> GgufVocab {
    static VOCAB: OnceLock<GgufVocab> = OnceLock::new();
    VOCAB
        .get_or_init(|| {
            let file = GgufFile::open(fixture_path("ggml-vocab-llama-spm.gguf")).unwrap();
            GgufVocab::from_gguf(&file).unwrap()
        })
        .clone()
}

/// Phi-3's vocabulary: Llama's with phi3_vocab.json's changes.
fn phi3_vocab() -> GgufVocab {
    let delta = json("phi3_vocab.json");
    let mut v = llama_vocab();
    let id = |key: &str| delta[key].as_u64().map(|x| x as u32);
    v.general_name = delta["general.name"].as_str().map(String::from);
    v.bos_token_id = id("tokenizer.ggml.bos_token_id");
    v.eos_token_id = id("tokenizer.ggml.eos_token_id");
    v.unknown_token_id = id("tokenizer.ggml.unknown_token_id");
    v.padding_token_id = id("tokenizer.ggml.padding_token_id");
    v.add_bos = delta["tokenizer.ggml.add_bos_token"].as_bool().unwrap();
    v.chat_template = delta["tokenizer.chat_template"].as_str().map(String::from);
    for (i, ty) in delta["token_type"].as_object().unwrap() {
        v.token_types[i.parse::<usize>().unwrap()] = ty.as_i64().unwrap() as i32;
    }
    for (i, score) in delta["scores"].as_object().unwrap() {
        v.scores[i.parse::<usize>().unwrap()] = score.as_f64().unwrap() as f32;
    }
    for t in delta["appended"].as_array().unwrap() {
        v.tokens.push(t[0].as_str().unwrap().into());
        v.scores.push(t[1].as_f64().unwrap() as f32);
        v.token_types.push(t[2].as_i64().unwrap() as i32);
    }
    v
}

/// The three vocabularies of the reference fixture, by its names.
fn vocab(name: &str) -> GgufVocab {
    match name {
        "llama-spm" => llama_vocab(),
        "llama-spm-no-prefix" => GgufVocab {
            add_space_prefix: Some(false),
            ..llama_vocab()
        },
        "phi-3" => phi3_vocab(),
        other => panic!("unknown vocabulary {other}"),
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Each vocabulary of the fixture: its name, tokenizer and reference.
fn each_vocab() -> Vec<(String, Tokenizer, &'static Value)> {
    let vocabs = reference()["vocabs"].as_object().unwrap();
    assert_eq!(vocabs.len(), 3);
    vocabs
        .iter()
        .map(|(name, r)| {
            let tok = Tokenizer::from_gguf_vocab(&vocab(name)).unwrap();
            (name.clone(), tok, r)
        })
        .collect()
}

fn cases(r: &Value) -> &Vec<Value> {
    r["cases"].as_array().unwrap()
}

/// Our ids without the BOS that `encode` adds.
fn encode_no_bos(tok: &Tokenizer, text: &str, parse_special: bool) -> Vec<u32> {
    let mut got = tok.encode(text, parse_special).unwrap();
    assert_eq!(got.first().copied(), tok.bos_token_id(), "{text:?}");
    got.remove(0);
    got
}

#[test]
fn the_llamacpp_test_vocab_gives_its_expected_ids() {
    // test-tokenizer-0's format: strings separated by a marker line, one line of ids
    // each (no BOS, special tokens not parsed).
    let inp = std::fs::read_to_string(fixture_path("ggml-vocab-llama-spm.gguf.inp")).unwrap();
    let out = std::fs::read_to_string(fixture_path("ggml-vocab-llama-spm.gguf.out")).unwrap();
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(texts.pop(), Some(""));
    let want: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), want.len());
    assert!(texts.len() >= 40);
    let tok = Tokenizer::from_gguf_vocab(&llama_vocab()).unwrap();
    let mut round_trips = 0;
    for (text, want) in texts.iter().zip(&want) {
        let got = encode_no_bos(&tok, text, false);
        assert_eq!(&got, want, "{text:?}");
        // llama.cpp's detokenize gives the text back for all of these.
        assert_eq!(tok.decode(&got, false).unwrap(), *text);
        round_trips += 1;
    }
    println!(
        "{round_trips}/{} strings identical and round-tripped",
        texts.len()
    );
}

#[test]
fn ids_match_llamacpp() {
    for (name, tok, r) in each_vocab() {
        let bos = tok.bos_token_id().unwrap();
        let (mut n, mut failures) = (0, Vec::new());
        for case in cases(r) {
            let text = case["text"].as_str().unwrap();
            for (key, parse) in [("ids", true), ("ids_plain", false)] {
                let want = ids(&case[key]);
                let got = tok.encode(text, parse).unwrap();
                // llama.cpp adds BOS before all; we don't add a second one.
                let expect = match want.first() {
                    Some(&first) if first == bos => want.clone(),
                    _ => [vec![bos], want.clone()].concat(),
                };
                n += 1;
                if got != expect {
                    failures.push(format!(
                        "{name} {key} {text:?}: ours {got:?} llama.cpp {want:?}"
                    ));
                }
            }
        }
        println!("{name}: {}/{n} id lists identical", n - failures.len());
        assert!(n >= 300, "{name}: {n}");
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

#[test]
fn decode_matches_llamacpp_and_round_trips() {
    for (name, tok, r) in each_vocab() {
        let bos = tok.bos_token_id().unwrap();
        let mut round_trips = 0;
        for case in cases(r) {
            let text = case["text"].as_str().unwrap();
            let want = ids(&case["ids"]);
            let detok = case["detok"].as_str().unwrap();
            let detok_special = case["detok_special"].as_str().unwrap();
            assert_eq!(tok.decode(&want, true).unwrap(), detok, "{name} {text:?}");
            assert_eq!(
                tok.decode(&want, false).unwrap(),
                detok_special,
                "{name} {text:?}"
            );
            let with_bos = [vec![bos], want.clone()].concat();
            assert_eq!(
                tok.decode(&with_bos, false).unwrap(),
                case["detok_bos"].as_str().unwrap(),
                "{name} {text:?}"
            );
            // Where llama.cpp gives the text back, so do we, from our own ids.
            if detok_special == text {
                let mut ours = tok.encode(text, true).unwrap();
                // Unless the text writes its own BOS, drop the one encode adds.
                if !text.starts_with("<s>") {
                    ours.remove(0);
                }
                assert_eq!(tok.decode(&ours, false).unwrap(), text, "{name}");
                round_trips += 1;
            }
        }
        println!(
            "{name}: {round_trips}/{} strings round-trip",
            cases(r).len()
        );
        assert!(round_trips >= 100, "{name}: {round_trips}");
    }
}

#[test]
fn streamed_text_never_splits_a_character() {
    // As the server streams: each id's bytes, special ids skipped, through Detokenizer.
    for (name, tok, r) in each_vocab() {
        for case in cases(r) {
            let text = case["text"].as_str().unwrap();
            let mut d = Detokenizer::new();
            let (mut streamed, mut bytes) = (String::new(), Vec::new());
            for id in ids(&case["ids"]) {
                if tok.is_special(id) {
                    continue;
                }
                let piece = tok.token_bytes(id).unwrap();
                bytes.extend_from_slice(&piece);
                let out = d.push(&piece);
                assert!(!out.contains('\u{FFFD}'), "{name} {text:?}: {out:?}");
                streamed.push_str(&out);
            }
            streamed.push_str(&d.finish());
            assert!(!d.has_pending());
            assert_eq!(streamed.as_bytes(), bytes, "{name} {text:?}");
            // The only difference from decode: the first token keeps its space.
            let decoded = tok.decode(&ids(&case["ids"]), true).unwrap();
            assert!(
                streamed == decoded || streamed == format!(" {decoded}"),
                "{name} {text:?}: streamed {streamed:?} decoded {decoded:?}"
            );
        }
    }
}

#[test]
fn token_bytes_match_llamacpp_pieces() {
    for (name, tok, r) in each_vocab() {
        let mut h = Sha256::new();
        for id in 0..tok.vocab_size() as u32 {
            let piece = tok.token_bytes(id).unwrap();
            h.update((piece.len() as u32).to_le_bytes());
            h.update(&piece);
        }
        let digest: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            digest,
            r["vocab"]["pieces_sha256"].as_str().unwrap(),
            "{name}"
        );
    }
}

#[test]
fn special_ids_match_llamacpp() {
    for (name, tok, r) in each_vocab() {
        let v = &r["vocab"];
        assert_eq!(
            tok.vocab_size() as u64,
            v["n_vocab"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            tok.bos_token_id().map(u64::from),
            v["bos"].as_u64(),
            "{name}"
        );
        assert_eq!(tok.add_bos(), v["add_bos"].as_bool().unwrap(), "{name}");
        assert_eq!(
            tok.eos_token_ids()[0] as u64,
            v["eos"].as_u64().unwrap(),
            "{name}"
        );
        let ours: BTreeSet<u32> = tok.eos_token_ids().iter().copied().collect();
        let want: BTreeSet<u32> = ids(&v["eog_ids"]).into_iter().collect();
        assert_eq!(ours, want, "{name}");
    }
    let phi3 = Tokenizer::from_gguf_vocab(&phi3_vocab()).unwrap();
    assert_eq!(phi3.token_to_id("<|end|>"), Some(32007));
    assert_eq!(phi3.token_to_id("▁Hello"), Some(15043));
    // Phi-3's </s> is user-defined in the file; llama.cpp makes it a control token.
    assert!(phi3.is_special(2) && phi3.is_special(32007) && !phi3.is_special(15043));
}
