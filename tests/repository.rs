//! A model repository served end to end: two models at once, each under its own names;
//! one unloaded and loaded again (over HTTP and gRPC) while the other serves traffic
//! with no request failing; the index, readiness and the refusals along the way.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use common::scratch::Scratch;
use common::server::{start_repository, start_tiny, TestServer};
use inflight::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use inflight::grpc::proto::*;
use inflight::model::tiny::{write_tiny_checkpoint, TinySpec};
use serde_json::{json, Value};

/// A tiny model in `dir/name` (its weights under `weights/` when `nested`), with
/// `config` as its config.toml.
fn model(dir: &Path, name: &str, seed: u64, nested: bool, config: &str) {
    let folder = dir.join(name);
    let weights = if nested {
        folder.join("weights")
    } else {
        folder.clone()
    };
    std::fs::create_dir_all(&weights).unwrap();
    let spec = TinySpec {
        num_layers: 2,
        seed,
        ..TinySpec::default()
    };
    write_tiny_checkpoint(&weights, &spec).unwrap();
    std::fs::write(folder.join("config.toml"), config).unwrap();
}

const SMALL: &str = "max_tokens_in_paged_kv_cache = 4096\ntokens_per_block = 16\n";

fn repository() -> Scratch {
    let dir = Scratch::new("repository");
    let alpha = format!(
        "[model]\n{SMALL}\n[model.triton_names]\nensemble = \"alpha_ensemble\"\ntensorrt_llm = \"alpha_trtllm\"\n"
    );
    model(&dir, "alpha", 1, false, &alpha);
    model(
        &dir,
        "beta",
        2,
        true,
        &format!("[model]\npath = \"weights\"\n{SMALL}"),
    );
    dir
}

fn states(index: &Value) -> Vec<(String, String)> {
    index
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("name"), s("state"))
        })
        .collect()
}

async fn generate(s: &TestServer, model: &str) -> (u16, Value) {
    s.post(
        &format!("/v2/models/{model}/generate"),
        json!({"text_input": "hello there", "max_tokens": 6, "ignore_eos": true}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_models_serve_at_once_and_one_reloads_while_the_other_serves() {
    let dir = repository();
    let s = start_repository(&dir).await;

    // Both serve, each under its own names; the index lists models and names.
    let (status, index) = s.post("/v2/repository/index", json!({})).await;
    assert_eq!(status, 200, "{index}");
    let ready = |n: &str| (n.to_string(), "READY".to_string());
    assert_eq!(
        states(&index),
        [
            ready("alpha"),
            ready("alpha_ensemble"),
            ready("alpha_trtllm"),
            ready("beta")
        ]
    );
    let (status, a) = generate(&s, "alpha").await;
    assert_eq!(status, 200, "{a}");
    let (status, b) = generate(&s, "beta").await;
    assert_eq!(status, 200, "{b}");
    assert_ne!(
        a["text_output"], b["text_output"],
        "two different models answered"
    );
    let (status, e) = generate(&s, "alpha_ensemble").await;
    assert_eq!((status, &e["text_output"]), (200, &a["text_output"]));
    let (status, ids) = s
        .post(
            "/v2/models/alpha_trtllm/generate",
            json!({"input_ids": [5, 6, 7], "request_output_len": 3, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, 200, "{ids}");
    assert!(ids["output_ids"].is_array(), "{ids}");
    let (status, _) = generate(&s, "ensemble").await;
    assert_eq!(
        status, 400,
        "a repository's models take no default Triton names"
    );
    let (status, c) = s
        .post(
            "/v1/completions",
            json!({"model": "beta", "prompt": "hi", "max_tokens": 3}),
        )
        .await;
    assert_eq!(status, 200, "{c}");
    let (status, c) = s
        .post("/v1/completions", json!({"prompt": "hi", "max_tokens": 3}))
        .await;
    assert_eq!(status, 400, "two models: a body must name one: {c}");

    // beta serves a steady stream of requests while alpha goes away and comes back.
    let base = s.base.clone();
    let done = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let (d, n) = (done.clone(), served.clone());
    let traffic = tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut statuses = Vec::new();
        while !d.load(Ordering::Relaxed) {
            let r = client
                .post(format!("{base}/v2/models/beta/generate_stream"))
                .json(&json!({"text_input": "request", "max_tokens": 4}))
                .send()
                .await
                .unwrap();
            statuses.push(r.status().as_u16());
            r.bytes().await.unwrap();
            n.fetch_add(1, Ordering::Relaxed);
        }
        statuses
    });
    let some_more = |from: usize| {
        let n = served.clone();
        async move {
            while n.load(Ordering::Relaxed) < from + 5 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    };
    some_more(0).await;
    let (status, r) = s
        .post("/v2/repository/models/alpha/unload", json!({}))
        .await;
    assert_eq!(status, 200, "{r}");
    let (status, r) = generate(&s, "alpha").await;
    assert_eq!(status, 503, "{r}");
    assert!(r["error"].as_str().unwrap().contains("unloaded"), "{r}");
    let (status, r) = generate(&s, "alpha_trtllm").await;
    assert_eq!(status, 503, "{r}");
    let (_, index) = s.post("/v2/repository/index", json!({})).await;
    assert!(states(&index).contains(&("alpha".into(), "UNAVAILABLE".into())));
    assert_eq!(index[0]["reason"], "unloaded");
    let (_, ready_only) = s.post("/v2/repository/index", json!({"ready": true})).await;
    assert_eq!(states(&ready_only), [ready("beta")]);
    let r = reqwest::get(s.url("/v2/models/alpha/ready")).await.unwrap();
    assert_eq!(r.status(), 503);
    let r = reqwest::get(s.url("/v2/health/ready")).await.unwrap();
    assert_eq!(
        r.status(),
        200,
        "unloaded on purpose: the server stays ready"
    );

    let (status, r) = s.post("/v2/repository/models/alpha/load", json!({})).await;
    assert_eq!(status, 200, "{r}");
    let (status, again) = generate(&s, "alpha").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        again["text_output"], a["text_output"],
        "the same model came back"
    );
    some_more(served.load(Ordering::Relaxed)).await;
    done.store(true, Ordering::Relaxed);
    let statuses = traffic.await.unwrap();
    assert!(statuses.len() >= 15, "{statuses:?}");
    assert!(
        statuses.iter().all(|&c| c == 200),
        "every request to beta succeeded: {statuses:?}"
    );

    // A reload while serving: alpha answers throughout.
    let (status, r) = s.post("/v2/repository/models/alpha/load", json!({})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(generate(&s, "alpha").await.0, 200);

    // The same over gRPC.
    let mut g = GrpcInferenceServiceClient::connect(s.grpc.clone())
        .await
        .unwrap();
    g.repository_model_unload(RepositoryModelUnloadRequest {
        model_name: "beta".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let idx = g
        .repository_index(RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    let beta = idx.models.iter().find(|m| m.name == "beta").unwrap();
    assert_eq!(
        (beta.state.as_str(), beta.reason.as_str()),
        ("UNAVAILABLE", "unloaded")
    );
    let ready = g
        .model_ready(ModelReadyRequest {
            name: "beta".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!ready.ready);
    g.repository_model_load(RepositoryModelLoadRequest {
        model_name: "beta".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(generate(&s, "beta").await.0, 200);
    let missing = g
        .repository_model_load(RepositoryModelLoadRequest {
            model_name: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");

    // Refusals: no such folder, a path out of the repository, a name another model has,
    // a model whose weights do not load (which then shows in the index with the reason).
    for bad in ["nope", "..", ".hidden"] {
        let (status, r) = s
            .post(&format!("/v2/repository/models/{bad}/load"), json!({}))
            .await;
        assert_eq!(status, 404, "{bad}: {r}");
    }
    let clash = format!("[model]\n{SMALL}\n[model.triton_names]\nensemble = \"alpha_ensemble\"\n");
    model(&dir, "gamma", 3, false, &clash);
    let (status, r) = s.post("/v2/repository/models/gamma/load", json!({})).await;
    assert_eq!(status, 400, "{r}");
    assert!(
        r["error"].as_str().unwrap().contains("'alpha_ensemble'"),
        "{r}"
    );
    let triton = dir.join("tensorrt_llm");
    std::fs::create_dir_all(&triton).unwrap();
    std::fs::write(triton.join("config.pbtxt"), "backend: \"tensorrtllm\"\n").unwrap();
    let (status, r) = s
        .post("/v2/repository/models/tensorrt_llm/load", json!({}))
        .await;
    assert_eq!(status, 400, "{r}");
    assert!(r["error"].as_str().unwrap().contains("config.pbtxt"), "{r}");
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    let (status, r) = s.post("/v2/repository/models/empty/load", json!({})).await;
    assert_eq!(status, 400, "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("failed to load 'empty'"),
        "{r}"
    );
    let (_, index) = s.post("/v2/repository/index", json!({})).await;
    let empty = index
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "empty")
        .unwrap();
    assert_eq!(empty["state"], "UNAVAILABLE");
    assert!(empty["reason"].as_str().unwrap().contains("failed to load"));
    let (status, r) = s
        .post(
            "/v2/repository/models/alpha/load",
            json!({"parameters": {"config": "{}"}}),
        )
        .await;
    assert_eq!(status, 400, "{r}");
    assert!(r["error"].as_str().unwrap().contains("'config'"), "{r}");
    // Both models still serve.
    assert_eq!(generate(&s, "alpha").await.0, 200);
    assert_eq!(generate(&s, "beta").await.0, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_of_one_model_refuses_to_load_and_unload() {
    let s = start_tiny("repo-single", |_| {}).await;
    let (status, r) = s
        .post("/v2/repository/models/ensemble/unload", json!({}))
        .await;
    assert_eq!(status, 400, "{r}");
    assert!(
        r["error"].as_str().unwrap().contains("--model-repository"),
        "{r}"
    );
    let (status, index) = s.post("/v2/repository/index", json!({})).await;
    assert_eq!(status, 200);
    let names: Vec<_> = states(&index).into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"ensemble".to_string()) && names.contains(&"tensorrt_llm".to_string()));
    assert_eq!(generate(&s, "ensemble").await.0, 200);
    s.stop().await;
}
