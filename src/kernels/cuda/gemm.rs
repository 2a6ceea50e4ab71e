//! Linear layers: bf16 or f16 operands, fp32 accumulation, fp32 or 16-bit output, or fp32
//! added to what y holds (the residual stream). cuBLAS (`cublasGemmEx`, `CUBLAS_COMPUTE_32F`)
//! in general; up to `GEMV_MAX_ROWS` token rows either cuBLAS or the weight-streaming
//! kernels of kernels/gemv.cu (at one row also its pipelined form), whichever
//! `Blas::tune` timed faster for that shape on this GPU; above that, the cuBLASLt
//! algorithm `Blas::tune_lt` timed fastest for the shape's row bucket, where one beat
//! `cublasGemmEx` (lt.rs).

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::cublas::{result, CudaBlas};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaFunction, CudaSlice};
use std::collections::HashMap;
use std::sync::Arc;

use super::gemv::{
    gemv_split, one_wave_pipelined, runnable_plans, GemvPlan, GEMV_MAX_ROWS, GEMV_WARPS,
};
use serde::{Deserialize, Serialize};

use super::launch;
use super::lt::{Lt, LtTuning, Tuned};
use super::{cuda_err, Gpu, Half};
use crate::error::{Error, Result};

/// cuBLAS's workspace, set once so that a captured pass never allocates.
const CUBLAS_WORKSPACE: usize = 32 << 20;

/// What a linear layer writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) enum Out {
    F32,
    /// The operands' 16-bit type.
    Half,
    /// fp32, added to what y holds (`y += x·wᵀ`, one fp32 add per element): the residual
    /// stream takes a layer's output without a pass of its own.
    F32Add,
}

impl Out {
    /// The cuBLAS `beta` for this output: 1 where y is added to.
    pub fn beta(self) -> f32 {
        if self == Out::F32Add {
            1.0
        } else {
            0.0
        }
    }

    /// Bytes per element of y.
    pub fn bytes(self) -> usize {
        if self == Out::Half {
            2
        } else {
            4
        }
    }
}

/// A linear layer's input normed on its way in: the RMSNorm of the fp32 rows `x` by the
/// fp32 weights `w` (launch::rms_norm's arithmetic). The GEMV kernel norms narrow rows
/// itself (`Blas::prepare`); otherwise rms_norm writes them into the 16-bit rows `xn`
/// first.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Norm {
    pub x: u64,
    pub w: u64,
    pub eps: f32,
    pub xn: u64,
    /// Whether, where rms_norm runs this norm ahead of a GEMV kernel, that kernel may launch
    /// before the norm's wait, so that its blocks request their weights a kernel earlier
    /// (norm.cu).
    pub early: bool,
}

/// What a linear layer reads.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Input {
    /// 16-bit rows.
    Rows(u64),
    Normed(Norm),
}

/// Which implementation runs a linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The fastest as timed at start: one of the GEMV kernels, cublasGemmEx or the row
    /// bucket's cuBLASLt algorithm; cublasGemmEx for untimed shapes.
    Auto,
    /// cublasGemmEx only (the baseline to compare with).
    Cublas,
    /// The GEMV kernel only, norming its input inside where it can (checks); an error for
    /// a shape it cannot run.
    Gemv,
    /// The row bucket's fastest cuBLASLt algorithm even where cublasGemmEx was faster
    /// (checks); cublasGemmEx where none was timed.
    CublasLt,
}

impl From<u64> for Input {
    fn from(x: u64) -> Input {
        Input::Rows(x)
    }
}

impl Input {
    /// The 16-bit rows the layer reads where nothing norms them in the kernel.
    fn rows(self) -> u64 {
        match self {
            Input::Rows(x) => x,
            Input::Normed(n) => n.xn,
        }
    }
}

/// A linear layer's shape, as [`Blas::tune`] keys its choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Shape {
    pub half: Half,
    pub n: usize,
    pub inp: usize,
    pub out: usize,
    pub y: Out,
}

/// Every choice [`Blas::tune`] and [`Blas::tune_lt`] made, for another [`Blas`] on the same
/// model and device to take ([`Blas::adopt`]): engines on one model then run the same
/// kernels, in the same summation order, without timing again.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Tuning {
    #[serde(with = "pairs")]
    by_shape: HashMap<Shape, Timed>,
    timed: Vec<Timed>,
    lt: LtTuning,
}

/// A map with struct keys as a list of (key, value) pairs (JSON keys are strings).
pub(crate) mod pairs {
    use std::collections::HashMap;
    use std::hash::Hash;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K, V, S>(map: &HashMap<K, V>, s: S) -> Result<S::Ok, S::Error>
    where
        K: Serialize,
        V: Serialize,
        S: Serializer,
    {
        s.collect_seq(map.iter())
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<HashMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Eq + Hash,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

/// One shape's timing: milliseconds per call on the GEMV kernels (at their fastest plan)
/// and on cuBLAS; [`Timed::run`] says which plan a layer runs.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct Timed {
    pub shape: Shape,
    pub gemv_ms: f64,
    pub cublas_ms: f64,
    /// The plan that gave `gemv_ms`.
    pub gemv: GemvPlan,
    /// The plain kernel's fastest split and its time: a layer that norms its rows inside
    /// the kernel runs that where `one_wave` is none, whichever plan won.
    pub plain_split: usize,
    pub plain_ms: f64,
    /// [`one_wave_pipelined`]'s plan and its time, where one was timed.
    pub one_wave: Option<(GemvPlan, f64)>,
}

impl Timed {
    /// Whether a GEMV kernel was timed faster than cuBLAS: the plan the layer runs
    /// ([`Timed::run`]).
    pub fn gemv_wins(&self, norms: bool) -> bool {
        self.run(norms).1 < self.cublas_ms
    }

    /// The plan a layer runs and its time. A layer that adds into the residual stream, or
    /// that norms its rows in the kernel (`norms`), runs the one-wave pipelined plan where
    /// one was timed, even where it timed slower: it is the faster in a decode step
    /// ([`one_wave_pipelined`]). Otherwise a norming layer runs the plain kernel's best (the
    /// only kernel that norms at other plans), and any other layer the fastest plan. (At one
    /// row cuBLAS times several times slower than any GEMV plan, so the one-wave choice
    /// never hands a layer to cuBLAS.)
    fn run(&self, norms: bool) -> (GemvPlan, f64) {
        match self.one_wave {
            Some(w) if norms || self.shape.y == Out::F32Add => w,
            _ if norms => (GemvPlan::plain(self.plain_split), self.plain_ms),
            _ => (self.gemv, self.gemv_ms),
        }
    }

    fn plan(&self, norms: bool) -> GemvPlan {
        self.run(norms).0
    }
}

/// A cuBLAS handle and the GEMV kernels, on the device's stream.
pub(crate) struct Blas {
    blas: CudaBlas,
    pub(super) gpu: Arc<Gpu>,
    /// The GEMV kernel built for bf16 and for f16.
    pub(super) gemv: [CudaFunction; 2],
    /// The pipelined one-row GEMV kernel built for bf16 and for f16, and its grid: as many
    /// of its blocks as the device holds at once (both builds take 64 registers, so the
    /// bf16 one's occupancy stands for both).
    pub(super) gemv_pipe: [CudaFunction; 2],
    pub(super) pipe_grid: usize,
    /// The pipelined kernel norming its row (gemv_pipe_norm), bf16 and f16; the same grid.
    pub(super) gemv_pipe_norm: [CudaFunction; 2],
    _workspace: CudaSlice<u8>,
    /// cuBLASLt, sharing the workspace.
    lt: Lt,
    /// Every shape [`Blas::tune`] timed; `Path::Auto` runs a GEMV kernel where one won.
    by_shape: HashMap<Shape, Timed>,
    /// The same, in the order timed.
    timed: Vec<Timed>,
}

impl Blas {
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        gpu.bind()?;
        // cudarc's loader panics when libcublas is missing: make that an error.
        let stream = gpu.stream.clone();
        let made = std::panic::catch_unwind(move || CudaBlas::new(stream))
            .map_err(|_| Error::Cuda("libcublas could not be loaded".into()))?;
        let blas = made.map_err(cuda_err("creating a cuBLAS handle"))?;
        let workspace = gpu
            .stream
            .alloc_zeros::<u8>(CUBLAS_WORKSPACE)
            .map_err(cuda_err("allocating the cuBLAS workspace"))?;
        let workspace_ptr = {
            use cudarc::driver::DevicePtr;
            let (ptr, _sync) = workspace.device_ptr(&gpu.stream);
            // SAFETY: the workspace lives as long as the handle (both in this struct) and is
            // only used by cuBLAS on this handle's stream.
            unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut _,
                    CUBLAS_WORKSPACE,
                )
            }
            .result()
            .map_err(cuda_err("setting the cuBLAS workspace"))?;
            ptr
        };
        // As above: a missing libcublasLt is an error, not a panic.
        let lt = std::panic::catch_unwind(|| Lt::new(workspace_ptr, CUBLAS_WORKSPACE))
            .map_err(|_| Error::Cuda("libcublasLt could not be loaded".into()))??;
        let gemv_pipe = [
            gpu.func("gemv_pipe", Half::Bf16)?.clone(),
            gpu.func("gemv_pipe", Half::F16)?.clone(),
        ];
        let sms = gpu
            .ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(cuda_err("reading the multiprocessor count"))?;
        let resident = gemv_pipe[0]
            .occupancy_max_active_blocks_per_multiprocessor(32 * GEMV_WARPS as u32, 0, None)
            .map_err(cuda_err("reading gemv_pipe's occupancy"))?;
        let pipe_grid = (sms.max(1) as usize) * (resident.max(1) as usize);
        let gemv_pipe_norm = [
            gpu.func("gemv_pipe_norm", Half::Bf16)?.clone(),
            gpu.func("gemv_pipe_norm", Half::F16)?.clone(),
        ];
        Ok(Blas {
            blas,
            gpu: gpu.clone(),
            gemv: [
                gpu.func("gemv", Half::Bf16)?.clone(),
                gpu.func("gemv", Half::F16)?.clone(),
            ],
            gemv_pipe,
            pipe_grid,
            gemv_pipe_norm,
            _workspace: workspace,
            lt,
            by_shape: HashMap::new(),
            timed: Vec::new(),
        })
    }

    /// Times the GEMV kernels at each plan, and cuBLAS, on `shape` (x, w, y device buffers
    /// big enough for it; their values do not matter) and keeps the fastest for
    /// [`Path::Auto`].
    pub fn tune(&mut self, shape: Shape, x: u64, w: u64, y: u64) -> Result<Timed> {
        self.tune_as(shape, x, w, y, false)
    }

    /// [`Blas::tune`] for the MLP's gate|up projection, as [`Blas::gate_up`] runs it: the
    /// GEMV applying SwiGLU as it writes, against cuBLAS followed by `silu_mul` (y big
    /// enough for both the product and the activation after it).
    pub fn tune_gate_up(&mut self, shape: Shape, x: u64, w: u64, y: u64) -> Result<Timed> {
        self.tune_as(shape, x, w, y, true)
    }

    fn tune_as(&mut self, shape: Shape, x: u64, w: u64, y: u64, swiglu: bool) -> Result<Timed> {
        let Shape {
            half,
            n,
            inp,
            out,
            y: y_ty,
        } = shape;
        let act = y + (n * out * y_ty.bytes()) as u64;
        // The GEMV kernels at each split they can run, the fastest kept: how many warps
        // share a pair of rows trades loads in flight a lane against blocks a
        // multiprocessor. The plain kernel's best is kept apart for layers that norm in it
        // where no one-wave pipelined plan exists.
        let (mut gemv_ms, mut gemv, mut plain_ms, mut plain_split) =
            (f64::INFINITY, GemvPlan::plain(1), f64::INFINITY, 1);
        let mut plans = Vec::new();
        if Self::gemv_fits(x, w, n, inp) {
            let into = if swiglu { act } else { y };
            for plan in runnable_plans(n, inp) {
                let ms = time_ms(&self.gpu, &mut || {
                    self.gemv(shape, x, w, into, swiglu, None, plan)
                })?;
                if ms < gemv_ms {
                    (gemv_ms, gemv) = (ms, plan);
                }
                if !plan.pipelined && ms < plain_ms {
                    (plain_ms, plain_split) = (ms, plan.split);
                }
                plans.push((plan, ms));
            }
        }
        let one_wave = one_wave_pipelined(&plans, out, self.pipe_grid);
        let cublas_ms = time_ms(&self.gpu, &mut || {
            self.gemm_ex(shape, x, w, y)?;
            if swiglu {
                launch::silu_mul(&self.gpu, half, y, act, n, out / 2)?;
            }
            Ok(())
        })?;
        let t = Timed {
            shape,
            gemv_ms,
            cublas_ms,
            gemv,
            plain_split,
            plain_ms,
            one_wave,
        };
        self.by_shape.insert(shape, t);
        self.timed.push(t);
        Ok(t)
    }

    /// Times `cublasGemmEx` and the cuBLASLt candidates on `shape` (its rows one of
    /// [`super::lt::BUCKETS`]; x, w, y device buffers big enough, values irrelevant) and
    /// keeps the fastest for calls in that bucket.
    pub fn tune_lt(&mut self, shape: Shape, x: u64, w: u64, y: u64) -> Result<Tuned> {
        let gemm_ex_ms = time_ms(&self.gpu, &mut || self.gemm_ex(shape, x, w, y))?;
        let gpu = self.gpu.clone();
        let stream = gpu.stream.cu_stream() as _;
        let time = |f: &mut dyn FnMut() -> Result<()>| time_ms(&gpu, f);
        self.lt.tune(shape, x, w, y, stream, gemm_ex_ms, &time)
    }

    /// Every (shape, row bucket) [`Blas::tune_lt`] timed, in order.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn timed_lt(&self) -> Vec<Tuned> {
        self.lt.tuned()
    }

    /// The choices made so far.
    pub fn tuning(&self) -> Tuning {
        Tuning {
            by_shape: self.by_shape.clone(),
            timed: self.timed.clone(),
            lt: self.lt.tuning(),
        }
    }

    /// Takes the choices another [`Blas`] made for the same model on the same device.
    pub fn adopt(&mut self, tuning: Tuning) {
        self.by_shape = tuning.by_shape;
        self.timed = tuning.timed;
        self.lt.adopt(tuning.lt);
    }

    /// Every shape [`Blas::tune`] timed, in order.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn timed(&self) -> &[Timed] {
        &self.timed
    }

    /// `y[n, out] = x[n, inp] · w[out, inp]ᵀ`, all row-major; x (16-bit rows, or normed on
    /// the way in: [`Input`]) and w of type `half`, y of type `y_ty`, on `path`
    /// (`Path::Gemv` where it cannot run is an error).
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        path: Path,
        half: Half,
        x: impl Into<Input>,
        w: u64,
        y: u64,
        y_ty: Out,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let shape = Shape {
            half,
            n,
            inp,
            out,
            y: y_ty,
        };
        self.linear_of(path, shape, x.into(), w, y)
    }

    fn linear_of(&self, path: Path, shape: Shape, x: Input, w: u64, y: u64) -> Result<()> {
        let gemv = self.runs_gemv(path, shape, x, w)?;
        let (x, norm) = self.prepare(path, gemv, shape, x)?;
        if gemv {
            let plan = self.plan_of(shape, norm.is_some());
            self.gemv(shape, x, w, y, false, norm, plan)
        } else {
            self.gemm(path, shape, x, w, y)
        }
    }

    /// The 16-bit rows a layer on `shape` reads, and the norm the GEMV kernel is to apply
    /// (`gemv`: it runs the shape): normed input the kernel cannot norm (too many values
    /// for its shared memory), should not ([`GEMV_NORM_MAX_AUTO`]; `Path::Gemv` norms in
    /// the kernel wherever it can) or that another path runs is normed here, by rms_norm.
    fn prepare(
        &self,
        path: Path,
        gemv: bool,
        shape: Shape,
        x: Input,
    ) -> Result<(u64, Option<Norm>)> {
        let in_kernel = gemv && Self::norms_in_kernel(path, shape);
        match x {
            Input::Rows(x) => Ok((x, None)),
            Input::Normed(norm) if in_kernel => Ok((norm.xn, Some(norm))),
            Input::Normed(norm) => {
                let (n, h) = (shape.n, shape.inp);
                // The early launch is for a GEMV kernel, which requests its weights before its
                // wait; cuBLAS's kernels wait for the norm's end either way.
                let early = norm.early && gemv;
                launch::rms_norm(
                    &self.gpu, shape.half, norm.x, norm.w, norm.xn, n, h, norm.eps, early,
                )?;
                Ok((norm.xn, None))
            }
        }
    }

    /// The MLP's gate|up projection of `n` rows `x` by `w`, whose `2 * f` rows interleave
    /// gate and up (gate i at row 2i, up i at 2i + 1), into `gu` (16-bit). Where the GEMV
    /// kernel runs it, the kernel applies SwiGLU as it writes, into `act` ([n, f], 16-bit),
    /// and this returns true; otherwise SwiGLU (launch::silu_mul) is still to run.
    #[allow(clippy::too_many_arguments)]
    pub fn gate_up(
        &self,
        path: Path,
        half: Half,
        x: Input,
        w: u64,
        (gu, act): (u64, u64),
        n: usize,
        inp: usize,
        f: usize,
    ) -> Result<bool> {
        if n == 0 {
            return Ok(true);
        }
        let shape = Shape {
            half,
            n,
            inp,
            out: 2 * f,
            y: Out::Half,
        };
        let gemv = self.runs_gemv(path, shape, x, w)?;
        let (x, norm) = self.prepare(path, gemv, shape, x)?;
        if gemv {
            let plan = self.plan_of(shape, norm.is_some());
            self.gemv(shape, x, w, act, true, norm, plan)?;
            return Ok(true);
        }
        self.gemm(path, shape, x, w, gu)?;
        Ok(false)
    }

    /// Whether `path` runs `shape`, reading `x`, on a GEMV kernel.
    fn runs_gemv(&self, path: Path, shape: Shape, x: Input, w: u64) -> Result<bool> {
        let fits = Self::gemv_fits(x.rows(), w, shape.n, shape.inp);
        let norms = matches!(x, Input::Normed(_)) && Self::norms_in_kernel(path, shape);
        Ok(match path {
            Path::Gemv if !fits => {
                return Err(Error::Cuda(format!(
                    "the GEMV kernel cannot run {} rows of {} inputs",
                    shape.n, shape.inp
                )))
            }
            Path::Gemv => true,
            Path::Cublas | Path::CublasLt => false,
            Path::Auto => {
                fits && self
                    .by_shape
                    .get(&shape)
                    .is_some_and(|t| t.gemv_wins(norms))
            }
        })
    }

    /// How the GEMV kernel runs `shape`: the plan [`Timed::run`] gives for it, the kernel
    /// norming the rows itself or not (`normed`) ([`Blas::tune`]; shapes where cuBLAS won,
    /// run here by `Path::Gemv`, keep theirs too); untimed, [`gemv_split`]'s split on the
    /// plain kernel.
    fn plan_of(&self, shape: Shape, normed: bool) -> GemvPlan {
        let timed = self.by_shape.get(&shape).filter(|t| t.gemv_ms.is_finite());
        timed.map_or_else(
            || GemvPlan::plain(gemv_split(shape.inp, shape.out.div_ceil(2))),
            |t| t.plan(normed),
        )
    }

    /// The cuBLAS paths of [`Blas::linear`]: the bucket's cuBLASLt algorithm where one was
    /// timed faster (`Path::Auto`) or timed at all (`Path::CublasLt`), else `cublasGemmEx`.
    fn gemm(&self, path: Path, shape: Shape, x: u64, w: u64, y: u64) -> Result<()> {
        if shape.n > GEMV_MAX_ROWS && path != Path::Cublas {
            let stream = self.gpu.stream.cu_stream() as _;
            if self
                .lt
                .matmul(shape, path == Path::CublasLt, (x, w, y), stream)?
            {
                return Ok(());
            }
        }
        self.gemm_ex(shape, x, w, y)
    }

    fn gemm_ex(&self, shape: Shape, x: u64, w: u64, y: u64) -> Result<()> {
        self.gemm_ex_ld(shape, x, w, y, shape.out)
    }

    /// `y[n, ..out] = x[n, inp] · w[out, inp]ᵀ` with y's rows `ldy` elements apart: a
    /// layer's output columns from a panel of its weight rows (qgemm.rs), on cublasGemmEx.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_strided(
        &self,
        half: Half,
        x: u64,
        w: u64,
        y: u64,
        y_ty: Out,
        n: usize,
        inp: usize,
        out: usize,
        ldy: usize,
    ) -> Result<()> {
        let shape = Shape {
            half,
            n,
            inp,
            out,
            y: y_ty,
        };
        self.gemm_ex_ld(shape, x, w, y, ldy)
    }

    fn gemm_ex_ld(&self, shape: Shape, x: u64, w: u64, y: u64, ldy: usize) -> Result<()> {
        let Shape {
            half,
            n,
            inp,
            out,
            y: y_ty,
        } = shape;
        let dim = |v: usize| {
            i32::try_from(v).map_err(|_| Error::Cuda(format!("GEMM dimension {v} too large")))
        };
        let (m, nn, k, ldc) = (dim(out)?, dim(n)?, dim(inp)?, dim(ldy)?);
        let (alpha, beta) = (1.0f32, y_ty.beta());
        let ty = match half {
            Half::Bf16 => cudaDataType_t::CUDA_R_16BF,
            Half::F16 => cudaDataType_t::CUDA_R_16F,
        };
        // Row-major y = x·wᵀ is column-major yᵀ = w·xᵀ with w read transposed.
        // SAFETY: the pointers are live device buffers of at least out·inp, n·inp and
        // (n - 1)·ldy + out elements, on the handle's stream.
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m,
                nn,
                k,
                (&alpha) as *const f32 as *const _,
                w as *const _,
                ty,
                k,
                x as *const _,
                ty,
                k,
                (&beta) as *const f32 as *const _,
                y as *mut _,
                match y_ty {
                    Out::F32 | Out::F32Add => cudaDataType_t::CUDA_R_32F,
                    Out::Half => ty,
                },
                ldc,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(cuda_err("cublasGemmEx"))
    }
}

/// Milliseconds per run of `f`: one untimed run, then REPS between two events.
pub(crate) fn time_ms(gpu: &Gpu, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    const REPS: usize = 5;
    f()?;
    let event = || {
        gpu.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("creating an event"))
    };
    let (a, b) = (event()?, event()?);
    a.record(&gpu.stream)
        .map_err(cuda_err("recording an event"))?;
    for _ in 0..REPS {
        f()?;
    }
    b.record(&gpu.stream)
        .map_err(cuda_err("recording an event"))?;
    let ms = a.elapsed_ms(&b).map_err(cuda_err("reading an event"))?;
    Ok(f64::from(ms) / REPS as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_norming_in_the_kernel_runs_the_one_wave_plan_where_there_is_one() {
        // SmolLM2-135M's qkv at one row: the plain kernel timed fastest.
        let shape = Shape {
            half: Half::F16,
            n: 1,
            inp: 576,
            out: 960,
            y: Out::Half,
        };
        let pipe = |split| GemvPlan {
            split,
            pipelined: true,
        };
        let mut t = Timed {
            shape,
            gemv_ms: 0.003,
            cublas_ms: 0.02,
            gemv: GemvPlan::plain(2),
            plain_split: 2,
            plain_ms: 0.003,
            one_wave: Some((pipe(2), 0.004)),
        };
        assert_eq!(t.plan(true), pipe(2));
        assert_eq!(t.plan(false), GemvPlan::plain(2));
        // Without a one-wave plan, the plain kernel's best, even where a pipelined plan was
        // chosen (a multi-wave one).
        t.one_wave = None;
        t.gemv = pipe(4);
        assert_eq!(t.plan(true), GemvPlan::plain(2));
        assert_eq!(t.plan(false), pipe(4));
        // cuBLAS is weighed against the time of the plan the layer runs.
        t.one_wave = Some((pipe(2), 0.03));
        assert!(!t.gemv_wins(true));
        assert!(t.gemv_wins(false));
    }

    #[test]
    fn a_residual_layer_runs_the_one_wave_plan_where_there_is_one() {
        // Llama-3.2-1B's o at one row: the plain kernel timed fastest.
        let shape = Shape {
            half: Half::F16,
            n: 1,
            inp: 2048,
            out: 2048,
            y: Out::F32Add,
        };
        let pipe = GemvPlan {
            split: 4,
            pipelined: true,
        };
        let mut t = Timed {
            shape,
            gemv_ms: 0.0039,
            cublas_ms: 0.0219,
            gemv: GemvPlan::plain(4),
            plain_split: 4,
            plain_ms: 0.0039,
            one_wave: Some((pipe, 0.0044)),
        };
        assert_eq!(t.plan(false), pipe);
        assert!(t.gemv_wins(false));
        // Without one, the fastest plan; and a 16-bit output keeps the fastest regardless.
        t.one_wave = None;
        assert_eq!(t.plan(false), GemvPlan::plain(4));
        t.one_wave = Some((pipe, 0.0044));
        t.shape.y = Out::Half;
        assert_eq!(t.plan(false), GemvPlan::plain(4));
    }
}
