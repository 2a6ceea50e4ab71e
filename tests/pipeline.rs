//! The actor pipeline end to end on the tiny model: inflight batching does not change
//! greedy results (with and without chunked context), cancellation frees every block,
//! stop_after_ms ends a request on time, an engine panic fails only the requests it held,
//! and a batch of prompts streams with batch_index.

mod common;

use std::time::{Duration, Instant};

use common::handle::wait_idle;
use common::scratch::Scratch;
use futures::StreamExt;

use inflight::model::tiny::{write_tiny_checkpoint, TinySpec};
use inflight::model::LoadedModel;
use inflight::scheduler::SchedulerPolicy;
use inflight::{Chunk, FinishReason, GenerationParams, ModelHandle, ModelOptions, Prompt, Request};

fn tiny_dir(tag: &str) -> Scratch {
    let dir = Scratch::new(&format!("pipeline-{tag}"));
    let spec = TinySpec {
        num_layers: 2,
        ..TinySpec::default()
    };
    write_tiny_checkpoint(&dir, &spec).unwrap();
    dir
}

async fn spawn(tag: &str, tweak: impl FnOnce(&mut ModelOptions)) -> ModelHandle {
    let model = LoadedModel::load(&tiny_dir(tag)).unwrap();
    let mut options = ModelOptions::for_model(model.model.config(), 64 * 1024);
    options.scheduler.block_size = 8;
    options.scheduler.num_blocks = 8 * 1024 / 8;
    tweak(&mut options);
    ModelHandle::spawn(model, options).await.unwrap()
}

fn greedy(max_tokens: usize) -> GenerationParams {
    GenerationParams {
        max_tokens,
        ignore_eos: true,
        ..GenerationParams::default()
    }
}

/// A prompt of `n` tokens that differs per `seed`.
fn prompt(seed: usize, n: usize) -> Prompt {
    Prompt::Tokens(
        (0..n)
            .map(|i| ((seed * 131 + i * 17) % 500) as u32)
            .collect(),
    )
}

async fn collect(handle: &ModelHandle, request: Request) -> Vec<Chunk> {
    let stream = handle.submit(request).await.expect("accepted");
    stream.collect().await
}

fn tokens(chunks: &[Chunk]) -> Vec<u32> {
    chunks
        .iter()
        .flat_map(|c| c.token_ids.iter().copied())
        .collect()
}

async fn batching_matches_alone(handle: ModelHandle) {
    let cases: Vec<(Prompt, usize)> = (0..64)
        .map(|i| (prompt(i, 3 + (i * 7) % 60), 4 + (i * 5) % 28))
        .collect();
    let mut alone = Vec::new();
    for (p, n) in &cases {
        let chunks = collect(
            &handle,
            Request {
                id: None,
                prompts: vec![p.clone()],
                params: greedy(*n),
            },
        )
        .await;
        alone.push(tokens(&chunks));
    }
    let monitor = {
        let h = handle.clone();
        tokio::spawn(async move {
            let mut peak = 0;
            for _ in 0..400 {
                peak = peak.max(h.stats().await.unwrap().running);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            peak
        })
    };
    let tasks: Vec<_> = cases
        .iter()
        .map(|(p, n)| {
            let h = handle.clone();
            let req = Request {
                id: None,
                prompts: vec![p.clone()],
                params: greedy(*n),
            };
            tokio::spawn(async move { collect(&h, req).await })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let chunks = t.await.unwrap();
        let last = chunks.last().unwrap();
        assert_eq!(
            last.finish_reason,
            Some(FinishReason::Length),
            "request {i}: {last:?}"
        );
        assert_eq!(
            tokens(&chunks),
            alone[i],
            "request {i} differs when batched"
        );
        assert_eq!(alone[i].len(), cases[i].1);
    }
    let s = wait_idle(&handle).await;
    assert_eq!(s.free_blocks, s.total_blocks);
    let peak = monitor.await.unwrap();
    assert!(
        peak >= 8,
        "requests were not batched together (peak running {peak})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_requests_match_their_solo_runs() {
    let handle = spawn("batch", |o| o.scheduler.max_batch_size = 64).await;
    batching_matches_alone(handle).await;
}

/// 64 prompts over four shared prefixes (8, 20, 33 and 64 tokens: inside a block, past
/// one, and whole blocks), each with its own tail, or none (the prompt is the prefix).
fn shared_prefix_prompts() -> Vec<Vec<u32>> {
    let prefixes: Vec<Vec<u32>> = [8usize, 20, 33, 64]
        .iter()
        .enumerate()
        .map(|(g, &n)| (0..n).map(|i| (g * 97 + i * 13) as u32 % 500).collect())
        .collect();
    (0..64)
        .map(|i| {
            let mut p = prefixes[i % 4].clone();
            p.extend((0..i % 13).map(|j| ((i * 31 + j * 7) % 500) as u32));
            p
        })
        .collect()
}

/// Each prompt's greedy tokens, every request at once (after one of each group alone
/// when `warm`, so that the rest find its prefix cached), and every final chunk's
/// cached-token count.
async fn shared_prefix_tokens(handle: &ModelHandle, warm: bool) -> (Vec<Vec<u32>>, usize) {
    let prompts = shared_prefix_prompts();
    let request = |p: &Vec<u32>| Request {
        id: None,
        prompts: vec![Prompt::Tokens(p.clone())],
        params: greedy(12),
    };
    if warm {
        for p in &prompts[..4] {
            collect(handle, request(p)).await;
        }
    }
    let mut streams = Vec::new();
    for p in &prompts {
        streams.push(handle.submit(request(p)).await.unwrap());
    }
    let (mut out, mut cached) = (Vec::new(), 0);
    for s in streams {
        let chunks: Vec<Chunk> = s.collect().await;
        cached += chunks.last().unwrap().cached_tokens;
        out.push(tokens(&chunks));
    }
    (out, cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefixes_give_the_same_tokens_with_reuse_on_and_off() {
    let off = spawn("reuse-off", |o| {
        o.scheduler.max_batch_size = 64;
        o.scheduler.enable_kv_cache_reuse = false;
    })
    .await;
    let (want, none) = shared_prefix_tokens(&off, true).await;
    assert_eq!(none, 0, "nothing is reused with reuse off");
    assert_eq!(off.stats().await.unwrap().prefix_hit_tokens, 0);
    let on = spawn("reuse-on", |o| o.scheduler.max_batch_size = 64).await;
    let (got, cached) = shared_prefix_tokens(&on, true).await;
    assert_eq!(got, want, "greedy tokens with reuse on and off");
    // Every warm group's whole blocks but one position: 60 prompts hit 0, 16, 32 or 56+.
    assert!(
        cached >= 15 * (16 + 32 + 56),
        "{cached} prompt tokens reused"
    );
    let stats = on.stats().await.unwrap();
    assert!(stats.prefix_hit_tokens as usize >= cached);
    assert!(stats.cached_blocks > 0);
    // Chunked prefills over cached prefixes, under max_utilization, agree too.
    let chunked = spawn("reuse-chunked", |o| {
        o.scheduler.max_batch_size = 64;
        o.scheduler.enable_chunked_context = true;
        o.scheduler.max_num_tokens = 24;
        o.scheduler.policy = SchedulerPolicy::MaxUtilization;
    })
    .await;
    assert_eq!(shared_prefix_tokens(&chunked, true).await.0, want);
    // A device cache too small to keep the prefixes (two sequences at a time fill it)
    // over a host tier: evicted prefix blocks come back from the host, and agree too.
    let tiered = spawn("reuse-host-tier", |o| {
        o.scheduler.max_batch_size = 2;
        o.scheduler.num_blocks = 24;
        o.scheduler.num_host_blocks = 256;
    })
    .await;
    let (got, cached) = shared_prefix_tokens(&tiered, true).await;
    assert_eq!(got, want, "greedy tokens through the host tier");
    let stats = tiered.stats().await.unwrap();
    assert!(
        stats.blocks_offloaded > 0 && stats.blocks_onloaded > 0,
        "{} blocks offloaded, {} back",
        stats.blocks_offloaded,
        stats.blocks_onloaded
    );
    assert!(stats.host_cached_blocks > 0);
    assert!(
        cached >= 15 * (16 + 32 + 56),
        "{cached} prompt tokens reused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_salt_keeps_requests_from_sharing_blocks() {
    let handle = spawn("salt", |_| {}).await;
    let prompt: Vec<u32> = (0..40).map(|i| (i * 11) % 500).collect();
    let run = |salt: Option<&str>| {
        let request = Request {
            id: None,
            prompts: vec![Prompt::Tokens(prompt.clone())],
            params: GenerationParams {
                cache_salt: salt.map(str::to_owned),
                ..greedy(4)
            },
        };
        let handle = &handle;
        async move {
            let chunks = collect(handle, request).await;
            (tokens(&chunks), chunks.last().unwrap().cached_tokens)
        }
    };
    let (first, none) = run(Some("tenant-a")).await;
    assert_eq!(none, 0);
    // Another tenant, and the common pool, find nothing; the same tenant finds its blocks.
    assert_eq!(run(Some("tenant-b")).await, (first.clone(), 0));
    assert_eq!(run(None).await.1, 0);
    assert_eq!(run(Some("tenant-a")).await, (first, 32));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_context_gives_the_same_results() {
    let handle = spawn("chunked", |o| {
        o.scheduler.enable_chunked_context = true;
        o.scheduler.max_num_tokens = 24;
        o.scheduler.policy = SchedulerPolicy::MaxUtilization;
    })
    .await;
    batching_matches_alone(handle).await;
}

/// A request's prompt token counts are known from submission, before any chunk: a
/// non-streamed answer sends none until it ends, and the HTTP layer logs them all the same
/// when the client leaves first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_token_counts_come_with_the_stream() {
    let handle = spawn("prompt-counts", |_| {}).await;
    let stream = handle
        .submit(Request {
            id: None,
            prompts: vec![prompt(1, 5), prompt(2, 9)],
            params: GenerationParams {
                stream: false,
                ..greedy(4)
            },
        })
        .await
        .unwrap();
    assert_eq!(stream.prompt_tokens(), &[5, 9]);
    let chunks: Vec<Chunk> = stream.collect().await;
    let mut seen: Vec<(usize, usize)> = chunks
        .iter()
        .map(|c| (c.batch_index, c.prompt_tokens))
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, vec![(0, 5), (1, 9)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_half_frees_every_block() {
    let handle = spawn("cancel", |_| {}).await;
    let total = handle.stats().await.unwrap().total_blocks;
    let mut streams = Vec::new();
    for i in 0..60 {
        let req = Request {
            id: Some(format!("r{i}")),
            prompts: vec![prompt(i, 20)],
            params: greedy(200),
        };
        streams.push(handle.submit(req).await.unwrap());
    }
    // Let every request start, then cancel the even ones three different ways.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut kept = Vec::new();
    for (i, s) in streams.into_iter().enumerate() {
        match i % 6 {
            0 | 2 => handle.cancel(&format!("r{i}")),
            4 => {
                drop(s);
                continue;
            }
            _ => {}
        }
        kept.push((i, s));
    }
    for (i, s) in kept {
        let chunks: Vec<Chunk> = s.collect().await;
        let reason = chunks.last().unwrap().finish_reason;
        let want = if i % 2 == 0 {
            FinishReason::Cancelled
        } else {
            FinishReason::Length
        };
        assert_eq!(reason, Some(want), "request {i}");
    }
    let s = wait_idle(&handle).await;
    assert_eq!((s.free_blocks, s.total_blocks), (total, total));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_after_ms_ends_the_request_on_time() {
    let handle = spawn("timeout", |_| {}).await;
    // 16 prompts of 2000 tokens each: far more work than 200 ms allows on any machine.
    let params = GenerationParams {
        stop_after_ms: Some(200),
        ..greedy(2000)
    };
    let prompts = (0..16).map(|i| prompt(i, 10)).collect();
    let start = Instant::now();
    let chunks = collect(
        &handle,
        Request {
            id: None,
            prompts,
            params,
        },
    )
    .await;
    let elapsed = start.elapsed();
    let finals: Vec<&Chunk> = chunks.iter().filter(|c| c.is_final()).collect();
    assert_eq!(finals.len(), 16);
    assert!(finals
        .iter()
        .all(|c| c.finish_reason == Some(FinishReason::Cancelled)));
    assert!(
        elapsed >= Duration::from_millis(200) && elapsed < Duration::from_millis(400),
        "took {elapsed:?}"
    );
    assert!(tokens(&chunks).len() < 16 * 2000);
}

/// A request that ended before its stop_after_ms timer fired leaves its id free: a later
/// request reusing the id is not cancelled by the old timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_timer_does_not_cancel_a_request_that_reuses_its_id() {
    let handle = spawn("timer-reuse", |_| {}).await;
    let request = |max_tokens, stop_after_ms| Request {
        id: Some("reused".into()),
        prompts: vec![prompt(3, 10)],
        params: GenerationParams {
            stop_after_ms,
            ..greedy(max_tokens)
        },
    };
    let short = collect(&handle, request(2, Some(150))).await;
    assert_eq!(
        short.last().unwrap().finish_reason,
        Some(FinishReason::Length)
    );
    // Runs well past the first request's 150 ms deadline.
    let start = Instant::now();
    let long = collect(&handle, request(1900, None)).await;
    assert!(
        start.elapsed() > Duration::from_millis(150),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        long.last().unwrap().finish_reason,
        Some(FinishReason::Length)
    );
    assert_eq!(tokens(&long).len(), 1900);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_keeps_failing_stops_the_model_and_leaves_no_request_waiting() {
    // One sequence at a time: the second request waits in the queue, its KV state nowhere.
    let handle = spawn("giveup", |o| o.scheduler.max_batch_size = 1).await;
    let wait_ready = || async {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !handle.is_ready() {
            assert!(Instant::now() < deadline, "not ready again after a restart");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let submit = |seed| {
        handle.submit(Request {
            id: None,
            prompts: vec![prompt(seed, 8)],
            params: greedy(1000),
        })
    };
    // Five failures (each on the next step after the fault is armed) are restarted from.
    for i in 0..5 {
        wait_ready().await;
        handle.inject_engine_fault();
        // Armed before the request's first step: an engine that served a step would clear
        // the count.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let failed: Vec<Chunk> = submit(10 + i).await.unwrap().collect().await;
        assert_eq!(
            failed.last().unwrap().finish_reason,
            Some(FinishReason::Error)
        );
    }
    wait_ready().await;
    // The sixth within the window, again of an engine that served no step, stops the
    // model: both requests end with an error.
    handle.inject_engine_fault();
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The first runs the failing step, the second is queued behind it; either may be
    // refused instead once the model has stopped (the tiny model fails within the submit).
    let (running, queued) = (submit(1).await, submit(2).await);
    for s in running.into_iter().chain(queued) {
        let chunks: Vec<Chunk> = tokio::time::timeout(Duration::from_secs(10), s.collect())
            .await
            .expect("no request waits for an engine that will not come");
        assert_eq!(
            chunks.last().unwrap().finish_reason,
            Some(FinishReason::Error)
        );
    }
    assert!(!handle.is_ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_panic_fails_held_requests_and_recovers() {
    let handle = spawn("panic", |_| {}).await;
    let mut streams = Vec::new();
    for i in 0..4 {
        streams.push(
            handle
                .submit(Request {
                    id: None,
                    prompts: vec![prompt(i, 8)],
                    params: greedy(1000),
                })
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    handle.inject_engine_fault();
    for s in streams {
        let chunks: Vec<Chunk> = tokio::time::timeout(Duration::from_secs(10), s.collect())
            .await
            .expect("no hang");
        let last = chunks.last().unwrap();
        assert_eq!(last.finish_reason, Some(FinishReason::Error));
        assert!(
            last.error
                .as_deref()
                .unwrap_or("")
                .contains("engine failed"),
            "{last:?}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !handle.is_ready() {
        assert!(
            Instant::now() < deadline,
            "not ready again after the restart"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let chunks = collect(
        &handle,
        Request {
            id: None,
            prompts: vec![prompt(9, 8)],
            params: greedy(5),
        },
    )
    .await;
    assert_eq!(
        chunks.last().unwrap().finish_reason,
        Some(FinishReason::Length)
    );
    assert_eq!(tokens(&chunks).len(), 5);
    let s = wait_idle(&handle).await;
    assert_eq!(s.free_blocks, s.total_blocks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_prompts_streams_with_batch_index() {
    let handle = spawn("fanout", |_| {}).await;
    let prompts = vec![prompt(1, 5), prompt(2, 9), prompt(3, 3)];
    let lens = [3, 7, 5];
    let mut alone = Vec::new();
    for (p, n) in prompts.iter().zip(lens) {
        alone.push(tokens(
            &collect(
                &handle,
                Request {
                    id: None,
                    prompts: vec![p.clone()],
                    params: greedy(n),
                },
            )
            .await,
        ));
    }
    // One request, three prompts; a per-prompt max_tokens is not a thing, so use the max
    // and compare prefixes.
    let chunks = collect(
        &handle,
        Request {
            id: None,
            prompts: prompts.clone(),
            params: greedy(7),
        },
    )
    .await;
    for (i, want) in alone.iter().enumerate() {
        let got: Vec<u32> = chunks
            .iter()
            .filter(|c| c.batch_index == i)
            .flat_map(|c| c.token_ids.clone())
            .collect();
        assert_eq!(got.len(), 7);
        assert_eq!(
            &got[..want.len().min(7)],
            &want[..want.len().min(7)],
            "prompt {i}"
        );
        let finals = chunks
            .iter()
            .filter(|c| c.batch_index == i && c.is_final())
            .count();
        assert_eq!(finals, 1, "prompt {i} has one final chunk");
    }
    assert!(chunks.iter().all(|c| c.batch_index < 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_rejects_at_once() {
    let handle = spawn("queue", |o| {
        o.scheduler.max_queue_size = 2;
        o.scheduler.max_batch_size = 1;
    })
    .await;
    let mut held = Vec::new();
    let mut rejected = None;
    for i in 0..10 {
        match handle
            .submit(Request {
                id: None,
                prompts: vec![prompt(i, 4)],
                params: greedy(500),
            })
            .await
        {
            Ok(s) => held.push(s),
            Err(e) => {
                rejected = Some(e);
                break;
            }
        }
    }
    let e = rejected.expect("the queue filled up");
    assert!(
        matches!(e, inflight::actors::messages::SubmitError::QueueFull(_)),
        "{e:?}"
    );
    assert!(e.to_string().contains("queue"), "{e}");
    drop(held);
    wait_idle(&handle).await;
}
