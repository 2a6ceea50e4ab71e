//! `inflight bench`: the serving benchmark (the seed's `benchmark_core_model`, grown up).
//! It drives a running server, ours or any OpenAI-compatible one, with seeded traffic
//! and prints throughput, latency, time to first token and inter-token latency.
//!
//! # Layout
//! - [`arrivals`]: arrival gaps (Poisson, constant, immediate) and length distributions.
//! - [`dataset`]: the prompts: `token-norm-dist` synthesis, shared prefixes and dataset
//!   files.
//! - `conversation`: the multi-turn chat replay, its conversations and how their turns
//!   are sent.
//! - `sse`: server-sent-events framing.
//! - `client`: URLs and request bodies per endpoint; sending and timing one request.
//! - `events`: what each endpoint's events say; token timings and output lengths.
//! - `runner`: warm-up, open/closed-loop sending, the progress bar.
//! - `stats`: per-request records, percentiles, the summary and goodput.
//! - `report`: the table, the `--json` report, side-by-side comparisons.
//!
//! The same `--seed` sends the same prompts, lengths and arrival gaps; warm-up requests
//! come from their own draws, so their number does not change the measured traffic.

pub mod arrivals;
pub(crate) mod client;
pub(crate) mod conversation;
pub mod dataset;
pub(crate) mod events;
pub(crate) mod report;
pub(crate) mod runner;
pub(crate) mod sse;
pub(crate) mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Subcommand, ValueEnum};
use rand::Rng;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::tokenizer::Tokenizer;
use arrivals::{rng_for, streams, Arrivals, NormalLengths};
use client::{Endpoint, Target};
use dataset::{BenchRequest, DatasetOptions, PromptSynth};
use report::Report;
use stats::{summarize, Slo};

/// Why a benchmark could not run or did not pass.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad options, an unreadable dataset or tokenizer.
    #[error("{0}")]
    Setup(String),
    /// The server did not answer the probe sent before the run.
    #[error("cannot reach the server at {url}: {reason}")]
    Unreachable {
        /// The server's URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// No measured request completed, or more than half failed.
    #[error("{failed} of {total} requests failed; first failure: {first}")]
    MostFailed {
        /// Requests that failed.
        failed: usize,
        /// Requests measured.
        total: usize,
        /// The first failure's message.
        first: String,
    },
}

/// `inflight bench`: options shared by both traffic sources come first.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub(crate) source: Source,
    /// The server: scheme, host and port.
    #[arg(long, global = true, default_value = "http://localhost:8000")]
    pub(crate) url: String,
    #[arg(long, global = true, value_enum, default_value_t = Endpoint::GenerateStream)]
    pub(crate) endpoint: Endpoint,
    /// Triton model (default `ensemble`), or the OpenAI `model` field (default: the first
    /// model `GET /v1/models` lists).
    #[arg(long, global = true)]
    pub(crate) model: Option<String>,
    /// Tokenizer for random prompts and token counts: a .gguf, a tokenizer.json or an HF
    /// checkpoint folder (default: SmolLM2-135M-Instruct's, fetched on first use).
    #[arg(long, global = true)]
    pub(crate) tokenizer: Option<PathBuf>,
    /// Measured requests (a dataset gives at most its size).
    #[arg(long, global = true, default_value_t = 128)]
    pub(crate) num_requests: usize,
    /// Requests sent before the measured ones and left out of every figure.
    #[arg(long, global = true, default_value_t = 2)]
    pub(crate) warmup: usize,
    /// Requests per second (open loop). Without it every request is due at once, so
    /// --concurrency alone makes a closed loop.
    #[arg(long, global = true)]
    pub(crate) request_rate: Option<f64>,
    /// Gaps between arrivals under --request-rate.
    #[arg(long, global = true, value_enum, default_value_t = ArrivalKind::Poisson)]
    pub(crate) arrival: ArrivalKind,
    /// Requests in flight at most (no cap by default).
    #[arg(long, global = true)]
    pub(crate) concurrency: Option<usize>,
    /// Seeds prompts, lengths and arrivals: the same seed sends the same traffic.
    #[arg(long, global = true, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Sampling temperature sent with each request (0 is greedy).
    #[arg(long, global = true, default_value_t = 0.0)]
    pub(crate) temperature: f32,
    /// Leave out `ignore_eos` and `min_tokens`, so answers may stop before max_tokens.
    #[arg(long, global = true)]
    pub(crate) no_ignore_eos: bool,
    /// A JSON object merged into every request body (server-specific options).
    #[arg(long, global = true)]
    pub(crate) extra_body: Option<String>,
    /// Goodput SLO: time to first token at most this many ms.
    #[arg(long, global = true)]
    pub(crate) slo_ttft_ms: Option<f64>,
    /// Goodput SLO: mean time per output token after the first at most this many ms.
    #[arg(long, global = true)]
    pub(crate) slo_tpot_ms: Option<f64>,
    /// Goodput SLO: end-to-end latency at most this many ms.
    #[arg(long, global = true)]
    pub(crate) slo_latency_ms: Option<f64>,
    /// Write the configuration, every figure and every request here.
    #[arg(long, global = true)]
    pub(crate) json: Option<PathBuf>,
    /// The run's name in the table, the JSON and comparisons (default: URL and endpoint).
    #[arg(long, global = true)]
    pub(crate) label: Option<String>,
    /// Give up on one request after this many seconds.
    #[arg(long, global = true, default_value_t = 600.0)]
    pub(crate) timeout_s: f64,
    /// No progress bar (it is drawn only on a terminal anyway).
    #[arg(long, global = true)]
    pub(crate) no_progress: bool,
}

#[derive(Subcommand, Debug, Clone, Serialize)]
#[serde(tag = "source", rename_all = "kebab-case")]
pub(crate) enum Source {
    /// Random token text; input and output lengths drawn from normal distributions.
    TokenNormDist(TokenNormDist),
    /// Prompts from a JSON (or JSON-lines) file, with optional reference outputs.
    Dataset(DatasetArgs),
    /// Groups of requests sharing a random prefix, each with its own question (the
    /// workload of KV cache reuse).
    SharedPrefix(SharedPrefixArgs),
    /// Conversations replayed turn by turn, each turn sending the whole history (the
    /// model's own answers included) and a new user message. --num-requests counts turns;
    /// --request-rate and --concurrency count conversations (their starts, and how many
    /// are under way).
    MultiTurn(MultiTurnArgs),
    /// Print saved --json reports side by side.
    Compare(CompareArgs),
}

#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct TokenNormDist {
    /// Mean prompt length in tokens.
    #[arg(long)]
    pub input_mean: f64,
    /// Standard deviation of prompt lengths.
    #[arg(long, default_value_t = 0.0)]
    pub input_stdev: f64,
    /// Mean output length in tokens (`max_tokens`).
    #[arg(long)]
    pub output_mean: f64,
    /// Standard deviation of output lengths.
    #[arg(long, default_value_t = 0.0)]
    pub output_stdev: f64,
}

#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct SharedPrefixArgs {
    /// Groups: distinct prefixes, taken in turn by the requests.
    #[arg(long)]
    pub num_groups: usize,
    /// Tokens of each group's prefix.
    #[arg(long)]
    pub prefix_len: usize,
    /// Tokens of each request's own question after the prefix.
    #[arg(long)]
    pub question_len: usize,
    /// Output tokens of every request.
    #[arg(long)]
    pub output_len: usize,
}

#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct MultiTurnArgs {
    /// Turns of each conversation: ceil(--num-requests / turns) conversations are replayed.
    #[arg(long)]
    pub turns: usize,
    /// Tokens of each conversation's system prompt (its own).
    #[arg(long)]
    pub system_len: usize,
    /// Tokens of each user message.
    #[arg(long)]
    pub user_len: usize,
    /// Output tokens of every answer.
    #[arg(long)]
    pub output_len: usize,
}

#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct DatasetArgs {
    /// The file: a list of strings, of {prompt, output}, of the seed's {input,
    /// instruction, output}, or ShareGPT {conversations: [...]}.
    #[arg(long)]
    pub dataset: PathBuf,
    /// Output tokens of every request (default: the reference output's length).
    #[arg(long)]
    pub output_len: Option<usize>,
    /// Prompts longer than this many tokens are skipped.
    #[arg(long, default_value_t = 4096)]
    pub max_input_len: usize,
    /// Cap on output lengths taken from references.
    #[arg(long, default_value_t = 1024)]
    pub max_output_len: usize,
}

#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct CompareArgs {
    /// Reports written with --json.
    #[arg(required = true)]
    pub reports: Vec<PathBuf>,
    /// One Markdown row per report instead of side-by-side tables.
    #[arg(long)]
    pub markdown: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ArrivalKind {
    /// Exponential gaps (a Poisson process).
    #[value(alias = "exponential")]
    Poisson,
    /// Equal gaps of 1/rate.
    Constant,
}

/// Open files kept aside from the requests' sockets (the tokenizer, the report, stdio).
const FILES_SPARE: u64 = 64;

/// Runs `inflight bench` and reports its error, if any, as the process's exit status.
pub fn main(args: BenchArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn run(args: BenchArgs) -> Result<(), BenchError> {
    if let Source::Compare(c) = &args.source {
        return compare(c);
    }
    let (mut target, plan) = prepare(&args)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::Setup(format!("tokio: {e}")))?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs_f64(args.timeout_s))
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| BenchError::Setup(format!("HTTP client: {e}")))?;
    let outcome = runtime.block_on(async {
        target.probe(&http, args.model.is_some()).await?;
        let turns: usize = plan.conversations.iter().map(|c| c.users.len()).sum();
        eprintln!(
            "inflight bench: {} requests (+{} warm-up) to {} ({}), model {:?}",
            plan.requests.len() + turns,
            plan.warmup.len(),
            target.url(),
            target.endpoint,
            target.model
        );
        let progress = !args.no_progress;
        Ok::<_, BenchError>(runner::execute(Arc::new(target.clone()), http, plan, progress).await)
    })?;
    conclude(&args, &target, &outcome)
}

/// Prints the table, writes the report, and fails the run when most requests failed.
fn conclude(
    args: &BenchArgs,
    target: &Target,
    outcome: &runner::Outcome,
) -> Result<(), BenchError> {
    let slo = Slo {
        ttft_ms: args.slo_ttft_ms,
        tpot_ms: args.slo_tpot_ms,
        latency_ms: args.slo_latency_ms,
    };
    let summary = summarize(&outcome.records, outcome.duration, &slo);
    let label = args
        .label
        .clone()
        .unwrap_or_else(|| format!("{} {}", args.url, args.endpoint));
    println!("{label}");
    print!("{}", report::table(&summary));
    if let Source::MultiTurn(m) = &args.source {
        let by_turn = conversation::ttft_by_turn(&outcome.records, m.turns);
        let cells: Vec<String> = by_turn
            .iter()
            .enumerate()
            .map(|(t, d)| match d {
                Some(d) => format!("{}: {:.1}", t + 1, d.p50),
                None => format!("{}: -", t + 1),
            })
            .collect();
        println!("TTFT p50 by turn (ms)  {}", cells.join("  "));
    }
    if outcome.warmup_failures > 0 {
        eprintln!(
            "warning: {} of {} warm-up requests failed",
            outcome.warmup_failures, args.warmup
        );
    }
    if let Some(path) = &args.json {
        let report = Report {
            label,
            inflight_version: env!("CARGO_PKG_VERSION").into(),
            command_line: std::env::args().collect(),
            config: config_json(args, target),
            summary: summary.clone(),
            requests: outcome.records.clone(),
        };
        report.write(path)?;
    }
    if summary.completed == 0 || summary.failed * 2 > summary.total_requests {
        let first = outcome
            .records
            .iter()
            .find_map(|r| r.error.clone())
            .unwrap_or_else(|| "none".into());
        return Err(BenchError::MostFailed {
            failed: summary.failed,
            total: summary.total_requests,
            first,
        });
    }
    Ok(())
}

fn compare(c: &CompareArgs) -> Result<(), BenchError> {
    let reports: Vec<Report> = c
        .reports
        .iter()
        .map(|p| Report::read(p))
        .collect::<Result<_, _>>()?;
    if c.markdown {
        print!("{}", report::markdown(&reports));
    } else {
        print!("{}", report::side_by_side(&reports));
    }
    Ok(())
}

fn config_json(args: &BenchArgs, target: &Target) -> Value {
    let mut v = serde_json::to_value(args).expect("options serialize");
    v["resolved"] = json!({
        "url": target.url(),
        "model": target.model,
        "ignore_eos": target.ignore_eos,
        "extra_body": target.extra,
        "arrivals": arrivals(args),
    });
    v
}

fn arrivals(args: &BenchArgs) -> Arrivals {
    match (args.request_rate, args.arrival) {
        (None, _) => Arrivals::Immediate,
        (Some(rate), ArrivalKind::Poisson) => Arrivals::Poisson { rate },
        (Some(rate), ArrivalKind::Constant) => Arrivals::Constant { rate },
    }
}

/// Checks the options and builds the target and every request of the run.
fn prepare(args: &BenchArgs) -> Result<(Target, runner::Plan), BenchError> {
    let bad = |m: &str| Err(BenchError::Setup(m.into()));
    if args.num_requests == 0 {
        return bad("--num-requests must be at least 1");
    }
    if args
        .request_rate
        .is_some_and(|r| !(r > 0.0 && r.is_finite()))
    {
        return bad("--request-rate must be a positive number of requests per second");
    }
    if args.concurrency == Some(0) {
        return bad("--concurrency must be at least 1");
    }
    // Every request in flight holds a socket: all at once must fit the open-file limit.
    let in_flight = match (args.concurrency, args.request_rate) {
        (Some(c), _) => c.min(args.num_requests),
        (None, None) => args.num_requests,
        (None, Some(_)) => 0,
    };
    if let Some(limit) = crate::fdlimit::raise_open_files() {
        let room = limit.saturating_sub(FILES_SPARE) as usize;
        if in_flight > room {
            return Err(BenchError::Setup(format!(
                "{in_flight} requests in flight at once need as many sockets, but this process \
                 may open {limit} files: pass --concurrency {room} or lower"
            )));
        }
    }
    if !(args.timeout_s > 0.0 && args.timeout_s.is_finite()) {
        return bad("--timeout-s must be positive");
    }
    let extra = match &args.extra_body {
        None => Map::new(),
        Some(s) => match serde_json::from_str(s) {
            Ok(Value::Object(m)) => m,
            _ => return bad("--extra-body must be a JSON object"),
        },
    };
    let url = args.url.trim_end_matches('/');
    let base = if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    };
    let model = args.model.clone().unwrap_or_else(|| "ensemble".into());
    let tok = Arc::new(tokenizer(args)?);
    let target = Target {
        base,
        endpoint: args.endpoint,
        model,
        temperature: args.temperature,
        ignore_eos: !args.no_ignore_eos,
        extra,
        tokenizer: Some(tok.clone()),
    };
    let synth = match args.source {
        Source::TokenNormDist(_) | Source::SharedPrefix(_) | Source::MultiTurn(_) => {
            Some(PromptSynth::new(&tok)?)
        }
        _ => None,
    };
    let warmup_seed: u64 = rng_for(args.seed, streams::WARMUP).gen();
    let warmup = traffic(args, &tok, synth.as_ref(), args.warmup, warmup_seed)?;
    let (requests, conversations) = match &args.source {
        Source::MultiTurn(m) => {
            let synth = synth.as_ref().expect("built for multi-turn");
            let n = args.num_requests.div_ceil(m.turns.max(1));
            let convs = conversation::conversations(
                multi_turn(m),
                synth,
                n,
                &mut rng_for(args.seed, streams::PROMPT_TOKENS),
            )?;
            (Vec::new(), convs)
        }
        _ => {
            let requests = traffic(args, &tok, synth.as_ref(), args.num_requests, args.seed)?;
            (requests, Vec::new())
        }
    };
    let starts = requests.len().max(conversations.len());
    let gaps = arrivals(args).gaps(starts, &mut rng_for(args.seed, streams::ARRIVALS));
    Ok((
        target,
        runner::Plan {
            warmup,
            requests,
            conversations,
            gaps,
            concurrency: args.concurrency,
        },
    ))
}

fn tokenizer(args: &BenchArgs) -> Result<Tokenizer, BenchError> {
    let path = match &args.tokenizer {
        Some(p) => p.clone(),
        None => crate::fetch::default_model_path()
            .map_err(|e| BenchError::Setup(format!("default tokenizer: {e}")))?,
    };
    dataset::load_tokenizer(&path)
}

/// `n` requests of the run's source, drawn from `seed`.
fn traffic(
    args: &BenchArgs,
    tok: &Tokenizer,
    synth: Option<&PromptSynth>,
    n: usize,
    seed: u64,
) -> Result<Vec<BenchRequest>, BenchError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    match &args.source {
        Source::TokenNormDist(d) => {
            if d.input_mean < 1.0
                || d.output_mean < 1.0
                || d.input_stdev < 0.0
                || d.output_stdev < 0.0
            {
                return Err(BenchError::Setup(
                    "token-norm-dist: means must be at least 1 and stdevs not negative".into(),
                ));
            }
            let inputs = NormalLengths::new(d.input_mean, d.input_stdev)
                .sample(n, &mut rng_for(seed, streams::INPUT_LENGTHS));
            let outputs = NormalLengths::new(d.output_mean, d.output_stdev)
                .sample(n, &mut rng_for(seed, streams::OUTPUT_LENGTHS));
            let synth = synth.expect("built for token-norm-dist");
            let mut rng = rng_for(seed, streams::PROMPT_TOKENS);
            inputs
                .into_iter()
                .zip(outputs)
                .map(|(len, output_tokens)| {
                    let (prompt, input_tokens) = synth.prompt(len, &mut rng)?;
                    Ok(BenchRequest {
                        prompt,
                        input_tokens,
                        output_tokens,
                        messages: Vec::new(),
                    })
                })
                .collect()
        }
        Source::Dataset(d) => {
            let entries = dataset::read_dataset(&d.dataset)?;
            let opts = DatasetOptions {
                output_len: d.output_len,
                max_input_len: d.max_input_len,
                max_output_len: d.max_output_len,
            };
            let reqs = dataset::dataset_requests(
                &entries,
                n,
                tok,
                &opts,
                &mut rng_for(seed, streams::DATASET_ORDER),
            )?;
            if reqs.is_empty() {
                return Err(BenchError::Setup(format!(
                    "{}: every prompt is longer than --max-input-len",
                    d.dataset.display()
                )));
            }
            Ok(reqs)
        }
        Source::SharedPrefix(p) => {
            let synth = synth.expect("built for shared-prefix");
            let shape = dataset::SharedPrefix {
                groups: p.num_groups,
                prefix_len: p.prefix_len,
                question_len: p.question_len,
                output_len: p.output_len,
            };
            dataset::shared_prefix_requests(
                shape,
                synth,
                n,
                &mut rng_for(seed, streams::PROMPT_TOKENS),
            )
        }
        Source::MultiTurn(m) => {
            // Warm-up: the first turns of conversations of their own.
            let synth = synth.expect("built for multi-turn");
            let convs = conversation::conversations(
                multi_turn(m),
                synth,
                n,
                &mut rng_for(seed, streams::PROMPT_TOKENS),
            )?;
            Ok(convs.iter().map(|c| c.turn(0, &[])).collect())
        }
        Source::Compare(_) => unreachable!("compare sends no traffic"),
    }
}

fn multi_turn(m: &MultiTurnArgs) -> conversation::MultiTurn {
    conversation::MultiTurn {
        turns: m.turns,
        system_len: m.system_len,
        user_len: m.user_len,
        output_len: m.output_len,
    }
}

#[cfg(test)]
mod tests;
