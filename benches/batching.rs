//! What inflight batching buys on this machine: total output tokens/s of the default model
//! for 1, 4, 16 and 64 concurrent requests through the library API (the whole actor
//! pipeline, no HTTP). Each request: a ~128-token prompt, 64 output tokens (ignore_eos).
//!
//! `cargo bench --bench batching [-- CONCURRENCY...]`

use std::time::Instant;

use futures::StreamExt;
use inflight::model::LoadedModel;
use inflight::{GenerationParams, ModelHandle, ModelOptions, Prompt, Request};

const OUTPUT_TOKENS: usize = 64;

fn prompt(i: usize) -> String {
    let words = [
        "the", "model", "serves", "many", "requests", "at", "once", "while", "blocks", "of",
        "cache", "move",
    ];
    (0..110)
        .map(|j| words[(i * 7 + j * 3) % words.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

async fn run(handle: &ModelHandle, concurrency: usize, total: usize) -> (f64, f64) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let h = handle.clone();
        tasks.push(tokio::spawn(async move {
            let mut tokens = 0;
            let mut i = worker;
            while i < total {
                let params = GenerationParams {
                    max_tokens: OUTPUT_TOKENS,
                    ignore_eos: true,
                    ..Default::default()
                };
                let req = Request {
                    id: None,
                    prompts: vec![Prompt::Text(prompt(i))],
                    params,
                };
                let stream = h.submit(req).await.expect("accepted");
                tokens += stream
                    .map(|c| c.token_ids.len())
                    .fold(0, |a, n| async move { a + n })
                    .await;
                i += concurrency;
            }
            tokens
        }));
    }
    let mut tokens = 0;
    for t in tasks {
        tokens += t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    (tokens as f64 / secs, secs)
}

#[tokio::main]
async fn main() {
    let levels: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let levels = if levels.is_empty() {
        vec![1, 4, 16, 64]
    } else {
        levels
    };
    let path = inflight::fetch::default_model_path().expect("default model");
    let model = LoadedModel::load(&path).expect("loads");
    let mut options = ModelOptions::for_model(model.model.config(), 64 * 1024);
    options.scheduler.max_batch_size = 64;
    let handle = ModelHandle::spawn(model, options).await.expect("spawns");
    let _ = run(&handle, 1, 1).await; // warm-up
    println!("| concurrent requests | requests | output tokens/s | wall s |");
    println!("|---|---|---|---|");
    for c in levels {
        let total = (c * 2).max(4);
        let (tps, secs) = run(&handle, c, total).await;
        println!("| {c} | {total} | {tps:.1} | {secs:.1} |");
    }
}
