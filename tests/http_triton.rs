//! The Triton generate extension over real HTTP against the tiny model: generate,
//! generate_stream (SSE), batch_index, the core model's ids, the three cancellation paths
//! (blocks freed, active requests back to zero), malformed requests (server healthy after
//! each), metrics, and a graceful stop that lets a running request finish.

mod common;

use std::time::{Duration, Instant};

use common::server::{start_tiny, TestServer};
use futures::StreamExt;
use serde_json::{json, Value};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let r = client()
        .post(s.url(path))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The `data:` payloads of an SSE body, checking there are no other line kinds.
fn sse_events(body: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for line in body.lines() {
        if let Some(data) = line.strip_prefix("data: ") {
            out.push(serde_json::from_str(data).expect("event is JSON"));
        } else {
            assert!(
                line.is_empty() || line.starts_with(':'),
                "unexpected SSE line {line:?}"
            );
        }
    }
    out
}

async fn wait_idle(s: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = s.model().stats().await.unwrap();
        if st.active_requests == 0 && st.free_blocks == st.total_blocks {
            return;
        }
        assert!(Instant::now() < deadline, "not idle: {st:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A metric's value; 0 when it has not been recorded yet.
async fn metric(s: &TestServer, line_start: &str) -> f64 {
    s.metric(line_start).await.unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_answers_with_triton_keys() {
    let s = start_tiny("gen", |_| {}).await;
    // No Content-Type header, as tritonclient and curl -d send it.
    let (status, body) = post(&s, "/v2/models/ensemble/generate", json!({"text_input": "hello there", "max_tokens": 6, "bad_words": "", "stop_words": "", "id": "a1", "ignore_eos": true})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model_name"], "ensemble");
    assert_eq!(body["model_version"], "1");
    assert_eq!(body["id"], "a1");
    let text = body["text_output"].as_str().unwrap();
    assert!(text.starts_with("hello there"), "prompt echoed: {text:?}");
    assert_eq!(body["output_log_probs"].as_array().unwrap().len(), 6);
    // exclude_input_in_output drops the echo; return_log_probs gives real values.
    let (_, body) = post(&s, "/v2/models/tensorrt_llm_bls/generate", json!({"text_input": ["hello there"], "parameters": {"max_tokens": 4, "exclude_input_in_output": true, "return_log_probs": true, "ignore_eos": true}})).await;
    assert!(!body["text_output"].as_str().unwrap().starts_with("hello"));
    let lps: Vec<f64> = body["output_log_probs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(lps.len(), 4);
    assert!(
        lps.iter().all(|&l| l <= 0.0) && lps.iter().any(|&l| l < 0.0),
        "{lps:?}"
    );
    let cum = body["cum_log_probs"].as_f64().unwrap();
    assert!((cum - lps.iter().sum::<f64>()).abs() < 1e-3);
    // The core model takes and returns ids.
    let (status, body) = post(
        &s,
        "/v2/models/tensorrt_llm/generate",
        json!({"input_ids": [5, 6, 7], "request_output_len": 5, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output_ids"].as_array().unwrap().len(), 5);
    assert_eq!(body["sequence_length"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_stream_sends_sse_events_with_batch_index() {
    let s = start_tiny("sse", |_| {}).await;
    let r = client()
        .post(s.url("/v2/models/ensemble/generate_stream"))
        .body(json!({"text_input": ["one", "two", "three"], "max_tokens": 5, "stream": true, "ignore_eos": true}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse_events(&r.text().await.unwrap());
    for i in 0..3 {
        let mine: Vec<&Value> = events.iter().filter(|e| e["batch_index"] == i).collect();
        assert_eq!(
            mine.len(),
            5,
            "5 token events for prompt {i}, the last one carrying the end"
        );
        assert!(mine.last().unwrap()["finish_reason"] == "length");
        assert!(mine[..4].iter().all(|e| e.get("finish_reason").is_none()));
    }
    // Non-streamed through generate_stream: one event per prompt with the whole answer.
    let r = client()
        .post(s.url("/v2/models/ensemble/generate_stream"))
        .body(json!({"text_input": "one", "max_tokens": 5, "ignore_eos": true}).to_string())
        .send()
        .await
        .unwrap();
    let events = sse_events(&r.text().await.unwrap());
    assert_eq!(events.len(), 1);
    // A batch through generate: per-prompt keys become lists.
    let (_, body) = post(
        &s,
        "/v2/models/ensemble/generate",
        json!({"text_input": ["one", "two"], "max_tokens": 3}),
    )
    .await;
    assert_eq!(body["batch_index"], json!([0, 1]));
    assert_eq!(body["text_output"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ways_to_cancel_free_the_blocks() {
    let s = start_tiny("cancel", |_| {}).await;
    // 1,500 tokens take the tiny model over a second on the CPU but only about 150 ms on a
    // GPU, so each way to cancel acts within the first few tens of milliseconds.
    let long = |id: &str| json!({"id": id, "text_input": "a long one", "max_tokens": 1500, "stream": true, "ignore_eos": true});
    // 1. A stop request with the same id.
    let stream = client()
        .post(s.url("/v2/models/ensemble/generate_stream"))
        .body(long("x1").to_string())
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, body) = post(
        &s,
        "/v2/models/ensemble/generate",
        json!({"id": "x1", "stop": true}),
    )
    .await;
    assert_eq!((status, &body["id"]), (200, &json!("x1")));
    let events = sse_events(&stream.text().await.unwrap());
    assert_eq!(events.last().unwrap()["finish_reason"], "cancelled");
    assert!(events.len() < 1500);
    // 2. stop_after_ms.
    let start = Instant::now();
    let mut body = long("x2");
    body["stop_after_ms"] = json!(30);
    let stream = client()
        .post(s.url("/v2/models/ensemble/generate_stream"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let events = sse_events(&stream.text().await.unwrap());
    assert_eq!(events.last().unwrap()["finish_reason"], "cancelled");
    assert!(start.elapsed() < Duration::from_secs(2));
    // 3. The client hangs up mid-stream.
    let r = client()
        .post(s.url("/v2/models/ensemble/generate_stream"))
        .body(long("x3").to_string())
        .send()
        .await
        .unwrap();
    let mut bytes = r.bytes_stream();
    let _ = bytes.next().await;
    drop(bytes);
    wait_idle(&s).await;
    assert_eq!(
        metric(&s, "nv_trt_llm_request_metrics{request_type=\"active\"").await,
        0.0
    );
    assert_eq!(
        metric(
            &s,
            "nv_inference_request_failure{model=\"ensemble\",version=\"1\",reason=\"CANCELED\"}"
        )
        .await,
        3.0
    );
    let st = s.model().stats().await.unwrap();
    assert_eq!(
        metric(
            &s,
            "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"free\""
        )
        .await,
        st.total_blocks as f64
    );
    // A stop request without an id is refused, as TRT-LLM does.
    let (status, body) = post(&s, "/v2/models/ensemble/generate", json!({"stop": true})).await;
    assert_eq!(status, 400);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("request ID is not provided"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_clear_errors_and_the_server_stays_healthy() {
    let s = start_tiny("bad", |_| {}).await;
    let ctx = s.model().config().max_position_embeddings;
    let long_prompt: String = "word ".repeat(ctx + 10);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "/v2/models/ensemble/generate",
            "{not json".into(),
            400,
            "malformed JSON",
        ),
        ("/v2/models/ensemble/generate", "".into(), 400, "empty"),
        (
            "/v2/models/ensemble/generate",
            "[1,2]".into(),
            400,
            "JSON object",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"max_tokens": 5}).to_string(),
            400,
            "text_input",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi"}).to_string(),
            400,
            "max_tokens",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 2, "end_id": 4294967297u64}).to_string(),
            400,
            "end_id",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 2, "pad_id": 4294967296u64}).to_string(),
            400,
            "pad_id",
        ),
        (
            "/v2/models/ensemble/versions/2/generate",
            json!({"text_input": "hi", "max_tokens": 2}).to_string(),
            400,
            "version 2 is not found",
        ),
        (
            "/v2/models/ensemble/versions/abc/generate",
            json!({"text_input": "hi", "max_tokens": 2}).to_string(),
            400,
            "version abc is not found",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": -3}).to_string(),
            400,
            "at least 1",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 0}).to_string(),
            400,
            "at least 1",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 10_000_000}).to_string(),
            400,
            "context length",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": "five"}).to_string(),
            400,
            "'max_tokens' must be an integer",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": 42, "max_tokens": 5}).to_string(),
            400,
            "text_input",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "temperature": "hot"}).to_string(),
            400,
            "temperature",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "temperature": -1.0}).to_string(),
            400,
            "temperature",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "top_p": 2.0}).to_string(),
            400,
            "top_p",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "repetition_penalty": 0.0}).to_string(),
            400,
            "repetition_penalty",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "beam_width": 0}).to_string(),
            400,
            "beam_width",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "return_perf_metrics": true}).to_string(),
            400,
            "return_perf_metrics",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "num_draft_tokens": 4}).to_string(),
            400,
            "num_draft_tokens",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "end_id": 99_999_999}).to_string(),
            400,
            "vocabulary",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "parameters": 3}).to_string(),
            400,
            "parameters",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "random_seed": -1}).to_string(),
            400,
            "negative",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": long_prompt, "max_tokens": 5}).to_string(),
            400,
            "context",
        ),
        (
            "/v2/models/nope/generate",
            json!({"text_input": "hi", "max_tokens": 5}).to_string(),
            400,
            "unknown model",
        ),
        (
            "/v2/models/tensorrt_llm/generate",
            json!({"input_ids": ["a"], "max_tokens": 5}).to_string(),
            400,
            "input_ids",
        ),
        (
            "/v2/models/tensorrt_llm/generate",
            json!({"input_ids": [1, 99_999_999], "max_tokens": 5}).to_string(),
            400,
            "vocabulary",
        ),
        (
            "/v2/models/tensorrt_llm/generate",
            json!({"text_input": "hi", "max_tokens": 5}).to_string(),
            400,
            "input_ids",
        ),
        (
            "/v2/models/ensemble/generate_stream",
            "{\"text_input\":".into(),
            400,
            "malformed JSON",
        ),
        (
            "/v2/models/ensemble/generate_stream",
            json!({"text_input": "hi", "max_tokens": 5, "stream": "yes"}).to_string(),
            400,
            "boolean",
        ),
        (
            "/v2/models/ensemble/generate",
            json!({"text_input": "hi", "max_tokens": 5, "id": {"x": 1}}).to_string(),
            400,
            "id",
        ),
    ];
    assert!(cases.len() >= 25);
    for (path, body, status, needle) in &cases {
        let r = client()
            .post(s.url(path))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), *status, "{path} {body:.80}");
        let v: Value = r.json().await.expect("error body is JSON");
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error string for {body:.80}: {v}"));
        assert!(
            msg.to_lowercase().contains(&needle.to_lowercase()),
            "{body:.80}: {msg}"
        );
        let ready = client()
            .get(s.url("/v2/health/ready"))
            .send()
            .await
            .unwrap();
        assert_eq!(ready.status(), 200, "not ready after {body:.80}");
    }
    // Wrong method and unknown path.
    let r = client()
        .get(s.url("/v2/models/ensemble/generate"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "Method Not Allowed"
    );
    let r = client().get(s.url("/v3/nothing")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.json::<Value>().await.unwrap()["error"].is_string());
    // A body past the default limit (16 MiB) is refused before any handler: JSON all the same.
    let huge = json!({"text_input": "x".repeat(17 << 20), "max_tokens": 1}).to_string();
    let r = client()
        .post(s.url("/v2/models/ensemble/generate"))
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let body: Value = r.json().await.expect("a JSON error body");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("max_request_body_bytes"),
        "{body}"
    );
    // Still serving, under its served version too.
    let (status, _) = post(
        &s,
        "/v2/models/ensemble/generate",
        json!({"text_input": "hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &s,
        "/v2/models/ensemble/versions/1/generate",
        json!({"text_input": "hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_503_and_metrics_count_it() {
    let s = start_tiny("full", |o| {
        o.scheduler.max_queue_size = 1;
        o.scheduler.max_batch_size = 1;
    })
    .await;
    let long = json!({"text_input": "x", "max_tokens": 1500, "ignore_eos": true, "stream": true});
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..6 {
        let r = client()
            .post(s.url("/v2/models/ensemble/generate_stream"))
            .body(long.to_string())
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            assert_eq!(r.headers()["retry-after"], "1", "told when to come back");
            refused = Some(r.json::<Value>().await.unwrap());
            break;
        }
        held.push(r);
    }
    let body = refused.expect("the queue filled");
    assert!(body["error"].as_str().unwrap().contains("queue"), "{body}");
    assert_eq!(
        metric(
            &s,
            "nv_inference_request_failure{model=\"ensemble\",version=\"1\",reason=\"REJECTED\"}"
        )
        .await,
        1.0
    );
    // OpenAI's clients get 429 and OpenAI's error object for the same refusal.
    let r = client()
        .post(s.url("/v1/completions"))
        .body(json!({"model": "ensemble", "prompt": "x", "max_tokens": 2}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("queue"));
    // A request with more prompts than the queue holds can never fit: 400, not 503.
    let (status, body) = post(
        &s,
        "/v2/models/ensemble/generate",
        json!({"text_input": ["a", "b"], "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("max_queue_size"),
        "{body}"
    );
    drop(held);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_requests() {
    let s = start_tiny("metrics", |_| {}).await;
    for _ in 0..3 {
        post(
            &s,
            "/v2/models/ensemble/generate",
            json!({"text_input": "count me", "max_tokens": 4, "ignore_eos": true}),
        )
        .await;
    }
    let text = client()
        .get(format!("{}/metrics", s.metrics))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "nv_inference_request_success",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_pending_request_count",
        "nv_trt_llm_request_metrics",
        "nv_trt_llm_kv_cache_block_metrics",
        "nv_trt_llm_inflight_batcher_metrics",
        "nv_trt_llm_general_metrics",
        "nv_trt_llm_runtime_memory_metrics",
        "inflight_time_to_first_token_seconds",
        "inflight_inter_token_latency_seconds",
        "inflight_e2e_request_latency_seconds",
        "inflight_engine_compute_duration_us",
        "inflight_engine_wait_duration_us",
        "inflight_engine_wait_count",
        "inflight_preemptions_total",
        "inflight_preempted_tokens_total",
        "inflight_swap_preemptions_total",
        "inflight_long_rope_restarts_total",
        "inflight_kv_blocks_swapped_out_total",
        "inflight_kv_blocks_swapped_in_total",
    ] {
        assert!(text.contains(name), "missing {name}");
    }
    assert_eq!(
        metric(
            &s,
            "nv_inference_request_success{model=\"ensemble\",version=\"1\"}"
        )
        .await,
        3.0
    );
    assert_eq!(
        metric(&s, "nv_inference_count{model=\"ensemble\",version=\"1\"}").await,
        3.0
    );
    assert_eq!(
        metric(
            &s,
            "inflight_time_to_first_token_seconds_count{model=\"ensemble\"}"
        )
        .await,
        3.0
    );
    assert_eq!(
        metric(
            &s,
            "inflight_inter_token_latency_seconds_count{model=\"ensemble\"}"
        )
        .await,
        9.0
    );
    assert!(
        metric(
            &s,
            "nv_inference_exec_count{model=\"tensorrt_llm\",version=\"1\"}"
        )
        .await
            >= 4.0
    );
    // Engine time: every iteration computed; each answer's later tokens came from
    // iterations sent in reply to the one before, whose waits are counted.
    let engine = |name: &str| format!("{name}{{model=\"tensorrt_llm\",version=\"1\"}}");
    assert!(metric(&s, &engine("inflight_engine_compute_duration_us")).await > 0.0);
    assert!(metric(&s, &engine("inflight_engine_wait_count")).await >= 3.0);
    let wait = metric(&s, &engine("inflight_engine_wait_duration_us")).await;
    assert!(wait > 0.0 && wait < 60e6, "wait {wait} us");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_lets_running_requests_finish() {
    let s = start_tiny("drain", |_| {}).await;
    let url = s.url("/v2/models/ensemble/generate");
    let running = tokio::spawn(async move {
        let r = client()
            .post(url)
            .body(json!({"text_input": "x", "max_tokens": 300, "ignore_eos": true}).to_string())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let base = s.base.clone();
    s.stop().await;
    let (status, body) = running.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["finish_reason"], "length");
    // The listener is gone.
    assert!(client()
        .get(format!("{base}/v2/health/live"))
        .send()
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_orders_the_queue_and_is_range_checked() {
    // One sequence at a time: while a long one runs, the queue's order is the answer order.
    let s = start_tiny("priority", |o| o.scheduler.max_batch_size = 1).await;
    let running = client()
        .post(s.url("/v2/models/ensemble/generate_stream"))
        .body(
            json!({"text_input": "x", "max_tokens": 300, "ignore_eos": true, "stream": true})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    let mut events = running.bytes_stream();
    let _ = events.next().await;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // Arrival order 5, 0, -1, 0 (a Triton field and the OpenAI extra): answers -1, 0, 0, 5.
    for (i, p) in [5, 0, -1, 0].into_iter().enumerate() {
        let (url, body) = if i % 2 == 0 {
            (
                s.url("/v2/models/ensemble/generate"),
                json!({"text_input": "y", "max_tokens": 2, "priority": p}),
            )
        } else {
            (
                s.url("/v1/completions"),
                json!({"model": "ensemble", "prompt": "y", "max_tokens": 2, "priority": p}),
            )
        };
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let r = client()
                .post(url)
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            order.lock().unwrap().push(i);
        }));
        // Queued one after the other, before the running one ends.
        let deadline = Instant::now() + Duration::from_secs(10);
        while metric(&s, "nv_trt_llm_request_metrics{request_type=\"waiting\"").await
            < (i + 1) as f64
        {
            assert!(Instant::now() < deadline, "request {i} never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    while events.next().await.is_some() {}
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![2, 1, 3, 0]);
    let (status, body) = post(
        &s,
        "/v2/models/ensemble/generate",
        json!({"text_input": "y", "max_tokens": 2, "priority": 1u64 << 31}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("'priority' must be between"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn num_return_sequences_answers_each_sequence_with_its_index() {
    let s = start_tiny("triton-nrs", |_| {}).await;
    let body = json!({"text_input": "Once upon", "max_tokens": 6, "ignore_eos": true,
                      "temperature": 1.0, "random_seed": 7, "num_return_sequences": 3});
    let (status, r) = post(&s, "/v2/models/ensemble/generate", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["batch_index"], json!([0, 0, 0]));
    assert_eq!(r["sequence_index"], json!([0, 1, 2]));
    let texts: Vec<&str> = r["text_output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(texts.len(), 3);
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "three draws: {texts:?}"
    );
    // Seeded: the same sequences again.
    let (_, again) = post(&s, "/v2/models/ensemble/generate", body).await;
    assert_eq!(again["text_output"], r["text_output"]);

    // Streamed: every sequence's events carry its index, each ends once.
    let mut streamed = json!({"text_input": "Once upon", "max_tokens": 4, "ignore_eos": true,
                              "temperature": 1.0, "random_seed": 7, "num_return_sequences": 2});
    streamed["stream"] = json!(true);
    let text = client()
        .post(s.url("/v2/models/ensemble/generate_stream"))
        .json(&streamed)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = sse_events(&text);
    for j in 0..2 {
        let ends = events
            .iter()
            .filter(|e| e["sequence_index"] == j && e.get("finish_reason").is_some())
            .count();
        assert_eq!(ends, 1, "sequence {j}: {text}");
    }
    assert!(events.iter().all(|e| e["batch_index"] == 0));

    // KServe infer: two prompts, two sequences each, rows prompt-major.
    let infer = json!({"inputs": [
        {"name": "input_ids", "datatype": "INT32", "shape": [2, 3], "data": [5, 6, 7, 8, 9, 10]},
        {"name": "request_output_len", "datatype": "INT32", "shape": [2, 1], "data": [3, 3]},
        {"name": "num_return_sequences", "datatype": "INT32", "shape": [2, 1], "data": [2, 2]},
    ]});
    let (status, r) = post(&s, "/v2/models/tensorrt_llm/infer", infer).await;
    assert_eq!(status, 200, "{r}");
    let out = |name: &str| common::json::output(&r, name);
    assert_eq!(out("batch_index")["data"], json!([0, 0, 1, 1]));
    assert_eq!(out("sequence_index")["data"], json!([0, 1, 0, 1]));
    assert_eq!(out("output_ids")["shape"], json!([4, 1, 3]));

    for bad in [0, 17, -1] {
        let (status, r) = post(
            &s,
            "/v2/models/ensemble/generate",
            json!({"text_input": "x", "max_tokens": 2, "num_return_sequences": bad}),
        )
        .await;
        assert_eq!(status, 400, "{bad}: {r}");
        assert!(
            r["error"]
                .as_str()
                .unwrap()
                .contains("num_return_sequences"),
            "{r}"
        );
    }
    s.stop().await;
}
