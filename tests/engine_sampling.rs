//! Sampling inside the Engine (the path a GPU takes: per-row plans run by the forward
//! pass, only token ids and log-probabilities back) gives exactly what the Sampler actor
//! gives from logits: same tokens, same log-probabilities, same finish reasons, for
//! greedy and seeded requests with every sampling feature, batched together, with
//! speculation by prompt lookup and by a draft model (whose standard-rule rows fall back
//! to logits), and after preemption; the raw logits rows that requests ask for
//! (`return_context_logits`, `return_generation_logits`) the same on both paths. On the CPU here; scripts/gpu-check.sh runs the
//! speculative and HTTP suites on the GPU, where the engine always samples this way.

mod common;

use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;

use common::handle::wait_idle;
use common::scratch::Scratch;
use inflight::model::tiny::{write_tiny_checkpoint, TinySpec};
use inflight::model::{CpuBackend, LoadedModel};
use inflight::scheduler::SchedulerPolicy;
use inflight::speculative::{DraftSource, SpeculativeOptions};
use inflight::{Chunk, GenerationParams, ModelHandle, ModelOptions, Prompt, Request};

fn model_dir(tag: &str, seed: u64) -> Scratch {
    let dir = Scratch::new(&format!("esamp-{tag}"));
    let spec = TinySpec {
        num_layers: 2,
        seed,
        ..TinySpec::default()
    };
    write_tiny_checkpoint(&dir, &spec).unwrap();
    dir
}

/// A handle on the tiny model; `in_engine` samples inside the Engine actor. `blocks`
/// small (with the policy that admits on what is free now) forces preemption.
async fn spawn(
    dir: &Path,
    in_engine: bool,
    blocks: usize,
    speculative: Option<SpeculativeOptions>,
) -> ModelHandle {
    spawn_swapping(dir, in_engine, blocks, 0, speculative).await
}

/// [`spawn`] with a host cache of `host_blocks` that preemption swaps to.
async fn spawn_swapping(
    dir: &Path,
    in_engine: bool,
    blocks: usize,
    host_blocks: usize,
    speculative: Option<SpeculativeOptions>,
) -> ModelHandle {
    let m = LoadedModel::load(dir).unwrap();
    let config = m.model.config().clone();
    let mut options = ModelOptions::for_model(&config, 64 * 1024);
    options.scheduler.block_size = 8;
    options.scheduler.max_batch_size = 16;
    options.scheduler.num_blocks = blocks;
    options.scheduler.num_host_blocks = host_blocks;
    if blocks < 4096 {
        options.scheduler.policy = SchedulerPolicy::MaxUtilization;
    }
    options.speculative = speculative;
    common::handle::spawn_cpu(m, options, in_engine).await
}

/// Per case: the params.
fn params(i: usize) -> GenerationParams {
    let mut p = GenerationParams {
        max_tokens: 6 + i % 11,
        return_log_probs: true,
        random_seed: Some(500 + i as u64),
        ..GenerationParams::default()
    };
    match i % 6 {
        0 => {}
        1 => p.temperature = 0.8,
        2 => {
            p.temperature = 1.1;
            p.top_k = 5;
            p.top_p = 0.7;
        }
        3 => {
            p.temperature = 0.6;
            p.repetition_penalty = 1.4;
            p.presence_penalty = 0.3;
            p.frequency_penalty = 0.2;
        }
        4 => {
            p.top_k = 3;
            p.temperature = 1.0;
            p.min_length = 4;
            p.bad_words = vec![vec![7], vec![3, 4]];
            p.end_id = Some(11);
        }
        _ => {
            p.temperature = 0.9;
            p.top_p = 0.5;
            p.stop_words = vec![vec![2], vec![5, 6]];
            p.use_draft_logits = true;
        }
    }
    p
}

/// [`params`], each case asking for its raw logits rows too (generation, context or
/// both): they come back as logits, sampled on the host, with no speculation.
fn logits_params(i: usize) -> GenerationParams {
    GenerationParams {
        return_generation_logits: i % 3 != 1,
        return_context_logits: !i.is_multiple_of(3),
        ..params(i)
    }
}

fn prompt(i: usize) -> Vec<u32> {
    let n = 2 + (i * 5) % 23;
    (0..n)
        .map(|j| ((i * 37 + (j % 4) * 11) % 300) as u32)
        .collect()
}

/// Every case at once (they batch), each answer with its tokens and log-probs.
async fn run(handle: &ModelHandle, cases: usize) -> Vec<Chunk> {
    run_counting(handle, cases).await.0
}

/// [`run`] with the cases' parameters from `params_of`.
async fn run_with(
    handle: &ModelHandle,
    cases: usize,
    params_of: fn(usize) -> GenerationParams,
) -> Vec<Chunk> {
    run_counting_with(handle, cases, params_of).await.0
}

/// [`run`], and how many iterations were planned ahead (overlap) during it.
async fn run_counting(handle: &ModelHandle, cases: usize) -> (Vec<Chunk>, u64) {
    run_counting_with(handle, cases, params).await
}

async fn run_counting_with(
    handle: &ModelHandle,
    cases: usize,
    params_of: fn(usize) -> GenerationParams,
) -> (Vec<Chunk>, u64) {
    let before = handle.stats().await.unwrap().planned_ahead;
    let mut streams = Vec::new();
    for i in 0..cases {
        let request = Request {
            id: None,
            prompts: vec![Prompt::Tokens(prompt(i))],
            params: params_of(i),
        };
        streams.push(handle.submit(request).await.expect("accepted"));
    }
    let mut answers = Vec::new();
    for s in streams {
        let chunks: Vec<Chunk> = s.collect().await;
        answers.push(inflight::request::answers(chunks, 1).remove(0));
    }
    let after = wait_idle(handle).await.planned_ahead;
    (answers, after - before)
}

fn assert_same(a: &[Chunk], b: &[Chunk], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(!x.token_ids.is_empty(), "{what}: case {i} is empty");
        assert_eq!(x.token_ids, y.token_ids, "{what}: case {i} tokens");
        assert_eq!(x.finish_reason, y.finish_reason, "{what}: case {i} finish");
        assert_eq!(x.log_probs, y.log_probs, "{what}: case {i} log-probs");
        assert_eq!(
            x.generation_logits, y.generation_logits,
            "{what}: case {i} generation logits"
        );
        assert_eq!(
            x.context_logits, y.context_logits,
            "{what}: case {i} context logits"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logits_rows_are_the_same_on_both_paths() {
    let dir = model_dir("logits", 7);
    let base = run_with(&spawn(&dir, false, 4096, None).await, 36, logits_params).await;
    for (i, c) in base.iter().enumerate() {
        let p = logits_params(i);
        let gen = if p.return_generation_logits {
            c.token_ids.len()
        } else {
            0
        };
        let ctx = if p.return_context_logits {
            prompt(i).len()
        } else {
            0
        };
        assert_eq!(c.generation_logits.len(), gen, "case {i}");
        assert_eq!(c.context_logits.len(), ctx, "case {i}");
    }
    let engine = run_with(&spawn(&dir, true, 4096, None).await, 36, logits_params).await;
    assert_same(&base, &engine, "logits, no speculation");
    let tight = spawn(&dir, true, 24, None).await;
    let preempted = run_with(&tight, 36, logits_params).await;
    assert_same(&base, &preempted, "logits, preemption");
    assert!(tight.stats().await.unwrap().preemptions > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_in_the_engine_matches_the_sampler_actor() {
    let dir = model_dir("plain", 7);
    let (base, ahead) = run_counting(&spawn(&dir, false, 4096, None).await, 36).await;
    assert_eq!(ahead, 0, "the Sampler actor's path is not planned ahead");
    // The engine that samples runs iterations planned ahead: decodes take the previous
    // iteration's tokens from its result, and stops are seen one iteration late.
    let (engine, ahead) = run_counting(&spawn(&dir, true, 4096, None).await, 36).await;
    assert_same(&base, &engine, "no speculation");
    assert!(ahead > 5, "{ahead} iterations planned ahead");
    // Few blocks: sequences are preempted and recomputed, and the engine rebuilds their
    // sampling state from their tokens.
    let tight = spawn(&dir, true, 24, None).await;
    let (preempted, ahead) = run_counting(&tight, 36).await;
    assert_same(&base, &preempted, "preemption");
    assert!(ahead > 0, "planned ahead under preemption too");
    assert!(tight.stats().await.unwrap().preemptions > 0);
    // With a host cache, preemption swaps blocks out and back: the engines keep each
    // sequence's state and nothing is recomputed. Both sampling paths.
    for in_engine in [false, true] {
        let swapping = spawn_swapping(&dir, in_engine, 24, 64, None).await;
        let (swapped, _) = run_counting(&swapping, 36).await;
        assert_same(&base, &swapped, "preemption by swapping");
        let stats = swapping.stats().await.unwrap();
        assert!(stats.swap_outs > 0, "nothing was swapped");
        assert_eq!(
            stats.preemptions, 0,
            "the host cache had room: no recompute"
        );
        assert_eq!(stats.blocks_swapped_out, stats.blocks_swapped_in);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_in_the_engine_matches_under_speculation() {
    let dir = model_dir("spec", 7);
    let draft_dir = model_dir("spec-draft", 9);
    let lookup = || SpeculativeOptions {
        draft: DraftSource::PromptLookup {
            min_ngram: 1,
            max_ngram: 3,
        },
        num_draft_tokens: 4,
    };
    let base = run(&spawn(&dir, false, 4096, Some(lookup())).await, 36).await;
    let engine = run(&spawn(&dir, true, 4096, Some(lookup())).await, 36).await;
    assert_same(&base, &engine, "prompt lookup");
    let drafted: usize = engine.iter().map(|c| c.draft_tokens).sum();
    assert!(drafted > 0, "prompt lookup proposed nothing");

    let draft = || {
        let m = LoadedModel::load(&draft_dir).unwrap().model;
        SpeculativeOptions {
            draft: DraftSource::Model {
                vocab_size: m.config().vocab_size,
                backend: Arc::new(CpuBackend::new(Arc::new(m))),
            },
            num_draft_tokens: 3,
        }
    };
    let base = run(&spawn(&dir, false, 4096, Some(draft())).await, 36).await;
    let engine = run(&spawn(&dir, true, 4096, Some(draft())).await, 36).await;
    assert_same(&base, &engine, "draft model");
}
