//! Embedding requests through the library API, on the tiny model: each is the engine's
//! own final hidden state of the prompt (after the final norm), pooled (last token or
//! mean) and L2-normalized, equal to what a direct `Llama::forward_hidden` gives, whether
//! the prompt runs whole or in chunks, alone or batched with generations (which answer
//! exactly as they do alone), on both engine paths (logits to the Sampler actor, and
//! sampling in the engine with iterations planned ahead, the GPU's path), and after a
//! generation cached the same prefix (mean pooling computes every token anyway).

mod common;

use std::path::Path;

use futures::StreamExt;

use common::handle::wait_idle;
use common::scratch::Scratch;
use inflight::model::pooling::{normalized, PoolSum};
use inflight::model::tiny::{write_tiny_checkpoint, TinySpec};
use inflight::model::{KvCache, Llama, LoadedModel, Pooling, SeqChunk};
use inflight::{Chunk, GenerationParams, ModelHandle, ModelOptions, Prompt, Request};

fn model_dir(tag: &str) -> Scratch {
    let dir = Scratch::new(&format!("embed-{tag}"));
    let spec = TinySpec {
        num_layers: 2,
        ..TinySpec::default()
    };
    write_tiny_checkpoint(&dir, &spec).unwrap();
    dir
}

/// A handle on the model at `dir`; `in_engine` samples inside the Engine actor (with
/// iterations planned ahead); `max_num_tokens` small chunks long prompts.
async fn spawn(dir: &Path, in_engine: bool, max_num_tokens: usize) -> ModelHandle {
    let m = LoadedModel::load(dir).unwrap();
    let config = m.model.config().clone();
    let mut options = ModelOptions::for_model(&config, 64 * 1024);
    options.scheduler.block_size = 8;
    options.scheduler.max_num_tokens = max_num_tokens;
    options.scheduler.enable_chunked_context = true;
    common::handle::spawn_cpu(m, options, in_engine).await
}

/// The prompt's embedding computed directly: one forward pass over a fresh cache.
fn direct(model: &Llama, tokens: &[u32], pooling: Pooling) -> Vec<f32> {
    let blocks = tokens.len().div_ceil(16);
    let mut cache = KvCache::new(model.config(), 16, blocks);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let chunk = SeqChunk {
        tokens,
        start_pos: 0,
        block_table: &table,
        logits: tokens.len(),
        long_rope: false,
    };
    let rows = model
        .forward_hidden(&[chunk], &mut cache)
        .unwrap()
        .remove(0);
    let h = model.config().hidden_size;
    assert_eq!(rows.len(), tokens.len() * h);
    match pooling {
        Pooling::Last => normalized(rows[rows.len() - h..].to_vec()),
        Pooling::Mean => {
            let mut sum = PoolSum::default();
            sum.add(&rows, h);
            sum.finish()
        }
    }
}

async fn run(handle: &ModelHandle, prompts: Vec<Prompt>, params: GenerationParams) -> Vec<Chunk> {
    let n = prompts.len();
    let stream = handle
        .submit(Request {
            id: None,
            prompts,
            params,
        })
        .await
        .unwrap();
    let chunks: Vec<Chunk> = stream.collect().await;
    inflight::request::answers(chunks, n)
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "{what}: differs by {worst}");
}

fn text(i: usize) -> String {
    format!("embedding test prompt number {i}: ").repeat(1 + i % 4)
}

fn greedy(max_tokens: usize) -> GenerationParams {
    GenerationParams {
        max_tokens,
        ignore_eos: true,
        stream: false,
        exclude_input_in_output: true,
        ..GenerationParams::default()
    }
}

/// Embeddings of several prompts, alone and beside generations, against the direct pass.
async fn check(in_engine: bool, pooling: Pooling) {
    let dir = model_dir(&format!("{in_engine}-{pooling:?}"));
    let reference = LoadedModel::load(&dir).unwrap();
    // Prompts up to ~80 tokens, in chunks of at most 24 tokens an iteration.
    let handle = spawn(&dir, in_engine, 24).await;
    let prompts: Vec<String> = (0..5).map(text).collect();
    let tokens: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| reference.tokenizer.encode(p, true).unwrap())
        .collect();
    assert!(
        tokens.iter().any(|t| t.len() > 24),
        "some prompt is chunked"
    );
    let want: Vec<Vec<f32>> = tokens
        .iter()
        .map(|t| direct(&reference.model, t, pooling))
        .collect();
    let embedding = GenerationParams::embedding(pooling);
    let alone = run(
        &handle,
        prompts.iter().cloned().map(Prompt::Text).collect(),
        embedding.clone(),
    )
    .await;
    for (i, (c, w)) in alone.iter().zip(&want).enumerate() {
        assert!(c.error.is_none(), "{c:?}");
        assert_eq!(c.prompt_tokens, tokens[i].len());
        assert!(
            c.token_ids.is_empty() && c.text.is_empty(),
            "nothing generated"
        );
        let v = c.embedding.as_ref().expect("an embedding");
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "unit norm, got {norm}");
        assert_close(v, w, &format!("prompt {i} alone"));
    }
    // Beside generations: both answers are what each gives alone.
    let gen_prompt = Prompt::Text("a generation running beside them".into());
    let gen_alone = run(&handle, vec![gen_prompt.clone()], greedy(12)).await;
    let (gen, embeds) = tokio::join!(
        run(&handle, vec![gen_prompt], greedy(12)),
        run(
            &handle,
            prompts.iter().cloned().map(Prompt::Text).collect(),
            embedding.clone()
        ),
    );
    assert_eq!(gen[0].token_ids, gen_alone[0].token_ids);
    assert_eq!(gen[0].token_ids.len(), 12);
    for (i, (c, w)) in embeds.iter().zip(&want).enumerate() {
        assert_close(
            c.embedding.as_ref().unwrap(),
            w,
            &format!("prompt {i} batched"),
        );
    }
    // Token ids in, and the same text twice: the same vector.
    let by_ids = run(
        &handle,
        vec![Prompt::Tokens(tokens[3].clone())],
        embedding.clone(),
    )
    .await;
    assert_close(by_ids[0].embedding.as_ref().unwrap(), &want[3], "token ids");
    wait_idle(&handle).await;
    let stats = handle.stats().await.unwrap();
    assert_eq!(stats.free_blocks, stats.total_blocks, "every block freed");
    handle.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_token_pooling_through_the_sampler() {
    check(false, Pooling::Last).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mean_pooling_through_the_sampler() {
    check(false, Pooling::Mean).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_token_pooling_with_sampling_in_the_engine() {
    check(true, Pooling::Last).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mean_pooling_with_sampling_in_the_engine() {
    check(true, Pooling::Mean).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_prefix_does_not_change_an_embedding() {
    let dir = model_dir("prefix");
    let reference = LoadedModel::load(&dir).unwrap();
    let handle = spawn(&dir, false, 8192).await;
    let prompt = text(3);
    let tokens = reference.tokenizer.encode(&prompt, true).unwrap();
    assert!(tokens.len() > 16, "at least two full blocks to cache");
    // A generation computes (and caches) the prompt's blocks first.
    run(&handle, vec![Prompt::Text(prompt.clone())], greedy(2)).await;
    for pooling in [Pooling::Mean, Pooling::Last] {
        let out = run(
            &handle,
            vec![Prompt::Text(prompt.clone())],
            GenerationParams::embedding(pooling),
        )
        .await;
        let want = direct(&reference.model, &tokens, pooling);
        assert_close(
            out[0].embedding.as_ref().unwrap(),
            &want,
            &format!("{pooling:?}"),
        );
    }
    handle.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_request_generates_nothing() {
    let dir = model_dir("refused");
    let handle = spawn(&dir, false, 8192).await;
    let mut params = GenerationParams::embedding(Pooling::Last);
    params.max_tokens = 3;
    let e = handle
        .submit(Request::text("x", params))
        .await
        .err()
        .expect("refused");
    assert!(e.to_string().contains("max_tokens must be 0"), "{e}");
    let e = handle
        .submit(Request::text("x", greedy(0)))
        .await
        .err()
        .expect("refused");
    assert!(e.to_string().contains("at least 1"), "{e}");
    handle.shutdown(std::time::Duration::from_secs(5)).await;
}

/// On the device `INFLIGHT_DEVICE` names (the CPU when unset; scripts/gpu-check.sh's
/// `INFLIGHT_TESTS` runs this binary on the GPU engine, whose 16-bit weights and
/// activations give vectors within a cosine of 1e-3 of the CPU's fp32 pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_configured_device() {
    let dir = model_dir("device");
    let reference = LoadedModel::load(&dir).unwrap();
    for pooling in [Pooling::Last, Pooling::Mean] {
        let m = LoadedModel::load(&dir).unwrap();
        let mut options = ModelOptions::for_model(m.model.config(), 64 * 1024);
        options.scheduler.block_size = 8;
        options.scheduler.max_num_tokens = 24;
        options.scheduler.enable_chunked_context = true;
        let on_gpu = options.device != inflight::model::Device::Cpu;
        let handle = ModelHandle::spawn(m, options).await.unwrap();
        let prompts: Vec<String> = (0..4).map(text).collect();
        let gen_prompt = Prompt::Text("a generation running beside them".into());
        let gen_alone = run(&handle, vec![gen_prompt.clone()], greedy(12)).await;
        let (gen, out) = tokio::join!(
            run(&handle, vec![gen_prompt], greedy(12)),
            run(
                &handle,
                prompts.iter().cloned().map(Prompt::Text).collect(),
                GenerationParams::embedding(pooling)
            ),
        );
        assert_eq!(gen[0].token_ids, gen_alone[0].token_ids, "{pooling:?}");
        for (i, (c, p)) in out.iter().zip(&prompts).enumerate() {
            let tokens = reference.tokenizer.encode(p, true).unwrap();
            let want = direct(&reference.model, &tokens, pooling);
            let got = c.embedding.as_ref().expect("an embedding");
            if on_gpu {
                let cos: f32 = got.iter().zip(&want).map(|(a, b)| a * b).sum();
                assert!(cos > 0.999, "{pooling:?} prompt {i}: cosine {cos}");
            } else {
                assert_close(got, &want, &format!("{pooling:?} prompt {i}"));
            }
        }
        wait_idle(&handle).await;
        handle.shutdown(std::time::Duration::from_secs(5)).await;
    }
}
