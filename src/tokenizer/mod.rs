//! Tokenizer: owns text ⇄ token ids. A byte-level BPE (HF `tokenizers`) built either from
//! GGUF metadata, with the pre-tokenizer llama.cpp uses for the file's
//! `tokenizer.ggml.pre`, or from an HF `tokenizer.json` (+ `tokenizer_config.json`); or a
//! GGUF's SentencePiece vocabulary (`llama`), encoded as llama.cpp does ([`spm`]);
//! also the raw bytes of every token for incremental UTF-8-safe detokenization, the
//! special and end-of-generation ids, and the model's chat template ([`chat`]). Where it
//! knows every step of HF's encode, `encode` takes its own path to the same ids (`bpe`).
//!
//! Parity target: for GGUF files, `encode` gives llama.cpp's ids (`llama_tokenize` with
//! `add_special = add_bos`) and `decode` gives `llama_detokenize`'s text; both are checked
//! against fixtures in tests/tokenizer_llamacpp.rs (byte-level BPE) and
//! tests/tokenizer_spm.rs (SentencePiece).

mod bpe;
pub mod chat;
pub mod detok;
#[cfg(test)]
mod fast_tests;
mod pretok;
mod split;
mod spm;
#[cfg(test)]
mod spm_tests;

use std::path::Path;

use rayon::prelude::*;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::{Error, Result};
use crate::model::gguf::{GgufFile, MetaValue};

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_NORMAL: i32 = 1;
const TOKEN_UNKNOWN: i32 = 2;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;

/// Control tokens that end a turn besides `eos`; llama.cpp marks the same texts as EOG.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
];

/// The tokenizer as a GGUF file describes it (`tokenizer.ggml.*` keys); plain data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: the tokenizer kind, `gpt2` (byte-level BPE) or `llama`
    /// (SentencePiece), the two [`Tokenizer::from_gguf_vocab`] builds.
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer's name (`llama-bpe`, `smollm`, ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: every token's text, by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: every token's ggml type (normal, control, ...); all
    /// normal when absent.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: BPE merges, `"a b"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores`: every token's score, by id; SentencePiece merges the pair
    /// whose token scores highest. Empty when absent (all 0).
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.add_space_prefix`: SentencePiece text gets a leading `▁` (None:
    /// llama.cpp's default, on for `llama`; Gemma's files turn it off).
    pub add_space_prefix: Option<bool>,
    /// `general.name`: llama.cpp gives Phi-3's special tokens (`phi-3`, `phi3` in the
    /// name) a different whitespace handling.
    pub general_name: Option<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unknown_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub padding_token_id: Option<u32>,
    /// Encoding prepends bos: `tokenizer.ggml.add_bos_token`, else llama.cpp's default
    /// for the pre-tokenizer.
    pub add_bos: bool,
    /// `tokenizer.chat_template`: the model's jinja chat template.
    pub chat_template: Option<String>,
}

impl GgufVocab {
    /// Reads the `tokenizer.*` metadata of a GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let string = |key: &str| file.get(key).and_then(MetaValue::as_str).map(str::to_owned);
        let id = |key: &str| file.get(key).and_then(MetaValue::as_u32);
        let model = string("tokenizer.ggml.model")
            .ok_or_else(|| Error::Tokenizer("GGUF has no tokenizer.ggml.model".into()))?;
        let tokens = string_array(file, "tokenizer.ggml.tokens")?
            .ok_or_else(|| Error::Tokenizer("GGUF has no tokenizer.ggml.tokens".into()))?;
        let token_types = match file.get("tokenizer.ggml.token_type") {
            None => vec![TOKEN_NORMAL; tokens.len()],
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(|t| t.as_i64().map(|t| t as i32)).collect())
                .ok_or_else(|| Error::Tokenizer("tokenizer.ggml.token_type: not ints".into()))?,
        };
        let pre = string("tokenizer.ggml.pre");
        // llama.cpp turns add_bos on for SentencePiece and the llama3 pre-tokenizer unless
        // the file says otherwise.
        let add_bos = file
            .get("tokenizer.ggml.add_bos_token")
            .and_then(MetaValue::as_bool)
            .unwrap_or_else(|| {
                model == "llama"
                    || pre
                        .as_deref()
                        .is_some_and(|p| pre_spec(p).is_ok_and(|s| s.1))
            });
        let scores = match file.get("tokenizer.ggml.scores") {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(MetaValue::as_f32).collect())
                .ok_or_else(|| Error::Tokenizer("tokenizer.ggml.scores: not numbers".into()))?,
        };
        Ok(GgufVocab {
            model,
            pre,
            tokens,
            token_types,
            merges: string_array(file, "tokenizer.ggml.merges")?.unwrap_or_default(),
            scores,
            add_space_prefix: file
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(MetaValue::as_bool),
            general_name: string("general.name"),
            bos_token_id: id("tokenizer.ggml.bos_token_id"),
            eos_token_id: id("tokenizer.ggml.eos_token_id"),
            unknown_token_id: id("tokenizer.ggml.unknown_token_id"),
            padding_token_id: id("tokenizer.ggml.padding_token_id"),
            add_bos,
            chat_template: string("tokenizer.chat_template"),
        })
    }
}

fn string_array(file: &GgufFile, key: &str) -> Result<Option<Vec<String>>> {
    let Some(value) = file.get(key) else {
        return Ok(None);
    };
    value
        .as_array()
        .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_owned)).collect())
        .map(Some)
        .ok_or_else(|| Error::Tokenizer(format!("{key}: not an array of strings")))
}

const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's pre-tokenizer for a `tokenizer.ggml.pre` value (llama-vocab.cpp): the
/// regexes applied in turn, each splitting every piece into matches and the text between
/// them, then whether whole pieces found in the vocabulary skip the merges
/// (`ignore_merges`, which also means llama.cpp's default add_bos is on).
fn pre_spec(pre: &str) -> Result<(Vec<&'static str>, bool)> {
    Ok(match pre {
        "default" => (
            vec![
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_RE,
                r"\p{N}+",
                "[0-9][0-9][0-9]",
            ],
            false,
        ),
        "gpt-2" | "phi-2" | "mpt" | "olmo" => (vec![GPT2_RE], false),
        "smollm" | "starcoder" | "refact" | "codeshell" => (vec![r"\p{N}", GPT2_RE], false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "dbrx" | "smaug-bpe" => {
            (vec![LLAMA3_RE], pre != "dbrx" && pre != "smaug-bpe")
        }
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" => (vec![QWEN2_RE], false),
        other => {
            return Err(Error::Tokenizer(format!(
                "unsupported GGUF pre-tokenizer '{other}' (supported: default, gpt-2, smollm, \
                 starcoder, llama3, llama-bpe, qwen2 and their llama.cpp aliases)"
            )))
        }
    })
}

/// Text ⇄ ids for one model. Cheap to share (`Arc<Tokenizer>`); every method takes `&self`.
pub struct Tokenizer {
    /// What turns text into ids.
    engine: Engine,
    /// Raw bytes of every id, as llama.cpp's `token_to_piece(special = true)` gives them.
    bytes: Vec<Box<[u8]>>,
    /// Ids dropped by `decode(skip_special = true)`: control and unknown tokens.
    special: Vec<bool>,
    /// Decode by concatenating `bytes` (byte-level and GGUF SentencePiece vocabularies)
    /// or through HF's decoder.
    byte_level: bool,
    /// Decoding drops one leading space from the first token's text, as llama.cpp's
    /// detokenize does for SentencePiece vocabularies that add a space prefix.
    strip_leading_space: bool,
    add_bos: bool,
    bos: Option<u32>,
    /// `eos` first, then other end-of-generation ids.
    eos: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

/// The encoder a [`Tokenizer`] runs.
enum Engine {
    /// HF `tokenizers`: byte-level BPE from GGUF, or any tokenizer.json.
    Hf(Box<HfEngine>),
    /// A GGUF SentencePiece vocabulary through llama.cpp's SPM algorithm.
    Spm(Box<spm::Spm>),
}

struct HfEngine {
    /// Splits special tokens out of the text before BPE (`parse_special = true`).
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special tokens treated as plain text.
    plain: tokenizers::Tokenizer,
    /// The same ids without HF's per-call machinery, where it knows every step ([`bpe`]).
    fast: Option<bpe::FastBpe>,
    /// Run the HF post-processor on encode (tokenizer.json checkpoints add BOS there).
    post_process: bool,
    /// Long texts may be cut into pieces encoded in parallel ([`split`]): the
    /// pre-tokenizer is one the cut is exact for, nothing normalizes across it, and no
    /// added token holds a space or takes the whitespace after it.
    cuttable: bool,
    /// The post-processor adds tokens (a BOS template), so cut pieces are merged and
    /// post-processed as a whole.
    template_adds: bool,
}

/// tokenizer.json parsed by the tokenizers crate, whose deserializers can panic on a
/// malformed file (found by fuzzing: a decoder whose map has a non-string key): a panic
/// becomes an error, so a broken file is refused instead of aborting the load.
fn parse_tokenizer_json(bytes: &[u8]) -> std::result::Result<tokenizers::Tokenizer, String> {
    match std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes)) {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(e.to_string()),
        Err(p) => Err(format!(
            "malformed tokenizer.json: {}",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("its parser failed")
        )),
    }
}

fn tk_err(context: &str) -> impl Fn(tokenizers::Error) -> Error + '_ {
    move |e| Error::Tokenizer(format!("{context}: {e}"))
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes: `gpt2` (byte-level BPE) or `llama`
    /// (SentencePiece) vocabularies; an unknown pre-tokenizer is an error rather than a
    /// silent mismatch.
    pub fn from_gguf_vocab(v: &GgufVocab) -> Result<Tokenizer> {
        match v.model.as_str() {
            "gpt2" => {}
            "llama" => return Tokenizer::from_spm_vocab(v),
            other => {
                return Err(Error::Tokenizer(format!(
                    "unsupported GGUF tokenizer model '{other}' (supported: 'gpt2' byte-level \
                     BPE, 'llama' SentencePiece)"
                )))
            }
        }
        let n = v.tokens.len();
        if v.token_types.len() != n {
            return Err(Error::Tokenizer(format!(
                "{} tokens but {} token types",
                n,
                v.token_types.len()
            )));
        }
        let (regexes, ignore_merges) = pre_spec(v.pre.as_deref().unwrap_or("default"))?;
        let vocab: Vocab = v.tokens.iter().cloned().zip(0u32..).collect();
        let merges = v
            .merges
            .iter()
            .map(|m| match m.split_once(' ') {
                Some((a, b)) => Ok((a.to_owned(), b.to_owned())),
                None => Err(Error::Tokenizer(format!("merge without a space: {m:?}"))),
            })
            .collect::<Result<Vec<_>>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .build()
            .map_err(tk_err("BPE from GGUF"))?;

        let mut pieces = regexes
            .iter()
            .map(|re| {
                Split::new(
                    SplitPattern::Regex((*re).to_owned()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map(PreTokenizerWrapper::Split)
                .map_err(tk_err("pre-tokenizer regex"))
            })
            .collect::<Result<Vec<_>>>()?;
        pieces.push(ByteLevel::new(false, false, false).into());

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(Sequence::new(pieces)));
        inner.with_decoder(Some(ByteLevel::default()));
        // llama.cpp splits control/unknown tokens out only when parsing specials, and
        // user-defined tokens always: HF's special and non-special added tokens.
        let (mut special_added, mut user_added) = (Vec::new(), Vec::new());
        let mut special = vec![false; n];
        for (i, (text, &ty)) in v.tokens.iter().zip(&v.token_types).enumerate() {
            match ty {
                TOKEN_CONTROL | TOKEN_UNKNOWN => {
                    special[i] = true;
                    special_added.push(AddedToken::from(text.clone(), true).normalized(false));
                }
                TOKEN_USER_DEFINED => {
                    user_added.push(AddedToken::from(text.clone(), false).normalized(false))
                }
                _ => {}
            }
        }
        inner.add_special_tokens(&special_added);
        inner.add_tokens(&user_added);

        let bytes = v
            .tokens
            .iter()
            .zip(&v.token_types)
            .map(|(text, &ty)| match ty {
                TOKEN_CONTROL | TOKEN_UNKNOWN | TOKEN_USER_DEFINED => text.as_bytes().into(),
                _ => byte_level_decode(text),
            })
            .collect();
        let eos = end_ids(
            v.eos_token_id,
            |id| special[id as usize],
            v.tokens.iter().zip(0u32..),
            |t| EOG_TEXTS.contains(&t),
        );
        Ok(Tokenizer::assemble(Parts {
            inner,
            bytes,
            special,
            byte_level: true,
            post_process: false,
            add_bos: v.add_bos,
            bos: v.bos_token_id,
            eos,
            chat_template: v.chat_template.clone(),
        }))
    }

    /// A GGUF SentencePiece vocabulary ([`spm`]). BOS, EOS and unknown ids default to 1,
    /// 2 and 0 as in llama.cpp; end-of-generation ids are the eos and the control tokens
    /// whose text ends a turn.
    fn from_spm_vocab(v: &GgufVocab) -> Result<Tokenizer> {
        let spm = spm::Spm::new(v)?;
        let n = v.tokens.len();
        let in_vocab = |id: u32| Some(id).filter(|&id| (id as usize) < n);
        let bos = v.bos_token_id.map_or(in_vocab(1), in_vocab);
        let eos_id = v.eos_token_id.map_or(in_vocab(2), in_vocab);
        let special = spm.special_flags();
        let names = v.tokens.iter().zip(0u32..);
        let eos = end_ids(eos_id, |id| special[id as usize], names, spm::is_spm_eog);
        Ok(Tokenizer {
            bytes: spm.pieces(),
            special,
            byte_level: true,
            strip_leading_space: spm.add_space_prefix(),
            engine: Engine::Spm(Box::new(spm)),
            add_bos: v.add_bos,
            bos,
            eos,
            chat_template: v.chat_template.clone(),
        })
    }

    /// A tokenizer from tokenizer.json's bytes alone (no tokenizer_config.json: no bos or
    /// chat template); what the fuzz target reads.
    pub fn from_json_bytes(tokenizer_json: &[u8]) -> Result<Tokenizer> {
        let inner = parse_tokenizer_json(tokenizer_json)
            .map_err(|e| Error::Tokenizer(format!("tokenizer.json: {e}")))?;
        Tokenizer::from_inner(inner, serde_json::Value::Null)
    }

    /// Loads an HF checkpoint's tokenizer. `tokenizer_config.json`, when given, supplies
    /// the chat template and the bos/eos token strings.
    pub fn from_files(
        tokenizer_json: &Path,
        tokenizer_config_json: Option<&Path>,
    ) -> Result<Tokenizer> {
        let bytes = std::fs::read(tokenizer_json).map_err(|e| Error::io(tokenizer_json, e))?;
        let inner = parse_tokenizer_json(&bytes)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", tokenizer_json.display())))?;
        let config = match tokenizer_config_json {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
                serde_json::from_str::<serde_json::Value>(&text)
                    .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?
            }
            None => serde_json::Value::Null,
        };
        Tokenizer::from_inner(inner, config)
    }

    /// The tokenizer of a loaded tokenizer.json and its tokenizer_config.json's values.
    fn from_inner(inner: tokenizers::Tokenizer, config: serde_json::Value) -> Result<Tokenizer> {
        let token_id = |key: &str| -> Option<u32> {
            let v = config.get(key)?;
            let text = v.as_str().or_else(|| v.get("content")?.as_str())?;
            inner.token_to_id(text)
        };
        let bos = token_id("bos_token");
        let eos_id = token_id("eos_token");

        let n = inner.get_vocab_size(true);
        let added = inner.get_added_tokens_decoder();
        let byte_level = is_byte_level(inner.get_decoder());
        let mut special = vec![false; n];
        let mut bytes: Vec<Box<[u8]>> = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let piece = match added.get(&id) {
                Some(tok) => {
                    special[id as usize] = tok.special;
                    tok.content.as_bytes().into()
                }
                None => match inner.id_to_token(id) {
                    Some(t) if byte_level => byte_level_decode(&t),
                    Some(t) => spm_piece_bytes(&t),
                    None => Box::default(),
                },
            };
            bytes.push(piece);
        }
        let names = (0..n as u32).filter_map(|id| added.get(&id).map(|t| (&t.content, id)));
        let eos = end_ids(
            eos_id,
            |id| special[id as usize],
            names,
            |t| EOG_TEXTS.contains(&t),
        );
        Ok(Tokenizer::assemble(Parts {
            inner,
            bytes,
            special,
            byte_level,
            post_process: true,
            add_bos: false,
            bos,
            eos,
            chat_template: chat_template_from_config(&config),
        }))
    }

    fn assemble(p: Parts) -> Tokenizer {
        let mut plain = p.inner.clone();
        plain.set_encode_special_tokens(true);
        let cuttable = p.inner.get_normalizer().is_none()
            && split::cuttable(p.inner.get_pre_tokenizer())
            && p.inner
                .get_added_tokens_decoder()
                .values()
                .all(|t| !t.rstrip && !t.content.contains(' '));
        let template_adds = p.post_process
            && p.inner
                .get_post_processor()
                .is_some_and(|pp| tokenizers::PostProcessor::added_tokens(pp, false) > 0);
        let fast = bpe::FastBpe::new(&p.inner, p.post_process)
            .inspect_err(|why| tracing::debug!("tokenizer: HF's encode ({why})"))
            .ok();
        Tokenizer {
            engine: Engine::Hf(Box::new(HfEngine {
                cuttable,
                template_adds,
                fast,
                inner: p.inner,
                plain,
                post_process: p.post_process,
            })),
            bytes: p.bytes,
            special: p.special,
            byte_level: p.byte_level,
            strip_leading_space: false,
            add_bos: p.add_bos,
            bos: p.bos,
            eos: p.eos,
            chat_template: p.chat_template,
        }
    }

    /// Text to ids. `parse_special`: control tokens written in the text (`<|im_start|>`)
    /// become their single ids; otherwise they are tokenized as plain text. BOS is
    /// prepended when the model asks for it, unless the text already produced one.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        match &self.engine {
            Engine::Hf(hf) => match &hf.fast {
                Some(fast) => Ok(self.with_bos(fast.encode(text, parse_special))),
                None => self.encode_hf(text, parse_special, hf.cuttable),
            },
            Engine::Spm(spm) => Ok(self.with_bos(spm.encode(text, parse_special)?)),
        }
    }

    /// [`Tokenizer::encode`] through HF `tokenizers` even where the fast path applies:
    /// the reference it is tested against, for benchmarks. `cut`: long texts in pieces on
    /// all threads, where the pre-tokenizer allows. SentencePiece vocabularies have one
    /// encoder: `encode`'s.
    pub fn encode_reference(&self, text: &str, parse_special: bool, cut: bool) -> Result<Vec<u32>> {
        match &self.engine {
            Engine::Hf(hf) => self.encode_hf(text, parse_special, cut && hf.cuttable),
            Engine::Spm(_) => self.encode(text, parse_special),
        }
    }

    /// [`Tokenizer::encode`] through HF `tokenizers`, cutting a long text into pieces
    /// encoded in parallel when `cut` (SentencePiece vocabularies: `encode`).
    fn encode_hf(&self, text: &str, parse_special: bool, cut: bool) -> Result<Vec<u32>> {
        let Engine::Hf(hf) = &self.engine else {
            return self.encode(text, parse_special);
        };
        let tk = if parse_special { &hf.inner } else { &hf.plain };
        if !cut || text.len() < split::PARALLEL_MIN_BYTES {
            let enc = tk
                .encode_fast(text, hf.post_process)
                .map_err(tk_err("encode"))?;
            return Ok(self.with_bos(enc.get_ids().to_vec()));
        }
        let piece = split::piece_bytes(text.len(), rayon::current_num_threads());
        let pieces = split::pieces(text, piece)
            .par_iter()
            .map(|&p| tk.encode_fast(p, false))
            .collect::<tokenizers::Result<Vec<_>>>()
            .map_err(tk_err("encode"))?;
        if !hf.template_adds {
            return Ok(self.with_bos(pieces.iter().flat_map(|e| e.get_ids()).copied().collect()));
        }
        // Merging copies every field of every token: only for a template that adds some.
        let whole = tokenizers::Encoding::merge(pieces, false);
        let enc = tk
            .post_process(whole, None, true)
            .map_err(tk_err("encode"))?;
        Ok(self.with_bos(enc.get_ids().to_vec()))
    }

    /// `ids` with BOS prepended when the model asks for it and they lack it.
    fn with_bos(&self, mut ids: Vec<u32>) -> Vec<u32> {
        match self.bos {
            Some(bos) if self.add_bos && ids.first() != Some(&bos) => {
                ids.insert(0, bos);
                ids
            }
            _ => ids,
        }
    }

    /// Ids to text; invalid UTF-8 (a character cut between ids) becomes U+FFFD.
    /// `skip_special` drops control tokens, as llama.cpp's detokenize without `special`.
    /// SentencePiece vocabularies that add a space prefix lose one leading space of the
    /// first id's text, as in llama.cpp (so BOS first keeps the text's space).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let (false, Engine::Hf(hf)) = (self.byte_level, &self.engine) {
            return hf.inner.decode(ids, skip_special).map_err(tk_err("decode"));
        }
        let mut out = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let piece = self
                .bytes
                .get(id as usize)
                .ok_or_else(|| Error::Tokenizer(format!("decode: id {id} out of vocabulary")))?;
            if !(skip_special && self.special[id as usize]) {
                match piece.split_first() {
                    Some((b' ', rest)) if i == 0 && self.strip_leading_space => {
                        out.extend_from_slice(rest)
                    }
                    _ => out.extend_from_slice(piece),
                }
            }
        }
        Ok(match String::from_utf8(out) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The raw bytes a token stands for (special tokens: their text). A multi-byte
    /// character may be split across tokens, so these are bytes, not a `str`. For
    /// SentencePiece-style vocabularies `▁` reads as a space, including at the start.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        self.bytes.get(id as usize).map(|b| b.to_vec())
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }

    /// The beginning-of-sequence id, when the tokenizer has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-generation ids: the model's `eos` first, then other control tokens that end
    /// a turn (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...), as llama.cpp's EOG set.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }

    /// Control tokens (dropped by `decode(.., true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Whether `encode` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The model's jinja chat template, when it ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The id of a token's vocabulary string (byte-level form: `Ġthe`, SentencePiece's
    /// `▁the`; specials as written).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.engine {
            Engine::Hf(hf) => hf.inner.token_to_id(token),
            Engine::Spm(spm) => spm.token_to_id(token),
        }
    }

    /// The HF engine, for tests of its internals.
    #[cfg(test)]
    fn hf(&self) -> &HfEngine {
        match &self.engine {
            Engine::Hf(hf) => hf,
            Engine::Spm(_) => panic!("a SentencePiece tokenizer has no HF engine"),
        }
    }

    /// A token's text as the chat template sees it (`bos_token`, `eos_token`): lossy UTF-8.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.bytes
            .get(id as usize)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

struct Parts {
    inner: tokenizers::Tokenizer,
    bytes: Vec<Box<[u8]>>,
    special: Vec<bool>,
    byte_level: bool,
    post_process: bool,
    add_bos: bool,
    bos: Option<u32>,
    eos: Vec<u32>,
    chat_template: Option<String>,
}

/// `eos` first, then special tokens whose text (one of `eog_texts`) marks an end of
/// turn, each once.
fn end_ids<'a>(
    eos: Option<u32>,
    is_special: impl Fn(u32) -> bool,
    names: impl Iterator<Item = (&'a String, u32)>,
    is_eog: impl Fn(&str) -> bool,
) -> Vec<u32> {
    let mut out: Vec<u32> = eos.into_iter().collect();
    for (text, id) in names {
        if is_eog(text) && is_special(id) && !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

fn is_byte_level(decoder: Option<&DecoderWrapper>) -> bool {
    match decoder {
        Some(DecoderWrapper::ByteLevel(_)) => true,
        Some(DecoderWrapper::Sequence(seq)) => seq
            .get_decoders()
            .iter()
            .any(|d| matches!(d, DecoderWrapper::ByteLevel(_))),
        _ => false,
    }
}

/// The chat template from tokenizer_config.json: a string, or a list of named templates
/// of which "default" is the chat one.
fn chat_template_from_config(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
        _ => None,
    }
}

/// GPT-2's byte ⇄ char table: printable Latin-1 bytes stand for themselves, the other 68
/// bytes map in order to U+0100.. so every byte has a visible character.
fn byte_to_char() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        table[b as usize] = if printable(b) {
            b as char
        } else {
            next += 1;
            char::from_u32(next - 1).expect("below U+0200")
        };
    }
    table
}

/// Byte-level token text to its bytes; text with a char outside the table (an added
/// token stored verbatim) is its own UTF-8.
fn byte_level_decode(text: &str) -> Box<[u8]> {
    byte_level_bytes(text)
        .unwrap_or_else(|| text.as_bytes().to_vec())
        .into_boxed_slice()
}

/// The bytes byte-level text stands for; None if a char is outside the table.
fn byte_level_bytes(text: &str) -> Option<Vec<u8>> {
    static CHAR_TO_BYTE: std::sync::LazyLock<std::collections::HashMap<char, u8>> =
        std::sync::LazyLock::new(|| {
            byte_to_char()
                .iter()
                .zip(0..=255u8)
                .map(|(&c, b)| (c, b))
                .collect()
        });
    text.chars()
        .map(|c| CHAR_TO_BYTE.get(&c).copied())
        .collect()
}

/// SentencePiece-style token text to bytes: `<0xAB>` byte tokens, `▁` for spaces.
fn spm_piece_bytes(text: &str) -> Box<[u8]> {
    if let Some(hex) = text.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
        if let (2, Ok(b)) = (hex.len(), u8::from_str_radix(hex, 16)) {
            return Box::new([b]);
        }
    }
    text.replace('\u{2581}', " ")
        .into_bytes()
        .into_boxed_slice()
}

#[cfg(test)]
mod tests;
