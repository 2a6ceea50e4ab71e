//! The newer routes over real HTTP against the tiny model: vLLM's `/tokenize` and
//! `/detokenize` (counts equal to a generation's prompt tokens, plain and chat), OpenAI's
//! `/v1/embeddings` (floats and base64 alike, unit norm, batches, both poolings,
//! refusals), `/v1/responses` (whole and streamed as typed events, the same text as chat,
//! refusals of what a stateless server cannot honour, a failure in mid-stream), and
//! `/openapi.json` (every documented operation is routed).

mod common;

use base64::Engine as _;
use common::server::{start_tiny, TestServer};
use inflight::model::Pooling;
use serde_json::{json, Value};

/// A 400 whose OpenAI error object's message contains `needle`.
async fn refused(s: &TestServer, path: &str, body: Value, needle: &str) {
    let (status, r) = s.post(path, body.clone()).await;
    assert_eq!(status, 400, "{body} gave {r}");
    assert_eq!(r["error"]["type"], "invalid_request_error", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains(needle), "{body}: {message}");
}

const MESSAGES: &str = r#"[{"role": "system", "content": "be brief"}, {"role": "user", "content": "Name three colours."}]"#;

fn messages() -> Value {
    serde_json::from_str(MESSAGES).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_counts_what_a_generation_counts() {
    let s = start_tiny("ep-tok", |_| {}).await;
    let prompt = "The quick brown fox <|im_end|> jumps";
    let (status, t) = s
        .post("/tokenize", json!({"model": "ensemble", "prompt": prompt}))
        .await;
    assert_eq!(status, 200, "{t}");
    let tokens: Vec<u64> = serde_json::from_value(t["tokens"].clone()).unwrap();
    assert_eq!(t["count"], tokens.len());
    assert_eq!(t["max_model_len"], 2048);
    assert!(t.get("token_strs").is_none());
    let (_, c) = s
        .post(
            "/v1/completions",
            json!({"model": "ensemble", "prompt": prompt, "max_tokens": 1}),
        )
        .await;
    assert_eq!(c["usage"]["prompt_tokens"], t["count"]);
    // Control tokens written in the text are one id each, and come back whole.
    let (_, d) = s.post("/detokenize", json!({"tokens": tokens})).await;
    assert_eq!(d["prompt"], prompt);
    let (_, strs) = s
        .post(
            "/tokenize",
            json!({"prompt": prompt, "return_token_strs": true}),
        )
        .await;
    let pieces: Vec<String> = serde_json::from_value(strs["token_strs"].clone()).unwrap();
    assert_eq!(pieces.len(), tokens.len());
    assert_eq!(pieces.concat(), prompt);

    // Chat messages through the template, with and without the generation prompt.
    let (_, chat) = s
        .post(
            "/tokenize",
            json!({"model": "ensemble", "messages": messages()}),
        )
        .await;
    let (_, cc) = s
        .post(
            "/v1/chat/completions",
            json!({"model": "ensemble", "messages": messages(), "max_tokens": 1}),
        )
        .await;
    assert_eq!(chat["count"], cc["usage"]["prompt_tokens"]);
    let (_, bare) = s
        .post(
            "/tokenize",
            json!({"messages": messages(), "add_generation_prompt": false}),
        )
        .await;
    assert!(
        bare["count"].as_u64() < chat["count"].as_u64(),
        "{bare} vs {chat}"
    );

    refused(
        &s,
        "/tokenize",
        json!({"prompt": "x", "messages": messages()}),
        "not both",
    )
    .await;
    refused(&s, "/tokenize", json!({}), "'prompt' or 'messages'").await;
    refused(
        &s,
        "/tokenize",
        json!({"prompt": "x", "tools": []}),
        "unknown field `tools`",
    )
    .await;
    refused(&s, "/tokenize", json!({"prompt": 3}), "'prompt'").await;
    refused(
        &s,
        "/tokenize",
        json!({"messages": [{"role": "robot", "content": "x"}]}),
        "messages[0].role",
    )
    .await;
    refused(
        &s,
        "/tokenize",
        json!({"prompt": "x", "add_generation_prompt": true}),
        "add_generation_prompt",
    )
    .await;
    refused(&s, "/detokenize", json!({"tokens": [1, 100000]}), "100000").await;
    refused(&s, "/detokenize", json!({"tokens": [-1]}), "'tokens[0]'").await;
    let (status, r) = s
        .post("/tokenize", json!({"model": "gpt-4", "prompt": "x"}))
        .await;
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
}

fn floats(v: &Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_as_floats_and_base64() {
    let s = start_tiny("ep-embed", |_| {}).await;
    let texts = [
        "the first text to embed",
        "a second, different one",
        "the first text to embed",
    ];
    let (status, r) = s
        .post(
            "/v1/embeddings",
            json!({"model": "ensemble", "input": texts}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "list");
    assert_eq!(r["model"], "ensemble");
    let data = r["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let vectors: Vec<Vec<f32>> = data.iter().map(|d| floats(&d["embedding"])).collect();
    for (i, d) in data.iter().enumerate() {
        assert_eq!(
            (d["object"].as_str(), d["index"].as_u64()),
            (Some("embedding"), Some(i as u64))
        );
        assert_eq!(vectors[i].len(), 64, "the model's hidden size");
        assert!(
            (dot(&vectors[i], &vectors[i]) - 1.0).abs() < 1e-5,
            "unit norm"
        );
    }
    assert_eq!(vectors[0], vectors[2], "the same text, the same vector");
    assert!(
        dot(&vectors[0], &vectors[1]) < 0.9999,
        "different texts differ"
    );
    let mut count = 0;
    for t in texts {
        let (_, tok) = s.post("/tokenize", json!({"prompt": t})).await;
        count += tok["count"].as_u64().unwrap();
    }
    assert_eq!(r["usage"]["prompt_tokens"], count);
    assert_eq!(r["usage"]["total_tokens"], count);

    // base64 of little-endian f32: the same numbers.
    let (_, b) = s
        .post(
            "/v1/embeddings",
            json!({"model": "ensemble", "input": texts[0], "encoding_format": "base64"}),
        )
        .await;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(decoded, vectors[0]);

    // Token ids in: the same vector as their text.
    let (_, tok) = s.post("/tokenize", json!({"prompt": texts[1]})).await;
    let (_, by_ids) = s
        .post(
            "/v1/embeddings",
            json!({"model": "ensemble", "input": [tok["tokens"]]}),
        )
        .await;
    assert_eq!(floats(&by_ids["data"][0]["embedding"]), vectors[1]);

    refused(
        &s,
        "/v1/embeddings",
        json!({"model": "ensemble", "input": "x", "dimensions": 8}),
        "'dimensions'",
    )
    .await;
    refused(
        &s,
        "/v1/embeddings",
        json!({"model": "ensemble", "input": []}),
        "empty",
    )
    .await;
    refused(
        &s,
        "/v1/embeddings",
        json!({"model": "ensemble", "input": [1, "x"]}),
        "'input' must be",
    )
    .await;
    refused(
        &s,
        "/v1/embeddings",
        json!({"model": "ensemble", "input": ""}),
        "empty",
    )
    .await;
    refused(
        &s,
        "/v1/embeddings",
        json!({"model": "ensemble", "input": "x", "encoding_format": "hex"}),
        "'encoding_format'",
    )
    .await;
    refused(
        &s,
        "/v1/embeddings",
        json!({"model": "ensemble", "input": "x", "truncate_prompt_tokens": 3}),
        "truncate_prompt_tokens",
    )
    .await;
    refused(&s, "/v1/embeddings", json!({"input": "x"}), "`model`").await;
    let (status, _) = s
        .post("/v1/embeddings", json!({"model": "gpt-4", "input": "x"}))
        .await;
    assert_eq!(status, 404);

    // Mean pooling, configured: another vector, unit norm too.
    let m = start_tiny("ep-embed-mean", |o| o.pooling = Pooling::Mean).await;
    let (_, mean) = m
        .post(
            "/v1/embeddings",
            json!({"model": "ensemble", "input": texts[0]}),
        )
        .await;
    let mean = floats(&mean["data"][0]["embedding"]);
    assert!((dot(&mean, &mean) - 1.0).abs() < 1e-5);
    assert!(
        dot(&mean, &vectors[0]) < 0.9999,
        "mean and last pooling differ"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_answer_what_chat_answers() {
    let s = start_tiny("ep-resp", |_| {}).await;
    let (_, chat) = s
        .post(
            "/v1/chat/completions",
            json!({"model": "ensemble", "messages": messages(), "max_tokens": 8, "temperature": 0}),
        )
        .await;
    let want = chat["choices"][0]["message"]["content"].as_str().unwrap();
    let body = json!({"model": "ensemble", "instructions": "be brief", "input": "Name three colours.", "max_output_tokens": 8, "temperature": 0, "metadata": {"k": "v"}});
    let r = reqwest::Client::new()
        .post(s.url("/v1/responses"))
        .header("x-request-id", "my-response")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "my-response");
    let r: Value = r.json().await.unwrap();
    assert_eq!(r["id"], "resp_my-response");
    assert_eq!(r["object"], "response");
    assert_eq!(r["model"], "ensemble");
    assert_eq!(r["metadata"]["k"], "v");
    assert_eq!(r["store"], false);
    let out = &r["output"][0];
    assert_eq!(
        (out["type"].as_str(), out["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(out["content"][0]["type"], "output_text");
    assert_eq!(out["content"][0]["text"], want);
    assert_eq!(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
    assert_eq!(
        r["usage"]["output_tokens"],
        chat["usage"]["completion_tokens"]
    );
    let finished = match chat["choices"][0]["finish_reason"].as_str() {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        _ => ("completed", Value::Null),
    };
    assert_eq!(
        (
            r["status"].as_str().unwrap(),
            r["incomplete_details"].clone()
        ),
        finished
    );

    // The same as typed events.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(s.url("/v1/responses"))
        .json(&streamed)
        .send()
        .await
        .unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(names.len(), events.len());
    for (i, (name, e)) in names.iter().zip(&events).enumerate() {
        assert_eq!(e["type"], *name);
        assert_eq!(e["sequence_number"], i);
    }
    let last = if finished.0 == "completed" {
        "response.completed"
    } else {
        "response.incomplete"
    };
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        names[names.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            last
        ]
    );
    assert!(names[4..names.len() - 4]
        .iter()
        .all(|n| *n == "response.output_text.delta"));
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, want);
    let done = events.last().unwrap();
    assert_eq!(done["response"]["output"][0]["content"][0]["text"], want);
    assert_eq!(done["response"]["status"], finished.0);
    assert_eq!(
        done["response"]["usage"]["output_tokens"],
        chat["usage"]["completion_tokens"]
    );
    assert_eq!(events[0]["response"]["status"], "in_progress");
    let item = events[2]["item"]["id"].as_str().unwrap();
    assert!(events[3..events.len() - 2]
        .iter()
        .all(|e| e["item_id"] == item));

    // Message items, with an assistant turn in between.
    let items = json!([
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "again"}]},
    ]);
    let (status, r) = s
        .post(
            "/v1/responses",
            json!({"model": "ensemble", "input": items, "max_output_tokens": 3}),
        )
        .await;
    assert_eq!(status, 200, "{r}");

    for (field, value, needle) in [
        ("store", json!(true), "'store'"),
        (
            "previous_response_id",
            json!("resp_1"),
            "'previous_response_id'",
        ),
        (
            "tools",
            json!([{"type": "function", "name": "f"}]),
            "'tools'",
        ),
        (
            "reasoning",
            json!({"effort": "low"}),
            "unknown field `reasoning`",
        ),
        (
            "text",
            json!({"format": {"type": "json_object"}}),
            "'text.format'",
        ),
        ("max_output_tokens", json!(0), "'max_output_tokens'"),
        ("temperature", json!("hot"), "'temperature'"),
    ] {
        let mut b = json!({"model": "ensemble", "input": "x"});
        b[field] = value;
        refused(&s, "/v1/responses", b, needle).await;
    }
    let image = json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]);
    refused(
        &s,
        "/v1/responses",
        json!({"model": "ensemble", "input": image}),
        "input_image",
    )
    .await;
    let call = json!([{"type": "function_call_output", "call_id": "c", "output": "x"}]);
    refused(
        &s,
        "/v1/responses",
        json!({"model": "ensemble", "input": call}),
        "'input[0].type'",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_fails_mid_stream_ends_with_response_failed() {
    let s = start_tiny("ep-resp-fault", |_| {}).await;
    let body =
        json!({"model": "ensemble", "input": "x", "max_output_tokens": 1500, "stream": true});
    let (first, rest) = s.fault_mid_stream("/v1/responses", body).await;
    assert!(first.starts_with(b"event: response.created"));
    let last: Value = serde_json::from_str(
        rest.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .next_back()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["type"], "response.failed", "{last}");
    assert_eq!(last["response"]["status"], "failed");
    assert!(last["response"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("engine failed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_served() {
    let s = start_tiny("ep-openapi", |_| {}).await;
    let doc: Value = reqwest::get(s.url("/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 25, "{}", paths.len());
    let client = reqwest::Client::new();
    // The fault injection route is served only with `fault_injection` (tests/device_recovery.rs).
    for (path, item) in paths.iter().filter(|(p, _)| !p.starts_with("/v2/debug/")) {
        let url = s.url(
            &path
                .replace("{model}", "ensemble")
                .replace("{version}", "1"),
        );
        for method in item.as_object().unwrap().keys() {
            let request = match method.as_str() {
                "get" => client.get(&url),
                "post" => client.post(&url).json(&json!({})),
                other => panic!("{other} {path}"),
            };
            let r = request.send().await.unwrap();
            let status = r.status().as_u16();
            let body = r.text().await.unwrap_or_default();
            assert!(
                !(status == 404 && body.contains("no route")) && status != 405,
                "{method} {path}: {status} {body}"
            );
        }
    }
}
