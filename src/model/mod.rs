//! Model definitions and weight loading: config, GGUF and safetensors readers, the Llama
//! forward pass and its paged KV cache, and the pooling of its hidden states into
//! embeddings.

pub(crate) mod backend;
pub mod config;
pub mod device;
pub mod family;
pub mod fault;
pub mod gguf;
pub mod gguf_convert;
pub mod gguf_writer;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod kquant;
pub mod kquant_encode;
pub(crate) mod kv_cache;
pub(crate) mod layers;
pub(crate) mod llama;
pub(crate) mod loader;
pub mod pooling;
pub mod quant;
pub mod safetensors;
pub(crate) mod stage;
pub mod stored;
pub mod tiny;
pub(crate) mod weights;

pub use backend::{Backend, CpuBackend, ForwardPass, RowsOut};
pub use config::ModelConfig;
pub use device::Device;
pub use fault::Fault;
pub use kv_cache::KvCache;
pub use llama::{Llama, SeqChunk};
pub use loader::LoadedModel;
pub use pooling::Pooling;
