//! Linear layers through cuBLAS: bf16 or f16 operands, fp32 accumulation and fp32 output
//! (`cublasGemmEx`, `CUBLAS_COMPUTE_32F`).

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::cublas::{result, CudaBlas};

use super::{cuda_err, Gpu, Half};
use crate::error::{Error, Result};

/// A cuBLAS handle on the device's stream.
pub struct Blas {
    blas: CudaBlas,
}

impl Blas {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        gpu.bind()?;
        // cudarc's loader panics when libcublas is missing: make that an error.
        let stream = gpu.stream.clone();
        let made = std::panic::catch_unwind(move || CudaBlas::new(stream))
            .map_err(|_| Error::Cuda("libcublas could not be loaded".into()))?;
        let blas = made.map_err(cuda_err("creating a cuBLAS handle"))?;
        Ok(Blas { blas })
    }

    /// `y[n, out] = x[n, inp] · w[out, inp]ᵀ`, all row-major; x and w of type `half`,
    /// y fp32.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        half: Half,
        x: u64,
        w: u64,
        y: u64,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let dim = |v: usize| {
            i32::try_from(v).map_err(|_| Error::Cuda(format!("GEMM dimension {v} too large")))
        };
        let (m, nn, k) = (dim(out)?, dim(n)?, dim(inp)?);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ty = match half {
            Half::Bf16 => cudaDataType_t::CUDA_R_16BF,
            Half::F16 => cudaDataType_t::CUDA_R_16F,
        };
        // Row-major y = x·wᵀ is column-major yᵀ = w·xᵀ with w read transposed.
        // SAFETY: the pointers are live device buffers of at least out·inp, n·inp and
        // n·out elements, on the handle's stream.
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
                cudaDataType_t::CUDA_R_32F,
                m,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(cuda_err("cublasGemmEx"))
    }
}
