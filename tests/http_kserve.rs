//! KServe v2 over real HTTP against the tiny model, with bodies built byte by byte as
//! tritonclient builds them: health, server and model metadata, model config for every
//! served name, infer in JSON and binary mode (responses parsed back), output selection,
//! batches, the core model's ids, a stop input, the statistics extension, and malformed
//! infer requests (a named 400 each, the server ready after all of them).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::server::{start_tiny, TestServer};
use serde_json::{json, Value};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn get(s: &TestServer, path: &str) -> (u16, Value) {
    let r = client().get(s.url(path)).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A binary body: the JSON header, then the blobs; returns it and the header's length.
fn binary_body(head: &Value, blobs: &[Vec<u8>]) -> (Vec<u8>, usize) {
    let mut body = head.to_string().into_bytes();
    let n = body.len();
    for b in blobs {
        body.extend_from_slice(b);
    }
    (body, n)
}

/// BYTES elements: each a u32 LE length and the bytes.
fn bytes_blob(items: &[&[u8]]) -> Vec<u8> {
    items
        .iter()
        .flat_map(|s| {
            (s.len() as u32)
                .to_le_bytes()
                .into_iter()
                .chain(s.iter().copied())
        })
        .collect()
}

fn i32_blob(items: &[i32]) -> Vec<u8> {
    items.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A tensor header entry with its blob size.
fn binary_input(name: &str, datatype: &str, shape: &[usize], blob: &[u8]) -> Value {
    json!({"name": name, "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": blob.len()}})
}

struct Reply {
    status: u16,
    content_type: String,
    head: Value,
    /// Binary outputs by name.
    blobs: HashMap<String, Vec<u8>>,
}

impl Reply {
    fn output(&self, name: &str) -> &Value {
        self.head["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["name"] == name)
            .unwrap_or_else(|| panic!("no output {name}: {}", self.head))
    }

    fn names(&self) -> Vec<String> {
        self.head["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap().to_string())
            .collect()
    }

    fn strings(&self, name: &str) -> Vec<String> {
        let mut b = &self.blobs[name][..];
        let mut out = Vec::new();
        while !b.is_empty() {
            let n = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
            out.push(String::from_utf8(b[4..4 + n].to_vec()).unwrap());
            b = &b[4 + n..];
        }
        out
    }

    fn i32s(&self, name: &str) -> Vec<i32> {
        self.blobs[name]
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        self.blobs[name]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

/// POSTs an infer body with no Content-Type (as tritonclient does) and splits the reply.
async fn infer_raw(s: &TestServer, model: &str, body: Vec<u8>, header_len: Option<usize>) -> Reply {
    let mut r = client()
        .post(s.url(&format!("/v2/models/{model}/infer")))
        .body(body);
    if let Some(n) = header_len {
        r = r.header("Inference-Header-Content-Length", n.to_string());
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let json_len = r
        .headers()
        .get("inference-header-content-length")
        .map(|v| v.to_str().unwrap().parse::<usize>().unwrap());
    let body = r.bytes().await.unwrap();
    let json_len = json_len.unwrap_or(body.len());
    let head: Value = serde_json::from_slice(&body[..json_len]).expect("reply header is JSON");
    let mut blobs = HashMap::new();
    let mut rest = &body[json_len..];
    for o in head["outputs"].as_array().into_iter().flatten() {
        if let Some(n) = o["parameters"]["binary_data_size"].as_u64() {
            assert!(o.get("data").is_none(), "binary output also has data: {o}");
            let (blob, tail) = rest.split_at(n as usize);
            blobs.insert(o["name"].as_str().unwrap().to_string(), blob.to_vec());
            rest = tail;
        }
    }
    assert!(
        rest.is_empty(),
        "{} bytes after the output blobs",
        rest.len()
    );
    Reply {
        status,
        content_type,
        head,
        blobs,
    }
}

async fn infer_json(s: &TestServer, model: &str, body: Value) -> Reply {
    infer_raw(s, model, body.to_string().into_bytes(), None).await
}

fn text_request(prompt: &str, max_tokens: i32) -> Value {
    json!({"inputs": [
        {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [prompt]},
        {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [max_tokens]},
        {"name": "ignore_eos", "shape": [1, 1], "datatype": "BOOL", "data": [true]},
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metadata_and_config_for_every_served_name() {
    let s = start_tiny("ks-meta", |_| {}).await;
    assert_eq!(
        client()
            .get(s.url("/v2/health/live"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client()
            .get(s.url("/v2/health/ready"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let (status, meta) = get(&s, "/v2").await;
    assert_eq!(status, 200);
    assert_eq!(meta["name"], "inflight");
    assert_eq!(meta["version"], env!("CARGO_PKG_VERSION"));
    let ext: Vec<&str> = meta["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for e in ["binary_tensor_data", "model_configuration", "statistics"] {
        assert!(ext.contains(&e), "{ext:?}");
    }
    for name in s.state.served_names() {
        for base in [
            format!("/v2/models/{name}"),
            format!("/v2/models/{name}/versions/1"),
        ] {
            let (status, meta) = get(&s, &base).await;
            assert_eq!(status, 200, "{base}: {meta}");
            assert_eq!(meta["name"], name.as_str());
            assert_eq!(meta["versions"], json!(["1"]));
            assert!(
                meta["inputs"].as_array().unwrap().len() >= 2
                    && !meta["outputs"].as_array().unwrap().is_empty()
            );
            let r = client()
                .get(s.url(&format!("{base}/ready")))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{base}/ready");
            let (status, config) = get(&s, &format!("{base}/config")).await;
            assert_eq!(status, 200, "{base}/config: {config}");
            assert_eq!(config["name"], name.as_str());
            assert!(config["max_batch_size"].as_u64().unwrap() > 0);
            assert_eq!(config["model_transaction_policy"]["decoupled"], true);
            for i in config["input"].as_array().unwrap() {
                assert!(i["data_type"].as_str().unwrap().starts_with("TYPE_"), "{i}");
                assert!(i["optional"].is_boolean() && i["dims"].is_array());
            }
        }
    }
    // The ensemble, as PROTOCOL.md §1 shows it.
    let (_, meta) = get(&s, "/v2/models/ensemble").await;
    assert_eq!(meta["platform"], "ensemble");
    let find = |list: &Value, n: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("no {n}"))
    };
    assert_eq!(
        find(&meta["inputs"], "text_input"),
        json!({"name": "text_input", "datatype": "BYTES", "shape": [-1, 1]})
    );
    assert_eq!(
        find(&meta["inputs"], "max_tokens"),
        json!({"name": "max_tokens", "datatype": "INT32", "shape": [-1, 1]})
    );
    assert_eq!(
        find(&meta["inputs"], "stop_words")["shape"],
        json!([-1, -1])
    );
    assert_eq!(find(&meta["inputs"], "seed")["datatype"], "UINT64");
    assert_eq!(
        find(&meta["outputs"], "text_output"),
        json!({"name": "text_output", "datatype": "BYTES", "shape": [-1, -1]})
    );
    let (_, config) = get(&s, "/v2/models/ensemble/config").await;
    assert_eq!(config["platform"], "ensemble");
    assert_eq!(
        find(&config["input"], "text_input")["data_type"],
        "TYPE_STRING"
    );
    assert_eq!(find(&config["input"], "top_k")["optional"], true);
    assert_eq!(find(&config["input"], "max_tokens")["optional"], false);
    // perf_analyzer dereferences the steps and fetches each composing model's config.
    let step = &config["ensemble_scheduling"]["step"][0];
    assert_eq!(step["model_name"], "tensorrt_llm");
    let (status, _) = get(&s, "/v2/models/tensorrt_llm/config").await;
    assert_eq!(status, 200);
    // The core model takes and returns ids.
    let (_, meta) = get(&s, "/v2/models/tensorrt_llm").await;
    assert_eq!(
        find(&meta["inputs"], "input_ids"),
        json!({"name": "input_ids", "datatype": "INT32", "shape": [-1, -1]})
    );
    assert_eq!(
        find(&meta["inputs"], "request_output_len")["datatype"],
        "INT32"
    );
    assert_eq!(find(&meta["inputs"], "stop")["datatype"], "BOOL");
    assert_eq!(
        find(&meta["outputs"], "output_ids")["shape"],
        json!([-1, -1, -1])
    );
    // Unknown models and versions are Triton's 400s.
    for path in [
        "/v2/models/nope",
        "/v2/models/nope/ready",
        "/v2/models/nope/config",
        "/v2/models/nope/stats",
    ] {
        let (status, body) = get(&s, path).await;
        assert_eq!(status, 400, "{path}");
        assert_eq!(
            body["error"],
            "Request for unknown model: 'nope' is not found"
        );
    }
    let (status, body) = get(&s, "/v2/models/ensemble/versions/2").await;
    assert_eq!(status, 400);
    assert!(
        body["error"].as_str().unwrap().contains("version 2"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infer_in_json_mode_with_output_selection() {
    let s = start_tiny("ks-json", |_| {}).await;
    let mut body = text_request("hello there", 5);
    body["id"] = json!("j1");
    body["inputs"].as_array_mut().unwrap().push(
        json!({"name": "return_log_probs", "shape": [1, 1], "datatype": "BOOL", "data": [[true]]}),
    );
    let r = infer_json(&s, "ensemble", body).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.content_type, "application/json");
    assert_eq!(
        (
            &r.head["model_name"],
            &r.head["model_version"],
            &r.head["id"]
        ),
        (&json!("ensemble"), &json!("1"), &json!("j1"))
    );
    // No outputs named: all of them, in JSON.
    let names = r.names();
    for n in [
        "text_output",
        "cum_log_probs",
        "output_log_probs",
        "batch_index",
        "sequence_index",
        "num_input_tokens",
        "num_output_tokens",
    ] {
        assert!(names.contains(&n.to_string()), "{names:?}");
    }
    let text = r.output("text_output");
    assert_eq!(
        (&text["datatype"], &text["shape"]),
        (&json!("BYTES"), &json!([1, 1]))
    );
    assert!(
        text["data"][0].as_str().unwrap().starts_with("hello there"),
        "{text}"
    );
    let lps = r.output("output_log_probs");
    assert_eq!(
        (&lps["datatype"], &lps["shape"]),
        (&json!("FP32"), &json!([1, 1, 5]))
    );
    let lps: Vec<f64> = lps["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(
        lps.iter().all(|&l| l <= 0.0) && lps.iter().any(|&l| l < 0.0),
        "{lps:?}"
    );
    let cum = r.output("cum_log_probs")["data"][0].as_f64().unwrap();
    assert!((cum - lps.iter().sum::<f64>()).abs() < 1e-3);
    assert_eq!(r.output("num_output_tokens")["data"], json!([5]));
    assert_eq!(r.output("batch_index")["data"], json!([0]));
    // Outputs named: exactly those, in that order; nested data lists are accepted.
    let mut body = json!({"inputs": [
        {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [["hi"]]},
        {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [[3]]},
        {"name": "ignore_eos", "shape": [1, 1], "datatype": "BOOL", "data": [[true]]},
    ]});
    body["outputs"] = json!([{"name": "num_output_tokens"}, {"name": "text_output"}]);
    let r = infer_json(&s, "tensorrt_llm_bls", body).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.names(), ["num_output_tokens", "text_output"]);
    assert_eq!(r.output("num_output_tokens")["data"], json!([3]));
    assert!(r.head.get("id").is_none());
    // The core model: ids in, ids out, on the versioned path.
    let body = json!({"inputs": [
        {"name": "input_ids", "shape": [1, 3], "datatype": "INT32", "data": [5, 6, 7]},
        {"name": "input_lengths", "shape": [1, 1], "datatype": "INT32", "data": [3]},
        {"name": "request_output_len", "shape": [1, 1], "datatype": "INT32", "data": [4]},
        {"name": "ignore_eos", "shape": [1, 1], "datatype": "BOOL", "data": [true]},
    ]});
    let r = infer_raw(
        &s,
        "tensorrt_llm/versions/1",
        body.to_string().into_bytes(),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    let ids = r.output("output_ids");
    let n = ids["data"].as_array().unwrap().len();
    assert_eq!(ids["shape"], json!([1, 1, n]));
    assert_eq!(r.output("sequence_length")["data"], json!([n]));
    assert!(n >= 4, "{ids}");
    assert_eq!(r.output("num_input_tokens")["data"], json!([3]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infer_in_binary_mode_as_tritonclient_sends_it() {
    let s = start_tiny("ks-bin", |_| {}).await;
    let prompt = b"the binary way";
    let blobs = vec![
        bytes_blob(&[prompt]),
        i32_blob(&[6]),
        vec![1u8],
        0.0f32.to_le_bytes().to_vec(),
        7u64.to_le_bytes().to_vec(),
    ];
    let head = json!({"id": "b1", "inputs": [
        binary_input("text_input", "BYTES", &[1, 1], &blobs[0]),
        binary_input("max_tokens", "INT32", &[1, 1], &blobs[1]),
        binary_input("ignore_eos", "BOOL", &[1, 1], &blobs[2]),
        binary_input("temperature", "FP32", &[1, 1], &blobs[3]),
        binary_input("seed", "UINT64", &[1, 1], &blobs[4]),
    ], "parameters": {"binary_data_output": true}});
    let (body, n) = binary_body(&head, &blobs);
    let r = infer_raw(&s, "ensemble", body.clone(), Some(n)).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.content_type, "application/octet-stream");
    assert_eq!(r.head["id"], "b1");
    let texts = r.strings("text_output");
    assert_eq!(texts.len(), 1);
    assert!(texts[0].starts_with("the binary way"), "{texts:?}");
    assert_eq!(r.output("text_output")["shape"], json!([1, 1]));
    assert_eq!(r.i32s("num_output_tokens"), [6]);
    assert_eq!(r.i32s("batch_index"), [0]);
    assert_eq!(r.f32s("output_log_probs").len(), 6);
    assert_eq!(r.f32s("cum_log_probs").len(), 1);
    // Greedy: JSON mode gives the same text.
    let json_mode = infer_json(&s, "ensemble", text_request("the binary way", 6)).await;
    assert_eq!(
        json_mode.output("text_output")["data"][0],
        texts[0].as_str()
    );
    // A per-output choice overrides binary_data_output, both ways.
    let mut head = head;
    head["outputs"] = json!([{"name": "text_output", "parameters": {"binary_data": false}}, {"name": "num_output_tokens"}]);
    let (body, n) = binary_body(&head, &blobs);
    let r = infer_raw(&s, "ensemble", body, Some(n)).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.content_type, "application/octet-stream");
    assert_eq!(r.output("text_output")["data"][0], texts[0].as_str());
    assert_eq!(r.i32s("num_output_tokens"), [6]);
    let mut body = text_request("json in", 2);
    body["outputs"] = json!([{"name": "text_output", "parameters": {"binary_data": true}}, {"name": "batch_index"}]);
    let r = infer_json(&s, "ensemble", body).await;
    assert_eq!(r.content_type, "application/octet-stream");
    assert!(r.strings("text_output")[0].starts_with("json in"));
    assert_eq!(r.output("batch_index")["data"], json!([0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_two_prompts() {
    let s = start_tiny("ks-batch", |_| {}).await;
    let blobs = vec![
        bytes_blob(&[b"first prompt", b"second one"]),
        i32_blob(&[3, 3]),
        vec![1u8],
    ];
    let head = json!({"inputs": [
        binary_input("text_input", "BYTES", &[2, 1], &blobs[0]),
        binary_input("max_tokens", "INT32", &[2, 1], &blobs[1]),
        binary_input("ignore_eos", "BOOL", &[1, 1], &blobs[2]),
    ], "parameters": {"binary_data_output": true}});
    let (body, n) = binary_body(&head, &blobs);
    let r = infer_raw(&s, "ensemble", body, Some(n)).await;
    assert_eq!(r.status, 200, "{}", r.head);
    let texts = r.strings("text_output");
    assert_eq!(r.output("text_output")["shape"], json!([2, 1]));
    assert!(
        texts[0].starts_with("first prompt") && texts[1].starts_with("second one"),
        "{texts:?}"
    );
    assert_eq!(r.i32s("batch_index"), [0, 1]);
    assert_eq!(r.i32s("num_output_tokens"), [3, 3]);
    assert_eq!(r.output("output_log_probs")["shape"], json!([2, 1, 3]));
    // Padded ids cut to input_lengths; ragged outputs padded, lengths in sequence_length.
    let body = json!({"inputs": [
        {"name": "input_ids", "shape": [2, 4], "datatype": "INT32", "data": [5, 6, 7, 0, 8, 9, 0, 0]},
        {"name": "input_lengths", "shape": [2, 1], "datatype": "INT32", "data": [3, 2]},
        {"name": "request_output_len", "shape": [1, 1], "datatype": "INT32", "data": [3]},
        {"name": "ignore_eos", "shape": [1, 1], "datatype": "BOOL", "data": [true]},
        {"name": "exclude_input_in_output", "shape": [1, 1], "datatype": "BOOL", "data": [true]},
    ]});
    let r = infer_json(&s, "tensorrt_llm", body).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.output("num_input_tokens")["data"], json!([3, 2]));
    assert_eq!(r.output("sequence_length")["data"], json!([3, 3]));
    assert_eq!(r.output("output_ids")["shape"], json!([2, 1, 3]));
    assert_eq!(r.output("batch_index")["data"], json!([0, 1]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_input_cancels_a_running_request() {
    let s = start_tiny("ks-stop", |_| {}).await;
    let mut long = text_request("a long one", 1500);
    long["id"] = json!("long1");
    let base = s.base.clone();
    let running = tokio::spawn(async move {
        let r = client()
            .post(format!("{base}/v2/models/ensemble/infer"))
            .body(long.to_string())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    // Stop it once it runs (waiting on the scheduler, not on a guess of its speed).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.model().stats().await.unwrap().active_requests == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the long request never started"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // TRT-LLM's stop request: same id, empty ids, stop = true.
    let stop = json!({"id": "long1", "inputs": [
        {"name": "input_ids", "shape": [1, 0], "datatype": "INT32", "data": []},
        {"name": "input_lengths", "shape": [1, 1], "datatype": "INT32", "data": [0]},
        {"name": "request_output_len", "shape": [1, 1], "datatype": "INT32", "data": [0]},
        {"name": "stop", "shape": [1, 1], "datatype": "BOOL", "data": [true]},
    ]});
    let r = infer_json(&s, "tensorrt_llm", stop).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.head["id"], "long1");
    assert_eq!(r.head["outputs"], json!([]));
    let (status, body) = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let out = body["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "num_output_tokens")
        .unwrap();
    assert!(out["data"][0].as_u64().unwrap() < 1500, "{out}");
}

fn model_stats(body: &Value, name: &str) -> Value {
    body["model_stats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no stats for {name}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_move_with_requests() {
    let s = start_tiny("ks-stats", |_| {}).await;
    let (status, all) = get(&s, "/v2/models/stats").await;
    assert_eq!(status, 200, "{all}");
    for name in s.state.served_names() {
        let m = model_stats(&all, &name);
        assert_eq!(m["version"], "1");
        assert_eq!(m["inference_count"], 0);
        for k in [
            "success",
            "fail",
            "queue",
            "compute_input",
            "compute_infer",
            "compute_output",
            "cache_hit",
            "cache_miss",
        ] {
            assert!(
                m["inference_stats"][k]["count"].is_u64() && m["inference_stats"][k]["ns"].is_u64(),
                "{k}: {m}"
            );
        }
        assert!(
            m["last_inference"].is_u64()
                && m["batch_stats"].is_array()
                && m["memory_usage"].is_array()
        );
    }
    // Two infer calls (one a batch of two) and one generate call.
    assert_eq!(
        infer_json(&s, "ensemble", text_request("count me", 3))
            .await
            .status,
        200
    );
    let mut batch = text_request("x", 3);
    batch["inputs"][0] =
        json!({"name": "text_input", "shape": [2, 1], "datatype": "BYTES", "data": ["one", "two"]});
    assert_eq!(infer_json(&s, "ensemble", batch).await.status, 200);
    let r = client()
        .post(s.url("/v2/models/ensemble/generate"))
        .body(json!({"text_input": "hi", "max_tokens": 2}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (status, one) = get(&s, "/v2/models/ensemble/versions/1/stats").await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["model_stats"].as_array().unwrap().len(), 1);
    let m = model_stats(&one, "ensemble");
    assert_eq!(m["inference_count"], 4);
    assert_eq!(m["execution_count"], 3);
    let st = &m["inference_stats"];
    assert_eq!(st["success"]["count"], 3);
    assert!(st["success"]["ns"].as_u64().unwrap() > 0);
    assert_eq!(st["queue"]["count"], 3);
    assert!(st["compute_infer"]["ns"].as_u64().unwrap() > 0);
    // The core model executed once per engine iteration.
    let (_, core) = get(&s, "/v2/models/tensorrt_llm/stats").await;
    assert!(
        model_stats(&core, "tensorrt_llm")["execution_count"]
            .as_u64()
            .unwrap()
            > 0
    );
    // Other names did not move.
    let (_, all) = get(&s, "/v2/models/stats").await;
    assert_eq!(model_stats(&all, "tensorrt_llm_bls")["inference_count"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_infer_requests_get_named_400s() {
    let s = start_tiny("ks-bad", |_| {}).await;
    let good = text_request("hi", 2);
    let with = |f: &dyn Fn(&mut Value)| {
        let mut b = good.clone();
        f(&mut b);
        b.to_string().into_bytes()
    };
    let bytes_head = |size: usize| json!({"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": size}}]});
    let (ok_body, ok_len) = binary_body(&bytes_head(6), &[bytes_blob(&[b"hi"])]);
    let mut extra = ok_body.clone();
    extra.extend_from_slice(b"zz");
    let (claims, claims_len) = binary_body(&bytes_head(6), &[b"\x09\x00\x00\x00hi".to_vec()]);
    let (not_utf8, not_utf8_len) = binary_body(&bytes_head(6), &[bytes_blob(&[b"\xff\xfe"])]);
    let bool_blob = vec![7u8];
    let (bad_bool, bad_bool_len) = binary_body(
        &json!({"inputs": [binary_input("ignore_eos", "BOOL", &[1, 1], &bool_blob)]}),
        std::slice::from_ref(&bool_blob),
    );
    let nan = f32::NAN.to_le_bytes().to_vec();
    let mut nan_head = good.clone();
    nan_head["inputs"]
        .as_array_mut()
        .unwrap()
        .push(binary_input("temperature", "FP32", &[1, 1], &nan));
    let (nan_body, nan_len) = binary_body(&nan_head, std::slice::from_ref(&nan));
    type Case = (&'static str, Vec<u8>, Option<String>, &'static str);
    let cases: Vec<Case> = vec![
        ("ensemble", b"{\"inputs\": [".to_vec(), None, "malformed JSON"),
        ("ensemble", Vec::new(), None, "empty"),
        ("ensemble", b"{}".to_vec(), None, "no 'inputs'"),
        ("ensemble", b"{\"inputs\": 3}".to_vec(), None, "'inputs' must be a list"),
        ("ensemble", with(&|b| b["inputs"][1]["datatype"] = json!("INT33")), None, "unknown datatype 'INT33'"),
        (
            "ensemble",
            with(&|b| b["inputs"][1] = json!({"name": "max_tokens", "shape": [1, 1], "datatype": "FP32", "data": [2.0]})),
            None,
            "inference input 'max_tokens' data-type is 'FP32', but model 'ensemble' expects 'INT32'",
        ),
        ("ensemble", with(&|b| b["inputs"][1]["data"] = json!([1, 2])), None, "has 2 elements but its shape [1, 1] needs 1"),
        ("ensemble", with(&|b| b["inputs"][1]["data"] = json!([30_000_000_000i64])), None, "not a valid INT32"),
        ("ensemble", with(&|b| b["inputs"][0] = json!({"name": "text_input", "shape": [3], "datatype": "BYTES", "data": ["a", "b", "c"]})), None, "unexpected shape for input 'text_input'"),
        ("ensemble", with(&|b| b["inputs"][1]["shape"] = json!([1, -1])), None, "non-negative"),
        ("ensemble", with(&|b| b["inputs"][2]["name"] = json!("foo")), None, "unexpected inference input 'foo' for model 'ensemble'"),
        ("ensemble", with(&|b| b["outputs"] = json!([{"name": "logits"}])), None, "unexpected inference output 'logits'"),
        ("ensemble", with(&|b| {
            b["inputs"].as_array_mut().unwrap().remove(1);
        }), None, "missing required input 'max_tokens'"),
        ("ensemble", with(&|b| b["parameters"] = json!({"triton_enable_x": true})), None, "reserved"),
        ("ensemble", with(&|b| b["parameters"] = json!({"binary_data_output": "yes"})), None, "binary_data_output"),
        ("ensemble", with(&|b| b["inputs"][1]["data"] = json!([0])), None, "at least 1"),
        ("ensemble", with(&|b| b["inputs"][0]["data"] = json!(["a", "b"])), None, "has 2 elements"),
        ("ensemble", with(&|b| {
            b["inputs"][0] = json!({"name": "text_input", "shape": [2, 1], "datatype": "BYTES", "data": ["a", "b"]});
            b["inputs"][1] = json!({"name": "max_tokens", "shape": [2, 1], "datatype": "INT32", "data": [2, 3]});
        }), None, "differs between the 2 rows"),
        ("ensemble", ok_body.clone(), Some("99999".into()), "holds only"),
        ("ensemble", ok_body.clone(), Some("twelve".into()), "not a byte count"),
        ("ensemble", ok_body.clone(), None, "Inference-Header-Content-Length"),
        ("ensemble", extra, Some(ok_len.to_string()), "do not add up"),
        ("ensemble", ok_body[..ok_body.len() - 3].to_vec(), Some(ok_len.to_string()), "binary data are left"),
        ("ensemble", claims, Some(claims_len.to_string()), "claims 9 bytes"),
        ("ensemble", not_utf8, Some(not_utf8_len.to_string()), "UTF-8"),
        ("ensemble", bad_bool, Some(bad_bool_len.to_string()), "not 0 or 1"),
        ("ensemble", nan_body, Some(nan_len.to_string()), "not finite"),
        ("ensemble", ok_body.clone(), Some("0".into()), "raw binary"),
        ("nope", good.to_string().into_bytes(), None, "Request for unknown model: 'nope' is not found"),
        ("ensemble/versions/3", good.to_string().into_bytes(), None, "version 3"),
        (
            "tensorrt_llm",
            json!({"inputs": [{"name": "stop", "shape": [1, 1], "datatype": "BOOL", "data": [true]}]}).to_string().into_bytes(),
            None,
            "request ID is not provided",
        ),
        (
            "tensorrt_llm",
            json!({"inputs": [
                {"name": "input_ids", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]},
                {"name": "input_lengths", "shape": [1, 1], "datatype": "INT32", "data": [5]},
                {"name": "request_output_len", "shape": [1, 1], "datatype": "INT32", "data": [2]},
            ]})
            .to_string()
            .into_bytes(),
            None,
            "input_lengths row 0 is 5",
        ),
    ];
    assert!(cases.len() >= 12);
    for (model, body, header, needle) in cases {
        let mut r = client()
            .post(s.url(&format!("/v2/models/{model}/infer")))
            .body(body.clone());
        if let Some(h) = &header {
            r = r.header("Inference-Header-Content-Length", h.as_str());
        }
        let r = r.send().await.unwrap();
        let shown = String::from_utf8_lossy(&body[..body.len().min(100)]).to_string();
        assert_eq!(r.status().as_u16(), 400, "{model} {shown}");
        let v: Value = r.json().await.expect("error body is JSON");
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error string for {shown}: {v}"));
        assert!(
            msg.contains(needle),
            "{shown}: {msg:?} should contain {needle:?}"
        );
        let ready = client()
            .get(s.url("/v2/health/ready"))
            .send()
            .await
            .unwrap();
        assert_eq!(ready.status(), 200, "not ready after {shown}");
    }
    // Compression is refused by name.
    let r = client()
        .post(s.url("/v2/models/ensemble/infer"))
        .header("Content-Encoding", "gzip")
        .body(good.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.json::<Value>().await.unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("Content-Encoding"));
    // Still serving.
    let r = infer_raw(&s, "ensemble", ok_body, Some(ok_len)).await;
    assert_eq!(
        r.status, 400,
        "text_input alone lacks max_tokens: {}",
        r.head
    );
    assert!(r.head["error"].as_str().unwrap().contains("max_tokens"));
    assert_eq!(infer_json(&s, "ensemble", good).await.status, 200);
}
