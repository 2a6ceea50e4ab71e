//! GGUF matrices kept quantized on the GPU: the CPU engine's quantized bands rewritten as
//! the device planes kernels/qgemv.cu reads (on the host, where tests check them against
//! the CPU's own dequantization), then copied to the device.

use half::f16;

use super::upload::Rows;
use crate::error::Result;
use crate::kernels::cuda::qgemm::{QBand, QKind, QWeight};
use crate::kernels::cuda::Gpu;
use crate::kernels::qmatmul::{QFormat, QMatrix};
use crate::model::kquant::QK_K;
use crate::model::quant::{GgmlType, QK};

/// The GGUF types whose matrices stay quantized on the device (those the CPU engine keeps).
pub(crate) const KEPT_TYPES: [GgmlType; 8] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Bytes of a Q6_K super-block, and of its part the device keeps together (its f16 `d`
/// goes to a plane of its own).
const Q6K_BYTES: usize = 210;
const Q6K_KEPT: usize = 208;

/// One band's planes on the host (qgemv.cu's layouts): band row `r` is output column
/// `c0 + cs·r`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostBand {
    pub kind: QKind,
    pub rows: usize,
    pub cols: usize,
    pub c0: usize,
    pub cs: usize,
    pub qs: Vec<u8>,
    /// f16 bits; empty where the format keeps its scales in `qs`.
    pub d: Vec<u16>,
    /// f16 bits; empty where there is no minimum (or it is -8·d, Q4_0).
    pub m: Vec<u16>,
}

fn f16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| f16::from_f32(x).to_bits()).collect()
}

/// Rows `lo..hi` of a band as device planes; None where a minimum has no exact f16 (a band
/// of Q4_0 and Q4_1 rows stacked, whose Q4_0 minima -8·d may pass f16's range).
fn planes(b: &crate::kernels::qmatmul::QBand<'_>, lo: usize, hi: usize) -> Option<HostBand> {
    let cols = b.cols;
    let per_row = cols / QK;
    let scales = |v: &[f32]| f16_bits(&v[lo * per_row..hi * per_row]);
    let band = |kind, qs: Vec<u8>, d, m| HostBand {
        kind,
        rows: hi - lo,
        cols,
        c0: 0,
        cs: 1,
        qs,
        d,
        m,
    };
    Some(match b.format {
        QFormat::Q8 => band(
            QKind::Q8,
            b.qs[lo * cols..hi * cols].to_vec(),
            scales(b.d),
            vec![],
        ),
        QFormat::Q8M => band(
            QKind::Q8,
            b.qs[lo * cols..hi * cols].to_vec(),
            scales(b.d),
            scales(b.m),
        ),
        QFormat::Q4 => {
            let (d, m) = (
                &b.d[lo * per_row..hi * per_row],
                &b.m[lo * per_row..hi * per_row],
            );
            // Q4_0's minimum is -8·d, which the kernel derives.
            let q4_0 = d.iter().zip(m).all(|(&d, &m)| m == -8.0 * d);
            let exact = |v: &[f32]| v.iter().all(|&x| f16::from_f32(x).to_f32() == x);
            if !q4_0 && !exact(m) {
                return None;
            }
            let qs = b.qs[lo * cols / 2..hi * cols / 2].to_vec();
            band(
                QKind::Q4,
                qs,
                f16_bits(d),
                if q4_0 { vec![] } else { f16_bits(m) },
            )
        }
        QFormat::Q4K | QFormat::Q5K => {
            let (kind, ty) = if b.format == QFormat::Q4K {
                (QKind::Q4K, GgmlType::Q4_K)
            } else {
                (QKind::Q5K, GgmlType::Q5_K)
            };
            let rb = cols / QK_K * ty.block_bytes();
            band(kind, b.qs[lo * rb..hi * rb].to_vec(), vec![], vec![])
        }
        QFormat::Q6K => {
            let rb = cols / QK_K * Q6K_BYTES;
            let src = &b.qs[lo * rb..hi * rb];
            let blocks = src.len() / Q6K_BYTES;
            let mut qs = Vec::with_capacity(blocks * Q6K_KEPT);
            let mut d = Vec::with_capacity(blocks);
            for sb in src.chunks_exact(Q6K_BYTES) {
                qs.extend_from_slice(&sb[..Q6K_KEPT]);
                d.push(u16::from_le_bytes([sb[Q6K_KEPT], sb[Q6K_KEPT + 1]]));
            }
            band(QKind::Q6K, qs, d, vec![])
        }
    })
}

/// A bound on the magnitude of `q`'s values, from its scales alone: what the 16-bit panel
/// of a prefill must hold.
pub(crate) fn max_abs_bound(q: &QMatrix) -> f32 {
    let max = |v: &[f32]| v.iter().fold(0f32, |a, &x| a.max(x.abs()));
    let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32().abs();
    q.bands()
        .map(|b| match b.format {
            QFormat::Q8 => 128.0 * max(b.d),
            QFormat::Q8M => 31.0 * max(b.d) + max(b.m),
            QFormat::Q4 => 15.0 * max(b.d) + max(b.m),
            QFormat::Q4K | QFormat::Q5K => {
                let (bytes, top) = if b.format == QFormat::Q4K {
                    (GgmlType::Q4_K.block_bytes(), 15.0)
                } else {
                    (GgmlType::Q5_K.block_bytes(), 31.0)
                };
                b.qs.chunks_exact(bytes).fold(0f32, |a, sb| {
                    a.max(63.0 * top * f16_at(sb, 0) + 63.0 * f16_at(sb, 2))
                })
            }
            QFormat::Q6K => {
                b.qs.chunks_exact(Q6K_BYTES)
                    .fold(0f32, |a, sb| a.max(128.0 * 32.0 * f16_at(sb, Q6K_KEPT)))
            }
        })
        .fold(0f32, f32::max)
}

/// The bands of `q` as device planes, their rows placed as `order` says (gate_up's halves
/// interleaved: row i of the first half at column 2i, of the second at 2i + 1); None where
/// the planes cannot hold them exactly ([`planes`]).
pub(crate) fn host_bands(q: &QMatrix, order: Rows) -> Option<Vec<HostBand>> {
    let half = q.rows / 2;
    let mut out = Vec::new();
    let mut first = 0;
    for b in q.bands() {
        let (start, end) = (first, first + b.rows);
        first = end;
        // Interleaved rows: a band across the two halves is cut where they meet.
        let cuts: Vec<(usize, usize)> = match order {
            Rows::AsIs => vec![(start, end)],
            Rows::HalvesInterleaved if start < half && end > half => {
                vec![(start, half), (half, end)]
            }
            Rows::HalvesInterleaved => vec![(start, end)],
        };
        for (a, z) in cuts {
            let mut p = planes(&b, a - start, z - start)?;
            (p.c0, p.cs) = match order {
                Rows::AsIs => (a, 1),
                Rows::HalvesInterleaved if a < half => (2 * a, 2),
                Rows::HalvesInterleaved => (2 * (a - half) + 1, 2),
            };
            out.push(p);
        }
    }
    Some(out)
}

/// Band row `r` dequantized from its planes as qgemv.cu does (same arithmetic and order):
/// the kernels' host twin.
#[cfg(test)]
fn dequant_row(b: &HostBand, r: usize) -> Vec<f32> {
    let cols = b.cols;
    let mut out = vec![0f32; cols];
    let h = |bits: u16| f16::from_bits(bits).to_f32();
    match b.kind {
        QKind::Q8 => {
            for (i, o) in out.iter_mut().enumerate() {
                let (code, bi) = (b.qs[r * cols + i], r * (cols / QK) + i / QK);
                *o = if b.m.is_empty() {
                    code as i8 as f32 * h(b.d[bi])
                } else {
                    code as f32 * h(b.d[bi]) + h(b.m[bi])
                };
            }
        }
        QKind::Q4 => {
            for (i, o) in out.iter_mut().enumerate() {
                let bi = r * (cols / QK) + i / QK;
                let byte = b.qs[r * cols / 2 + (i / QK) * 16 + i % 16];
                let code = if i % QK < 16 { byte & 0x0f } else { byte >> 4 };
                let d = h(b.d[bi]);
                let m = if b.m.is_empty() { -8.0 * d } else { h(b.m[bi]) };
                *o = code as f32 * d + m;
            }
        }
        QKind::Q4K | QKind::Q5K => {
            type Dequant = fn(&[u8], &mut [f32]);
            let (ty, f): (GgmlType, Dequant) = if b.kind == QKind::Q4K {
                (GgmlType::Q4_K, crate::model::kquant::dequantize_q4_k)
            } else {
                (GgmlType::Q5_K, crate::model::kquant::dequantize_q5_k)
            };
            let rb = cols / QK_K * ty.block_bytes();
            let row = &b.qs[r * rb..(r + 1) * rb];
            for (sb, o) in row
                .chunks_exact(ty.block_bytes())
                .zip(out.chunks_exact_mut(QK_K))
            {
                f(sb, o);
            }
        }
        QKind::Q6K => {
            let per_row = cols / QK_K;
            for (s, o) in out.chunks_exact_mut(QK_K).enumerate() {
                let at = r * per_row + s;
                let mut sb = b.qs[at * Q6K_KEPT..(at + 1) * Q6K_KEPT].to_vec();
                sb.extend_from_slice(&b.d[at].to_le_bytes());
                crate::model::kquant::dequantize_q6_k(&sb, o);
            }
        }
    }
    out
}

/// Copies `q`'s bands to the device (rows placed as `order` says); None where the planes
/// cannot hold them ([`host_bands`]).
pub(crate) fn upload(gpu: &Gpu, q: &QMatrix, order: Rows) -> Result<Option<QWeight>> {
    let opt = |v: &[u16]| -> Result<_> {
        if v.is_empty() {
            Ok(None)
        } else {
            Ok(Some(gpu.upload(v)?))
        }
    };
    let Some(host) = host_bands(q, order) else {
        return Ok(None);
    };
    let bands = host
        .into_iter()
        .map(|b| {
            Ok(QBand {
                kind: b.kind,
                rows: b.rows,
                c0: b.c0,
                cs: b.cs,
                qs: gpu.upload(&b.qs)?,
                d: opt(&b.d)?,
                m: opt(&b.m)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(QWeight {
        rows: q.rows,
        cols: q.cols,
        bands,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf_writer::encode;

    fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> QMatrix {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2654435761).wrapping_add(seed * 97) >> 8;
                (x % 2001) as f32 / 1000.0 - 1.0
            })
            .collect();
        QMatrix::from_ggml(ty, &encode(ty, &values), rows, cols).unwrap()
    }

    /// Every output column's values from the planes, bit for bit the CPU engine's.
    fn check(q: &QMatrix, order: Rows) {
        let bands = host_bands(q, order).unwrap();
        let mut seen = vec![false; q.rows];
        let mut want = vec![0f32; q.cols];
        for b in &bands {
            for r in 0..b.rows {
                let col = b.c0 + b.cs * r;
                // The matrix row that lands at this column.
                let src = match order {
                    Rows::AsIs => col,
                    Rows::HalvesInterleaved => col / 2 + (col % 2) * (q.rows / 2),
                };
                q.row_into(src, &mut want);
                let got = dequant_row(b, r);
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{:?} band row {r} (column {col})",
                    b.kind
                );
                assert!(!seen[col], "column {col} twice");
                seen[col] = true;
            }
        }
        assert!(seen.iter().all(|&s| s), "a column without a row");
    }

    #[test]
    fn planes_hold_the_cpu_engines_values_for_every_kept_format() {
        for ty in KEPT_TYPES {
            let q = matrix(ty, 6, 512, 1);
            check(&q, Rows::AsIs);
            check(&q, Rows::HalvesInterleaved);
        }
    }

    #[test]
    fn q4_0_carries_no_minimum_plane_and_q4_1_does() {
        let b0 = host_bands(&matrix(GgmlType::Q4_0, 2, 64, 2), Rows::AsIs).unwrap();
        assert!(b0[0].m.is_empty());
        assert_eq!(b0[0].d.len(), 4);
        let b1 = host_bands(&matrix(GgmlType::Q4_1, 2, 64, 2), Rows::AsIs).unwrap();
        assert_eq!(b1[0].m.len(), 4);
        // The file's bytes: 18 (Q4_0) and 20 (Q4_1) per 32 values.
        let bytes = |b: &HostBand| b.qs.len() + 2 * (b.d.len() + b.m.len());
        assert_eq!(bytes(&b0[0]), 4 * 18);
        assert_eq!(bytes(&b1[0]), 4 * 20);
        let q6 = host_bands(&matrix(GgmlType::Q6_K, 2, 256, 3), Rows::AsIs).unwrap();
        assert_eq!(bytes(&q6[0]), 2 * Q6K_BYTES);
    }

    #[test]
    fn bands_of_two_formats_across_the_halves_interleave() {
        // gate|up of 8 rows: a Q4_K band of 6 rows (all of gate, half of up), then Q6_K.
        let top = matrix(GgmlType::Q4_K, 6, 256, 4);
        let bottom = matrix(GgmlType::Q6_K, 2, 256, 5);
        let q = QMatrix::concat(vec![top, bottom]).unwrap();
        let bands = host_bands(&q, Rows::HalvesInterleaved).unwrap();
        let shape: Vec<(QKind, usize, usize, usize)> =
            bands.iter().map(|b| (b.kind, b.rows, b.c0, b.cs)).collect();
        assert_eq!(
            shape,
            vec![
                (QKind::Q4K, 4, 0, 2),
                (QKind::Q4K, 2, 1, 2),
                (QKind::Q6K, 2, 5, 2)
            ]
        );
        check(&q, Rows::HalvesInterleaved);
        check(&q, Rows::AsIs);
    }

    #[test]
    fn the_bound_holds_every_value() {
        let types = [
            GgmlType::Q8_0,
            GgmlType::Q4_1,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ];
        for ty in types {
            let q = matrix(ty, 4, 512, 6);
            let mut row = vec![0f32; 512];
            let top = (0..4).fold(0f32, |a, r| {
                q.row_into(r, &mut row);
                row.iter().fold(a, |a, v| a.max(v.abs()))
            });
            let bound = max_abs_bound(&q);
            assert!(
                top <= bound && bound < 1000.0 * top,
                "{ty:?}: {top} against {bound}"
            );
        }
    }
}
