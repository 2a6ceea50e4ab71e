//! Numeric kernels. `cpu` holds the CPU implementations: the production CPU path and the
//! twins the CUDA kernels are tested against; `cuda` (feature `cuda`) the GPU launchers.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod matmul;
pub(crate) mod parallel;
pub mod qmatmul;
