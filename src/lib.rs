//! inflight: an LLM inference server where every pipeline stage is an actor.
//!
//! # Layout
//! - [`model`]: model configuration, weight loading (GGUF, safetensors) and the Llama
//!   forward pass with its paged KV cache.
//! - [`tokenizer`]: the HF tokenizers wrapper, built from GGUF metadata or tokenizer.json,
//!   and chat templates.
//! - [`kernels`]: numeric building blocks; the CPU implementations are the production CPU
//!   path and the twins of the CUDA kernels.
//! - [`sampling`]: turning logits into token ids (greedy, temperature, top-k, top-p).
//! - [`generate`]: a single-sequence generation loop used by `inflight generate`.
//! - [`fetch`]: fetching the default model.
//! - [`actors`]: the per-model actor tree (preprocess, scheduler, engine, sampler,
//!   postprocess, supervisor); [`handle`] is its library API.
//! - [`scheduler`]: the pure inflight-batching scheduler and KV block manager.
//! - [`request`], [`output`]: what clients send and receive, and how output is built.

#![warn(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]

pub mod actors;
pub mod bench;
pub mod config;
pub mod engines;
pub mod error;
pub mod fdlimit;
pub mod fetch;
pub mod fuzz_entry;
pub mod generate;
/// Developer GPU checks and profiles (`inflight gpu-check`, `gpu-logits`, `gpu-profile`),
/// built only with the `gpu-tools` feature: not part of the embedding API.
#[cfg(feature = "gpu-tools")]
#[doc(hidden)]
pub mod gpu_check;
pub mod grpc;
pub mod guide;
pub mod handle;
pub mod http;
pub mod kernels;
pub mod launch;
pub(crate) mod metrics;
pub mod model;
pub mod output;
pub mod repository;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod speculative;
pub mod tokenizer;

pub use error::{Error, Result};
pub use handle::{ModelHandle, ModelOptions, ResponseStream};
pub use request::{Chunk, FinishReason, GenerationParams, Prompt, Request};
