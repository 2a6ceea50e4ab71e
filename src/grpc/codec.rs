//! Triton's gRPC messages to and from the request path HTTP's infer shares: a
//! `ModelInferRequest` (typed contents or raw little-endian bytes) becomes the decoded
//! [`InferRequest`], output tensors travel back as raw contents, and the JSON metadata,
//! configuration and statistics the HTTP routes serve become their protobuf messages.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::proto::infer_parameter::ParameterChoice;
use super::proto::model_infer_response::InferOutputTensor;
use super::proto::{self, InferParameter, ModelInferRequest, ModelInferResponse};
use crate::http::tensors::{
    decode_binary, encode_binary, Data, DataType, InferRequest, Output, OutputRequest, Tensor,
};
use crate::http::{ApiError, ApiResult};

/// The request parameter with which a client asks for an empty response carrying only
/// the final flag (tritonclient's `enable_empty_final_response`); the final response
/// always comes here, so it is accepted and needs nothing more.
pub const EMPTY_FINAL: &str = "triton_enable_empty_final_response";
/// The response parameter that marks a stream's last response.
pub const FINAL: &str = "triton_final_response";

fn bad(m: String) -> ApiError {
    ApiError::BadRequest(m)
}

fn param_json(p: &InferParameter) -> Value {
    match &p.parameter_choice {
        Some(ParameterChoice::BoolParam(b)) => json!(b),
        Some(ParameterChoice::Int64Param(i)) => json!(i),
        Some(ParameterChoice::StringParam(s)) => json!(s),
        Some(ParameterChoice::DoubleParam(d)) => json!(d),
        Some(ParameterChoice::Uint64Param(u)) => json!(u),
        None => Value::Null,
    }
}

/// A bool parameter.
pub fn bool_param(b: bool) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::BoolParam(b)),
    }
}

/// The decoded request.
pub fn infer_request(r: ModelInferRequest) -> ApiResult<InferRequest> {
    let mut parameters = Map::new();
    for (k, v) in &r.parameters {
        if k == EMPTY_FINAL {
            continue;
        } else if k.starts_with("triton_") {
            return Err(bad(format!(
                "request parameter '{k}': names starting with 'triton_' are reserved"
            )));
        } else {
            parameters.insert(k.clone(), param_json(v));
        }
    }
    if !r.raw_input_contents.is_empty() && r.raw_input_contents.len() != r.inputs.len() {
        return Err(bad(format!(
            "raw_input_contents holds {} entries for {} inputs; give every input's data raw, or none",
            r.raw_input_contents.len(),
            r.inputs.len()
        )));
    }
    let inputs = r
        .inputs
        .into_iter()
        .enumerate()
        .map(|(i, t)| input(t, r.raw_input_contents.get(i).map(Vec::as_slice)))
        .collect::<ApiResult<Vec<_>>>()?;
    let outputs = (!r.outputs.is_empty())
        .then(|| {
            r.outputs
                .into_iter()
                .map(|o| {
                    if o.parameters.contains_key("shared_memory_region") {
                        return Err(ApiError::Unsupported(format!(
                            "output '{}': shared memory is not supported by this server",
                            o.name
                        )));
                    }
                    if o.parameters.contains_key("classification") {
                        return Err(ApiError::Unsupported(format!(
                            "output '{}': the classification extension is not supported",
                            o.name
                        )));
                    }
                    Ok(OutputRequest {
                        name: o.name,
                        binary: None,
                    })
                })
                .collect::<ApiResult<Vec<_>>>()
        })
        .transpose()?;
    let id = (!r.id.is_empty()).then_some(r.id);
    Ok(InferRequest {
        id,
        parameters,
        inputs,
        outputs,
    })
}

fn input(t: proto::model_infer_request::InferInputTensor, raw: Option<&[u8]>) -> ApiResult<Tensor> {
    let name = t.name;
    let dt = DataType::parse(&t.datatype)
        .ok_or_else(|| bad(format!("input '{name}': unknown datatype '{}'", t.datatype)))?;
    if t.parameters.contains_key("shared_memory_region") {
        return Err(ApiError::Unsupported(format!(
            "input '{name}': shared memory is not supported by this server"
        )));
    }
    let shape = t
        .shape
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                bad(format!(
                    "input '{name}': negative dimension {d} in its shape"
                ))
            })
        })
        .collect::<ApiResult<Vec<usize>>>()?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(format!("input '{name}': its shape {shape:?} is too large")))?;
    let data = match raw {
        Some(blob) => decode_binary(&name, dt, blob, count)?,
        None => typed(&name, dt, t.contents.unwrap_or_default())?,
    };
    if data.len() != count {
        return Err(bad(format!(
            "input '{name}': shape {shape:?} holds {count} elements but {} were given",
            data.len()
        )));
    }
    if let (Data::Int(v), Some((lo, hi))) = (&data, dt.int_range()) {
        if let Some(x) = v.iter().find(|&&x| x < lo || x > hi) {
            return Err(bad(format!(
                "input '{name}': {x} is out of range for {}",
                dt.name()
            )));
        }
    }
    Ok(Tensor {
        name,
        datatype: dt,
        shape,
        data,
    })
}

/// Data from the typed `contents` field that holds `dt`.
fn typed(name: &str, dt: DataType, c: proto::InferTensorContents) -> ApiResult<Data> {
    use DataType::*;
    let ints = |v: Vec<i128>| Data::Int(v);
    Ok(match dt {
        Bool => Data::Bool(c.bool_contents),
        I8 | I16 | I32 => ints(c.int_contents.into_iter().map(i128::from).collect()),
        I64 => ints(c.int64_contents.into_iter().map(i128::from).collect()),
        U8 | U16 | U32 => ints(c.uint_contents.into_iter().map(i128::from).collect()),
        U64 => ints(c.uint64_contents.into_iter().map(i128::from).collect()),
        F32 => Data::Float(c.fp32_contents.into_iter().map(f64::from).collect()),
        F64 => Data::Float(c.fp64_contents),
        Bytes => Data::Bytes(c.bytes_contents),
        F16 | Bf16 => {
            return Err(bad(format!(
                "input '{name}': {} data must come in raw_input_contents",
                dt.name()
            )))
        }
    })
}

/// A response of `model` carrying `outputs` as raw contents; `last` sets the final flag
/// (a stream's responses carry it, false on all but the last).
pub fn infer_response(
    model: &str,
    id: Option<&str>,
    outputs: Vec<Output>,
    last: Option<bool>,
) -> ModelInferResponse {
    let mut raw = Vec::with_capacity(outputs.len());
    let tensors = outputs
        .into_iter()
        .map(|o| {
            let mut bytes = Vec::new();
            encode_binary(o.datatype, &o.data, &mut bytes);
            raw.push(bytes);
            InferOutputTensor {
                name: o.name,
                datatype: o.datatype.name().into(),
                shape: o.shape.iter().map(|&d| d as i64).collect(),
                parameters: HashMap::new(),
                contents: None,
            }
        })
        .collect();
    let parameters = last
        .map(|l| HashMap::from([(FINAL.to_string(), bool_param(l))]))
        .unwrap_or_default();
    ModelInferResponse {
        model_name: model.into(),
        model_version: "1".into(),
        id: id.unwrap_or_default().into(),
        parameters,
        outputs: tensors,
        raw_output_contents: raw,
    }
}

/// The HTTP route's metadata JSON as its message.
pub fn metadata(v: &Value) -> proto::ModelMetadataResponse {
    use proto::model_metadata_response::TensorMetadata;
    let tensors = |key: &str| {
        v[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| TensorMetadata {
                name: str_of(&t["name"]),
                datatype: str_of(&t["datatype"]),
                shape: ints_of(&t["shape"]),
            })
            .collect()
    };
    proto::ModelMetadataResponse {
        name: str_of(&v["name"]),
        versions: vec!["1".into()],
        platform: str_of(&v["platform"]),
        inputs: tensors("inputs"),
        outputs: tensors("outputs"),
    }
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn ints_of(v: &Value) -> Vec<i64> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_i64)
        .collect()
}

fn data_type(v: &Value) -> i32 {
    proto::DataType::from_str_name(v.as_str().unwrap_or_default())
        .unwrap_or(proto::DataType::TypeInvalid) as i32
}

/// The HTTP route's configuration JSON (protobuf field names) as its message.
pub fn config(v: &Value) -> proto::ModelConfig {
    use proto::model_config::SchedulingChoice;
    let inputs = v["input"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| proto::ModelInput {
            name: str_of(&t["name"]),
            data_type: data_type(&t["data_type"]),
            dims: ints_of(&t["dims"]),
            optional: t["optional"].as_bool().unwrap_or(false),
            ..Default::default()
        })
        .collect();
    let outputs = v["output"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| proto::ModelOutput {
            name: str_of(&t["name"]),
            data_type: data_type(&t["data_type"]),
            dims: ints_of(&t["dims"]),
            ..Default::default()
        })
        .collect();
    let map = |m: &Value| -> HashMap<String, String> {
        m.as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), str_of(v)))
            .collect()
    };
    let scheduling = match v.get("ensemble_scheduling") {
        Some(e) => SchedulingChoice::EnsembleScheduling(proto::ModelEnsembling {
            step: e["step"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| proto::model_ensembling::Step {
                    model_name: str_of(&s["model_name"]),
                    model_version: s["model_version"].as_i64().unwrap_or(-1),
                    input_map: map(&s["input_map"]),
                    output_map: map(&s["output_map"]),
                    model_namespace: String::new(),
                })
                .collect(),
            max_inflight_requests: 0,
        }),
        None => SchedulingChoice::DynamicBatching(Default::default()),
    };
    proto::ModelConfig {
        name: str_of(&v["name"]),
        platform: str_of(&v["platform"]),
        backend: str_of(&v["backend"]),
        version_policy: Some(proto::ModelVersionPolicy {
            policy_choice: Some(proto::model_version_policy::PolicyChoice::Latest(
                proto::model_version_policy::Latest { num_versions: 1 },
            )),
        }),
        max_batch_size: v["max_batch_size"].as_i64().unwrap_or(0) as i32,
        input: inputs,
        output: outputs,
        model_transaction_policy: Some(proto::ModelTransactionPolicy {
            decoupled: v["model_transaction_policy"]["decoupled"]
                .as_bool()
                .unwrap_or(false),
        }),
        scheduling_choice: Some(scheduling),
        ..Default::default()
    }
}

/// The HTTP route's statistics JSON as its message.
pub fn statistics(v: &Value) -> proto::ModelStatisticsResponse {
    let duration = |d: &Value| {
        Some(proto::StatisticDuration {
            count: d["count"].as_u64().unwrap_or(0),
            ns: d["ns"].as_u64().unwrap_or(0),
        })
    };
    let model_stats = v["model_stats"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let s = &m["inference_stats"];
            proto::ModelStatistics {
                name: str_of(&m["name"]),
                version: str_of(&m["version"]),
                last_inference: m["last_inference"].as_u64().unwrap_or(0),
                inference_count: m["inference_count"].as_u64().unwrap_or(0),
                execution_count: m["execution_count"].as_u64().unwrap_or(0),
                inference_stats: Some(proto::InferStatistics {
                    success: duration(&s["success"]),
                    fail: duration(&s["fail"]),
                    queue: duration(&s["queue"]),
                    compute_input: duration(&s["compute_input"]),
                    compute_infer: duration(&s["compute_infer"]),
                    compute_output: duration(&s["compute_output"]),
                    cache_hit: duration(&s["cache_hit"]),
                    cache_miss: duration(&s["cache_miss"]),
                }),
                ..Default::default()
            }
        })
        .collect();
    proto::ModelStatisticsResponse { model_stats }
}

#[cfg(test)]
mod tests;
