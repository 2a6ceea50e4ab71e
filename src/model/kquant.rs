//! GGUF's K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4 (IQ4_NL, IQ4_XS) block layouts and
//! their dequantization to f32, bit for bit as ggml's reference code computes it.
//!
//! K-quants cover super-blocks of 256 values split into sub-blocks of 16 or 32, each with
//! a small integer scale (and minimum) that multiplies the super-block's f16 scale. IQ4
//! codes index a fixed non-linear table of 16 int8 values. Each function below takes whole
//! blocks; `quant::dequantize_into` checks the sizes. The float operations are done in the
//! reference's order (a product of the scales first, then the code), so the results are
//! the same bits.

use half::f16;

/// Values per K-quant (and IQ4_XS) super-block.
pub const QK_K: usize = 256;

/// Bytes per Q2_K super-block: 16 scale/min bytes, 64 bytes of 2-bit codes, f16 `d`, `dmin`.
pub const Q2_K_BYTES: usize = QK_K / 16 + QK_K / 4 + 4;
/// Bytes per Q3_K super-block: 32-byte high-bit mask, 64 bytes of low 2 bits, 12 bytes of
/// 6-bit scales, f16 `d`.
pub const Q3_K_BYTES: usize = QK_K / 8 + QK_K / 4 + 12 + 2;
/// Bytes per Q4_K super-block: f16 `d`, `dmin`, 12 bytes of 6-bit scales and mins, 128
/// bytes of 4-bit codes.
pub const Q4_K_BYTES: usize = 4 + 12 + QK_K / 2;
/// Bytes per Q5_K super-block: as Q4_K with a 32-byte fifth-bit plane before the codes.
pub const Q5_K_BYTES: usize = 4 + 12 + QK_K / 8 + QK_K / 2;
/// Bytes per Q6_K super-block: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales,
/// f16 `d`.
pub const Q6_K_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
/// Values per IQ4_NL block.
pub const QK4_NL: usize = 32;
/// Bytes per IQ4_NL block: f16 `d` and 16 bytes of 4-bit table indices.
pub const IQ4_NL_BYTES: usize = 2 + QK4_NL / 2;
/// Bytes per IQ4_XS super-block: f16 `d`, 2 bytes of high scale bits, 4 of low scale bits,
/// 128 bytes of 4-bit table indices.
pub const IQ4_XS_BYTES: usize = 2 + 2 + QK_K / 64 + QK_K / 2;

/// The non-linear values IQ4 codes index.
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) of a Q4_K / Q5_K super-block, from
/// its 12 packed bytes: sub-blocks 0..4 use the low 6 bits of bytes `j` (scale) and `j + 4`
/// (minimum); sub-blocks 4..8 take their low 4 bits from byte `j + 4` (scale low nibble,
/// minimum high nibble) and their top 2 bits from the top of bytes `j - 4` and `j`.
#[inline]
pub fn k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The signed 6-bit scale of sub-block `i` (0..16) of a Q3_K super-block from its 12
/// packed bytes: the low nibble from byte `i % 8` (low half for `i < 8`, high half after),
/// the top 2 bits from byte `8 + i % 4` at bit `2 · (i / 4)`, stored offset by 32.
#[inline]
pub fn q3_k_scale(s: &[u8], i: usize) -> i8 {
    let low = if i < 8 { s[i] & 0x0f } else { s[i - 8] >> 4 };
    let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

/// Q2_K: value `d·(sc & 15)·q - dmin·(sc >> 4)` per sub-block of 16, `q` 2 bits. Each half
/// of 128 values takes 32 code bytes; value `h·128 + j·32 + l` is bits `2j..2j+2` of byte
/// `h·32 + l`.
pub fn dequantize_q2_k(b: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (i, o) in out.iter_mut().enumerate() {
        let (h, j, l) = (i / 128, (i / 32) % 4, i % 32);
        let sc = scales[i / 16];
        let dl = d * (sc & 0x0f) as f32;
        let ml = dmin * (sc >> 4) as f32;
        let q = (qs[h * 32 + l] >> (2 * j)) & 3;
        *o = dl * q as f32 - ml;
    }
}

/// Q3_K: value `d·sc·q` per sub-block of 16, `q` in -4..=3: 2 low bits laid out as in
/// Q2_K, and bit `h·4 + j` of mask byte `l` set when `q` is not offset by -4.
pub fn dequantize_q3_k(b: &[u8], out: &mut [f32]) {
    let (hmask, qs, scales) = (&b[..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    for (i, o) in out.iter_mut().enumerate() {
        let (h, j, l) = (i / 128, (i / 32) % 4, i % 32);
        let dl = d * q3_k_scale(scales, i / 16) as f32;
        let low = ((qs[h * 32 + l] >> (2 * j)) & 3) as i8;
        let high = (hmask[l] >> (h * 4 + j)) & 1;
        let q = low - if high == 0 { 4 } else { 0 };
        *o = dl * q as f32;
    }
}

/// Q4_K: value `d·sc·q - dmin·m` per sub-block of 32, `q` 4 bits. Chunk `c` of 32 code
/// bytes holds sub-block `2c` in its low nibbles and `2c + 1` in its high ones.
pub fn dequantize_q4_k(b: &[u8], out: &mut [f32]) {
    scaled_min_blocks(b, &b[16..144], None, out);
}

/// Q5_K: Q4_K with a fifth bit: value `j·32 + l` adds bit `j` of plane byte `l` as 16.
pub fn dequantize_q5_k(b: &[u8], out: &mut [f32]) {
    scaled_min_blocks(b, &b[48..176], Some(&b[16..48]), out);
}

/// Q4_K's and Q5_K's sub-blocks: f16 `d`, `dmin`, then 12 bytes of packed 6-bit scales
/// and minima; the low nibbles in `qs`, the fifth bits (Q5_K) in `qh`.
fn scaled_min_blocks(b: &[u8], qs: &[u8], qh: Option<&[u8]>, out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for (j, o) in out.chunks_exact_mut(32).enumerate() {
        let (sc, m) = k_scale_min(scales, j);
        let d1 = d * sc as f32;
        let m1 = dmin * m as f32;
        let (c, shift) = (j / 2, 4 * (j % 2));
        for (l, v) in o.iter_mut().enumerate() {
            let high = qh.map_or(0, |qh| ((qh[l] >> j) & 1) << 4);
            let q = ((qs[c * 32 + l] >> shift) & 0x0f) | high;
            *v = d1 * q as f32 - m1;
        }
    }
}

/// Q6_K: value `d·sc·(q - 32)` per sub-block of 16, `q` 6 bits. In each half `h` of 128
/// values, value `h·128 + j·32 + l` (j in 0..4) takes its low 4 bits from nibble `j / 2` of
/// byte `h·64 + (j % 2)·32 + l` and its high 2 bits from bits `2j..2j+2` of byte
/// `h·32 + l` of the high plane.
pub fn dequantize_q6_k(b: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (i, o) in out.iter_mut().enumerate() {
        let (h, j, l) = (i / 128, (i / 32) % 4, i % 32);
        let low = (ql[h * 64 + (j % 2) * 32 + l] >> (4 * (j / 2))) & 0x0f;
        let high = (qh[h * 32 + l] >> (2 * j)) & 3;
        let q = (low | (high << 4)) as i8 - 32;
        *o = d * scales[i / 16] as i8 as f32 * q as f32;
    }
}

/// IQ4_NL: value `d·IQ4_VALUES[q]`; byte `l` holds value `l` low and `l + 16` high.
pub fn dequantize_iq4_nl(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for (l, o) in out.iter_mut().enumerate() {
        let q = (qs[l % 16] >> (4 * (l / 16))) & 0x0f;
        *o = d * IQ4_VALUES[q as usize] as f32;
    }
}

/// IQ4_XS: 8 sub-blocks of 32 coded as IQ4_NL (16 bytes each), value
/// `d·(ls - 32)·IQ4_VALUES[q]` with a 6-bit `ls`: low nibble `j % 2` of byte `j / 2` of the
/// low bits, top 2 bits at bit `2j` of the little-endian u16 of high bits.
pub fn dequantize_iq4_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let (scales_l, qs) = (&b[4..8], &b[8..136]);
    for (j, o) in out.chunks_exact_mut(32).enumerate() {
        let low = (scales_l[j / 2] >> (4 * (j % 2))) & 0x0f;
        let high = ((scales_h >> (2 * j)) & 3) as u8;
        let dl = d * ((low | (high << 4)) as i8 - 32) as f32;
        for (l, v) in o.iter_mut().enumerate() {
            let q = (qs[j * 16 + l % 16] >> (4 * (l / 16))) & 0x0f;
            *v = dl * IQ4_VALUES[q as usize] as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::{dequantize, GgmlType};

    /// Reference blocks written by `scripts/kquant_ref.py`: per type, the ggml type id, the
    /// block count, the raw blocks and the `gguf` package's dequantized f32 values.
    const REFERENCE: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kquant_ref.bin"
    ));

    fn u32_at(b: &[u8], i: usize) -> u32 {
        u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
    }

    #[test]
    fn dequantization_matches_the_reference_bit_for_bit() {
        assert_eq!(&REFERENCE[..8], b"KQREF001");
        let mut at = 8;
        let mut seen = Vec::new();
        while at < REFERENCE.len() {
            let (id, blocks) = (u32_at(REFERENCE, at), u32_at(REFERENCE, at + 4) as usize);
            at += 8;
            let ty = GgmlType::from_id(id).unwrap();
            let (n, nbytes) = (blocks * ty.block_len(), blocks * ty.block_bytes());
            let raw = &REFERENCE[at..at + nbytes];
            at += nbytes;
            let want: Vec<u32> = (0..n).map(|i| u32_at(REFERENCE, at + 4 * i)).collect();
            at += 4 * n;
            let got = dequantize(ty, raw, n).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    *w,
                    "{ty:?} value {i} (block {}): {g} vs {}",
                    i / ty.block_len(),
                    f32::from_bits(*w)
                );
            }
            seen.push(ty);
        }
        assert_eq!(at, REFERENCE.len());
        for ty in [
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_NL,
            GgmlType::IQ4_XS,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
        ] {
            assert!(seen.contains(&ty), "the fixture has no {ty:?} blocks");
        }
    }

    #[test]
    fn packed_scales_unpack_to_six_bits() {
        // Q4_K/Q5_K: sub-blocks 0..4 plain, 4..8 split across bytes; all 64 values reachable.
        let mut s = [0u8; 12];
        let sc = [1u8, 63, 0, 17, 42, 63, 5, 32];
        let mn = [63u8, 0, 9, 33, 1, 62, 48, 15];
        for j in 0..4 {
            s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
            s[j + 8] = (sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4);
        }
        for j in 0..8 {
            assert_eq!(k_scale_min(&s, j), (sc[j], mn[j]), "sub-block {j}");
        }
        // Q3_K: scale 5 = low nibble of byte 5, top bits at bits 2..4 of byte 9.
        let mut s3 = [0u8; 12];
        s3[5] = 0x0b;
        s3[9] = 0b10 << 2;
        assert_eq!(q3_k_scale(&s3, 5), (0x0b | (0b10 << 4)) - 32);
        assert_eq!(q3_k_scale(&s3, 13), -32);
    }
}
