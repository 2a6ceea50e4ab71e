//! Model hyper-parameters of the Llama family, read from HF `config.json` or GGUF metadata.

use serde::Deserialize;

use super::gguf::GgufFile;
use crate::error::{Error, Result};

/// Llama 3.1's frequency-dependent RoPE scaling (`rope_scaling.rope_type == "llama3"`).
#[derive(Debug, Clone, PartialEq)]
pub struct Llama3RopeScaling {
    /// Divisor of the low frequencies.
    pub factor: f32,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled
    /// by `1 / factor`.
    pub low_freq_factor: f32,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept;
    /// those in between are interpolated.
    pub high_freq_factor: f32,
    /// The context length the model was trained at before scaling.
    pub original_max_position_embeddings: usize,
}

/// The element type of the CPU engine's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// 32-bit floats.
    F32,
    /// Half the memory; attention scores are then computed at the keys' precision.
    F16,
}

/// Shapes and constants of a Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// A GGUF file's `general.architecture` (`llama`, `mistral`, `qwen2`), or an HF
    /// checkpoint's class (`LlamaForCausalLM`, ...).
    pub architecture: String,
    /// Tokens in the vocabulary (rows of the embedding and the lm_head).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention); divides `num_heads`.
    pub num_kv_heads: usize,
    /// Width of one head; even.
    pub head_dim: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Llama 3 RoPE scaling, when the model uses it.
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f32,
    /// Context length: the positions the model serves.
    pub max_position_embeddings: usize,
    /// The lm_head reuses the token embedding (a GGUF file without `output.weight`).
    pub tie_word_embeddings: bool,
    /// Qwen2 has biases on the q, k and v projections.
    pub attention_bias: bool,
    /// The beginning-of-sequence token, when the model names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens: generation stops at any of them.
    pub eos_token_ids: Vec<u32>,
    /// GGUF models use an f16 cache (llama.cpp's convention for the format); HF
    /// checkpoints use f32 on the CPU.
    pub kv_dtype: KvDtype,
}

impl ModelConfig {
    /// Checks the invariants the forward pass relies on.
    pub fn validate(&self) -> Result<()> {
        let fail = |m: String| Err(Error::Model(m));
        if self.num_heads == 0 || self.num_kv_heads == 0 || self.num_layers == 0 {
            return fail("num_heads, num_kv_heads and num_layers must be positive".into());
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return fail(format!(
                "num_heads {} is not a multiple of num_kv_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return fail(format!(
                "head_dim {} must be even and positive",
                self.head_dim
            ));
        }
        if self.hidden_size == 0 || self.intermediate_size == 0 || self.vocab_size == 0 {
            return fail("hidden_size, intermediate_size and vocab_size must be positive".into());
        }
        Ok(())
    }

    /// Width of the queries of one token, all heads: `num_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the keys (or values) of one token, all heads: `num_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Inverse RoPE frequencies, one per rotated pair, with Llama 3 scaling applied.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let f = 1.0 / (self.rope_theta as f64).powf(2.0 * i as f64 / self.head_dim as f64);
                match &self.rope_scaling {
                    None => f as f32,
                    Some(s) => llama3_scale(f, s) as f32,
                }
            })
            .collect()
    }

    /// Reads the hyper-parameters of a GGUF file's `general.architecture` (llama, mistral,
    /// qwen2).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let arch = file
            .require("general.architecture")?
            .as_str()
            .ok_or_else(|| Error::Gguf("general.architecture is not a string".into()))?
            .to_string();
        if !["llama", "mistral", "qwen2"].contains(&arch.as_str()) {
            return Err(Error::Gguf(format!(
                "architecture {arch:?} is not supported (llama, mistral, qwen2 are)"
            )));
        }
        let int = |key: &str| -> Result<usize> {
            let k = format!("{arch}.{key}");
            file.require(&k)?
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| Error::Gguf(format!("{k} is not an integer")))
        };
        let float = |key: &str, default: f32| -> f32 {
            file.get(&format!("{arch}.{key}"))
                .and_then(|v| v.as_f32())
                .unwrap_or(default)
        };
        let hidden_size = int("embedding_length")?;
        let num_heads = int("attention.head_count")?;
        let num_kv_heads = int("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = int("attention.key_length")
            .or_else(|_| int("rope.dimension_count"))
            .unwrap_or(hidden_size / num_heads.max(1));
        let vocab_size = match int("vocab_size") {
            Ok(v) => v,
            Err(_) => file
                .get("tokenizer.ggml.tokens")
                .and_then(|t| t.as_array())
                .map(|t| t.len())
                .ok_or_else(|| {
                    Error::Gguf("neither vocab_size nor tokenizer.ggml.tokens".into())
                })?,
        };
        let token_id = |key: &str| file.get(key).and_then(|v| v.as_u32());
        let cfg = ModelConfig {
            architecture: arch.clone(),
            vocab_size,
            hidden_size,
            intermediate_size: int("feed_forward_length")?,
            num_layers: int("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta: float("rope.freq_base", 10000.0),
            rope_scaling: None,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon", 1e-5),
            max_position_embeddings: int("context_length").unwrap_or(4096),
            tie_word_embeddings: file.tensor_info("output.weight").is_none(),
            attention_bias: file.tensor_info("blk.0.attn_q.bias").is_some(),
            bos_token_id: token_id("tokenizer.ggml.bos_token_id"),
            eos_token_ids: token_id("tokenizer.ggml.eos_token_id")
                .into_iter()
                .collect(),
            kv_dtype: KvDtype::F16,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads an HF `config.json` (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM).
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let raw: HfConfig = serde_json::from_str(text)
            .map_err(|e| Error::Checkpoint(format!("config.json: {e}")))?;
        let architecture = raw
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned())
            .or(raw.model_type.clone())
            .unwrap_or_else(|| "LlamaForCausalLM".into());
        let known = ["Llama", "Mistral", "Qwen2", "llama", "mistral", "qwen2"];
        if !known.iter().any(|k| architecture.starts_with(k)) {
            return Err(Error::Checkpoint(format!(
                "architecture {architecture} is not in the Llama family"
            )));
        }
        let is_qwen2 = architecture.to_lowercase().starts_with("qwen2");
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads.max(1));
        // transformers 5 writes `rope_parameters` (rope_theta and the scaling together)
        // where 4.x wrote `rope_theta` and `rope_scaling`.
        let params = raw.rope_parameters;
        let rope_theta = raw
            .rope_theta
            .or(params.as_ref().and_then(|p| p.rope_theta))
            .unwrap_or(10000.0);
        let rope_scaling = match raw.rope_scaling.or(params.map(|p| p.scaling)) {
            Some(s) if s.rope_type.as_deref().or(s.kind.as_deref()) == Some("llama3") => {
                Some(Llama3RopeScaling {
                    factor: s.factor.unwrap_or(1.0),
                    low_freq_factor: s.low_freq_factor.unwrap_or(1.0),
                    high_freq_factor: s.high_freq_factor.unwrap_or(4.0),
                    original_max_position_embeddings: s
                        .original_max_position_embeddings
                        .unwrap_or(8192),
                })
            }
            Some(s) => {
                let kind = s.rope_type.or(s.kind).unwrap_or_default();
                if kind != "default" {
                    return Err(Error::Checkpoint(format!(
                        "rope_scaling type {kind:?} is not supported"
                    )));
                }
                None
            }
            None => None,
        };
        let cfg = ModelConfig {
            architecture,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            rope_theta,
            rope_scaling,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(is_qwen2),
            bos_token_id: raw.bos_token_id,
            eos_token_ids: match raw.eos_token_id {
                Some(EosIds::One(id)) => vec![id],
                Some(EosIds::Many(ids)) => ids,
                None => vec![],
            },
            kv_dtype: KvDtype::F32,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

fn llama3_scale(freq: f64, s: &Llama3RopeScaling) -> f64 {
    let old = s.original_max_position_embeddings as f64;
    let low_wavelen = old / s.low_freq_factor as f64;
    let high_wavelen = old / s.high_freq_factor as f64;
    let wavelen = 2.0 * std::f64::consts::PI / freq;
    if wavelen < high_wavelen {
        freq
    } else if wavelen > low_wavelen {
        freq / s.factor as f64
    } else {
        let smooth = (old / wavelen - s.low_freq_factor as f64)
            / (s.high_freq_factor as f64 - s.low_freq_factor as f64);
        (1.0 - smooth) * freq / s.factor as f64 + smooth * freq
    }
}

#[derive(Deserialize)]
struct HfConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_theta: Option<f32>,
    rope_scaling: Option<HfRopeScaling>,
    rope_parameters: Option<HfRopeParameters>,
    rms_norm_eps: Option<f32>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<EosIds>,
}

#[derive(Deserialize)]
struct HfRopeScaling {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
}

/// transformers 5's `rope_parameters`: the theta beside the scaling fields.
#[derive(Deserialize)]
struct HfRopeParameters {
    rope_theta: Option<f32>,
    #[serde(flatten)]
    scaling: HfRopeScaling,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum EosIds {
    One(u32),
    Many(Vec<u32>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_llama3_config_with_rope_scaling() {
        let json = r#"{"architectures":["LlamaForCausalLM"],"vocab_size":128256,"hidden_size":2048,
            "intermediate_size":8192,"num_hidden_layers":16,"num_attention_heads":32,
            "num_key_value_heads":8,"rope_theta":500000.0,"rms_norm_eps":1e-5,
            "max_position_embeddings":131072,"tie_word_embeddings":true,
            "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"},
            "bos_token_id":128000,"eos_token_id":[128001,128008,128009]}"#;
        let c = ModelConfig::from_hf_json(json).unwrap();
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.num_kv_heads, 8);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
        let f = c.rope_inv_freq();
        assert_eq!(f.len(), 32);
        // Highest frequency is untouched, the lowest is divided by the factor.
        assert_eq!(f[0], 1.0);
        let plain = 1.0 / 500000f64.powf(62.0 / 64.0);
        assert!(((f[31] as f64) - plain / 32.0).abs() / (plain / 32.0) < 1e-5);
    }

    #[test]
    fn reads_transformers5_rope_parameters() {
        let json = r#"{"architectures":["LlamaForCausalLM"],"vocab_size":128256,"hidden_size":2048,
            "intermediate_size":8192,"num_hidden_layers":16,"num_attention_heads":32,
            "num_key_value_heads":8,"rms_norm_eps":1e-5,"max_position_embeddings":131072,
            "rope_parameters":{"rope_theta":500000.0,"factor":32.0,"high_freq_factor":4.0,
            "low_freq_factor":1.0,"original_max_position_embeddings":8192,"rope_type":"llama3"}}"#;
        let c = ModelConfig::from_hf_json(json).unwrap();
        assert_eq!(c.rope_theta, 500000.0);
        assert_eq!(c.rope_scaling.as_ref().map(|s| s.factor), Some(32.0));
        let plain = r#"{"vocab_size":10,"hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":1,"num_attention_heads":4,
            "rope_parameters":{"rope_theta":100000.0,"rope_type":"default"}}"#;
        let c = ModelConfig::from_hf_json(plain).unwrap();
        assert_eq!((c.rope_theta, c.rope_scaling), (100000.0, None));
    }

    #[test]
    fn qwen2_gets_attention_bias_and_bad_heads_are_rejected() {
        let json = r#"{"architectures":["Qwen2ForCausalLM"],"vocab_size":100,"hidden_size":64,
            "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
            "num_key_value_heads":2}"#;
        assert!(ModelConfig::from_hf_json(json).unwrap().attention_bias);
        let bad = json.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3");
        let err = ModelConfig::from_hf_json(&bad).unwrap_err().to_string();
        assert!(err.contains("not a multiple"), "{err}");
        let gpt2 = json.replace("Qwen2ForCausalLM", "GPT2LMHeadModel");
        assert!(ModelConfig::from_hf_json(&gpt2).is_err());
    }
}
