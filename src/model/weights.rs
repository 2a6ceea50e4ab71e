//! Llama-family weights for the CPU path, loaded from a GGUF file (dequantized) or an HF
//! safetensors checkpoint. Q, K and V are fused into one matrix, as are gate and up.
//! Matrices stored as F32 in the source stay f32; half-precision and quantized ones are
//! kept as f16 (exact for F16, and far below the quantization error for Q4/Q8), which
//! halves the bytes each decode step reads. Norms and biases are always f32.

use rayon::prelude::*;

use super::config::ModelConfig;
use super::gguf::GgufFile;
use super::quant::GgmlType;
use super::safetensors::HfCheckpoint;
use crate::error::{Error, Result};
use crate::kernels::matmul::Matrix;
use crate::kernels::qmatmul::QMatrix;

/// A linear layer `y = x · Wᵀ + b` with `w` row-major `[rows (out), cols (in)]`.
pub struct Linear {
    pub w: Matrix,
    pub b: Option<Vec<f32>>,
    pub rows: usize,
    pub cols: usize,
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// Rows: q (heads·head_dim), then k, then v (kv_heads·head_dim each).
    pub qkv: Linear,
    pub o: Linear,
    pub ffn_norm: Vec<f32>,
    /// Rows: gate (intermediate), then up (intermediate).
    pub gate_up: Linear,
    pub down: Linear,
}

pub struct LlamaWeights {
    /// `[vocab, hidden]`.
    pub embed: Matrix,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// None when the head is tied to the embedding.
    pub lm_head: Option<Linear>,
}

/// The tensors of one layer or of the model, named independently of the file format.
#[derive(Clone, Copy)]
enum Part {
    Embed,
    FinalNorm,
    LmHead,
    AttnNorm,
    Q,
    K,
    V,
    QBias,
    KBias,
    VBias,
    O,
    FfnNorm,
    Gate,
    Up,
    Down,
}

/// A place tensors come from.
trait Source: Sync {
    fn name(&self, part: Part, layer: usize) -> String;
    fn has(&self, name: &str) -> bool;
    fn load(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)>;
    /// Whether the tensor is stored as f32 in the source (so it stays f32 here).
    fn is_f32(&self, name: &str) -> bool;
    /// The tensor as a block-quantized matrix, when the source holds it quantized.
    fn quantized(&self, _name: &str) -> Option<QMatrix> {
        None
    }
    /// The order of rows that undoes a format's reordering of Q or K (see `fix_rows`).
    fn row_order(&self, _part: Part, _cfg: &ModelConfig) -> Option<Vec<usize>> {
        None
    }
}

struct Gguf<'a>(&'a GgufFile, bool);

impl Source for Gguf<'_> {
    fn name(&self, part: Part, l: usize) -> String {
        let s = match part {
            Part::Embed => return "token_embd.weight".into(),
            Part::FinalNorm => return "output_norm.weight".into(),
            Part::LmHead => return "output.weight".into(),
            Part::AttnNorm => "attn_norm.weight",
            Part::Q => "attn_q.weight",
            Part::K => "attn_k.weight",
            Part::V => "attn_v.weight",
            Part::QBias => "attn_q.bias",
            Part::KBias => "attn_k.bias",
            Part::VBias => "attn_v.bias",
            Part::O => "attn_output.weight",
            Part::FfnNorm => "ffn_norm.weight",
            Part::Gate => "ffn_gate.weight",
            Part::Up => "ffn_up.weight",
            Part::Down => "ffn_down.weight",
        };
        format!("blk.{l}.{s}")
    }
    fn has(&self, name: &str) -> bool {
        self.0.tensor_info(name).is_some()
    }
    fn load(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        self.0.tensor_f32(name)
    }
    fn is_f32(&self, name: &str) -> bool {
        self.0
            .tensor_info(name)
            .is_some_and(|t| t.ty == GgmlType::F32)
    }
    fn quantized(&self, name: &str) -> Option<QMatrix> {
        let info = self.0.tensor_info(name)?;
        let shape = info.shape();
        if shape.len() != 2
            || !matches!(
                info.ty,
                GgmlType::Q4_0
                    | GgmlType::Q4_1
                    | GgmlType::Q8_0
                    | GgmlType::Q4_K
                    | GgmlType::Q5_K
                    | GgmlType::Q6_K
            )
        {
            return None;
        }
        QMatrix::from_ggml(info.ty, self.0.tensor_bytes(info), shape[0], shape[1])
    }
    fn row_order(&self, part: Part, cfg: &ModelConfig) -> Option<Vec<usize>> {
        // llama.cpp's converter interleaves the two rotated halves of each Q/K head for
        // llama-architecture models (its "normal" RoPE rotates adjacent pairs); we undo it
        // to run one RoPE layout, HF's, for every source.
        let heads = match part {
            Part::Q | Part::QBias if self.1 => cfg.num_heads,
            Part::K | Part::KBias if self.1 => cfg.num_kv_heads,
            _ => return None,
        };
        Some(unpermute_order(heads, cfg.head_dim))
    }
}

/// Row `r` of the HF layout is row `order[r]` of the GGUF layout: the inverse of the
/// converter's `reshape(heads, 2, hd/2, ..).swapaxes(1, 2)`.
fn unpermute_order(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    let mut order = vec![0; heads * head_dim];
    for h in 0..heads {
        for j in 0..half {
            for s in 0..2 {
                order[h * head_dim + s * half + j] = h * head_dim + 2 * j + s;
            }
        }
    }
    order
}

fn reorder_rows(w: &[f32], order: &[usize]) -> Vec<f32> {
    let cols = w.len() / order.len();
    order
        .iter()
        .flat_map(|&r| w[r * cols..(r + 1) * cols].iter().copied())
        .collect()
}

struct Hf<'a>(&'a HfCheckpoint);

impl Source for Hf<'_> {
    fn name(&self, part: Part, l: usize) -> String {
        let s = match part {
            Part::Embed => return "model.embed_tokens.weight".into(),
            Part::FinalNorm => return "model.norm.weight".into(),
            Part::LmHead => return "lm_head.weight".into(),
            Part::AttnNorm => "input_layernorm.weight",
            Part::Q => "self_attn.q_proj.weight",
            Part::K => "self_attn.k_proj.weight",
            Part::V => "self_attn.v_proj.weight",
            Part::QBias => "self_attn.q_proj.bias",
            Part::KBias => "self_attn.k_proj.bias",
            Part::VBias => "self_attn.v_proj.bias",
            Part::O => "self_attn.o_proj.weight",
            Part::FfnNorm => "post_attention_layernorm.weight",
            Part::Gate => "mlp.gate_proj.weight",
            Part::Up => "mlp.up_proj.weight",
            Part::Down => "mlp.down_proj.weight",
        };
        format!("model.layers.{l}.{s}")
    }
    fn has(&self, name: &str) -> bool {
        self.0.contains(name)
    }
    fn load(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        self.0.tensor_f32(name)
    }
    fn is_f32(&self, name: &str) -> bool {
        self.0
            .tensor_raw(name)
            .is_ok_and(|(dtype, _, _)| dtype == safetensors::Dtype::F32)
    }
}

impl LlamaWeights {
    pub fn from_gguf(file: &GgufFile, cfg: &ModelConfig) -> Result<Self> {
        Self::load(&Gguf(file, cfg.architecture == "llama"), cfg)
    }

    pub fn from_hf(ckpt: &HfCheckpoint, cfg: &ModelConfig) -> Result<Self> {
        Self::load(&Hf(ckpt), cfg)
    }

    fn load(src: &dyn Source, cfg: &ModelConfig) -> Result<Self> {
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let embed = match quantized(src, &[Part::Embed], 0, cfg) {
            Some(q) => Matrix::Quant(q),
            None => matrix(
                src,
                &[Part::Embed],
                tensor(src, Part::Embed, 0, &[v, h], cfg)?,
                0,
            ),
        };
        let final_norm = tensor(src, Part::FinalNorm, 0, &[h], cfg)?;
        let head_name = src.name(Part::LmHead, 0);
        let lm_head = if src.has(&head_name) && !cfg.tie_word_embeddings {
            Some(linear(src, &[Part::LmHead], None, 0, cfg)?)
        } else {
            None
        };
        let layers = (0..cfg.num_layers)
            .into_par_iter()
            .map(|l| layer(src, l, cfg))
            .collect::<Result<Vec<_>>>()?;
        Ok(LlamaWeights {
            embed,
            layers,
            final_norm,
            lm_head,
        })
    }
}

fn layer(src: &dyn Source, l: usize, cfg: &ModelConfig) -> Result<LayerWeights> {
    let h = cfg.hidden_size;
    let bias = cfg
        .attention_bias
        .then_some([Part::QBias, Part::KBias, Part::VBias]);
    Ok(LayerWeights {
        attn_norm: tensor(src, Part::AttnNorm, l, &[h], cfg)?,
        qkv: linear(
            src,
            &[Part::Q, Part::K, Part::V],
            bias.as_ref().map(|b| &b[..]),
            l,
            cfg,
        )?,
        o: linear(src, &[Part::O], None, l, cfg)?,
        ffn_norm: tensor(src, Part::FfnNorm, l, &[h], cfg)?,
        gate_up: linear(src, &[Part::Gate, Part::Up], None, l, cfg)?,
        down: linear(src, &[Part::Down], None, l, cfg)?,
    })
}

/// The shape a part must have.
fn expected_shape(part: Part, cfg: &ModelConfig) -> Vec<usize> {
    let (h, f) = (cfg.hidden_size, cfg.intermediate_size);
    match part {
        Part::Embed | Part::LmHead => vec![cfg.vocab_size, h],
        Part::FinalNorm | Part::AttnNorm | Part::FfnNorm => vec![h],
        Part::Q => vec![cfg.q_dim(), h],
        Part::K | Part::V => vec![cfg.kv_dim(), h],
        Part::QBias => vec![cfg.q_dim()],
        Part::KBias | Part::VBias => vec![cfg.kv_dim()],
        Part::O => vec![h, cfg.q_dim()],
        Part::Gate | Part::Up => vec![f, h],
        Part::Down => vec![h, f],
    }
}

fn tensor(
    src: &dyn Source,
    part: Part,
    l: usize,
    want: &[usize],
    cfg: &ModelConfig,
) -> Result<Vec<f32>> {
    let name = src.name(part, l);
    let (shape, mut data) = src.load(&name)?;
    if shape != want {
        return Err(Error::Model(format!(
            "tensor {name} has shape {shape:?}, expected {want:?}"
        )));
    }
    if let Some(order) = src.row_order(part, cfg) {
        data = reorder_rows(&data, &order);
    }
    Ok(data)
}

/// Keeps `data` in f32 when every part is f32 in the source, else in f16.
fn matrix(src: &dyn Source, parts: &[Part], data: Vec<f32>, l: usize) -> Matrix {
    if parts.iter().all(|&p| src.is_f32(&src.name(p, l))) {
        Matrix::F32(data)
    } else {
        Matrix::F16(data.into_iter().map(half::f16::from_f32).collect())
    }
}

/// The parts as one stacked quantized matrix, when every part is quantized alike.
fn quantized(src: &dyn Source, parts: &[Part], l: usize, cfg: &ModelConfig) -> Option<QMatrix> {
    let mut qs = Vec::new();
    for &p in parts {
        let mut q = src.quantized(&src.name(p, l))?;
        if [q.rows, q.cols] != expected_shape(p, cfg)[..] {
            return None;
        }
        if let Some(order) = src.row_order(p, cfg) {
            q.permute_rows(&order);
        }
        qs.push(q);
    }
    QMatrix::concat(qs)
}

/// Loads parts that share an input and stacks their rows into one matrix (and biases).
fn linear(
    src: &dyn Source,
    parts: &[Part],
    biases: Option<&[Part]>,
    l: usize,
    cfg: &ModelConfig,
) -> Result<Linear> {
    let rows: usize = parts.iter().map(|&p| expected_shape(p, cfg)[0]).sum();
    let cols = expected_shape(parts[0], cfg)[1];
    let w = match quantized(src, parts, l, cfg) {
        Some(q) => Matrix::Quant(q),
        None => {
            let mut w = Vec::with_capacity(rows * cols);
            for &p in parts {
                w.extend(tensor(src, p, l, &expected_shape(p, cfg), cfg)?);
            }
            matrix(src, parts, w, l)
        }
    };
    let b = match biases {
        None => None,
        Some(bs) => {
            let mut b = Vec::with_capacity(rows);
            for &p in bs {
                b.extend(tensor(src, p, l, &expected_shape(p, cfg), cfg)?);
            }
            Some(b)
        }
    };
    Ok(Linear { w, b, rows, cols })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_the_gguf_interleave() {
        // 2 heads of dim 4, one column: HF rows [h0: a0 a1 b0 b1, h1: ...] where (a_j, b_j)
        // rotate together; GGUF stores them as [a0 b0 a1 b1].
        let hf: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let gguf = vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0];
        assert_eq!(reorder_rows(&gguf, &unpermute_order(2, 4)), hf);
    }
}
