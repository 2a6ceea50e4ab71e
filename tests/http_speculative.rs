//! Speculative decoding over real HTTP against the tiny model with prompt lookup: the
//! `tensorrt_llm_bls` model takes `num_draft_tokens` on generate and generate_stream,
//! OpenAI endpoints take it per request, greedy answers do not change, the draft metrics
//! count, and a server without a draft source refuses the option with a 400.

mod common;

use common::server::{start_tiny, TestServer};
use inflight::speculative::{DraftSource, SpeculativeOptions};
use serde_json::{json, Value};

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value, String) {
    let r = reqwest::Client::new()
        .post(s.url(path))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    )
}

async fn metric(s: &TestServer, line_start: &str) -> f64 {
    s.metric(line_start)
        .await
        .unwrap_or_else(|| panic!("no metric {line_start}"))
}

const PROMPT: &str = "the cat and the dog and the cat and the dog and the cat and the";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bls_and_openai_speculate_per_request() {
    let s = start_tiny("spec-http", |o| {
        o.speculative = Some(SpeculativeOptions {
            draft: DraftSource::PromptLookup {
                min_ngram: 1,
                max_ngram: 3,
            },
            num_draft_tokens: 0,
        })
    })
    .await;
    let generate = |drafts: u64| {
        json!({"text_input": PROMPT, "max_tokens": 24, "ignore_eos": true,
               "exclude_input_in_output": true, "num_draft_tokens": drafts})
    };
    let (status, plain, _) = post(&s, "/v2/models/tensorrt_llm_bls/generate", generate(0)).await;
    assert_eq!(status, 200, "{plain}");
    let (status, spec, _) = post(&s, "/v2/models/tensorrt_llm_bls/generate", generate(4)).await;
    assert_eq!(status, 200, "{spec}");
    assert_eq!(
        spec["text_output"], plain["text_output"],
        "greedy text unchanged"
    );

    let mut body = generate(4);
    body["stream"] = json!(true);
    let (status, _, sse) = post(&s, "/v2/models/tensorrt_llm_bls/generate_stream", body).await;
    assert_eq!(status, 200, "{sse}");
    let streamed: String = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["text_output"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(streamed, plain["text_output"].as_str().unwrap());

    let completion = |drafts: u64| {
        json!({"model": "ensemble", "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
               "ignore_eos": true, "num_draft_tokens": drafts})
    };
    let (status, a, _) = post(&s, "/v1/completions", completion(0)).await;
    assert_eq!(status, 200, "{a}");
    let (status, b, _) = post(&s, "/v1/completions", completion(3)).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);

    let labels = "{model=\"tensorrt_llm_bls\",version=\"1\"}";
    let drafted = metric(
        &s,
        &format!("inflight_spec_decode_draft_tokens_total{labels}"),
    )
    .await;
    let accepted = metric(
        &s,
        &format!("inflight_spec_decode_accepted_tokens_total{labels}"),
    )
    .await;
    assert!(
        drafted > 0.0 && accepted > 0.0 && accepted <= drafted,
        "{accepted} of {drafted}"
    );
    let rates = metric(
        &s,
        "inflight_spec_decode_acceptance_rate_count{model=\"tensorrt_llm_bls\"}",
    )
    .await;
    assert_eq!(rates, 2.0, "one observation per speculative prompt");

    let (status, e, _) = post(&s, "/v1/completions", completion(1000)).await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"].to_string().contains("num_draft_tokens"), "{e}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_draft_source_num_draft_tokens_is_refused() {
    let s = start_tiny("spec-none", |_| {}).await;
    let body = json!({"text_input": "hello", "max_tokens": 4, "num_draft_tokens": 4});
    let (status, e, _) = post(&s, "/v2/models/tensorrt_llm_bls/generate", body).await;
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("no draft source"),
        "{e}"
    );
    let body = json!({"text_input": "hello", "max_tokens": 4, "num_draft_tokens": 0});
    let (status, ok, _) = post(&s, "/v2/models/tensorrt_llm_bls/generate", body).await;
    assert_eq!(status, 200, "{ok}");
    s.stop().await;
}
