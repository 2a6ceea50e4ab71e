//! Speculative decoding end to end through the actor pipeline, with a tiny model as the
//! target and each draft source: greedy output is token-for-token what it is without
//! speculation (batching on, many prompts); seeded sampling with token matching is too;
//! with `use_draft_logits` a draft identical to the target is always accepted;
//! cancellation and stop_after_ms still end speculative requests and free every block.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::handle::wait_idle;
use common::scratch::Scratch;
use futures::StreamExt;

use inflight::model::device::Device;
use inflight::model::tiny::{write_tiny_checkpoint, TinySpec};
use inflight::model::LoadedModel;
use inflight::speculative::{DraftSource, SpeculativeOptions};
use inflight::{Chunk, FinishReason, GenerationParams, ModelHandle, ModelOptions, Prompt, Request};

fn model_dir(tag: &str, seed: u64, layers: usize) -> Scratch {
    let dir = Scratch::new(&format!("spec-{tag}"));
    let spec = TinySpec {
        num_layers: layers,
        seed,
        ..TinySpec::default()
    };
    write_tiny_checkpoint(&dir, &spec).unwrap();
    dir
}

/// The target model, written afresh for each test (tests run in parallel).
fn target_dir(test: &str) -> Scratch {
    model_dir(&format!("target-{test}"), 7, 2)
}

/// A draft model on the device the target runs on (`$INFLIGHT_DEVICE`, the CPU in CI).
fn draft_model(dir: &Path) -> DraftSource {
    let m = LoadedModel::load(dir).unwrap().model;
    DraftSource::Model {
        vocab_size: m.config().vocab_size,
        backend: Device::from_env().backend(m, None).unwrap(),
    }
}

fn prompt_lookup() -> DraftSource {
    DraftSource::PromptLookup {
        min_ngram: 1,
        max_ngram: 3,
    }
}

async fn spawn(target: &Path, draft: Option<DraftSource>) -> ModelHandle {
    let model = LoadedModel::load(target).unwrap();
    let mut options = ModelOptions::for_model(model.model.config(), 64 * 1024);
    options.scheduler.block_size = 8;
    options.scheduler.max_batch_size = 16;
    options.speculative = draft.map(|draft| SpeculativeOptions {
        draft,
        num_draft_tokens: 4,
    });
    ModelHandle::spawn(model, options).await.unwrap()
}

/// Prompts of varied lengths: half of them repeat a pattern (prompt lookup finds its
/// n-grams), half are irregular.
fn cases() -> Vec<(Prompt, usize)> {
    (0..32)
        .map(|i| {
            let n = 3 + (i * 7) % 40;
            let tokens: Vec<u32> = if i % 2 == 0 {
                (0..n)
                    .map(|j| ((i * 13 + (j % 5) * 31) % 500) as u32)
                    .collect()
            } else {
                (0..n)
                    .map(|j| ((i * 131 + j * j * 17) % 500) as u32)
                    .collect()
            };
            (Prompt::Tokens(tokens), 6 + (i * 5) % 30)
        })
        .collect()
}

/// Every case at once (so they batch), each with `params(i)`; per case its final
/// answer.
async fn run(handle: &ModelHandle, params: impl Fn(usize) -> GenerationParams) -> Vec<Chunk> {
    let mut streams = Vec::new();
    for (i, (prompt, max_tokens)) in cases().into_iter().enumerate() {
        let request = Request {
            id: None,
            prompts: vec![prompt],
            params: GenerationParams {
                max_tokens,
                ..params(i)
            },
        };
        streams.push(handle.submit(request).await.expect("accepted"));
    }
    let mut answers = Vec::new();
    for s in streams {
        let chunks: Vec<Chunk> = s.collect().await;
        answers.push(inflight::request::answers(chunks, 1).remove(0));
    }
    answers
}

fn greedy(_: usize) -> GenerationParams {
    GenerationParams {
        ignore_eos: true,
        ..GenerationParams::default()
    }
}

fn sampled(i: usize) -> GenerationParams {
    GenerationParams {
        temperature: 0.5,
        top_p: 0.95,
        random_seed: Some(1000 + i as u64),
        ignore_eos: true,
        ..GenerationParams::default()
    }
}

/// Same tokens case by case; returns (drafted, accepted) summed over the cases.
fn assert_same(base: &[Chunk], spec: &[Chunk], what: &str) -> (usize, usize) {
    for (i, (a, b)) in base.iter().zip(spec).enumerate() {
        assert_eq!(
            b.finish_reason,
            Some(FinishReason::Length),
            "{what}, case {i}"
        );
        assert_eq!(a.token_ids, b.token_ids, "{what}: case {i} differs");
        assert!(b.accepted_draft_tokens <= b.draft_tokens);
    }
    let drafted = spec.iter().map(|c| c.draft_tokens).sum();
    let accepted = spec.iter().map(|c| c.accepted_draft_tokens).sum();
    let tokens: usize = spec.iter().map(|c| c.token_ids.len()).sum();
    eprintln!("{what}: {tokens} tokens identical, {accepted} of {drafted} draft tokens accepted");
    (drafted, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_is_unchanged_by_every_draft_source() {
    let target = target_dir("greedy");
    let base = run(&spawn(&target, None).await, greedy).await;
    assert!(base.iter().all(|c| c.draft_tokens == 0));

    let lookup = run(&spawn(&target, Some(prompt_lookup())).await, greedy).await;
    let (drafted, accepted) = assert_same(&base, &lookup, "prompt lookup");
    assert!(
        accepted > 0,
        "prompt lookup: {accepted} of {drafted} accepted"
    );

    // The target's first layer alone (same seed, one layer): a different model whose
    // guesses are often right, as a layer-skipping draft's are.
    let first_layer = model_dir("draft-first-layer", 7, 1);
    let with_first = run(
        &spawn(&target, Some(draft_model(&first_layer))).await,
        greedy,
    )
    .await;
    let (drafted, accepted) = assert_same(&base, &with_first, "the target's first layer");
    assert!(
        accepted > 0 && accepted < drafted,
        "{accepted} of {drafted}"
    );

    // An unrelated model: its guesses are all wrong, and nothing changes.
    let other = model_dir("draft-other", 11, 1);
    let with_other = run(&spawn(&target, Some(draft_model(&other))).await, greedy).await;
    let (drafted, _) = assert_same(&base, &with_other, "an unrelated draft model");
    assert!(drafted > 0);

    // The target as its own draft: every draft token is accepted.
    let with_self = run(&spawn(&target, Some(draft_model(&target))).await, greedy).await;
    let (drafted, accepted) = assert_same(&base, &with_self, "the target as draft");
    assert_eq!(
        accepted, drafted,
        "a draft identical to the target is always right"
    );
    assert!(drafted > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampling_with_token_matching_is_unchanged() {
    let target = target_dir("sampling");
    let base = run(&spawn(&target, None).await, sampled).await;
    let lookup = run(&spawn(&target, Some(prompt_lookup())).await, sampled).await;
    assert_same(&base, &lookup, "prompt lookup, sampling");
    let first_layer = model_dir("draft-sampling", 7, 1);
    let with_first = run(
        &spawn(&target, Some(draft_model(&first_layer))).await,
        sampled,
    )
    .await;
    let (drafted, accepted) = assert_same(&base, &with_first, "first-layer draft, sampling");
    assert!(accepted > 0, "{accepted} of {drafted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draft_logits_of_an_identical_draft_are_always_accepted() {
    let target = target_dir("draft-logits");
    let handle = spawn(&target, Some(draft_model(&target))).await;
    let answers = run(&handle, |i| GenerationParams {
        use_draft_logits: true,
        // Some requests opt out; they share the batch.
        num_draft_tokens: (i % 4 == 3).then_some(0),
        ..sampled(i)
    })
    .await;
    for (i, (a, (_, max_tokens))) in answers.iter().zip(cases()).enumerate() {
        assert_eq!(a.token_ids.len(), max_tokens, "case {i}");
        assert!(a.token_ids.iter().all(|&t| t < 512));
        if i % 4 == 3 {
            assert_eq!(a.draft_tokens, 0, "case {i} opted out");
        } else {
            // p == q: min(1, p/q) is 1 for every draft token.
            assert!(a.draft_tokens > 0, "case {i}");
            assert_eq!(a.accepted_draft_tokens, a.draft_tokens, "case {i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_timeout_end_speculative_requests_and_free_blocks() {
    let target = target_dir("cancel");
    let handle = spawn(
        &target,
        Some(draft_model(&model_dir("draft-cancel", 11, 1))),
    )
    .await;
    let long = |id: &str, stop_after_ms| Request {
        id: Some(id.into()),
        prompts: vec![Prompt::Tokens((0..20).map(|i| i % 7).collect())],
        params: GenerationParams {
            max_tokens: 1500,
            stop_after_ms,
            ..greedy(0)
        },
    };
    let mut cancelled = handle.submit(long("cancel-me", None)).await.unwrap();
    let timed = handle.submit(long("time-me", Some(300))).await.unwrap();
    let first = cancelled.next().await.expect("a first token");
    assert!(!first.token_ids.is_empty());
    handle.cancel("cancel-me");
    let rest: Vec<Chunk> = cancelled.collect().await;
    assert_eq!(
        rest.last().and_then(|c| c.finish_reason),
        Some(FinishReason::Cancelled)
    );
    let started = Instant::now();
    let timed: Vec<Chunk> = timed.collect().await;
    assert_eq!(
        timed.last().and_then(|c| c.finish_reason),
        Some(FinishReason::Cancelled)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let stats = wait_idle(&handle).await;
    assert_eq!(stats.free_blocks, stats.total_blocks, "every block is back");
    // And the model still serves.
    let after = run(&handle, greedy).await;
    assert!(after
        .iter()
        .all(|c| c.finish_reason == Some(FinishReason::Length)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cannot_speculate_without_a_draft_source() {
    let handle = spawn(&target_dir("refused"), None).await;
    let request = Request {
        id: None,
        prompts: vec![Prompt::Tokens(vec![1, 2, 3])],
        params: GenerationParams {
            num_draft_tokens: Some(4),
            ..greedy(0)
        },
    };
    let e = handle.submit(request).await.err().expect("refused");
    assert!(e.to_string().contains("no draft source"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_fault_restarts_the_whole_speculative_group() {
    let target = target_dir("fault");
    let handle = spawn(&target, Some(draft_model(&model_dir("draft-fault", 11, 1)))).await;
    let mut streams = Vec::new();
    for i in 0..3u32 {
        let request = Request {
            id: None,
            prompts: vec![Prompt::Tokens(vec![1 + i, 2, 3, 4])],
            params: GenerationParams {
                max_tokens: 1000,
                ..greedy(0)
            },
        };
        streams.push(handle.submit(request).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    handle.inject_engine_fault();
    for s in streams {
        let chunks: Vec<Chunk> = tokio::time::timeout(Duration::from_secs(10), s.collect())
            .await
            .expect("no hang");
        let last = chunks.last().unwrap();
        assert_eq!(last.finish_reason, Some(FinishReason::Error), "{last:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !handle.is_ready() {
        assert!(Instant::now() < deadline, "not ready after the restart");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The restarted target, draft engine and orchestrator serve, and still speculate
    // exactly.
    let base = run(&spawn(&target, None).await, greedy).await;
    let again = run(&handle, greedy).await;
    let (drafted, _) = assert_same(&base, &again, "after the restart");
    assert!(drafted > 0);
    let stats = wait_idle(&handle).await;
    assert_eq!(stats.free_blocks, stats.total_blocks);
}
