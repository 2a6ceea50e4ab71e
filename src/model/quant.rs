//! GGML tensor types and their dequantization to f32: the plain floats and the 32-value
//! block types (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) here, the K-quants and IQ4
//! in `kquant`.
//!
//! Block layouts follow ggml's `ggml-common.h`: each 32-value block starts with an f16
//! scale `d` (Q4_1 and Q5_1 add an f16 minimum `m`). In Q4 and Q5 blocks, byte `j` holds
//! value `j` in its low nibble and value `j + 16` in its high nibble; Q5's fifth bits are a
//! little-endian u32 after the scales, bit `j` for value `j`.

use half::{bf16, f16};

use super::kquant::{self, QK4_NL, QK_K};
use crate::error::{Error, Result};

/// Values per quantized block.
pub const QK: usize = 32;

/// The tensor types of the GGUF format that we can load (named as ggml names them).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit floats.
    F32,
    /// IEEE half precision.
    F16,
    /// Blocks of 32 4-bit codes and an f16 scale: value `d·(q - 8)`.
    Q4_0,
    /// Blocks of 32 4-bit codes, an f16 scale and an f16 minimum: value `d·q + m`.
    Q4_1,
    /// Blocks of 32 signed 8-bit codes and an f16 scale: value `d·q`.
    Q8_0,
    /// bfloat16.
    BF16,
    /// Blocks of 32 5-bit codes and an f16 scale: value `d·(q - 16)`.
    Q5_0,
    /// Blocks of 32 5-bit codes, an f16 scale and an f16 minimum: value `d·q + m`.
    Q5_1,
    /// Super-blocks of 256 2-bit codes, 4-bit scales and minimums per 16.
    Q2_K,
    /// Super-blocks of 256 3-bit codes, 6-bit signed scales per 16.
    Q3_K,
    /// Super-blocks of 256 4-bit codes, 6-bit scales and minimums per 32.
    Q4_K,
    /// Super-blocks of 256 5-bit codes, 6-bit scales and minimums per 32.
    Q5_K,
    /// Super-blocks of 256 6-bit codes, int8 scales per 16.
    Q6_K,
    /// Blocks of 32 4-bit indices into a non-linear table, an f16 scale.
    IQ4_NL,
    /// Super-blocks of 256 4-bit table indices, 6-bit scales per 32.
    IQ4_XS,
}

impl GgmlType {
    /// Every type.
    pub const ALL: [GgmlType; 15] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::BF16,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ];

    /// Maps ggml's numeric type id; unknown or unsupported ids are an error naming the id.
    pub fn from_id(id: u32) -> Result<Self> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            20 => GgmlType::IQ4_NL,
            23 => GgmlType::IQ4_XS,
            30 => GgmlType::BF16,
            other => {
                return Err(Error::Gguf(format!(
                    "tensor type {other} ({}) is not supported; supported: F32, F16, BF16, \
                     Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS",
                    ggml_type_name(other)
                )))
            }
        })
    }

    /// Values per block (1 for plain floats).
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q5_1 => {
                QK
            }
            GgmlType::IQ4_NL => QK4_NL,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + QK / 2,
            GgmlType::Q4_1 => 4 + QK / 2,
            GgmlType::Q8_0 => 2 + QK,
            GgmlType::Q5_0 => 2 + 4 + QK / 2,
            GgmlType::Q5_1 => 4 + 4 + QK / 2,
            GgmlType::Q2_K => kquant::Q2_K_BYTES,
            GgmlType::Q3_K => kquant::Q3_K_BYTES,
            GgmlType::Q4_K => kquant::Q4_K_BYTES,
            GgmlType::Q5_K => kquant::Q5_K_BYTES,
            GgmlType::Q6_K => kquant::Q6_K_BYTES,
            GgmlType::IQ4_NL => kquant::IQ4_NL_BYTES,
            GgmlType::IQ4_XS => kquant::IQ4_XS_BYTES,
        }
    }

    /// Bytes taken by `n` values, or None when `n` is not a whole number of blocks.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_len()) {
            return None;
        }
        (n / self.block_len()).checked_mul(self.block_bytes())
    }
}

/// ggml's name for a type id, for error messages.
fn ggml_type_name(id: u32) -> &'static str {
    const NAMES: [&str; 31] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
        "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
        "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    NAMES.get(id as usize).copied().unwrap_or("unknown")
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes `bytes` (exactly `out.len()` values of type `ty`) into `out`.
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let need = ty.bytes_for(out.len()).ok_or_else(|| {
        Error::Gguf(format!(
            "{} values are not a whole number of {ty:?} blocks",
            out.len()
        ))
    })?;
    if bytes.len() != need {
        return Err(Error::Gguf(format!(
            "{ty:?} data for {} values needs {need} bytes, got {}",
            out.len(),
            bytes.len()
        )));
    }
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q8_0 => {
            for (o, b) in out
                .chunks_exact_mut(QK)
                .zip(bytes.chunks_exact(ty.block_bytes()))
            {
                let d = f16_at(b, 0);
                for (x, &q) in o.iter_mut().zip(&b[2..]) {
                    *x = (q as i8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_0 => {
            for (o, b) in out
                .chunks_exact_mut(QK)
                .zip(bytes.chunks_exact(ty.block_bytes()))
            {
                let d = f16_at(b, 0);
                unpack_nibbles(&b[2..], o, |q| (q as f32 - 8.0) * d);
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in out
                .chunks_exact_mut(QK)
                .zip(bytes.chunks_exact(ty.block_bytes()))
            {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                unpack_nibbles(&b[4..], o, |q| q as f32 * d + m);
            }
        }
        GgmlType::Q5_0 => {
            for (o, b) in out
                .chunks_exact_mut(QK)
                .zip(bytes.chunks_exact(ty.block_bytes()))
            {
                let d = f16_at(b, 0);
                for (v, q) in o.iter_mut().zip(q5_codes(&b[2..6], &b[6..])) {
                    *v = d * (q as i8 - 16) as f32;
                }
            }
        }
        GgmlType::Q5_1 => {
            for (o, b) in out
                .chunks_exact_mut(QK)
                .zip(bytes.chunks_exact(ty.block_bytes()))
            {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for (v, q) in o.iter_mut().zip(q5_codes(&b[4..8], &b[8..])) {
                    *v = d * q as f32 + m;
                }
            }
        }
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::IQ4_NL
        | GgmlType::IQ4_XS => {
            let block: fn(&[u8], &mut [f32]) = match ty {
                GgmlType::Q2_K => kquant::dequantize_q2_k,
                GgmlType::Q3_K => kquant::dequantize_q3_k,
                GgmlType::Q4_K => kquant::dequantize_q4_k,
                GgmlType::Q5_K => kquant::dequantize_q5_k,
                GgmlType::Q6_K => kquant::dequantize_q6_k,
                GgmlType::IQ4_NL => kquant::dequantize_iq4_nl,
                _ => kquant::dequantize_iq4_xs,
            };
            for (o, b) in out
                .chunks_exact_mut(ty.block_len())
                .zip(bytes.chunks_exact(ty.block_bytes()))
            {
                block(b, o);
            }
        }
    }
    Ok(())
}

/// The 32 five-bit codes of a Q5 block: low nibbles in `qs` (code j low, j + 16 high),
/// fifth bits in the little-endian word `qh` (bit j for code j).
pub(crate) fn q5_codes(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let half = QK / 2;
    let mut out = [0u8; QK];
    for j in 0..half {
        let high = |k: usize| (((qh >> k) & 1) as u8) << 4;
        out[j] = (qs[j] & 0x0f) | high(j);
        out[j + half] = (qs[j] >> 4) | high(j + half);
    }
    out
}

fn unpack_nibbles(qs: &[u8], out: &mut [f32], value: impl Fn(u8) -> f32) {
    let half = QK / 2;
    for j in 0..half {
        out[j] = value(qs[j] & 0x0f);
        out[j + half] = value(qs[j] >> 4);
    }
}

/// Dequantizes a whole tensor, splitting large ones across threads.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    use rayon::prelude::*;
    let mut out = vec![0f32; n];
    ty.bytes_for(n)
        .filter(|&b| b == bytes.len())
        .ok_or_else(|| {
            Error::Gguf(format!(
                "{ty:?} data of {} bytes does not hold {n} values",
                bytes.len()
            ))
        })?;
    // Chunks of whole blocks, so each piece dequantizes independently.
    let per_chunk = ty.block_len() * 4096;
    let bytes_per_chunk = ty.bytes_for(per_chunk).expect("whole blocks");
    out.par_chunks_mut(per_chunk)
        .zip(bytes.par_chunks(bytes_per_chunk))
        .try_for_each(|(o, b)| dequantize_into(ty, b, o))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q8_0_block() {
        let mut b = h(0.5).to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let out = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        for (i, x) in out.iter().enumerate() {
            assert_eq!(*x, (i as f32 - 16.0) * 0.5);
        }
    }

    #[test]
    fn q4_0_block_nibble_order() {
        let mut b = h(2.0).to_vec();
        // byte j: low nibble j, high nibble 15 - j.
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let out = dequantize(GgmlType::Q4_0, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 2.0);
            assert_eq!(out[j + 16], ((15 - j) as f32 - 8.0) * 2.0);
        }
    }

    #[test]
    fn q4_1_block_with_min() {
        let mut b = h(0.25).to_vec();
        b.extend(h(-1.5));
        b.extend((0..16u8).map(|j| (j % 16) | (3 << 4)));
        let out = dequantize(GgmlType::Q4_1, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 0.25 - 1.5);
            assert_eq!(out[j + 16], 3.0 * 0.25 - 1.5);
        }
    }

    #[test]
    fn two_blocks_use_their_own_scales() {
        let mut b = h(1.0).to_vec();
        b.extend([1u8; 32]);
        b.extend(h(-3.0));
        b.extend([2u8; 32]);
        let out = dequantize(GgmlType::Q8_0, &b, 64).unwrap();
        assert!(out[..32].iter().all(|&x| x == 1.0));
        assert!(out[32..].iter().all(|&x| x == -6.0));
    }

    #[test]
    fn plain_float_types() {
        let f32s: Vec<u8> = [1.5f32, -2.25]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(
            dequantize(GgmlType::F32, &f32s, 2).unwrap(),
            vec![1.5, -2.25]
        );
        let f16s: Vec<u8> = [h(0.5), h(-7.0)].concat();
        assert_eq!(
            dequantize(GgmlType::F16, &f16s, 2).unwrap(),
            vec![0.5, -7.0]
        );
        let bf16s: Vec<u8> = [
            bf16::from_f32(3.0).to_le_bytes(),
            bf16::from_f32(-0.125).to_le_bytes(),
        ]
        .concat();
        assert_eq!(
            dequantize(GgmlType::BF16, &bf16s, 2).unwrap(),
            vec![3.0, -0.125]
        );
    }

    #[test]
    fn size_mismatches_are_errors() {
        assert!(dequantize(GgmlType::Q8_0, &[0u8; 33], 32).is_err());
        assert!(dequantize(GgmlType::Q4_0, &[0u8; 18], 31).is_err());
        let e = GgmlType::from_id(16).unwrap_err().to_string();
        assert!(e.contains("IQ2_XXS") && e.contains("Q4_K"), "{e}");
        assert!(GgmlType::from_id(999).is_err());
    }
}
