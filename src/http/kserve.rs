//! KServe v2 / Open Inference Protocol, as tritonclient and perf_analyzer use it: health,
//! server and model metadata, model configuration (protobuf field names), `infer` with
//! JSON or binary tensors (codec in [`super::tensors`]), and the statistics extension.
//!
//! Each served name describes itself as TensorRT-LLM's model of that name does: the text
//! models (`ensemble`, `tensorrt_llm_bls`, the model's own name) take `text_input` and
//! `max_tokens`, the core model (`tensorrt_llm`) takes `input_ids` and
//! `request_output_len`. An `infer` call becomes the same field object a generate call
//! carries (one key per input tensor) and goes through [`build_request`], non-streamed.
//! One request holds one set of sampling parameters, so a batch's rows must agree on
//! every input but the prompt.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_ENCODING;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{json, Map, Value};

use super::fields::{build_request, stop_target, Fields};
use super::kserve_stats::{all_stats, model_stats};
use super::tensors::{self, Data, DataType, InferRequest, Output, Tensor};
use super::{
    versioned_get, versioned_post, ApiError, ApiResult, AppState, ModelKind, BLS, CORE, ENSEMBLE,
};
use crate::handle::ModelHandle;
use crate::request::Chunk;
use DataType::{Bool, Bytes as Str, F32, I32, U64};

pub fn routes() -> Router<AppState> {
    let r = Router::new()
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2", get(server_metadata))
        .route("/v2/models/stats", get(all_stats));
    let r = versioned_get(r, "/v2/models/{model}", model_metadata);
    let r = versioned_get(r, "/v2/models/{model}/ready", model_ready);
    let r = versioned_get(r, "/v2/models/{model}/config", model_config);
    let r = versioned_get(r, "/v2/models/{model}/stats", model_stats);
    versioned_post(r, "/v2/models/{model}/infer", infer)
}

pub async fn live() -> StatusCode {
    StatusCode::OK
}

/// 503 rather than Triton's 400 when not ready: load balancers read 503 as "not yet".
pub async fn ready(State(state): State<AppState>) -> StatusCode {
    if state.models().is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

#[derive(serde::Deserialize)]
pub(super) struct ModelPath {
    pub model: String,
    version: Option<String>,
}

/// The serving model behind the named one and the name's kind; only version 1 exists.
pub(super) fn served(state: &AppState, p: &ModelPath) -> ApiResult<(ModelHandle, ModelKind)> {
    let routed = state.route(&p.model)?;
    served_version(p)?;
    Ok(routed)
}

/// Only version 1 exists.
fn served_version(p: &ModelPath) -> ApiResult<()> {
    match p.version.as_deref() {
        None | Some("") | Some("1") => Ok(()),
        Some(v) => Err(ApiError::BadRequest(format!(
            "Request for unknown model: '{}' version {v} is not found",
            p.model
        ))),
    }
}

/// The protocol extensions the server implements (HTTP and gRPC metadata).
pub(crate) const EXTENSIONS: [&str; 6] = [
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "statistics",
    "parameters",
    "generate",
];

async fn server_metadata() -> Json<Value> {
    Json(
        json!({"name": "inflight", "version": env!("CARGO_PKG_VERSION"), "extensions": EXTENSIONS}),
    )
}

async fn model_ready(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> ApiResult<StatusCode> {
    let ready = state.model_ready(&p.model)?;
    served_version(&p)?;
    Ok(if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    })
}

/// One tensor a model declares. `listed: false` marks an alias or a value-checked option
/// that `infer` accepts but metadata does not advertise.
struct Spec {
    name: &'static str,
    dt: DataType,
    dims: &'static [i64],
    optional: bool,
    listed: bool,
}

const fn req(name: &'static str, dt: DataType, dims: &'static [i64]) -> Spec {
    Spec {
        name,
        dt,
        dims,
        optional: false,
        listed: true,
    }
}
const fn opt(name: &'static str, dt: DataType) -> Spec {
    Spec {
        name,
        dt,
        dims: &[1],
        optional: true,
        listed: true,
    }
}
const fn alias(name: &'static str, dt: DataType) -> Spec {
    Spec {
        name,
        dt,
        dims: &[1],
        optional: true,
        listed: false,
    }
}

/// Inputs every model shares (TRT-LLM's names; `ignore_eos`, `stop_after_ms` are ours).
const COMMON_INPUTS: &[Spec] = &[
    opt("num_return_sequences", I32),
    opt("exclude_input_in_output", Bool),
    opt("end_id", I32),
    opt("pad_id", I32),
    opt("temperature", F32),
    opt("repetition_penalty", F32),
    opt("min_tokens", I32),
    opt("presence_penalty", F32),
    opt("frequency_penalty", F32),
    opt("seed", U64),
    opt("return_log_probs", Bool),
    opt("return_num_input_tokens", Bool),
    opt("return_num_output_tokens", Bool),
    opt("beam_width", I32),
    opt("early_stopping", Bool),
    alias("beam_search_diversity_rate", F32),
    opt("ignore_eos", Bool),
    opt("stop_after_ms", I32),
    opt("priority", I32),
    alias("min_length", I32),
    alias("random_seed", U64),
    opt("return_context_logits", Bool),
    opt("return_generation_logits", Bool),
    alias("return_perf_metrics", Bool),
];

const TEXT_INPUTS: &[Spec] = &[
    req("text_input", Str, &[1]),
    req("max_tokens", I32, &[1]),
    Spec {
        optional: true,
        ..req("bad_words", Str, &[-1])
    },
    Spec {
        optional: true,
        ..req("stop_words", Str, &[-1])
    },
    opt("top_k", I32),
    opt("top_p", F32),
    opt("length_penalty", F32),
    opt("stream", Bool),
    alias("decoder_text_input", Str),
    alias("runtime_top_k", I32),
    alias("runtime_top_p", F32),
    alias("streaming", Bool),
    alias("stop", Bool),
];

const IDS_INPUTS: &[Spec] = &[
    req("input_ids", I32, &[-1]),
    opt("input_lengths", I32),
    req("request_output_len", I32, &[1]),
    opt("runtime_top_k", I32),
    opt("runtime_top_p", F32),
    opt("len_penalty", F32),
    opt("stop", Bool),
    opt("streaming", Bool),
    alias("max_tokens", I32),
    alias("top_k", I32),
    alias("top_p", F32),
    alias("stream", Bool),
];

/// An output: its name, datatype and dims after the batch dimension.
type OutSpec = (&'static str, DataType, &'static [i64]);

const TEXT_OUTPUTS: &[OutSpec] = &[
    ("text_output", Str, &[-1]),
    ("cum_log_probs", F32, &[-1]),
    ("output_log_probs", F32, &[-1, -1]),
    ("batch_index", I32, &[1]),
    ("sequence_index", I32, &[1]),
    ("num_input_tokens", I32, &[1]),
    ("num_output_tokens", I32, &[1]),
    ("context_logits", F32, &[-1, -1]),
    ("generation_logits", F32, &[-1, -1, -1]),
];

const IDS_OUTPUTS: &[OutSpec] = &[
    ("output_ids", I32, &[-1, -1]),
    ("sequence_length", I32, &[-1]),
    ("cum_log_probs", F32, &[-1]),
    ("output_log_probs", F32, &[-1, -1]),
    ("batch_index", I32, &[1]),
    ("sequence_index", I32, &[1]),
    ("num_input_tokens", I32, &[1]),
    ("num_output_tokens", I32, &[1]),
    ("context_logits", F32, &[-1, -1]),
    ("generation_logits", F32, &[-1, -1, -1]),
];

/// The outputs sent only when their flag asks for them (they are large).
const LOGITS_OUTPUTS: [(&str, &str); 2] = [
    ("context_logits", "return_context_logits"),
    ("generation_logits", "return_generation_logits"),
];

fn inputs(kind: ModelKind) -> impl Iterator<Item = &'static Spec> {
    let own = match kind {
        ModelKind::Text => TEXT_INPUTS,
        ModelKind::Ids => IDS_INPUTS,
    };
    own.iter().chain(COMMON_INPUTS)
}

fn outputs(kind: ModelKind) -> &'static [OutSpec] {
    match kind {
        ModelKind::Text => TEXT_OUTPUTS,
        ModelKind::Ids => IDS_OUTPUTS,
    }
}

/// Triton's platform (metadata) and backend (config) of each served name.
fn platform(name: &str) -> (&'static str, &'static str) {
    match name {
        ENSEMBLE => ("ensemble", ""),
        BLS => ("python", "python"),
        CORE => ("tensorrtllm", "tensorrtllm"),
        _ => ("inflight", "inflight"),
    }
}

fn with_batch(dims: &[i64]) -> Vec<i64> {
    std::iter::once(-1).chain(dims.iter().copied()).collect()
}

async fn model_metadata(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> ApiResult<Json<Value>> {
    let (_, kind) = served(&state, &p)?;
    Ok(Json(metadata_json(&p.model, kind)))
}

/// A served name's metadata: its inputs and outputs with their batch dimension.
pub(crate) fn metadata_json(model: &str, kind: ModelKind) -> Value {
    let ins: Vec<Value> = inputs(kind)
        .filter(|s| s.listed)
        .map(|s| json!({"name": s.name, "datatype": s.dt.name(), "shape": with_batch(s.dims)}))
        .collect();
    let outs: Vec<Value> = outputs(kind)
        .iter()
        .map(|(n, dt, dims)| json!({"name": n, "datatype": dt.name(), "shape": with_batch(dims)}))
        .collect();
    json!({"name": model, "versions": ["1"], "platform": platform(model).0, "inputs": ins, "outputs": outs})
}

async fn model_config(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> ApiResult<Json<Value>> {
    let (handle, kind) = served(&state, &p)?;
    Ok(Json(config_json(&handle, &p.model, kind).await?))
}

/// A served name's configuration in protobuf field names (model_config.proto).
pub(crate) async fn config_json(
    handle: &ModelHandle,
    model: &str,
    kind: ModelKind,
) -> ApiResult<Value> {
    let stats = handle
        .stats()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    let ins: Vec<Value> = inputs(kind)
        .filter(|s| s.listed)
        .map(|s| {
            json!({"name": s.name, "data_type": s.dt.config_name(), "format": "FORMAT_NONE", "dims": s.dims,
                   "is_shape_tensor": false, "allow_ragged_batch": false, "optional": s.optional})
        })
        .collect();
    let outs: Vec<Value> = outputs(kind)
        .iter()
        .map(|(n, dt, dims)| json!({"name": n, "data_type": dt.config_name(), "dims": dims, "label_filename": "", "is_shape_tensor": false}))
        .collect();
    let (platform, backend) = platform(model);
    let mut config = json!({
        "name": model, "platform": platform, "backend": backend,
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": stats.max_batch_size.max(1),
        "input": ins, "output": outs,
        // Every served name streams through generate_stream.
        "model_transaction_policy": {"decoupled": true},
    });
    if model == ENSEMBLE {
        // perf_analyzer walks the steps and fetches each composing model's config and
        // stats. Tokenizing happens inside, so the one step is the core model.
        let input_map: Map<String, Value> = [
            ("request_output_len", "max_tokens"),
            ("runtime_top_k", "top_k"),
            ("runtime_top_p", "top_p"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .chain(
            COMMON_INPUTS
                .iter()
                .filter(|s| s.listed)
                .map(|s| (s.name.to_string(), json!(s.name))),
        )
        .collect();
        let output_map: Map<String, Value> = TEXT_OUTPUTS[1..]
            .iter()
            .map(|(n, ..)| (n.to_string(), json!(n)))
            .collect();
        let step = json!({"model_name": CORE, "model_version": -1, "input_map": input_map, "output_map": output_map});
        config["ensemble_scheduling"] = json!({"step": [step]});
    } else {
        config["dynamic_batching"] = json!({});
    }
    Ok(config)
}

/// `POST /v2/models/{model}/infer`.
async fn infer(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let (handle, kind) = served(&state, &p)?;
    let model = p.model.as_str();
    if let Some(enc) = headers
        .get(CONTENT_ENCODING)
        .filter(|e| e.as_bytes() != b"identity")
    {
        return Err(ApiError::Unsupported(format!(
            "Content-Encoding {enc:?} is not supported; send the body uncompressed"
        )));
    }
    let req = tensors::decode_request(&body, headers.get(tensors::HEADER_LENGTH))?;
    if let Some(k) = req.parameters.keys().find(|k| k.starts_with("triton_")) {
        return Err(ApiError::BadRequest(format!(
            "request parameter '{k}': names starting with 'triton_' are reserved"
        )));
    }
    let mut run = match prepare(&state, &handle, model, kind, &req)? {
        Prepared::Stop(id) => {
            return Ok(Json(
                json!({"model_name": model, "model_version": "1", "id": id, "outputs": []}),
            )
            .into_response())
        }
        Prepared::Run(run) => run,
    };
    run.request.params.stream = false;
    let outputs = run.whole(&state, model).await?;
    let mut head = Map::new();
    head.insert("model_name".into(), json!(model));
    head.insert("model_version".into(), json!("1"));
    if let Some(id) = &req.id {
        head.insert("id".into(), json!(id));
    }
    tensors::encode_response(head, outputs)
}

/// An infer request decoded and checked, before anything runs (HTTP and gRPC share it).
pub(crate) enum Prepared {
    /// TRT-LLM's stop request: the request with this id was cancelled; it is answered
    /// with no outputs.
    Stop(String),
    /// A generation to run.
    Run(Box<InferRun>),
}

/// A generation an infer request asks for, the model that runs it, and how its answer is
/// shaped.
pub(crate) struct InferRun {
    pub model: ModelHandle,
    pub request: crate::request::Request,
    pub shape: AnswerShape,
}

/// Which output tensors an infer request gets back, and how they are filled.
pub(crate) struct AnswerShape {
    wanted: Vec<(&'static OutSpec, bool)>,
    pad: u32,
    logprobs: bool,
    /// Answers: prompts times `n` (num_return_sequences).
    pub prompts: usize,
    /// Sequences per prompt: answer `i` is prompt `i / n`'s sequence `i % n`.
    n: usize,
}

impl AnswerShape {
    /// The output tensors of `answers` (one per prompt, or one chunk's worth of a
    /// stream: each carries its own `batch_index`).
    pub fn outputs(&self, answers: &[Chunk]) -> Vec<Output> {
        let beams = answers.iter().map(|a| a.beams.len()).max().unwrap_or(0);
        if beams == 0 {
            return self
                .wanted
                .iter()
                .map(|&(spec, binary)| output(spec, binary, answers, self))
                .collect();
        }
        // Beam search: a row per beam, TensorRT-LLM's [batch, beam, ...] tensors (a
        // prompt with fewer beams padded with empty ones).
        let rows: Vec<Chunk> = answers
            .iter()
            .flat_map(|a| {
                let mut b = a.beams.clone();
                b.resize_with(beams, Chunk::default);
                b
            })
            .collect();
        self.wanted
            .iter()
            .map(|&(spec, binary)| match spec.0 {
                "batch_index" | "sequence_index" | "num_input_tokens" | "context_logits" => {
                    output(spec, binary, answers, self)
                }
                _ => {
                    let mut o = output(spec, binary, &rows, self);
                    let mut shape = vec![answers.len(), beams];
                    shape.extend_from_slice(o.shape.get(2..).unwrap_or_default());
                    o.shape = shape;
                    o
                }
            })
            .collect()
    }
}

impl InferRun {
    /// Runs the request to its end and returns its whole answer's outputs.
    pub async fn whole(self, state: &AppState, model: &str) -> ApiResult<Vec<Output>> {
        let stream = state.submit(&self.model, model, self.request).await?;
        let chunks: Vec<Chunk> = stream.collect().await;
        if let Some(err) = chunks.iter().find_map(|c| c.error.clone()) {
            return Err(ApiError::EngineFailed(err));
        }
        Ok(self
            .shape
            .outputs(&crate::request::answers(chunks, self.shape.prompts)))
    }
}

/// Checks `req` for `model` and turns it into a generation, or carries out a stop
/// request (cancelling its target).
pub(crate) fn prepare(
    state: &AppState,
    handle: &ModelHandle,
    model: &str,
    kind: ModelKind,
    req: &InferRequest,
) -> ApiResult<Prepared> {
    let wanted = select_outputs(model, kind, req)?;
    let object = Value::Object(field_object(model, kind, req)?);
    let fields = Fields::new(&object)?;
    if let Some(id) = stop_target(&fields)? {
        // Every instance of the model: a reload's draining one may run the target.
        state.models().cancel(model, &id);
        return Ok(Prepared::Stop(id));
    }
    if let Some(missing) = inputs(kind)
        .find(|s| !s.optional && fields.get(s.name).is_none() && !alias_present(&fields, s.name))
    {
        return Err(ApiError::BadRequest(format!(
            "missing required input '{}' for model '{model}'",
            missing.name
        )));
    }
    let request = build_request(
        &fields,
        kind,
        handle.tokenizer(),
        handle.config().max_position_embeddings,
    )?;
    let p = &request.params;
    let asked = |flag: &str| match flag {
        "return_context_logits" => p.return_context_logits,
        _ => p.return_generation_logits,
    };
    let mut wanted = wanted;
    for (name, flag) in LOGITS_OUTPUTS {
        let listed = wanted.iter().any(|(spec, _)| spec.0 == name);
        match (req.outputs.is_some(), listed, asked(flag)) {
            (true, true, false) => {
                return Err(ApiError::BadRequest(format!(
                    "output '{name}' needs the input {flag} = true"
                )))
            }
            (false, _, false) => wanted.retain(|(spec, _)| spec.0 != name),
            _ => {}
        }
    }
    let pad = request.params.pad_id.or(request.params.end_id).unwrap_or(0);
    Ok(Prepared::Run(Box::new(InferRun {
        model: handle.clone(),
        shape: AnswerShape {
            logprobs: request.params.return_log_probs,
            prompts: request.prompts.len() * request.params.n,
            n: request.params.n,
            wanted,
            pad,
        },
        request,
    })))
}

/// A required input given under its alias (`max_tokens` for the core model).
fn alias_present(fields: &Fields<'_>, name: &str) -> bool {
    name == "request_output_len" && fields.get("max_tokens").is_some()
}

/// The outputs to send and whether each is binary: those asked for, else all of them.
fn select_outputs(
    model: &str,
    kind: ModelKind,
    req: &InferRequest,
) -> ApiResult<Vec<(&'static OutSpec, bool)>> {
    let default = req.binary_output()?;
    let Some(asked) = &req.outputs else {
        return Ok(outputs(kind).iter().map(|s| (s, default)).collect());
    };
    asked
        .iter()
        .map(|o| {
            let spec = outputs(kind)
                .iter()
                .find(|s| s.0 == o.name)
                .ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "unexpected inference output '{}' for model '{model}'",
                        o.name
                    ))
                })?;
            Ok((spec, o.binary.unwrap_or(default)))
        })
        .collect()
}

/// The generate-style field object of an infer request: one key per input tensor (the
/// prompts as a list, one per row; other inputs as their one row's value), plus `id`.
fn field_object(model: &str, kind: ModelKind, req: &InferRequest) -> ApiResult<Map<String, Value>> {
    let mut object = Map::new();
    if let Some(id) = &req.id {
        object.insert("id".into(), json!(id));
    }
    let lengths = match req.inputs.iter().find(|t| t.name == "input_lengths") {
        Some(t) if kind == ModelKind::Ids => Some(rows(model, &IDS_INPUTS[1], t)?),
        _ => None,
    };
    for t in &req.inputs {
        let spec = inputs(kind).find(|s| s.name == t.name).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "unexpected inference input '{}' for model '{model}'",
                t.name
            ))
        })?;
        if t.datatype != spec.dt {
            return Err(ApiError::BadRequest(format!(
                "inference input '{}' data-type is '{}', but model '{model}' expects '{}'",
                t.name,
                t.datatype.name(),
                spec.dt.name()
            )));
        }
        if object.contains_key(&t.name) {
            return Err(ApiError::BadRequest(format!(
                "input '{}' is given more than once",
                t.name
            )));
        }
        let rows = rows(model, spec, t)?;
        let value = match t.name.as_str() {
            "input_lengths" => continue,
            "text_input" => Value::Array(rows.into_iter().flatten().collect()),
            "input_ids" => Value::Array(trim_ids(rows, lengths.as_deref())?),
            name => one_row(name, rows)?,
        };
        object.insert(t.name.clone(), value);
    }
    Ok(object)
}

/// A tensor's rows (its first dimension is the batch), checked against the model's dims.
/// A tensor without the batch dimension is one row.
fn rows(model: &str, spec: &Spec, t: &Tensor) -> ApiResult<Vec<Vec<Value>>> {
    let inner = if t.shape.len() == spec.dims.len() + 1 {
        &t.shape[1..]
    } else {
        &t.shape[..]
    };
    let fits = inner.len() == spec.dims.len()
        && inner
            .iter()
            .zip(spec.dims)
            .all(|(&d, &want)| want < 0 || d as i64 == want);
    if !fits {
        return Err(ApiError::BadRequest(format!(
            "unexpected shape for input '{}' for model '{model}'. Expected {:?}, got {:?}",
            t.name,
            with_batch(spec.dims),
            t.shape
        )));
    }
    let batch = if inner.len() < t.shape.len() {
        t.shape[0]
    } else {
        1
    };
    if batch == 0 {
        return Err(ApiError::BadRequest(format!(
            "input '{}' has a batch of 0 rows",
            t.name
        )));
    }
    if let Data::Float(v) = &t.data {
        if v.iter().any(|x| !x.is_finite()) {
            return Err(ApiError::BadRequest(format!(
                "input '{}' holds a value that is not finite",
                t.name
            )));
        }
    }
    let values = (0..t.data.len())
        .map(|i| {
            t.data
                .json(i)
                .map_err(|m| ApiError::BadRequest(format!("input '{}': {m}", t.name)))
        })
        .collect::<ApiResult<Vec<_>>>()?;
    let width = values.len() / batch;
    Ok((0..batch)
        .map(|r| values[r * width..(r + 1) * width].to_vec())
        .collect())
}

/// Every row must carry the same value: one request has one set of parameters.
fn one_row(name: &str, mut rows: Vec<Vec<Value>>) -> ApiResult<Value> {
    if rows.iter().any(|r| *r != rows[0]) {
        return Err(ApiError::BadRequest(format!(
            "input '{name}' differs between the {} rows of the batch; this server applies one value to a whole request",
            rows.len()
        )));
    }
    let mut row = rows.swap_remove(0);
    Ok(if row.len() == 1 {
        row.remove(0)
    } else {
        Value::Array(row)
    })
}

/// Each row of `input_ids` cut to its `input_lengths` entry (rows may be padded).
fn trim_ids(rows: Vec<Vec<Value>>, lengths: Option<&[Vec<Value>]>) -> ApiResult<Vec<Value>> {
    let Some(lengths) = lengths else {
        return Ok(rows.into_iter().map(Value::Array).collect());
    };
    if lengths.len() != rows.len() {
        return Err(ApiError::BadRequest(format!(
            "input_lengths has {} rows but input_ids has {}",
            lengths.len(),
            rows.len()
        )));
    }
    rows.into_iter()
        .zip(lengths)
        .enumerate()
        .map(|(i, (mut row, len))| {
            let n = len[0]
                .as_u64()
                .filter(|&n| n as usize <= row.len())
                .ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "input_lengths row {i} is {} but input_ids row {i} holds {} ids",
                        len[0],
                        row.len()
                    ))
                })?;
            row.truncate(n as usize);
            Ok(Value::Array(row))
        })
        .collect()
}

/// One output tensor over the batch; ragged rows are padded (ids with `pad`, 0.0).
fn output(spec: &OutSpec, binary: bool, answers: &[Chunk], shape: &AnswerShape) -> Output {
    let (pad, logprobs, n) = (shape.pad, shape.logprobs, shape.n.max(1));
    let b = answers.len();
    let longest = answers.iter().map(|a| a.token_ids.len()).max().unwrap_or(0);
    let ints = |f: &dyn Fn(usize, &Chunk) -> i128| {
        Data::Int(answers.iter().enumerate().map(|(i, a)| f(i, a)).collect())
    };
    let (shape, data) = match spec.0 {
        "text_output" => (
            vec![b, 1],
            Data::Bytes(
                answers
                    .iter()
                    .map(|a| a.text.clone().into_bytes())
                    .collect(),
            ),
        ),
        "output_ids" => {
            let ids = answers.iter().flat_map(|a| {
                let fill = std::iter::repeat_n(pad, longest - a.token_ids.len());
                a.token_ids.iter().copied().chain(fill).map(i128::from)
            });
            (vec![b, 1, longest], Data::Int(ids.collect()))
        }
        "output_log_probs" => {
            // Zeros when not asked for, as TRT-LLM sends; every row padded to `longest`.
            let lps = answers.iter().flat_map(|a| {
                let real = if logprobs { &a.log_probs[..] } else { &[] };
                let row = real
                    .iter()
                    .map(|&l| f64::from(l))
                    .chain(std::iter::repeat(0.0));
                row.take(longest)
            });
            (vec![b, 1, longest], Data::Float(lps.collect()))
        }
        "cum_log_probs" => {
            let cum = answers
                .iter()
                .map(|a| a.cum_log_prob.filter(|_| logprobs).unwrap_or(0.0) as f64);
            (vec![b, 1], Data::Float(cum.collect()))
        }
        "sequence_length" | "num_output_tokens" => {
            (vec![b, 1], ints(&|_, a| a.token_ids.len() as i128))
        }
        "num_input_tokens" => (vec![b, 1], ints(&|_, a| a.prompt_tokens as i128)),
        // [batch, positions, vocab] and [batch, beam, tokens, vocab], rows padded with 0.
        "context_logits" => {
            let (rows, vocab, data) = logits_tensor(answers, |a| &a.context_logits);
            (vec![b, rows, vocab], data)
        }
        "generation_logits" => {
            let (rows, vocab, data) = logits_tensor(answers, |a| &a.generation_logits);
            (vec![b, 1, rows, vocab], data)
        }
        "batch_index" => (vec![b, 1], ints(&|_, a| (a.batch_index / n) as i128)),
        "sequence_index" => (vec![b, 1], ints(&|_, a| (a.batch_index % n) as i128)),
        _ => (vec![b, 1], ints(&|_, _| 0)),
    };
    Output {
        name: spec.0.to_string(),
        datatype: spec.1,
        shape,
        data,
        binary,
    }
}

/// The logits rows `rows_of` each answer as one tensor: (rows, vocab, data) with every
/// answer's rows padded with zeros to the longest.
fn logits_tensor(
    answers: &[Chunk],
    rows_of: impl Fn(&Chunk) -> &Vec<Vec<f32>>,
) -> (usize, usize, Data) {
    let rows = answers.iter().map(|a| rows_of(a).len()).max().unwrap_or(0);
    let vocab = answers
        .iter()
        .find_map(|a| rows_of(a).first().map(Vec::len))
        .unwrap_or(0);
    let mut data = Vec::with_capacity(answers.len() * rows * vocab);
    for a in answers {
        for r in rows_of(a) {
            data.extend(r.iter().map(|&v| f64::from(v)));
        }
        data.resize(data.len() + (rows - rows_of(a).len()) * vocab, 0.0);
    }
    (rows, vocab, Data::Float(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_input_has_a_known_shape() {
        for kind in [ModelKind::Text, ModelKind::Ids] {
            let names: Vec<_> = inputs(kind).map(|s| s.name).collect();
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(
                unique.len(),
                names.len(),
                "duplicate input names in {kind:?}"
            );
        }
        assert_eq!(IDS_INPUTS[1].name, "input_lengths");
    }
}
