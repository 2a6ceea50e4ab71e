//! Unit tests of the SentencePiece path ([`super::spm`]) on a hand-made vocabulary: the
//! merge order (score, then leftmost), byte fallback, the space prefix and its `false`
//! setting (Gemma), special and user-defined tokens, Phi-3's whitespace stripping,
//! decoding, and streamed detokenization of byte-fallback characters.

use super::detok::Detokenizer;
use super::*;

/// `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then normal tokens with scores, a
/// user-defined `<tool>`, a control `<|user|>` and an unused token.
fn tiny_spm(add_space_prefix: Option<bool>, name: Option<&str>) -> GgufVocab {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut token_types = vec![TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL];
    let mut scores = vec![0.0; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        token_types.push(6);
        scores.push(0.0);
    }
    let normal = [
        ("▁", -1.0),
        ("a", -1.0),
        ("b", -1.0),
        ("c", -1.0),
        ("h", -1.0),
        ("i", -1.0),
        ("ab", -10.0),
        ("bc", -5.0),
        ("▁a", -20.0),
        ("abc", -30.0),
        ("bb", -7.0),
        ("▁h", -3.0),
        ("▁hi", -2.0),
        ("▁▁", -8.0),
    ];
    for (text, score) in normal {
        tokens.push(text.into());
        token_types.push(TOKEN_NORMAL);
        scores.push(score);
    }
    for (text, ty) in [
        ("<tool>", TOKEN_USER_DEFINED),
        ("<|user|>", TOKEN_CONTROL),
        ("<x>", 5),
    ] {
        tokens.push(text.into());
        token_types.push(ty);
        scores.push(0.0);
    }
    GgufVocab {
        model: "llama".into(),
        tokens,
        token_types,
        scores,
        add_space_prefix,
        general_name: name.map(String::from),
        add_bos: true,
        ..GgufVocab::default()
    }
}

fn tiny(add_space_prefix: Option<bool>) -> Tokenizer {
    Tokenizer::from_gguf_vocab(&tiny_spm(add_space_prefix, None)).unwrap()
}

fn id(tok: &Tokenizer, text: &str) -> u32 {
    tok.token_to_id(text)
        .unwrap_or_else(|| panic!("{text:?} not in vocabulary"))
}

fn ids(tok: &Tokenizer, texts: &[&str]) -> Vec<u32> {
    texts.iter().map(|t| id(tok, t)).collect()
}

#[test]
fn the_highest_score_pair_merges_first_then_the_leftmost() {
    let tok = tiny(None);
    // ▁abc: bc (-5) beats ab (-10) and ▁a (-20); then ▁a; abc (-30) finds its `a` gone.
    assert_eq!(
        tok.encode("abc", false).unwrap(),
        vec![1, id(&tok, "▁a"), id(&tok, "bc")]
    );
    // Two equal bb pairs: the left one merges; bbb is no token.
    assert_eq!(
        tok.encode("bbb", false).unwrap(),
        [vec![1], ids(&tok, &["▁", "bb", "b"])].concat()
    );
    // Spaces are ▁: the prefix and a space make ▁▁ (-8), but ▁h (-3) and ▁hi (-2) win.
    assert_eq!(
        tok.encode(" hi", false).unwrap(),
        [vec![1], ids(&tok, &["▁", "▁hi"])].concat()
    );
}

#[test]
fn characters_without_a_token_fall_back_to_bytes() {
    let tok = tiny(None);
    let got = tok.encode("é", false).unwrap();
    assert_eq!(got, vec![1, id(&tok, "▁"), 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(tok.token_bytes(3 + 0xC3).unwrap(), vec![0xC3]);
    assert_eq!(tok.decode(&got, true).unwrap(), " é");
    assert_eq!(tok.decode(&got[1..], true).unwrap(), "é");
    assert_eq!(tok.decode(&got[2..3], true).unwrap(), "\u{FFFD}");
}

#[test]
fn the_space_prefix_opens_the_text_and_follows_special_tokens() {
    let tok = tiny(None);
    let hi = id(&tok, "▁hi");
    assert_eq!(tok.encode("", false).unwrap(), vec![1]);
    assert_eq!(tok.encode("hi", false).unwrap(), vec![1, hi]);
    assert_eq!(tok.encode("hi</s>hi", true).unwrap(), vec![1, hi, 2, hi]);
    // Unparsed, </s> is text: `<` etc. have no token and come out as bytes.
    let plain = tok.encode("hi</s>hi", false).unwrap();
    assert_eq!(plain.len(), 2 + 4 + 2, "{plain:?}");
    assert_eq!(
        &plain[2..6],
        &[
            3 + b'<' as u32,
            3 + b'/' as u32,
            3 + b's' as u32,
            3 + b'>' as u32
        ]
    );
    // A user-defined token splits out either way; control tokens only when parsed.
    let tool = id(&tok, "<tool>");
    for parse in [true, false] {
        assert_eq!(
            tok.encode("hi<tool>hi", parse).unwrap(),
            vec![1, hi, tool, hi]
        );
    }
    assert!(tok.is_special(0) && tok.is_special(1) && tok.is_special(2));
    assert!(!tok.is_special(tool) && !tok.is_special(hi));
}

#[test]
fn without_the_space_prefix_text_starts_bare() {
    // Gemma's GGUFs set tokenizer.ggml.add_space_prefix = false.
    let tok = tiny(Some(false));
    let (h, i, hi) = (id(&tok, "h"), id(&tok, "i"), id(&tok, "▁hi"));
    assert_eq!(tok.encode("hi", false).unwrap(), vec![1, h, i]);
    assert_eq!(tok.encode("hi</s> hi", true).unwrap(), vec![1, h, i, 2, hi]);
    // Nothing is stripped on decode either.
    assert_eq!(tok.decode(&[hi, hi], true).unwrap(), " hi hi");
}

#[test]
fn decoding_strips_the_first_space_only_without_bos_first() {
    let tok = tiny(None);
    let hi = id(&tok, "▁hi");
    assert_eq!(tok.decode(&[hi, hi], false).unwrap(), "hi hi");
    // llama.cpp's detokenize strips at the first token only: BOS there keeps the space.
    assert_eq!(tok.decode(&[1, hi], true).unwrap(), " hi");
    assert_eq!(tok.decode(&[1, hi], false).unwrap(), "<s> hi");
    // Streaming (token_bytes) never strips.
    assert_eq!(tok.token_bytes(hi).unwrap(), b" hi".to_vec());
    // Unused tokens are nothing, control tokens their text unless skipped.
    let unused = id(&tok, "<x>");
    assert_eq!(tok.decode(&[unused], false).unwrap(), "");
    assert_eq!(tok.decode(&[2, hi], false).unwrap(), "</s> hi");
    assert_eq!(tok.decode(&[0], false).unwrap(), "<unk>");
    assert_eq!(tok.decode(&[0], true).unwrap(), "");
}

#[test]
fn defaults_follow_llamacpp() {
    let tok = tiny(None);
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_ids(), &[2]);
    assert!(tok.add_bos());
    assert_eq!(tok.token_text(1).as_deref(), Some("<s>"));
    assert_eq!(tok.vocab_size(), 3 + 256 + 14 + 3);
}

#[test]
fn phi3_special_tokens_take_no_whitespace_after_them() {
    let user = |name: Option<&str>| {
        let tok = Tokenizer::from_gguf_vocab(&tiny_spm(None, name)).unwrap();
        let user = id(&tok, "<|user|>");
        (
            tok.encode("<|user|>\n hi", true).unwrap(),
            user,
            id(&tok, "▁hi"),
        )
    };
    let (got, user_id, hi) = user(Some("Phi3"));
    assert_eq!(got, vec![1, user_id, hi]);
    // Other models keep it: \n is a byte token, then ▁hi.
    let (got, user_id, hi) = user(Some("Llama-2"));
    assert_eq!(got[..2], [1, user_id]);
    assert_eq!(got[got.len() - 1], hi);
    assert!(got.contains(&(3 + b'\n' as u32)), "{got:?}");
    // <s> is not stripped after, even in Phi-3.
    let tok = Tokenizer::from_gguf_vocab(&tiny_spm(None, Some("phi-3-mini"))).unwrap();
    let got = tok.encode("<s> hi", true).unwrap();
    assert_eq!(got, vec![1, id(&tok, "▁"), id(&tok, "▁hi")]);
}

#[test]
fn streamed_byte_fallback_characters_come_out_whole() {
    let tok = tiny(None);
    let text = "hi é 😀 hi";
    let ids = tok.encode(text, false).unwrap();
    let mut d = Detokenizer::new();
    let mut streamed = String::new();
    for &id in &ids {
        if tok.is_special(id) {
            continue;
        }
        let piece = d.push(&tok.token_bytes(id).unwrap());
        assert!(!piece.contains('\u{FFFD}'), "{piece:?} after id {id}");
        streamed.push_str(&piece);
    }
    streamed.push_str(&d.finish());
    assert_eq!(streamed, format!(" {text}"));
    assert_eq!(tok.decode(&ids, true).unwrap(), format!(" {text}"));
    assert_eq!(tok.decode(&ids[1..], true).unwrap(), text);
}
