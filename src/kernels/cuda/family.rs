//! Launchers of the kernels only some model families need (`kernels/family.cu`):
//! LayerNorm, per-head q/k RMSNorm, the residual add with a bias and an output norm, GELU
//! activations and soft-capping. Device addresses are `u64` (0 for a null pointer).

use super::launch::{cfg, i32_of, Args};
use super::{cuda_err, Gpu, Half};
use crate::error::Result;

const THREADS: u32 = 256;

/// `out[i] = layernorm(x[rows[i]]) * w + b` in `half` (`rows` 0: row i), `n` rows of `h`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(
    gpu: &Gpu,
    half: Half,
    x: u64,
    rows: u64,
    (w, b): (u64, u64),
    out: u64,
    n: usize,
    h: usize,
    eps: f32,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let hi = i32_of(h)?;
    let f = gpu.func("layer_norm", half)?;
    let mut a = Args::new();
    a.arg(&x)
        .arg(&rows)
        .arg(&w)
        .arg(&b)
        .arg(&out)
        .arg(&hi)
        .arg(&eps);
    // SAFETY: argument order and types match family.cu; x holds every indexed row, out n.
    unsafe { gpu.launch(f, cfg((n, 1, 1), THREADS)?, &mut a) }.map_err(cuda_err("layer_norm"))?;
    Ok(())
}

/// Per-head RMSNorm of the q heads (weight `q_w`) and k heads (`k_w`) of `n` fused QKV
/// rows in `half`, in place.
#[allow(clippy::too_many_arguments)]
pub fn head_rms_norm(
    gpu: &Gpu,
    half: Half,
    qkv: u64,
    (q_w, k_w): (u64, u64),
    n: usize,
    (heads, kv_heads, hd): (usize, usize, usize),
    eps: f32,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (h, kvh, d) = (i32_of(heads)?, i32_of(kv_heads)?, i32_of(hd)?);
    let f = gpu.func("head_rms_norm", half)?;
    let mut a = Args::new();
    a.arg(&qkv)
        .arg(&q_w)
        .arg(&k_w)
        .arg(&h)
        .arg(&kvh)
        .arg(&d)
        .arg(&eps);
    // SAFETY: argument order and types match family.cu; qkv holds n rows of
    // (heads + 2 kv_heads) * hd values, the weights hd each; one warp a (row, head).
    unsafe { gpu.launch(f, cfg((n, heads + kv_heads, 1), 32)?, &mut a) }
        .map_err(cuda_err("head_rms_norm"))?;
    Ok(())
}

/// `x += t + b`, or `x += rmsnorm(t + b) * w` where `w` is given (0: none; `b` likewise),
/// over `n` fp32 rows of `h`.
#[allow(clippy::too_many_arguments)]
pub fn residual_add(
    gpu: &Gpu,
    half: Half,
    x: u64,
    t: u64,
    (b, w): (u64, u64),
    n: usize,
    h: usize,
    eps: f32,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let hi = i32_of(h)?;
    let f = gpu.func("residual_add", half)?;
    let mut a = Args::new();
    a.arg(&x).arg(&t).arg(&b).arg(&w).arg(&hi).arg(&eps);
    // SAFETY: argument order and types match family.cu; x and t hold n rows of h.
    unsafe { gpu.launch(f, cfg((n, 1, 1), THREADS)?, &mut a) }.map_err(cuda_err("residual_add"))?;
    Ok(())
}

/// GeGLU of `n` rows of interleaved gate|up columns (`[n, 2f]`) into `out` (`[n, f]`).
pub fn gelu_mul(gpu: &Gpu, half: Half, gu: u64, out: u64, n: usize, f: usize) -> Result<()> {
    elementwise(gpu, half, "gelu_mul", &[gu, out], n, f)
}

/// `out = gelu(up + b)` over `n` rows of `f` (`b` 0: no bias).
pub fn gelu_bias(
    gpu: &Gpu,
    half: Half,
    up: u64,
    b: u64,
    out: u64,
    n: usize,
    f: usize,
) -> Result<()> {
    elementwise(gpu, half, "gelu_bias", &[up, b, out], n, f)
}

/// `x = cap * tanh(x / cap)` over `n` fp32 rows of `w`.
pub fn softcap(gpu: &Gpu, half: Half, x: u64, n: usize, w: usize, cap: f32) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let wi = i32_of(w)?;
    let f = gpu.func("softcap", half)?;
    let mut a = Args::new();
    a.arg(&x).arg(&wi).arg(&cap);
    // SAFETY: argument order and types match family.cu; x holds n rows of w.
    unsafe {
        gpu.launch(
            f,
            cfg((w.div_ceil(THREADS as usize), n, 1), THREADS)?,
            &mut a,
        )
    }
    .map_err(cuda_err("softcap"))?;
    Ok(())
}

/// A kernel of `ptrs` then the row width `f`, one thread an output over `n` rows of `f`.
fn elementwise(
    gpu: &Gpu,
    half: Half,
    name: &'static str,
    ptrs: &[u64],
    n: usize,
    f: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let fi = i32_of(f)?;
    let func = gpu.func(name, half)?;
    let mut a = Args::new();
    for p in ptrs {
        a.arg(p);
    }
    a.arg(&fi);
    // SAFETY: argument order and types match family.cu (pointers, then f); the buffers hold
    // n rows of the widths the kernel reads.
    unsafe {
        gpu.launch(
            func,
            cfg((f.div_ceil(THREADS as usize), n, 1), THREADS)?,
            &mut a,
        )
    }
    .map_err(cuda_err(name))?;
    Ok(())
}
