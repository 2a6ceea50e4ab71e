//! What each model family changes in the Llama decoder, declared once: [`Arch`] is the
//! list of those differences the forward passes read, [`Part`] names a tensor
//! independently of the file format, and each family's file (`llama`, `gemma`, `phi3`,
//! `gpt2`) says which tensors it has under which names and how its config sets [`Arch`].

mod gemma;
mod gpt2;
mod llama;
mod phi3;

use crate::error::{Error, Result};

/// A model family the engines run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Family {
    /// Llama 2/3, SmolLM and every checkpoint that is a Llama with other sizes.
    #[default]
    Llama,
    /// Llama with a sliding attention window.
    Mistral,
    /// Llama with q/k/v biases.
    Qwen2,
    /// Llama with a per-head RMSNorm on q and k.
    Qwen3,
    /// Gemma 2: GeGLU, norms around attention and MLP, soft-capped scores and logits,
    /// alternating local (sliding) and global layers.
    Gemma2,
    /// Gemma 3 (text): Gemma 2 with q/k norms instead of soft-capping, and a RoPE base of
    /// its own on the local layers.
    Gemma3,
    /// Phi-3 / Phi-3.5: fused qkv and gate|up in the files, LongRoPE.
    Phi3,
    /// GPT-2: learned positions, LayerNorm, GELU MLP, biases everywhere.
    Gpt2,
}

/// How the residual stream is normalized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NormKind {
    /// `x / rms(x) * w` (Gemma's `1 + w` is folded into `w` at load, as GGUF files hold it).
    #[default]
    Rms,
    /// `(x - mean) / std * w + b`.
    Layer,
}

/// The MLP between the up and down projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mlp {
    /// `silu(gate) * up`.
    #[default]
    SwiGlu,
    /// `gelu_tanh(gate) * up`.
    GeGlu,
    /// `gelu_tanh(up)`: no gate (the up projection alone, `intermediate_size` rows).
    Gelu,
}

/// The differences from a Llama decoder layer that a family declares.
#[derive(Debug, Clone, PartialEq)]
pub struct Arch {
    /// Which family this is.
    pub family: Family,
    /// Every norm's kind (LayerNorms carry a bias).
    pub norm: NormKind,
    /// The MLP's activation and whether it is gated.
    pub mlp: Mlp,
    /// Positions come from a learned table added to the embeddings, not RoPE.
    pub learned_positions: bool,
    /// A per-head RMSNorm (one weight of `head_dim`) on q and on k before RoPE.
    pub qk_norm: bool,
    /// Norms on the attention's and the MLP's outputs before each joins the residual
    /// (Gemma's "sandwich"); the MLP's input norm is then the "pre-feedforward" one.
    pub sandwich_norms: bool,
    /// The embeddings are multiplied by this (Gemma: `sqrt(hidden_size)`).
    pub embed_scale: Option<f32>,
    /// Attention scores become `cap * tanh(score / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits become `cap * tanh(logit / cap)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Keys a query sees on a local layer: positions `p - window + 1 ..= p`.
    pub sliding_window: Option<usize>,
    /// Per layer: whether it is local (uses the sliding window). Empty: every layer is
    /// local where there is a window.
    pub local_layers: Vec<bool>,
    /// The RoPE base of the local layers, when theirs differs from the global one (and is
    /// unscaled): Gemma 3.
    pub local_rope_theta: Option<f32>,
    /// Which linear layers carry a bias.
    pub bias: Bias,
}

/// Which linear layers carry a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Bias {
    /// None (Llama).
    #[default]
    None,
    /// q, k and v (Qwen2).
    Qkv,
    /// q, k, v and o (Llama's `attention_bias`).
    QkvO,
    /// Every linear layer but the lm_head (GPT-2).
    All,
}

impl Default for Arch {
    fn default() -> Self {
        Arch::of(Family::Llama)
    }
}

impl Arch {
    /// The family's fixed traits; its config then sets windows, caps and scales.
    pub fn of(family: Family) -> Self {
        let base = Arch {
            family,
            norm: NormKind::Rms,
            mlp: Mlp::SwiGlu,
            learned_positions: false,
            qk_norm: false,
            sandwich_norms: false,
            embed_scale: None,
            attn_softcap: None,
            final_softcap: None,
            sliding_window: None,
            local_layers: Vec::new(),
            local_rope_theta: None,
            bias: Bias::None,
        };
        match family {
            Family::Llama | Family::Mistral | Family::Phi3 => base,
            Family::Qwen2 => Arch {
                bias: Bias::Qkv,
                ..base
            },
            Family::Qwen3 => Arch {
                qk_norm: true,
                ..base
            },
            Family::Gemma2 | Family::Gemma3 => Arch {
                mlp: Mlp::GeGlu,
                sandwich_norms: true,
                qk_norm: family == Family::Gemma3,
                ..base
            },
            Family::Gpt2 => Arch {
                norm: NormKind::Layer,
                mlp: Mlp::Gelu,
                learned_positions: true,
                bias: Bias::All,
                ..base
            },
        }
    }

    /// Whether layer `l` attends within the sliding window only.
    pub fn is_local(&self, l: usize) -> bool {
        self.sliding_window.is_some() && self.local_layers.get(l).copied().unwrap_or(true)
    }

    /// The window every one of `layers` layers attends within, where all are local (None:
    /// some layer sees every earlier position): KV blocks wholly behind it are never read
    /// again.
    pub fn kv_window(&self, layers: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| (0..layers).all(|l| self.is_local(l)))
    }

    /// The window layer `l` attends within (None: every earlier position).
    pub fn window(&self, l: usize) -> Option<usize> {
        self.sliding_window.filter(|_| self.is_local(l))
    }

    /// Rows of the fused gate|up layer for an MLP of `intermediate` width.
    pub fn up_rows(&self, intermediate: usize) -> usize {
        match self.mlp {
            Mlp::Gelu => intermediate,
            Mlp::SwiGlu | Mlp::GeGlu => 2 * intermediate,
        }
    }

    /// Whether the linear layer of `part` (a weight) carries a bias.
    pub fn has_bias(&self, part: Part) -> bool {
        match self.bias {
            Bias::None => false,
            Bias::Qkv => matches!(part, Part::Q | Part::K | Part::V | Part::Qkv),
            Bias::QkvO => matches!(part, Part::Q | Part::K | Part::V | Part::Qkv | Part::O),
            Bias::All => !matches!(part, Part::LmHead | Part::Embed),
        }
    }
}

/// The tensors of one layer or of the model, named independently of the file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Token embeddings.
    Embed,
    /// Learned position embeddings (GPT-2).
    PosEmbed,
    /// The norm after the last layer.
    FinalNorm,
    /// The output projection (absent when tied to the embeddings).
    LmHead,
    /// The attention's input norm.
    AttnNorm,
    /// The query projection.
    Q,
    /// The key projection.
    K,
    /// The value projection.
    V,
    /// q|k|v stacked in one tensor (Phi-3, GPT-2).
    Qkv,
    /// Per-head norm of q (Qwen3, Gemma 3).
    QNorm,
    /// Per-head norm of k (Qwen3, Gemma 3).
    KNorm,
    /// The attention's output projection.
    O,
    /// The attention output's norm (Gemma).
    PostAttnNorm,
    /// The MLP's input norm (Gemma's pre-feedforward norm).
    FfnNorm,
    /// The MLP's gate projection.
    Gate,
    /// The MLP's up projection.
    Up,
    /// gate|up stacked in one tensor (Phi-3).
    GateUp,
    /// The MLP's down projection.
    Down,
    /// The MLP output's norm (Gemma).
    PostFfnNorm,
}

/// The file format a name is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// HF transformers' safetensors names.
    Hf,
    /// llama.cpp's GGUF names.
    Gguf,
}

/// What a tensor name is: a weight or its bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A weight.
    Weight,
    /// Its bias.
    Bias,
}

impl Family {
    /// The family of an HF checkpoint's `architectures[0]` (or `model_type`).
    pub fn from_hf(architecture: &str) -> Result<Self> {
        let a = architecture.to_ascii_lowercase();
        let found = [
            ("llama", Family::Llama),
            ("mistral", Family::Mistral),
            ("qwen3", Family::Qwen3),
            ("qwen2", Family::Qwen2),
            ("gemma3", Family::Gemma3),
            ("gemma2", Family::Gemma2),
            ("phi3", Family::Phi3),
            ("gpt2", Family::Gpt2),
        ]
        .into_iter()
        .find(|(p, _)| a.starts_with(p));
        match found {
            // Mixture-of-experts and multimodal classes share a prefix with a dense one.
            Some(_) if a.contains("moe") || a.contains("conditionalgeneration") => None,
            f => f.map(|(_, f)| f),
        }
        .ok_or_else(|| {
            Error::Checkpoint(format!(
                "architecture {architecture} is not supported (supported: {})",
                Self::SUPPORTED_HF
            ))
        })
    }

    /// HF classes the loader takes.
    pub const SUPPORTED_HF: &'static str = "LlamaForCausalLM, MistralForCausalLM, \
        Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, \
        Phi3ForCausalLM, GPT2LMHeadModel";

    /// The family of a GGUF file's `general.architecture`.
    pub fn from_gguf(arch: &str) -> Result<Self> {
        Ok(match arch {
            "llama" => Family::Llama,
            "mistral" => Family::Mistral,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gemma2" => Family::Gemma2,
            "gemma3" => Family::Gemma3,
            "phi3" => Family::Phi3,
            "gpt2" => Family::Gpt2,
            other => {
                return Err(Error::Gguf(format!(
                    "architecture {other:?} is not supported (llama, mistral, qwen2, qwen3, \
                     gemma2, gemma3, phi3, gpt2 are)"
                )))
            }
        })
    }

    /// The name of `part`'s weight or bias in layer `l` (ignored for model-wide parts) in
    /// `format`, or None when the family has no such tensor.
    pub fn name(self, format: Format, part: Part, kind: Kind, l: usize) -> Option<String> {
        match self {
            Family::Gemma2 | Family::Gemma3 => gemma::name(format, part, kind, l),
            Family::Phi3 => phi3::name(format, part, kind, l),
            Family::Gpt2 => gpt2::name(format, part, kind, l),
            _ => llama::name(format, part, kind, l),
        }
    }

    /// Whether the family's linear layers are stored `[in, out]` in HF files (GPT-2's
    /// Conv1D), so that they are transposed at load.
    pub fn hf_transposed(self) -> bool {
        self == Family::Gpt2
    }

    /// Whether llama.cpp's converter interleaved the rotated halves of each Q/K head.
    pub fn gguf_permuted_qk(self) -> bool {
        matches!(self, Family::Llama | Family::Mistral)
    }
}
