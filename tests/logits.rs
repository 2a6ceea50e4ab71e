//! `return_context_logits` / `return_generation_logits` over real HTTP against the tiny
//! model: the rows returned are the model's own logits (a direct forward pass of the
//! prompt and the output), raw (before penalties), through Triton's generate (whole and
//! streamed) and KServe infer (tensors of TensorRT-LLM's shapes, padded over a batch), and
//! only when asked.

mod common;

use common::direct::logits_of;
use common::json::{floats, ids, output};
use common::server::{start, tiny_model_dir};
use inflight::model::LoadedModel;
use serde_json::{json, Value};

/// Max |got - want| over max |want|.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}

const TOL: f32 = 1e-4;
const PROMPT: [u32; 9] = [5, 17, 43, 99, 120, 7, 7, 250, 31];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_returns_the_models_own_context_and_generation_logits() {
    let dir = tiny_model_dir("logits-generate");
    let model = LoadedModel::load(&dir).unwrap().model;
    let vocab = model.config().vocab_size;
    let s = start(&dir, |_| {}).await;
    let ask = |extra: Value| {
        let mut body = json!({"input_ids": PROMPT, "request_output_len": 6, "ignore_eos": true,
                              "return_context_logits": true, "return_generation_logits": true});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    // Twice, the second time with the prompt's blocks cached: its logits are computed anew.
    for round in 0..2 {
        let (status, r) = s
            .post("/v2/models/tensorrt_llm/generate", ask(json!({})))
            .await;
        assert_eq!(status, 200, "{r}");
        let out = ids(&r["output_ids"]);
        assert_eq!(out.len(), 6);
        let all: Vec<u32> = PROMPT.iter().copied().chain(out.iter().copied()).collect();
        let want = logits_of(&model, &all);
        let context = floats(&r["context_logits"]);
        assert_eq!(context.len(), PROMPT.len() * vocab, "round {round}");
        assert!(
            rel_err(&context, &want[..PROMPT.len()].concat()) < TOL,
            "round {round}"
        );
        let generation = floats(&r["generation_logits"]);
        assert_eq!(generation.len(), 6 * vocab);
        let p = PROMPT.len();
        assert!(rel_err(&generation, &want[p - 1..p + 5].concat()) < TOL);
        // Greedy: each token is its row's argmax.
        for (row, &t) in generation.chunks(vocab).zip(&out) {
            let best = (0..vocab)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap();
            assert_eq!(best as u32, t);
        }
    }

    // A penalty changes the choices, not the rows returned: they are the model's raw ones.
    let (status, r) = s
        .post(
            "/v2/models/tensorrt_llm/generate",
            ask(json!({"repetition_penalty": 3.0, "return_context_logits": false})),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(r.get("context_logits").is_none(), "not asked: {r}");
    let out = ids(&r["output_ids"]);
    let all: Vec<u32> = PROMPT.iter().copied().chain(out.iter().copied()).collect();
    let want = logits_of(&model, &all);
    let p = PROMPT.len();
    let generation = floats(&r["generation_logits"]);
    assert!(rel_err(&generation, &want[p - 1..p - 1 + out.len()].concat()) < TOL);

    // Streamed: the rows arrive with their tokens, the context's with the first one.
    let r = reqwest::Client::new()
        .post(s.url("/v2/models/tensorrt_llm/generate_stream"))
        .json(&ask(json!({"stream": true})))
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let mut streamed = Vec::new();
    let mut gen_rows = Vec::new();
    let mut context_events = 0;
    for e in &events {
        let n = e["output_ids"].as_array().map_or(0, Vec::len);
        streamed.extend(ids(&e["output_ids"]));
        let g = e.get("generation_logits").map(floats).unwrap_or_default();
        assert_eq!(g.len(), n * vocab, "one row per token: {e}");
        gen_rows.extend(g);
        if let Some(c) = e.get("context_logits") {
            context_events += 1;
            assert_eq!(floats(c).len(), PROMPT.len() * vocab);
        }
    }
    assert_eq!(context_events, 1);
    let all: Vec<u32> = PROMPT
        .iter()
        .copied()
        .chain(streamed.iter().copied())
        .collect();
    let want = logits_of(&model, &all);
    assert!(rel_err(&gen_rows, &want[p - 1..p + 5].concat()) < TOL);

    // Without the flags there are none.
    let (_, r) = s
        .post(
            "/v2/models/tensorrt_llm/generate",
            json!({"input_ids": PROMPT, "request_output_len": 2}),
        )
        .await;
    assert!(
        r.get("context_logits").is_none() && r.get("generation_logits").is_none(),
        "{r}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kserve_infer_returns_logits_tensors_of_tensorrt_llms_shapes() {
    let dir = tiny_model_dir("logits-kserve");
    let model = LoadedModel::load(&dir).unwrap().model;
    let vocab = model.config().vocab_size;
    let s = start(&dir, |_| {}).await;
    let short = [5u32, 17, 43];
    // Two prompts of different lengths: input_ids padded, input_lengths give each.
    let padded: Vec<u32> = short.iter().copied().chain([0; 6]).chain(PROMPT).collect();
    let body = |flags: bool, outputs: Option<Value>| {
        let mut b = json!({"inputs": [
            {"name": "input_ids", "datatype": "INT32", "shape": [2, 9], "data": padded},
            {"name": "input_lengths", "datatype": "INT32", "shape": [2, 1], "data": [3, 9]},
            {"name": "request_output_len", "datatype": "INT32", "shape": [2, 1], "data": [4, 4]},
            {"name": "ignore_eos", "datatype": "BOOL", "shape": [2, 1], "data": [true, true]},
            {"name": "return_context_logits", "datatype": "BOOL", "shape": [2, 1], "data": [flags, flags]},
            {"name": "return_generation_logits", "datatype": "BOOL", "shape": [2, 1], "data": [flags, flags]},
        ]});
        if let Some(o) = outputs {
            b["outputs"] = o;
        }
        b
    };
    let (status, r) = s
        .post("/v2/models/tensorrt_llm/infer", body(true, None))
        .await;
    assert_eq!(status, 200, "{r}");
    let out = |name: &str| output(&r, name);
    let ctx = out("context_logits");
    assert_eq!(ctx["datatype"], "FP32");
    assert_eq!(ctx["shape"], json!([2, 9, vocab]));
    let gen = out("generation_logits");
    assert_eq!(gen["shape"], json!([2, 1, 4, vocab]));
    let out_ids = ids(&out("output_ids")["data"]);
    let (ctx, gen) = (floats(&ctx["data"]), floats(&gen["data"]));
    for (i, prompt) in [&short[..], &PROMPT[..]].into_iter().enumerate() {
        let all: Vec<u32> = prompt
            .iter()
            .copied()
            .chain(out_ids[i * 4..i * 4 + 4].iter().copied())
            .collect();
        let want = logits_of(&model, &all);
        let p = prompt.len();
        let rows = &ctx[i * 9 * vocab..(i + 1) * 9 * vocab];
        assert!(
            rel_err(&rows[..p * vocab], &want[..p].concat()) < TOL,
            "prompt {i}"
        );
        assert!(
            rows[p * vocab..].iter().all(|&x| x == 0.0),
            "padding of prompt {i}"
        );
        let rows = &gen[i * 4 * vocab..(i + 1) * 4 * vocab];
        assert!(
            rel_err(rows, &want[p - 1..p + 3].concat()) < TOL,
            "prompt {i}"
        );
    }

    // Not asked: not sent, and asking for the output without its flag is refused.
    let (status, r) = s
        .post("/v2/models/tensorrt_llm/infer", body(false, None))
        .await;
    assert_eq!(status, 200, "{r}");
    let names: Vec<&str> = r["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"context_logits") && !names.contains(&"generation_logits"));
    let (status, r) = s
        .post(
            "/v2/models/tensorrt_llm/infer",
            body(false, Some(json!([{"name": "generation_logits"}]))),
        )
        .await;
    assert_eq!(status, 400, "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("return_generation_logits"),
        "{r}"
    );
    s.stop().await;
}
