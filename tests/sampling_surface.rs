//! The OpenAI sampling surface through the library API on the tiny model, on both
//! sampling paths (the Sampler actor from logits, and plans run inside the Engine, the
//! GPU's path): `n` sequences per prompt (indexed answers, seeds derived per sequence,
//! greedy ones identical, the prompt's blocks shared), the alternatives of each token
//! and the prompt's scores equal to the log-softmax of the model's own logits (a direct
//! forward pass of the same tokens), also with chunked prefill and under preemption, and
//! logit bias and min-p taking effect.

mod common;

use std::path::Path;

use futures::StreamExt;

use common::handle::wait_idle;
use common::scratch::Scratch;
use inflight::model::tiny::{write_tiny_checkpoint, TinySpec};
use inflight::model::{KvCache, Llama, LoadedModel, SeqChunk};
use inflight::scheduler::SchedulerPolicy;
use inflight::{Chunk, GenerationParams, ModelHandle, ModelOptions, Prompt, Request};

const BLOCK: usize = 8;

fn model_dir(tag: &str) -> Scratch {
    let dir = Scratch::new(&format!("surface-{tag}"));
    let spec = TinySpec {
        num_layers: 2,
        seed: 11,
        ..TinySpec::default()
    };
    write_tiny_checkpoint(&dir, &spec).unwrap();
    dir
}

/// A handle on the model at `dir`; `in_engine` samples inside the Engine. `tweak` sets
/// the scheduler's limits.
async fn spawn(dir: &Path, in_engine: bool, tweak: impl FnOnce(&mut ModelOptions)) -> ModelHandle {
    let m = LoadedModel::load(dir).unwrap();
    let config = m.model.config().clone();
    let mut options = ModelOptions::for_model(&config, 64 * 1024);
    options.scheduler.block_size = BLOCK;
    options.scheduler.max_batch_size = 16;
    tweak(&mut options);
    common::handle::spawn_cpu(m, options, in_engine).await
}

/// The answers of one request (by batch index).
async fn answers(
    handle: &ModelHandle,
    prompts: Vec<Vec<u32>>,
    params: GenerationParams,
) -> Vec<Chunk> {
    let n = prompts.len() * params.n;
    let request = Request {
        id: None,
        prompts: prompts.into_iter().map(Prompt::Tokens).collect(),
        params,
    };
    let chunks: Vec<Chunk> = handle
        .submit(request)
        .await
        .expect("accepted")
        .collect()
        .await;
    let out = inflight::request::answers(chunks, n);
    for (i, a) in out.iter().enumerate() {
        assert!(a.error.is_none(), "answer {i}: {:?}", a.error);
        assert!(a.finish_reason.is_some(), "answer {i} unfinished");
    }
    out
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|j| (j * 37 + salt * 11) % 300 + 1)
        .collect()
}

/// The model's logits at every position of `tokens`, from one direct forward pass.
fn logits_of(model: &Llama, tokens: &[u32]) -> Vec<Vec<f32>> {
    let blocks = tokens.len().div_ceil(BLOCK);
    let mut cache = KvCache::new(model.config(), BLOCK, blocks);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let out = model
        .forward(
            &[SeqChunk {
                tokens,
                start_pos: 0,
                block_table: &table,
                logits: tokens.len(),
                long_rope: false,
            }],
            &mut cache,
        )
        .unwrap()
        .remove(0);
    out.chunks(model.config().vocab_size)
        .map(<[f32]>::to_vec)
        .collect()
}

/// The log-softmax of `row` at temperature `t`, in f64.
fn log_softmax(row: &[f32], t: f64) -> Vec<f64> {
    let z: Vec<f64> = row.iter().map(|&x| x as f64 / t).collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
    z.iter().map(|&x| x - lse).collect()
}

/// Checks `alts` (from the most likely) against the reference log-softmax `want`: each
/// value within `tol`, in order, and no token left out that is likelier than the last one
/// listed (beyond `tol`).
fn check_alternatives(
    alts: &[inflight::request::TokenLogprob],
    want: &[f64],
    k: usize,
    what: &str,
) {
    const TOL: f64 = 2e-4;
    assert_eq!(alts.len(), k, "{what}");
    for a in alts {
        let w = want[a.token as usize];
        assert!((a.log_prob as f64 - w).abs() < TOL, "{what}: {a:?} vs {w}");
    }
    assert!(
        alts.windows(2).all(|w| w[0].log_prob >= w[1].log_prob),
        "{what}: {alts:?}"
    );
    let last = alts.last().unwrap().log_prob as f64;
    let listed: Vec<u32> = alts.iter().map(|a| a.token).collect();
    let missed = (0..want.len() as u32)
        .filter(|t| !listed.contains(t))
        .find(|&t| want[t as usize] > last + TOL);
    assert_eq!(missed, None, "{what}: a likelier token is not listed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_sequences_answer_apart_with_derived_seeds_and_share_the_prompt() {
    let dir = model_dir("n");
    for in_engine in [false, true] {
        let h = spawn(&dir, in_engine, |_| {}).await;
        let base = GenerationParams {
            max_tokens: 8,
            ignore_eos: true,
            n: 4,
            ..GenerationParams::default()
        };
        // Greedy: four identical answers, indexed 0..4.
        let greedy = answers(&h, vec![prompt(30, 1)], base.clone()).await;
        assert_eq!(greedy.len(), 4);
        assert!(greedy.iter().enumerate().all(|(i, a)| a.batch_index == i));
        assert!(greedy
            .iter()
            .all(|a| a.token_ids == greedy[0].token_ids && a.token_ids.len() == 8));
        // Seeded: the first as a single request with that seed, the others apart, and the
        // same four again.
        let seeded = GenerationParams {
            temperature: 1.0,
            random_seed: Some(77),
            ..base.clone()
        };
        let a = answers(&h, vec![prompt(30, 2)], seeded.clone()).await;
        let b = answers(&h, vec![prompt(30, 2)], seeded.clone()).await;
        let ids = |x: &[Chunk]| x.iter().map(|c| c.token_ids.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&a), ids(&b), "seeded answers repeat");
        let mut distinct = ids(&a);
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() >= 3, "{distinct:?}");
        let single = answers(
            &h,
            vec![prompt(30, 2)],
            GenerationParams {
                n: 1,
                ..seeded.clone()
            },
        )
        .await;
        assert_eq!(single[0].token_ids, a[0].token_ids);
        // Two prompts: answer i * n + j is prompt i's j-th sequence.
        let two = answers(&h, vec![prompt(12, 3), prompt(30, 2)], seeded.clone()).await;
        assert_eq!(two.len(), 8);
        assert_eq!(ids(&two[4..]), ids(&a));
        // The prompt's 3 whole blocks (of 30 tokens, the last left to compute) are
        // computed once and found by the other three sequences.
        let before = h.stats().await.unwrap().prefix_hit_tokens;
        answers(&h, vec![prompt(30, 4)], base.clone()).await;
        let after = wait_idle(&h).await.prefix_hit_tokens;
        assert_eq!(
            after - before,
            3 * 3 * BLOCK as u64,
            "in engine: {in_engine}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternatives_and_prompt_scores_are_the_log_softmax_of_the_models_logits() {
    let dir = model_dir("logprobs");
    let model = LoadedModel::load(&dir).unwrap().model;
    let p = prompt(21, 5);
    let k = 5;
    // Greedy (reported at temperature 1) and sampled at 0.8.
    let cases = [(0.0f32, 1.0f64), (0.8, 0.8)];
    let mut per_path: Vec<Vec<Chunk>> = Vec::new();
    for in_engine in [false, true] {
        // Chunked prefill in pieces of 8: the scores cross chunk boundaries.
        let h = spawn(&dir, in_engine, |o| {
            o.scheduler.enable_chunked_context = true;
            o.scheduler.max_num_tokens = 8;
        })
        .await;
        let mut got = Vec::new();
        for (temperature, t) in cases {
            let params = GenerationParams {
                max_tokens: 6,
                ignore_eos: true,
                temperature,
                random_seed: Some(3),
                return_log_probs: true,
                top_log_probs: k,
                prompt_log_probs: true,
                ..GenerationParams::default()
            };
            let a = answers(&h, vec![p.clone()], params).await.remove(0);
            let g = &a.token_ids;
            assert_eq!(g.len(), 6);
            let mut all = p.clone();
            all.extend(&g[..5]);
            let logits = logits_of(&model, &all);
            // The prompt: its first token has no score, every other one its log-softmax.
            assert_eq!(a.prompt_log_probs.len(), p.len());
            assert_eq!(a.prompt_log_probs[0].log_prob, None);
            for (i, pl) in a.prompt_log_probs.iter().enumerate() {
                assert_eq!(pl.token, p[i]);
                if i == 0 {
                    assert!(pl.top.is_empty());
                    continue;
                }
                let want = log_softmax(&logits[i - 1], 1.0);
                let lp = pl.log_prob.unwrap() as f64;
                assert!(
                    (lp - want[p[i] as usize]).abs() < 2e-4,
                    "prompt {i}: {lp} vs {}",
                    want[p[i] as usize]
                );
                check_alternatives(&pl.top, &want, k, &format!("prompt {i}"));
            }
            // Each generated token, at the request's temperature.
            assert_eq!(a.top_log_probs.len(), g.len());
            for (j, top) in a.top_log_probs.iter().enumerate() {
                let want = log_softmax(&logits[p.len() - 1 + j], t);
                let lp = a.log_probs[j] as f64;
                assert!((lp - want[g[j] as usize]).abs() < 2e-4, "token {j}: {lp}");
                check_alternatives(top, &want, k, &format!("token {j} at {t}"));
            }
            got.push(a);
        }
        per_path.push(got);
    }
    // Both sampling paths give the same answers, scores and alternatives.
    for (x, y) in per_path[0].iter().zip(&per_path[1]) {
        assert_eq!(x.token_ids, y.token_ids);
        assert_eq!(x.log_probs, y.log_probs);
        assert_eq!(x.top_log_probs, y.top_log_probs);
        assert_eq!(x.prompt_log_probs, y.prompt_log_probs);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_scores_survive_preemption_and_sit_beside_plain_requests() {
    let dir = model_dir("preempt");
    let params = |i: usize| GenerationParams {
        max_tokens: 10 + i % 7,
        ignore_eos: true,
        temperature: 0.9,
        random_seed: Some(i as u64),
        return_log_probs: true,
        top_log_probs: (i % 3) * 2,
        prompt_log_probs: i.is_multiple_of(2),
        n: 1 + i % 2,
        ..GenerationParams::default()
    };
    let run = |h: ModelHandle| async move {
        let mut streams = Vec::new();
        for i in 0..12 {
            let request = Request {
                id: None,
                prompts: vec![Prompt::Tokens(prompt(10 + i * 3, i as u32))],
                params: params(i),
            };
            streams.push((h.submit(request).await.expect("accepted"), params(i).n));
        }
        let mut out = Vec::new();
        for (s, n) in streams {
            let chunks: Vec<Chunk> = s.collect().await;
            out.push(inflight::request::answers(chunks, n));
        }
        let preemptions = wait_idle(&h).await.preemptions;
        (out, preemptions)
    };
    let (base, _) = run(spawn(&dir, false, |_| {}).await).await;
    for in_engine in [false, true] {
        let tight = spawn(&dir, in_engine, |o| {
            o.scheduler.num_blocks = 16;
            o.scheduler.policy = SchedulerPolicy::MaxUtilization;
        })
        .await;
        let (got, preemptions) = run(tight).await;
        assert!(preemptions > 0, "nothing was preempted");
        for (i, (x, y)) in base.iter().zip(&got).enumerate() {
            for (a, b) in x.iter().zip(y) {
                assert_eq!(a.token_ids, b.token_ids, "request {i}");
                assert_eq!(a.top_log_probs, b.top_log_probs, "request {i}");
                // Scored once each, whatever was computed again.
                assert_eq!(a.prompt_log_probs, b.prompt_log_probs, "request {i}");
                let want = if i.is_multiple_of(2) { 10 + i * 3 } else { 0 };
                assert_eq!(b.prompt_log_probs.len(), want, "request {i}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_and_min_p_take_effect() {
    let dir = model_dir("bias");
    let h = spawn(&dir, true, |_| {}).await;
    let base = GenerationParams {
        max_tokens: 6,
        ignore_eos: true,
        temperature: 1.0,
        random_seed: Some(9),
        ..GenerationParams::default()
    };
    // +100 on one token: sampled every time; -100 on the greedy answer's tokens: none.
    let pinned = answers(
        &h,
        vec![prompt(9, 1)],
        GenerationParams {
            logit_bias: vec![(42, 100.0)],
            ..base.clone()
        },
    )
    .await;
    assert_eq!(pinned[0].token_ids, vec![42; 6]);
    let greedy = GenerationParams {
        temperature: 0.0,
        ..base.clone()
    };
    let plain = answers(&h, vec![prompt(9, 1)], greedy.clone()).await;
    let banned: Vec<(u32, f32)> = plain[0].token_ids.iter().map(|&t| (t, -100.0)).collect();
    let other = answers(
        &h,
        vec![prompt(9, 1)],
        GenerationParams {
            logit_bias: banned,
            ..greedy.clone()
        },
    )
    .await;
    assert!(other[0]
        .token_ids
        .iter()
        .all(|t| !plain[0].token_ids.contains(t)));
    // min_p 1 keeps only the most likely token: sampling gives the greedy answer.
    let strict = answers(
        &h,
        vec![prompt(9, 1)],
        GenerationParams {
            min_p: 1.0,
            ..base.clone()
        },
    )
    .await;
    assert_eq!(strict[0].token_ids, plain[0].token_ids);
    // Refused: a bias outside the vocabulary or the range, min_p outside [0, 1], n 0.
    for bad in [
        GenerationParams {
            logit_bias: vec![(1 << 20, 1.0)],
            ..base.clone()
        },
        GenerationParams {
            logit_bias: vec![(1, 101.0)],
            ..base.clone()
        },
        GenerationParams {
            min_p: 1.5,
            ..base.clone()
        },
        GenerationParams {
            n: 0,
            ..base.clone()
        },
        GenerationParams {
            n: 17,
            ..base.clone()
        },
        GenerationParams {
            top_log_probs: 21,
            ..base.clone()
        },
    ] {
        let request = Request {
            id: None,
            prompts: vec![Prompt::Tokens(prompt(4, 0))],
            params: bad,
        };
        assert!(h.submit(request).await.is_err());
    }
}
