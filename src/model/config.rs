//! Model hyper-parameters of every family the engines run, read from HF `config.json` or
//! GGUF metadata: the Llama shapes, the family's [`Arch`], RoPE scaling and attention scale.

use serde::Deserialize;
use serde_json::Value;

use super::family::{Arch, Bias, Family, Mlp, NormKind};
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

/// How RoPE frequencies are rescaled for a longer context.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.1's frequency-dependent scaling.
    Llama3(Llama3RopeScaling),
    /// Every frequency divided by `factor` (position interpolation; Gemma 3's global layers).
    Linear(f32),
    /// Each frequency divided by its own factor: Phi-3's LongRoPE short factors, or a GGUF
    /// file's `rope_freqs` tensor (Llama 3.1's scaling, precomputed by the converter).
    Factors(Vec<f32>),
}

/// Phi-3's LongRoPE past its original context: a sequence that reaches position
/// `original` is computed with `factors` in place of the short ones (`RopeScaling::Factors`)
/// at every position, its cache recomputed when it crosses there while decoding (HF
/// transformers' rule: the long factors once the sequence is longer than the original
/// context, the cache dropped at the crossing).
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    /// One divisor per rotated pair, as the short factors.
    pub factors: Vec<f32>,
    /// The context length the short factors serve (`original_max_position_embeddings`).
    pub original: usize,
}

/// The element type of the CPU engine's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// 32-bit floats.
    F32,
    /// Half the memory; attention scores are then computed at the keys' precision.
    F16,
}

/// Shapes and constants of a decoder of any supported family.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// A GGUF file's `general.architecture` (`llama`, `qwen3`, `gemma2`, ...), or an HF
    /// checkpoint's class (`LlamaForCausalLM`, ...).
    pub architecture: String,
    /// What the family changes in the Llama decoder.
    pub arch: Arch,
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
    /// RoPE base frequency (of the global layers, where local ones have their own).
    pub rope_theta: f32,
    /// RoPE scaling of the global layers, when the model uses it.
    pub rope_scaling: Option<RopeScaling>,
    /// LongRoPE's long factors, for sequences past the original context.
    pub long_rope: Option<LongRope>,
    /// The attention scores' scale: `1/sqrt(head_dim)` unless the family says otherwise.
    pub attn_scale: f32,
    /// Epsilon of every norm (RMSNorm or LayerNorm).
    pub rms_norm_eps: f32,
    /// Context length: the positions the model serves.
    pub max_position_embeddings: usize,
    /// The lm_head reuses the token embedding (a GGUF file without `output.weight`).
    pub tie_word_embeddings: bool,
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
        if let Some(RopeScaling::Factors(f)) = &self.rope_scaling {
            if f.len() != self.head_dim / 2 || f.iter().any(|v| !v.is_finite() || *v <= 0.0) {
                return fail(format!(
                    "RoPE factors: {} positive values expected, one per rotated pair",
                    self.head_dim / 2
                ));
            }
        }
        if let Some(l) = &self.long_rope {
            let short = matches!(&self.rope_scaling, Some(RopeScaling::Factors(_)));
            if !short
                || l.factors.len() != self.head_dim / 2
                || l.factors.iter().any(|v| !v.is_finite() || *v <= 0.0)
                || l.original == 0
            {
                return fail(format!(
                    "LongRoPE long factors: {} positive values expected beside the short ones",
                    self.head_dim / 2
                ));
            }
        }
        if self.arch.sliding_window == Some(0) {
            return fail("sliding_window must be positive".into());
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

    /// Inverse RoPE frequencies of the global layers, one per rotated pair, scaled.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        inv_freq(self.rope_theta, self.head_dim, self.rope_scaling.as_ref())
    }

    /// Inverse RoPE frequencies of a sequence past LongRoPE's original context.
    pub fn long_rope_inv_freq(&self) -> Option<Vec<f32>> {
        self.long_rope.as_ref().map(|l| {
            let long = RopeScaling::Factors(l.factors.clone());
            inv_freq(self.rope_theta, self.head_dim, Some(&long))
        })
    }

    /// The position from which a sequence takes the long RoPE factors (LongRoPE's
    /// original context), when the model has them.
    pub fn long_rope_from(&self) -> Option<usize> {
        self.long_rope.as_ref().map(|l| l.original)
    }

    /// Inverse RoPE frequencies of the local layers where they differ from the global
    /// ones (Gemma 3: their own base, unscaled).
    pub fn local_rope_inv_freq(&self) -> Option<Vec<f32>> {
        self.arch
            .local_rope_theta
            .map(|theta| inv_freq(theta, self.head_dim, None))
    }

    /// Reads the hyper-parameters of a GGUF file's `general.architecture`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let arch = file
            .require("general.architecture")?
            .as_str()
            .ok_or_else(|| Error::Gguf("general.architecture is not a string".into()))?
            .to_string();
        let family = Family::from_gguf(&arch)?;
        let int = |key: &str| -> Result<usize> {
            let k = format!("{arch}.{key}");
            file.require(&k)?
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| Error::Gguf(format!("{k} is not an integer")))
        };
        let opt_float = |key: &str| file.get(&format!("{arch}.{key}")).and_then(|v| v.as_f32());
        let float = |key: &str, default: f32| -> f32 { opt_float(key).unwrap_or(default) };
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
        let num_layers = int("block_count")?;
        let mut a = Arch::of(family);
        a.sliding_window = int("attention.sliding_window").ok().filter(|&w| w > 0);
        let mut attn_scale = 1.0 / (head_dim as f32).sqrt();
        let mut rope_scaling = None;
        let mut long_rope = None;
        let mut max_pos = int("context_length").unwrap_or(4096);
        match family {
            Family::Gemma2 | Family::Gemma3 => {
                // llama.cpp's graph for these: embeddings times sqrt(hidden), every second
                // (Gemma 2) or all but every sixth (Gemma 3) layer local, the 27B models
                // scaling queries by hidden/heads rather than head_dim.
                a.embed_scale = Some((hidden_size as f32).sqrt());
                let pattern = if family == Family::Gemma2 { 2 } else { 6 };
                a.local_layers = (0..num_layers).map(|l| l % pattern < pattern - 1).collect();
                let big = (family == Family::Gemma2 && num_layers == 46)
                    || (family == Family::Gemma3 && num_layers == 62);
                if big {
                    attn_scale = 1.0 / ((hidden_size / num_heads) as f32).sqrt();
                }
                if family == Family::Gemma2 {
                    a.attn_softcap = opt_float("attn_logit_softcapping");
                    a.final_softcap = opt_float("final_logit_softcapping");
                } else {
                    a.local_rope_theta = Some(float("rope.freq_base_swa", 10000.0));
                    let kind = file
                        .get(&format!("{arch}.rope.scaling.type"))
                        .and_then(|v| v.as_str().map(String::from));
                    if let Some(f) = opt_float("rope.scaling.factor").filter(|&f| f > 0.0) {
                        match kind.as_deref() {
                            None | Some("linear") => rope_scaling = Some(RopeScaling::Linear(f)),
                            Some("none") => {}
                            Some(other) => {
                                return Err(Error::Gguf(format!(
                                    "rope scaling {other:?} is not supported"
                                )))
                            }
                        }
                    }
                }
            }
            Family::Phi3 => {
                if let Some(info) = file.tensor_info("rope_factors_short.weight") {
                    let (_, f) = file.tensor_f32(&info.name)?;
                    rope_scaling = Some(RopeScaling::Factors(f));
                    let orig = int("rope.scaling.original_context_length").ok();
                    match (file.tensor_info("rope_factors_long.weight"), orig) {
                        (Some(info), Some(original)) if max_pos > original => {
                            let (_, factors) = file.tensor_f32(&info.name)?;
                            long_rope = Some(LongRope { factors, original });
                        }
                        (_, Some(orig)) => max_pos = max_pos.min(orig),
                        _ => {}
                    }
                    attn_scale *= float("rope.scaling.attn_factor", 1.0).powi(2);
                }
            }
            _ => {
                if file.tensor_info("rope_freqs.weight").is_some() {
                    let (_, f) = file.tensor_f32("rope_freqs.weight")?;
                    rope_scaling = Some(RopeScaling::Factors(f));
                }
            }
        }
        if a.bias == Bias::None && file.tensor_info("blk.0.attn_q.bias").is_some() {
            a.bias = Bias::Qkv;
        }
        let intermediate_size = int("feed_forward_length")?;
        let token_id = |key: &str| file.get(key).and_then(|v| v.as_u32());
        let eps_key = if a.norm == NormKind::Layer {
            "attention.layer_norm_epsilon"
        } else {
            "attention.layer_norm_rms_epsilon"
        };
        let cfg = ModelConfig {
            architecture: arch.clone(),
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta: float("rope.freq_base", 10000.0),
            rope_scaling,
            long_rope,
            attn_scale,
            rms_norm_eps: float(eps_key, 1e-5),
            max_position_embeddings: max_pos,
            tie_word_embeddings: file.tensor_info("output.weight").is_none(),
            bos_token_id: token_id("tokenizer.ggml.bos_token_id"),
            eos_token_ids: token_id("tokenizer.ggml.eos_token_id")
                .into_iter()
                .collect(),
            kv_dtype: KvDtype::F16,
            arch: a,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads an HF `config.json` of any supported family.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let raw: HfConfig = serde_json::from_str(text)
            .map_err(|e| Error::Checkpoint(format!("config.json: {e}")))?;
        let architecture = raw
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned())
            .or(raw.model_type.clone())
            .unwrap_or_else(|| "LlamaForCausalLM".into());
        let family = Family::from_hf(&architecture)?;
        let missing = |k: &str| Error::Checkpoint(format!("config.json: missing {k}"));
        let hidden_size = raw.hidden_size.ok_or_else(|| missing("hidden_size"))?;
        let num_heads = raw
            .num_attention_heads
            .ok_or_else(|| missing("num_attention_heads"))?;
        let num_layers = raw
            .num_hidden_layers
            .ok_or_else(|| missing("num_hidden_layers"))?;
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(num_heads);
        let head_dim = raw.head_dim.unwrap_or(hidden_size / num_heads.max(1));
        let intermediate_size = match (raw.intermediate_size, family) {
            (Some(f), _) => f,
            (None, Family::Gpt2) => 4 * hidden_size,
            (None, _) => return Err(missing("intermediate_size")),
        };
        if let Some(p) = raw.partial_rotary_factor.filter(|&p| p != 1.0) {
            return Err(Error::Checkpoint(format!(
                "partial_rotary_factor {p} is not supported"
            )));
        }
        let mut a = Arch::of(family);
        let act = raw
            .hidden_activation
            .clone()
            .or(raw.hidden_act.clone())
            .or(raw.activation_function.clone());
        let want_gelu = a.mlp != Mlp::SwiGlu;
        match act.as_deref() {
            None => {}
            Some("silu" | "swish") if !want_gelu => {}
            Some("gelu_pytorch_tanh" | "gelu_new" | "gelu_fast") if want_gelu => {}
            Some(other) => {
                return Err(Error::Checkpoint(format!(
                    "activation {other:?} is not supported for {architecture}"
                )))
            }
        }
        // transformers 5 writes `rope_parameters` (theta and scaling together, per layer
        // type for Gemma 3) where 4.x wrote `rope_theta`, `rope_scaling` and
        // `rope_local_base_freq`.
        let params = raw.rope_parameters.clone().unwrap_or(Value::Null);
        let (global, local) = match (
            params.get("full_attention"),
            params.get("sliding_attention"),
        ) {
            (Some(g), l) => (g.clone(), l.cloned()),
            _ => (params, None),
        };
        let global: HfRope = serde_json::from_value(global).unwrap_or_default();
        let local: Option<HfRope> = local.and_then(|l| serde_json::from_value(l).ok());
        let rope_theta = raw.rope_theta.or(global.rope_theta).unwrap_or(10000.0);
        let scaling = raw
            .rope_scaling
            .clone()
            .or(Some(global).filter(|g| g.kind().is_some()));
        let mut max_pos = raw.max_position_embeddings.unwrap_or(4096);
        let mut long_rope = None;
        let mut attn_scale = 1.0 / (head_dim as f32).sqrt();
        let rope_scaling = match scaling {
            None => None,
            Some(s) => match s.kind().unwrap_or("default") {
                "default" => None,
                "llama3" => Some(RopeScaling::Llama3(Llama3RopeScaling {
                    factor: s.factor.unwrap_or(1.0),
                    low_freq_factor: s.low_freq_factor.unwrap_or(1.0),
                    high_freq_factor: s.high_freq_factor.unwrap_or(4.0),
                    original_max_position_embeddings: s
                        .original_max_position_embeddings
                        .unwrap_or(8192),
                })),
                "linear" => Some(RopeScaling::Linear(s.factor.unwrap_or(1.0))),
                "longrope" | "su" => {
                    // Phi-3's LongRoPE: the short factors within the original context
                    // (served up to it), and every score scaled by the attention factor
                    // squared (it multiplies RoPE's cos and sin of q and of k).
                    let orig = s
                        .original_max_position_embeddings
                        .or(raw.original_max_position_embeddings)
                        .unwrap_or(max_pos);
                    let factor = max_pos as f64 / orig as f64;
                    let mscale = s
                        .attention_factor
                        .map(f64::from)
                        .unwrap_or(if factor <= 1.0 {
                            1.0
                        } else {
                            (1.0 + factor.ln() / (orig as f64).ln()).sqrt()
                        });
                    attn_scale *= (mscale * mscale) as f32;
                    match &s.long_factor {
                        Some(factors) if max_pos > orig => {
                            long_rope = Some(LongRope {
                                factors: factors.clone(),
                                original: orig,
                            })
                        }
                        _ => max_pos = max_pos.min(orig),
                    }
                    Some(RopeScaling::Factors(
                        s.short_factor.clone().unwrap_or_default(),
                    ))
                }
                kind => {
                    return Err(Error::Checkpoint(format!(
                        "rope_scaling type {kind:?} is not supported"
                    )))
                }
            },
        };
        let window = raw.sliding_window.filter(|&w| w > 0);
        match family {
            Family::Mistral => a.sliding_window = window,
            Family::Qwen2 | Family::Qwen3 if raw.use_sliding_window == Some(true) => {
                a.sliding_window = window;
                let from = raw.max_window_layers.unwrap_or(0);
                a.local_layers = (0..num_layers).map(|l| l >= from).collect();
            }
            Family::Gemma2 | Family::Gemma3 => {
                a.embed_scale = Some((hidden_size as f32).sqrt());
                a.sliding_window = window;
                a.local_layers = match &raw.layer_types {
                    Some(t) => t.iter().map(|t| t == "sliding_attention").collect(),
                    None if family == Family::Gemma2 => {
                        (0..num_layers).map(|l| l % 2 == 0).collect()
                    }
                    None => {
                        let p = raw.sliding_window_pattern.unwrap_or(6).max(1);
                        (0..num_layers).map(|l| (l + 1) % p != 0).collect()
                    }
                };
                if a.local_layers.len() != num_layers {
                    return Err(Error::Checkpoint(format!(
                        "layer_types has {} entries for {num_layers} layers",
                        a.local_layers.len()
                    )));
                }
                if let Some(s) = raw.query_pre_attn_scalar {
                    attn_scale = 1.0 / s.sqrt();
                }
                a.attn_softcap = raw.attn_logit_softcapping;
                a.final_softcap = raw.final_logit_softcapping;
                if family == Family::Gemma3 {
                    a.local_rope_theta = Some(
                        raw.rope_local_base_freq
                            .or(local.and_then(|l| l.rope_theta))
                            .unwrap_or(10000.0),
                    );
                }
            }
            _ => {}
        }
        if raw.attention_bias == Some(true) && a.bias == Bias::None {
            // HF's Llama puts `attention_bias` on o_proj too.
            a.bias = if family == Family::Llama {
                Bias::QkvO
            } else {
                Bias::Qkv
            };
        }
        if raw.mlp_bias == Some(true) {
            return Err(Error::Checkpoint(
                "mlp_bias (biases on the MLP's projections) is not supported".into(),
            ));
        }
        let cfg = ModelConfig {
            architecture,
            arch: a,
            vocab_size: raw.vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta,
            rope_scaling,
            long_rope,
            attn_scale,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            max_position_embeddings: max_pos,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(matches!(
                family,
                Family::Gemma2 | Family::Gemma3 | Family::Gpt2
            )),
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

/// Inverse RoPE frequencies for base `theta`, one per rotated pair, with `scaling`.
fn inv_freq(theta: f32, head_dim: usize, scaling: Option<&RopeScaling>) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            let f = 1.0 / (theta as f64).powf(2.0 * i as f64 / head_dim as f64);
            (match scaling {
                None => f,
                Some(RopeScaling::Llama3(s)) => llama3_scale(f, s),
                Some(RopeScaling::Linear(factor)) => f / *factor as f64,
                Some(RopeScaling::Factors(d)) => f / d[i] as f64,
            }) as f32
        })
        .collect()
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

/// config.json's fields for every family (GPT-2's names are aliases).
#[derive(Deserialize)]
struct HfConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: usize,
    #[serde(alias = "n_embd")]
    hidden_size: Option<usize>,
    #[serde(alias = "n_inner")]
    intermediate_size: Option<usize>,
    #[serde(alias = "n_layer")]
    num_hidden_layers: Option<usize>,
    #[serde(alias = "n_head")]
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_theta: Option<f32>,
    rope_scaling: Option<HfRope>,
    rope_parameters: Option<Value>,
    rope_local_base_freq: Option<f32>,
    partial_rotary_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
    #[serde(alias = "layer_norm_epsilon", alias = "layer_norm_eps")]
    rms_norm_eps: Option<f32>,
    #[serde(alias = "n_positions")]
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    activation_function: Option<String>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    query_pre_attn_scalar: Option<f32>,
    attn_logit_softcapping: Option<f32>,
    final_logit_softcapping: Option<f32>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<EosIds>,
}

/// `rope_scaling` (4.x) or `rope_parameters` (5.x; theta beside the scaling fields).
#[derive(Deserialize, Clone, Default)]
struct HfRope {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    rope_theta: Option<f32>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
    short_factor: Option<Vec<f32>>,
    long_factor: Option<Vec<f32>>,
    attention_factor: Option<f32>,
}

impl HfRope {
    fn kind(&self) -> Option<&str> {
        self.rope_type.as_deref().or(self.kind.as_deref())
    }
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
        assert!(matches!(&c.rope_scaling, Some(RopeScaling::Llama3(s)) if s.factor == 32.0));
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
        assert_eq!(
            ModelConfig::from_hf_json(json).unwrap().arch.bias,
            Bias::Qkv
        );
        let bad = json.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3");
        let err = ModelConfig::from_hf_json(&bad).unwrap_err().to_string();
        assert!(err.contains("not a multiple"), "{err}");
        let moe = json.replace("Qwen2ForCausalLM", "Qwen2MoeForCausalLM");
        let err = ModelConfig::from_hf_json(&moe).unwrap_err().to_string();
        assert!(
            err.contains("Qwen2MoeForCausalLM is not supported"),
            "{err}"
        );
    }
    #[test]
    fn reads_transformers4_gemma3_and_phi3_configs() {
        // Gemma 3 as its hub config.json (transformers 4.x) says it.
        let json = r#"{"architectures":["Gemma3ForCausalLM"],"vocab_size":262208,
            "hidden_size":2560,"intermediate_size":10240,"num_hidden_layers":34,
            "num_attention_heads":8,"num_key_value_heads":4,"head_dim":256,
            "query_pre_attn_scalar":256,"rope_theta":1000000.0,"rope_local_base_freq":10000.0,
            "rope_scaling":{"factor":8.0,"rope_type":"linear"},"sliding_window":1024,
            "sliding_window_pattern":6,"hidden_activation":"gelu_pytorch_tanh",
            "max_position_embeddings":131072}"#;
        let c = ModelConfig::from_hf_json(json).unwrap();
        assert_eq!(c.arch.family, Family::Gemma3);
        assert!(c.tie_word_embeddings && c.arch.qk_norm && c.arch.sandwich_norms);
        assert_eq!(c.attn_scale, 1.0 / 16.0);
        assert_eq!(c.arch.embed_scale, Some((2560f32).sqrt()));
        assert_eq!(c.arch.window(0), Some(1024));
        assert_eq!(c.arch.window(5), None);
        assert_eq!(c.arch.window(6), Some(1024));
        assert_eq!(c.rope_scaling, Some(RopeScaling::Linear(8.0)));
        assert_eq!(
            c.local_rope_inv_freq().unwrap()[1],
            1.0 / 10000f32.powf(2.0 / 256.0)
        );
        assert_eq!(c.rope_inv_freq()[0], 1.0 / 8.0);
        // Gemma 2's default layout: even layers local.
        let g2 = json
            .replace("Gemma3ForCausalLM", "Gemma2ForCausalLM")
            .replace("\"sliding_window_pattern\":6,", "");
        let c = ModelConfig::from_hf_json(&g2).unwrap();
        assert_eq!((c.arch.window(0), c.arch.window(1)), (Some(1024), None));
        assert!(!c.arch.qk_norm && c.local_rope_inv_freq().is_none());
        // Phi-3.5's LongRoPE (4.x: rope_scaling with the original context at the top).
        let phi = r#"{"architectures":["Phi3ForCausalLM"],"vocab_size":32064,"hidden_size":3072,
            "intermediate_size":8192,"num_hidden_layers":32,"num_attention_heads":32,
            "max_position_embeddings":131072,"original_max_position_embeddings":4096,
            "rope_scaling":{"type":"longrope","short_factor":[SHORT],"long_factor":[LONG]}}"#
            .replace("SHORT", &vec!["1.5"; 48].join(","))
            .replace("LONG", &vec!["4.0"; 48].join(","));
        let c = ModelConfig::from_hf_json(&phi).unwrap();
        // The whole context, past the original one with the long factors.
        assert_eq!(c.max_position_embeddings, 131072);
        assert_eq!(c.long_rope_from(), Some(4096));
        assert_eq!(c.long_rope_inv_freq().unwrap()[0], 1.0 / 4.0);
        let mscale = (1.0 + (32f64).ln() / (4096f64).ln()).sqrt();
        let want = (mscale * mscale / (96f64).sqrt()) as f32;
        assert!(
            (c.attn_scale - want).abs() < 1e-7,
            "{} vs {want}",
            c.attn_scale
        );
        assert_eq!(c.rope_inv_freq()[0], 1.0 / 1.5);
        // Without long factors: the original context only.
        let short = phi.replace(
            &format!(",\"long_factor\":[{}]", vec!["4.0"; 48].join(",")),
            "",
        );
        let c = ModelConfig::from_hf_json(&short).unwrap();
        assert_eq!(
            (c.max_position_embeddings, c.long_rope_from()),
            (4096, None)
        );
        // Anything else is a clear error.
        let yarn = json.replace("\"linear\"", "\"yarn\"");
        let err = ModelConfig::from_hf_json(&yarn).unwrap_err().to_string();
        assert!(err.contains("yarn"), "{err}");
        let relu = json.replace("gelu_pytorch_tanh", "relu");
        let err = ModelConfig::from_hf_json(&relu).unwrap_err().to_string();
        assert!(err.contains("relu"), "{err}");
    }
}
