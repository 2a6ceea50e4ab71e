//! An HF Llama checkpoint written as a GGUF file the way llama.cpp's converter and quantizer
//! write one (its tensor names, its interleaved Q/K rows, a quantization recipe), without
//! a tokenizer: tests and the GPU tools make the quantized models they load from the
//! random checkpoints they write (`inflight gpu-gguf`).

use std::path::Path;

use rayon::prelude::*;

use super::gguf::MetaValue;
use super::gguf_writer::{encode, GgufWriter};
use super::quant::GgmlType;
use super::safetensors::HfCheckpoint;
use crate::error::{Error, Result};

/// Which type each matrix takes (vectors stay F32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    /// Every matrix of one type.
    All(GgmlType),
    /// llama.cpp's Q4_K_M: Q4_K, with Q6_K for the output and for `attn_v` and `ffn_down`
    /// in the first and last eighth of the layers and every third layer between.
    Q4KM,
}

impl Recipe {
    /// `q4_k_m`, or a type's name (`q8_0`, `q4_k`, ...).
    pub fn parse(s: &str) -> Result<Recipe> {
        if s.eq_ignore_ascii_case("q4_k_m") {
            return Ok(Recipe::Q4KM);
        }
        GgmlType::ALL
            .iter()
            .find(|t| format!("{t:?}").eq_ignore_ascii_case(s))
            .map(|&t| Recipe::All(t))
            .ok_or_else(|| Error::Config(format!("unknown quantization {s:?}")))
    }

    /// The type of matrix `name` (GGUF's name) of a model of `layers` layers, whose rows
    /// are `cols` wide: a K-quant that does not fit the rows falls back as llama.cpp's does
    /// (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0).
    pub fn type_of(self, name: &str, layers: usize, cols: usize) -> GgmlType {
        let ty = match self {
            Recipe::All(t) => t,
            Recipe::Q4KM => {
                let layer = name
                    .strip_prefix("blk.")
                    .and_then(|r| r.split('.').next())
                    .and_then(|l| l.parse::<usize>().ok());
                let more_bits =
                    |i: usize| i < layers / 8 || i >= 7 * layers / 8 || (i - layers / 8) % 3 == 2;
                let v_or_down =
                    name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight");
                match layer {
                    _ if name == "output.weight" => GgmlType::Q6_K,
                    Some(i) if v_or_down && more_bits(i) => GgmlType::Q6_K,
                    _ => GgmlType::Q4_K,
                }
            }
        };
        if cols.is_multiple_of(ty.block_len()) {
            return ty;
        }
        match ty {
            GgmlType::Q4_K => GgmlType::Q5_0,
            GgmlType::Q5_K => GgmlType::Q5_1,
            _ => GgmlType::Q8_0,
        }
    }
}

/// llama.cpp's converter permutation of Q/K rows (HF rotate-half → adjacent pairs).
fn permute(w: &[f32], heads: usize, head_dim: usize) -> Vec<f32> {
    let cols = w.len() / (heads * head_dim);
    let half = head_dim / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for j in 0..half {
            for s in 0..2 {
                let dst = (h * head_dim + 2 * j + s) * cols;
                let src = (h * head_dim + s * half + j) * cols;
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    out
}

/// Encodes a `[rows, cols]` matrix as `ty`, bands of rows in parallel.
fn encode_rows(ty: GgmlType, values: &[f32], cols: usize) -> Vec<u8> {
    let band = cols.max(1) * 64;
    let parts: Vec<Vec<u8>> = values.par_chunks(band).map(|c| encode(ty, c)).collect();
    parts.concat()
}

/// The checkpoint at `dir` as a GGUF image, each matrix of `recipe`'s type; with `twin`,
/// every matrix holds the same quantized values stored as F32 (what the quantized file
/// computes, without its arithmetic).
pub fn hf_to_gguf(dir: &Path, recipe: Recipe, twin: bool) -> Result<GgufWriter> {
    let ckpt = HfCheckpoint::open(dir)?;
    hf_checkpoint_to_gguf(
        &ckpt,
        &|name, layers, cols| recipe.type_of(name, layers, cols),
        twin,
    )
}

/// [`hf_to_gguf`] of an open checkpoint, each matrix of type `ty_of(gguf name, layers,
/// cols)`.
pub fn hf_checkpoint_to_gguf(
    ckpt: &HfCheckpoint,
    ty_of: &dyn Fn(&str, usize, usize) -> GgmlType,
    twin: bool,
) -> Result<GgufWriter> {
    let c = ckpt.config();
    if c.arch.family != super::family::Family::Llama {
        return Err(Error::Model(format!(
            "only Llama checkpoints convert to GGUF here, not {:?}",
            c.arch.family
        )));
    }
    let mut w = GgufWriter::new();
    let u = |v: usize| MetaValue::U32(v as u32);
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("llama.block_count", u(c.num_layers))
        .meta("llama.context_length", u(c.max_position_embeddings))
        .meta("llama.embedding_length", u(c.hidden_size))
        .meta("llama.feed_forward_length", u(c.intermediate_size))
        .meta("llama.attention.head_count", u(c.num_heads))
        .meta("llama.attention.head_count_kv", u(c.num_kv_heads))
        .meta("llama.rope.freq_base", MetaValue::F32(c.rope_theta))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(c.rms_norm_eps),
        )
        .meta("llama.vocab_size", u(c.vocab_size));
    let mut put = |gguf: &str, hf: &str, heads: Option<usize>| -> Result<()> {
        let (shape, mut data) = ckpt.tensor_f32(hf)?;
        if let Some(heads) = heads {
            data = permute(&data, heads, c.head_dim);
        }
        let cols = *shape.last().unwrap_or(&1);
        let ty = if shape.len() == 1 {
            GgmlType::F32
        } else {
            ty_of(gguf, c.num_layers, cols)
        };
        if twin && ty != GgmlType::F32 {
            let bytes = encode_rows(ty, &data, cols);
            let values = super::quant::dequantize(ty, &bytes, data.len())?;
            w.tensor_raw(gguf, &shape, GgmlType::F32, encode(GgmlType::F32, &values));
        } else {
            w.tensor_raw(gguf, &shape, ty, encode_rows(ty, &data, cols));
        }
        Ok(())
    };
    put("token_embd.weight", "model.embed_tokens.weight", None)?;
    put("output_norm.weight", "model.norm.weight", None)?;
    if !c.tie_word_embeddings {
        put("output.weight", "lm_head.weight", None)?;
    }
    for l in 0..c.num_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let g = |s: &str| format!("blk.{l}.{s}");
        put(&g("attn_norm.weight"), &p("input_layernorm.weight"), None)?;
        let (q, k) = (Some(c.num_heads), Some(c.num_kv_heads));
        put(&g("attn_q.weight"), &p("self_attn.q_proj.weight"), q)?;
        put(&g("attn_k.weight"), &p("self_attn.k_proj.weight"), k)?;
        put(&g("attn_v.weight"), &p("self_attn.v_proj.weight"), None)?;
        put(
            &g("attn_output.weight"),
            &p("self_attn.o_proj.weight"),
            None,
        )?;
        put(
            &g("ffn_norm.weight"),
            &p("post_attention_layernorm.weight"),
            None,
        )?;
        put(&g("ffn_gate.weight"), &p("mlp.gate_proj.weight"), None)?;
        put(&g("ffn_up.weight"), &p("mlp.up_proj.weight"), None)?;
        put(&g("ffn_down.weight"), &p("mlp.down_proj.weight"), None)?;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_gives_more_bits_where_llama_cpp_does() {
        let r = Recipe::Q4KM;
        // 32 layers: the first 4, the last 4, and every third from 4 (6, 9, ...).
        let q6: Vec<usize> = (0..32)
            .filter(|&i| r.type_of(&format!("blk.{i}.ffn_down.weight"), 32, 4096) == GgmlType::Q6_K)
            .collect();
        assert_eq!(
            q6,
            vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        assert_eq!(r.type_of("blk.6.attn_q.weight", 32, 4096), GgmlType::Q4_K);
        assert_eq!(r.type_of("blk.6.attn_v.weight", 32, 4096), GgmlType::Q6_K);
        assert_eq!(r.type_of("output.weight", 32, 4096), GgmlType::Q6_K);
        assert_eq!(r.type_of("token_embd.weight", 32, 4096), GgmlType::Q4_K);
        // Rows that are not whole super-blocks fall back.
        assert_eq!(r.type_of("blk.5.attn_q.weight", 32, 576), GgmlType::Q5_0);
        assert_eq!(r.type_of("output.weight", 32, 576), GgmlType::Q8_0);
        assert_eq!(Recipe::parse("Q8_0").unwrap(), Recipe::All(GgmlType::Q8_0));
        assert_eq!(Recipe::parse("q4_k_m").unwrap(), Recipe::Q4KM);
        assert!(Recipe::parse("q9").is_err());
    }
}
