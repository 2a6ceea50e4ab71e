//! Triton's gRPC service against the tiny model, through a client generated from the same
//! vendored protocol: health and metadata, `ModelInfer` equal to HTTP's infer, the
//! decoupled `ModelStreamInfer` (one response per token batch, the final flag last, two
//! requests interleaved on one stream), a stop request on the stream, errors as stream
//! responses, and a stream closed by its client cancelling what it had running.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::handle::wait_idle;
use common::server::{start_tiny, TestServer};
use inflight::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use inflight::grpc::proto::infer_parameter::ParameterChoice;
use inflight::grpc::proto::model_infer_request::InferInputTensor;
use inflight::grpc::proto::*;
use serde_json::json;
use tokio::sync::mpsc;
use tonic::transport::Channel;

async fn connect(s: &TestServer) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(s.grpc.clone())
        .await
        .unwrap()
}

fn typed(name: &str, dt: &str, shape: &[i64], c: InferTensorContents) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: dt.into(),
        shape: shape.to_vec(),
        parameters: HashMap::new(),
        contents: Some(c),
    }
}

fn ints(v: &[i32]) -> InferTensorContents {
    InferTensorContents {
        int_contents: v.to_vec(),
        ..Default::default()
    }
}

fn flag(b: bool) -> InferTensorContents {
    InferTensorContents {
        bool_contents: vec![b],
        ..Default::default()
    }
}

/// A core-model request: prompt ids, output length, streaming, greedy, EOS ignored.
fn ids_request(id: &str, ids: &[i32], n: i32, streaming: bool) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "tensorrt_llm".into(),
        id: id.into(),
        inputs: vec![
            typed("input_ids", "INT32", &[1, ids.len() as i64], ints(ids)),
            typed("request_output_len", "INT32", &[1, 1], ints(&[n])),
            typed("streaming", "BOOL", &[1, 1], flag(streaming)),
            typed("ignore_eos", "BOOL", &[1, 1], flag(true)),
            typed(
                "temperature",
                "FP32",
                &[1, 1],
                InferTensorContents {
                    fp32_contents: vec![0.0],
                    ..Default::default()
                },
            ),
        ],
        ..Default::default()
    }
}

/// The INT32 output `name` of a response, from its raw contents.
fn output_i32(r: &ModelInferResponse, name: &str) -> Vec<i32> {
    let i = r.outputs.iter().position(|o| o.name == name).unwrap();
    r.raw_output_contents[i]
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn is_final(r: &ModelInferResponse) -> bool {
    matches!(
        r.parameters
            .get("triton_final_response")
            .and_then(|p| p.parameter_choice.clone()),
        Some(ParameterChoice::BoolParam(true))
    )
}

/// HTTP's greedy answer for the same ids.
async fn http_ids(s: &TestServer, ids: &[i32], n: i32) -> Vec<i32> {
    let (status, out) = s
        .post(
            "/v2/models/tensorrt_llm/generate",
            json!({"input_ids": ids, "request_output_len": n, "temperature": 0.0, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let ids = out["output_ids"].as_array().unwrap();
    let flat = if ids[0].is_array() {
        ids[0].as_array().unwrap()
    } else {
        ids
    };
    flat.iter().map(|v| v.as_i64().unwrap() as i32).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metadata_and_infer() {
    let s = start_tiny("grpc-infer", |_| {}).await;
    let mut c = connect(&s).await;
    assert!(
        c.server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let ready = c
        .model_ready(ModelReadyRequest {
            name: "tensorrt_llm".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ready.ready);
    let meta = c
        .model_metadata(ModelMetadataRequest {
            name: "tensorrt_llm".into(),
            version: "1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(meta
        .inputs
        .iter()
        .any(|t| t.name == "input_ids" && t.shape == [-1, -1]));
    let err = c
        .model_metadata(ModelMetadataRequest {
            name: "nope".into(),
            version: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    let config = c
        .model_config(ModelConfigRequest {
            name: "ensemble".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert!(config.model_transaction_policy.unwrap().decoupled);

    let ids = [3, 9, 27, 4];
    let want = http_ids(&s, &ids, 6).await;
    let r = c
        .model_infer(ids_request("i-1", &ids, 6, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.id, "i-1");
    assert_eq!(output_i32(&r, "output_ids"), want);
    assert_eq!(output_i32(&r, "sequence_length"), [6]);
    // A request the HTTP route refuses is refused here too, with the same words.
    let mut bad = ids_request("i-2", &ids, 6, false);
    bad.inputs.remove(1);
    let err = c.model_infer(bad).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("request_output_len"), "{err:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoupled_stream_stop_errors_and_cancel() {
    let s = start_tiny("grpc-stream", |_| {}).await;
    let mut c = connect(&s).await;
    let (tx, rx) = mpsc::channel(16);
    let mut responses = c
        .model_stream_infer(tokio_stream_of(rx))
        .await
        .unwrap()
        .into_inner();
    let (a, b) = ([3, 9, 27, 4], [5, 5, 8]);
    let (want_a, want_b) = (http_ids(&s, &a, 12).await, http_ids(&s, &b, 7).await);
    tx.send(ids_request("a", &a, 12, true)).await.unwrap();
    tx.send(ids_request("b", &b, 7, true)).await.unwrap();
    // A refused request: its error comes back on the stream, naming the problem.
    let mut bad = ids_request("bad", &a, 4, true);
    bad.inputs.remove(0);
    tx.send(bad).await.unwrap();
    let mut got: HashMap<String, Vec<i32>> = HashMap::new();
    let mut responses_of: HashMap<String, usize> = HashMap::new();
    let (mut finals, mut errors) = (0, 0);
    let mut ended: Vec<String> = Vec::new();
    while finals < 2 || errors < 1 {
        let m = next(&mut responses).await;
        let r = m.infer_response.unwrap();
        if !m.error_message.is_empty() {
            assert_eq!(r.id, "bad");
            assert!(m.error_message.contains("input_ids"), "{}", m.error_message);
            errors += 1;
            continue;
        }
        assert!(
            !ended.contains(&r.id),
            "a response after {}'s final one",
            r.id
        );
        got.entry(r.id.clone())
            .or_default()
            .extend(output_i32(&r, "output_ids"));
        *responses_of.entry(r.id.clone()).or_default() += 1;
        if is_final(&r) {
            finals += 1;
            ended.push(r.id.clone());
        }
    }
    assert_eq!(got["a"], want_a);
    assert_eq!(got["b"], want_b);
    assert!(
        responses_of["a"] >= 3,
        "12 tokens in {} responses",
        responses_of["a"]
    );

    // A long generation, then TRT-LLM's stop request for its id on the same stream.
    tx.send(ids_request("long", &a, 2000, true)).await.unwrap();
    let first = next(&mut responses).await;
    assert_eq!(first.error_message, "");
    assert_eq!(first.infer_response.unwrap().id, "long");
    let stop = ModelInferRequest {
        model_name: "tensorrt_llm".into(),
        id: "long".into(),
        inputs: vec![
            typed("input_ids", "INT32", &[1, 1], ints(&[0])),
            typed("input_lengths", "INT32", &[1, 1], ints(&[0])),
            typed("request_output_len", "INT32", &[1, 1], ints(&[0])),
            typed("stop", "BOOL", &[1, 1], flag(true)),
        ],
        ..Default::default()
    };
    tx.send(stop).await.unwrap();
    let (mut tokens, mut long_finals) = (0, 0);
    while long_finals < 2 {
        let m = next(&mut responses).await;
        let r = m.infer_response.unwrap();
        assert_eq!(r.id, "long");
        if !r.outputs.is_empty() {
            tokens += output_i32(&r, "output_ids").len();
        }
        long_finals += is_final(&r) as usize;
    }
    assert!(
        tokens < 1999,
        "the stop request did not end the generation ({tokens} tokens)"
    );
    wait_idle(&s.model()).await;

    // A client that drops its stream cancels what it had running.
    tx.send(ids_request("dropped", &a, 2000, true))
        .await
        .unwrap();
    next(&mut responses).await;
    drop(responses);
    drop(tx);
    let stats = wait_idle(&s.model()).await;
    assert_eq!(stats.running, 0);
    // Counted when each request's stream is dropped, which follows the client's leaving.
    let line =
        "nv_inference_request_failure{model=\"tensorrt_llm\",version=\"1\",reason=\"CANCELED\"}";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.metric(line).await != Some(2.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the stopped and the dropped request count as cancelled: {:?}",
            s.metric(line).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
}

/// The stream's next response (within 30 s).
async fn next(
    responses: &mut tonic::Streaming<ModelStreamInferResponse>,
) -> ModelStreamInferResponse {
    tokio::time::timeout(Duration::from_secs(30), responses.message())
        .await
        .expect("a response within 30 s")
        .unwrap()
        .expect("the stream is open")
}

/// The request side of a stream, from a channel.
fn tokio_stream_of(
    rx: mpsc::Receiver<ModelInferRequest>,
) -> impl futures::Stream<Item = ModelInferRequest> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_and_connection_cap() {
    let dir = common::server::tiny_model_dir("grpc-limits");
    let limits = inflight::http::ServeLimits {
        api_key: Some("sesame".into()),
        max_connections: 2,
        ..Default::default()
    };
    let s = common::server::start_limited(&dir, limits, |_| {}).await;
    let mut a = connect(&s).await;
    // Health needs no key; everything else does.
    assert!(
        a.server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    let meta = || ServerMetadataRequest {};
    let err = a.server_metadata(meta()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    let mut keyed = tonic::Request::new(meta());
    keyed
        .metadata_mut()
        .insert("authorization", "Bearer sesame".parse().unwrap());
    assert_eq!(
        a.server_metadata(keyed).await.unwrap().into_inner().name,
        "inflight"
    );
    // Two connections open: a third is closed at once; once one goes, a new one is served.
    let mut b = connect(&s).await;
    b.server_live(ServerLiveRequest {}).await.unwrap();
    let third = async {
        let mut c = connect(&s).await;
        c.server_live(ServerLiveRequest {}).await
    };
    let refused = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .unwrap();
    assert!(
        refused.is_err(),
        "a third connection was served: {refused:?}"
    );
    drop(b);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = connect(&s).await;
        if c.server_live(ServerLiveRequest {}).await.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the freed slot was never given to a new connection"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
}
