//! Round-to-nearest encoders for the Q5, K-quant and IQ4 block formats, used by the GGUF
//! writer (tests and benchmarks build quantized files with them). Each sub-block is scaled
//! from its own minimum and maximum and every code is rounded to the nearest: simpler than
//! llama.cpp's error-minimising searches, but valid blocks that any reader decodes.

use half::f16;

use super::kquant::{IQ4_VALUES, QK_K};
use super::quant::{GgmlType, QK};

/// Encodes `values` (whole blocks of `ty`) as `ty`, one of Q5_0, Q5_1, the K-quants, IQ4_NL
/// and IQ4_XS. Panics on a partial block or another type.
pub fn encode_blocks(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    let len = ty.block_len();
    assert!(
        values.len().is_multiple_of(len),
        "{} values are not whole {ty:?} blocks",
        values.len()
    );
    let block: fn(&[f32], &mut Vec<u8>) = match ty {
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => |x, out| q45_k(x, 15, out),
        GgmlType::Q5_K => |x, out| q45_k(x, 31, out),
        GgmlType::Q6_K => q6_k,
        GgmlType::IQ4_NL => iq4_nl,
        GgmlType::IQ4_XS => iq4_xs,
        other => panic!("{other:?} is not a Q5, K-quant or IQ4 type"),
    };
    let mut out = Vec::with_capacity(values.len() / len * ty.block_bytes());
    for x in values.chunks_exact(len) {
        block(x, &mut out);
    }
    out
}

/// `x` rounded to f16, as its bytes and its value.
fn half(x: f32) -> ([u8; 2], f32) {
    let h = f16::from_f32(x);
    (h.to_le_bytes(), h.to_f32())
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// The value of largest magnitude, with its sign.
fn signed_max(x: &[f32]) -> f32 {
    x.iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

/// `round(x / step)` clamped to `lo..=hi`, or 0 clamped when the step is zero.
fn code(x: f32, step: f32, lo: i32, hi: i32) -> i32 {
    let q = if step != 0.0 {
        (x / step).round() as i32
    } else {
        0
    };
    q.clamp(lo, hi)
}

/// Q5 codes packed: low nibbles as in Q4 (value `j` low, `j + 16` high), then fifth bits.
fn pack_q5(q: &[u8], out: &mut Vec<u8>) {
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &v)| h | (((v >> 4) as u32 & 1) << j));
    out.extend(qh.to_le_bytes());
    out.extend((0..QK / 2).map(|j| (q[j] & 0x0f) | ((q[j + QK / 2] & 0x0f) << 4)));
}

fn q5_0(x: &[f32], out: &mut Vec<u8>) {
    // As ggml: the value of largest magnitude maps to code 0 (-16).
    let (bytes, d) = half(signed_max(x) / -16.0);
    out.extend(bytes);
    let q: Vec<u8> = x
        .iter()
        .map(|&v| (code(v, d, -16, 15) + 16) as u8)
        .collect();
    pack_q5(&q, out);
}

fn q5_1(x: &[f32], out: &mut Vec<u8>) {
    let (lo, hi) = min_max(x);
    let (db, d) = half((hi - lo) / 31.0);
    let (mb, m) = half(lo);
    out.extend(db);
    out.extend(mb);
    let q: Vec<u8> = x.iter().map(|&v| code(v - m, d, 0, 31) as u8).collect();
    pack_q5(&q, out);
}

/// Per sub-block: the scale `(max - min) / nmax` and the minimum's magnitude (minimums
/// above zero are taken as zero, as ggml does), then both coded against a super-block
/// scale as `levels`-level integers. Returns (d, dmin, integer scales, integer minimums).
fn scales_and_mins<const N: usize>(
    x: &[f32],
    nmax: f32,
    levels: f32,
) -> ([u8; 2], f32, [u8; 2], f32, [u8; N], [u8; N]) {
    let sub = x.len() / N;
    let mut sc = [0f32; N];
    let mut mn = [0f32; N];
    for (j, s) in x.chunks_exact(sub).enumerate() {
        let (lo, hi) = min_max(s);
        let lo = lo.min(0.0);
        sc[j] = (hi - lo) / nmax;
        mn[j] = -lo;
    }
    let top = |v: &[f32; N]| v.iter().fold(0f32, |m, &x| m.max(x));
    let (db, d) = half(top(&sc) / levels);
    let (mb, dmin) = half(top(&mn) / levels);
    let ls = sc.map(|s| code(s, d, 0, levels as i32) as u8);
    let lm = mn.map(|m| code(m, dmin, 0, levels as i32) as u8);
    (db, d, mb, dmin, ls, lm)
}

fn q2_k(x: &[f32], out: &mut Vec<u8>) {
    let (db, d, mb, dmin, ls, lm) = scales_and_mins::<16>(x, 3.0, 15.0);
    out.extend((0..16).map(|j| ls[j] | (lm[j] << 4)));
    let mut qs = [0u8; QK_K / 4];
    for (i, &v) in x.iter().enumerate() {
        let (h, j, l) = (i / 128, (i / 32) % 4, i % 32);
        let s = i / 16;
        let q = code(v + dmin * lm[s] as f32, d * ls[s] as f32, 0, 3) as u8;
        qs[h * 32 + l] |= q << (2 * j);
    }
    out.extend(qs);
    out.extend(db);
    out.extend(mb);
}

fn q3_k(x: &[f32], out: &mut Vec<u8>) {
    let sc: Vec<f32> = x.chunks_exact(16).map(|s| amax(s) / 4.0).collect();
    let (db, d) = half(sc.iter().fold(0f32, |m, &v| m.max(v)) / 31.0);
    let ls: Vec<i32> = sc.iter().map(|&s| code(s, d, 0, 31)).collect();
    let mut hmask = [0u8; 32];
    let mut qs = [0u8; QK_K / 4];
    for (i, &v) in x.iter().enumerate() {
        let (h, j, l) = (i / 128, (i / 32) % 4, i % 32);
        let u = (code(v, d * ls[i / 16] as f32, -4, 3) + 4) as u8;
        qs[h * 32 + l] |= (u & 3) << (2 * j);
        hmask[l] |= (u >> 2) << (h * 4 + j);
    }
    let mut scales = [0u8; 12];
    for (i, &s) in ls.iter().enumerate() {
        let u = (s + 32) as u8;
        scales[i % 8] |= (u & 0x0f) << (4 * (i / 8));
        scales[8 + i % 4] |= (u >> 4) << (2 * (i / 4));
    }
    out.extend(hmask);
    out.extend(qs);
    out.extend(scales);
    out.extend(db);
}

/// Q4_K (`nmax` 15) and Q5_K (`nmax` 31).
fn q45_k(x: &[f32], nmax: i32, out: &mut Vec<u8>) {
    let (db, d, mb, dmin, ls, lm) = scales_and_mins::<8>(x, nmax as f32, 63.0);
    out.extend(db);
    out.extend(mb);
    let mut scales = [0u8; 12];
    for j in 0..4 {
        scales[j] = ls[j] | ((ls[j + 4] >> 4) << 6);
        scales[j + 4] = lm[j] | ((lm[j + 4] >> 4) << 6);
        scales[j + 8] = (ls[j + 4] & 0x0f) | ((lm[j + 4] & 0x0f) << 4);
    }
    out.extend(scales);
    let mut qh = [0u8; 32];
    let mut qs = [0u8; QK_K / 2];
    for (i, &v) in x.iter().enumerate() {
        let (j, l) = (i / 32, i % 32);
        let q = code(v + dmin * lm[j] as f32, d * ls[j] as f32, 0, nmax) as u8;
        qs[(j / 2) * 32 + l] |= (q & 0x0f) << (4 * (j % 2));
        qh[l] |= (q >> 4) << j;
    }
    if nmax > 15 {
        out.extend(qh);
    }
    out.extend(qs);
}

fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    let sc: Vec<f32> = x.chunks_exact(16).map(|s| amax(s) / 31.0).collect();
    let (db, d) = half(sc.iter().fold(0f32, |m, &v| m.max(v)) / 127.0);
    let ls: Vec<i32> = sc.iter().map(|&s| code(s, d, 0, 127)).collect();
    let mut ql = [0u8; QK_K / 2];
    let mut qh = [0u8; QK_K / 4];
    for (i, &v) in x.iter().enumerate() {
        let (h, j, l) = (i / 128, (i / 32) % 4, i % 32);
        let u = (code(v, d * ls[i / 16] as f32, -32, 31) + 32) as u8;
        ql[h * 64 + (j % 2) * 32 + l] |= (u & 0x0f) << (4 * (j / 2));
        qh[h * 32 + l] |= (u >> 4) << (2 * j);
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(ls.iter().map(|&s| s as u8));
    out.extend(db);
}

/// The index of the table value nearest `x / step` (IQ4's codes).
fn iq4_code(x: f32, step: f32) -> u8 {
    let t = if step != 0.0 { x / step } else { 0.0 };
    (0..16)
        .min_by(|&a, &b| {
            let e = |i: usize| (IQ4_VALUES[i] as f32 - t).abs();
            e(a).total_cmp(&e(b))
        })
        .expect("16 values") as u8
}

fn pack_iq4(x: &[f32], step: f32, out: &mut Vec<u8>) {
    out.extend((0..16).map(|l| iq4_code(x[l], step) | (iq4_code(x[l + 16], step) << 4)));
}

fn iq4_nl(x: &[f32], out: &mut Vec<u8>) {
    // The value of largest magnitude maps to the table's first entry, -127.
    let (db, d) = half(signed_max(x) / -127.0);
    out.extend(db);
    pack_iq4(x, d, out);
}

fn iq4_xs(x: &[f32], out: &mut Vec<u8>) {
    let sc: Vec<f32> = x.chunks_exact(32).map(|s| signed_max(s) / -127.0).collect();
    let (db, d) = half(sc.iter().fold(0f32, |m, &v| m.max(v.abs())) / 31.0);
    let ls: Vec<i32> = sc.iter().map(|&s| code(s, d, -32, 31)).collect();
    out.extend(db);
    let high = ls
        .iter()
        .enumerate()
        .fold(0u16, |h, (j, &s)| h | ((((s + 32) as u16) >> 4) << (2 * j)));
    out.extend(high.to_le_bytes());
    out.extend(
        (0..4)
            .map(|k| ((ls[2 * k] + 32) as u8 & 0x0f) | (((ls[2 * k + 1] + 32) as u8 & 0x0f) << 4)),
    );
    for (j, s) in x.chunks_exact(32).enumerate() {
        pack_iq4(s, d * ls[j] as f32, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::dequantize;
    use rand::{Rng, SeedableRng};

    #[test]
    fn encoded_blocks_decode_close_to_their_values() {
        // Relative RMS error bounds: about 1.5x the rounding error of each format's step
        // on uniform values; a packing mistake scrambles values and gives errors near 1.
        let cases = [
            (GgmlType::Q5_0, 0.05),
            (GgmlType::Q5_1, 0.04),
            (GgmlType::Q2_K, 0.45),
            (GgmlType::Q3_K, 0.2),
            (GgmlType::Q4_K, 0.1),
            (GgmlType::Q5_K, 0.05),
            (GgmlType::Q6_K, 0.03),
            (GgmlType::IQ4_NL, 0.12),
            (GgmlType::IQ4_XS, 0.12),
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for (ty, bound) in cases {
            // Sub-blocks of different ranges and offsets, so the scales differ.
            let x: Vec<f32> = (0..4 * QK_K)
                .map(|i| {
                    let g = (i / 16) % 7;
                    rng.gen_range(-1.0..1.0) * (1.0 + g as f32) + 0.1 * g as f32
                })
                .collect();
            let bytes = encode_blocks(ty, &x);
            assert_eq!(bytes.len(), ty.bytes_for(x.len()).unwrap(), "{ty:?}");
            let y = dequantize(ty, &bytes, x.len()).unwrap();
            let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum();
            let norm: f32 = x.iter().map(|a| a * a).sum();
            let rel = (err / norm).sqrt();
            assert!(rel < bound, "{ty:?}: relative RMS error {rel}");
        }
    }

    #[test]
    fn zero_blocks_stay_zero() {
        for ty in [
            GgmlType::Q2_K,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_XS,
        ] {
            let y = dequantize(ty, &encode_blocks(ty, &[0.0; QK_K]), QK_K).unwrap();
            assert!(y.iter().all(|&v| v == 0.0), "{ty:?}");
        }
    }
}
