//! The models a server serves: one (`inflight serve`), or every model folder of a model
//! repository (`inflight serve --model-repository DIR`), each its own actor tree, loaded
//! and unloaded at run time as Triton's explicit model control does it. [`Models`] is
//! what the HTTP and gRPC front ends route requests through.
//!
//! A repository holds one folder per model: `DIR/<name>/config.toml` (optional: the
//! `[model]` and `[speculative]` tables of a serve config, no `[server]`) and the model
//! itself, either in the folder (config.json + safetensors + tokenizer.json, or one
//! `.gguf`) or where the config's `[model] path` points (relative to the folder).

pub mod registry;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::{ServeConfig, ServerSection, TritonNames};
use crate::error::{Error, Result};
use crate::handle::ModelHandle;
use registry::Registry;
pub use registry::{ChangeError, IndexRow, ModelKind, Names, RouteError, State};

/// The name of TensorRT-LLM's ensemble model in Triton's layout (text in, text out).
pub const ENSEMBLE: &str = "ensemble";
/// The BLS model's name (text in, text out).
pub const BLS: &str = "tensorrt_llm_bls";
/// The core model's name (token ids in and out).
pub const CORE: &str = "tensorrt_llm";

/// The config file of a repository's model folder.
pub const MODEL_CONFIG: &str = "config.toml";

/// Every model of the server and its state.
pub struct Models {
    registry: RwLock<Registry<ModelHandle>>,
    /// Where models are loaded from; None for a server of one model.
    repository: Option<Repository>,
}

struct Repository {
    dir: PathBuf,
    /// The server's settings (the device among them), which every model runs under.
    server: ServerSection,
}

/// The names a model answers to: its own, then the Triton layout names `triton` gives it.
fn names_of(model: &str, triton: &TritonNames) -> Names {
    let mut v = vec![(model.to_string(), ModelKind::Text)];
    let roles = [
        (&triton.ensemble, ModelKind::Text),
        (&triton.tensorrt_llm_bls, ModelKind::Text),
        (&triton.tensorrt_llm, ModelKind::Ids),
    ];
    for (name, kind) in roles {
        if let Some(n) = name.as_ref().filter(|n| *n != model) {
            v.push((n.clone(), kind));
        }
    }
    Names(v)
}

impl Models {
    /// A server of the one model `handle`, answering to its own name and to `triton`'s
    /// (None: Triton's three default names).
    pub fn single(handle: ModelHandle, triton: Option<&TritonNames>) -> Self {
        let standard = TritonNames::standard();
        let names = names_of(handle.name(), triton.unwrap_or(&standard));
        let model = handle.name().to_string();
        let mut registry = Registry::new();
        // A fresh registry holds no other model's names: neither step can be refused.
        let _ = registry.begin_load(&model, names.clone());
        registry.finish_load(&model, names, Ok(handle));
        Models {
            registry: RwLock::new(registry),
            repository: None,
        }
    }

    /// Every model folder of `dir`, each loaded in turn under `server`'s settings; the
    /// first that fails to load fails the start, naming it.
    pub async fn open(dir: &Path, server: &ServerSection) -> Result<Arc<Self>> {
        let models = Arc::new(Models {
            registry: RwLock::new(Registry::new()),
            repository: Some(Repository {
                dir: dir.to_path_buf(),
                server: server.clone(),
            }),
        });
        let folders = model_folders(dir)?;
        if folders.is_empty() {
            return Err(Error::Repository(format!(
                "{} has no model folder",
                dir.display()
            )));
        }
        for name in folders {
            models
                .load_now(&name)
                .await
                .map_err(|e| Error::Repository(e.to_string()))?;
        }
        Ok(models)
    }

    /// The serving model behind `name` and the kind of input the name takes.
    pub fn route(&self, name: &str) -> std::result::Result<(ModelHandle, ModelKind), RouteError> {
        self.read().route(name)
    }

    /// The repository index: every model (and, with `aliases`, every other name it
    /// answers to) with its state.
    pub fn index(&self, aliases: bool) -> Vec<IndexRow> {
        self.read().index(aliases)
    }

    /// The composing (token-ids) name of a text name's model, if it has one.
    pub fn composing_of(&self, name: &str) -> Option<String> {
        self.read().composing_of(name)
    }

    /// Every name a model answers to.
    pub fn names(&self) -> Vec<String> {
        self.read().names()
    }

    /// The serving instances, with their model names and the names they answer to.
    pub fn serving(&self) -> Vec<(String, Names, ModelHandle)> {
        self.read().serving()
    }

    /// The one serving model, where a route that names none may use it; None when none
    /// or several serve.
    pub fn only(&self) -> Option<ModelHandle> {
        let mut serving = self.serving();
        (serving.len() == 1).then(|| serving.remove(0).2)
    }

    /// A serving model whose device could not be recovered, and why: the server cannot
    /// serve it again in this process.
    pub fn lost(&self) -> Option<(String, String)> {
        self.serving()
            .into_iter()
            .find_map(|(name, _, h)| h.lost().map(|why| (name, why)))
    }

    /// Server readiness: every model not unloaded on purpose serves and is ready.
    pub fn is_ready(&self) -> bool {
        let r = self.read();
        r.all_ready() && r.serving().iter().all(|(_, _, h)| h.is_ready())
    }

    /// Loads the repository's model `model` from its folder (reading its config anew): a
    /// model that serves keeps serving until the new instance is ready, then that one
    /// serves and the old one is drained in the background. The load runs to its end in
    /// a task of its own, even when the caller stops waiting (a client gone, a deadline).
    pub async fn load(self: &Arc<Self>, model: &str) -> std::result::Result<(), ChangeError> {
        let (me, m) = (self.clone(), model.to_string());
        tokio::spawn(async move { me.load_now(&m).await })
            .await
            .unwrap_or_else(|e| {
                Err(ChangeError::Refused(format!(
                    "the load of '{model}' stopped: {e}"
                )))
            })
    }

    async fn load_now(self: &Arc<Self>, model: &str) -> std::result::Result<(), ChangeError> {
        let Some(repo) = &self.repository else {
            return Err(single_model("load"));
        };
        let folder = model_folder(&repo.dir, model)?;
        let cfg = model_config(&folder, &repo.server)
            .map_err(|e| ChangeError::Refused(format!("failed to load '{model}': {e}")))?;
        let names = names_of(
            model,
            cfg.model
                .triton_names
                .as_ref()
                .unwrap_or(&TritonNames::default()),
        );
        self.write().begin_load(model, names.clone())?;
        let path = cfg.model_path();
        let started = crate::launch::start(cfg, path, Some(model.to_string())).await;
        let started = started.map_err(|e| format!("failed to load '{model}': {e}"));
        let failed = started.as_ref().err().cloned();
        let old = self.write().finish_load(model, names, started);
        if let Some(why) = failed {
            tracing::warn!("{why}");
            return Err(ChangeError::Refused(why));
        }
        tracing::info!(model, "loaded");
        if let Some(old) = old {
            // The new instance serves; the old one finishes its requests meanwhile.
            let (me, m) = (self.clone(), model.to_string());
            tokio::spawn(async move { me.drain(&m, old).await });
        }
        Ok(())
    }

    /// Takes `model` out of service: its names stop routing at once; the requests it is
    /// running finish (within the server's shutdown timeout) before this returns. The
    /// drain runs to its end in a task of its own, even when the caller stops waiting.
    pub async fn unload(self: &Arc<Self>, model: &str) -> std::result::Result<(), ChangeError> {
        let (me, m) = (self.clone(), model.to_string());
        tokio::spawn(async move { me.unload_now(&m).await })
            .await
            .unwrap_or_else(|e| {
                Err(ChangeError::Refused(format!(
                    "the unload of '{model}' stopped: {e}"
                )))
            })
    }

    async fn unload_now(&self, model: &str) -> std::result::Result<(), ChangeError> {
        if self.repository.is_none() {
            return Err(single_model("unload"));
        }
        let old = self.write().unload(model)?;
        if let Some(old) = old {
            self.drain(model, old).await;
            tracing::info!(model, "unloaded");
        }
        Ok(())
    }

    /// Lets `old` finish its running requests (within the shutdown timeout), stops it
    /// and forgets it.
    async fn drain(&self, model: &str, old: ModelHandle) {
        let timeout = self
            .repository
            .as_ref()
            .map_or(30, |r| r.server.shutdown_timeout_s);
        old.shutdown(Duration::from_secs(timeout)).await;
        self.write().drained(model, &old);
    }

    /// Cancels the request `id` on every instance of the model behind `name`, draining
    /// ones included (TensorRT-LLM's stop request).
    pub fn cancel(&self, name: &str, id: &str) {
        for h in self.read().instances(name) {
            h.cancel(id);
        }
    }

    /// Drains and stops every serving model.
    pub async fn shutdown(&self, timeout: Duration) {
        let all = self.serving();
        futures::future::join_all(all.iter().map(|(_, _, h)| h.shutdown(timeout))).await;
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry<ModelHandle>> {
        self.registry.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry<ModelHandle>> {
        self.registry.write().unwrap_or_else(|e| e.into_inner())
    }
}

fn single_model(what: &str) -> ChangeError {
    ChangeError::Refused(format!(
        "cannot {what} models: this server serves the one model it started with \
         (serve --model-repository DIR serves a repository whose models load and unload)"
    ))
}

/// The model folders of `dir`, by name (hidden folders left out).
fn model_folders(dir: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    Ok(names)
}

/// `dir/model`, when `model` names a folder of it.
fn model_folder(dir: &Path, model: &str) -> std::result::Result<PathBuf, ChangeError> {
    let plain = !model.is_empty() && !model.starts_with('.') && !model.contains(['/', '\\']);
    let folder = dir.join(model);
    if plain && folder.is_dir() {
        Ok(folder)
    } else {
        Err(ChangeError::Unknown(format!(
            "failed to load '{model}': no model folder '{model}' in the repository"
        )))
    }
}

/// The serve config of the model in `folder`: its config.toml when present (without a
/// `[server]` table: `server` applies), the model path relative to the folder, the
/// folder itself when the config names none.
pub fn model_config(folder: &Path, server: &ServerSection) -> Result<ServeConfig> {
    let file = folder.join(MODEL_CONFIG);
    let mut cfg = if file.is_file() {
        let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
        let table: toml::Table =
            toml::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", file.display())))?;
        if table.contains_key("server") {
            return Err(Error::Config(format!(
                "{}: a model's config takes no [server] table (the server's settings are \
                 the serve command's)",
                file.display()
            )));
        }
        ServeConfig::load(&file)?
    } else if folder.join("config.pbtxt").is_file() {
        // A folder of Triton's own repository layout (a TensorRT engine, or a Python
        // pre/postprocessing model): nothing inflight can run as it is.
        return Err(Error::Config(format!(
            "{} holds a Triton config.pbtxt and no {MODEL_CONFIG}: inflight serves HF \
             checkpoints and GGUF files, not TensorRT engines; give the model a folder of \
             its own with a {MODEL_CONFIG} whose [model] path names its checkpoint (and \
             [model.triton_names] for the ensemble / tensorrt_llm names)",
            folder.display()
        )));
    } else {
        ServeConfig::from_toml("")?
    };
    cfg.server = server.clone();
    if cfg.model.path.is_empty() {
        cfg.model.path = folder.to_string_lossy().into_owned();
    }
    Ok(cfg.with_env_overrides())
}
