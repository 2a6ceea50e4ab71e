//! The `inflight` command line: `generate` streams a completion to stdout, `fetch-model`
//! fetches the default model.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use inflight::generate::{generate, GenerateOptions};
use inflight::model::LoadedModel;
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
    /// Generate a completion for one prompt, streaming text to stdout.
    Generate(GenerateArgs),
    /// Fetch the default model (SmolLM2-135M-Instruct) into the cache folder.
    FetchModel {
        /// Folder to put it in (default: $INFLIGHT_MODEL_DIR or ~/.cache/inflight).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
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
        Command::Generate(args) => run_generate(args),
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
            messages.push(ChatMessage {
                role: "system".into(),
                content: system,
            });
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: args.prompt,
        });
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
