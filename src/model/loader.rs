//! Loads a model and its tokenizer together from a GGUF file or an HF checkpoint folder.

use std::path::Path;

use super::device::Device;
use super::gguf::GgufFile;
use super::llama::Llama;
use crate::error::{Error, Result};
use crate::tokenizer::{GgufVocab, Tokenizer};

/// A runnable model: weights, tokenizer, and the name it is served under.
pub struct LoadedModel {
    /// The weights, on the host.
    pub model: Llama,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The file or folder name without its extension.
    pub name: String,
}

/// The weights at `path` (a `.gguf` file or a checkpoint folder), for an engine on `device`.
/// On a GPU a checkpoint's 16-bit matrices stay in their memory maps for the upload.
pub fn load_weights(path: &Path, device: Device) -> Result<Llama> {
    match device {
        Device::Cpu => Llama::load(path),
        Device::Cuda(_) => Llama::load_mapped(path),
    }
}

impl LoadedModel {
    /// `path` is a `.gguf` file (tokenizer from its metadata) or a folder with config.json,
    /// safetensors and tokenizer.json.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_for(path, Device::Cpu)
    }

    /// [`LoadedModel::load`] for an engine on `device` ([`load_weights`]).
    pub fn load_for(path: &Path, device: Device) -> Result<Self> {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        if path.is_dir() {
            let tok_json = path.join("tokenizer.json");
            if !tok_json.exists() {
                return Err(Error::Tokenizer(format!(
                    "{} has no tokenizer.json",
                    path.display()
                )));
            }
            let tok_cfg = path.join("tokenizer_config.json");
            let tokenizer =
                Tokenizer::from_files(&tok_json, tok_cfg.exists().then_some(tok_cfg.as_path()))?;
            let model = load_weights(path, device)?;
            Ok(LoadedModel {
                model,
                tokenizer,
                name,
            })
        } else {
            let file = GgufFile::open(path)?;
            let tokenizer = Tokenizer::from_gguf_vocab(&GgufVocab::from_gguf(&file)?)?;
            let model = Llama::from_gguf(&file)?;
            Ok(LoadedModel {
                model,
                tokenizer,
                name,
            })
        }
    }
}
