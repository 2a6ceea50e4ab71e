//! Engine start-up timing of the linear layers: which of the GEMV kernels (and at which
//! plan), cublasGemmEx and the cuBLASLt candidates runs each layer shape at each row count.
//! The first engine on a model times them; the choices are kept on the model for every
//! later one, and on disk (`tuning-<key>.json` beside the kernel cache) for the next start
//! of the same shapes on the same device, libraries and kernels.

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

use super::CudaModel;
use crate::error::Result;
use crate::kernels::cuda::gemm::{Blas, Out, Shape, Tuning};
use crate::kernels::cuda::gemv::GEMV_MAX_ROWS;
use crate::kernels::cuda::{compile, lt, switches, Half};
use crate::model::family::Mlp;

/// Gives `blas` the model's linear-layer choices: those of an earlier engine on the model,
/// or those kept on disk for the same model shapes, device, libraries and kernels
/// ([`cache_path`]), or, for the first, its own timing (`tune_linears`), then kept on the
/// model and on disk.
pub fn choose_linears(model: &CudaModel, blas: &mut Blas) -> Result<()> {
    if let Some(tuning) = model.tuning.get() {
        blas.adopt(tuning.clone());
        return Ok(());
    }
    let path = cache_path(model);
    if let Some(cached) = path.as_deref().and_then(read_cached) {
        tracing::info!("linear layers' kernel choices from the tuning cache");
        let kept = model.tuning.get_or_init(|| cached);
        blas.adopt(kept.clone());
        return Ok(());
    }
    let started = std::time::Instant::now();
    tune_linears(model, blas)?;
    model.gpu.sync()?;
    tracing::info!(
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "linear layers timed: GEMV or cuBLAS per shape at 1 to 4 rows, cuBLASLt per row bucket"
    );
    // Engines are built one at a time; should two ever time at once, the first choices
    // stored serve both.
    let kept = model.tuning.get_or_init(|| blas.tuning());
    blas.adopt(kept.clone());
    if let Some(path) = path {
        write_cached(&path, kept);
    }
    Ok(())
}

/// The file that keeps the choices for this model's linear layers on this device:
/// `tuning-<key>.json` beside the kernel cache, the key a digest of the device (name,
/// architecture, switches), the driver and cuBLASLt versions, the kernel sources, this
/// timing code, the 16-bit type and every layer shape. None when the versions cannot be read.
fn cache_path(model: &CudaModel) -> Option<PathBuf> {
    let mut driver = 0;
    // SAFETY: writes one int through a valid pointer.
    let ok = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
    if ok != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    // SAFETY: a plain query of the loaded library.
    let lt_version = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
    let (g, w) = (&model.gpu, &model.weights);
    let all = linears(model);
    let shapes: Vec<(usize, usize, Out)> = all.iter().map(|&(_, i, o, y)| (i, o, y)).collect();
    // What else decides which kernels are timed: the MLP (gate|up fused with SwiGLU on the
    // GEMV kernel, or not) and how many row buckets fit in the memory left.
    let gate_up_bias = w.layers.first().is_some_and(|l| l.gate_up.b.is_some());
    let head = w.head().half_ptr().unwrap_or(0);
    let top = top_bucket(&all, head, g.mem_info().ok()?.0);
    let mut h = Sha256::new();
    h.update(format!(
        "{}|{}|{}{}{}|{driver}|{lt_version}|{}|{:?}|{shapes:?}|{GEMV_MAX_ROWS}|{:?}|{gate_up_bias}|{top:?}",
        g.name,
        g.arch,
        g.pdl,
        g.wgmma,
        g.clusters,
        compile::sources_digest(),
        w.half,
        model.config.arch.mlp,
    ));
    // The code that times and applies the choices: a new build's choices are its own.
    for code in TIMING_CODE {
        h.update(code);
    }
    let key: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Some(
        switches::switches()
            .kernel_cache
            .join(format!("tuning-{key}.json")),
    )
}

/// The sources whose change makes a kept tuning stale.
const TIMING_CODE: [&str; 4] = [
    include_str!("tune.rs"),
    include_str!("../../kernels/cuda/gemm.rs"),
    include_str!("../../kernels/cuda/gemv.rs"),
    include_str!("../../kernels/cuda/lt.rs"),
];

fn read_cached(path: &Path) -> Option<Tuning> {
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(path = %path.display(), "ignoring an unreadable tuning cache: {e}");
            None
        }
    }
}

/// Keeps `tuning` at `path` (written whole, then renamed); a cache that cannot be written
/// only costs the timing at the next start.
fn write_cached(path: &Path, tuning: &Tuning) {
    let Ok(bytes) = serde_json::to_vec(tuning) else {
        return;
    };
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Every linear layer's shape: (layer 0's weights, inputs, outputs, what it writes), for
/// those whose weights are 16-bit (a quantized matrix has one path: qgemm.rs).
fn linears(model: &CudaModel) -> Vec<(u64, usize, usize, Out)> {
    let (cfg, w) = (&model.config, &model.weights);
    let (h, qd, kvd, f) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
    );
    let Some(l0) = w.layers.first() else {
        return Vec::new();
    };
    let head = w.head();
    // The outputs the layers write (layers.rs): the residual added by o and down, unless a
    // bias or an output norm comes between.
    let residual = |b: bool, post: bool| if b || post { Out::F32 } else { Out::F32Add };
    [
        (&l0.qkv.w, h, qd + 2 * kvd, Out::Half),
        (
            &l0.o.w,
            qd,
            h,
            residual(l0.o.b.is_some(), l0.post_attn_norm.is_some()),
        ),
        (&l0.gate_up.w, h, cfg.arch.up_rows(f), Out::Half),
        (
            &l0.down.w,
            f,
            h,
            residual(l0.down.b.is_some(), l0.post_ffn_norm.is_some()),
        ),
        (head, h, cfg.vocab_size, Out::F32),
    ]
    .into_iter()
    .filter_map(|(m, i, o, y)| Some((m.half_ptr()?, i, o, y)))
    .collect()
}

/// Times every linear layer's shape (layer 0's weights, random inputs): at 1..=GEMV_MAX_ROWS
/// rows on the GEMV kernels and on cuBLAS, so that decode runs each on the faster; at each
/// row bucket on cublasGemmEx and the cuBLASLt candidates, so that larger batches and
/// prefills run the fastest.
fn tune_linears(model: &CudaModel, blas: &mut Blas) -> Result<()> {
    let (cfg, w, g) = (&model.config, &model.weights, &model.gpu);
    let Some(l0) = w.layers.first() else {
        return Ok(());
    };
    let head = w.head().half_ptr().unwrap_or(0);
    // gate|up fused with SwiGLU on the GEMV kernel where the MLP is a plain SwiGLU.
    let fused_mlp = cfg.arch.mlp == Mlp::SwiGlu && l0.gate_up.b.is_none();
    let gate_up = l0.gate_up.w.half_ptr().unwrap_or(0);
    let linears = linears(model);
    let max_in = linears.iter().map(|l| l.1).max().unwrap_or(0);
    let max_out = linears.iter().map(|l| l.2).max().unwrap_or(0);
    let x = g.upload(&random_halves(w.half, GEMV_MAX_ROWS * max_in))?;
    // fp32 rows of the widest layer: room for gate|up's 16-bit product and its activation.
    let y = g.alloc::<f32>(GEMV_MAX_ROWS * max_out)?;
    for n in 1..=GEMV_MAX_ROWS {
        for &(wp, inp, out, y_ty) in &linears {
            let shape = Shape {
                half: w.half,
                n,
                inp,
                out,
                y: y_ty,
            };
            if wp == gate_up && fused_mlp {
                blas.tune_gate_up(shape, x.ptr(), wp, y.ptr())?;
            } else {
                blas.tune(shape, x.ptr(), wp, y.ptr())?;
            }
        }
    }
    drop((x, y));
    // cuBLASLt against cublasGemmEx at each row bucket: the layers at every bucket that
    // fits in half the free memory, lm_head (logit rows only) up to LM_HEAD_BUCKET.
    let (free, _) = g.mem_info()?;
    let Some(top) = top_bucket(&linears, head, free) else {
        return Ok(());
    };
    let need = |b| bucket_bytes(&linears, head, b);
    let (xb, yb) = need(top);
    // Random inputs: on zeros the tensor cores draw less power and run faster than they
    // will on real activations.
    let x = g.upload(&random_halves(w.half, xb / 2))?;
    let y = g.alloc::<u8>(yb)?;
    for b in lt::BUCKETS.into_iter().filter(|&b| b <= top) {
        for &(wp, inp, out, y_ty) in &linears {
            if wp == head && b > LM_HEAD_BUCKET {
                continue;
            }
            let shape = Shape {
                half: w.half,
                n: b,
                inp,
                out,
                y: y_ty,
            };
            blas.tune_lt(shape, x.ptr(), wp, y.ptr())?;
        }
    }
    Ok(())
}

/// lm_head is timed on cuBLASLt up to this many rows (logit rows only).
const LM_HEAD_BUCKET: usize = 256;

/// The bytes of the inputs and outputs of the linear layers at `b` rows.
fn bucket_bytes(linears: &[(u64, usize, usize, Out)], head: u64, b: usize) -> (usize, usize) {
    let xs = linears.iter().map(|l| b * l.1 * 2).max().unwrap_or(0);
    let ys = linears
        .iter()
        .map(|l| b.min(if l.0 == head { LM_HEAD_BUCKET } else { b }) * l.2 * l.3.bytes())
        .max()
        .unwrap_or(0);
    (xs, ys)
}

/// The largest row bucket whose buffers fit in half of `free` bytes.
fn top_bucket(linears: &[(u64, usize, usize, Out)], head: u64, free: usize) -> Option<usize> {
    lt::BUCKETS
        .iter()
        .copied()
        .filter(|&b| {
            let (x, y) = bucket_bytes(linears, head, b);
            x + y <= free / 2
        })
        .max()
}

/// `len` 16-bit values of type `half`, uniform in [-1, 1): a block of 2^20 drawn from a fixed
/// seed, repeated. (Drawing an 8B bucket's 117M values one by one took the host 0.45 s at
/// every engine start; repeating a block takes about 0.13 s.)
fn random_halves(half: Half, len: usize) -> Vec<u16> {
    const BLOCK: usize = 1 << 20;
    let mut rng = StdRng::seed_from_u64(0);
    let block: Vec<u16> = (0..BLOCK.min(len))
        .map(|_| half.bits(rng.gen_range(-1.0f32..1.0)))
        .collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let n = (len - out.len()).min(block.len());
        out.extend_from_slice(&block[..n]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_inputs_fill_the_length_with_varied_values_in_range() {
        for len in [0, 5, (1 << 20) + 3] {
            let v = random_halves(Half::F16, len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&b| Half::F16.value(b).abs() <= 1.0));
        }
        let v = random_halves(Half::Bf16, 1000);
        let distinct: std::collections::HashSet<u16> = v.iter().copied().collect();
        assert!(distinct.len() > 500, "{} distinct values", distinct.len());
        assert!(v.iter().any(|&b| Half::Bf16.value(b) < 0.0));
    }
}
