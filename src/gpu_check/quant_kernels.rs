//! The kernels of GGUF weights kept quantized on the device (kernels/qgemv.cu) against the
//! CPU engine's dequantization of the same blocks (qgemv's rows quantized to int8 blocks as
//! the kernel does it): qgemv at up to 8 rows a launch and in several launches, the panel
//! path (qdequant, then cuBLAS) past qgemm's row limit, every output type, gate_up's
//! interleaved placement, rows of one and of several 1,024-value stripes, and the quantized
//! embedding gather; and, reported, qgemv's rate on Llama-3.1-8B's matrices at one row, in
//! bytes read a second, and both paths' times by rows.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;

use super::kernels::{half_of, poison_f32, rand_vec, row};
use super::Row;
use crate::error::Result;
use crate::kernels::cuda::gemm::{time_ms, Blas, Out};
use crate::kernels::cuda::launch::EmbedExtras;
use crate::kernels::cuda::qgemm::{self, QPath, QScratch, QGEMV_MAX};
use crate::kernels::cuda::{Gpu, Half};
use crate::kernels::qmatmul::QMatrix;
use crate::model::gguf_writer::encode;
use crate::model::gpu::qweights;
use crate::model::gpu::upload::Rows;
use crate::model::quant::GgmlType;

/// Every row of `q` as the device places them (`order`), dequantized by the CPU engine.
fn placed_rows(q: &QMatrix, order: Rows) -> Vec<f32> {
    let (rows, cols) = (q.rows, q.cols);
    let mut out = vec![0f32; rows * cols];
    for (c, dst) in out.chunks_exact_mut(cols).enumerate() {
        let src = match order {
            Rows::AsIs => c,
            Rows::HalvesInterleaved => c / 2 + (c % 2) * (rows / 2),
        };
        q.row_into(src, dst);
    }
    out
}

/// `x`'s rows (of a multiple of 32) as qgemv quantizes them, dequantized: int8 codes in
/// blocks of 32, d = amax / 127, q = round(x / d), times d.
fn int8_rows(x: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for b in x.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(b.iter().map(|&v| (v * id).round() * d));
    }
    out
}

/// `y[t, c] = sum_i x[t, i] · w[c, i]` in f64.
fn product(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut y = vec![0f32; n * m];
    for t in 0..n {
        for c in 0..m {
            let dot: f64 = (0..k)
                .map(|i| x[t * k + i] as f64 * w[c * k + i] as f64)
                .sum();
            y[t * m + c] = dot as f32;
        }
    }
    y
}

/// A `rows` x `cols` matrix of type `ty` on the device, one random block of 256 values
/// repeated: encoding 500M values on the host would take longer than the timing.
fn repeated_block(
    gpu: &Arc<Gpu>,
    rng: &mut StdRng,
    ty: GgmlType,
    (rows, cols): (usize, usize),
    order: Rows,
) -> Result<qgemm::QWeight> {
    let one = encode(ty, &rand_vec(rng, 256, 0.05));
    let q = QMatrix::from_ggml(ty, &one.repeat(rows * cols / 256), rows, cols)
        .ok_or_else(|| crate::Error::Model(format!("{ty:?} is not kept quantized")))?;
    Ok(qweights::upload(gpu, &q, order)?.expect("planes"))
}

/// qgemv at one row on Llama-3.1-8B's shapes (random blocks), f16: the weights' bytes over
/// the time, reported beside the device's (not required).
pub fn rates(gpu: &Arc<Gpu>, rng: &mut StdRng) -> Result<Vec<Row>> {
    let blas = Blas::new(gpu)?;
    let dt = Half::F16;
    let mut out = Vec::new();
    for (ty, rows, cols, name) in [
        (GgmlType::Q4_K, 6144, 4096, "qkv"),
        (GgmlType::Q4_K, 28672, 4096, "gate_up"),
        (GgmlType::Q4_K, 4096, 14336, "down"),
        (GgmlType::Q6_K, 4096, 14336, "down"),
        (GgmlType::Q6_K, 128256, 4096, "lm_head"),
        (GgmlType::Q8_0, 28672, 4096, "gate_up"),
        (GgmlType::Q8_0, 4096, 14336, "down"),
        (GgmlType::Q8_0, 128256, 4096, "lm_head"),
    ] {
        let w = repeated_block(gpu, rng, ty, (rows, cols), Rows::AsIs)?;
        let x = gpu.upload(&half_of(dt, &rand_vec(rng, cols, 1.0)).0)?;
        let y = gpu.alloc::<f32>(rows)?;
        let scratch = QScratch::new(gpu, 1)?;
        let ms = time_ms(gpu, &mut || {
            qgemm::qlinear(&blas, dt, x.ptr(), &w, y.ptr(), Out::F32, 1, &scratch)
        })?;
        let gb_s = w.bytes() as f64 / 1e6 / ms;
        out.push(Row {
            check: format!("qgemv rate, 1 row [{}]", dt.suffix()),
            shape: format!("{ty:?} {name} {rows}x{cols}"),
            err: gb_s,
            tol: 0.0,
            written: true,
            note: format!(
                "GB/s ({:.1} µs, {:.1} MB)",
                ms * 1e3,
                w.bytes() as f64 / 1e6
            ),
            info: true,
        });
    }
    // Both paths by rows on gate_up's shape: where qgemv stops (QGEMV_MAX).
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0] {
        let (rows, cols) = (28672, 4096);
        let w = repeated_block(gpu, rng, ty, (rows, cols), Rows::HalvesInterleaved)?;
        let x = gpu.upload(&half_of(dt, &rand_vec(rng, 64 * cols, 1.0)).0)?;
        let y = gpu.alloc::<f32>(64 * rows)?;
        let scratch = QScratch::new(gpu, (qgemm::PANEL_BYTES / 2 / cols) * cols)?;
        for n in [1, 2, 4, 8, 16, 32, 64] {
            let mut ms = [0f64; 2];
            for (i, path) in [QPath::Gemv, QPath::Panel].into_iter().enumerate() {
                ms[i] = time_ms(gpu, &mut || {
                    let args = (x.ptr(), &w, y.ptr());
                    qgemm::qlinear_by(&blas, dt, args, Out::F32, n, &scratch, path)
                })?;
            }
            out.push(Row {
                check: format!("qgemv / panel time by rows [{}]", dt.suffix()),
                shape: format!("{ty:?} gate_up {rows}x{cols} n {n}"),
                err: ms[0] / ms[1],
                tol: 0.0,
                written: true,
                note: format!("qgemv {:.1} µs, panel {:.1} µs", ms[0] * 1e3, ms[1] * 1e3),
                info: true,
            });
        }
    }
    Ok(out)
}

pub fn run(gpu: &Arc<Gpu>, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let blas = Blas::new(gpu)?;
    let mut out = Vec::new();
    // One stripe of int8 rows, and several with a partial last (qgemv.cu's XS).
    for ((rows, cols), ty) in [(300, 512), (72, 2816)]
        .into_iter()
        .flat_map(|shape| qweights::KEPT_TYPES.into_iter().map(move |ty| (shape, ty)))
    {
        let values = rand_vec(rng, rows * cols, 0.05);
        let q = QMatrix::from_ggml(ty, &encode(ty, &values), rows, cols)
            .ok_or_else(|| crate::Error::Model(format!("{ty:?} is not kept quantized")))?;
        for order in [Rows::AsIs, Rows::HalvesInterleaved] {
            let w = qweights::upload(gpu, &q, order)?.expect("planes");
            let exact = placed_rows(&q, order);
            let rounded = half_of(dt, &exact).1;
            // A panel of 128 rows: 300 rows take three.
            let scratch = QScratch::new(gpu, 128 * cols)?;
            for n in [1, 3, 8, QGEMV_MAX, QGEMV_MAX + 9] {
                let (xb, xv) = half_of(dt, &rand_vec(rng, n * cols, 1.0));
                let x = gpu.upload(&xb)?;
                // qgemv multiplies the exact values by int8 rows; the panel holds the
                // values rounded to dt, times the 16-bit rows.
                let want = if n > QGEMV_MAX {
                    product(&xv, &rounded, n, cols, rows)
                } else {
                    product(&int8_rows(&xv), &exact, n, cols, rows)
                };
                let base = rand_vec(rng, n * rows, 1.0);
                let added: Vec<f32> = base.iter().zip(&want).map(|(b, w)| b + w).collect();
                let path = if n > QGEMV_MAX { "panel" } else { "qgemv" };
                let shape = format!("{ty:?} {order:?} n {n} in {cols} out {rows}");
                for y_ty in [Out::F32, Out::F32Add, Out::Half] {
                    let got = match y_ty {
                        Out::Half => {
                            let y = gpu.upload(&vec![dt.nan(); n * rows])?;
                            qgemm::qlinear(&blas, dt, x.ptr(), &w, y.ptr(), y_ty, n, &scratch)?;
                            gpu.read(&y, n * rows)?
                                .iter()
                                .map(|&b| dt.value(b))
                                .collect()
                        }
                        _ => {
                            let y = match y_ty {
                                Out::F32Add => gpu.upload(&base)?,
                                _ => poison_f32(gpu, n * rows)?,
                            };
                            qgemm::qlinear(&blas, dt, x.ptr(), &w, y.ptr(), y_ty, n, &scratch)?;
                            gpu.read(&y, n * rows)?
                        }
                    };
                    let (want, tol) = match y_ty {
                        Out::F32 => (&want, 1e-5),
                        Out::F32Add => (&added, 1e-5),
                        Out::Half => (&want, if dt == Half::Bf16 { 8e-3 } else { 1e-3 }),
                    };
                    let check = format!("quantized linear ({path}, {y_ty:?})");
                    out.push(row(
                        &check,
                        dt,
                        shape.clone(),
                        super::rel_err(&got, want),
                        tol,
                    ));
                }
            }
        }
        // The embedding gather: ids and pending tokens (the last step's choices).
        let table = qweights::upload(gpu, &q, Rows::AsIs)?.expect("planes");
        let exact = placed_rows(&q, Rows::AsIs);
        let fed: Vec<i32> = (0..5).map(|_| rng.gen_range(0..rows as i32)).collect();
        let ids: Vec<i32> = (0..9)
            .map(|r| match r % 3 {
                2 => -rng.gen_range(1..=fed.len() as i32),
                _ => rng.gen_range(0..rows as i32),
            })
            .collect();
        let (idb, fedb) = (gpu.upload(&ids)?, gpu.upload(&fed)?);
        let x = poison_f32(gpu, ids.len() * cols)?;
        let (i, f, xp) = (idb.ptr(), fedb.ptr(), x.ptr());
        qgemm::qembed(gpu, dt, &table, i, f, xp, ids.len(), EmbedExtras::NONE)?;
        let got = gpu.read(&x, ids.len() * cols)?;
        let token = |i: i32| if i >= 0 { i } else { fed[(-i - 1) as usize] } as usize;
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| {
                exact[token(i) * cols..(token(i) + 1) * cols]
                    .iter()
                    .copied()
            })
            .collect();
        let shape = format!("{ty:?} vocab {rows} h {cols} n {}, pending rows", ids.len());
        // The host's values exactly (a pass needs the error under the bar, so not 0).
        out.push(row(
            "quantized embed",
            dt,
            shape,
            super::rel_err(&got, &want),
            1e-7,
        ));
    }
    Ok(out)
}
