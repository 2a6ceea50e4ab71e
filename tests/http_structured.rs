//! Structured output and tool calls over real HTTP against the tiny random model, whose
//! own choices are noise: whatever it says comes from the grammar. JSON schemas, regexes,
//! choices and grammars on OpenAI's chat and completions routes (whole and streamed) and
//! on Triton's generate route; tool calls parsed whole and streamed; broken constraints
//! refused with a 400 naming the problem, the server healthy after them.

mod common;

use common::server::start_tiny;
use serde_json::{json, Value};

fn chat(body: Value) -> Value {
    let mut b = json!({"model": "ensemble", "messages": [{"role": "user", "content": "Answer."}],
        "max_tokens": 120, "temperature": 1.0});
    for (k, v) in body.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// A person: bounded strings, an integer range, an enum, a bounded list of enums.
fn person_schema() -> Value {
    json!({"type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,7}$"},
            "age": {"type": "integer", "minimum": 1, "maximum": 99},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}
        },
        "required": ["name", "age", "role", "tags"], "additionalProperties": false})
}

fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let name = v["name"].as_str().unwrap();
    assert!(
        name.len() >= 2 && name.len() <= 8 && name.chars().next().unwrap().is_ascii_uppercase(),
        "{text}"
    );
    assert!((1..=99).contains(&v["age"].as_i64().unwrap()), "{text}");
    assert!(
        ["admin", "user", "guest"].contains(&v["role"].as_str().unwrap()),
        "{text}"
    );
    let tags = v["tags"].as_array().unwrap();
    assert!((1..=3).contains(&tags.len()), "{text}");
    assert_eq!(v.as_object().unwrap().len(), 4, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_answers_validate_whole_and_streamed() {
    let s = start_tiny("structured-json", |_| {}).await;
    let rf = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema(), "strict": true}});
    for seed in 0..4 {
        let (status, r) = s
            .post(
                "/v1/chat/completions",
                chat(json!({"response_format": rf, "seed": seed})),
            )
            .await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        check_person(r["choices"][0]["message"]["content"].as_str().unwrap());
    }
    let events = s
        .sse(
            "/v1/chat/completions",
            chat(json!({"response_format": rf, "seed": 9, "stream": true})),
        )
        .await;
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    check_person(&text);
    // vLLM's extra field, on completions.
    let (status, r) = s
        .post(
            "/v1/completions",
            json!({"model": "ensemble", "prompt": "A person:",
        "max_tokens": 120, "guided_json": person_schema(), "seed": 3}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    check_person(r["choices"][0]["text"].as_str().unwrap());
    // json_object: any object.
    let (_, r) = s
        .post(
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_object"},
        "max_tokens": 400, "temperature": 0})),
        )
        .await;
    if r["choices"][0]["finish_reason"] == "stop" {
        let text = r["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(
            serde_json::from_str::<serde_json::Map<String, Value>>(text).is_ok(),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_choice_and_grammar_are_always_satisfied() {
    let s = start_tiny("structured-rx", |_| {}).await;
    for seed in 0..6 {
        let (_, r) = s
            .post(
                "/v1/chat/completions",
                chat(json!({"guided_regex": "[0-9]{3}-[a-z]{2,4}", "seed": seed})),
            )
            .await;
        let t = r["choices"][0]["message"]["content"].as_str().unwrap();
        let b = t.as_bytes();
        assert!(
            b.len() >= 6
                && b.len() <= 8
                && b[..3].iter().all(u8::is_ascii_digit)
                && b[3] == b'-'
                && b[4..].iter().all(u8::is_ascii_lowercase),
            "{t:?}"
        );
        let (_, r) = s.post("/v1/chat/completions",
            chat(json!({"guided_choice": ["red", "green", "blue"], "seed": seed, "stream": false})),
        )
        .await;
        let t = r["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(["red", "green", "blue"].contains(&t), "{t:?}");
        let events = s.sse("/v1/chat/completions", chat(json!({"structured_outputs": {"grammar": "root ::= (\"yes\" | \"no\") \"!\"{1,3}"}, "seed": seed, "stream": true}))).await;
        let t: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert!(
            (t.starts_with("yes") || t.starts_with("no")) && t.ends_with('!') && t.len() <= 6,
            "{t:?}"
        );
    }
    // TensorRT-LLM's fields on the Triton route.
    let (status, r) = s
        .post(
            "/v2/models/ensemble/generate",
            json!({"text_input": "Q", "max_tokens": 20,
        "guided_decoding_guide_type": "regex", "guided_decoding_guide": "(ab){1,3}c"}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let out = r["text_output"].as_str().unwrap();
    let answer = out.strip_prefix("Q").unwrap_or(out);
    let pairs = answer
        .strip_suffix('c')
        .unwrap_or_else(|| panic!("{out:?}"));
    assert!(
        (1..=3).contains(&(pairs.len() / 2))
            && pairs.len() % 2 == 0
            && pairs.as_bytes().chunks(2).all(|p| p == b"ab"),
        "{out:?}"
    );
    let (status, r) = s.post("/v2/models/ensemble/generate", json!({"text_input": "Q", "max_tokens": 60,
        "exclude_input_in_output": true, "temperature": 0,
        "guided_decoding_guide_type": "json_schema",
        "guided_decoding_guide": "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"}},\"required\":[\"ok\"],\"additionalProperties\":false}"})).await;
    assert_eq!(status, 200, "{r}");
    let v: Value = serde_json::from_str(r["text_output"].as_str().unwrap()).unwrap();
    assert!(v["ok"].is_boolean(), "{v}");
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "pattern": "^[A-Z][a-z]{2,9}$"},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_are_parsed_whole_and_streamed() {
    let s = start_tiny("structured-tools", |_| {}).await;
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for choice in [json!("required"), named] {
        let body = chat(
            json!({"tools": [weather_tool()], "tool_choice": choice, "parallel_tool_calls": false, "seed": 1}),
        );
        let (status, r) = s.post("/v1/chat/completions", body.clone()).await;
        assert_eq!(status, 200, "{r}");
        let c = &r["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{r}");
        assert!(c["message"]["content"].is_null(), "{r}");
        let call = &c["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(
            ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()),
            "{args}"
        );
        let mut streamed = body;
        streamed["stream"] = json!(true);
        let events = s.sse("/v1/chat/completions", streamed).await;
        let deltas: Vec<&Value> = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
            .collect();
        assert_eq!(deltas.len(), 1, "{events:?}");
        assert_eq!(deltas[0]["index"], 0);
        assert_eq!(deltas[0]["function"]["name"], "get_weather");
        assert_eq!(
            deltas[0]["function"]["arguments"],
            call["function"]["arguments"]
        );
        assert_eq!(
            events
                .iter()
                .rev()
                .find_map(|e| e["choices"][0]["finish_reason"].as_str()),
            Some("tool_calls")
        );
    }
    // The call and the tool's answer go back into the conversation.
    let (status, r) = s.post("/v1/chat/completions", chat(json!({"tools": [weather_tool()], "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call-1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call-1", "content": "21 C, sunny"}]}))).await;
    assert_eq!(status, 200, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_constraints_are_400s_and_the_server_stays_healthy() {
    let s = start_tiny("structured-bad", |_| {}).await;
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}}),
            "json_schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}}),
            "json_schema",
        ),
        (json!({"guided_regex": "[a-"}), "regex"),
        (json!({"guided_grammar": "root ::= \"x"}), "not closed"),
        (json!({"guided_grammar": "start: missing_rule"}), "lark"),
        (json!({"guided_choice": []}), "guided_choice"),
        (json!({"guided_json": "{oops"}), "guided_json"),
        (
            json!({"guided_regex": "a", "guided_choice": ["b"]}),
            "only one",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{bad"}}]}),
            "parameters",
        ),
        (
            json!({"tools": [weather_tool()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "nope",
        ),
        (
            json!({"tools": [weather_tool()], "tool_choice": "required", "guided_regex": "a"}),
            "cannot be combined",
        ),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]}),
            "arguments",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "tool_call_id",
        ),
        // A field the server does not read is named, never dropped.
        (
            json!({"prediction": {}, "reasoning_effort": "low"}),
            "'prediction', 'reasoning_effort'",
        ),
    ];
    for (body, want) in cases {
        let (status, r) = s.post("/v1/chat/completions", chat(body.clone())).await;
        assert_eq!(status, 400, "{body}: {r}");
        let msg = r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(msg.contains(want), "{body}: {msg}");
    }
    let (status, _) = s
        .post(
            "/v2/models/ensemble/generate",
            json!({"text_input": "Q", "max_tokens": 5,
        "guided_decoding_guide_type": "json_schema", "guided_decoding_guide": "{\"type\": 3}"}),
        )
        .await;
    assert_eq!(status, 400);
    let ready = reqwest::get(s.url("/v2/health/ready")).await.unwrap();
    assert_eq!(ready.status(), 200);
    let (status, r) = s
        .post(
            "/v1/chat/completions",
            chat(json!({"guided_choice": ["fine"]})),
        )
        .await;
    assert_eq!(
        (status, r["choices"][0]["message"]["content"].as_str()),
        (200, Some("fine"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_are_checked_against_the_grammar() {
    use inflight::speculative::{DraftSource, SpeculativeOptions};
    let s = start_tiny("structured-spec", |o| {
        o.speculative = Some(SpeculativeOptions {
            draft: DraftSource::PromptLookup {
                min_ngram: 1,
                max_ngram: 3,
            },
            num_draft_tokens: 0,
        })
    })
    .await;
    let prompt = "the cat and the dog and the cat and the dog and the cat and the";
    let body = |drafts: u64| {
        json!({"model": "ensemble", "prompt": prompt, "max_tokens": 40, "temperature": 0,
               "num_draft_tokens": drafts, "guided_regex": "( (the|cat|dog|and)){4,12}\\."})
    };
    let (status, plain) = s.post("/v1/completions", body(0)).await;
    assert_eq!(status, 200, "{plain}");
    let (status, spec) = s.post("/v1/completions", body(4)).await;
    assert_eq!(status, 200, "{spec}");
    let text = spec["choices"][0]["text"].as_str().unwrap();
    assert_eq!(
        text,
        plain["choices"][0]["text"].as_str().unwrap(),
        "greedy text unchanged"
    );
    let words: Vec<&str> = text.trim_end_matches('.').split_whitespace().collect();
    assert!(
        text.ends_with('.') && (4..=12).contains(&words.len()),
        "{text:?}"
    );
    assert!(
        words
            .iter()
            .all(|w| ["the", "cat", "dog", "and"].contains(w)),
        "{text:?}"
    );
    let drafted = s
        .metric("inflight_spec_decode_draft_tokens_total")
        .await
        .unwrap_or(0.0);
    assert!(drafted > 0.0, "no draft was proposed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guided_sequences_survive_preemption() {
    use inflight::scheduler::SchedulerPolicy;
    // Eight blocks of 16 tokens for eight sequences growing to ~90 tokens: they preempt
    // each other, and each one's grammar state must follow its own tokens throughout.
    let s = start_tiny("structured-preempt", |o| {
        o.scheduler.num_blocks = 8;
        o.scheduler.max_batch_size = 8;
        o.scheduler.policy = SchedulerPolicy::MaxUtilization;
    })
    .await;
    let list = json!({"type": "array", "minItems": 20, "maxItems": 20,
        "items": {"type": "integer", "minimum": 10, "maximum": 99}});
    let asks = (0..8).map(|seed| {
        let s = &s;
        let list = list.clone();
        async move {
            s.post(
                "/v1/completions",
                json!({"model": "ensemble", "prompt": "Numbers:",
                "max_tokens": 90, "seed": seed, "temperature": 1.0, "guided_json": list}),
            )
            .await
        }
    });
    for (status, r) in futures::future::join_all(asks).await {
        assert_eq!(status, 200, "{r}");
        let text = r["choices"][0]["text"].as_str().unwrap();
        let v: Vec<i64> = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(
            v.len() == 20 && v.iter().all(|n| (10..=99).contains(n)),
            "{text}"
        );
    }
    let preempted = s.metric("inflight_preemptions_total").await.unwrap_or(0.0);
    assert!(preempted > 0.0, "no preemption happened");
}
