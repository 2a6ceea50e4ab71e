//! The OpenAI sampling surface over real HTTP against the tiny model: `n` choices per
//! prompt (indexed, streamed by index, usage counting each prompt once), `best_of`,
//! per-choice seeds, `logit_bias`, `min_p`, and the alternatives (`top_logprobs`) and
//! echoed prompt log-probabilities equal to the log-softmax of the model's own logits
//! (a direct forward pass of the same tokens).

mod common;

use common::direct::logits_of;
use common::server::{start, tiny_model_dir};
use inflight::model::{Llama, LoadedModel};
use inflight::tokenizer::chat::{ChatMessage, ChatTemplate, CHATML_TEMPLATE};
use serde_json::{json, Value};

fn choices(r: &Value) -> &Vec<Value> {
    r["choices"].as_array().unwrap()
}

/// The streamed text of choice `index` (completions' `text`, chat's `delta.content`).
fn streamed_text(events: &[Value], index: usize) -> String {
    events
        .iter()
        .flat_map(|e| choices(e).iter())
        .filter(|c| c["index"] == index)
        .map(|c| {
            c["text"]
                .as_str()
                .or(c["delta"]["content"].as_str())
                .unwrap_or("")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_are_indexed_streamed_by_index_and_counted_once() {
    let dir = tiny_model_dir("oai-n");
    let s = start(&dir, |_| {}).await;
    let prompt = "The quick brown fox jumps over the lazy dog again and again";
    let greedy = json!({"model": "ensemble", "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true, "n": 4});
    let (status, r) = s.post("/v1/completions", greedy.clone()).await;
    assert_eq!(status, 200, "{r}");
    let cs = choices(&r);
    assert_eq!(cs.len(), 4);
    for (i, c) in cs.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], cs[0]["text"], "greedy choices are identical");
    }
    // The prompt counts once; every choice's tokens count.
    assert_eq!(r["usage"]["prompt_tokens"], s.prompt_tokens(prompt));
    assert_eq!(r["usage"]["completion_tokens"], 4 * 6);

    // Streamed: each choice's deltas under its index, one finish each, usage last.
    let mut streamed = greedy.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = s.sse("/v1/completions", streamed).await;
    let (usage, chunks) = events.split_last().unwrap();
    for (i, c) in cs.iter().enumerate() {
        assert_eq!(streamed_text(chunks, i), c["text"].as_str().unwrap());
        let finals = chunks
            .iter()
            .flat_map(|e| choices(e).iter())
            .filter(|c| c["index"] == i && !c["finish_reason"].is_null())
            .count();
        assert_eq!(finals, 1, "choice {i}");
    }
    assert_eq!(usage["usage"]["prompt_tokens"], s.prompt_tokens(prompt));
    assert_eq!(usage["usage"]["completion_tokens"], 4 * 6);

    // Seeded: the same choices again, and choices that differ.
    let seeded = json!({"model": "ensemble", "prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": 5, "ignore_eos": true, "n": 4});
    let (_, a) = s.post("/v1/completions", seeded.clone()).await;
    let (_, b) = s.post("/v1/completions", seeded.clone()).await;
    let texts = |r: &Value| -> Vec<String> {
        choices(r)
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(texts(&a), texts(&b));
    let mut distinct = texts(&a);
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() >= 2, "{distinct:?}");
    // Streamed, the same seeded choices.
    let mut seeded_stream = seeded.clone();
    seeded_stream["stream"] = json!(true);
    let events = s.sse("/v1/completions", seeded_stream).await;
    for (i, t) in texts(&a).iter().enumerate() {
        assert_eq!(&streamed_text(&events, i), t);
    }

    // Several prompts: choice index prompt * n + j.
    let (_, r) = s.post("/v1/completions", json!({"model": "ensemble", "prompt": ["one two", prompt], "max_tokens": 8, "temperature": 1.0, "seed": 5, "ignore_eos": true, "n": 4})).await;
    assert_eq!(choices(&r).len(), 8);
    assert_eq!(texts(&r)[4..], texts(&a)[..]);
    assert_eq!(
        r["usage"]["prompt_tokens"],
        s.prompt_tokens("one two") + s.prompt_tokens(prompt)
    );

    // Chat: n choices, each streamed under its index after its own role delta.
    let chat = json!({"model": "ensemble", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5, "temperature": 0.9, "seed": 3, "ignore_eos": true, "n": 3});
    let (status, r) = s.post("/v1/chat/completions", chat.clone()).await;
    assert_eq!(status, 200, "{r}");
    let cs = choices(&r);
    assert_eq!(cs.len(), 3);
    assert_eq!(r["usage"]["completion_tokens"], 15);
    let mut chat_stream = chat;
    chat_stream["stream"] = json!(true);
    chat_stream["stream_options"] = json!({"include_usage": true});
    let events = s.sse("/v1/chat/completions", chat_stream).await;
    for (i, c) in cs.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(
            streamed_text(&events, i),
            c["message"]["content"].as_str().unwrap()
        );
        let roles = events
            .iter()
            .flat_map(|e| choices(e).iter())
            .filter(|d| d["index"] == i && d["delta"]["role"] == "assistant")
            .count();
        assert_eq!(roles, 1);
    }
    assert_eq!(
        events.last().unwrap()["usage"]["prompt_tokens"],
        r["usage"]["prompt_tokens"]
    );
    assert_eq!(events.last().unwrap()["usage"]["completion_tokens"], 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_of_returns_the_choices_of_highest_cumulative_log_probability() {
    let dir = tiny_model_dir("oai-best-of");
    let s = start(&dir, |_| {}).await;
    let body = |extra: Value| {
        let mut b = json!({"model": "ensemble", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.2, "seed": 21, "ignore_eos": true});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    // best_of 4 generates the sequences n = 4 does (the same seeds); the best two return.
    let (_, all) = s
        .post("/v1/completions", body(json!({"n": 4, "logprobs": 0})))
        .await;
    let mut ranked: Vec<(f64, String)> = choices(&all)
        .iter()
        .map(|c| {
            let cum: f64 = c["logprobs"]["token_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .sum();
            (cum, c["text"].as_str().unwrap().to_owned())
        })
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (status, r) = s
        .post("/v1/completions", body(json!({"n": 2, "best_of": 4})))
        .await;
    assert_eq!(status, 200, "{r}");
    let cs = choices(&r);
    assert_eq!(cs.len(), 2);
    let mut got: Vec<&str> = cs.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let mut want: Vec<&str> = ranked[..2].iter().map(|r| r.1.as_str()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(
        (cs[0]["index"].clone(), cs[1]["index"].clone()),
        (json!(0), json!(1))
    );
    // Log-probabilities were needed, not asked for: none returned. All four counted.
    assert!(cs.iter().all(|c| c["logprobs"].is_null()));
    assert_eq!(r["usage"]["completion_tokens"], 4 * 8);
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// The `k` likeliest ids of a row of log-probabilities (ties to the lower id).
fn top_ids(lp: &[f64], k: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..lp.len() as u32).collect();
    ids.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
    ids.truncate(k);
    ids
}

/// Greedy decoding of `n` tokens after `prompt` by direct forward passes: the tokens and
/// each position's log-softmax (the prompt's positions included).
fn greedy_reference(model: &Llama, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f64>>) {
    let mut all = prompt.to_vec();
    for _ in 0..n {
        let lp = log_softmax(logits_of(model, &all).last().unwrap());
        all.push(top_ids(&lp, 1)[0]);
    }
    let rows = logits_of(model, &all)
        .iter()
        .map(|r| log_softmax(r))
        .collect();
    (all[prompt.len()..].to_vec(), rows)
}

const TOL: f64 = 2e-4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_logprobs_and_echoed_prompt_logprobs_are_the_log_softmax_of_the_logits() {
    let dir = tiny_model_dir("oai-top");
    let model = LoadedModel::load(&dir).unwrap().model;
    let s = start(&dir, |_| {}).await;
    let handle = s.model();
    let tok = handle.tokenizer();
    let text = |id: u32| tok.token_text(id).unwrap_or_default();

    // Completions on token ids, greedy, echoed, 5 alternatives.
    let prompt: Vec<u32> = vec![5, 17, 43, 99, 120, 7, 7, 250, 31];
    let body = json!({"model": "tensorrt_llm", "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true, "logprobs": 5, "echo": true});
    let (status, r) = s.post("/v1/completions", body).await;
    assert_eq!(status, 200, "{r}");
    let (generated, rows) = greedy_reference(&model, &prompt, 4);
    let lp = &choices(&r)[0]["logprobs"];
    let all: Vec<u32> = prompt.iter().chain(&generated).copied().collect();
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), all.len());
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    for (i, &id) in all.iter().enumerate().skip(1) {
        assert_eq!(tokens[i], text(id), "position {i}");
        let want = &rows[i - 1];
        let got = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(
            (got - want[id as usize]).abs() < TOL,
            "position {i}: {got} vs {}",
            want[id as usize]
        );
        // The 5 likeliest, and the token itself when it is not among them, by text (a
        // text two tokens share keeps the likelier, as the tiny model's byte tokens do).
        let top = lp["top_logprobs"][i].as_object().unwrap();
        let mut expect = top_ids(want, 5);
        if !expect.contains(&id) {
            expect.push(id);
        }
        let mut by_text: Vec<(String, f64)> = Vec::new();
        for t in expect {
            if !by_text.iter().any(|(x, _)| *x == text(t)) {
                by_text.push((text(t), want[t as usize]));
            }
        }
        assert_eq!(top.len(), by_text.len(), "position {i}: {top:?}");
        for (t, w) in by_text {
            let v = top[&t].as_f64().unwrap();
            assert!((v - w).abs() < TOL, "position {i} token {t:?}");
        }
    }
    // Offsets: the prompt's tokens from 0, the answer's after the echoed text.
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    let echo_len = tok.decode(&prompt, false).unwrap().chars().count() as u64;
    assert_eq!(offsets[prompt.len()], echo_len);

    // Chat, greedy, 5 alternatives per token, whole and streamed.
    let chat = json!({"model": "ensemble", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 5, "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 5});
    let template =
        ChatTemplate::new(tok.chat_template().unwrap_or(CHATML_TEMPLATE), "", "").unwrap();
    let rendered = template
        .apply(&[ChatMessage::new("user", "Hello there")], true)
        .unwrap();
    let chat_prompt = tok.encode(&rendered, true).unwrap();
    let (generated, rows) = greedy_reference(&model, &chat_prompt, 5);
    let (status, r) = s.post("/v1/chat/completions", chat.clone()).await;
    assert_eq!(status, 200, "{r}");
    let content = choices(&r)[0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    let mut streamed_chat = chat;
    streamed_chat["stream"] = json!(true);
    let streamed: Vec<Value> = s
        .sse("/v1/chat/completions", streamed_chat)
        .await
        .iter()
        .flat_map(|e| choices(e).to_vec())
        .filter_map(|c| c["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed, content);
    assert_eq!(content.len(), 5);
    for (j, (t, &id)) in content.iter().zip(&generated).enumerate() {
        let want = &rows[chat_prompt.len() - 1 + j];
        assert_eq!(t["token"], text(id));
        assert!((t["logprob"].as_f64().unwrap() - want[id as usize]).abs() < TOL);
        let top = t["top_logprobs"].as_array().unwrap();
        let ids = top_ids(want, 5);
        assert_eq!(top.len(), 5);
        for (a, &want_id) in top.iter().zip(&ids) {
            assert_eq!(a["token"], text(want_id), "token {j}");
            assert!((a["logprob"].as_f64().unwrap() - want[want_id as usize]).abs() < TOL);
            assert_eq!(
                a["bytes"],
                json!(tok.token_bytes(want_id).unwrap_or_default())
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_and_min_p_steer_sampling() {
    let dir = tiny_model_dir("oai-bias");
    let s = start(&dir, |_| {}).await;
    let body = json!({"model": "tensorrt_llm", "prompt": [3, 4, 5], "max_tokens": 5, "temperature": 1.0, "seed": 2, "ignore_eos": true, "logprobs": 0});
    // +100 on token 77: every token is 77.
    let mut pinned = body.clone();
    pinned["logit_bias"] = json!({"77": 100});
    let (status, r) = s.post("/v1/completions", pinned).await;
    assert_eq!(status, 200, "{r}");
    let want = s.model().tokenizer().token_text(77).unwrap_or_default();
    let tokens = choices(&r)[0]["logprobs"]["tokens"].as_array().unwrap();
    assert!(tokens.iter().all(|t| *t == want), "{tokens:?}");
    // min_p 1 keeps the likeliest token alone: sampling at any temperature is greedy.
    let mut strict = body.clone();
    strict["min_p"] = json!(1.0);
    let mut greedy = body;
    greedy["temperature"] = json!(0);
    let (_, a) = s.post("/v1/completions", strict).await;
    let (_, b) = s.post("/v1/completions", greedy).await;
    assert_eq!(choices(&a)[0]["text"], choices(&b)[0]["text"]);
}
