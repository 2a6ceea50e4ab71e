//! The OpenAI API over real HTTP against the tiny model: models, completions and chat,
//! whole and streamed, batches, usage equal to token counts, stop strings trimmed, seeded
//! sampling, log-probabilities, echo, `chat_template_kwargs` reaching the template, a
//! failure in mid-stream, and malformed requests (each a 4xx naming the field; the server
//! healthy after them).

mod common;

use std::time::Duration;

use common::server::{start_tiny, TestServer};
use inflight::tokenizer::chat::{ChatMessage, ChatTemplate, CHATML_TEMPLATE};
use serde_json::{json, Value};

async fn post_raw(s: &TestServer, path: &str, body: String) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(s.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn text_of(events: &[Value], index: u64) -> String {
    events
        .iter()
        .flat_map(|e| e["choices"].as_array().unwrap().iter())
        .filter(|c| c["index"] == index)
        .map(|c| c["text"].as_str().unwrap_or(""))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_listed_and_looked_up() {
    let s = start_tiny("oai-models", |_| {}).await;
    let list: Value = reqwest::get(s.url("/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, s.state.served_names());
    assert!(list["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["object"] == "model" && m["owned_by"] == "inflight"));
    let one: Value = reqwest::get(s.url("/v1/models/ensemble"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one["id"], "ensemble");
    let r = reqwest::get(s.url("/v1/models/gpt-4")).await.unwrap();
    assert_eq!(r.status(), 404);
    let e = r.json::<Value>().await.unwrap();
    assert_eq!(e["error"]["message"], "The model `gpt-4` does not exist.");
    assert_eq!(e["error"]["code"], "model_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_counts_tokens_and_streams_the_same_text() {
    let s = start_tiny("oai-cmpl", |_| {}).await;
    let prompt = "The quick brown fox";
    let body = json!({"model": "ensemble", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true, "logprobs": 0});
    let (status, r) = s.post("/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    assert!(r["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(r["model"], "ensemble");
    assert!(r["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &r["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "length");
    let lp = &choice["logprobs"];
    let lps: Vec<f64> = lp["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(lps.len(), 8);
    assert!(
        lps.iter().all(|&l| l <= 0.0) && lps.iter().any(|&l| l < 0.0),
        "{lps:?}"
    );
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 8);
    assert!(lp["top_logprobs"].is_null());
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(r["usage"]["prompt_tokens"], s.prompt_tokens(prompt));
    assert_eq!(r["usage"]["completion_tokens"], 8);
    assert_eq!(r["usage"]["total_tokens"], s.prompt_tokens(prompt) + 8);
    let text = choice["text"].as_str().unwrap();

    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = s.sse("/v1/completions", streamed).await;
    let (usage, chunks) = events.split_last().unwrap();
    assert!(usage["choices"].as_array().unwrap().is_empty());
    assert_eq!(usage["usage"]["completion_tokens"], 8);
    assert_eq!(usage["usage"]["prompt_tokens"], s.prompt_tokens(prompt));
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"
        && c["usage"].is_null()
        && c["id"] == chunks[0]["id"]));
    let reasons: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .collect();
    assert!(reasons[..reasons.len() - 1].iter().all(|r| r.is_null()));
    assert_eq!(reasons.last().unwrap().as_str(), Some("length"));
    assert_eq!(text_of(chunks, 0), text);
    let n: usize = chunks
        .iter()
        .map(|c| {
            c["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .map_or(0, |a| a.len())
        })
        .sum();
    assert_eq!(n, 8);

    // echo puts the prompt first, whole and streamed.
    let echo = json!({"model": "ensemble", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true, "echo": true});
    let (_, r) = s.post("/v1/completions", echo.clone()).await;
    assert_eq!(r["choices"][0]["text"], format!("{prompt}{text}"));
    let mut echo_stream = echo;
    echo_stream["stream"] = json!(true);
    assert_eq!(
        text_of(&s.sse("/v1/completions", echo_stream).await, 0),
        format!("{prompt}{text}")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_prompts_give_one_choice_each() {
    let s = start_tiny("oai-batch", |_| {}).await;
    let prompts = ["one", "two three", "four five six"];
    let body = json!({"model": "tensorrt_llm_bls", "prompt": prompts, "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    let (status, r) = s.post("/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let mut prompt_total = 0;
    for (i, (c, p)) in choices.iter().zip(prompts).enumerate() {
        assert_eq!(c["index"], i);
        // Each choice is what its prompt alone gives.
        let (_, alone) = s.post("/v1/completions", json!({"model": "ensemble", "prompt": p, "max_tokens": 5, "temperature": 0, "ignore_eos": true})).await;
        assert_eq!(c["text"], alone["choices"][0]["text"]);
        prompt_total += s.prompt_tokens(p);
    }
    assert_eq!(r["usage"]["prompt_tokens"], prompt_total);
    assert_eq!(r["usage"]["completion_tokens"], 15);

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let events = s.sse("/v1/completions", streamed).await;
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(text_of(&events, i as u64), c["text"].as_str().unwrap());
        let finals = events
            .iter()
            .filter(|e| {
                e["choices"][0]["index"] == i && !e["choices"][0]["finish_reason"].is_null()
            })
            .count();
        assert_eq!(finals, 1);
    }

    // Token-id prompts, one and several.
    let (status, r) = s.post("/v1/completions", json!({"model": "tensorrt_llm", "prompt": [[5, 6, 7], [8, 9]], "max_tokens": 3, "ignore_eos": true})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"].as_array().unwrap().len(), 2);
    assert_eq!(r["usage"]["prompt_tokens"], 5);
    let (status, r) = s.post("/v1/completions",
        json!({"model": "tensorrt_llm", "prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_are_trimmed_and_seeds_repeat() {
    let s = start_tiny("oai-stop", |_| {}).await;
    let base = json!({"model": "ensemble", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let (_, r) = s.post("/v1/completions", base.clone()).await;
    let full = r["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "{full:?}");
    let stop: String = chars[4..6].iter().collect();
    let expected = &full[..full.find(&stop).unwrap()];
    let mut with_stop = base.clone();
    with_stop["stop"] = json!([stop, "never appears \u{1F600}"]);
    let (_, r) = s.post("/v1/completions", with_stop.clone()).await;
    assert_eq!(
        r["choices"][0]["text"], expected,
        "stop {stop:?} in {full:?}"
    );
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    with_stop["stream"] = json!(true);
    assert_eq!(
        text_of(&s.sse("/v1/completions", with_stop).await, 0),
        expected
    );

    // Same seed, same text, with temperature > 0.
    let mut sampled = base;
    sampled["temperature"] = json!(1.0);
    sampled["seed"] = json!(1234);
    let (_, a) = s.post("/v1/completions", sampled.clone()).await;
    let (_, b) = s.post("/v1/completions", sampled.clone()).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    let chat = json!({"model": "ensemble", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "temperature": 0.9, "seed": 7, "ignore_eos": true});
    let (_, a) = s.post("/v1/chat/completions", chat.clone()).await;
    let (_, b) = s.post("/v1/chat/completions", chat).await;
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_uses_the_template_and_streams_deltas() {
    let s = start_tiny("oai-chat", |_| {}).await;
    let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]);
    let body = json!({"model": "ensemble", "messages": messages, "max_completion_tokens": 10, "temperature": 0, "ignore_eos": true, "logprobs": true});
    let (status, r) = s.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &r["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "length");
    let content = choice["message"]["content"].as_str().unwrap();
    let lps = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(lps.len(), 10);
    assert!(lps.iter().all(|t| t["logprob"].as_f64().unwrap() <= 0.0
        && t["top_logprobs"] == json!([])
        && t["token"].is_string()));
    // The prompt is the ChatML rendering of the messages (text parts joined by newlines).
    let template = ChatTemplate::new(
        s.state
            .models()
            .only()
            .unwrap()
            .tokenizer()
            .chat_template()
            .unwrap_or(CHATML_TEMPLATE),
        "",
        "",
    )
    .unwrap();
    let rendered = template
        .apply(
            &[
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hello\nthere"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(r["usage"]["prompt_tokens"], s.prompt_tokens(&rendered));
    assert_eq!(r["usage"]["completion_tokens"], 10);
    assert_eq!(r["usage"]["total_tokens"], s.prompt_tokens(&rendered) + 10);

    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = s.sse("/v1/chat/completions", streamed).await;
    assert!(events
        .iter()
        .all(|e| e["object"] == "chat.completion.chunk"));
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let (usage, chunks) = events.split_last().unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 10);
    assert!(usage["choices"].as_array().unwrap().is_empty());
    let (last, deltas) = chunks.split_last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert!(deltas
        .iter()
        .all(|d| d["choices"][0]["finish_reason"].is_null()));
    let joined: String = deltas
        .iter()
        .map(|d| d["choices"][0]["delta"]["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(joined, content);
    let streamed_lps: usize = deltas
        .iter()
        .map(|d| {
            d["choices"][0]["logprobs"]["content"]
                .as_array()
                .map_or(0, |a| a.len())
        })
        .sum();
    assert_eq!(streamed_lps, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_kwargs_reach_the_template() {
    // The tiny model with Qwen3's template, which reads `enable_thinking`.
    let dir = common::server::tiny_model_dir("oai-chat-kwargs");
    let qwen3 = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates/Qwen-Qwen3-0.6B.jinja"
    ))
    .unwrap();
    let config = dir.join("tokenizer_config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    cfg["chat_template"] = json!(qwen3);
    std::fs::write(&config, cfg.to_string()).unwrap();
    let s = common::server::start(&dir, |_| {}).await;
    let template = ChatTemplate::new(&qwen3, "", "").unwrap();
    let chat = [ChatMessage::new("user", "Hello")];
    let body = |kwargs: Value| json!({"model": "ensemble", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1, "chat_template_kwargs": kwargs});
    for kwargs in [
        json!(null),
        json!({"enable_thinking": false}),
        json!({"enable_thinking": true}),
    ] {
        let (status, r) = s.post("/v1/chat/completions", body(kwargs.clone())).await;
        assert_eq!(status, 200, "{r}");
        let vars = kwargs.as_object().cloned().unwrap_or_default();
        let rendered = template.apply_with(&chat, true, &vars).unwrap();
        assert_eq!(
            r["usage"]["prompt_tokens"],
            s.prompt_tokens(&rendered),
            "{kwargs}"
        );
    }
    // Thinking off adds the empty think block to the prompt.
    let tokens = |kwargs: Value| {
        let vars = kwargs.as_object().cloned().unwrap_or_default();
        s.prompt_tokens(&template.apply_with(&chat, true, &vars).unwrap())
    };
    assert!(tokens(json!({"enable_thinking": false})) > tokens(json!({})));
    let (status, r) = s.post("/v1/chat/completions", body(json!([1]))).await;
    assert_eq!(status, 400, "{r}");
    assert!(r.to_string().contains("chat_template_kwargs"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_mid_stream_is_an_error_event() {
    let s = start_tiny("oai-fault", |_| {}).await;
    let body = json!({"model": "ensemble", "prompt": "x", "max_tokens": 1500, "ignore_eos": true, "stream": true});
    let (first, rest) = s.fault_mid_stream("/v1/completions", body).await;
    assert!(first.starts_with(b"data: "));
    let last = rest
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .next_back()
        .unwrap();
    let event: Value = serde_json::from_str(last).unwrap();
    assert!(
        event["error"]["message"]
            .as_str()
            .unwrap()
            .contains("engine failed"),
        "{event}"
    );
    assert!(!rest.contains("[DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_4xx_naming_the_field() {
    let s = start_tiny("oai-bad", |_| {}).await;
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v1/completions", "{not json".into(), 400, "malformed JSON"),
        ("/v1/completions", String::new(), 400, "empty"),
        ("/v1/completions", json!([1, 2]).to_string(), 400, "JSON object"),
        ("/v1/completions", json!({"prompt": "x"}).to_string(), 400, "'model'"),
        ("/v1/completions", json!({"model": "ensemble"}).to_string(), 400, "'prompt'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": 5}).to_string(), 400, "'prompt'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": ["a", [1]]}).to_string(), 400, "prompt[1]"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "max_tokens": -1}).to_string(), 400, "'max_tokens'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "max_tokens": 1_000_000}).to_string(), 400, "context length"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "max_tokens": "ten"}).to_string(), 400, "'max_tokens'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "n": 17}).to_string(), 400, "'n'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "n": 3, "best_of": 2}).to_string(), 400, "'best_of'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "best_of": 2, "stream": true}).to_string(), 400, "'best_of'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "logit_bias": {"x": 1}}).to_string(), 400, "'logit_bias'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "logit_bias": {"5": -101}}).to_string(), 400, "'logit_bias.5'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "logit_bias": {"99999": 1}}).to_string(), 400, "logit_bias"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "min_p": -0.5}).to_string(), 400, "'min_p'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "temperature": -1}).to_string(), 400, "temperature"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "top_p": 0}).to_string(), 400, "top_p"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "logprobs": 9}).to_string(), 400, "'logprobs'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "stop": 3}).to_string(), 400, "'stop'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": "x", "stream": "yes"}).to_string(), 400, "'stream'"),
        ("/v1/completions", json!({"model": "ensemble", "prompt": [99999]}).to_string(), 400, "vocabulary"),
        ("/v1/completions", json!({"model": "gpt-4", "prompt": "x"}).to_string(), 404, "The model `gpt-4` does not exist."),
        ("/v1/chat/completions", json!({"model": "ensemble"}).to_string(), 400, "'messages'"),
        ("/v1/chat/completions", json!({"model": "ensemble", "messages": []}).to_string(), 400, "'messages'"),
        ("/v1/chat/completions", json!({"model": "ensemble", "messages": "hi"}).to_string(), 400, "'messages'"),
        ("/v1/chat/completions", json!({"model": "ensemble", "messages": [{"role": "wizard", "content": "hi"}]}).to_string(), 400, "messages[0].role"),
        ("/v1/chat/completions", json!({"model": "ensemble", "messages": [{"role": "user", "content": 7}]}).to_string(), 400, "messages[0].content"),
        ("/v1/chat/completions", json!({"model": "ensemble", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}).to_string(), 400, "image_url"),
        ("/v1/chat/completions", json!({"model": "ensemble", "messages": user, "n": 0}).to_string(), 400, "'n'"),
        ("/v1/chat/completions", json!({"model": "ensemble", "messages": user, "logprobs": true, "top_logprobs": 21}).to_string(), 400, "'top_logprobs'"),
        ("/v1/chat/completions", json!({"model": "ensemble", "messages": user, "max_tokens": 0}).to_string(), 400, "'max_tokens'"),
        ("/v1/chat/completions", json!({"model": "ensemble", "messages": user, "top_logprobs": 3}).to_string(), 400, "'top_logprobs'"),
        ("/v1/chat/completions", json!({"model": "nope", "messages": user}).to_string(), 404, "The model `nope` does not exist."),
    ];
    for (path, body, status, needle) in cases {
        let (got, answer) = post_raw(&s, path, body.clone()).await;
        assert_eq!(got, status, "{path} {body}: {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");
        let message = answer["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{path} {body}: {answer}"));
        assert!(
            message.contains(needle),
            "{path} {body}: {message:?} lacks {needle:?}"
        );
    }
    let ready = reqwest::get(s.url("/v2/health/ready")).await.unwrap();
    assert_eq!(ready.status(), 200);
    let (status, _) = s.post("/v1/chat/completions", json!({"model": "ensemble", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_requests_carry_an_id_that_a_stop_request_can_name() {
    let s = start_tiny("oai-id", |_| {}).await;
    let c = reqwest::Client::new();
    // The client's X-Request-Id names the request: echoed, and the body's id built on it.
    let r = c
        .post(s.url("/v1/completions"))
        .header("x-request-id", "mine-1")
        .body(json!({"model": "ensemble", "prompt": "hi", "max_tokens": 2}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "mine-1");
    assert_eq!(r.json::<Value>().await.unwrap()["id"], "cmpl-mine-1");
    // Without one, the server's id comes back the same way.
    let chat = json!({"model": "ensemble", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let r = c
        .post(s.url("/v1/chat/completions"))
        .body(chat.to_string())
        .send()
        .await
        .unwrap();
    let id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(
        r.json::<Value>().await.unwrap()["id"],
        format!("chatcmpl-{id}")
    );
    // A long streamed completion, stopped by that id with Triton's stop request.
    let long = json!({"model": "ensemble", "prompt": "a long one", "max_tokens": 1500, "ignore_eos": true, "stream": true});
    let stream = c
        .post(s.url("/v1/completions"))
        .header("x-request-id", "long-1")
        .body(long.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(stream.headers()["x-request-id"], "long-1");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, _) = s
        .post(
            "/v2/models/ensemble/generate",
            json!({"id": "long-1", "stop": true}),
        )
        .await;
    assert_eq!(status, 200);
    let text = tokio::time::timeout(Duration::from_secs(30), stream.text())
        .await
        .expect("the stopped stream ends")
        .unwrap();
    let events = text.lines().filter(|l| l.starts_with("data: {")).count();
    assert!(events < 1500, "{events} events: the stop did not act");
}
