//! Phi-3 / Phi-3.5: Llama's layer with q|k|v and gate|up each stored as one tensor
//! (`qkv_proj`, `gate_up_proj` in HF files; `attn_qkv` and a double-height `ffn_up` in
//! GGUF files), gate rows first.

use super::{llama, Format, Kind, Part};

/// The name of `part` in layer `l`.
pub(super) fn name(format: Format, part: Part, kind: Kind, l: usize) -> Option<String> {
    match (format, part) {
        (_, Part::Q | Part::K | Part::V | Part::Gate | Part::Up) => None,
        (Format::Hf, Part::Qkv) => Some(format!("model.layers.{l}.self_attn.qkv_proj.weight")),
        (Format::Hf, Part::GateUp) => Some(format!("model.layers.{l}.mlp.gate_up_proj.weight")),
        _ => llama::name(format, part, kind, l),
    }
}
