//! GGUF writer: builds GGUF images in memory. Tests use it to hand-make files (valid and
//! broken ones) and tiny quantized models; it writes version 3.

use half::f16;

use super::gguf::MetaValue;
use super::kquant_encode;
use super::quant::{GgmlType, QK};

/// Collects metadata and tensors, then serialises them.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<usize>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the metadata entry `key` (entries are written in the order added).
    pub fn meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor of row-major `shape` whose data is already encoded as `ty`.
    pub fn tensor_raw(
        &mut self,
        name: &str,
        shape: &[usize],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        let dims = shape.iter().rev().copied().collect();
        self.tensors.push((name.to_string(), dims, ty, data));
        self
    }

    /// Adds an f32 tensor, encoded (quantized) as `ty`.
    pub fn tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        ty: GgmlType,
        values: &[f32],
    ) -> &mut Self {
        self.tensor_raw(name, shape, ty, encode(ty, values))
    }

    /// Serialises the file, aligning tensor data to `general.alignment` when set, else 32.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self
            .metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .map_or(32, |a| a as usize);
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend(type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0usize;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend((*d as u64).to_le_bytes());
            }
            out.extend(ggml_id(*ty).to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset = (offset + data.len()).div_ceil(align) * align;
        }
        pad_to(&mut out, align);
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            pad_to(&mut out, align);
        }
        out
    }
}

fn pad_to(out: &mut Vec<u8>, align: usize) {
    out.resize(out.len().div_ceil(align) * align, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn ggml_id(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q5_0 => 6,
        GgmlType::Q5_1 => 7,
        GgmlType::Q8_0 => 8,
        GgmlType::Q2_K => 10,
        GgmlType::Q3_K => 11,
        GgmlType::Q4_K => 12,
        GgmlType::Q5_K => 13,
        GgmlType::Q6_K => 14,
        GgmlType::IQ4_NL => 20,
        GgmlType::IQ4_XS => 23,
        GgmlType::BF16 => 30,
    }
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(items) => {
            let elem = items.first().map(type_id).unwrap_or(4);
            out.extend(elem.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for it in items {
                put_value(out, it);
            }
        }
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

/// Encodes f32 values as `ty`: round-to-nearest quantization, as ggml's reference code for
/// the 32-value Q4/Q8 blocks, per sub-block min/max scaling for the others (see
/// `kquant_encode`; those need whole blocks).
pub fn encode(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        GgmlType::BF16 => values
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 => values.chunks(QK).flat_map(q8_0_block).collect(),
        GgmlType::Q4_0 => values.chunks(QK).flat_map(q4_0_block).collect(),
        GgmlType::Q4_1 => values.chunks(QK).flat_map(q4_1_block).collect(),
        GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::IQ4_NL
        | GgmlType::IQ4_XS => kquant_encode::encode_blocks(ty, values),
    }
}

fn q8_0_block(x: &[f32]) -> Vec<u8> {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(x.iter().map(|v| (v * inv).round() as i8 as u8));
    b
}

fn pack_nibbles(q: impl Fn(f32) -> u8, x: &[f32]) -> Vec<u8> {
    (0..QK / 2)
        .map(|j| q(x[j]) | (q(x[j + QK / 2]) << 4))
        .collect()
}

fn q4_0_block(x: &[f32]) -> Vec<u8> {
    // ggml picks the value of largest magnitude and maps it to -8.
    let max = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -8.0;
    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(pack_nibbles(
        |v| ((v * inv + 8.5) as i32).clamp(0, 15) as u8,
        x,
    ));
    b
}

fn q4_1_block(x: &[f32]) -> Vec<u8> {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / 15.0;
    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(f16::from_f32(min).to_le_bytes());
    b.extend(pack_nibbles(
        |v| (((v - min) * inv + 0.5) as i32).clamp(0, 15) as u8,
        x,
    ));
    b
}
