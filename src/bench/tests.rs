//! `inflight bench` end to end: options as the command line gives them, the traffic a
//! seed fixes, and whole runs against the real server (in-process, tiny model) on every
//! endpoint, with the failure paths (server down, every request refused).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

use super::*;
use crate::http::{serve_on, AppState};
use crate::model::tiny::{write_tiny_checkpoint, TinySpec};
use crate::model::LoadedModel;
use crate::{ModelHandle, ModelOptions};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    Bench(BenchArgs),
}

fn parse(line: &str) -> BenchArgs {
    let argv = std::iter::once("inflight").chain(line.split_whitespace());
    match Cli::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("{line}: {e}"))
        .command
    {
        Command::Bench(a) => a,
    }
}

fn tiny_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("inflight-bench-tiny-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_tiny_checkpoint(
            &dir,
            &TinySpec {
                num_layers: 2,
                ..TinySpec::default()
            },
        )
        .unwrap();
        dir
    })
}

#[test]
fn options_parse_before_or_after_the_source() {
    let a = parse("bench token-norm-dist --input-mean 128 --output-mean 64 --concurrency 8 --endpoint openai-completions");
    assert_eq!(
        (a.concurrency, a.endpoint, a.num_requests, a.warmup),
        (Some(8), Endpoint::OpenaiCompletions, 128, 2)
    );
    let Source::TokenNormDist(d) = &a.source else {
        panic!("token-norm-dist")
    };
    assert_eq!(
        (d.input_mean, d.input_stdev, d.output_mean),
        (128.0, 0.0, 64.0)
    );
    let b = parse("bench --url localhost:9 --request-rate 2.5 --arrival exponential dataset --dataset x.json --output-len 5");
    assert_eq!(
        (b.url.as_str(), b.request_rate, b.arrival),
        ("localhost:9", Some(2.5), ArrivalKind::Poisson)
    );
    assert!(matches!(&b.source, Source::Dataset(d) if d.output_len == Some(5)));
    assert_eq!(arrivals(&b), Arrivals::Poisson { rate: 2.5 });
    let g = parse("bench --endpoint generate_stream compare a.json b.json --markdown");
    assert!(matches!(&g.source, Source::Compare(c) if c.reports.len() == 2 && c.markdown));
    assert!(
        Cli::try_parse_from(["inflight", "bench", "token-norm-dist", "--input-mean", "4"]).is_err()
    );
}

#[test]
fn bad_options_are_refused_before_any_request() {
    let tok = format!("--tokenizer {}", tiny_dir().display());
    for bad in [
        "--num-requests 0",
        "--request-rate 0",
        "--request-rate=-3",
        "--concurrency 0",
        "--extra-body [1]",
        "--timeout-s 0",
    ] {
        let a = parse(&format!(
            "bench {tok} {bad} token-norm-dist --input-mean 8 --output-mean 4"
        ));
        assert!(matches!(prepare(&a), Err(BenchError::Setup(_))), "{bad}");
    }
    let a = parse(&format!(
        "bench {tok} token-norm-dist --input-mean 0 --output-mean 4"
    ));
    assert!(prepare(&a).is_err());
}

#[test]
fn more_requests_in_flight_than_open_files_are_refused() {
    // Off Unix there is no limit to read; an unlimited one leaves nothing to refuse.
    let Some(limit) = crate::fdlimit::raise_open_files().filter(|&l| l < 1 << 24) else {
        return;
    };
    let tok = format!("--tokenizer {}", tiny_dir().display());
    let over = limit + 1;
    let all_at_once = parse(&format!(
        "bench {tok} --num-requests {over} token-norm-dist --input-mean 8 --output-mean 4"
    ));
    match prepare(&all_at_once) {
        Err(BenchError::Setup(m)) => assert!(m.contains("--concurrency"), "{m}"),
        other => panic!(
            "{over} requests at once were not refused: {:?}",
            other.err()
        ),
    }
    let capped = parse(&format!(
        "bench {tok} --num-requests {over} --concurrency 64 token-norm-dist --input-mean 8 --output-mean 4"
    ));
    assert_eq!(prepare(&capped).unwrap().1.requests.len() as u64, over);
}

#[test]
fn the_seed_fixes_the_traffic_and_warmup_does_not_change_it() {
    let line = |extra: &str| {
        format!(
            "bench --tokenizer {} --num-requests 20 --request-rate 5 {extra} token-norm-dist --input-mean 24 --input-stdev 6 --output-mean 8 --output-stdev 2",
            tiny_dir().display()
        )
    };
    let (_, a) = prepare(&parse(&line("--seed 1"))).unwrap();
    let (_, b) = prepare(&parse(&line("--seed 1 --warmup 7"))).unwrap();
    let (_, c) = prepare(&parse(&line("--seed 2"))).unwrap();
    assert_eq!(
        (a.requests.clone(), a.gaps.clone()),
        (b.requests.clone(), b.gaps.clone())
    );
    assert_eq!((a.warmup.len(), b.warmup.len()), (2, 7));
    assert_ne!(a.requests, c.requests);
    assert_ne!(a.gaps, c.gaps);
    assert_eq!(a.requests.len(), 20);
    assert!(
        a.requests.iter().any(|r| r.input_tokens != 24),
        "lengths vary with the stdev"
    );
}

/// The real server on the tiny model, on its own runtime and thread; dropped, it stops.
struct Server {
    base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start() -> Server {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let model = LoadedModel::load(tiny_dir()).unwrap();
                let mut options = ModelOptions::for_model(model.model.config(), 16 * 1024);
                options.scheduler.block_size = 16;
                let state = AppState::new(ModelHandle::spawn(model, options).await.unwrap());
                let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(format!("http://{}", http.local_addr().unwrap()))
                    .unwrap();
                let shutdown = async move {
                    let _ = stopped.await;
                };
                let limits = crate::http::ServeLimits {
                    drain_timeout: Duration::from_secs(5),
                    ..Default::default()
                };
                serve_on(state, http, metrics, None, shutdown, limits)
                    .await
                    .unwrap();
            });
        });
        let base = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("server starts");
        Server {
            base,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        let _ = self.thread.take().map(|t| t.join());
    }
}

fn json_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("inflight-bench-{tag}-{}.json", std::process::id()))
}

#[test]
fn whole_runs_on_every_endpoint_measure_the_asked_lengths() {
    let server = Server::start();
    for (endpoint, conc) in [
        ("generate_stream", "--concurrency 3"),
        ("openai-completions", "--request-rate 200"),
        ("openai-chat", "--concurrency 2"),
    ] {
        let out = json_path(endpoint);
        let a = parse(&format!(
            "bench --url {} --endpoint {endpoint} --tokenizer {} --num-requests 6 --warmup 1 {conc} --no-progress \
             --slo-ttft-ms 60000 --json {} --label tiny-{endpoint} token-norm-dist --input-mean 12 --output-mean 6 --output-stdev 2",
            server.base,
            tiny_dir().display(),
            out.display()
        ));
        run(a).unwrap_or_else(|e| panic!("{endpoint}: {e}"));
        let r = Report::read(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        let s = &r.summary;
        assert_eq!(
            (s.total_requests, s.completed, s.failed),
            (6, 6, 0),
            "{endpoint}: {:?}",
            s.errors
        );
        assert_eq!(
            s.output_length_mismatches, 0,
            "{endpoint}: ignore_eos forces the lengths"
        );
        assert_eq!(
            s.total_output_tokens,
            r.requests
                .iter()
                .map(|q| q.expected_output_tokens)
                .sum::<usize>()
        );
        for q in &r.requests {
            // Triton events count their tokens; OpenAI servers skip tokens that end
            // inside a character (the tiny model's random bytes often do), so a chunk
            // may carry two and give one gap.
            let gaps = q.itl_s.len();
            let exact = endpoint == "generate_stream";
            assert!(
                q.ttft_s.is_some()
                    && (gaps == q.output_tokens - 1 || !exact && gaps < q.output_tokens),
                "{endpoint}: {q:?}"
            );
        }
        assert_eq!(s.goodput.unwrap().good_requests, 6);
        assert!(r.config["resolved"]["model"].is_string());
        assert_eq!(r.config["endpoint"], endpoint);
        if endpoint == "openai-chat" {
            assert!(
                s.avg_input_tokens > 12.0,
                "usage counts the chat template too"
            );
        }
    }
}

#[test]
fn failures_are_counted_and_fail_the_run() {
    let tok = tiny_dir().display().to_string();
    let down = parse(&format!("bench --url 127.0.0.1:1 --tokenizer {tok} --no-progress token-norm-dist --input-mean 4 --output-mean 2"));
    let err = run(down).unwrap_err();
    assert!(matches!(err, BenchError::Unreachable { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("cannot reach the server at http://127.0.0.1:1"),
        "{err}"
    );
    let server = Server::start();
    let out = json_path("refused");
    let refused = parse(&format!(
        "bench --url {} --model no-such-model --tokenizer {tok} --num-requests 4 --no-progress --json {} token-norm-dist --input-mean 4 --output-mean 2",
        server.base,
        out.display()
    ));
    let err = run(refused).unwrap_err();
    assert!(
        matches!(
            err,
            BenchError::MostFailed {
                failed: 4,
                total: 4,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("HTTP 400"), "{err}");
    let s = Report::read(&out).unwrap().summary;
    let _ = std::fs::remove_file(&out);
    assert_eq!(
        (s.failed, s.errors.len()),
        (4, 1),
        "the report is written before the run fails"
    );
}
