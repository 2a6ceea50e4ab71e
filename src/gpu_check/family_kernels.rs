//! The kernels only some model families need (`kernels/family.cu`) against their CPU
//! twins, in both 16-bit types, odd widths included, outputs poisoned with NaN first:
//! LayerNorm (every row, and selected rows), per-head q/k RMSNorm in the fused QKV rows,
//! the residual add with a bias and an output norm, GeGLU, GELU with a bias, soft-capping.

use rand::rngs::StdRng;

use super::kernels::{half_of, poison_half, rand_vec, row, to_f32};
use super::{rel_err, Row};
use crate::error::Result;
use crate::kernels::cpu;
use crate::kernels::cuda::{family, Gpu, Half};
use crate::model::gpu::weights::interleave_halves;

const EPS: f32 = 1e-5;

/// Every family kernel's check in `dt`.
pub fn run(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    out.extend(layer_norm(gpu, dt, rng)?);
    out.extend(head_rms_norm(gpu, dt, rng)?);
    out.extend(residual_add(gpu, dt, rng)?);
    out.extend(activations(gpu, dt, rng)?);
    out.extend(softcap(gpu, dt, rng)?);
    Ok(out)
}

fn layer_norm(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (n, h) in [(1, 768), (5, 33), (3, 4096)] {
        let x: Vec<f32> = rand_vec(rng, n * h, 3.0).iter().map(|v| v + 0.5).collect();
        let w = rand_vec(rng, h, 1.0);
        let b = rand_vec(rng, h, 0.5);
        let (xb, wb, bb) = (gpu.upload(&x)?, gpu.upload(&w)?, gpu.upload(&b)?);
        let mut want = vec![0f32; n * h];
        cpu::layer_norm(&x, &w, &b, EPS, &mut want);
        // Every row in order, then the rows n-1, 0 through the rows list.
        let ob = poison_half(gpu, dt, n * h)?;
        family::layer_norm(
            gpu,
            dt,
            xb.ptr(),
            0,
            (wb.ptr(), bb.ptr()),
            ob.ptr(),
            n,
            h,
            EPS,
        )?;
        let got = to_f32(dt, &gpu.read(&ob, n * h)?);
        out.push(row(
            "layer_norm",
            dt,
            format!("n {n} h {h}"),
            rel_err(&got, &want),
            1e-2,
        ));
        let rows = [(n - 1) as i32, 0];
        let rb = gpu.upload(&rows)?;
        let ob = poison_half(gpu, dt, 2 * h)?;
        let wb2 = (wb.ptr(), bb.ptr());
        family::layer_norm(gpu, dt, xb.ptr(), rb.ptr(), wb2, ob.ptr(), 2, h, EPS)?;
        let got = to_f32(dt, &gpu.read(&ob, 2 * h)?);
        let picked: Vec<f32> = rows
            .iter()
            .flat_map(|&r| want[r as usize * h..(r as usize + 1) * h].to_vec())
            .collect();
        out.push(row(
            "layer_norm (rows)",
            dt,
            format!("2 of {n} rows, h {h}"),
            rel_err(&got, &picked),
            1e-2,
        ));
    }
    Ok(out)
}

fn head_rms_norm(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (n, heads, kvh, hd) in [(1, 16, 8, 128), (7, 4, 2, 16), (3, 8, 1, 256)] {
        let width = (heads + 2 * kvh) * hd;
        let (bits, vals) = half_of(dt, &rand_vec(rng, n * width, 4.0));
        let (qw, kw) = (rand_vec(rng, hd, 1.5), rand_vec(rng, hd, 1.5));
        let (qkv, qwb, kwb) = (gpu.upload(&bits)?, gpu.upload(&qw)?, gpu.upload(&kw)?);
        family::head_rms_norm(
            gpu,
            dt,
            qkv.ptr(),
            (qwb.ptr(), kwb.ptr()),
            n,
            (heads, kvh, hd),
            EPS,
        )?;
        let got = to_f32(dt, &gpu.read(&qkv, n * width)?);
        // The CPU twin: q and k heads normed, v untouched.
        let mut want = vals.clone();
        for r in want.chunks_exact_mut(width) {
            let (q, rest) = r.split_at_mut(heads * hd);
            cpu::rms_norm_in_place(q, &qw, EPS);
            cpu::rms_norm_in_place(&mut rest[..kvh * hd], &kw, EPS);
        }
        out.push(row(
            "head_rms_norm",
            dt,
            format!("n {n} heads {heads}/{kvh} hd {hd}"),
            rel_err(&got, &want),
            1e-2,
        ));
    }
    Ok(out)
}

fn residual_add(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (n, h) in [(1, 2304), (6, 37)] {
        let (x0, t) = (rand_vec(rng, n * h, 2.0), rand_vec(rng, n * h, 3.0));
        let (b, w) = (rand_vec(rng, h, 0.5), rand_vec(rng, h, 1.5));
        for (with_b, with_w) in [(true, false), (false, true), (true, true)] {
            let xb = gpu.upload(&x0)?;
            let (tb, bb, wb) = (gpu.upload(&t)?, gpu.upload(&b)?, gpu.upload(&w)?);
            let bp = if with_b { bb.ptr() } else { 0 };
            let wp = if with_w { wb.ptr() } else { 0 };
            family::residual_add(gpu, dt, xb.ptr(), tb.ptr(), (bp, wp), n, h, EPS)?;
            let got = gpu.read(&xb, n * h)?;
            let mut v: Vec<f32> = t
                .chunks_exact(h)
                .flat_map(|r| {
                    r.iter()
                        .zip(&b)
                        .map(|(x, bv)| x + if with_b { *bv } else { 0.0 })
                })
                .collect();
            if with_w {
                let raw = v.clone();
                cpu::rms_norm(&raw, &w, EPS, &mut v);
            }
            let want: Vec<f32> = x0.iter().zip(&v).map(|(a, b)| a + b).collect();
            out.push(row(
                "residual_add",
                dt,
                format!("n {n} h {h} bias {with_b} norm {with_w}"),
                rel_err(&got, &want),
                1e-4,
            ));
        }
    }
    Ok(out)
}

fn activations(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (n, f) in [(1, 9216), (5, 77)] {
        // GeGLU reads gate and up interleaved, as the GPU's gate|up weights produce them.
        let (gbits, gu) = half_of(dt, &rand_vec(rng, n * 2 * f, 4.0));
        let gbits: Vec<u16> = gbits
            .chunks(2 * f)
            .flat_map(|r| interleave_halves(r, 2 * f, 1))
            .collect();
        let (gb, ob) = (gpu.upload(&gbits)?, poison_half(gpu, dt, n * f)?);
        family::gelu_mul(gpu, dt, gb.ptr(), ob.ptr(), n, f)?;
        let mut want = vec![0f32; n * f];
        cpu::gelu_mul(&gu, f, &mut want);
        let got = to_f32(dt, &gpu.read(&ob, n * f)?);
        out.push(row(
            "gelu_mul",
            dt,
            format!("n {n} f {f}"),
            rel_err(&got, &want),
            1e-2,
        ));
        // GPT-2's MLP: gelu(up + b).
        let (ubits, up) = half_of(dt, &rand_vec(rng, n * f, 4.0));
        let b = rand_vec(rng, f, 1.0);
        let (ub, bb, ob) = (
            gpu.upload(&ubits)?,
            gpu.upload(&b)?,
            poison_half(gpu, dt, n * f)?,
        );
        family::gelu_bias(gpu, dt, ub.ptr(), bb.ptr(), ob.ptr(), n, f)?;
        let biased: Vec<f32> = up
            .chunks_exact(f)
            .flat_map(|r| r.iter().zip(&b).map(|(x, bv)| x + bv))
            .collect();
        let mut want = vec![0f32; n * f];
        cpu::gelu(&biased, &mut want);
        let got = to_f32(dt, &gpu.read(&ob, n * f)?);
        out.push(row(
            "gelu_bias",
            dt,
            format!("n {n} f {f}"),
            rel_err(&got, &want),
            1e-2,
        ));
    }
    Ok(out)
}

fn softcap(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (n, w, cap) in [(1, 256_000, 30.0f32), (3, 1001, 50.0)] {
        let x = rand_vec(rng, n * w, 120.0);
        let xb = gpu.upload(&x)?;
        family::softcap(gpu, dt, xb.ptr(), n, w, cap)?;
        let got = gpu.read(&xb, n * w)?;
        let mut want = x.clone();
        cpu::softcap(&mut want, cap);
        out.push(row(
            "softcap",
            dt,
            format!("n {n} width {w} cap {cap}"),
            rel_err(&got, &want),
            1e-5,
        ));
    }
    Ok(out)
}
