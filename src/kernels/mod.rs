//! Numeric kernels. `cpu` holds the CPU implementations: the production CPU path and the
//! twins the CUDA kernels are tested against.

pub mod cpu;
pub mod matmul;
pub mod parallel;
pub mod qmatmul;
