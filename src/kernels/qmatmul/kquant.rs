//! The K-quant kernels of `QMatrix`: dot products of Q4_K, Q5_K and Q6_K rows (GGUF
//! super-blocks of 256, read as stored) with activations quantized to match.
//!
//! As llama.cpp does for these formats (its Q8_K), the activations are quantized to int8 in
//! blocks of 256 with one f32 scale, and the sums of every 16 codes are kept. A weight
//! super-block then meets its activation block in exact integer arithmetic: each sub-block's
//! integer dot product is multiplied by its integer scale inside `madd` and all 8 (Q6_K: 16)
//! are summed as integers; the f32 factor, super-block scale times activation scale, is
//! applied once per 256 values. The Q4_K/Q5_K minimums meet the activation sums (`Σ m·Σq`),
//! and Q6_K's offset of -32 is taken off the same way (`32·Σ sc·Σq`), also in integers.

use half::f16;

use super::{QFormat, QPart, TOKENS};
use crate::model::kquant::QK_K;

/// Sub-blocks of 16 values per super-block (activation sums, Q6_K scales).
const SUMS: usize = QK_K / 16;

/// Rows of activations quantized for K-quant weights: int8 in blocks of 256, one f32 scale
/// per block, and the sum of every 16 codes.
pub(super) struct KActs {
    pub(super) q: Vec<i8>,
    pub(super) d: Vec<f32>,
    pub(super) s16: Vec<i16>,
}

/// Quantizes `x` (a whole number of 256-value blocks) for the K-quant kernels.
pub(super) fn quantize_acts(x: &[f32]) -> KActs {
    let nb = x.len() / QK_K;
    let mut a = KActs {
        q: vec![0; x.len()],
        d: Vec::with_capacity(nb),
        s16: Vec::with_capacity(nb * SUMS),
    };
    for (xb, qb) in x.chunks_exact(QK_K).zip(a.q.chunks_exact_mut(QK_K)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
        a.d.push(d);
        a.s16.extend(
            qb.chunks_exact(16)
                .map(|g| g.iter().map(|&q| q as i16).sum::<i16>()),
        );
    }
    a
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The 8 scales and 8 minimums of a Q4_K / Q5_K super-block from their 12 packed bytes
/// (see `kquant::k_scale_min`), four at a time in u32 words: words 0 and 1 hold the low 6
/// bits of scales and minimums 0..4, word 2 the low nibbles of 4..8, whose top 2 bits are
/// the top bits of words 0 and 1.
#[inline(always)]
fn scales_and_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a, b, c) = (word(0), word(1), word(2));
    let sc_hi = (c & LOW4) | (((a >> 6) & LOW2) << 4);
    let mn_hi = ((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4);
    let bytes = |lo: u32, hi: u32| (lo as u64 | (hi as u64) << 32).to_le_bytes();
    (bytes(a & LOW6, sc_hi), bytes(b & LOW6, mn_hi))
}

/// Dot products of weight row `o` with activation rows `t..t + rows` (rows <= TOKENS).
pub(super) fn dot_rows(
    w: &QPart,
    o: usize,
    a: &KActs,
    t: usize,
    rows: usize,
    avx: bool,
    out: &mut [f32; TOKENS],
) {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: AVX2, FMA and F16C are present (checked at run time by the caller),
        // o < w.rows and rows t..t + rows of `a` exist (qlinear's loop); R <= TOKENS.
        unsafe {
            match (w.format, rows) {
                (QFormat::Q4K, 1) => dot_q45k_avx2::<1, false>(w, o, a, t, out),
                (QFormat::Q4K, 2) => dot_q45k_avx2::<2, false>(w, o, a, t, out),
                (QFormat::Q4K, 3) => dot_q45k_avx2::<3, false>(w, o, a, t, out),
                (QFormat::Q4K, _) => dot_q45k_avx2::<4, false>(w, o, a, t, out),
                (QFormat::Q5K, 1) => dot_q45k_avx2::<1, true>(w, o, a, t, out),
                (QFormat::Q5K, 2) => dot_q45k_avx2::<2, true>(w, o, a, t, out),
                (QFormat::Q5K, 3) => dot_q45k_avx2::<3, true>(w, o, a, t, out),
                (QFormat::Q5K, _) => dot_q45k_avx2::<4, true>(w, o, a, t, out),
                (_, 1) => dot_q6k_avx2::<1>(w, o, a, t, out),
                (_, 2) => dot_q6k_avx2::<2>(w, o, a, t, out),
                (_, 3) => dot_q6k_avx2::<3>(w, o, a, t, out),
                (_, _) => dot_q6k_avx2::<4>(w, o, a, t, out),
            }
        }
        return;
    }
    let _ = avx;
    for (r, o_r) in out.iter_mut().enumerate().take(rows) {
        *o_r = dot_row(w, o, a, t + r);
    }
}

/// The portable kernel: dot product of weight row `o` with activation row `t`.
fn dot_row(w: &QPart, o: usize, a: &KActs, t: usize) -> f32 {
    let ty = w.format.super_blocks().expect("a K-quant matrix");
    let (bb, nsb) = (ty.block_bytes(), w.cols / QK_K);
    let (mut acc, mut offset) = (0f32, 0f32);
    for sb in 0..nsb {
        let blk = &w.qs[(o * nsb + sb) * bb..(o * nsb + sb + 1) * bb];
        let ab = t * nsb + sb;
        let x = &a.q[ab * QK_K..(ab + 1) * QK_K];
        let sums = &a.s16[ab * SUMS..(ab + 1) * SUMS];
        let (isum, d) = match w.format {
            QFormat::Q4K | QFormat::Q5K => {
                let (scales, mins) = scales_and_mins(&blk[4..16]);
                let (qh, qs) = if w.format == QFormat::Q5K {
                    (Some(&blk[16..48]), &blk[48..176])
                } else {
                    (None, &blk[16..144])
                };
                let mut isum = 0i32;
                let mut msum = 0i32;
                for j in 0..8 {
                    let (c, shift) = (j / 2, 4 * (j % 2));
                    let dot: i32 = (0..32)
                        .map(|l| {
                            let mut q = (qs[c * 32 + l] >> shift) & 0x0f;
                            if let Some(qh) = qh {
                                q |= ((qh[l] >> j) & 1) << 4;
                            }
                            q as i32 * x[j * 32 + l] as i32
                        })
                        .sum();
                    isum += scales[j] as i32 * dot;
                    msum += mins[j] as i32 * (sums[2 * j] as i32 + sums[2 * j + 1] as i32);
                }
                offset += (f16_at(blk, 2) * a.d[ab]) * msum as f32;
                (isum, f16_at(blk, 0))
            }
            _ => {
                // Q6K: value j·32 + l of half h = j / 4 (see kquant::dequantize_q6_k).
                let (ql, qh, scales) = (&blk[..128], &blk[128..192], &blk[192..208]);
                let mut isum = 0i32;
                for i in 0..SUMS {
                    let (j, l0) = (i / 2, 16 * (i % 2));
                    let (h, jj) = (j / 4, j % 4);
                    let dot: i32 = (l0..l0 + 16)
                        .map(|l| {
                            let low = (ql[h * 64 + (jj % 2) * 32 + l] >> (4 * (jj / 2))) & 0x0f;
                            let high = (qh[h * 32 + l] >> (2 * jj)) & 3;
                            (low | (high << 4)) as i32 * x[j * 32 + l] as i32
                        })
                        .sum();
                    isum += scales[i] as i8 as i32 * (dot - 32 * sums[i] as i32);
                }
                (isum, f16_at(blk, 208))
            }
        };
        acc += (d * a.d[ab]) * isum as f32;
    }
    acc - offset
}

/// Byte shuffles for `_mm256_shuffle_epi8`: entry `j` copies 16-bit word `j` of each
/// 128-bit half to all its words.
#[cfg(target_arch = "x86_64")]
const WORD: [[u8; 32]; 8] = {
    let mut m = [[0u8; 32]; 8];
    let mut j = 0;
    while j < 8 {
        let mut b = 0;
        while b < 32 {
            m[j][b] = (2 * j + b % 2) as u8;
            b += 1;
        }
        j += 1;
    }
    m
};

/// Entry `j` copies word `2j` to every word of the low half and word `2j + 1` to every
/// word of the high half (a Q6_K sub-block's two scales, one per 16 values).
#[cfg(target_arch = "x86_64")]
const WORD_PAIR: [[u8; 32]; 4] = {
    let mut m = [[0u8; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut b = 0;
        while b < 32 {
            m[j][b] = (2 * (2 * j + b / 16) + b % 2) as u8;
            b += 1;
        }
        j += 1;
    }
    m
};

/// The f16 at byte `i` of `b`, through F16C.
///
/// Safety: the CPU has F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "f16c")]
unsafe fn f16_avx(b: &[u8], i: usize) -> f32 {
    use std::arch::x86_64::*;
    let bits = u16::from_le_bytes([b[i], b[i + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Sum of the eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(v: std::arch::x86_64::__m256) -> f32 {
    // SAFETY: an `__m256` is eight f32 lanes, and every bit pattern is an f32.
    let lanes: [f32; 8] = unsafe { std::mem::transmute(v) };
    lanes.iter().sum()
}

/// How far ahead of the block being read the weights are prefetched, in bytes.
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 2048;

/// Asks for the cache lines of the `bb` bytes `PREFETCH` bytes past `blk`'s start (a later
/// block of the row, or of the next rows, which follow it in memory) to be loaded.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_ahead(blk: &[u8], bb: usize) {
    use std::arch::x86_64::*;
    let p = blk.as_ptr().wrapping_add(PREFETCH) as *const i8;
    let mut off = 0;
    while off < bb + 63 {
        // SAFETY: prefetching is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off)) };
        off += 64;
    }
}

/// Where activation row `t + r` starts in `a.q`.
///
/// Safety: `a` holds row `t + r` of `nsb` blocks.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn row_start(a: &KActs, t: usize, r: usize, nsb: usize) -> *const i8 {
    // SAFETY: the row's start is inside a.q (the caller's guarantee).
    unsafe { a.q.as_ptr().add((t + r) * nsb * QK_K) }
}

/// The AVX2 kernel for Q4_K (Q5_K with `FIVE`) and `R` activation rows: each super-block's
/// codes are unpacked once and met with every row's int8 values; each row accumulates
/// exactly as a single row would.
///
/// Safety: the CPU has AVX2, FMA and F16C, `o < w.rows`, `w` is Q4_K (Q5_K with `FIVE`),
/// and `a` holds activation rows `t..t + R` of `w.cols / 256` blocks each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q45k_avx2<const R: usize, const FIVE: bool>(
    w: &QPart,
    o: usize,
    a: &KActs,
    t: usize,
    out: &mut [f32; TOKENS],
) {
    use std::arch::x86_64::*;
    let bb = if FIVE { 176 } else { 144 };
    let codes = if FIVE { 48 } else { 16 };
    let nsb = w.cols / QK_K;
    let row = &w.qs[o * nsb * bb..(o + 1) * nsb * bb];
    // SAFETY: the caller's guarantee.
    let xq: [*const i8; R] = std::array::from_fn(|r| unsafe { row_start(a, t, r, nsb) });
    let mut acc = [_mm256_setzero_ps(); R];
    let mut macc = [_mm256_setzero_ps(); R];
    let low = _mm256_set1_epi8(0x0f);
    let bit4 = _mm256_set1_epi8(0x10);
    for sb in 0..nsb {
        let blk = &row[sb * bb..(sb + 1) * bb];
        prefetch_ahead(blk, bb);
        // SAFETY: F16C is present (the caller's guarantee).
        let (d, dmin) = unsafe { (f16_avx(blk, 0), f16_avx(blk, 2)) };
        let (scales, mins) = scales_and_mins(&blk[4..16]);
        // SAFETY: `scales` and `mins` are 8 bytes each (unaligned loads).
        let (s8, m8) = unsafe {
            (
                _mm_loadl_epi64(scales.as_ptr() as *const __m128i),
                _mm_loadl_epi64(mins.as_ptr() as *const __m128i),
            )
        };
        // The 8 scales as i16 words in both halves; the minimums as words, each twice (one
        // per 16-value activation sum).
        let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(s8));
        let mw = _mm_cvtepu8_epi16(m8);
        let m16 = _mm256_set_m128i(_mm_unpackhi_epi16(mw, mw), _mm_unpacklo_epi16(mw, mw));
        // Q5_K's fifth bits: bit j of byte l is value l of sub-block j. Shifted right once
        // per sub-block, each byte's bit 0 is the current sub-block's bit.
        let mut qh = if FIVE {
            // SAFETY: bytes 16..48 of a Q5_K block (unaligned load).
            unsafe { _mm256_loadu_si256(blk.as_ptr().add(16) as *const __m256i) }
        } else {
            _mm256_setzero_si256()
        };
        let mut isum = [_mm256_setzero_si256(); R];
        for c in 0..4 {
            // SAFETY: the 32 code bytes of chunk c are within the block (unaligned).
            let packed =
                unsafe { _mm256_loadu_si256(blk.as_ptr().add(codes + c * 32) as *const __m256i) };
            let mut wq = [
                _mm256_and_si256(packed, low),
                _mm256_and_si256(_mm256_srli_epi16(packed, 4), low),
            ];
            if FIVE {
                for q in &mut wq {
                    *q = _mm256_or_si256(*q, _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit4));
                    qh = _mm256_srli_epi16(qh, 1);
                }
            }
            // SAFETY: WORD entries are 32 bytes (unaligned loads).
            let sc = unsafe {
                [
                    _mm256_shuffle_epi8(sc16, _mm256_loadu_si256(WORD[2 * c].as_ptr() as _)),
                    _mm256_shuffle_epi8(sc16, _mm256_loadu_si256(WORD[2 * c + 1].as_ptr() as _)),
                ]
            };
            for r in 0..R {
                // SAFETY: sb < nsb: values c·64..c·64 + 64 of block sb are within
                // activation row t + r (unaligned loads).
                let (x0, x1) = unsafe {
                    let p = xq[r].add(sb * QK_K + c * 64);
                    (
                        _mm256_loadu_si256(p as *const __m256i),
                        _mm256_loadu_si256(p.add(32) as *const __m256i),
                    )
                };
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(wq[0], x0), sc[0]);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(wq[1], x1), sc[1]);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(p0, p1));
            }
        }
        for r in 0..R {
            let ab = (t + r) * nsb + sb;
            let dx = a.d[ab];
            let sums = &a.s16[ab * SUMS..(ab + 1) * SUMS];
            // SAFETY: 16 i16 sums (unaligned load).
            let s = unsafe { _mm256_loadu_si256(sums.as_ptr() as *const __m256i) };
            let msum = _mm256_cvtepi32_ps(_mm256_madd_epi16(m16, s));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(d * dx), acc[r]);
            macc[r] = _mm256_fmadd_ps(msum, _mm256_set1_ps(dmin * dx), macc[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]) - hsum(macc[r]);
    }
}

/// The AVX2 kernel for Q6_K and `R` activation rows, as `dot_q45k_avx2`.
///
/// Safety: the CPU has AVX2, FMA and F16C, `o < w.rows`, `w` is Q6_K, and `a` holds
/// activation rows `t..t + R` of `w.cols / 256` blocks each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6k_avx2<const R: usize>(
    w: &QPart,
    o: usize,
    a: &KActs,
    t: usize,
    out: &mut [f32; TOKENS],
) {
    use std::arch::x86_64::*;
    let bb = 210;
    let nsb = w.cols / QK_K;
    let row = &w.qs[o * nsb * bb..(o + 1) * nsb * bb];
    // SAFETY: the caller's guarantee.
    let xq: [*const i8; R] = std::array::from_fn(|r| unsafe { row_start(a, t, r, nsb) });
    let mut acc = [_mm256_setzero_ps(); R];
    let (mask4, mask30) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
    for sb in 0..nsb {
        let blk = &row[sb * bb..(sb + 1) * bb];
        prefetch_ahead(blk, bb);
        // SAFETY: F16C is present (the caller's guarantee).
        let d = unsafe { f16_avx(blk, 208) };
        // The 16 int8 scales as i16 words: in order, and per half of the block its 8 in
        // both 128-bit halves.
        // SAFETY: bytes 192..208 of the block (unaligned loads).
        let (lo, hi) = unsafe {
            (
                _mm_cvtepi8_epi16(_mm_loadl_epi64(blk.as_ptr().add(192) as *const __m128i)),
                _mm_cvtepi8_epi16(_mm_loadl_epi64(blk.as_ptr().add(200) as *const __m128i)),
            )
        };
        let sc_all = _mm256_set_m128i(hi, lo);
        let sc_half = [
            _mm256_broadcastsi128_si256(lo),
            _mm256_broadcastsi128_si256(hi),
        ];
        let mut isum = [_mm256_setzero_si256(); R];
        for (h, &sch) in sc_half.iter().enumerate() {
            // SAFETY: bytes h·64..h·64 + 64 and 128 + h·32..+32 are within the block.
            let (ql0, ql1, qh) = unsafe {
                let p = blk.as_ptr();
                (
                    _mm256_loadu_si256(p.add(h * 64) as *const __m256i),
                    _mm256_loadu_si256(p.add(h * 64 + 32) as *const __m256i),
                    _mm256_loadu_si256(p.add(128 + h * 32) as *const __m256i),
                )
            };
            // Sub-block j of the half: nibble j / 2 of ql(j % 2), bits 2j..2j+2 of qh moved
            // to bits 4..6: codes 0..=63.
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, mask4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 4), mask30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, mask4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 2), mask30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), mask4),
                    _mm256_and_si256(qh, mask30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), mask4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), mask30),
                ),
            ];
            for (jj, &qj) in q.iter().enumerate() {
                // i16 lanes 0..8 meet values 0..16 (scale 2j), 8..16 values 16..32.
                // SAFETY: WORD_PAIR entries are 32 bytes (unaligned load).
                let sc = unsafe {
                    _mm256_shuffle_epi8(sch, _mm256_loadu_si256(WORD_PAIR[jj].as_ptr() as _))
                };
                let j = h * 4 + jj;
                for r in 0..R {
                    // SAFETY: sb < nsb: values j·32..j·32 + 32 of block sb are within
                    // activation row t + r (unaligned load).
                    let x = unsafe {
                        _mm256_loadu_si256(xq[r].add(sb * QK_K + j * 32) as *const __m256i)
                    };
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qj, x), sc);
                    isum[r] = _mm256_add_epi32(isum[r], p);
                }
            }
        }
        for r in 0..R {
            let ab = (t + r) * nsb + sb;
            let sums = &a.s16[ab * SUMS..(ab + 1) * SUMS];
            // The codes' offset of 32: Σ scale · 32 · (sum of the 16 activation codes).
            // SAFETY: 16 i16 sums (unaligned load).
            let s = unsafe { _mm256_loadu_si256(sums.as_ptr() as *const __m256i) };
            let off = _mm256_slli_epi32(_mm256_madd_epi16(sc_all, s), 5);
            let total = _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r], off));
            acc[r] = _mm256_fmadd_ps(total, _mm256_set1_ps(d * a.d[ab]), acc[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{has_avx2, qlinear, QMatrix};
    use super::*;
    use crate::model::gguf_writer::encode;
    use crate::model::kquant::k_scale_min;
    use crate::model::quant::GgmlType;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const K_TYPES: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

    /// Random super-blocks: every code, scale and minimum byte random, the f16 scales
    /// small and of either sign.
    fn random_blocks(ty: GgmlType, blocks: usize, rng: &mut StdRng) -> Vec<u8> {
        let mut bytes: Vec<u8> = (0..blocks * ty.block_bytes()).map(|_| rng.gen()).collect();
        for b in bytes.chunks_exact_mut(ty.block_bytes()) {
            let mut put = |at: usize, v: f32| {
                b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
            };
            if ty == GgmlType::Q6_K {
                put(208, rng.gen_range(-0.002..0.002));
            } else {
                put(0, rng.gen_range(-0.002..0.002));
                put(2, rng.gen_range(-0.01..0.01));
            }
        }
        bytes
    }

    fn dequantized(q: &QMatrix) -> Vec<f32> {
        let mut w = vec![0f32; q.rows * q.cols];
        for (r, row) in w.chunks_exact_mut(q.cols).enumerate() {
            q.row_into(r, row);
        }
        w
    }

    #[test]
    fn k_quant_products_match_the_dequantized_product() {
        let mut rng = StdRng::seed_from_u64(11);
        for ty in K_TYPES {
            for &(n, k, m) in &[(1, 256, 1), (3, 512, 7), (6, 1024, 37)] {
                let q = QMatrix::from_ggml(ty, &random_blocks(ty, m * k / QK_K, &mut rng), m, k)
                    .unwrap();
                let w = dequantized(&q);
                let x: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let acts = quantize_acts(&x);
                // The activation sums are the codes' sums.
                for (i, g) in acts.q.chunks_exact(16).enumerate() {
                    let sum: i16 = g.iter().map(|&q| q as i16).sum();
                    assert_eq!(acts.s16[i], sum);
                }
                let mut y = vec![f32::NAN; n * m];
                qlinear(&x, &q, None, n, &mut y);
                for t in 0..n {
                    for o in 0..m {
                        let (wr, xr) = (&w[o * k..(o + 1) * k], &x[t * k..(t + 1) * k]);
                        let ad = |i: usize| acts.d[(t * k + i) / QK_K] as f64;
                        // The same product on the int8 activations, in f64: only the f32
                        // rounding of the per-block scaling separates it from ours.
                        let on_q8: f64 = (0..k)
                            .map(|i| wr[i] as f64 * acts.q[t * k + i] as f64 * ad(i))
                            .sum();
                        let size: f64 = (0..k).map(|i| (wr[i] as f64 * xr[i] as f64).abs()).sum();
                        let got = y[t * m + o] as f64;
                        assert!(
                            (got - on_q8).abs() <= 1e-5 * size + 1e-6,
                            "{ty:?} ({n},{k},{m}) [{t},{o}]: {got} vs {on_q8} (size {size})"
                        );
                        // Against the f32 activations: the int8 rounding error, uniform in
                        // ±d/2 per value, within 6 standard deviations.
                        let exact: f64 = (0..k).map(|i| wr[i] as f64 * xr[i] as f64).sum();
                        let sd = ((0..k).map(|i| (wr[i] as f64 * ad(i)).powi(2)).sum::<f64>()
                            / 12.0)
                            .sqrt();
                        assert!(
                            (got - exact).abs() <= 6.0 * sd + 1e-6,
                            "{ty:?} ({n},{k},{m}) [{t},{o}]: {got} vs {exact} (sd {sd})"
                        );
                    }
                }
                // The portable and AVX2 kernels agree up to f32 summation order.
                for o in 0..m {
                    let mut p = [0f32; TOKENS];
                    let mut v = [0f32; TOKENS];
                    dot_rows(&q.parts[0], o, &acts, 0, 1, false, &mut p);
                    dot_rows(&q.parts[0], o, &acts, 0, 1, has_avx2(), &mut v);
                    let size: f32 = (0..k).map(|i| (w[o * k + i] * x[i]).abs()).sum();
                    assert!(
                        (p[0] - v[0]).abs() <= 1e-5 * size,
                        "{ty:?}: {} vs {}",
                        p[0],
                        v[0]
                    );
                }
            }
        }
    }

    #[test]
    fn packed_scales_unpack_as_the_dequantizer_reads_them() {
        let mut rng = StdRng::seed_from_u64(10);
        for _ in 0..200 {
            let s: [u8; 12] = rng.gen();
            let (sc, mn) = scales_and_mins(&s);
            for j in 0..8 {
                assert_eq!((sc[j], mn[j]), k_scale_min(&s, j), "{s:?} sub-block {j}");
            }
        }
    }

    #[test]
    fn k_quant_grouped_rows_equal_single_rows_exactly() {
        let mut rng = StdRng::seed_from_u64(12);
        for ty in K_TYPES {
            let (n, k, m) = (7, 512, 5);
            let q =
                QMatrix::from_ggml(ty, &random_blocks(ty, m * k / QK_K, &mut rng), m, k).unwrap();
            let x: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let mut batched = vec![0f32; n * m];
            qlinear(&x, &q, None, n, &mut batched);
            for t in 0..n {
                let mut alone = vec![0f32; m];
                qlinear(&x[t * k..(t + 1) * k], &q, None, 1, &mut alone);
                assert_eq!(&batched[t * m..(t + 1) * m], &alone[..], "{ty:?} token {t}");
            }
        }
    }

    #[test]
    fn k_quant_rows_survive_permute_and_concat() {
        let mut rng = StdRng::seed_from_u64(13);
        for ty in K_TYPES {
            let k = 512;
            let wf: Vec<f32> = (0..4 * k)
                .map(|i| (i / k) as f32 + rng.gen_range(-0.1..0.1))
                .collect();
            let bytes = encode(ty, &wf);
            let mut q = QMatrix::from_ggml(ty, &bytes, 4, k).unwrap();
            assert_eq!(q.weight_bytes(), bytes.len(), "{ty:?} keeps the GGUF bytes");
            let before = dequantized(&q);
            q.permute_rows(&[3, 1, 2, 0]);
            let tail = QMatrix::from_ggml(ty, &bytes[..bytes.len() / 4], 1, k).unwrap();
            let c = QMatrix::concat(vec![q, tail]).unwrap();
            assert_eq!((c.rows, c.cols), (5, k));
            let after = dequantized(&c);
            for (r, src) in [3, 1, 2, 0, 0].into_iter().enumerate() {
                assert_eq!(
                    after[r * k..(r + 1) * k],
                    before[src * k..(src + 1) * k],
                    "{ty:?} row {r}"
                );
            }
            // The rows are the file's values, as the dequantizer gives them.
            let whole = crate::model::quant::dequantize(ty, &bytes, 4 * k).unwrap();
            assert_eq!(before, whole, "{ty:?}");
            // Widths must agree to stack.
            let narrow = QMatrix::from_ggml(ty, &encode(ty, &wf[..k]), 2, k / 2);
            assert!(QMatrix::concat(vec![c, narrow.unwrap()]).is_none());
        }
    }

    #[test]
    fn mixed_formats_stack_as_bands() {
        // A Q4_K_M layer: q and k Q4_K, v Q6_K; and a Q8_0 matrix of the same width.
        let mut rng = StdRng::seed_from_u64(14);
        let k = 512;
        let bands = [
            (GgmlType::Q4_K, 3),
            (GgmlType::Q4_K, 2),
            (GgmlType::Q6_K, 2),
            (GgmlType::Q8_0, 1),
        ];
        let mats: Vec<QMatrix> = bands
            .iter()
            .map(|&(ty, rows)| {
                let wf: Vec<f32> = (0..rows * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
                QMatrix::from_ggml(ty, &encode(ty, &wf), rows, k).unwrap()
            })
            .collect();
        let n = 3;
        let x: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
        // Each band's product alone, and its rows.
        let mut alone = Vec::new();
        let mut rows = Vec::new();
        for q in &mats {
            let mut y = vec![0f32; n * q.rows];
            qlinear(&x, q, None, n, &mut y);
            alone.push(y);
            rows.extend(dequantized(q).chunks_exact(k).map(|r| r.to_vec()));
        }
        let bytes: usize = mats.iter().map(QMatrix::weight_bytes).sum();
        let mut c = QMatrix::concat(mats).unwrap();
        assert_eq!((c.rows, c.parts.len(), c.weight_bytes()), (8, 3, bytes));
        let check = |c: &QMatrix, order: &[usize]| {
            let mut y = vec![0f32; n * c.rows];
            qlinear(&x, c, None, n, &mut y);
            let got = dequantized(c);
            for (r, &src) in order.iter().enumerate() {
                assert_eq!(got[r * k..(r + 1) * k], rows[src][..], "row {r}");
                // Where row `src` sat in its band's own product.
                let (mut b, mut lr) = (0, src);
                while lr >= bands[b].1 {
                    lr -= bands[b].1;
                    b += 1;
                }
                for t in 0..n {
                    let want = alone[b][t * bands[b].1 + lr];
                    assert_eq!(y[t * c.rows + r], want, "token {t} row {r}");
                }
            }
        };
        check(&c, &[0, 1, 2, 3, 4, 5, 6, 7]);
        // Rows moved across bands regroup into bands of one format.
        let order = [6, 0, 5, 7, 1, 2, 3, 4];
        c.permute_rows(&order);
        assert_eq!(c.parts.len(), 5);
        check(&c, &order);
    }

    #[test]
    fn k_quant_widths_must_be_whole_super_blocks() {
        let bytes = encode(GgmlType::Q4_K, &[0.5; 512]);
        assert!(QMatrix::from_ggml(GgmlType::Q4_K, &bytes, 2, 256).is_some());
        // 512 values as 4 rows of 128: not whole super-blocks per row.
        assert!(QMatrix::from_ggml(GgmlType::Q4_K, &bytes, 4, 128).is_none());
        assert!(QMatrix::from_ggml(GgmlType::Q4_K, &bytes[1..], 2, 256).is_none());
        // Types the loader dequantizes instead.
        let q3 = encode(GgmlType::Q3_K, &[0.5; 256]);
        assert!(QMatrix::from_ggml(GgmlType::Q3_K, &q3, 1, 256).is_none());
    }
}
