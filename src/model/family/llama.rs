//! Llama, Mistral, Qwen2 and Qwen3: the Llama decoder's tensor names in HF and GGUF files
//! (Qwen2's q/k/v biases and Qwen3's q/k norms are the only parts the others lack).

use super::{Format, Kind, Part};

/// The name of `part` in layer `l` (model-wide parts ignore `l`).
pub(super) fn name(format: Format, part: Part, kind: Kind, l: usize) -> Option<String> {
    let suffix = match kind {
        Kind::Weight => "weight",
        Kind::Bias => "bias",
    };
    let (global, layer) = match format {
        Format::Hf => hf(part),
        Format::Gguf => gguf(part),
    };
    match (global, layer) {
        (Some(g), _) => Some(format!("{g}.{suffix}")),
        (None, Some(s)) => Some(match format {
            Format::Hf => format!("model.layers.{l}.{s}.{suffix}"),
            Format::Gguf => format!("blk.{l}.{s}.{suffix}"),
        }),
        (None, None) => None,
    }
}

/// (model-wide name, per-layer name) of a part in HF files.
pub(super) fn hf(part: Part) -> (Option<&'static str>, Option<&'static str>) {
    let layer = match part {
        Part::Embed => return (Some("model.embed_tokens"), None),
        Part::FinalNorm => return (Some("model.norm"), None),
        Part::LmHead => return (Some("lm_head"), None),
        Part::AttnNorm => "input_layernorm",
        Part::Q => "self_attn.q_proj",
        Part::K => "self_attn.k_proj",
        Part::V => "self_attn.v_proj",
        Part::QNorm => "self_attn.q_norm",
        Part::KNorm => "self_attn.k_norm",
        Part::O => "self_attn.o_proj",
        Part::FfnNorm => "post_attention_layernorm",
        Part::Gate => "mlp.gate_proj",
        Part::Up => "mlp.up_proj",
        Part::Down => "mlp.down_proj",
        Part::PosEmbed | Part::Qkv | Part::GateUp | Part::PostAttnNorm | Part::PostFfnNorm => {
            return (None, None)
        }
    };
    (None, Some(layer))
}

/// (model-wide name, per-layer name) of a part in llama.cpp's GGUF files.
pub(super) fn gguf(part: Part) -> (Option<&'static str>, Option<&'static str>) {
    let layer = match part {
        Part::Embed => return (Some("token_embd"), None),
        Part::PosEmbed => return (Some("position_embd"), None),
        Part::FinalNorm => return (Some("output_norm"), None),
        Part::LmHead => return (Some("output"), None),
        Part::AttnNorm => "attn_norm",
        Part::Q => "attn_q",
        Part::K => "attn_k",
        Part::V => "attn_v",
        Part::Qkv => "attn_qkv",
        Part::QNorm => "attn_q_norm",
        Part::KNorm => "attn_k_norm",
        Part::O => "attn_output",
        Part::PostAttnNorm => "post_attention_norm",
        Part::FfnNorm => "ffn_norm",
        Part::Gate => "ffn_gate",
        Part::Up => "ffn_up",
        Part::GateUp => "ffn_up",
        Part::Down => "ffn_down",
        Part::PostFfnNorm => "post_ffw_norm",
    };
    (None, Some(layer))
}
