//! Beam search end to end on the tiny model, on both sampling paths (the Sampler actor's
//! and the engine's own, the GPU's path): the beams served are those of a reference beam
//! search written here over direct forward passes (TensorRT-LLM's rules, every
//! hypothesis's logits computed from scratch), each beam's cumulative log-probability is
//! its tokens' score under the model, one output token's beams are the brute-force top
//! ones, beam_width 1 is greedy, streaming sends whole beams, and every block comes back.
//! Over HTTP: Triton generate's lists and KServe's `[batch, beam, ...]` tensors, and the
//! options beam search refuses.

mod common;

use futures::StreamExt;

use common::direct::logits_of;
use common::handle::{spawn_cpu, wait_idle};
use common::json::{floats, ids, output};
use common::scratch::Scratch;
use common::server::start;
use inflight::model::tiny::{write_tiny_checkpoint, TinySpec};
use inflight::model::{Llama, LoadedModel};
use inflight::{Chunk, GenerationParams, ModelHandle, ModelOptions, Prompt, Request};
use serde_json::json;

fn model_dir(tag: &str) -> Scratch {
    let dir = Scratch::new(&format!("beam-{tag}"));
    let spec = TinySpec {
        num_layers: 2,
        ..TinySpec::default()
    };
    write_tiny_checkpoint(&dir, &spec).unwrap();
    dir
}

async fn spawn(dir: &Scratch, in_engine: bool) -> ModelHandle {
    let m = LoadedModel::load(dir).unwrap();
    let mut options = ModelOptions::for_model(m.model.config(), 16 * 1024);
    options.scheduler.block_size = 16;
    spawn_cpu(m, options, in_engine).await
}

/// One hypothesis of the reference: tokens (an end token last when it ended), sum.
#[derive(Debug, Clone)]
struct Hyp {
    tokens: Vec<u32>,
    cum: f32,
    ended: bool,
}

/// Log-softmax of the model's logits after `prompt` + `tokens`, from a forward pass of the
/// whole sequence.
fn next_log_probs(model: &Llama, prompt: &[u32], tokens: &[u32]) -> Vec<f32> {
    let all: Vec<u32> = prompt.iter().chain(tokens).copied().collect();
    let row = logits_of(model, &all).pop().unwrap();
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let total: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
    row.iter()
        .map(|&x| (f64::from(x - max) - total.ln()) as f32)
        .collect()
}

/// TensorRT-LLM's beam search, written plainly: per beam its `2w` likeliest tokens; the
/// candidates best first; an end token in the first `w` ranks finishes a hypothesis; the
/// first `w` others are the next beams; early_stopping 1; length_penalty 0.
fn reference(model: &Llama, prompt: &[u32], w: usize, max_new: usize, ends: &[u32]) -> Vec<Hyp> {
    let mut beams = vec![Hyp {
        tokens: Vec::new(),
        cum: 0.0,
        ended: false,
    }];
    let mut finished: Vec<Hyp> = Vec::new();
    for _ in 0..max_new {
        let mut cands: Vec<(f32, Hyp)> = Vec::new();
        for b in &beams {
            let lp = next_log_probs(model, prompt, &b.tokens);
            let mut order: Vec<u32> = (0..lp.len() as u32).collect();
            order.sort_by(|&x, &y| lp[y as usize].total_cmp(&lp[x as usize]).then(x.cmp(&y)));
            for &t in order.iter().take(2 * w) {
                let mut h = b.clone();
                h.tokens.push(t);
                h.cum += lp[t as usize];
                h.ended = ends.contains(&t);
                cands.push((h.cum, h));
            }
        }
        cands.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut next = Vec::new();
        for (r, (_, h)) in cands.into_iter().enumerate() {
            if next.len() == w {
                break;
            }
            if h.ended {
                if r < w && finished.len() < w {
                    finished.push(h);
                }
            } else {
                next.push(h);
            }
        }
        beams = next;
        if finished.len() >= w {
            break;
        }
    }
    let mut all: Vec<Hyp> = finished.into_iter().chain(beams).collect();
    all.sort_by(|a, b| b.cum.total_cmp(&a.cum));
    all.truncate(w);
    all
}

fn beam_request(prompt: &[u32], params: GenerationParams) -> Request {
    Request {
        id: None,
        prompts: vec![Prompt::Tokens(prompt.to_vec())],
        params,
    }
}

fn params(width: usize, max_tokens: usize) -> GenerationParams {
    GenerationParams {
        beam_width: width,
        max_tokens,
        return_log_probs: true,
        exclude_input_in_output: true,
        stream: false,
        ..GenerationParams::default()
    }
}

async fn run(handle: &ModelHandle, req: Request) -> Vec<Chunk> {
    handle.submit(req).await.unwrap().collect().await
}

/// The served answer's beams as (tokens, cum, ended), ended ones with their end token
/// put back (`ends[0]`).
fn served(chunks: &[Chunk], end: Option<u32>) -> Vec<Hyp> {
    let last = chunks.last().unwrap();
    assert!(last.finish_reason.is_some(), "{last:?}");
    last.beams
        .iter()
        .map(|b| {
            let ended = b.finish_reason == Some(inflight::FinishReason::Stop);
            let mut tokens = b.token_ids.clone();
            if ended {
                tokens.push(end.unwrap());
            }
            Hyp {
                tokens,
                cum: b.cum_log_prob.unwrap(),
                ended,
            }
        })
        .collect()
}

fn assert_same(got: &[Hyp], want: &[Hyp], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.tokens, w.tokens, "{what}: {got:?} vs {want:?}");
        assert_eq!(g.ended, w.ended, "{what}");
        assert!((g.cum - w.cum).abs() < 1e-3, "{what}: {g:?} vs {w:?}");
    }
}

/// A 9-token prompt (its last block partly filled: forks give it up and compute it again)
/// and a 16-token one (a whole block: forks share every block).
const PROMPTS: [&[u32]; 2] = [
    &[5, 17, 43, 99, 120, 7, 7, 250, 31],
    &[3, 9, 27, 81, 243, 217, 139, 161, 1, 2, 3, 4, 5, 6, 7, 8],
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beams_are_the_reference_searchs_on_both_sampling_paths() {
    let dir = model_dir("reference");
    let model = LoadedModel::load(&dir).unwrap().model;
    for in_engine in [false, true] {
        let handle = spawn(&dir, in_engine).await;
        for prompt in PROMPTS {
            for w in [2, 4] {
                let p = GenerationParams {
                    ignore_eos: true,
                    ..params(w, 5)
                };
                let got = served(&run(&handle, beam_request(prompt, p)).await, None);
                let want = reference(&model, prompt, w, 5, &[]);
                assert_same(&got, &want, &format!("w {w} in_engine {in_engine}"));
                // Each beam's sum is its tokens' score under the model.
                for h in &got {
                    let mut score = 0.0;
                    for i in 0..h.tokens.len() {
                        score +=
                            next_log_probs(&model, prompt, &h.tokens[..i])[h.tokens[i] as usize];
                    }
                    assert!((score - h.cum).abs() < 1e-3, "{h:?} scores {score}");
                }
            }
            // An end token the search meets: the best beam's second token ends hypotheses.
            let free = reference(&model, prompt, 3, 4, &[]);
            let end = free[0].tokens[1];
            let p = GenerationParams {
                end_id: Some(end),
                ..params(3, 4)
            };
            let got = served(&run(&handle, beam_request(prompt, p)).await, Some(end));
            let want = reference(&model, prompt, 3, 4, &[end]);
            assert!(want.iter().any(|h| h.ended), "the end id is met: {want:?}");
            assert_same(&got, &want, &format!("end {end} in_engine {in_engine}"));
        }
        let stats = wait_idle(&handle).await;
        assert_eq!(
            stats.free_blocks, stats.total_blocks,
            "every block comes back"
        );
        handle.shutdown(std::time::Duration::from_secs(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tokens_beams_are_the_brute_force_top_and_width_one_is_greedy() {
    let dir = model_dir("brute");
    let model = LoadedModel::load(&dir).unwrap().model;
    let handle = spawn(&dir, false).await;
    let prompt = PROMPTS[0];
    let lp = next_log_probs(&model, prompt, &[]);
    let mut order: Vec<u32> = (0..lp.len() as u32).collect();
    order.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]));
    let p = GenerationParams {
        ignore_eos: true,
        ..params(4, 1)
    };
    let got = served(&run(&handle, beam_request(prompt, p)).await, None);
    let tokens: Vec<u32> = got.iter().map(|h| h.tokens[0]).collect();
    assert_eq!(tokens, order[..4], "the four likeliest tokens, best first");

    // Two tokens: every one of the 512 x 512 outputs scored; the best beam is the best
    // two-token output, whose first token is among the four likeliest.
    let p = GenerationParams {
        ignore_eos: true,
        ..params(4, 2)
    };
    let got = served(&run(&handle, beam_request(prompt, p)).await, None);
    let mut best = (f32::NEG_INFINITY, 0, 0);
    for &a in &order {
        let second = next_log_probs(&model, prompt, &[a]);
        for (b, &l) in second.iter().enumerate() {
            let s = lp[a as usize] + l;
            if s > best.0 {
                best = (s, a, b as u32);
            }
        }
    }
    // (So it is for this model and prompt.)
    assert!(order[..4].contains(&best.1), "{best:?}");
    assert_eq!(got[0].tokens, [best.1, best.2], "the best of all 262,144");
    assert!((got[0].cum - best.0).abs() < 1e-3);
    for pair in got.windows(2) {
        assert!(pair[0].cum >= pair[1].cum, "best first: {got:?}");
    }

    // beam_width 1 is the greedy path: the argmax chain.
    let greedy = GenerationParams {
        ignore_eos: true,
        ..params(1, 4)
    };
    let chunks = run(&handle, beam_request(prompt, greedy)).await;
    let ids: Vec<u32> = chunks.iter().flat_map(|c| c.token_ids.clone()).collect();
    assert!(chunks.iter().all(|c| c.beams.is_empty()));
    let mut want = Vec::new();
    for _ in 0..4 {
        let row = next_log_probs(&model, prompt, &want);
        want.push(inflight::sampling::argmax(&row));
    }
    assert_eq!(ids, want);
    handle.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_beams_come_whole_each_step_and_end_as_the_whole_answer() {
    let dir = model_dir("stream");
    let handle = spawn(&dir, true).await;
    let prompt = PROMPTS[0];
    let whole = GenerationParams {
        ignore_eos: true,
        ..params(3, 6)
    };
    let answer = run(&handle, beam_request(prompt, whole.clone())).await;
    let streamed = run(
        &handle,
        beam_request(
            prompt,
            GenerationParams {
                stream: true,
                ..whole
            },
        ),
    )
    .await;
    assert_eq!(streamed.len(), 6, "one chunk a step: {streamed:?}");
    for (i, c) in streamed.iter().enumerate() {
        assert_eq!(c.beams.len(), 3);
        assert!(
            c.beams.iter().all(|b| b.token_ids.len() == i + 1),
            "whole beams"
        );
        assert!(c.text.is_empty() && c.token_ids.is_empty());
    }
    let last = streamed.last().unwrap();
    let want = answer.last().unwrap();
    let ids = |c: &Chunk| {
        c.beams
            .iter()
            .map(|b| b.token_ids.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(last), ids(want));
    assert_eq!(last.finish_reason, Some(inflight::FinishReason::Length));

    // Dropped mid-stream: cancelled, every block back.
    let mut s = handle
        .submit(beam_request(
            prompt,
            GenerationParams {
                stream: true,
                ignore_eos: true,
                ..params(4, 200)
            },
        ))
        .await
        .unwrap();
    s.next().await.unwrap();
    drop(s);
    let stats = wait_idle(&handle).await;
    assert_eq!(stats.free_blocks, stats.total_blocks);
    handle.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triton_and_kserve_answer_beams_in_tensorrt_llms_shapes() {
    let dir = model_dir("http");
    let s = start(&dir, |o| o.scheduler.block_size = 16).await;
    let prompt = PROMPTS[0];
    let body = json!({"input_ids": prompt, "request_output_len": 4, "beam_width": 2,
                      "ignore_eos": true, "return_log_probs": true});
    let (status, r) = s.post("/v2/models/tensorrt_llm/generate", body).await;
    assert_eq!(status, 200, "{r}");
    let beams = r["output_ids"].as_array().unwrap();
    assert_eq!(beams.len(), 2, "{r}");
    assert!(beams.iter().all(|b| ids(b).len() == 4));
    assert_eq!(r["sequence_length"], json!([4, 4]));
    let cum: Vec<f64> = r["cum_log_probs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_f64().unwrap())
        .collect();
    assert!(cum[0] >= cum[1] && cum[1] < 0.0, "{r}");
    let lp: f64 = r["output_log_probs"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .sum();
    assert!((lp - cum[0]).abs() < 1e-3, "{r}");

    // The text model: one string per beam; num_return_sequences 1 returns the best alone.
    let (status, r) = s
        .post(
            "/v2/models/ensemble/generate",
            json!({"text_input": "hello", "max_tokens": 3, "beam_width": 3, "ignore_eos": true,
                   "num_return_sequences": 1}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["text_output"].as_array().unwrap().len(), 1, "{r}");
    assert!(r["text_output"][0].as_str().unwrap().starts_with("hello"));

    // KServe: [batch, beam, tokens] over two prompts.
    let infer = json!({"inputs": [
        {"name": "input_ids", "datatype": "INT32", "shape": [2, 9], "data": [prompt, prompt]},
        {"name": "input_lengths", "datatype": "INT32", "shape": [2, 1], "data": [9, 5]},
        {"name": "request_output_len", "datatype": "INT32", "shape": [2, 1], "data": [3, 3]},
        {"name": "beam_width", "datatype": "INT32", "shape": [2, 1], "data": [2, 2]},
        {"name": "early_stopping", "datatype": "BOOL", "shape": [2, 1], "data": [true, true]},
        {"name": "len_penalty", "datatype": "FP32", "shape": [2, 1], "data": [1.0, 1.0]},
        {"name": "return_log_probs", "datatype": "BOOL", "shape": [2, 1], "data": [true, true]}]});
    let (status, r) = s.post("/v2/models/tensorrt_llm/infer", infer).await;
    assert_eq!(status, 200, "{r}");
    let out = |name: &str| output(&r, name);
    assert_eq!(out("output_ids")["shape"], json!([2, 2, 3]));
    assert_eq!(out("sequence_length")["shape"], json!([2, 2]));
    assert_eq!(out("cum_log_probs")["shape"], json!([2, 2]));
    assert_eq!(out("output_log_probs")["shape"], json!([2, 2, 3]));

    // The prompt's logits with beams: every position's row, the model's own.
    let (status, r) = s
        .post(
            "/v2/models/tensorrt_llm/generate",
            json!({"input_ids": prompt, "request_output_len": 3, "beam_width": 2,
                   "return_context_logits": true}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let model = LoadedModel::load(&dir).unwrap().model;
    let want = logits_of(&model, prompt).concat();
    let got = floats(&r["context_logits"]);
    assert_eq!(got.len(), want.len(), "every prompt position's row");
    let worst = got
        .iter()
        .zip(&want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst < 1e-3, "{worst}");

    // What beam search refuses, by name.
    for (extra, word) in [
        (json!({"beam_width": 9}), "beam_width"),
        (json!({"beam_width": 2, "stop_words": ["x"]}), "stop words"),
        (
            json!({"beam_width": 2, "num_return_sequences": 3}),
            "num_return_sequences",
        ),
        (
            json!({"beam_width": 2, "beam_search_diversity_rate": 0.5}),
            "diversity",
        ),
        (
            json!({"beam_width": 2, "return_generation_logits": true}),
            "return_generation_logits",
        ),
    ] {
        let mut body = json!({"text_input": "hi", "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, r) = s.post("/v2/models/ensemble/generate", body).await;
        assert_eq!(status, 400, "{extra}: {r}");
        assert!(r["error"].as_str().unwrap().contains(word), "{extra}: {r}");
    }
    s.stop().await;
}
