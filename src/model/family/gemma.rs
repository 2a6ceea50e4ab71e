//! Gemma 2 and Gemma 3: the Llama tensor names plus the norms around attention and the
//! MLP (HF's `post_attention_layernorm` is the attention output's norm here, not the MLP
//! input's, which is `pre_feedforward_layernorm`).

use super::{llama, Format, Kind, Part};

/// The name of `part` in layer `l`.
pub(super) fn name(format: Format, part: Part, kind: Kind, l: usize) -> Option<String> {
    if format == Format::Gguf {
        return llama::name(format, part, kind, l);
    }
    let s = match part {
        Part::PostAttnNorm => "post_attention_layernorm",
        Part::FfnNorm => "pre_feedforward_layernorm",
        Part::PostFfnNorm => "post_feedforward_layernorm",
        _ => return llama::name(format, part, kind, l),
    };
    Some(format!("model.layers.{l}.{s}.weight"))
}
