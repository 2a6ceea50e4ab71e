//! GPT-2: learned positions, LayerNorms with biases, a fused `c_attn` (q|k|v), an
//! ungated GELU MLP and a bias on every linear layer. HF files store its linear layers
//! as Conv1D (`[in, out]`, transposed at load); GGUF files as usual.

use super::{llama, Format, Kind, Part};

/// The name of `part` in layer `l`.
pub(super) fn name(format: Format, part: Part, kind: Kind, l: usize) -> Option<String> {
    if format == Format::Gguf {
        return match part {
            Part::Q | Part::K | Part::V | Part::Gate | Part::GateUp | Part::QNorm | Part::KNorm => {
                None
            }
            _ => llama::name(format, part, kind, l),
        };
    }
    let suffix = match kind {
        Kind::Weight => "weight",
        Kind::Bias => "bias",
    };
    let global = |n: &str| Some(format!("transformer.{n}.{suffix}"));
    let layer = |n: &str| Some(format!("transformer.h.{l}.{n}.{suffix}"));
    match part {
        Part::Embed => global("wte"),
        Part::PosEmbed => global("wpe"),
        Part::FinalNorm => global("ln_f"),
        Part::AttnNorm => layer("ln_1"),
        Part::Qkv => layer("attn.c_attn"),
        Part::O => layer("attn.c_proj"),
        Part::FfnNorm => layer("ln_2"),
        Part::Up => layer("mlp.c_fc"),
        Part::Down => layer("mlp.c_proj"),
        _ => None,
    }
}
