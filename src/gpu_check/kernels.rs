//! Each CUDA kernel against its CPU twin (crate::kernels::cpu, the CPU matmul) on fresh
//! random inputs, in both 16-bit types, several shapes including odd sizes and
//! block-boundary lengths, with the output buffers poisoned with NaN first so a skipped
//! element shows.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaStream;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::attention::attention;
use super::{rel_err, Row};
use crate::error::Result;
use crate::kernels::cpu;
use crate::kernels::cuda::gemm::{Blas, Input, Norm, Out, Path, Shape};
use crate::kernels::cuda::gemv::runnable_plans;
use crate::kernels::cuda::launch::{self, Heads};
use crate::kernels::cuda::lt;
use crate::kernels::cuda::swap::{self, SwapCaches};
use crate::kernels::cuda::{cuda_err, DevBuf, Gpu, Half};
use crate::kernels::matmul::{linear, Matrix};
use crate::model::gpu::weights::interleave_halves;

pub(super) fn rand_vec(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
        .collect()
}

/// Rounds to `dt`: (bits, the values they hold).
pub(super) fn half_of(dt: Half, v: &[f32]) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = v.iter().map(|&x| dt.bits(x)).collect();
    let vals = bits.iter().map(|&b| dt.value(b)).collect();
    (bits, vals)
}

pub(super) fn to_f32(dt: Half, bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| dt.value(b)).collect()
}

pub(super) fn poison_f32(gpu: &Gpu, n: usize) -> Result<DevBuf<f32>> {
    gpu.upload(&vec![f32::NAN; n])
}

pub(super) fn poison_half(gpu: &Gpu, dt: Half, n: usize) -> Result<DevBuf<u16>> {
    gpu.upload(&vec![dt.nan(); n])
}

pub(super) fn row(check: &str, dt: Half, shape: String, e: (f64, bool), tol: f64) -> Row {
    Row {
        check: format!("{check} [{}]", dt.suffix()),
        shape,
        err: e.0,
        tol,
        written: e.1,
        note: String::new(),
        info: false,
    }
}

/// Runs every kernel check in both 16-bit types.
pub fn run_all(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Row>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rows = Vec::new();
    for dt in Half::ALL {
        rows.extend(embed(gpu, dt, &mut rng)?);
        rows.extend(norms(gpu, dt, &mut rng)?);
        rows.extend(swiglu(gpu, dt, &mut rng)?);
        rows.extend(rope(gpu, dt, &mut rng)?);
        rows.extend(attention(gpu, dt, &mut rng)?);
        rows.extend(gemm(gpu, dt, &mut rng)?);
        rows.extend(gate_up_swiglu(gpu, dt, &mut rng)?);
        rows.extend(normed_linear(gpu, dt, &mut rng)?);
        rows.extend(super::family_kernels::run(gpu, dt, &mut rng)?);
        rows.extend(super::quant_kernels::run(gpu, dt, &mut rng)?);
    }
    // A bit copy: one build's check is the other's.
    rows.extend(gather(gpu, Half::F16, &mut rng)?);
    rows.extend(kv_block_copies(gpu, &mut rng)?);
    rows.push(kv_copy_rate(gpu)?);
    rows.extend(super::sample::sample_rows(gpu, &mut rng)?);
    rows.extend(super::quant_kernels::rates(gpu, &mut rng)?);
    Ok(rows)
}

fn embed(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (vocab, h, n) in [(1000, 576, 1), (49152, 77, 13), (301, 2048, 33)] {
        let (tbits, tvals) = half_of(dt, &rand_vec(rng, vocab * h, 1.0));
        // The last step's choices (-1: no token allowed, embedded as token 0); every
        // other row takes one of them (a pending token, id -(row + 1)).
        let fed: Vec<i32> = (0..7)
            .map(|r| {
                if r == 3 {
                    -1
                } else {
                    rng.gen_range(0..vocab as i32)
                }
            })
            .collect();
        let ids: Vec<i32> = (0..n)
            .map(|r| match r % 2 {
                0 => rng.gen_range(0..vocab as i32),
                _ => -rng.gen_range(1..=fed.len() as i32),
            })
            .collect();
        let (table, idb, fedb) = (gpu.upload(&tbits)?, gpu.upload(&ids)?, gpu.upload(&fed)?);
        let x = poison_f32(gpu, n * h)?;
        let plain = launch::EmbedExtras::NONE;
        launch::embed(
            gpu,
            dt,
            table.ptr(),
            idb.ptr(),
            fedb.ptr(),
            x.ptr(),
            n,
            h,
            plain,
        )?;
        let got = gpu.read(&x, n * h)?;
        let token = |i: i32| if i >= 0 { i } else { fed[(-i - 1) as usize].max(0) } as usize;
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| tvals[token(i) * h..(token(i) + 1) * h].iter().copied())
            .collect();
        let shape = format!("vocab {vocab} h {h} n {n}, odd rows pending");
        out.push(row("embed", dt, shape, rel_err(&got, &want), 1e-6));
    }
    Ok(out)
}

fn norms(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    let eps = 1e-5;
    for (n, h) in [
        (1, 576),
        (5, 1000),
        (64, 2048),
        (3, 4097),
        (2, 8192),
        (1, 8196),
    ] {
        let x = rand_vec(rng, n * h, 2.0);
        let w = rand_vec(rng, h, 1.5);
        let (xb, wb) = (gpu.upload(&x)?, gpu.upload(&w)?);
        let ob = poison_half(gpu, dt, n * h)?;
        launch::rms_norm(gpu, dt, xb.ptr(), wb.ptr(), ob.ptr(), n, h, eps, false)?;
        let mut want = vec![0f32; n * h];
        cpu::rms_norm(&x, &w, eps, &mut want);
        let shape = format!("n {n} h {h}");
        let got = to_f32(dt, &gpu.read(&ob, n * h)?);
        out.push(row(
            "rms_norm",
            dt,
            shape.clone(),
            rel_err(&got, &want),
            1e-2,
        ));

        // The rows that get logits: a few, out of order.
        let sel: Vec<i32> = [n - 1, 0, n / 2].iter().map(|&r| r as i32).collect();
        let (selb, rb) = (gpu.upload(&sel)?, poison_half(gpu, dt, sel.len() * h)?);
        let m = sel.len();
        launch::rms_norm_rows(gpu, dt, xb.ptr(), selb.ptr(), wb.ptr(), rb.ptr(), m, h, eps)?;
        let want_rows: Vec<f32> = sel
            .iter()
            .flat_map(|&r| want[r as usize * h..(r as usize + 1) * h].iter().copied())
            .collect();
        let got = to_f32(dt, &gpu.read(&rb, m * h)?);
        let shape = format!("rows {sel:?} of {n}, h {h}");
        out.push(row(
            "rms_norm_rows",
            dt,
            shape,
            rel_err(&got, &want_rows),
            1e-2,
        ));
    }
    Ok(out)
}

/// `gather_rows`: a few rows, out of order, of 32-bit words (the last layer's residual and
/// 16-bit attention rows), exact; rows of a multiple of 4 words and of another width.
fn gather(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    let n = 37;
    let sel: Vec<i32> = vec![36, 0, 17, 5, 36];
    let selb = gpu.upload(&sel)?;
    for words in [576, 288, 2048, 7] {
        let src = rand_vec(rng, n * words, 1.0);
        let srcb = gpu.upload(&src)?;
        let ob = poison_f32(gpu, sel.len() * words)?;
        launch::gather_rows(gpu, dt, srcb.ptr(), selb.ptr(), ob.ptr(), sel.len(), words)?;
        let want: Vec<f32> = sel
            .iter()
            .flat_map(|&r| {
                src[r as usize * words..(r as usize + 1) * words]
                    .iter()
                    .copied()
            })
            .collect();
        let got = gpu.read(&ob, sel.len() * words)?;
        let shape = format!("rows {sel:?} of {n}, {words} words");
        out.push(row("gather_rows", dt, shape, rel_err(&got, &want), 1e-12));
    }
    Ok(out)
}

/// Preemption by swapping: KV blocks copied out to page-locked host memory and back in to
/// other device blocks by the copy engine, against the same copies made on the host (exact:
/// bits compared). Out on the copy stream in groups of planes, as the engine queues them;
/// in on the compute stream, every plane in one group.
fn kv_block_copies(gpu: &Gpu, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (planes, blocks, bs, kvd, host_blocks) in [(4, 9, 32, 64, 5), (60, 7, 16, 192, 6)] {
        let chunk = bs * kvd;
        let plane = blocks * chunk;
        let dev: Vec<u16> = (0..planes * plane).map(|_| rng.gen()).collect();
        let devb = gpu.upload(&dev)?;
        let mut host = gpu.pinned_host::<u16>(host_blocks * planes * chunk)?;
        let host_ptr = host.as_mut_ptr().map_err(cuda_err("host cache"))?;
        let outs = [(3, 1), (0, 4), (blocks as u32 - 1, 0)];
        let ins = [(1, 4), (5, 1), (2, 0)];
        let mut want_host = vec![0u16; host_blocks * planes * chunk];
        for &(d, h) in &outs {
            for p in 0..planes {
                let src = p * plane + d as usize * chunk;
                let dst = (h as usize * planes + p) * chunk;
                want_host[dst..dst + chunk].copy_from_slice(&dev[src..src + chunk]);
            }
        }
        let mut want_dev = dev.clone();
        for &(d, h) in &ins {
            for p in 0..planes {
                let src = (h as usize * planes + p) * chunk;
                let dst = p * plane + d as usize * chunk;
                want_dev[dst..dst + chunk].copy_from_slice(&want_host[src..src + chunk]);
            }
        }
        let caches = SwapCaches {
            dev: devb.ptr(),
            host: host_ptr as u64,
            planes,
            plane,
            chunk,
        };
        let join = |a: &CudaStream, b: &CudaStream| a.join(b).map_err(cuda_err("joining streams"));
        join(&gpu.copy_stream, &gpu.stream)?;
        let mut p = 0;
        while p < planes {
            let end = (p + 2 * (p / 2).max(1)).min(planes);
            swap::copy_blocks(&gpu.copy_stream, &caches, &outs, p..end, true)?;
            p = end;
        }
        join(&gpu.stream, &gpu.copy_stream)?;
        swap::copy_blocks(&gpu.stream, &caches, &ins, 0..planes, false)?;
        let got_dev = gpu.read(&devb, dev.len())?;
        // SAFETY: the read above synchronized the compute stream, which waited for the copy
        // stream: every copy is done, and the buffer holds host_blocks * planes * chunk
        // elements.
        let got_host = unsafe { std::slice::from_raw_parts(host_ptr, want_host.len()) };
        let as_f32 = |v: &[u16]| v.iter().map(|&b| f32::from(b)).collect::<Vec<f32>>();
        let pick = |v: &[u16]| -> Vec<u16> {
            outs.iter()
                .flat_map(|&(_, h)| {
                    let h = h as usize;
                    v[h * planes * chunk..(h + 1) * planes * chunk].to_vec()
                })
                .collect()
        };
        let shape = format!("{planes} planes, {blocks} blocks of {bs} x {kvd}, 3 out, 3 in");
        let e = rel_err(&as_f32(&pick(got_host)), &as_f32(&pick(&want_host)));
        out.push(row(
            "kv block copies out",
            Half::F16,
            shape.clone(),
            e,
            1e-12,
        ));
        let e = rel_err(&as_f32(&got_dev), &as_f32(&want_dev));
        out.push(row("kv block copies in", Half::F16, shape, e, 1e-12));
    }
    Ok(out)
}

/// How fast the copy engine moves KV blocks each way: 64 blocks of the Llama-3.1-8B shape
/// (64 planes of 32 x 1,024 elements, 4 MiB a block), best of 5.
fn kv_copy_rate(gpu: &Gpu) -> Result<Row> {
    let (planes, blocks, chunk) = (64, 64, 32 * 1024);
    let dev = gpu.zeros::<u16>(planes * blocks * chunk)?;
    let mut host = gpu.pinned_host::<u16>(planes * blocks * chunk)?;
    let host_ptr = host.as_mut_ptr().map_err(cuda_err("host cache"))? as u64;
    // Device block i to host block 63 - i: the scattered order a preemption gives.
    let pairs: Vec<(u32, u32)> = (0..blocks as u32).map(|i| (i, 63 - i)).collect();
    let caches = SwapCaches {
        dev: dev.ptr(),
        host: host_ptr,
        planes,
        plane: blocks * chunk,
        chunk,
    };
    let bytes = (planes * blocks * chunk * 2) as f64;
    let mut rates = Vec::new();
    for to_host in [true, false] {
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            gpu.sync()?;
            let t = Instant::now();
            swap::copy_blocks(&gpu.stream, &caches, &pairs, 0..planes, to_host)?;
            gpu.sync()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        rates.push(bytes / best / 1e9);
    }
    Ok(Row {
        check: "kv block copy rate".into(),
        shape: format!("{blocks} blocks of 4 MiB ({planes} planes of 32 x 1024)"),
        err: rates[0],
        tol: f64::INFINITY,
        written: true,
        note: format!(
            "{:.1} GB/s device to host, {:.1} GB/s host to device",
            rates[0], rates[1]
        ),
        info: true,
    })
}

fn swiglu(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (n, f) in [(1, 1536), (3, 8191), (17, 64), (2, 1540)] {
        let (gbits, gu) = half_of(dt, &rand_vec(rng, n * 2 * f, 4.0));
        // The kernel reads each row's gate and up values interleaved, as the GPU's gate_up
        // weights produce them; the CPU twin reads [gate | up].
        let gbits: Vec<u16> = gbits
            .chunks(2 * f)
            .flat_map(|row| interleave_halves(row, 2 * f, 1))
            .collect();
        let (gb, ob) = (gpu.upload(&gbits)?, poison_half(gpu, dt, n * f)?);
        launch::silu_mul(gpu, dt, gb.ptr(), ob.ptr(), n, f)?;
        let mut want = vec![0f32; n * f];
        cpu::silu_mul(&gu, f, &mut want);
        let got = to_f32(dt, &gpu.read(&ob, n * f)?);
        out.push(row(
            "silu_mul",
            dt,
            format!("n {n} f {f}"),
            rel_err(&got, &want),
            1e-2,
        ));
    }
    Ok(out)
}

/// The MLP's gate|up projection with SwiGLU ([`Blas::gate_up`]): the GEMV kernel applying
/// SwiGLU as it writes, and cuBLAS followed by silu_mul, both on the interleaved weights the
/// GPU holds, against the CPU matmul on [gate | up] and the CPU SwiGLU, each output rounded
/// to 16 bits as on the GPU.
fn gate_up_swiglu(gpu: &Arc<Gpu>, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let blas = Blas::new(gpu)?;
    let mut out = Vec::new();
    for (n, k, f) in [
        (1, 576, 1536),
        (1, 2048, 2731),
        (3, 2048, 2731),
        (4, 4096, 1000),
        (2, 2056, 7),
    ] {
        // x is the norm of fp32 rows, so that the GEMV kernel can also norm them itself.
        let normed = NormedRows::new(gpu, dt, rng, n, k)?;
        let (xb, xv) = (&normed.bits, normed.vals.clone());
        let (wb, wv) = half_of(dt, &rand_vec(rng, 2 * f * k, 0.05));
        let (xd, wd) = (
            gpu.upload(xb)?,
            gpu.upload(&interleave_halves(&wb, 2 * f, k))?,
        );
        let xn = poison_half(gpu, dt, n * k)?;
        let norm = normed.input(&xn, false);
        let mut gu = vec![0f32; n * 2 * f];
        linear(&xv, &Matrix::F32(wv), None, n, k, 2 * f, &mut gu);
        let mut want = vec![0f32; n * f];
        cpu::silu_mul(&half_of(dt, &gu).1, f, &mut want);
        let want = half_of(dt, &want).1;
        for (path, x, name) in [
            (
                Path::Gemv,
                Input::Rows(xd.ptr()),
                "gate_up + SwiGLU, gemv kernel",
            ),
            (
                Path::Cublas,
                Input::Rows(xd.ptr()),
                "gate_up + SwiGLU, cublas gemm + silu_mul",
            ),
            (Path::Gemv, norm, "rms_norm + gate_up + SwiGLU, gemv kernel"),
            (
                Path::Cublas,
                norm,
                "rms_norm + gate_up + SwiGLU, rms_norm + cublas + silu_mul",
            ),
        ] {
            let gud = gpu.alloc::<u16>(n * 2 * f)?;
            let act = poison_half(gpu, dt, n * f)?;
            let fused = blas.gate_up(path, dt, x, wd.ptr(), (gud.ptr(), act.ptr()), n, k, f)?;
            if fused != (path == Path::Gemv) {
                return Err(crate::error::Error::Cuda(format!(
                    "{name}: SwiGLU fused {fused}, expected {}",
                    path == Path::Gemv
                )));
            }
            if !fused {
                launch::silu_mul(gpu, dt, gud.ptr(), act.ptr(), n, f)?;
            }
            let got = to_f32(dt, &gpu.read(&act, n * f)?);
            out.push(row(
                name,
                dt,
                format!("n {n} in {k} f {f}"),
                rel_err(&got, &want),
                1e-2,
            ));
        }
        // The pipelined kernel at each split it can run (the tuning may choose it).
        for plan in runnable_plans(n, k).filter(|p| p.pipelined) {
            // Unnormed on xd, then (where the kernel can norm these rows) normed by the same
            // kernel (gemv_pipe_norm; its xn poisoned and unread, so that the plain pipelined
            // kernel on xn could not pass).
            let run = |norm_in_kernel: bool| -> Result<Vec<f32>> {
                let act = poison_half(gpu, dt, n * f)?;
                let xn = if norm_in_kernel {
                    Some(poison_half(gpu, dt, n * k)?)
                } else {
                    None
                };
                let (x, nm) = match &xn {
                    Some(xn) => (xn.ptr(), Some(normed.norm(xn))),
                    None => (xd.ptr(), None),
                };
                blas.gemv_at(
                    dt,
                    (x, wd.ptr(), act.ptr()),
                    Out::Half,
                    n,
                    k,
                    2 * f,
                    true,
                    plan,
                    nm,
                )?;
                Ok(to_f32(dt, &gpu.read(&act, n * f)?))
            };
            for (norm_in_kernel, name) in [(false, "gate_up"), (true, "rms_norm + gate_up")] {
                if norm_in_kernel && !Blas::gemv_can_norm(n, k) {
                    continue;
                }
                out.push(row(
                    &format!("{name} + SwiGLU, gemv kernel at split {plan}"),
                    dt,
                    format!("n {n} in {k} f {f}"),
                    rel_err(&run(norm_in_kernel)?, &want),
                    1e-2,
                ));
            }
        }
    }
    Ok(out)
}

/// The norms' epsilon in the fused-norm checks.
const NORM_EPS: f32 = 1e-5;

/// Random fp32 rows and norm weights on the device, and their CPU norm in 16 bits.
struct NormedRows {
    xf: DevBuf<f32>,
    g: DevBuf<f32>,
    bits: Vec<u16>,
    vals: Vec<f32>,
}

impl NormedRows {
    fn new(gpu: &Gpu, dt: Half, rng: &mut StdRng, n: usize, k: usize) -> Result<NormedRows> {
        let (xf, g) = (rand_vec(rng, n * k, 2.0), rand_vec(rng, k, 1.5));
        let mut normed = vec![0f32; n * k];
        cpu::rms_norm(&xf, &g, NORM_EPS, &mut normed);
        let (bits, vals) = half_of(dt, &normed);
        Ok(NormedRows {
            xf: gpu.upload(&xf)?,
            g: gpu.upload(&g)?,
            bits,
            vals,
        })
    }

    /// The rows as a layer's input normed on the way in, `xn` for the paths that need it;
    /// with `early`, where rms_norm norms them before the GEMV kernel, the GEMV launches
    /// before the norm's wait.
    fn input(&self, xn: &DevBuf<u16>, early: bool) -> Input {
        Input::Normed(Norm {
            early,
            ..self.norm(xn)
        })
    }

    fn norm(&self, xn: &DevBuf<u16>) -> Norm {
        Norm {
            x: self.xf.ptr(),
            w: self.g.ptr(),
            eps: NORM_EPS,
            xn: xn.ptr(),
            early: false,
        }
    }
}

/// A linear layer of normed rows ([`Input::Normed`]): the GEMV kernel norming the fp32
/// rows itself (`Path::Gemv` does at every width that fits its shared memory), and
/// rms_norm followed by cuBLAS (and by the GEMV kernel, where the rows would overflow its
/// shared memory), against the CPU norm, rounded, and matmul; and the kernel's own norm
/// against the rms_norm kernel's rows, which it reproduces bit for bit.
fn normed_linear(gpu: &Arc<Gpu>, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let blas = Blas::new(gpu)?;
    let mut out = Vec::new();
    for (n, k, m) in [
        (1, 576, 960),
        (1, 2048, 3072),
        (3, 4096, 6144),
        (4, 2048, 2050),
        (3, 2048, 4099),
        (1, 6144, 64),
        // 48 KB of 16-bit rows (and 32 KB of weights): more than the kernel's shared
        // memory beside its own, so normed by rms_norm.
        (3, 8192, 64),
    ] {
        let normed = NormedRows::new(gpu, dt, rng, n, k)?;
        let (wb, wv) = half_of(dt, &rand_vec(rng, m * k, 0.05));
        let mut want = vec![0f32; n * m];
        linear(&normed.vals, &Matrix::F32(wv), None, n, k, m, &mut want);
        let want = half_of(dt, &want).1;
        let wd = gpu.upload(&wb)?;
        let shape = format!("n {n} in {k} out {m}");
        let mut got_path = Vec::new();
        for (path, name) in [
            (Path::Gemv, "rms_norm + linear, gemv kernel"),
            (Path::Cublas, "rms_norm + linear, rms_norm + cublas"),
        ] {
            let xn = poison_half(gpu, dt, n * k)?;
            let y = poison_half(gpu, dt, n * m)?;
            // The GEMV path's rows too wide for its shared memory are normed by rms_norm,
            // which lets the GEMV launch before its wait, as forward.rs's norm before qkv.
            let x = normed.input(&xn, path == Path::Gemv);
            blas.linear(path, dt, x, wd.ptr(), y.ptr(), Out::Half, n, k, m)?;
            let got = to_f32(dt, &gpu.read(&y, n * m)?);
            out.push(row(name, dt, shape.clone(), rel_err(&got, &want), 1e-2));
            got_path.push(got);
        }
        if !Blas::gemv_can_norm(n, k) {
            continue;
        }
        // The same layer after the rms_norm kernel, on the GEMV kernel: the same bits; and
        // again with the GEMV launched before the norm's wait (`early`: its blocks resident
        // and loading weights while the norm runs): the same bits.
        let (xf, g) = (normed.xf.ptr(), normed.g.ptr());
        let after_norm = |early: bool| -> Result<Vec<f32>> {
            let xn = poison_half(gpu, dt, n * k)?;
            launch::rms_norm(gpu, dt, xf, g, xn.ptr(), n, k, NORM_EPS, early)?;
            let y = poison_half(gpu, dt, n * m)?;
            blas.linear(
                Path::Gemv,
                dt,
                xn.ptr(),
                wd.ptr(),
                y.ptr(),
                Out::Half,
                n,
                k,
                m,
            )?;
            Ok(to_f32(dt, &gpu.read(&y, n * m)?))
        };
        let apart = after_norm(false)?;
        out.push(row(
            "rms_norm in the gemv kernel = rms_norm kernel + gemv",
            dt,
            shape.clone(),
            rel_err(&got_path[0], &apart),
            1e-9,
        ));
        out.push(row(
            "rms_norm kernel launching the gemv early = without",
            dt,
            shape.clone(),
            rel_err(&after_norm(true)?, &apart),
            1e-9,
        ));
        // The pipelined kernel norming the row itself (gemv_pipe_norm), at each split it
        // can run: against the CPU, and bit for bit against the rms_norm kernel's row on the
        // same plan (the same norm, the same sums).
        for plan in runnable_plans(n, k).filter(|p| p.pipelined) {
            let run = |normed_in_kernel: bool| -> Result<Vec<f32>> {
                let xn = poison_half(gpu, dt, n * k)?;
                let y = poison_half(gpu, dt, n * m)?;
                let ptrs = (xn.ptr(), wd.ptr(), y.ptr());
                let nm = if normed_in_kernel {
                    Some(normed.norm(&xn))
                } else {
                    launch::rms_norm(gpu, dt, xf, g, xn.ptr(), n, k, NORM_EPS, false)?;
                    None
                };
                blas.gemv_at(dt, ptrs, Out::Half, n, k, m, false, plan, nm)?;
                Ok(to_f32(dt, &gpu.read(&y, n * m)?))
            };
            let got = run(true)?;
            out.push(row(
                &format!("rms_norm + linear, gemv kernel at split {plan}"),
                dt,
                shape.clone(),
                rel_err(&got, &want),
                1e-2,
            ));
            out.push(row(
                &format!("rms_norm in the gemv kernel at split {plan} = rms_norm kernel + it"),
                dt,
                shape.clone(),
                rel_err(&got, &run(false)?),
                1e-9,
            ));
        }
    }
    Ok(out)
}

fn inv_freq(hd: usize, theta: f32) -> Vec<f32> {
    (0..hd / 2)
        .map(|i| 1.0 / theta.powf(2.0 * i as f32 / hd as f32))
        .collect()
}

/// RoPE with the KV-cache write, q out in both forms: fp32 (the warp-per-key kernel's) and
/// 16-bit pre-scaled (the tensor-core kernels'), on shapes of both thread widths (hd / 2 a
/// multiple of 8, and not).
fn rope(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (heads, kvh, hd, bias) in [
        (9, 3, 64, false),
        (32, 8, 128, true),
        (4, 2, 16, false),
        (4, 2, 24, true),
    ] {
        for q_scale in [None, Some(crate::kernels::cuda::attention::base2_scale(hd))] {
            out.extend(rope_one(gpu, dt, rng, (heads, kvh, hd, bias), q_scale)?);
        }
    }
    Ok(out)
}

fn rope_one(
    gpu: &Gpu,
    dt: Half,
    rng: &mut StdRng,
    (heads, kvh, hd, bias): (usize, usize, usize, bool),
    q_scale: Option<f32>,
) -> Result<Vec<Row>> {
    let (qd, kvd, n, num_slots) = (heads * hd, kvh * hd, 13, 300);
    let (qkv_bits, qkv) = half_of(dt, &rand_vec(rng, n * (qd + 2 * kvd), 1.0));
    let b = rand_vec(rng, qd + 2 * kvd, 0.5);
    let pos: Vec<usize> = (0..n)
        .map(|i| if i == 0 { 0 } else { rng.gen_range(0..8192) })
        .collect();
    // n distinct slots out of num_slots.
    let mut slots: Vec<usize> = (0..num_slots).collect();
    for i in 0..n {
        let j = rng.gen_range(i..num_slots);
        slots.swap(i, j);
    }
    slots.truncate(n);
    // LongRoPE's layout: the short frequencies, then the long ones, taken by the rows
    // flagged (every third).
    let short = inv_freq(hd, 500000.0);
    let long: Vec<f32> = short
        .iter()
        .enumerate()
        .map(|(i, f)| f / (1.0 + i as f32))
        .collect();
    let freqs = [short.clone(), long.clone()].concat();
    let long_rows: Vec<i32> = (0..n as i32).map(|r| (r % 3 == 1) as i32).collect();
    let hs = Heads {
        heads,
        kv_heads: kvh,
        head_dim: hd,
        simple: false,
    };
    let pos_i: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
    let slots_i: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
    let (qkvb, bb, fb) = (gpu.upload(&qkv_bits)?, gpu.upload(&b)?, gpu.upload(&freqs)?);
    let (pb, sb) = (gpu.upload(&pos_i)?, gpu.upload(&slots_i)?);
    let lb = gpu.upload(&long_rows)?;
    // fp32-sized either way: the 16-bit form uses its first half, poisoned too.
    let qo = poison_f32(gpu, n * qd)?;
    let kc = poison_half(gpu, dt, num_slots * kvd)?;
    let vc = poison_half(gpu, dt, num_slots * kvd)?;
    let bptr = if bias { bb.ptr() } else { 0 };
    launch::rope_kv_write(
        gpu,
        dt,
        qkvb.ptr(),
        bptr,
        pb.ptr(),
        sb.ptr(),
        (fb.ptr(), lb.ptr()),
        (qo.ptr(), q_scale),
        kc.ptr(),
        vc.ptr(),
        n,
        hs,
    )?;
    // CPU twin: split, bias, rotate; K/V compared after the cache's rounding.
    let (mut q, mut k, mut v) = (vec![], vec![], vec![]);
    for r in 0..n {
        let row: Vec<f32> = (0..qd + 2 * kvd)
            .map(|i| qkv[r * (qd + 2 * kvd) + i] + if bias { b[i] } else { 0.0 })
            .collect();
        q.extend_from_slice(&row[..qd]);
        k.extend_from_slice(&row[qd..qd + kvd]);
        v.extend_from_slice(&row[qd + kvd..]);
    }
    for r in 0..n {
        let f = if long_rows[r] != 0 { &long } else { &short };
        cpu::rope(&mut q[r * qd..(r + 1) * qd], &pos[r..r + 1], hd, f);
        cpu::rope(&mut k[r * kvd..(r + 1) * kvd], &pos[r..r + 1], hd, f);
    }
    let form = if q_scale.is_some() { "16-bit" } else { "fp32" };
    let shape = format!("heads {heads}/{kvh} hd {hd} n {n} bias {bias} q {form}");
    let q_row = match q_scale {
        None => row(
            "rope_kv_write (q)",
            dt,
            shape.clone(),
            rel_err(&gpu.read(&qo, n * qd)?, &q),
            1e-4,
        ),
        Some(scale) => {
            // The 16-bit form: n * qd values in the buffer's first half, times the scale;
            // its second half must still hold the poison.
            let words = gpu.read(&qo, n * qd)?;
            let (used, rest) = words.split_at(n * qd / 2);
            let bits: Vec<u16> = used
                .iter()
                .flat_map(|w| {
                    let u = w.to_bits();
                    [u as u16, (u >> 16) as u16]
                })
                .collect();
            let got: Vec<f32> = to_f32(dt, &bits).iter().map(|x| x / scale).collect();
            let mut r = row(
                "rope_kv_write (q)",
                dt,
                shape.clone(),
                rel_err(&got, &q),
                1e-2,
            );
            if rest.iter().any(|x| !x.is_nan()) {
                r.written = false;
                r.note = "wrote past its 16-bit rows".into();
            }
            r
        }
    };
    let kall = to_f32(dt, &gpu.read(&kc, num_slots * kvd)?);
    let vall = to_f32(dt, &gpu.read(&vc, num_slots * kvd)?);
    let pick = |all: &[f32]| -> Vec<f32> {
        slots
            .iter()
            .flat_map(|&s| all[s * kvd..(s + 1) * kvd].iter().copied())
            .collect()
    };
    let stray = |all: &[f32]| all.iter().filter(|x| !x.is_nan()).count() != n * kvd;
    let mut rk = row(
        "rope_kv_write (k)",
        dt,
        shape.clone(),
        rel_err(&pick(&kall), &k),
        1e-2,
    );
    let mut rv = row(
        "rope_kv_write (v)",
        dt,
        shape,
        rel_err(&pick(&vall), &v),
        1e-2,
    );
    if stray(&kall) || stray(&vall) {
        rk.written = false;
        rv.written = false;
        rk.note = "wrote outside its slots".into();
    }
    Ok(vec![q_row, rk, rv])
}

/// Linear layers on every implementation (cublasGemmEx; the GEMV kernel where it runs;
/// above a few rows the fastest cuBLASLt candidate of the row bucket, timed first) and both
/// output types, against the CPU matmul on the same rounded operands. A 16-bit output is
/// compared after the same rounding.
fn gemm(gpu: &Arc<Gpu>, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut blas = Blas::new(gpu)?;
    let mut out = Vec::new();
    for (n, k, m) in [
        (1, 576, 1728),
        (7, 2048, 2048),
        (17, 1000, 333),
        (33, 576, 49152),
        (1, 4096, 6144),
        (2, 1000, 77),
        (3, 14336, 515),
        (4, 2048, 4099),
        // Rows whose last batch of chunks is partial (257 and 513 chunks), and more rows
        // than an H100's 132 SMs hold warps at once.
        (1, 2056, 5000),
        (2, 4104, 9001),
        // One row at the 1B's width, an odd number of outputs: the pipelined kernel at
        // splits 4 and 8, its blocks taking one to three groups each on an H100.
        (1, 2048, 3001),
        // Narrow enough for the pipelined kernel at split 1 (no barrier), and enough pairs
        // that at splits 1 and 2 its blocks take several groups.
        (1, 512, 9001),
    ] {
        let (xb, xv) = half_of(dt, &rand_vec(rng, n * k, 1.0));
        let (wb, wv) = half_of(dt, &rand_vec(rng, m * k, 0.05));
        let (xd, wd) = (gpu.upload(&xb)?, gpu.upload(&wb)?);
        let mut want = vec![0f32; n * m];
        linear(&xv, &Matrix::F32(wv), None, n, k, m, &mut want);
        let want_half = half_of(dt, &want).1;
        let base = rand_vec(rng, n * m, 1.0);
        let want_added: Vec<f32> = base.iter().zip(&want).map(|(b, w)| b + w).collect();
        let gemv = Blas::gemv_fits(xd.ptr(), wd.ptr(), n, k);
        let paths: &[(Path, &str)] = if gemv {
            &[(Path::Cublas, "cublas gemm"), (Path::Gemv, "gemv kernel")]
        } else {
            // Time the bucket's cuBLASLt candidates on buffers of the bucket's rows.
            let b = lt::bucket(n).unwrap_or(n);
            let (tx, ty) = (gpu.zeros::<u16>(b * k)?, gpu.alloc::<f32>(b * m)?);
            for y_ty in [Out::F32, Out::Half, Out::F32Add] {
                let shape = Shape {
                    half: dt,
                    n: b,
                    inp: k,
                    out: m,
                    y: y_ty,
                };
                blas.tune_lt(shape, tx.ptr(), wd.ptr(), ty.ptr())?;
            }
            &[
                (Path::Cublas, "cublas gemm"),
                (Path::CublasLt, "cublasLt matmul"),
            ]
        };
        if gemv {
            let expected = Expected {
                want: &want,
                want_half: &want_half,
                base: &base,
                want_added: &want_added,
            };
            let ptrs = (xd.ptr(), wd.ptr());
            out.extend(gemv_plans(gpu, &blas, dt, ptrs, (n, k, m), &expected)?);
        }
        for &(path, name) in paths {
            let shape = format!("n {n} in {k} out {m}");
            let y = poison_f32(gpu, n * m)?;
            blas.linear(path, dt, xd.ptr(), wd.ptr(), y.ptr(), Out::F32, n, k, m)?;
            let got = gpu.read(&y, n * m)?;
            let e = rel_err(&got, &want);
            out.push(row(
                &format!("{name}, fp32 out"),
                dt,
                shape.clone(),
                e,
                1e-3,
            ));
            let yh = poison_half(gpu, dt, n * m)?;
            blas.linear(path, dt, xd.ptr(), wd.ptr(), yh.ptr(), Out::Half, n, k, m)?;
            let got = to_f32(dt, &gpu.read(&yh, n * m)?);
            let e = rel_err(&got, &want_half);
            out.push(row(
                &format!("{name}, 16-bit out"),
                dt,
                shape.clone(),
                e,
                1e-2,
            ));
            // Added into what y holds (the residual stream).
            let y = gpu.upload(&base)?;
            blas.linear(path, dt, xd.ptr(), wd.ptr(), y.ptr(), Out::F32Add, n, k, m)?;
            let got = gpu.read(&y, n * m)?;
            let e = rel_err(&got, &want_added);
            out.push(row(&format!("{name}, fp32 added to y"), dt, shape, e, 1e-3));
        }
    }
    Ok(out)
}

/// A linear layer's CPU results: fp32, rounded to 16 bits, and added to `base` (what y
/// held before).
struct Expected<'a> {
    want: &'a [f32],
    want_half: &'a [f32],
    base: &'a [f32],
    want_added: &'a [f32],
}

/// The GEMV kernel on `n` rows `x` of `k` inputs by `w` (`m` outputs) at every plan the
/// tuning may choose ([`gemm`]'s paths take the untimed rule's): each split, and the
/// pipelined kernel in each output where it fits, whose fp32 sums must equal the plain
/// kernel's at the same split, bit for bit.
fn gemv_plans(
    gpu: &Arc<Gpu>,
    blas: &Blas,
    dt: Half,
    (x, w): (u64, u64),
    (n, k, m): (usize, usize, usize),
    e: &Expected,
) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    let mut plain_sums: Option<(usize, Vec<f32>)> = None;
    for plan in runnable_plans(n, k) {
        let outs: &[Out] = if plan.pipelined {
            &[Out::F32, Out::Half, Out::F32Add]
        } else {
            &[Out::F32]
        };
        for &y_ty in outs {
            let (got, want, tol) = match y_ty {
                Out::Half => {
                    let y = poison_half(gpu, dt, n * m)?;
                    blas.gemv_at(dt, (x, w, y.ptr()), y_ty, n, k, m, false, plan, None)?;
                    (to_f32(dt, &gpu.read(&y, n * m)?), e.want_half, 1e-2)
                }
                Out::F32 | Out::F32Add => {
                    let y = if y_ty == Out::F32 {
                        poison_f32(gpu, n * m)?
                    } else {
                        gpu.upload(e.base)?
                    };
                    blas.gemv_at(dt, (x, w, y.ptr()), y_ty, n, k, m, false, plan, None)?;
                    let want = if y_ty == Out::F32 {
                        e.want
                    } else {
                        e.want_added
                    };
                    (gpu.read(&y, n * m)?, want, 1e-3)
                }
            };
            out.push(row(
                &format!("gemv kernel at split {plan}, {y_ty:?} out"),
                dt,
                format!("n {n} in {k} out {m}"),
                rel_err(&got, want),
                tol,
            ));
            if y_ty != Out::F32 {
                continue;
            }
            match (&plain_sums, plan.pipelined) {
                (_, false) => plain_sums = Some((plan.split, got)),
                (Some((split, plain)), true) if *split == plan.split => out.push(row(
                    &format!("gemv kernel at split {plan} = plain, fp32 out"),
                    dt,
                    format!("n {n} in {k} out {m}"),
                    rel_err(&got, plain),
                    1e-9,
                )),
                _ => {}
            }
        }
    }
    Ok(out)
}
