//! The tiny random Llama checkpoint that tests across the project build for themselves:
//! `write_tiny_checkpoint` writes an HF directory (config.json, safetensors, sharded with
//! an index when asked, tokenizer.json and tokenizer_config.json), all from a fixed seed.
//!
//! Weights are normal with std 1/sqrt(fan_in) (embeddings 0.5, norms 1 ± 0.1), so the
//! residual stream stays O(1) through the layers and the logits are not degenerate. Each
//! tensor draws from its own stream keyed by (seed, name): changing the dtype, the
//! sharding or the tying leaves every other tensor's values unchanged.
//!
//! The tokenizer is a byte-level BPE: the 256 byte tokens (GPT-2's byte-to-unicode
//! mapping), merges learnt deterministically from a short English text (then synthetic
//! merges if the text runs out), and `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` at the
//! last three ids.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};

use crate::error::{Error, Result};

/// Storage dtype of the tiny checkpoint's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TinyDtype {
    /// 32-bit floats.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE half precision.
    F16,
}

/// Shape and options of the tiny random model.
#[derive(Debug, Clone, PartialEq)]
pub struct TinySpec {
    /// Tokens in the vocabulary: 256 bytes, merges, then the three special tokens (at
    /// least 259).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// No `lm_head.weight`: the lm_head is the embedding.
    pub tie_word_embeddings: bool,
    /// Biases on q, k and v; the checkpoint is then a Qwen2ForCausalLM.
    pub attention_bias: bool,
    /// Storage type of the weights.
    pub dtype: TinyDtype,
    /// Number of safetensors files; more than one adds `model.safetensors.index.json`.
    pub shards: usize,
    /// Seeds every tensor's values.
    pub seed: u64,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Context length written to config.json.
    pub max_position_embeddings: usize,
}

impl Default for TinySpec {
    fn default() -> Self {
        TinySpec {
            vocab_size: 512,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 3,
            num_heads: 4,
            num_kv_heads: 2,
            tie_word_embeddings: false,
            attention_bias: false,
            dtype: TinyDtype::F32,
            shards: 1,
            seed: 7,
            rope_theta: 10000.0,
            max_position_embeddings: 2048,
        }
    }
}

/// RMSNorm epsilon written to config.json.
pub(crate) const TINY_RMS_NORM_EPS: f32 = 1e-5;
/// The special tokens, in id order, occupying the last three ids of the vocabulary.
pub(crate) const TINY_SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The text the tokenizer's merges are learnt from.
const CORPUS: &str = "The quick brown fox jumps over the lazy dog. In the beginning there was \
    the word, and the word was with the people who spoke it. This is a small model that \
    is used for testing the server: it reads a prompt, then it writes one token at a time \
    until it reaches the end of the answer or the limit that the user has set. What is the \
    capital of France? The capital of France is Paris. Hello, how are you today? I am fine, \
    thank you, and how are you? We would like to know where the nearest station is, and \
    whether the trains are running on time this evening. Information about the weather \
    should be available from the service at any time of the day or night. Once upon a time \
    there lived a king and a queen who had no children; they wished for a daughter every \
    day of their lives. Please write a short story about a cat that learns to read books, \
    and then explain what the story means for the readers who have never owned a cat.";

/// Writes a tiny random Llama checkpoint with its tokenizer into `dir` (created if needed).
pub fn write_tiny_checkpoint(dir: &Path, spec: &TinySpec) -> Result<()> {
    check_spec(spec)?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    write_weights(dir, spec)?;
    let write_json = |name: &str, value: &Value| {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(value).expect("JSON values always serialize");
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
    };
    write_json("config.json", &config_json(spec))?;
    write_json("tokenizer.json", &tokenizer_json(spec.vocab_size))?;
    write_json("tokenizer_config.json", &tokenizer_config_json(spec))?;
    Ok(())
}

fn check_spec(s: &TinySpec) -> Result<()> {
    let fail = |m: String| Err(Error::Model(format!("tiny model: {m}")));
    if s.vocab_size < 256 + TINY_SPECIAL_TOKENS.len() {
        return fail(format!(
            "vocab_size {} < 259 (bytes + specials)",
            s.vocab_size
        ));
    }
    if s.num_heads == 0 || s.num_kv_heads == 0 || s.num_layers == 0 || s.hidden_size == 0 {
        return fail("sizes must be positive".into());
    }
    if !s.hidden_size.is_multiple_of(s.num_heads)
        || !(s.hidden_size / s.num_heads).is_multiple_of(2)
    {
        return fail(format!(
            "hidden_size {} must split into {} heads of even size",
            s.hidden_size, s.num_heads
        ));
    }
    if !s.num_heads.is_multiple_of(s.num_kv_heads) {
        return fail(format!(
            "num_heads {} is not a multiple of num_kv_heads {}",
            s.num_heads, s.num_kv_heads
        ));
    }
    if s.shards == 0 {
        return fail("shards must be at least 1".into());
    }
    Ok(())
}

/// The checkpoint's tensors in HF order: (name, shape, values).
fn tensors(spec: &TinySpec) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let (h, v, ff) = (spec.hidden_size, spec.vocab_size, spec.intermediate_size);
    let hd = h / spec.num_heads;
    let (q, kv) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let fan_in = |n: usize| 1.0 / (n as f64).sqrt();
    // (name, shape, mean, std) in HF order.
    let mut plan = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![v, h],
        0.0,
        0.5,
    )];
    for i in 0..spec.num_layers {
        let mut layer = vec![
            ("input_layernorm.weight", vec![h], 1.0, 0.1),
            ("self_attn.q_proj.weight", vec![q, h], 0.0, fan_in(h)),
            ("self_attn.k_proj.weight", vec![kv, h], 0.0, fan_in(h)),
            ("self_attn.v_proj.weight", vec![kv, h], 0.0, fan_in(h)),
            ("self_attn.o_proj.weight", vec![h, q], 0.0, fan_in(q)),
            ("post_attention_layernorm.weight", vec![h], 1.0, 0.1),
            ("mlp.gate_proj.weight", vec![ff, h], 0.0, fan_in(h)),
            ("mlp.up_proj.weight", vec![ff, h], 0.0, fan_in(h)),
            ("mlp.down_proj.weight", vec![h, ff], 0.0, fan_in(ff)),
        ];
        if spec.attention_bias {
            layer.push(("self_attn.q_proj.bias", vec![q], 0.0, 0.2));
            layer.push(("self_attn.k_proj.bias", vec![kv], 0.0, 0.2));
            layer.push(("self_attn.v_proj.bias", vec![kv], 0.0, 0.2));
        }
        let named = layer
            .into_iter()
            .map(|(n, s, m, d)| (format!("model.layers.{i}.{n}"), s, m, d));
        plan.extend(named);
    }
    plan.push(("model.norm.weight".into(), vec![h], 1.0, 0.1));
    if !spec.tie_word_embeddings {
        plan.push(("lm_head.weight".into(), vec![v, h], 0.0, fan_in(h)));
    }
    plan.into_iter()
        .map(|(name, shape, mean, std)| {
            let mut rng = Rng::new(spec.seed, &name);
            let n = shape.iter().product();
            let values = (0..n).map(|_| (mean + std * rng.normal()) as f32).collect();
            (name, shape, values)
        })
        .collect()
}

fn to_bytes(values: &[f32], dtype: TinyDtype) -> (Dtype, Vec<u8>) {
    match dtype {
        TinyDtype::F32 => (
            Dtype::F32,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        TinyDtype::BF16 => (
            Dtype::BF16,
            values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
        ),
        TinyDtype::F16 => (
            Dtype::F16,
            values
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
        ),
    }
}

fn write_weights(dir: &Path, spec: &TinySpec) -> Result<()> {
    let all: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = tensors(spec)
        .into_iter()
        .map(|(name, shape, values)| {
            let (dtype, bytes) = to_bytes(&values, spec.dtype);
            (name, shape, dtype, bytes)
        })
        .collect();
    if spec.shards > all.len() {
        return Err(Error::Model(format!(
            "tiny model: {} shards for only {} tensors",
            spec.shards,
            all.len()
        )));
    }
    let per_shard = all.len().div_ceil(spec.shards);
    let chunks: Vec<_> = all.chunks(per_shard).collect();
    let n = chunks.len();
    let mut weight_map = BTreeMap::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let file = if spec.shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        };
        let views = chunk
            .iter()
            .map(|(name, shape, dtype, bytes)| {
                weight_map.insert(name.clone(), file.clone());
                TensorView::new(*dtype, shape.clone(), bytes).map(|v| (name.as_str(), v))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::Checkpoint(format!("tiny model: {e}")))?;
        let path = dir.join(&file);
        safetensors::serialize_to_file(views, &None, &path)
            .map_err(|e| Error::Checkpoint(format!("{}: {e}", path.display())))?;
    }
    if spec.shards > 1 {
        let total: usize = all.iter().map(|t| t.3.len()).sum();
        let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        let path = dir.join("model.safetensors.index.json");
        let text = serde_json::to_string_pretty(&index).expect("JSON values always serialize");
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

fn special_id(spec_vocab: usize, token: &str) -> usize {
    let pos = TINY_SPECIAL_TOKENS.iter().position(|t| *t == token);
    spec_vocab - TINY_SPECIAL_TOKENS.len() + pos.expect("a known special token")
}

fn config_json(spec: &TinySpec) -> Value {
    let (arch, model_type) = if spec.attention_bias {
        ("Qwen2ForCausalLM", "qwen2")
    } else {
        ("LlamaForCausalLM", "llama")
    };
    let torch_dtype = match spec.dtype {
        TinyDtype::F32 => "float32",
        TinyDtype::BF16 => "bfloat16",
        TinyDtype::F16 => "float16",
    };
    let mut cfg = json!({
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.hidden_size / spec.num_heads,
        "hidden_act": "silu",
        "rms_norm_eps": TINY_RMS_NORM_EPS,
        "rope_theta": spec.rope_theta,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": torch_dtype,
        "bos_token_id": special_id(spec.vocab_size, "<|im_start|>"),
        "eos_token_id": special_id(spec.vocab_size, "<|im_end|>"),
    });
    // HF Llama's attention_bias also puts a bias on o_proj; Qwen2 implies q/k/v only.
    if !spec.attention_bias {
        cfg["attention_bias"] = json!(false);
    }
    cfg
}

fn tokenizer_config_json(spec: &TinySpec) -> Value {
    let decoder: serde_json::Map<String, Value> = TINY_SPECIAL_TOKENS
        .iter()
        .map(|t| {
            let id = special_id(spec.vocab_size, t).to_string();
            (
                id,
                json!({ "content": t, "lstrip": false, "normalized": false,
                "rstrip": false, "single_word": false, "special": true }),
            )
        })
        .collect();
    json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "model_max_length": spec.max_position_embeddings,
        "tokenizer_class": "GPT2Tokenizer",
    })
}

/// GPT-2's reversible map from bytes to printable unicode characters.
fn byte_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut extra = 0;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        map[b as usize] = char::from_u32(c).expect("valid code point");
    }
    map
}

/// Splits like GPT-2's pre-tokenizer on plain text: runs of letters, digits or other
/// characters, each taking one leading space.
fn pre_split(text: &str) -> Vec<String> {
    let class = |c: char| match c {
        c if c.is_alphabetic() => 0,
        c if c.is_numeric() => 1,
        c if c.is_whitespace() => 2,
        _ => 3,
    };
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        let same = cur
            .chars()
            .last()
            .is_some_and(|l| class(l) == class(c) && class(c) != 2);
        if !(cur.is_empty() || cur == " " || same) {
            out.push(std::mem::take(&mut cur));
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

/// Learns `n_merges` merges: most frequent pair first (ties broken by the pair's text).
fn learn_merges(bytes: &[char; 256], vocab: &mut Vec<String>, n_merges: usize) -> Vec<String> {
    let mut known: HashSet<String> = vocab.iter().cloned().collect();
    let mut words: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for piece in pre_split(CORPUS) {
        let symbols = piece
            .bytes()
            .map(|b| bytes[b as usize].to_string())
            .collect();
        *words.entry(symbols).or_default() += 1;
    }
    let mut merges = Vec::new();
    while merges.len() < n_merges {
        let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (w, f) in &words {
            for p in w.windows(2) {
                *counts.entry((p[0].clone(), p[1].clone())).or_default() += f;
            }
        }
        // BTreeMap iterates in text order, so max_by_key's last-wins needs the reverse.
        let Some(((a, b), _)) = counts.into_iter().rev().max_by_key(|(_, c)| *c) else {
            break;
        };
        let joined = format!("{a}{b}");
        words = words
            .into_iter()
            .map(|(w, f)| (merge_word(&w, &a, &b, &joined), f))
            .fold(BTreeMap::new(), |mut m, (w, f)| {
                *m.entry(w).or_default() += f;
                m
            });
        merges.push(format!("{a} {b}"));
        if known.insert(joined.clone()) {
            vocab.push(joined);
        }
    }
    merges
}

fn merge_word(w: &[String], a: &str, b: &str, joined: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(w.len());
    let mut i = 0;
    while i < w.len() {
        if i + 1 < w.len() && w[i] == a && w[i + 1] == b {
            out.push(joined.to_string());
            i += 2;
        } else {
            out.push(w[i].clone());
            i += 1;
        }
    }
    out
}

/// HF tokenizers' JSON for the byte-level BPE filling `vocab_size` ids.
fn tokenizer_json(vocab_size: usize) -> Value {
    let bytes = byte_to_unicode();
    let target = vocab_size - TINY_SPECIAL_TOKENS.len();
    let mut vocab: Vec<String> = bytes.iter().map(|c| c.to_string()).collect();
    let mut merges = learn_merges(&bytes, &mut vocab, target - 256);
    // Past the corpus, synthetic merges (a known token + a letter) keep the vocab full.
    let letters: Vec<char> = ('a'..='z').chain('A'..='Z').collect();
    let mut known: HashSet<String> = vocab.iter().cloned().collect();
    let mut i = 0;
    while vocab.len() < target {
        // Each known token has 52 extensions and only finitely many exist, so the
        // token index stays below vocab.len().
        let a = vocab[i / letters.len()].clone();
        let b = letters[i % letters.len()].to_string();
        i += 1;
        let joined = format!("{a}{b}");
        if known.insert(joined.clone()) {
            merges.push(format!("{a} {b}"));
            vocab.push(joined);
        }
    }
    let mut vocab_map: serde_json::Map<String, Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let added: Vec<Value> = TINY_SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            vocab_map.insert(t.to_string(), json!(target + i));
            json!({ "id": target + i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true })
        })
        .collect();
    let byte_level = |prefix: bool| {
        json!({ "type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true,
            "use_regex": true })
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level(false),
        "post_processor": byte_level(false),
        "decoder": byte_level(false),
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab_map,
            "merges": merges,
        },
    })
}

/// SplitMix64 seeded from (seed, tensor name), with Box-Muller normals: independent of
/// any crate's generator so checkpoints are identical across dependency versions.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, name: &str) -> Self {
        // FNV-1a over the name, mixed with the seed.
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
        Rng(h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::family::Bias;
    use crate::model::safetensors::HfCheckpoint;

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "inflight-tiny-{tag}-{}-{}",
            std::process::id(),
            std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn writes_a_loadable_deterministic_checkpoint() {
        let spec = TinySpec::default();
        let (a, b) = (temp_dir("a"), temp_dir("b"));
        write_tiny_checkpoint(&a, &spec).unwrap();
        write_tiny_checkpoint(&b, &spec).unwrap();
        for f in [
            "model.safetensors",
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            assert_eq!(
                std::fs::read(a.join(f)).unwrap(),
                std::fs::read(b.join(f)).unwrap()
            );
        }
        let ck = HfCheckpoint::open(&a).unwrap();
        let c = ck.config();
        assert_eq!((c.vocab_size, c.hidden_size, c.num_layers), (512, 64, 3));
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, 16));
        assert_eq!(c.eos_token_ids, vec![511]);
        assert_eq!(c.bos_token_id, Some(510));
        assert!(c.arch.bias == Bias::None && !c.tie_word_embeddings);
        assert_eq!(ck.names().len(), 2 + 3 * 9 + 1);
        let (shape, w) = ck
            .tensor_f32("model.layers.2.mlp.down_proj.weight")
            .unwrap();
        assert_eq!(shape, vec![64, 128]);
        let std = (w.iter().map(|x| x * x).sum::<f32>() / w.len() as f32).sqrt();
        assert!((std - 1.0 / 128f32.sqrt()).abs() < 0.01, "{std}");
        let (_, norm) = ck.tensor_f32("model.norm.weight").unwrap();
        assert!(norm.iter().all(|x| (0.5..1.5).contains(x)));
        std::fs::remove_dir_all(&a).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
    }

    #[test]
    fn variants_share_values_across_dtype_sharding_and_tying() {
        let base = TinySpec::default();
        let f32_dir = temp_dir("f32");
        write_tiny_checkpoint(&f32_dir, &base).unwrap();
        let spec = TinySpec {
            dtype: TinyDtype::BF16,
            shards: 3,
            tie_word_embeddings: true,
            attention_bias: true,
            ..base
        };
        let bf_dir = temp_dir("bf16");
        write_tiny_checkpoint(&bf_dir, &spec).unwrap();
        assert!(bf_dir.join("model-00003-of-00003.safetensors").is_file());
        let (f, b) = (
            HfCheckpoint::open(&f32_dir).unwrap(),
            HfCheckpoint::open(&bf_dir).unwrap(),
        );
        assert!(b.config().arch.bias == Bias::Qkv && b.config().tie_word_embeddings);
        assert_eq!(b.config().architecture, "Qwen2ForCausalLM");
        assert!(
            !b.contains("lm_head.weight") && b.contains("model.layers.0.self_attn.k_proj.bias")
        );
        let name = "model.layers.1.self_attn.q_proj.weight";
        let (x, y) = (f.tensor_f32(name).unwrap().1, b.tensor_f32(name).unwrap().1);
        for (x, y) in x.iter().zip(&y) {
            assert_eq!(half::bf16::from_f32(*x).to_f32(), *y);
        }
        std::fs::remove_dir_all(&f32_dir).unwrap();
        std::fs::remove_dir_all(&bf_dir).unwrap();
    }

    #[test]
    fn bad_specs_are_errors() {
        let dir = temp_dir("bad");
        let bad = [
            TinySpec {
                vocab_size: 200,
                ..Default::default()
            },
            TinySpec {
                num_kv_heads: 3,
                ..Default::default()
            },
            TinySpec {
                shards: 0,
                ..Default::default()
            },
            TinySpec {
                shards: 1000,
                ..Default::default()
            },
        ];
        for spec in bad {
            assert!(write_tiny_checkpoint(&dir, &spec).is_err(), "{spec:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tokenizer_loads_round_trips_and_uses_merges() {
        for vocab_size in [512, 2048] {
            let dir = temp_dir("tok");
            let spec = TinySpec {
                vocab_size,
                num_layers: 1,
                ..Default::default()
            };
            write_tiny_checkpoint(&dir, &spec).unwrap();
            let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
            assert_eq!(tok.get_vocab_size(true), vocab_size);
            let text = "Hello, the quick brown fox! Ünïcødé 漢字 and\ttabs\n\nnew lines 12345.";
            let enc = tok.encode(text, false).unwrap();
            assert!(
                enc.get_ids().len() < text.len(),
                "merges should shorten the text"
            );
            assert!(enc
                .get_ids()
                .iter()
                .all(|&id| (id as usize) < vocab_size - 3));
            assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);

            let chat = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n";
            let ids = tok.encode(chat, false).unwrap().get_ids().to_vec();
            let n = vocab_size as u32;
            assert_eq!((ids[0], ids[ids.len() - 2]), (n - 2, n - 1));
            assert_eq!(tok.decode(&ids, false).unwrap(), chat);
            assert_eq!(tok.token_to_id("<|endoftext|>"), Some(n - 3));

            let cfg: Value =
                serde_json::from_slice(&std::fs::read(dir.join("tokenizer_config.json")).unwrap())
                    .unwrap();
            assert_eq!(cfg["eos_token"], "<|im_end|>");
            let mut env = minijinja::Environment::new();
            let template = cfg["chat_template"].as_str().unwrap();
            env.add_template("chat", template).unwrap();
            let messages = json!([{"role": "user", "content": "Hi"}]);
            let ctx = json!({"messages": messages, "add_generation_prompt": true});
            let rendered = env.get_template("chat").unwrap().render(ctx).unwrap();
            let want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
            assert_eq!(rendered, want);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
