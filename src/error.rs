//! The crate's error type: one enum for loading, tokenizing and running models.

use std::path::PathBuf;

/// Everything that can go wrong below the HTTP layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A GGUF file that cannot be read; the message names the problem.
    #[error("GGUF: {0}")]
    Gguf(String),
    /// A safetensors checkpoint or its config.json that cannot be read.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A model whose configuration or tensors do not fit what we can run.
    #[error("model: {0}")]
    Model(String),
    /// A tokenizer that cannot be built, or text it cannot encode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template that does not parse or fails to render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A configuration file or flag that cannot be used.
    #[error("config: {0}")]
    Config(String),
    /// Fetching the default model failed.
    #[error("fetch: {0}")]
    Fetch(String),
    /// A CUDA driver, NVRTC or cuBLAS call failed (the GPU engine); the engine is restarted.
    #[error("cuda: {0}")]
    Cuda(String),
    /// A request that cannot be served as asked (bad parameters, prompt too long, ...).
    #[error("{0}")]
    InvalidRequest(String),
    /// A model repository that cannot be served (a model that does not load, no model).
    #[error("model repository: {0}")]
    Repository(String),
}

/// The crate's result type, [`Error`] by default.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Io`] on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
