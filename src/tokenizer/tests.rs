//! Unit tests of the tokenizer: GGUF and tokenizer.json construction, special tokens,
//! byte-level decoding, and long texts cut into pieces (split.rs).

use super::*;

/// A byte-level vocabulary: three control tokens, the 256 byte characters, then merges
/// for "hello", " world" and "12".
fn tiny_vocab(pre: &str) -> GgufVocab {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    let mut token_types = vec![TOKEN_CONTROL; 3];
    tokens.extend(byte_to_char().iter().map(|c| c.to_string()));
    let merges = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    tokens.push("<tool>".into());
    token_types.resize(tokens.len() - 1, TOKEN_NORMAL);
    token_types.push(TOKEN_USER_DEFINED);
    GgufVocab {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types,
        merges: merges.map(String::from).to_vec(),
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        ..GgufVocab::default()
    }
}

fn tiny(pre: &str) -> Tokenizer {
    Tokenizer::from_gguf_vocab(&tiny_vocab(pre)).unwrap()
}

#[test]
fn merges_apply_and_decode_round_trips() {
    let tok = tiny("smollm");
    let hello = tok.token_to_id("hello").unwrap();
    let world = tok.token_to_id("Ġworld").unwrap();
    assert_eq!(tok.encode("hello world", true).unwrap(), vec![hello, world]);
    assert_eq!(tok.decode(&[hello, world], false).unwrap(), "hello world");
    assert_eq!(tok.vocab_size(), 3 + 256 + 10 + 1);
}

#[test]
fn special_tokens_parse_only_when_asked_and_skip_on_decode() {
    let tok = tiny("smollm");
    let hello = tok.token_to_id("hello").unwrap();
    let text = "<|im_start|>hello<|im_end|>";
    assert_eq!(tok.encode(text, true).unwrap(), vec![1, hello, 2]);
    let plain = tok.encode(text, false).unwrap();
    assert!(
        plain.len() > 3 && !plain.contains(&1) && !plain.contains(&2),
        "{plain:?}"
    );
    assert_eq!(tok.decode(&plain, true).unwrap(), text);
    assert_eq!(tok.decode(&[1, hello, 2], false).unwrap(), text);
    assert_eq!(tok.decode(&[1, hello, 2], true).unwrap(), "hello");
    assert!(tok.is_special(1) && !tok.is_special(hello));
    // User-defined tokens split out in both modes, and are never skipped.
    let tool = tok.token_to_id("<tool>").unwrap();
    assert_eq!(tok.encode("<tool>", false).unwrap(), vec![tool]);
    assert_eq!(tok.decode(&[tool], true).unwrap(), "<tool>");
}

#[test]
fn token_bytes_split_a_multibyte_char() {
    let tok = tiny("smollm");
    let ids = tok.encode("é", false).unwrap();
    assert_eq!(ids.len(), 2);
    assert_eq!(tok.token_bytes(ids[0]).unwrap(), vec![0xC3]);
    assert_eq!(tok.token_bytes(ids[1]).unwrap(), vec![0xA9]);
    assert_eq!(tok.decode(&ids[..1], false).unwrap(), "\u{FFFD}");
    assert_eq!(tok.decode(&ids, false).unwrap(), "é");
    assert_eq!(tok.token_bytes(1).unwrap(), b"<|im_start|>".to_vec());
    assert_eq!(tok.token_bytes(u32::MAX), None);
}

#[test]
fn long_texts_encode_in_pieces_to_the_same_ids() {
    let words = [
        "hello",
        " world",
        "  ",
        "12",
        "345",
        ",",
        " é",
        "\n",
        " \n ",
        "\t",
        "don't",
        "<|im_start|>",
        " user",
        "!?",
        " 7",
        "ÿ",
        "   x",
        "<tool>",
        " wor",
        "ld",
    ];
    let mut text = String::new();
    let mut k = 7usize;
    while text.len() < 3 * split::PARALLEL_MIN_BYTES {
        k = (k * 1_103_515_245 + 12_345) % (1 << 31);
        text.push_str(words[k % words.len()]);
    }
    for pre in ["smollm", "gpt-2", "llama3", "qwen2", "default"] {
        let tok = tiny(pre);
        assert!(tok.hf().cuttable, "{pre}");
        // The pre-tokens themselves (vocabulary-independent): the pieces' in turn are
        // the whole text's.
        let pre_tokens = |t: &str| -> Vec<String> {
            use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
            let mut p = PreTokenizedString::from(t);
            tok.hf()
                .inner
                .get_pre_tokenizer()
                .unwrap()
                .pre_tokenize(&mut p)
                .unwrap();
            p.get_splits(OffsetReferential::Original, OffsetType::Byte)
                .into_iter()
                .map(|(s, _, _)| s.to_owned())
                .collect()
        };
        let pieces: Vec<String> = split::pieces(&text, 64)
            .into_iter()
            .flat_map(pre_tokens)
            .collect();
        assert_eq!(pieces, pre_tokens(&text), "{pre}");
        for special in [true, false] {
            let whole = tok.encode_hf(&text, special, false).unwrap();
            let cut = tok.encode_hf(&text, special, true).unwrap();
            assert_eq!(cut, whole, "{pre}, parse_special {special}");
        }
    }
    // A tokenizer.json template that adds BOS applies once, to the whole.
    use tokenizers::processors::template::TemplateProcessing;
    let base = tiny("llama3");
    let template = TemplateProcessing::builder()
        .try_single("<|im_start|> $A")
        .unwrap()
        .special_tokens(vec![("<|im_start|>", 1)])
        .build()
        .unwrap();
    let mut inner = base.hf().inner.clone();
    inner.with_post_processor(Some(template));
    let tok = Tokenizer::assemble(Parts {
        inner,
        bytes: base.bytes.clone(),
        special: base.special.clone(),
        byte_level: true,
        post_process: true,
        add_bos: false,
        bos: base.bos,
        eos: base.eos.clone(),
        chat_template: None,
    });
    assert!(tok.hf().cuttable && tok.hf().template_adds);
    let whole = tok.encode_hf(&text, false, false).unwrap();
    assert_eq!(tok.encode_hf(&text, false, true).unwrap(), whole);
    assert_eq!(
        (whole[0], whole.iter().filter(|&&i| i == 1).count()),
        (1, 1)
    );
}

#[test]
fn smollm_splits_every_digit_but_gpt2_merges() {
    assert_eq!(tiny("smollm").encode("12", false).unwrap().len(), 2);
    assert_eq!(tiny("gpt-2").encode("12", false).unwrap().len(), 1);
}

#[test]
fn bos_eos_and_eog() {
    let mut v = tiny_vocab("smollm");
    let tok = Tokenizer::from_gguf_vocab(&v).unwrap();
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_ids(), &[2, 0]);
    assert!(tok.encode("hello", true).unwrap()[0] != 1);
    v.add_bos = true;
    let tok = Tokenizer::from_gguf_vocab(&v).unwrap();
    let hello = tok.token_to_id("hello").unwrap();
    assert_eq!(tok.encode("hello", true).unwrap(), vec![1, hello]);
    // A prompt that already starts with BOS does not get a second one.
    assert_eq!(
        tok.encode("<|im_start|>hello", true).unwrap(),
        vec![1, hello]
    );
}

#[test]
fn unknown_pre_or_model_is_a_clear_error() {
    let mut v = tiny_vocab("no-such-pre");
    let err = Tokenizer::from_gguf_vocab(&v).unwrap_err();
    assert!(
        matches!(&err, Error::Tokenizer(m) if m.contains("no-such-pre")),
        "{err}"
    );
    v.pre = Some("smollm".into());
    v.model = "bert".into();
    let err = Tokenizer::from_gguf_vocab(&v).unwrap_err();
    assert!(
        matches!(&err, Error::Tokenizer(m) if m.contains("'bert'")),
        "{err}"
    );
}

#[test]
fn from_files_reads_tokenizer_json_and_config() {
    let gguf = tiny("smollm");
    let dir = std::env::temp_dir().join(format!("inflight-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("tokenizer.json");
    let config = dir.join("tokenizer_config.json");
    std::fs::write(&json, gguf.hf().inner.to_string(false).unwrap()).unwrap();
    let cfg = r#"{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
                  "chat_template": [{"name": "default", "template": "{{ bos_token }}"}]}"#;
    std::fs::write(&config, cfg).unwrap();
    let tok = Tokenizer::from_files(&json, Some(&config)).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    for text in ["hello world", "<|im_start|>é 12<|im_end|>", "<tool> x"] {
        for special in [true, false] {
            let ids = tok.encode(text, special).unwrap();
            assert_eq!(ids, gguf.encode(text, special).unwrap(), "{text:?}");
            assert_eq!(
                tok.decode(&ids, true).unwrap(),
                gguf.decode(&ids, true).unwrap()
            );
        }
    }
    assert_eq!(
        (tok.bos_token_id(), tok.eos_token_ids()),
        (Some(1), &[2, 0][..])
    );
    assert_eq!(tok.chat_template(), Some("{{ bos_token }}"));
    assert!(tok.is_special(0) && !tok.is_special(3));
    assert_eq!(tok.token_bytes(3 + 0xC3), Some(vec![0xC3]));
    assert_eq!(tok.vocab_size(), gguf.vocab_size());
}

#[test]
fn spm_pieces_map_to_bytes() {
    assert_eq!(&*spm_piece_bytes("<0x0A>"), b"\n");
    assert_eq!(&*spm_piece_bytes("\u{2581}the"), b" the");
    assert_eq!(&*byte_level_decode("Ġthe"), b" the");
}
