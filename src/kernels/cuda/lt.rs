//! cuBLASLt matmuls for the linear layers at more than a few token rows: for each layer
//! shape and each row bucket ([`BUCKETS`]), the heuristic's candidate algorithms are timed
//! against `cublasGemmEx` once at start and the fastest is kept; a call takes its bucket's
//! choice (the bucket at or above its row count). Descriptors are built once per
//! exact shape and cached. An algorithm that refuses a row count it was not timed at sends
//! that shape back to `cublasGemmEx` for good.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    self, cublasComputeType_t, cublasLtMatmulAlgo_t, cublasLtMatmulDescAttributes_t,
    cublasLtMatmulHeuristicResult_t, cublasLtMatmulPreferenceAttributes_t, cudaDataType,
};

use super::gemm::{Out, Shape};
use super::Half;
use crate::error::{Error, Result};

/// Runs a call `REPS` times between two events and returns ms per run.
pub type Timer<'a> = dyn Fn(&mut dyn FnMut() -> Result<()>) -> Result<f64> + 'a;

/// Candidate algorithms asked of the heuristic per shape.
const CANDIDATES: usize = 8;
/// Row buckets tuned at start; calls above the largest use cublasGemmEx. A call runs its
/// bucket's algorithm, whose tiles were chosen for the bucket's row count, so a call pays
/// for the rows up to its bucket. From 32 to 2,048 rows there are four buckets to an octave
/// (32, 40, 48, 56, 64, 80, ...), so a call pays for at most a quarter more rows than it
/// has: with powers of two, 170 decode rows ran on 256 rows' tiles, their linear layers a
/// quarter slower than cublasGemmEx chose for 170. Past 2,048 rows the last tile is a small
/// share of a call and powers of two suffice.
pub const BUCKETS: [usize; 28] = [
    16, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768,
    896, 1024, 1280, 1536, 1792, 2048, 4096, 8192,
];

/// The bucket a call of `n` rows takes: the smallest at or above it.
pub fn bucket(n: usize) -> Option<usize> {
    BUCKETS.iter().copied().find(|&b| b >= n)
}

fn lt_err(what: &'static str) -> impl Fn(lt::CublasError) -> Error {
    move |e| Error::Cuda(format!("{what}: {e:?}"))
}

/// A matmul's descriptors: `y[n, out] = x[n, inp] · w[out, inp]ᵀ` (row-major), which is
/// column-major `yᵀ = w·xᵀ` with w read transposed.
struct Descs {
    desc: sys::cublasLtMatmulDesc_t,
    w: sys::cublasLtMatrixLayout_t,
    x: sys::cublasLtMatrixLayout_t,
    y: sys::cublasLtMatrixLayout_t,
    /// 1 where y is added to ([`Out::F32Add`]), else 0.
    beta: f32,
}

// SAFETY: the descriptors are plain host objects owned by this value; cuBLASLt does not
// tie them to a thread.
unsafe impl Send for Descs {}

impl Descs {
    fn new(shape: Shape) -> Result<Descs> {
        let ty = match shape.half {
            Half::Bf16 => cudaDataType::CUDA_R_16BF,
            Half::F16 => cudaDataType::CUDA_R_16F,
        };
        let y_ty = match shape.y {
            Out::F32 | Out::F32Add => cudaDataType::CUDA_R_32F,
            Out::Half => ty,
        };
        let (n, k, m) = (shape.n as u64, shape.inp as u64, shape.out as u64);
        let desc = lt::create_matmul_desc(
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_err("cublasLtMatmulDescCreate"))?;
        let transpose = cublasOperation_t::CUBLAS_OP_T;
        // SAFETY: desc was just created; the attribute is a cublasOperation_t passed by
        // address with its size.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&transpose) as *const _ as *const c_void,
                std::mem::size_of::<cublasOperation_t>(),
            )
        }
        .map_err(lt_err("cublasLtMatmulDescSetAttribute"))?;
        let w = lt::create_matrix_layout(ty, k, m, k as i64);
        let x = lt::create_matrix_layout(ty, k, n, k as i64);
        let y = lt::create_matrix_layout(y_ty, m, n, m as i64);
        match (w, x, y) {
            (Ok(w), Ok(x), Ok(y)) => Ok(Descs {
                desc,
                w,
                x,
                y,
                beta: shape.y.beta(),
            }),
            (w, x, y) => {
                let made = Descs {
                    desc,
                    w: w.unwrap_or(std::ptr::null_mut()),
                    x: x.unwrap_or(std::ptr::null_mut()),
                    y: y.unwrap_or(std::ptr::null_mut()),
                    beta: 0.0,
                };
                drop(made);
                Err(Error::Cuda("cublasLtMatrixLayoutCreate failed".into()))
            }
        }
    }
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each descriptor is owned by this value and destroyed once; null ones
        // (a failed creation) are skipped.
        unsafe {
            for l in [self.w, self.x, self.y] {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// What a bucket's timing found: the fastest cuBLASLt algorithm (None when none ran), and
/// whether it beat `cublasGemmEx`.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct Tuned {
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub shape: Shape,
    pub gemm_ex_ms: f64,
    pub lt_ms: f64,
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub candidates: usize,
    /// The algorithm's opaque words, as cuBLASLt filled them (valid for the same library
    /// version and device, which the tuning cache's key holds).
    #[serde(with = "algo_words")]
    algo: Option<cublasLtMatmulAlgo_t>,
}

/// A cuBLASLt algorithm as its eight words.
mod algo_words {
    use cudarc::cublaslt::sys::cublasLtMatmulAlgo_t;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(
        a: &Option<cublasLtMatmulAlgo_t>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        a.map(|a| a.data).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<cublasLtMatmulAlgo_t>, D::Error> {
        Ok(Option::<[u64; 8]>::deserialize(d)?.map(|data| cublasLtMatmulAlgo_t { data }))
    }
}

impl Tuned {
    pub fn uses_lt(&self) -> bool {
        self.algo.is_some() && self.lt_ms < self.gemm_ex_ms
    }
}

/// The choices of [`Lt::tune`]: per (shape at bucket rows), in the order timed.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct LtTuning {
    #[serde(with = "super::gemm::pairs")]
    tuned: HashMap<Shape, Tuned>,
    order: Vec<Shape>,
}

/// The cuBLASLt handle, the choices per (shape at bucket rows), and the descriptors per
/// exact shape.
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: u64,
    workspace_bytes: usize,
    tuning: LtTuning,
    /// Descriptors of each exact shape called, None once its algorithm refused it.
    calls: Mutex<HashMap<Shape, Option<Descs>>>,
}

// SAFETY: the handle is used from one thread at a time (the engine's, through &mut or the
// calls mutex), on one stream.
unsafe impl Send for Lt {}

impl Lt {
    /// A handle that uses `workspace_bytes` at device address `workspace` (shared with
    /// cuBLAS on the same stream).
    pub fn new(workspace: u64, workspace_bytes: usize) -> Result<Lt> {
        let handle = lt::create_handle().map_err(lt_err("cublasLtCreate"))?;
        Ok(Lt {
            handle,
            workspace,
            workspace_bytes,
            tuning: LtTuning::default(),
            calls: Mutex::new(HashMap::new()),
        })
    }

    /// The heuristic's candidate algorithms for the matmul `d` describes.
    fn candidates(&self, d: &Descs) -> Result<Vec<cublasLtMatmulAlgo_t>> {
        let pref = lt::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
        let bytes = self.workspace_bytes as u64;
        let mut results = [cublasLtMatmulHeuristicResult_t {
            algo: cublasLtMatmulAlgo_t { data: [0; 8] },
            workspaceSize: 0,
            state: sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS,
            wavesCount: 0.0,
            reserved: [0; 4],
        }; CANDIDATES];
        let mut count = 0i32;
        // SAFETY: pref and the descriptors are live; results holds CANDIDATES entries.
        let status = unsafe {
            let set = lt::set_matmul_pref_attribute(
                pref,
                cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&bytes) as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            );
            let got = sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                d.desc,
                d.w,
                d.x,
                d.y,
                d.y,
                pref,
                CANDIDATES as i32,
                results.as_mut_ptr(),
                &mut count,
            );
            let _ = lt::destroy_matmul_pref(pref);
            set.map(|_| got)
        }
        .map_err(lt_err("cublasLtMatmulPreferenceSetAttribute"))?;
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Ok(Vec::new());
        }
        Ok(results[..count.clamp(0, CANDIDATES as i32) as usize]
            .iter()
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .filter(|r| r.workspaceSize <= self.workspace_bytes)
            .map(|r| r.algo)
            .collect())
    }

    /// Runs one matmul with `algo` (`d` built for the shape).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        d: &Descs,
        algo: &cublasLtMatmulAlgo_t,
        x: u64,
        w: u64,
        y: u64,
        stream: sys::cudaStream_t,
    ) -> std::result::Result<(), lt::CublasError> {
        let (alpha, beta) = (1.0f32, d.beta);
        // SAFETY: the descriptors match the buffers' shapes and types (the caller's
        // contract, as for cublasGemmEx); the workspace is live for the handle's life.
        unsafe {
            lt::matmul(
                self.handle,
                d.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                w as *const c_void,
                d.w,
                x as *const c_void,
                d.x,
                y as *const c_void,
                d.y,
                y as *mut c_void,
                d.y,
                algo,
                self.workspace as *mut c_void,
                self.workspace_bytes,
                stream,
            )
        }
    }

    /// Times the heuristic's candidates for `shape` (rows = a bucket) with `time`, which
    /// runs a closure `reps` times between events and returns ms per run, against
    /// `gemm_ex_ms`, and keeps the winner.
    #[allow(clippy::too_many_arguments)]
    pub fn tune(
        &mut self,
        shape: Shape,
        x: u64,
        w: u64,
        y: u64,
        stream: sys::cudaStream_t,
        gemm_ex_ms: f64,
        time: &Timer,
    ) -> Result<Tuned> {
        let d = Descs::new(shape)?;
        let algos = self.candidates(&d)?;
        let (mut best, mut best_ms) = (None, f64::INFINITY);
        for algo in &algos {
            let mut call = || {
                self.run(&d, algo, x, w, y, stream)
                    .map_err(lt_err("cublasLtMatmul"))
            };
            // An algorithm that fails here is skipped.
            if let Ok(ms) = time(&mut call) {
                if ms < best_ms {
                    best_ms = ms;
                    best = Some(*algo);
                }
            }
        }
        let t = Tuned {
            shape,
            gemm_ex_ms,
            lt_ms: best_ms,
            candidates: algos.len(),
            algo: best,
        };
        self.tuning.tuned.insert(shape, t);
        self.tuning.order.push(shape);
        Ok(t)
    }

    /// The choices made so far.
    pub fn tuning(&self) -> LtTuning {
        self.tuning.clone()
    }

    /// Takes the choices another handle made for the same model on the same device.
    pub fn adopt(&mut self, tuning: LtTuning) {
        self.tuning = tuning;
    }

    /// Every tuned (shape, bucket), in order.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn tuned(&self) -> Vec<Tuned> {
        self.tuning
            .order
            .iter()
            .filter_map(|s| self.tuning.tuned.get(s))
            .copied()
            .collect()
    }

    /// Runs `shape` on its bucket's cuBLASLt algorithm where that beat cublasGemmEx (or,
    /// with `always`, wherever one was timed); false when it did not run (none, or it
    /// refused this row count), so the caller runs cublasGemmEx.
    pub fn matmul(
        &self,
        shape: Shape,
        always: bool,
        (x, w, y): (u64, u64, u64),
        stream: sys::cudaStream_t,
    ) -> Result<bool> {
        let Some(b) = bucket(shape.n) else {
            return Ok(false);
        };
        let Some(t) = self.tuning.tuned.get(&Shape { n: b, ..shape }) else {
            return Ok(false);
        };
        let Some(algo) = t.algo.filter(|_| always || t.uses_lt()) else {
            return Ok(false);
        };
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if let std::collections::hash_map::Entry::Vacant(e) = calls.entry(shape) {
            e.insert(Some(Descs::new(shape)?));
        }
        let ran = match calls.get(&shape) {
            Some(Some(d)) => self.run(d, &algo, x, w, y, stream).is_ok(),
            _ => return Ok(false),
        };
        if !ran {
            calls.insert(shape, None);
        }
        Ok(ran)
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        self.calls
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        // SAFETY: the handle is owned by this value and destroyed once, after every
        // descriptor.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_take_the_bucket_at_or_above() {
        assert_eq!(bucket(5), Some(16));
        assert_eq!(bucket(16), Some(16));
        assert_eq!(bucket(17), Some(32));
        assert_eq!(bucket(170), Some(192));
        assert_eq!(bucket(489), Some(512));
        assert_eq!(bucket(1537), Some(1792));
        assert_eq!(bucket(2048), Some(2048));
        assert_eq!(bucket(2049), Some(4096));
        assert_eq!(bucket(8193), None);
        // Ascending, each at most a quarter above the one before from 32 to 2,048.
        for pair in BUCKETS.windows(2) {
            assert!(pair[0] < pair[1]);
            if (32..2048).contains(&pair[0]) {
                assert!(4 * pair[1] <= 5 * pair[0], "{pair:?}");
            }
        }
    }

    #[test]
    fn choices_survive_a_round_trip_through_json() {
        let shape = Shape {
            half: crate::kernels::cuda::Half::F16,
            n: 64,
            inp: 4096,
            out: 6144,
            y: crate::kernels::cuda::gemm::Out::F32Add,
        };
        let mut tuning = LtTuning::default();
        for (i, algo) in [Some([1u64, 2, 3, 4, 5, 6, 7, u64::MAX]), None]
            .into_iter()
            .enumerate()
        {
            let s = Shape {
                n: 64 << i,
                ..shape
            };
            tuning.order.push(s);
            tuning.tuned.insert(
                s,
                Tuned {
                    shape: s,
                    gemm_ex_ms: 0.25,
                    lt_ms: 0.125,
                    candidates: 7,
                    algo: algo.map(|data| cublasLtMatmulAlgo_t { data }),
                },
            );
        }
        let back: LtTuning = serde_json::from_slice(&serde_json::to_vec(&tuning).unwrap()).unwrap();
        assert_eq!(back.order, tuning.order);
        for s in &tuning.order {
            let (a, b) = (&tuning.tuned[s], &back.tuned[s]);
            assert_eq!(a.algo.map(|a| a.data), b.algo.map(|b| b.data));
            assert_eq!(
                (a.shape, a.lt_ms, a.uses_lt()),
                (b.shape, b.lt_ms, b.uses_lt())
            );
        }
    }
}
