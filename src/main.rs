//! The `inflight` command line: `serve` runs the HTTP server (Triton generate, KServe v2,
//! OpenAI, metrics), `generate` streams a completion to stdout, `fetch-model` fetches the
//! default model.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use inflight::config::ServeConfig;
use inflight::generate::{generate, GenerateOptions};
use inflight::http::{serve, AppState};
#[cfg(feature = "gpu-tools")]
use inflight::model::Llama;
use inflight::model::LoadedModel;
use inflight::repository::Models;
use inflight::request::GenerationParams;
use inflight::tokenizer::chat::{ChatMessage, ChatTemplate};

#[derive(Parser)]
#[command(
    name = "inflight",
    version,
    about = "An LLM inference server where every pipeline stage is an actor"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model over HTTP (default: SmolLM2-135M-Instruct on ports 8000 and 8002).
    Serve(ServeArgs),
    /// Generate a completion for one prompt, streaming text to stdout.
    Generate(GenerateArgs),
    /// Benchmark a running server (ours or any OpenAI-compatible one) with seeded traffic.
    Bench(Box<inflight::bench::BenchArgs>),
    /// GPU self-check: every CUDA kernel against its CPU twin, then the model checks.
    #[cfg(feature = "gpu-tools")]
    #[command(hide = true)]
    GpuCheck {
        /// A model for the greedy GPU-vs-CPU check (skipped when absent).
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long, default_value_t = 32)]
        steps: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// Compiles every CUDA kernel with NVRTC (no GPU needed) and caches the PTX.
    #[cfg(feature = "cuda")]
    #[command(hide = true)]
    GpuCompile {
        #[arg(long, default_value = "compute_90a")]
        arch: String,
    },
    /// Writes the GPU engine's logits for random prompts (for scripts/hf_compare.py).
    #[cfg(feature = "gpu-tools")]
    #[command(hide = true)]
    GpuLogits {
        #[arg(long)]
        model: PathBuf,
        /// Output path prefix (.json and .f32 are written).
        #[arg(long)]
        out: PathBuf,
        #[arg(long, value_delimiter = ',', default_value = "5,17,64,100")]
        lens: Vec<usize>,
        #[arg(long, default_value_t = 32)]
        steps: usize,
        #[arg(long, default_value_t = 11)]
        seed: u64,
        /// bf16 or f16 (default: f16, or bf16 when a weight is beyond f16's range).
        #[arg(long)]
        dtype: Option<String>,
    },
    /// Writes an HF Llama checkpoint as a GGUF file of a quantization (q4_k_m, q8_0, ...):
    /// the quantized models of the GPU checks and benchmarks.
    #[cfg(feature = "gpu-tools")]
    #[command(hide = true)]
    GpuGguf {
        /// The HF checkpoint folder.
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "q4_k_m")]
        quant: String,
    },
    /// The quantized GEMV's rate on Llama-3.1-8B's matrices at one row (bytes a second).
    #[cfg(feature = "gpu-tools")]
    #[command(hide = true)]
    GpuQrates,
    /// GPU time per stage of the forward pass for a prefill and decode batches.
    #[cfg(feature = "gpu-tools")]
    #[command(hide = true)]
    GpuProfile {
        #[arg(long)]
        model: PathBuf,
        /// Prefill lengths (one sequence each).
        #[arg(long, value_delimiter = ',', default_value = "2048")]
        prefill: Vec<usize>,
        /// Decode batches as SEQSxCONTEXT.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1x512,64x256,256x256,256x1100"
        )]
        decode: Vec<String>,
        #[arg(long, default_value_t = 5)]
        iters: usize,
        /// bf16 or f16 (default: f16, or bf16 when a weight is beyond f16's range).
        #[arg(long)]
        dtype: Option<String>,
        /// Linear layers on `auto` (whichever of the GEMV kernel, cublasGemmEx and the
        /// cuBLASLt candidates was timed fastest for the shape at start) or `cublas`
        /// (cublasGemmEx always), to compare the two.
        #[arg(long, default_value = "auto")]
        linear: String,
    },
    /// Fetch the default model (SmolLM2-135M-Instruct) into the cache folder.
    FetchModel {
        /// Folder to put it in (default: $INFLIGHT_MODEL_DIR or ~/.cache/inflight).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// A TOML config (see config/); flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A .gguf file or an HF checkpoint folder (default: the config's, else SmolLM2-135M-Instruct).
    #[arg(long, env = "INFLIGHT_MODEL")]
    model: Option<PathBuf>,
    #[arg(long)]
    host: Option<String>,
    #[arg(long)]
    http_port: Option<u16>,
    #[arg(long)]
    metrics_port: Option<u16>,
    /// Triton's gRPC service (default 8001; 0: none).
    #[arg(long)]
    grpc_port: Option<u16>,
    /// cpu, or cuda / cuda:N (builds with feature `cuda`).
    #[arg(long)]
    device: Option<String>,
    /// Requests must carry `Authorization: Bearer <key>` (health and metrics exempt).
    #[arg(long, env = "INFLIGHT_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// A PEM certificate chain: every port serves TLS (with --tls-key).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// Serve every model folder of this model repository (each with its own config.toml);
    /// models load and unload at run time.
    #[arg(long)]
    model_repository: Option<PathBuf>,
    /// Serve POST /v2/debug/fault (tests of fault recovery; never in production).
    #[arg(long)]
    fault_injection: bool,
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// A .gguf file or an HF checkpoint folder (default: SmolLM2-135M-Instruct, fetched on first use).
    #[arg(long, env = "INFLIGHT_MODEL")]
    model: Option<PathBuf>,
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System message for --chat (default: the template's own).
    #[arg(long)]
    system: Option<String>,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// 0 keeps every token.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating past the end-of-sequence token.
    #[arg(long)]
    ignore_eos: bool,
    /// Print timing to stderr.
    #[arg(long)]
    stats: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => run_serve(args),
        Command::Generate(args) => run_generate(args),
        Command::Bench(args) => return inflight::bench::main(*args),
        #[cfg(feature = "gpu-tools")]
        Command::GpuCheck { model, steps, seed } => gpu_check(model, steps, seed),
        #[cfg(feature = "cuda")]
        Command::GpuCompile { arch } => {
            use inflight::kernels::cuda::{compile, Half};
            Half::ALL.iter().try_for_each(|&half| {
                compile::MODULES.iter().try_for_each(|(name, src)| {
                    let ptx = compile::ptx(name, src, &arch, half)?;
                    println!(
                        "{name}.cu [{}]: {} bytes of PTX for {arch}",
                        half.suffix(),
                        ptx.len()
                    );
                    Ok(())
                })
            })
        }
        #[cfg(feature = "gpu-tools")]
        Command::GpuLogits {
            model,
            out,
            lens,
            steps,
            seed,
            dtype,
        } => {
            let half = dtype.as_deref().map(inflight::kernels::cuda::Half::parse);
            match half {
                Some(None) => Err(inflight::Error::Config("--dtype is bf16 or f16".into())),
                _ => Llama::load_mapped(&model)
                    .and_then(|m| inflight::model::gpu::CudaModel::load_as(&m, 0, half.flatten()))
                    .and_then(|g| {
                        inflight::gpu_check::model::dump_logits(&g, &lens, steps, seed, &out)
                    }),
            }
        }
        #[cfg(feature = "gpu-tools")]
        Command::GpuProfile {
            model,
            prefill,
            decode,
            iters,
            dtype,
            linear,
        } => gpu_profile(&model, &prefill, &decode, iters, dtype.as_deref(), &linear),
        #[cfg(feature = "gpu-tools")]
        Command::GpuGguf { model, out, quant } => {
            inflight::model::gguf_convert::Recipe::parse(&quant)
                .and_then(|r| inflight::model::gguf_convert::hf_to_gguf(&model, r, false))
                .and_then(|w| {
                    std::fs::write(&out, w.to_bytes())
                        .map_err(|e| inflight::Error::Gguf(format!("{}: {e}", out.display())))
                })
        }
        #[cfg(feature = "gpu-tools")]
        Command::GpuQrates => (|| {
            use rand::SeedableRng;
            let gpu = inflight::kernels::cuda::Gpu::open(0)?;
            let mut rng = rand::rngs::StdRng::seed_from_u64(1);
            inflight::gpu_check::print_table(&inflight::gpu_check::quant_rates(&gpu, &mut rng)?);
            Ok(())
        })(),
        Command::FetchModel { dir } => {
            let dir = dir.unwrap_or_else(inflight::fetch::cache_dir);
            inflight::fetch::fetch_default_model(&dir).map(|p| println!("{}", p.display()))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "gpu-tools")]
fn gpu_profile(
    model: &std::path::Path,
    prefill: &[usize],
    decode: &[String],
    iters: usize,
    dtype: Option<&str>,
    linear: &str,
) -> inflight::Result<()> {
    use inflight::gpu_check::profile::{profile, Batch};
    use inflight::kernels::cuda::gemm::Path;
    let linear = match linear {
        "auto" => Path::Auto,
        "cublas" => Path::Cublas,
        other => {
            return Err(inflight::Error::Config(format!(
                "--linear is auto or cublas, got {other:?}"
            )))
        }
    };
    let half = match dtype.map(inflight::kernels::cuda::Half::parse) {
        Some(None) => return Err(inflight::Error::Config("--dtype is bf16 or f16".into())),
        h => h.flatten(),
    };
    let mut batches: Vec<Batch> = prefill
        .iter()
        .map(|&p| Batch {
            seqs: 1,
            new: p,
            past: 0,
        })
        .collect();
    for d in decode {
        let parsed = d
            .split_once('x')
            .and_then(|(s, c)| Some((s.parse::<usize>().ok()?, c.parse::<usize>().ok()?)))
            .filter(|&(s, c)| s > 0 && c > 0);
        let Some((seqs, context)) = parsed else {
            return Err(inflight::Error::Config(format!(
                "--decode takes SEQSxCONTEXT, got {d:?}"
            )));
        };
        batches.push(Batch {
            seqs,
            new: 1,
            past: context - 1,
        });
    }
    let m = Llama::load_mapped(model)?;
    let g = inflight::model::gpu::CudaModel::load_as(&m, 0, half)?;
    drop(m);
    if model.is_file() {
        let file = std::fs::metadata(model).map(|m| m.len()).unwrap_or(0);
        println!("model file: {:.3} GB", file as f64 / 1e9);
    }
    profile(&g, &batches, iters.max(1), linear)
}

fn run_serve(args: ServeArgs) -> inflight::Result<()> {
    use std::io::IsTerminal;
    let started = std::time::Instant::now();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        // Colour codes only on a terminal: a log piped to a file or a collector stays plain.
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    if let Some(limit) = inflight::fdlimit::raise_open_files() {
        tracing::info!("open-file limit {limit} (one per client connection)");
    }
    let mut cfg = match &args.config {
        Some(path) => ServeConfig::load(path)?,
        None => ServeConfig::from_toml("")?,
    }
    .with_env_overrides();
    if let Some(m) = args.model {
        if args.model_repository.is_some() {
            return Err(inflight::Error::Config(
                "--model (or INFLIGHT_MODEL) and --model-repository exclude each other: a \
                 repository's models are its folders"
                    .into(),
            ));
        }
        cfg.model.path = m.to_string_lossy().into_owned();
    }
    let server = &mut cfg.server;
    server.host = args.host.unwrap_or(server.host.clone());
    server.http_port = args.http_port.unwrap_or(server.http_port);
    server.metrics_port = args.metrics_port.unwrap_or(server.metrics_port);
    server.grpc_port = args.grpc_port.unwrap_or(server.grpc_port);
    server.device = args.device.unwrap_or(server.device.clone());
    server.api_key = args.api_key.or(server.api_key.clone());
    server.tls_cert = args.tls_cert.or(server.tls_cert.clone());
    server.tls_key = args.tls_key.or(server.tls_key.clone());
    server.model_repository = args.model_repository.or(server.model_repository.clone());
    server.fault_injection |= args.fault_injection;
    let tls = match (&server.tls_cert, &server.tls_key) {
        (Some(cert), Some(key)) => Some(inflight::http::tls::Tls::load(cert, key)?),
        (None, None) => None,
        _ => {
            return Err(inflight::Error::Config(
                "TLS needs both tls_cert and tls_key (--tls-cert, --tls-key)".into(),
            ))
        }
    };
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| inflight::Error::Config(format!("tokio: {e}")))?;
    runtime.block_on(async move {
        let models = match &cfg.server.model_repository {
            Some(dir) => {
                tracing::info!(repository = %dir.display(), "serving a model repository");
                Models::open(dir, &cfg.server).await?
            }
            None => {
                let triton = cfg.model.triton_names.clone();
                let path = cfg.model_path();
                let handle = inflight::launch::start(cfg.clone(), path, None).await?;
                std::sync::Arc::new(Models::single(handle, triton.as_ref()))
            }
        };
        tracing::info!(
            seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
            "models ready"
        );
        let state = AppState::with_models(models);
        serve(
            state,
            &cfg.server.host,
            inflight::http::Ports {
                http: cfg.server.http_port,
                metrics: cfg.server.metrics_port,
                grpc: cfg.server.grpc_port,
            },
            inflight::http::ServeLimits {
                tls,
                ..inflight::http::ServeLimits::from(&cfg.server)
            },
        )
        .await
    })
}

/// Runs the kernel checks, then (with a model) the greedy GPU-vs-CPU check; prints the
/// table and fails when any row fails.
#[cfg(feature = "gpu-tools")]
fn gpu_check(model: Option<PathBuf>, steps: usize, seed: u64) -> inflight::Result<()> {
    use inflight::gpu_check::{kernels, model as mcheck, print_table};
    let gpu = inflight::kernels::cuda::Gpu::open(0)?;
    println!("device: {} ({})", gpu.name, gpu.arch);
    let mut rows = kernels::run_all(&gpu, seed)?;
    // Every family's tiny checkpoint against transformers (run from the repository root).
    let families = std::path::Path::new("tests/fixtures/families");
    rows.extend(inflight::gpu_check::families::families_vs_hf(families)?);
    if let Some(path) = model {
        let llama = Llama::load(&path)?;
        let cuda = inflight::model::gpu::CudaModel::load(&llama, 0)?;
        // The CPU engine runs GGUF models as llama.cpp does (quantized weights times
        // int8-quantized activations), another function than the GPU's dequantized
        // weights: reported; the check proper is against the same weights dequantized.
        let quantized = "engine as loaded (Q4 x int8 activations)";
        rows.extend(mcheck::greedy_vs_cpu(
            &llama, quantized, &cuda, steps, true,
        )?);
        let plain = mcheck::dequantized(&llama);
        let same = "engine, same weights dequantized";
        rows.extend(mcheck::greedy_vs_cpu(&plain, same, &cuda, steps, false)?);
        rows.push(mcheck::swapped_vs_resident(&cuda)?);
        rows.push(mcheck::last_layer_rows_vs_every_row(&cuda)?);
        rows.push(mcheck::long_decodes_graph_vs_kernels(&cuda)?);
        rows.push(mcheck::sampled_plans_vs_cpu(&cuda)?);
    }
    if print_table(&rows) {
        Ok(())
    } else {
        Err(inflight::Error::Model("some GPU checks failed".into()))
    }
}

fn run_generate(args: GenerateArgs) -> inflight::Result<()> {
    let path = match args.model {
        Some(p) => p,
        None => inflight::fetch::default_model_path()?,
    };
    let loaded = LoadedModel::load(&path)?;
    let tok = &loaded.tokenizer;
    let text = if args.chat {
        let template = ChatTemplate::for_tokenizer(tok)?;
        let mut messages = Vec::new();
        if let Some(system) = args.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", args.prompt));
        template.apply(&messages, true)?
    } else {
        args.prompt
    };
    let prompt = tok.encode(&text, true)?;
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling: GenerationParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            random_seed: Some(args.seed),
            ignore_eos: args.ignore_eos,
            ..Default::default()
        },
    };
    let mut out = std::io::stdout().lock();
    let stats = generate(&loaded.model, tok, &prompt, &opts, |piece| {
        let _ = out.write_all(piece.as_bytes());
        let _ = out.flush();
    })?;
    let _ = writeln!(out);
    if args.stats {
        eprintln!(
            "prompt {} tokens, prefill {:.1} ms; generated {} tokens, decode {:.2} tokens/s",
            stats.prompt_tokens,
            stats.prefill.as_secs_f64() * 1e3,
            stats.generated.len(),
            stats.decode_tokens_per_s()
        );
    }
    Ok(())
}
