//! The stages of a forward pass, in the order both engines (CPU and GPU) run them, and the
//! names a profile gives them: each engine's layer loop is this list, each stage one method.

/// One stage of the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Token embeddings into the fp32 residual.
    Embed,
    /// RMSNorm and the fused q|k|v projection (on the GPU the norm may run inside the GEMV).
    Qkv,
    /// RoPE on q and k, and the new K/V written into the paged cache.
    Rope,
    /// Paged attention. In a last layer run on the rows with logits alone, their residual's
    /// gather too.
    Attention,
    /// The o projection added into the residual (there, the attention rows' gather too).
    O,
    /// RMSNorm and the fused gate|up projection (on the GPU's GEMV, SwiGLU too).
    GateUp,
    /// silu(gate) * up (GeGLU's gelu(gate) * up, GPT-2's gelu(up)), where gate_up did not
    /// apply it.
    Swiglu,
    /// The down projection added into the residual.
    Down,
    /// The final RMSNorm of the rows that get logits (on the GPU, inside the lm_head's GEMV
    /// where it can).
    FinalNorm,
    /// The logits of those rows.
    LmHead,
}

/// Every stage of a decoder layer, in order.
pub const LAYER: [Stage; 7] = [
    Stage::Qkv,
    Stage::Rope,
    Stage::Attention,
    Stage::O,
    Stage::GateUp,
    Stage::Swiglu,
    Stage::Down,
];

/// The stages after the last layer.
pub const HEAD: [Stage; 2] = [Stage::FinalNorm, Stage::LmHead];

/// The stages after the last layer of a pass that returns final hidden states instead of
/// logits (embeddings): the final norm alone.
pub const HIDDEN_HEAD: [Stage; 1] = [Stage::FinalNorm];

/// The stages layer `l` of `layers` runs: all of them, except where it is the last layer
/// and no row gets logits (a prompt chunk that samples nothing), which only writes its K/V.
pub fn layer_stages(l: usize, layers: usize, no_logits: bool) -> &'static [Stage] {
    if l + 1 == layers && no_logits {
        &LAYER[..2]
    } else {
        &LAYER
    }
}

impl Stage {
    /// The stage's name in a profile.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn name(self) -> &'static str {
        match self {
            Stage::Embed => "embed",
            Stage::Qkv => "rms_norm + qkv gemm",
            Stage::Rope => "rope + kv write",
            Stage::Attention => "attention",
            Stage::O => "o gemm + residual",
            Stage::GateUp => "rms_norm + gate_up gemm (+ SwiGLU on the GEMV)",
            Stage::Swiglu => "activation (silu or gelu) * up",
            Stage::Down => "down gemm + residual",
            Stage::FinalNorm => "final norm",
            Stage::LmHead => "lm_head gemm",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_layer_without_logits_only_writes_its_kv() {
        assert_eq!(layer_stages(3, 4, true), &[Stage::Qkv, Stage::Rope]);
        assert_eq!(layer_stages(2, 4, true), &LAYER);
        assert_eq!(layer_stages(3, 4, false), &LAYER);
    }
}
