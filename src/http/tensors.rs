//! The KServe v2 tensor codec: an `infer` body (JSON tensors, or the binary tensor
//! extension: a JSON header of `Inference-Header-Content-Length` bytes followed by one
//! blob per input that carries `parameters.binary_data_size`, in `inputs` order) in, and
//! the response (JSON `data`, or binary blobs after the JSON header) out.
//!
//! Binary elements are little-endian, row-major, unpadded; BYTES elements are a u32 LE
//! length followed by that many bytes; BOOL is one byte. Every malformed body is a 400
//! that names the tensor and the problem.

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderValue;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::{ApiError, ApiResult};

/// The header that splits a binary request or response into JSON and blobs.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// A KServe datatype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    Bf16,
    F32,
    F64,
    Bytes,
}

const ALL: [(DataType, &str); 14] = [
    (DataType::Bool, "BOOL"),
    (DataType::U8, "UINT8"),
    (DataType::U16, "UINT16"),
    (DataType::U32, "UINT32"),
    (DataType::U64, "UINT64"),
    (DataType::I8, "INT8"),
    (DataType::I16, "INT16"),
    (DataType::I32, "INT32"),
    (DataType::I64, "INT64"),
    (DataType::F16, "FP16"),
    (DataType::Bf16, "BF16"),
    (DataType::F32, "FP32"),
    (DataType::F64, "FP64"),
    (DataType::Bytes, "BYTES"),
];

impl DataType {
    pub fn parse(s: &str) -> Option<DataType> {
        ALL.iter().find(|(_, n)| *n == s).map(|(d, _)| *d)
    }

    /// The protocol name (`INT32`).
    pub fn name(self) -> &'static str {
        ALL.iter()
            .find(|(d, _)| *d == self)
            .map_or("BYTES", |(_, n)| n)
    }

    /// The model-configuration name (`TYPE_INT32`; BYTES is `TYPE_STRING` there).
    pub fn config_name(self) -> String {
        match self {
            DataType::Bytes => "TYPE_STRING".into(),
            d => format!("TYPE_{}", d.name()),
        }
    }

    /// Bytes per element; None for BYTES (variable length).
    fn size(self) -> Option<usize> {
        use DataType::*;
        match self {
            Bool | U8 | I8 => Some(1),
            U16 | I16 | F16 | Bf16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            Bytes => None,
        }
    }

    /// The inclusive range of an integer type, as i128 so every type fits.
    pub(crate) fn int_range(self) -> Option<(i128, i128)> {
        use DataType::*;
        let r = match self {
            U8 => (0, u8::MAX as i128),
            U16 => (0, u16::MAX as i128),
            U32 => (0, u32::MAX as i128),
            U64 => (0, u64::MAX as i128),
            I8 => (i8::MIN as i128, i8::MAX as i128),
            I16 => (i16::MIN as i128, i16::MAX as i128),
            I32 => (i32::MIN as i128, i32::MAX as i128),
            I64 => (i64::MIN as i128, i64::MAX as i128),
            _ => return None,
        };
        Some(r)
    }
}

/// A tensor's elements, row-major. Integers of every width share `Int`, floats `Float`.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Bool(Vec<bool>),
    Int(Vec<i128>),
    Float(Vec<f64>),
    Bytes(Vec<Vec<u8>>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::Bool(v) => v.len(),
            Data::Int(v) => v.len(),
            Data::Float(v) => v.len(),
            Data::Bytes(v) => v.len(),
        }
    }

    /// Element `i` as JSON (BYTES as a UTF-8 string).
    pub fn json(&self, i: usize) -> Result<Value, String> {
        Ok(match self {
            Data::Bool(v) => json!(v[i]),
            Data::Int(v) if v[i] < 0 => json!(v[i] as i64),
            Data::Int(v) => json!(v[i] as u64),
            Data::Float(v) => json!(v[i]),
            Data::Bytes(v) => json!(std::str::from_utf8(&v[i])
                .map_err(|_| format!("element {i} is not valid UTF-8"))?),
        })
    }
}

/// One input tensor of a request.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<usize>,
    pub data: Data,
}

/// An output the client asked for, and how: `binary` is the per-output override.
#[derive(Debug, Clone)]
pub struct OutputRequest {
    pub name: String,
    pub binary: Option<bool>,
}

/// A decoded `infer` request.
#[derive(Debug, Clone)]
pub struct InferRequest {
    pub id: Option<String>,
    pub parameters: Map<String, Value>,
    pub inputs: Vec<Tensor>,
    /// None: the client named no outputs (it gets them all).
    pub outputs: Option<Vec<OutputRequest>>,
}

impl InferRequest {
    /// `parameters.binary_data_output`: the default for outputs without their own choice.
    pub fn binary_output(&self) -> ApiResult<bool> {
        match self.parameters.get("binary_data_output") {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(bad(
                "request parameter 'binary_data_output' must be a boolean".into(),
            )),
        }
    }
}

fn bad(m: String) -> ApiError {
    ApiError::BadRequest(m)
}

/// Splits and decodes a body. `header_length` is `Inference-Header-Content-Length`.
pub fn decode_request(body: &[u8], header_length: Option<&HeaderValue>) -> ApiResult<InferRequest> {
    let (head, mut blobs) = split_body(body, header_length)?;
    let head: Value = serde_json::from_slice(head).map_err(|e| {
        let hint = if header_length.is_none() {
            " (binary tensors need the Inference-Header-Content-Length header)"
        } else {
            ""
        };
        bad(format!(
            "malformed JSON in the inference request: {e}{hint}"
        ))
    })?;
    let head = head
        .as_object()
        .ok_or_else(|| bad("the inference request must be a JSON object".into()))?;
    let id = match head.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("'id' must be a string".into())),
    };
    let parameters = object(head.get("parameters"), "the request's 'parameters'")?;
    let inputs = match head.get("inputs") {
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => {
            return Err(bad("the inference request has no 'inputs'".into()))
        }
        Some(_) => return Err(bad("'inputs' must be a list of tensors".into())),
    };
    let mut decoded = Vec::with_capacity(inputs.len());
    for (i, input) in inputs.iter().enumerate() {
        decoded.push(decode_input(i, input, &mut blobs)?);
    }
    if !blobs.is_empty() {
        return Err(bad(format!(
            "{} bytes of binary data follow the inputs' binary_data_size total; the sizes do not add up",
            blobs.len()
        )));
    }
    let outputs = match head.get("outputs") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .enumerate()
                .map(|(i, o)| decode_output(i, o))
                .collect::<ApiResult<_>>()?,
        ),
        Some(_) => return Err(bad("'outputs' must be a list".into())),
    };
    Ok(InferRequest {
        id,
        parameters,
        inputs: decoded,
        outputs,
    })
}

/// The JSON header and the binary part, split where `Inference-Header-Content-Length` says.
fn split_body<'a>(
    body: &'a [u8],
    header_length: Option<&HeaderValue>,
) -> ApiResult<(&'a [u8], &'a [u8])> {
    let json_len = match header_length {
        None => body.len(),
        Some(h) => {
            let n: usize = h
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| {
                    bad(format!(
                        "the Inference-Header-Content-Length header {h:?} is not a byte count"
                    ))
                })?;
            if n > body.len() {
                return Err(bad(format!(
                    "Inference-Header-Content-Length is {n} but the request body holds only {} bytes",
                    body.len()
                )));
            }
            if n == 0 {
                return Err(ApiError::Unsupported(
                    "raw binary requests (Inference-Header-Content-Length: 0) are only for single-input models; send a JSON header".into(),
                ));
            }
            n
        }
    };
    if json_len == 0 {
        return Err(bad(
            "the request body is empty; expected a JSON inference request".into(),
        ));
    }
    Ok(body.split_at(json_len))
}

fn object(v: Option<&Value>, what: &str) -> ApiResult<Map<String, Value>> {
    match v {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(_) => Err(bad(format!("{what} must be a JSON object"))),
    }
}

fn decode_input(index: usize, v: &Value, blobs: &mut &[u8]) -> ApiResult<Tensor> {
    let t = v
        .as_object()
        .ok_or_else(|| bad(format!("input {index} must be a JSON object")))?;
    let name = match t.get("name") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(bad(format!("input {index} has no 'name'"))),
    };
    let datatype = match t.get("datatype") {
        Some(Value::String(s)) => DataType::parse(s)
            .ok_or_else(|| bad(format!("input '{name}' has an unknown datatype '{s}'")))?,
        _ => return Err(bad(format!("input '{name}' has no 'datatype'"))),
    };
    let shape = decode_shape(&name, t.get("shape"))?;
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("input '{name}': shape {shape:?} is too large")))?;
    let params = object(t.get("parameters"), &format!("input '{name}' 'parameters'"))?;
    if params.contains_key("shared_memory_region") {
        return Err(ApiError::Unsupported(format!(
            "input '{name}': shared memory is not supported by this server"
        )));
    }
    let data = match params.get("binary_data_size") {
        None | Some(Value::Null) => {
            let data = t.get("data").ok_or_else(|| {
                bad(format!(
                    "input '{name}' has neither 'data' nor parameters.binary_data_size"
                ))
            })?;
            let mut flat = Vec::new();
            flatten(data, &mut flat);
            decode_json(&name, datatype, &flat)?
        }
        Some(size) => {
            if t.contains_key("data") {
                return Err(bad(format!(
                    "input '{name}' has both 'data' and parameters.binary_data_size"
                )));
            }
            let size = size.as_u64().ok_or_else(|| {
                bad(format!(
                    "input '{name}': binary_data_size must be a non-negative integer"
                ))
            })? as usize;
            if size > blobs.len() {
                return Err(bad(format!(
                    "input '{name}': binary_data_size is {size} but only {} bytes of binary data are left{}",
                    blobs.len(),
                    if blobs.is_empty() { " (is the Inference-Header-Content-Length header missing?)" } else { "" }
                )));
            }
            let (blob, rest) = blobs.split_at(size);
            *blobs = rest;
            decode_binary(&name, datatype, blob, count)?
        }
    };
    if data.len() != count {
        return Err(bad(format!(
            "input '{name}' has {} elements but its shape {shape:?} needs {count}",
            data.len()
        )));
    }
    Ok(Tensor {
        name,
        datatype,
        shape,
        data,
    })
}

fn decode_shape(name: &str, v: Option<&Value>) -> ApiResult<Vec<usize>> {
    let items = v
        .and_then(Value::as_array)
        .ok_or_else(|| bad(format!("input '{name}' has no 'shape' list")))?;
    items
        .iter()
        .map(|d| {
            d.as_u64().map(|d| d as usize).ok_or_else(|| {
                bad(format!(
                    "input '{name}': shape dimensions must be non-negative integers, got {d}"
                ))
            })
        })
        .collect()
}

fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other),
    }
}

fn decode_json(name: &str, dt: DataType, items: &[&Value]) -> ApiResult<Data> {
    let wrong = |i: usize, v: &Value| {
        bad(format!(
            "input '{name}': element {i} ({v}) is not a valid {} value",
            dt.name()
        ))
    };
    Ok(match dt {
        DataType::Bool => Data::Bool(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| v.as_bool().ok_or_else(|| wrong(i, v)))
                .collect::<ApiResult<_>>()?,
        ),
        DataType::Bytes => Data::Bytes(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str()
                        .map(|s| s.as_bytes().to_vec())
                        .ok_or_else(|| wrong(i, v))
                })
                .collect::<ApiResult<_>>()?,
        ),
        DataType::F16 | DataType::F32 | DataType::F64 => Data::Float(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| v.as_f64().ok_or_else(|| wrong(i, v)))
                .collect::<ApiResult<_>>()?,
        ),
        DataType::Bf16 => {
            return Err(bad(format!(
                "input '{name}': BF16 data can only be sent in binary"
            )))
        }
        int => {
            let (lo, hi) = int.int_range().expect("integer type");
            let one = |i: usize, v: &Value| {
                let x = v
                    .as_i64()
                    .map(i128::from)
                    .or_else(|| v.as_u64().map(i128::from));
                x.filter(|x| (lo..=hi).contains(x))
                    .ok_or_else(|| wrong(i, v))
            };
            Data::Int(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| one(i, v))
                    .collect::<ApiResult<_>>()?,
            )
        }
    })
}

pub(crate) fn decode_binary(
    name: &str,
    dt: DataType,
    blob: &[u8],
    count: usize,
) -> ApiResult<Data> {
    let Some(size) = dt.size() else {
        return decode_bytes(name, blob, count);
    };
    if Some(blob.len()) != count.checked_mul(size) {
        return Err(bad(format!(
            "input '{name}': binary_data_size is {} bytes but {count} {} elements take {}",
            blob.len(),
            dt.name(),
            count.saturating_mul(size)
        )));
    }
    let chunks = blob.chunks_exact(size);
    let le = |c: &[u8]| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(b)
    };
    use DataType::*;
    Ok(match dt {
        Bool => Data::Bool(
            blob.iter()
                .enumerate()
                .map(|(i, &b)| match b {
                    0 | 1 => Ok(b == 1),
                    _ => Err(bad(format!(
                        "input '{name}': BOOL element {i} is byte {b}, not 0 or 1"
                    ))),
                })
                .collect::<ApiResult<_>>()?,
        ),
        U8 | U16 | U32 | U64 => Data::Int(chunks.map(|c| le(c) as i128).collect()),
        I8 => Data::Int(chunks.map(|c| c[0] as i8 as i128).collect()),
        I16 => Data::Int(chunks.map(|c| le(c) as u16 as i16 as i128).collect()),
        I32 => Data::Int(chunks.map(|c| le(c) as u32 as i32 as i128).collect()),
        I64 => Data::Int(chunks.map(|c| le(c) as i64 as i128).collect()),
        F16 => Data::Float(
            chunks
                .map(|c| half::f16::from_bits(le(c) as u16).to_f64())
                .collect(),
        ),
        Bf16 => Data::Float(
            chunks
                .map(|c| half::bf16::from_bits(le(c) as u16).to_f64())
                .collect(),
        ),
        F32 => Data::Float(
            chunks
                .map(|c| f32::from_bits(le(c) as u32) as f64)
                .collect(),
        ),
        F64 => Data::Float(chunks.map(|c| f64::from_bits(le(c))).collect()),
        Bytes => unreachable!("BYTES has no fixed size"),
    })
}

/// BYTES: a u32 LE length, then that many bytes, per element.
fn decode_bytes(name: &str, mut blob: &[u8], count: usize) -> ApiResult<Data> {
    let mut out = Vec::with_capacity(count.min(blob.len() / 4));
    while !blob.is_empty() {
        let i = out.len();
        if blob.len() < 4 {
            return Err(bad(format!(
                "input '{name}': BYTES element {i} has a truncated length prefix ({} bytes)",
                blob.len()
            )));
        }
        let n = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
        if n > blob.len() - 4 {
            return Err(bad(format!(
                "input '{name}': BYTES element {i} claims {n} bytes but only {} remain in its binary data",
                blob.len() - 4
            )));
        }
        out.push(blob[4..4 + n].to_vec());
        blob = &blob[4 + n..];
    }
    Ok(Data::Bytes(out))
}

fn decode_output(index: usize, v: &Value) -> ApiResult<OutputRequest> {
    let o = v
        .as_object()
        .ok_or_else(|| bad(format!("output {index} must be a JSON object")))?;
    let name = match o.get("name") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(bad(format!("output {index} has no 'name'"))),
    };
    let params = object(
        o.get("parameters"),
        &format!("output '{name}' 'parameters'"),
    )?;
    if params.contains_key("shared_memory_region") {
        return Err(ApiError::Unsupported(format!(
            "output '{name}': shared memory is not supported by this server"
        )));
    }
    if params.get("classification").is_some_and(|c| !c.is_null()) {
        return Err(ApiError::Unsupported(format!(
            "output '{name}': the classification extension is not supported"
        )));
    }
    let binary = match params.get("binary_data") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(bad(format!(
                "output '{name}': parameters.binary_data must be a boolean"
            )))
        }
    };
    Ok(OutputRequest { name, binary })
}

/// One output tensor of a response, and whether it travels as a binary blob.
#[derive(Debug, Clone)]
pub struct Output {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<usize>,
    pub data: Data,
    pub binary: bool,
}

/// The response: JSON when every output is in JSON, else the JSON header and the blobs.
pub fn encode_response(mut head: Map<String, Value>, outputs: Vec<Output>) -> ApiResult<Response> {
    let mut blobs = Vec::new();
    let mut entries = Vec::with_capacity(outputs.len());
    for o in &outputs {
        let mut e = Map::new();
        e.insert("name".into(), json!(o.name));
        e.insert("datatype".into(), json!(o.datatype.name()));
        e.insert("shape".into(), json!(o.shape));
        if o.binary {
            let before = blobs.len();
            encode_binary(o.datatype, &o.data, &mut blobs);
            e.insert(
                "parameters".into(),
                json!({"binary_data_size": blobs.len() - before}),
            );
        } else {
            let data = (0..o.data.len())
                .map(|i| o.data.json(i))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|m| ApiError::Internal(format!("output '{}': {m}", o.name)))?;
            e.insert("data".into(), Value::Array(data));
        }
        entries.push(Value::Object(e));
    }
    head.insert("outputs".into(), Value::Array(entries));
    let json =
        serde_json::to_vec(&Value::Object(head)).map_err(|e| ApiError::Internal(e.to_string()))?;
    let builder = Response::builder().status(200);
    let response = if outputs.iter().any(|o| o.binary) {
        let json_len = json.len();
        let mut body = json;
        body.extend_from_slice(&blobs);
        builder
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(HEADER_LENGTH, json_len)
            .body(Body::from(body))
    } else {
        builder
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(json))
    };
    response.map_err(|e| ApiError::Internal(e.to_string()))
}

pub(crate) fn encode_binary(dt: DataType, data: &Data, out: &mut Vec<u8>) {
    use DataType::*;
    match data {
        Data::Bool(v) => out.extend(v.iter().map(|&b| b as u8)),
        Data::Bytes(v) => {
            for b in v {
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
        }
        Data::Int(v) => {
            let size = dt.size().unwrap_or(8);
            for &x in v {
                out.extend_from_slice(&(x as i64).to_le_bytes()[..size]);
            }
        }
        Data::Float(v) => {
            for &x in v {
                match dt {
                    F16 => out.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
                    Bf16 => out.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
                    F64 => out.extend_from_slice(&x.to_le_bytes()),
                    _ => out.extend_from_slice(&(x as f32).to_le_bytes()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(n: usize) -> HeaderValue {
        HeaderValue::from_str(&n.to_string()).unwrap()
    }

    /// The request tritonclient sends by default (PROTOCOL.md §2).
    fn binary_body() -> (Vec<u8>, usize) {
        let json = br#"{"id":"r1","inputs":[{"name":"text_input","shape":[1,1],"datatype":"BYTES","parameters":{"binary_data_size":6}},{"name":"max_tokens","shape":[1,1],"datatype":"INT32","parameters":{"binary_data_size":4}}],"parameters":{"binary_data_output":true}}"#;
        let mut body = json.to_vec();
        body.extend_from_slice(b"\x02\x00\x00\x00Hi\x08\x00\x00\x00");
        (body, json.len())
    }

    #[test]
    fn decodes_tritonclients_binary_request() {
        let (body, n) = binary_body();
        let r = decode_request(&body, Some(&header(n))).unwrap();
        assert_eq!(r.id.as_deref(), Some("r1"));
        assert!(r.binary_output().unwrap());
        assert_eq!(r.inputs[0].data, Data::Bytes(vec![b"Hi".to_vec()]));
        assert_eq!(r.inputs[1].data, Data::Int(vec![8]));
        assert_eq!(r.inputs[1].shape, vec![1, 1]);
    }

    #[test]
    fn decodes_flat_and_nested_json() {
        let body = br#"{"inputs":[{"name":"a","shape":[2,2],"datatype":"INT64","data":[[1,-2],[3,4]]},{"name":"b","shape":[1],"datatype":"FP32","data":[0.5]}]}"#;
        let r = decode_request(body, None).unwrap();
        assert_eq!(r.inputs[0].data, Data::Int(vec![1, -2, 3, 4]));
        assert_eq!(r.inputs[1].data, Data::Float(vec![0.5]));
    }

    #[test]
    fn every_dtype_round_trips_through_binary() {
        use DataType::*;
        let cases = [
            (Bool, Data::Bool(vec![true, false])),
            (U8, Data::Int(vec![0, 255])),
            (I8, Data::Int(vec![-128, 127])),
            (U16, Data::Int(vec![1, 65535])),
            (I16, Data::Int(vec![-3, 3])),
            (U32, Data::Int(vec![7, u32::MAX as i128])),
            (I32, Data::Int(vec![-7, 9])),
            (U64, Data::Int(vec![u64::MAX as i128, 1])),
            (I64, Data::Int(vec![i64::MIN as i128, 5])),
            (F16, Data::Float(vec![0.5, -2.0])),
            (Bf16, Data::Float(vec![1.0, -0.25])),
            (F32, Data::Float(vec![0.25, 3.5])),
            (F64, Data::Float(vec![1e-300, -1.5])),
            (
                Bytes,
                Data::Bytes(vec![b"".to_vec(), "é\0x".as_bytes().to_vec()]),
            ),
        ];
        for (dt, data) in cases {
            let mut blob = Vec::new();
            encode_binary(dt, &data, &mut blob);
            assert_eq!(decode_binary("t", dt, &blob, 2).unwrap(), data, "{dt:?}");
        }
    }

    #[test]
    fn malformed_bodies_are_named() {
        let int32 = r#"{"inputs":[{"name":"a","shape":[1],"datatype":"INT32","parameters":{"binary_data_size":SIZE}}]}"#;
        let cases: [(String, Option<&str>, &str); 9] = [
            ("{".into(), None, "malformed JSON"),
            (
                r#"{"inputs":[{"name":"a","shape":[1],"datatype":"INT33","data":[1]}]}"#.into(),
                None,
                "unknown datatype 'INT33'",
            ),
            (
                r#"{"inputs":[{"name":"a","shape":[2],"datatype":"INT32","data":[1]}]}"#.into(),
                None,
                "has 1 elements but its shape [2] needs 2",
            ),
            (
                r#"{"inputs":[{"name":"a","shape":[1],"datatype":"INT8","data":[300]}]}"#.into(),
                None,
                "not a valid INT8",
            ),
            (
                r#"{"inputs":[{"name":"a","shape":[-1],"datatype":"INT8","data":[3]}]}"#.into(),
                None,
                "non-negative",
            ),
            (int32.replace("SIZE", "4"), None, "header missing"),
            (
                int32.replace("SIZE", "4"),
                Some("xxxxx"),
                "sizes do not add up",
            ),
            (int32.replace("SIZE", "3"), Some("xxx"), "take 4"),
            ("{}".into(), Some(""), "holds only 2 bytes"),
        ];
        for (json, tail, want) in cases {
            let mut body = json.clone().into_bytes();
            let h = tail.map(|t| {
                body.extend_from_slice(t.as_bytes());
                header(if want.contains("holds only") {
                    500
                } else {
                    json.len()
                })
            });
            let err = decode_request(&body, h.as_ref()).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
        }
        let err = decode_bytes("s", b"\x09\x00\x00\x00abc", 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("claims 9 bytes"), "{err}");
    }
}
