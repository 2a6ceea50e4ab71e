//! `inflight serve` configuration: a TOML file per model (config/*.toml) with the
//! TensorRT-LLM model-config parameters we support. Unknown keys are an error that names
//! them; command-line flags override the file.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::model::{ModelConfig, Pooling};
use crate::scheduler::{SchedulerConfig, SchedulerPolicy};
use crate::speculative::{DraftSource, SpeculativeOptions};

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// `[server]`: addresses, device, shutdown.
    #[serde(default)]
    pub server: ServerSection,
    /// `[model]`: the model and its scheduler.
    #[serde(default)]
    pub model: ModelSection,
    /// Speculative decoding; absent means none.
    pub speculative: Option<SpeculativeSection>,
}

/// `[speculative]`: where draft tokens come from and how many per step.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SpeculativeSection {
    /// `prompt_lookup` or `draft_model`.
    pub source: String,
    /// The draft model (a .gguf file or an HF folder) for `draft_model`; relative to the
    /// config file's folder. It must share the target's vocabulary.
    pub draft_model: String,
    /// Draft tokens per step for requests that do not set `num_draft_tokens`.
    pub num_draft_tokens: usize,
    /// Shortest n-gram prompt lookup tries (it tries the longest first).
    pub prompt_lookup_min_ngram: usize,
    /// Longest n-gram prompt lookup tries.
    pub prompt_lookup_max_ngram: usize,
}

impl Default for SpeculativeSection {
    fn default() -> Self {
        SpeculativeSection {
            source: "prompt_lookup".into(),
            draft_model: String::new(),
            num_draft_tokens: 4,
            prompt_lookup_min_ngram: 1,
            prompt_lookup_max_ngram: 3,
        }
    }
}

impl SpeculativeSection {
    /// What the library needs; `load_draft` loads a draft model from its path.
    pub fn options(
        &self,
        load_draft: impl FnOnce(&Path) -> Result<DraftSource>,
    ) -> Result<SpeculativeOptions> {
        let bad = |m: String| Err(Error::Config(format!("[speculative] {m}")));
        if self.num_draft_tokens > crate::speculative::MAX_DRAFT_TOKENS {
            return bad(format!(
                "num_draft_tokens must be at most {}, got {}",
                crate::speculative::MAX_DRAFT_TOKENS,
                self.num_draft_tokens
            ));
        }
        let draft = match self.source.as_str() {
            "prompt_lookup" => {
                let (min, max) = (self.prompt_lookup_min_ngram, self.prompt_lookup_max_ngram);
                if min == 0 || min > max {
                    return bad(format!(
                        "prompt lookup n-grams must satisfy 1 <= min <= max, got {min} and {max}"
                    ));
                }
                DraftSource::PromptLookup {
                    min_ngram: min,
                    max_ngram: max,
                }
            }
            "draft_model" => {
                if self.draft_model.is_empty() {
                    return bad("source = \"draft_model\" needs draft_model = \"<path>\"".into());
                }
                load_draft(Path::new(&self.draft_model))?
            }
            other => {
                return bad(format!(
                    "source {other:?} is not one of prompt_lookup, draft_model"
                ))
            }
        };
        Ok(SpeculativeOptions {
            draft,
            num_draft_tokens: self.num_draft_tokens,
        })
    }
}

/// `[server]`: where the server listens and what it runs on.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Address both ports bind to.
    pub host: String,
    /// Port of the inference APIs (Triton, KServe v2, OpenAI) and health.
    pub http_port: u16,
    /// Port of the Prometheus metrics.
    pub metrics_port: u16,
    /// Port of Triton's gRPC service (`ModelInfer`, `ModelStreamInfer`, metadata); 0 serves
    /// no gRPC.
    pub grpc_port: u16,
    /// `cpu`, or `cuda` / `cuda:N` (builds with feature `cuda`).
    pub device: String,
    /// Seconds to let running requests finish on SIGTERM.
    pub shutdown_timeout_s: u64,
    /// Seconds a connection has to send a request's head, from when it opens or finishes
    /// its previous request (so an idle kept-alive connection closes after it too).
    pub header_read_timeout_s: f64,
    /// Seconds a request's body has to arrive once its head has.
    pub request_body_timeout_s: f64,
    /// Longest request body in bytes (a longer one is a 413).
    pub max_request_body_bytes: usize,
    /// Open connections per port at most; one more gets a 503 and is closed.
    pub max_connections: usize,
    /// When set, every request but those to `api_key_exempt_paths` needs
    /// `Authorization: Bearer <api_key>`.
    pub api_key: Option<String>,
    /// Paths open without the key (exact): health and metrics by default.
    pub api_key_exempt_paths: Vec<String>,
    /// A PEM certificate chain: with `tls_key`, every port (HTTP, gRPC, metrics) serves
    /// TLS only.
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// A model repository: every model folder in it is served (the `[model]` table of
    /// this file is then unused), and models load and unload at run time
    /// (`/v2/repository/...`, gRPC's RepositoryModelLoad/Unload).
    pub model_repository: Option<PathBuf>,
    /// Serves `POST /v2/debug/fault`, which makes a model's engine meet a fault at its
    /// next step (a panic, an illegal address on the GPU, a failed launch), to test
    /// recovery and an orchestrator's restarts. Never on a production server.
    pub fault_injection: bool,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            host: "0.0.0.0".into(),
            http_port: 8000,
            metrics_port: 8002,
            grpc_port: 8001,
            device: "cpu".into(),
            shutdown_timeout_s: 30,
            header_read_timeout_s: 30.0,
            request_body_timeout_s: 60.0,
            max_request_body_bytes: 16 << 20,
            max_connections: 4096,
            api_key: None,
            api_key_exempt_paths: ["/v2/health/live", "/v2/health/ready", "/health", "/metrics"]
                .map(String::from)
                .to_vec(),
            tls_cert: None,
            tls_key: None,
            model_repository: None,
            fault_injection: false,
        }
    }
}

/// Sequences per iteration on the CPU engine unless configured: each one costs the 2
/// cores a share of every step, so more only lengthens the steps.
pub(crate) const CPU_MAX_BATCH: usize = 64;
/// Sequences per iteration on a GPU unless configured. Measured with Llama-3.1-8B shapes,
/// 1,024 requests of 128/128 (docs/perf.md): on an H100, 4,897 output tok/s at 64 and 9,037
/// at 256 (an earlier build); on an H200, one machine, 14,137 at 256, 15,290 at 512 (30 ms
/// iterations) and 15,594 at 1,024 (53 ms iterations, which double the time between tokens
/// for 2% more).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const GPU_MAX_BATCH: usize = 512;

/// The model and its scheduler: names follow TensorRT-LLM's model config.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// A .gguf file or an HF checkpoint folder; empty means the default model (fetched).
    /// A relative path is taken from the config file's folder.
    pub path: String,
    /// Sequences per iteration; unset: 64 on the CPU, 512 on a GPU (`CPU_MAX_BATCH`,
    /// `GPU_MAX_BATCH`).
    pub max_batch_size: Option<usize>,
    /// `guaranteed_no_evict` or `max_utilization`.
    pub batch_scheduler_policy: String,
    /// KV cache size in tokens; wins over the memory fraction when set.
    pub max_tokens_in_paged_kv_cache: Option<usize>,
    /// Fraction of free (GPU, or on the CPU host) memory given to the KV cache.
    pub kv_cache_free_gpu_mem_fraction: f64,
    /// Bytes of host memory for KV blocks (page-locked on a GPU): `max_utilization` swaps
    /// preempted sequences' blocks out to it instead of recomputing them, and with prefix
    /// caching it is the cache's host tier for blocks evicted from the device (0: neither).
    pub kv_cache_host_memory_bytes: u64,
    /// Tokens per KV block.
    pub tokens_per_block: usize,
    /// Split prompts longer than an iteration's remaining token budget.
    pub enable_chunked_context: bool,
    /// Tokens computed per iteration, prefill chunks and decodes together.
    pub max_num_tokens: usize,
    /// Sequences waiting for admission before new requests are refused.
    pub max_queue_size: usize,
    /// Prompt tokens waiting for admission before new requests are refused (0: no limit).
    pub max_queued_tokens: usize,
    /// Accepted for compatibility; the scheduler batches every iteration, so it waits for
    /// nothing.
    pub max_queue_delay_microseconds: u64,
    /// Longest sequence (prompt + output); 0 means the model's context length.
    pub max_seq_len: usize,
    /// Preprocess actors (tokenizing and validating requests).
    pub preprocess_instances: usize,
    /// Postprocess actors (detokenizing and streaming outputs).
    pub postprocess_instances: usize,
    /// The GPU engine's 16-bit type for weights, GEMM inputs and the KV cache: `auto`
    /// (f16, or bf16 when a weight is beyond f16's range), `bf16` or `f16`.
    pub gpu_dtype: String,
    /// Plan each iteration while the device runs the one before it (an engine that samples
    /// on its device, no draft source). `INFLIGHT_OVERLAP=0` overrides it at start.
    pub overlap_scheduling: bool,
    /// Reuse the KV blocks of prompt prefixes that earlier requests computed.
    pub enable_kv_cache_reuse: bool,
    /// How `/v1/embeddings` pools a prompt's final hidden states: `last` (the last
    /// token's) or `mean`.
    pub pooling: Pooling,
    /// `[model.triton_names]`: the names of Triton's TensorRT-LLM layout the model answers
    /// to besides its own. Unset: `ensemble`, `tensorrt_llm_bls` and `tensorrt_llm` for
    /// the one model of a plain `serve`, none for a repository's models (each needs its
    /// own).
    pub triton_names: Option<TritonNames>,
}

/// `[model.triton_names]`: a model's names in Triton's TensorRT-LLM layout.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TritonNames {
    /// The ensemble's name (text_input in, text_output out).
    pub ensemble: Option<String>,
    /// The BLS model's name (text in, text out, as the ensemble).
    pub tensorrt_llm_bls: Option<String>,
    /// The core model's name (input_ids in, output_ids out).
    pub tensorrt_llm: Option<String>,
}

impl TritonNames {
    /// Triton's own names: `ensemble`, `tensorrt_llm_bls`, `tensorrt_llm`.
    pub fn standard() -> Self {
        TritonNames {
            ensemble: Some(crate::repository::ENSEMBLE.into()),
            tensorrt_llm_bls: Some(crate::repository::BLS.into()),
            tensorrt_llm: Some(crate::repository::CORE.into()),
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: String::new(),
            max_batch_size: None,
            batch_scheduler_policy: "guaranteed_no_evict".into(),
            max_tokens_in_paged_kv_cache: None,
            kv_cache_free_gpu_mem_fraction: 0.9,
            kv_cache_host_memory_bytes: 0,
            tokens_per_block: 32,
            enable_chunked_context: false,
            max_num_tokens: 8192,
            max_queue_size: 1024,
            max_queued_tokens: 0,
            max_queue_delay_microseconds: 0,
            max_seq_len: 0,
            preprocess_instances: 2,
            postprocess_instances: 2,
            gpu_dtype: "auto".into(),
            overlap_scheduling: true,
            enable_kv_cache_reuse: true,
            pooling: Pooling::Last,
            triton_names: None,
        }
    }
}

/// The KV cache on the CPU is capped here unless max_tokens_in_paged_kv_cache says more.
const CPU_KV_CAP_BYTES: usize = 2 << 30;

impl ServeConfig {
    /// Parses a config file's text; the empty text gives every default.
    pub fn from_toml(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| Error::Config(e.to_string()))
    }

    /// Applies the documented environment overrides, read once at start:
    /// `INFLIGHT_OVERLAP=0` turns `overlap_scheduling` off (to compare).
    pub fn with_env_overrides(mut self) -> Self {
        if std::env::var("INFLIGHT_OVERLAP").is_ok_and(|v| v == "0") {
            self.model.overlap_scheduling = false;
        }
        self
    }

    /// Reads a file; a relative model path is resolved against its folder.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut cfg = Self::from_toml(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        if let Some(dir) = path.parent() {
            let resolve = |p: &mut String| {
                if !p.is_empty() && Path::new(p.as_str()).is_relative() {
                    *p = dir.join(p.as_str()).to_string_lossy().into_owned();
                }
            };
            resolve(&mut cfg.model.path);
            if let Some(s) = cfg.speculative.as_mut() {
                resolve(&mut s.draft_model);
            }
        }
        Ok(cfg)
    }

    /// The model file or folder, None for the default model.
    pub fn model_path(&self) -> Option<PathBuf> {
        (!self.model.path.is_empty()).then(|| PathBuf::from(&self.model.path))
    }

    /// Scheduler limits for `model` on the CPU engine, with the KV cache sized from the
    /// config (a fraction of the host's available memory, capped).
    pub(crate) fn scheduler(&self, model: &ModelConfig) -> Result<SchedulerConfig> {
        let per_token = crate::model::KvCache::bytes_per_token(model);
        self.scheduler_with(model, CPU_MAX_BATCH, per_token, |fraction| {
            let budget = (available_memory() as f64 * fraction) as usize;
            Ok(budget.min(CPU_KV_CAP_BYTES) / per_token.max(1))
        })
    }

    /// Scheduler limits for `model`, `default_batch` sequences per iteration unless the
    /// config says; `kv_tokens(kv_cache_free_gpu_mem_fraction)` sizes the KV cache (in
    /// tokens) when max_tokens_in_paged_kv_cache does not, and the host cache holds
    /// `kv_cache_host_memory_bytes` of tokens of `kv_bytes_per_token`.
    pub(crate) fn scheduler_with(
        &self,
        model: &ModelConfig,
        default_batch: usize,
        kv_bytes_per_token: usize,
        kv_tokens: impl FnOnce(f64) -> Result<usize>,
    ) -> Result<SchedulerConfig> {
        let m = &self.model;
        let policy = match m.batch_scheduler_policy.to_ascii_lowercase().as_str() {
            "guaranteed_no_evict" => SchedulerPolicy::GuaranteedNoEvict,
            "max_utilization" => SchedulerPolicy::MaxUtilization,
            other => {
                return Err(Error::Config(format!(
                    "batch_scheduler_policy {other:?} is not one of guaranteed_no_evict, max_utilization"
                )))
            }
        };
        if !(m.kv_cache_free_gpu_mem_fraction > 0.0 && m.kv_cache_free_gpu_mem_fraction <= 1.0) {
            return Err(Error::Config(format!(
                "kv_cache_free_gpu_mem_fraction must be in (0, 1], got {}",
                m.kv_cache_free_gpu_mem_fraction
            )));
        }
        let max_seq_len = match m.max_seq_len {
            0 => model.max_position_embeddings,
            n if n > model.max_position_embeddings => {
                // Positions past the model's context are refused by the forward pass: a
                // sequence allowed to reach them would fail the engine mid-request.
                return Err(Error::Config(format!(
                    "max_seq_len {n} exceeds the model's context of {} positions",
                    model.max_position_embeddings
                )));
            }
            n => n,
        };
        let kv_tokens = match m.max_tokens_in_paged_kv_cache {
            Some(t) => t,
            None => kv_tokens(m.kv_cache_free_gpu_mem_fraction)?,
        };
        let block = m.tokens_per_block.max(1);
        if m.kv_cache_host_memory_bytes > 0 && self.speculative.is_some() {
            // The speculative orchestrator's per-sequence state (and a draft model's
            // cache, which shares the block ids) is not swapped.
            return Err(Error::Config(
                "kv_cache_host_memory_bytes cannot be used with speculative decoding".into(),
            ));
        }
        let host_blocks = m.kv_cache_host_memory_bytes / (kv_bytes_per_token.max(1) * block) as u64;
        let cfg = SchedulerConfig {
            max_batch_size: m.max_batch_size.unwrap_or(default_batch),
            max_num_tokens: m.max_num_tokens,
            max_queue_size: m.max_queue_size,
            max_queued_tokens: m.max_queued_tokens,
            policy,
            enable_chunked_context: m.enable_chunked_context,
            block_size: block,
            num_blocks: (kv_tokens / block).max(1),
            num_host_blocks: usize::try_from(host_blocks).unwrap_or(usize::MAX),
            max_seq_len,
            enable_kv_cache_reuse: m.enable_kv_cache_reuse,
            overlap: m.overlap_scheduling,
            // A draft model reads the same block tables with its own layers: blocks are
            // given back only where nothing else reads them.
            kv_window: model
                .arch
                .kv_window(model.num_layers)
                .filter(|_| self.speculative.is_none()),
            // The model's, set where every model's actors start (`ModelHandle`).
            long_rope_from: None,
        };
        cfg.validate().map_err(|e| Error::Config(e.to_string()))?;
        Ok(cfg)
    }
}

/// Memory the host could give the KV cache (MemAvailable on Linux; 4 GiB elsewhere).
fn available_memory() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<usize>().ok())
        })
        .map_or(4 << 30, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model of 2,048 positions.
    fn small_model() -> ModelConfig {
        ModelConfig::from_hf_json(
            r#"{"vocab_size":100,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
                "num_attention_heads":4,"max_position_embeddings":2048}"#,
        )
        .unwrap()
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = ServeConfig::from_toml("[model]\nmax_batch_sise = 8\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_batch_sise"), "{e}");
        let e = ServeConfig::from_toml("[sever]\n").unwrap_err().to_string();
        assert!(e.contains("sever"), "{e}");
    }

    #[test]
    fn the_batch_size_defaults_by_device_unless_set() {
        let model = small_model();
        let unset = ServeConfig::from_toml(
            "[model]
max_tokens_in_paged_kv_cache = 4096
",
        )
        .unwrap();
        assert_eq!(
            unset.scheduler(&model).unwrap().max_batch_size,
            CPU_MAX_BATCH
        );
        let gpu = unset
            .scheduler_with(&model, GPU_MAX_BATCH, 1024, |_| Ok(0))
            .unwrap();
        assert_eq!(gpu.max_batch_size, GPU_MAX_BATCH);
        let set = ServeConfig::from_toml(
            "[model]
max_batch_size = 5
",
        )
        .unwrap();
        let gpu = set
            .scheduler_with(&model, GPU_MAX_BATCH, 1024, |_| Ok(4096))
            .unwrap();
        assert_eq!(gpu.max_batch_size, 5);
    }

    #[test]
    fn max_seq_len_past_the_models_context_is_refused_at_start() {
        let model = small_model();
        let cfg = |n| {
            ServeConfig::from_toml(&format!(
                "[model]\nmax_tokens_in_paged_kv_cache = 4096\nmax_seq_len = {n}\n"
            ))
            .unwrap()
        };
        let e = cfg(4096).scheduler(&model).unwrap_err().to_string();
        assert!(e.contains("max_seq_len 4096") && e.contains("2048"), "{e}");
        assert_eq!(cfg(2048).scheduler(&model).unwrap().max_seq_len, 2048);
        assert_eq!(cfg(0).scheduler(&model).unwrap().max_seq_len, 2048);
        // Planning ahead is on unless the file (or INFLIGHT_OVERLAP=0) turns it off.
        assert!(cfg(0).model.overlap_scheduling);
    }

    #[test]
    fn pooling_is_last_unless_the_file_says_mean() {
        let read = |text: &str| ServeConfig::from_toml(text).map(|c| c.model.pooling);
        assert_eq!(read("").unwrap(), Pooling::Last);
        assert_eq!(
            read("[model]\npooling = \"mean\"\n").unwrap(),
            Pooling::Mean
        );
        let e = read("[model]\npooling = \"cls\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cls") && e.contains("mean"), "{e}");
    }

    #[test]
    fn keys_reach_the_scheduler() {
        let c = ServeConfig::from_toml(
            "[model]\nmax_batch_size = 8\nbatch_scheduler_policy = \"max_utilization\"\n\
             max_tokens_in_paged_kv_cache = 4096\ntokens_per_block = 16\nenable_chunked_context = true\n\
             max_num_tokens = 512\nmax_queue_size = 3\n",
        )
        .unwrap();
        let model = small_model();
        let s = c.scheduler(&model).unwrap();
        assert_eq!((s.max_batch_size, s.block_size, s.num_blocks), (8, 16, 256));
        assert_eq!(s.policy, SchedulerPolicy::MaxUtilization);
        assert!(s.enable_chunked_context);
        assert_eq!(
            (s.max_num_tokens, s.max_queue_size, s.max_seq_len),
            (512, 3, 2048)
        );
        assert_eq!(s.num_host_blocks, 0);
        // The host cache in blocks of this model's tokens: 2 layers x K,V x 64 x f32.
        let host = ServeConfig::from_toml(
            "[model]\nkv_cache_host_memory_bytes = 1048576\ntokens_per_block = 16\n",
        )
        .unwrap();
        assert_eq!(crate::model::KvCache::bytes_per_token(&model), 1024);
        assert_eq!(host.scheduler(&model).unwrap().num_host_blocks, 64);
        let both = ServeConfig::from_toml(
            "[model]\nkv_cache_host_memory_bytes = 1048576\n[speculative]\nnum_draft_tokens = 2\n",
        )
        .unwrap();
        let e = both.scheduler(&model).unwrap_err().to_string();
        assert!(e.contains("speculative"), "{e}");
        let spec = ServeConfig::from_toml("[speculative]\nnum_draft_tokens = 6\n").unwrap();
        let opts = spec
            .speculative
            .unwrap()
            .options(|_| panic!("no draft model to load"))
            .unwrap();
        assert_eq!(opts.num_draft_tokens, 6);
        assert!(matches!(
            opts.draft,
            DraftSource::PromptLookup {
                min_ngram: 1,
                max_ngram: 3
            }
        ));
        let no_path = ServeConfig::from_toml("[speculative]\nsource = \"draft_model\"\n").unwrap();
        let e = no_path
            .speculative
            .unwrap()
            .options(|_| panic!())
            .unwrap_err();
        assert!(e.to_string().contains("draft_model = "), "{e}");
        let bad = ServeConfig::from_toml("[model]\nbatch_scheduler_policy = \"fifo\"\n").unwrap();
        assert!(bad
            .scheduler(&model)
            .unwrap_err()
            .to_string()
            .contains("fifo"));
    }
}
