//! Decoder weights of every family for the CPU path, loaded from a GGUF file or an HF
//! safetensors checkpoint under the names its family gives (`model::family`). Q, K and V
//! are fused into one matrix, as are gate and up.
//! Matrices stored as F32 in the source stay f32; half-precision and quantized ones are
//! kept as f16 (exact for F16, and far below the quantization error for Q4/Q8), which
//! halves the bytes each decode step reads. Norms and biases are always f32.

use rayon::prelude::*;

use super::config::ModelConfig;
use super::family::{Family, Format, Kind, Mlp, NormKind, Part};
use super::gguf::GgufFile;
use super::quant::GgmlType;
use super::safetensors::HfCheckpoint;
use super::stored::{Stored, StoredPart};
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

/// A norm's weight, and its bias where it is a LayerNorm.
#[derive(Clone, Debug)]
pub struct Norm {
    pub w: Vec<f32>,
    pub b: Option<Vec<f32>>,
}

pub struct LayerWeights {
    pub attn_norm: Norm,
    /// Rows: q (heads·head_dim), then k, then v (kv_heads·head_dim each).
    pub qkv: Linear,
    /// Per-head norms of q and of k (`head_dim` each), where the family has them.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub o: Linear,
    /// The attention output's norm (Gemma).
    pub post_attn_norm: Option<Norm>,
    pub ffn_norm: Norm,
    /// Rows: gate (intermediate), then up (intermediate); up alone for an ungated MLP.
    pub gate_up: Linear,
    pub down: Linear,
    /// The MLP output's norm (Gemma).
    pub post_ffn_norm: Option<Norm>,
}

pub struct LlamaWeights {
    /// `[vocab, hidden]`.
    pub embed: Matrix,
    /// `[max_position_embeddings, hidden]` learned positions (GPT-2).
    pub pos_embed: Option<Vec<f32>>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Norm,
    /// None when the head is tied to the embedding.
    pub lm_head: Option<Linear>,
}

/// A place tensors come from.
trait Source: Sync {
    fn family(&self) -> Family;
    fn format(&self) -> Format;
    fn has(&self, name: &str) -> bool;
    fn load(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)>;
    /// Whether the tensor is stored as f32 in the source (so it stays f32 here).
    fn is_f32(&self, name: &str) -> bool;
    /// The tensor as a block-quantized matrix, when the source holds it quantized.
    fn quantized(&self, _name: &str) -> Option<QMatrix> {
        None
    }
    /// The tensor's 16-bit rows left in the source's memory map, when it leaves them there.
    fn stored(&self, _name: &str) -> Option<StoredPart> {
        None
    }
    /// The name of a part's weight or bias in layer `l`, as the file spells it.
    fn name(&self, part: Part, kind: Kind, l: usize) -> Option<String> {
        self.family().name(self.format(), part, kind, l)
    }
    /// The order of rows that undoes a format's reordering of Q or K (see `fix_rows`).
    fn row_order(&self, _part: Part, _cfg: &ModelConfig) -> Option<Vec<usize>> {
        None
    }
}

struct Gguf<'a>(&'a GgufFile, Family);

impl Source for Gguf<'_> {
    fn family(&self) -> Family {
        self.1
    }
    fn format(&self) -> Format {
        Format::Gguf
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
                    | GgmlType::Q5_0
                    | GgmlType::Q5_1
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
            Part::Q if self.1.gguf_permuted_qk() => cfg.num_heads,
            Part::K if self.1.gguf_permuted_qk() => cfg.num_kv_heads,
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

fn transpose(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = w[r * cols + c];
        }
    }
    out
}

/// A checkpoint folder; with `mapped`, its 16-bit matrices stay in the memory map.
struct Hf<'a> {
    ckpt: &'a HfCheckpoint,
    family: Family,
    mapped: bool,
}

impl Source for Hf<'_> {
    fn family(&self) -> Family {
        self.family
    }
    fn format(&self) -> Format {
        Format::Hf
    }
    fn name(&self, part: Part, kind: Kind, l: usize) -> Option<String> {
        let name = self.family.name(Format::Hf, part, kind, l)?;
        // GPT-2 checkpoints saved by transformers prefix `transformer.`; the original
        // ones do not.
        match name.strip_prefix("transformer.") {
            Some(bare) if !self.ckpt.contains(&name) && self.ckpt.contains(bare) => {
                Some(bare.into())
            }
            _ => Some(name),
        }
    }
    fn has(&self, name: &str) -> bool {
        self.ckpt.contains(name)
    }
    fn load(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        self.ckpt.tensor_f32(name)
    }
    fn stored(&self, name: &str) -> Option<StoredPart> {
        match self.mapped {
            true => self.ckpt.tensor_stored(name).ok().flatten(),
            false => None,
        }
    }
    fn is_f32(&self, name: &str) -> bool {
        self.ckpt
            .tensor_raw(name)
            .is_ok_and(|(dtype, _, _)| dtype == safetensors::Dtype::F32)
    }
}

impl LlamaWeights {
    pub fn from_gguf(file: &GgufFile, cfg: &ModelConfig) -> Result<Self> {
        Self::load(&Gguf(file, cfg.arch.family), cfg)
    }

    /// The weights of a checkpoint folder; with `mapped` its 16-bit matrices stay in the
    /// memory map ([`Matrix::Stored`]) for the GPU engine's upload.
    pub fn from_hf(ckpt: &HfCheckpoint, cfg: &ModelConfig, mapped: bool) -> Result<Self> {
        let src = Hf {
            ckpt,
            family: cfg.arch.family,
            mapped,
        };
        Self::load(&src, cfg)
    }

    fn load(src: &dyn Source, cfg: &ModelConfig) -> Result<Self> {
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let in_place = || stored(src, &[Part::Embed], 0, cfg);
        let embed = match (quantized(src, &[Part::Embed], 0, cfg), in_place()) {
            (Some(q), _) => Matrix::Quant(q),
            (None, Some(s)) => Matrix::Stored(s),
            (None, None) => matrix(
                src,
                &[Part::Embed],
                tensor(src, Part::Embed, Kind::Weight, 0, &[v, h], cfg)?,
                0,
            ),
        };
        let pos_embed = if cfg.arch.learned_positions {
            let want = [cfg.max_position_embeddings, h];
            Some(tensor(src, Part::PosEmbed, Kind::Weight, 0, &want, cfg)?)
        } else {
            None
        };
        let final_norm = norm(src, Part::FinalNorm, 0, cfg)?;
        let head = src.name(Part::LmHead, Kind::Weight, 0);
        let lm_head = match head {
            Some(name) if src.has(&name) && !cfg.tie_word_embeddings => {
                Some(linear(src, &[Part::LmHead], 0, cfg)?)
            }
            _ => None,
        };
        let layers = (0..cfg.num_layers)
            .into_par_iter()
            .map(|l| layer(src, l, cfg))
            .collect::<Result<Vec<_>>>()?;
        Ok(LlamaWeights {
            embed,
            pos_embed,
            layers,
            final_norm,
            lm_head,
        })
    }
}

/// The `split` parts where the file holds them all (stacked at load), else `fused` where
/// it holds that (GGUF names Phi-3's fused gate|up `ffn_up`, as others' up alone).
fn parts(src: &dyn Source, fused: Part, split: &[Part], l: usize) -> Vec<Part> {
    let held = |p: Part| src.name(p, Kind::Weight, l).is_some_and(|n| src.has(&n));
    if !split.iter().all(|&p| held(p)) && held(fused) {
        vec![fused]
    } else {
        split.to_vec()
    }
}

fn layer(src: &dyn Source, l: usize, cfg: &ModelConfig) -> Result<LayerWeights> {
    let a = &cfg.arch;
    let hd = cfg.head_dim;
    let qkv = parts(src, Part::Qkv, &[Part::Q, Part::K, Part::V], l);
    let gate_up = match a.mlp {
        Mlp::Gelu => vec![Part::Up],
        Mlp::SwiGlu | Mlp::GeGlu => parts(src, Part::GateUp, &[Part::Gate, Part::Up], l),
    };
    let head_norm = |part| -> Result<Option<Vec<f32>>> {
        if !a.qk_norm {
            return Ok(None);
        }
        let mut w = tensor(src, part, Kind::Weight, l, &[hd], cfg)?;
        offset_norm(src, &mut w);
        Ok(Some(w))
    };
    let sandwich = |part| {
        a.sandwich_norms
            .then(|| norm(src, part, l, cfg))
            .transpose()
    };
    Ok(LayerWeights {
        attn_norm: norm(src, Part::AttnNorm, l, cfg)?,
        qkv: linear(src, &qkv, l, cfg)?,
        q_norm: head_norm(Part::QNorm)?,
        k_norm: head_norm(Part::KNorm)?,
        o: linear(src, &[Part::O], l, cfg)?,
        post_attn_norm: sandwich(Part::PostAttnNorm)?,
        ffn_norm: norm(src, Part::FfnNorm, l, cfg)?,
        gate_up: linear(src, &gate_up, l, cfg)?,
        down: linear(src, &[Part::Down], l, cfg)?,
        post_ffn_norm: sandwich(Part::PostFfnNorm)?,
    })
}

/// Gemma's HF norms scale by `1 + w`: folded into `w` (GGUF files hold it folded).
fn offset_norm(src: &dyn Source, w: &mut [f32]) {
    let gemma = matches!(src.family(), Family::Gemma2 | Family::Gemma3);
    if gemma && src.format() == Format::Hf {
        w.iter_mut().for_each(|v| *v += 1.0);
    }
}

/// A norm's weight (and bias, for a LayerNorm).
fn norm(src: &dyn Source, part: Part, l: usize, cfg: &ModelConfig) -> Result<Norm> {
    let h = cfg.hidden_size;
    let mut w = tensor(src, part, Kind::Weight, l, &[h], cfg)?;
    offset_norm(src, &mut w);
    let b = match cfg.arch.norm {
        NormKind::Rms => None,
        NormKind::Layer => Some(tensor(src, part, Kind::Bias, l, &[h], cfg)?),
    };
    Ok(Norm { w, b })
}

/// The shape a part's weight must have.
fn expected_shape(part: Part, cfg: &ModelConfig) -> Vec<usize> {
    let (h, f) = (cfg.hidden_size, cfg.intermediate_size);
    match part {
        Part::Embed | Part::LmHead => vec![cfg.vocab_size, h],
        Part::PosEmbed => vec![cfg.max_position_embeddings, h],
        Part::FinalNorm
        | Part::AttnNorm
        | Part::FfnNorm
        | Part::PostAttnNorm
        | Part::PostFfnNorm => vec![h],
        Part::QNorm | Part::KNorm => vec![cfg.head_dim],
        Part::Q => vec![cfg.q_dim(), h],
        Part::K | Part::V => vec![cfg.kv_dim(), h],
        Part::Qkv => vec![cfg.q_dim() + 2 * cfg.kv_dim(), h],
        Part::O => vec![h, cfg.q_dim()],
        Part::Gate | Part::Up => vec![f, h],
        Part::GateUp => vec![2 * f, h],
        Part::Down => vec![h, f],
    }
}

fn tensor(
    src: &dyn Source,
    part: Part,
    kind: Kind,
    l: usize,
    want: &[usize],
    cfg: &ModelConfig,
) -> Result<Vec<f32>> {
    let name = src.name(part, kind, l).ok_or_else(|| {
        Error::Model(format!(
            "{:?} has no {part:?} {kind:?} tensor",
            src.family()
        ))
    })?;
    let (mut shape, mut data) = src.load(&name)?;
    let linear = !matches!(part, Part::Embed | Part::PosEmbed | Part::LmHead);
    if src.family().hf_transposed() && src.format() == Format::Hf && shape.len() == 2 && linear {
        data = transpose(&data, shape[0], shape[1]);
        shape.reverse();
    }
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
    let f32 = |&p: &Part| src.name(p, Kind::Weight, l).is_some_and(|n| src.is_f32(&n));
    if parts.iter().all(f32) {
        Matrix::F32(data)
    } else {
        Matrix::F16(data.into_iter().map(half::f16::from_f32).collect())
    }
}

/// The parts as one stacked quantized matrix, when every part is quantized alike.
fn quantized(src: &dyn Source, parts: &[Part], l: usize, cfg: &ModelConfig) -> Option<QMatrix> {
    let mut qs = Vec::new();
    for &p in parts {
        let mut q = src.quantized(&src.name(p, Kind::Weight, l)?)?;
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

/// The parts as one matrix left in the source's memory map, where it keeps them there and
/// they need no change on the way (no transposed layout, no reordered rows) and have their
/// expected shapes (else they load as values, which names what is wrong).
fn stored(src: &dyn Source, parts: &[Part], l: usize, cfg: &ModelConfig) -> Option<Stored> {
    let mut out = Vec::with_capacity(parts.len());
    for &p in parts {
        let linear = !matches!(p, Part::Embed | Part::PosEmbed | Part::LmHead);
        if linear && src.family().hf_transposed() && src.format() == Format::Hf {
            return None;
        }
        let s = src.stored(&src.name(p, Kind::Weight, l)?)?;
        if [s.rows, s.cols] != expected_shape(p, cfg)[..] || src.row_order(p, cfg).is_some() {
            return None;
        }
        out.push(s);
    }
    Stored::stack(out)
}

/// Loads parts that share an input and stacks their rows into one matrix (and their
/// biases, where the family has them).
fn linear(src: &dyn Source, parts: &[Part], l: usize, cfg: &ModelConfig) -> Result<Linear> {
    let rows: usize = parts.iter().map(|&p| expected_shape(p, cfg)[0]).sum();
    let cols = expected_shape(parts[0], cfg)[1];
    let w = match (quantized(src, parts, l, cfg), stored(src, parts, l, cfg)) {
        (Some(q), _) => Matrix::Quant(q),
        (None, Some(s)) => Matrix::Stored(s),
        (None, None) => {
            let mut w = Vec::with_capacity(rows * cols);
            for &p in parts {
                w.extend(tensor(
                    src,
                    p,
                    Kind::Weight,
                    l,
                    &expected_shape(p, cfg),
                    cfg,
                )?);
            }
            matrix(src, parts, w, l)
        }
    };
    let b = if parts.iter().any(|&p| cfg.arch.has_bias(p)) {
        let mut b = Vec::with_capacity(rows);
        for &p in parts {
            let want = [expected_shape(p, cfg)[0]];
            b.extend(tensor(src, p, Kind::Bias, l, &want, cfg)?);
        }
        Some(b)
    } else {
        None
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
