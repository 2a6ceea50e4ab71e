//! Request fields of the Triton generate extension (and of KServe `infer` tensors, which
//! carry the same names): each value may be a scalar or a tensor-shaped list around it,
//! at the top level or under `"parameters"`. Turns them into a [`Request`].

use serde_json::{Map, Value};

use super::{ApiError, ApiResult, ModelKind};
use crate::request::{GenerationParams, Prompt, Request};
use crate::tokenizer::Tokenizer;

/// The fields of one generate call, top level first, then `parameters`.
pub struct Fields<'a> {
    top: &'a Map<String, Value>,
    params: Option<&'a Map<String, Value>>,
}

impl<'a> Fields<'a> {
    pub fn new(body: &'a Value) -> ApiResult<Self> {
        let top = body
            .as_object()
            .ok_or_else(|| ApiError::BadRequest("the request body must be a JSON object".into()))?;
        let params = match top.get("parameters") {
            None | Some(Value::Null) => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => {
                return Err(ApiError::BadRequest(
                    "'parameters' must be a JSON object".into(),
                ))
            }
        };
        Ok(Fields { top, params })
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.top
            .get(key)
            .or_else(|| self.params.and_then(|p| p.get(key)))
            .filter(|v| !v.is_null())
    }

    /// The first of `keys` present, unwrapped from single-element lists.
    fn scalar<'k>(&self, keys: &[&'k str]) -> Option<(&'k str, &'a Value)> {
        keys.iter()
            .find_map(|&k| self.get(k).map(|v| (k, unwrap_single(v))))
    }

    pub fn int(&self, keys: &[&str]) -> ApiResult<Option<i64>> {
        match self.scalar(keys) {
            None => Ok(None),
            Some((k, v)) => v
                .as_i64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                        .map(|f| f as i64)
                })
                .map(Some)
                .ok_or_else(|| wrong_type(k, "an integer", v)),
        }
    }

    pub fn uint(&self, keys: &[&str]) -> ApiResult<Option<u64>> {
        match self.int(keys)? {
            Some(v) if v < 0 => Err(ApiError::BadRequest(format!(
                "'{}' must not be negative, got {v}",
                keys[0]
            ))),
            v => Ok(v.map(|v| v as u64)),
        }
    }

    /// A token id: a non-negative integer that fits 32 bits (never wrapped).
    pub fn token_id(&self, keys: &[&str]) -> ApiResult<Option<u32>> {
        match self.uint(keys)? {
            Some(v) => u32::try_from(v).map(Some).map_err(|_| {
                ApiError::BadRequest(format!(
                    "'{}' must be a token id of at most {}, got {v}",
                    keys[0],
                    u32::MAX
                ))
            }),
            None => Ok(None),
        }
    }

    pub fn float(&self, keys: &[&str]) -> ApiResult<Option<f32>> {
        match self.scalar(keys) {
            None => Ok(None),
            Some((k, v)) => v
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| wrong_type(k, "a number", v)),
        }
    }

    pub fn bool(&self, keys: &[&str]) -> ApiResult<Option<bool>> {
        match self.scalar(keys) {
            None => Ok(None),
            Some((_, Value::Bool(b))) => Ok(Some(*b)),
            Some((_, Value::Number(n))) if n.as_i64() == Some(0) || n.as_i64() == Some(1) => {
                Ok(Some(n.as_i64() == Some(1)))
            }
            Some((k, v)) => Err(wrong_type(k, "a boolean", v)),
        }
    }

    /// A string or a list of strings (flattened); empty strings dropped.
    pub fn strings(&self, key: &str) -> ApiResult<Vec<String>> {
        let Some(v) = self.get(key) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        collect_strings(key, v, &mut out)?;
        out.retain(|s| !s.is_empty());
        Ok(out)
    }
}

fn collect_strings(key: &str, v: &Value, out: &mut Vec<String>) -> ApiResult<()> {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => {
            for i in items {
                collect_strings(key, i, out)?;
            }
        }
        other => return Err(wrong_type(key, "a string or a list of strings", other)),
    }
    Ok(())
}

fn unwrap_single(v: &Value) -> &Value {
    match v {
        Value::Array(items) if items.len() == 1 => unwrap_single(&items[0]),
        other => other,
    }
}

fn wrong_type(key: &str, want: &str, got: &Value) -> ApiError {
    let kind = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    ApiError::BadRequest(format!("'{key}' must be {want}, got {kind}"))
}

/// The request id: `"id"` as a string or a number.
pub fn request_id(fields: &Fields<'_>) -> ApiResult<Option<String>> {
    match fields.top.get("id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(wrong_type("id", "a string", other)),
    }
}

/// The id to cancel, when the body is TRT-LLM's stop request (`"stop": true`).
pub fn stop_target(fields: &Fields<'_>) -> ApiResult<Option<String>> {
    if fields.bool(&["stop"])? != Some(true) {
        return Ok(None);
    }
    request_id(fields)?.map(Some).ok_or_else(|| {
        ApiError::BadRequest("Trying to stop a request but request ID is not provided".into())
    })
}

/// The prompts: `text_input` (a string or a list: a batch) for text models, `input_ids`
/// (a list of ids, or a list of lists: a batch) for the core model.
fn prompts(fields: &Fields<'_>, kind: ModelKind) -> ApiResult<Vec<Prompt>> {
    match kind {
        ModelKind::Text => {
            let v = fields
                .get("text_input")
                .ok_or_else(|| ApiError::BadRequest("'text_input' is required".into()))?;
            let mut texts = Vec::new();
            collect_strings("text_input", v, &mut texts)?;
            if texts.is_empty() {
                return Err(ApiError::BadRequest("'text_input' holds no prompt".into()));
            }
            Ok(texts.into_iter().map(Prompt::Text).collect())
        }
        ModelKind::Ids => {
            let v = fields
                .get("input_ids")
                .ok_or_else(|| ApiError::BadRequest("'input_ids' is required".into()))?;
            let bad = || {
                ApiError::BadRequest(
                    "'input_ids' must be a list of token ids or a list of such lists".into(),
                )
            };
            let as_ids = |v: &Value| -> ApiResult<Vec<u32>> {
                v.as_array()
                    .ok_or_else(bad)?
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .filter(|&i| i <= u32::MAX as u64)
                            .map(|i| i as u32)
                            .ok_or_else(bad)
                    })
                    .collect()
            };
            let items = v.as_array().ok_or_else(bad)?;
            if items.first().is_some_and(|x| x.is_array()) {
                items
                    .iter()
                    .map(|x| as_ids(x).map(Prompt::Tokens))
                    .collect()
            } else {
                Ok(vec![Prompt::Tokens(as_ids(v)?)])
            }
        }
    }
}

/// Builds the request of a generate call. `max_tokens` is required, as in the ensemble.
/// A request's `priority`, which must fit a 32-bit signed integer.
pub fn priority(v: Option<i64>) -> ApiResult<i32> {
    v.map_or(Ok(0), |p| {
        i32::try_from(p).map_err(|_| {
            ApiError::BadRequest(format!(
                "'priority' must be between {} and {}, got {p}",
                i32::MIN,
                i32::MAX
            ))
        })
    })
}

pub fn build_request(
    fields: &Fields<'_>,
    kind: ModelKind,
    tokenizer: &Tokenizer,
    max_seq_len: usize,
) -> ApiResult<Request> {
    let prompts = prompts(fields, kind)?;
    let max_tokens = fields
        .int(&["max_tokens", "request_output_len"])?
        .ok_or_else(|| ApiError::BadRequest("'max_tokens' is required".into()))?;
    if max_tokens < 1 {
        return Err(ApiError::BadRequest(format!(
            "'max_tokens' must be at least 1, got {max_tokens}"
        )));
    }
    if max_tokens as usize >= max_seq_len {
        return Err(ApiError::BadRequest(format!(
            "'max_tokens' {max_tokens} exceeds the model's context length of {max_seq_len} tokens"
        )));
    }
    unsupported(fields)?;
    let d = GenerationParams::default();
    let word_ids = |key: &str| -> ApiResult<Vec<Vec<u32>>> {
        fields
            .strings(key)?
            .iter()
            .map(|w| {
                tokenizer
                    .encode(w, false)
                    .map_err(|e| ApiError::BadRequest(format!("'{key}': {e}")))
            })
            .filter(|r| r.as_ref().map_or(true, |ids| !ids.is_empty()))
            .collect()
    };
    let beam_width = match fields.int(&["beam_width"])? {
        None => 1,
        Some(b) if b >= 1 => b as usize,
        Some(b) => {
            return Err(ApiError::BadRequest(format!(
                "beam_width must be at least 1, got {b}"
            )))
        }
    };
    let asked_returns = fields.int(&["num_return_sequences"])?;
    let returned = num_return_sequences(asked_returns)?;
    let params = GenerationParams {
        max_tokens: max_tokens as usize,
        temperature: fields.float(&["temperature"])?.unwrap_or(d.temperature),
        top_k: fields
            .uint(&["top_k", "runtime_top_k"])?
            .map_or(d.top_k, |v| v as usize),
        top_p: fields
            .float(&["top_p", "runtime_top_p"])?
            .unwrap_or(d.top_p),
        repetition_penalty: fields
            .float(&["repetition_penalty"])?
            .unwrap_or(d.repetition_penalty),
        presence_penalty: fields
            .float(&["presence_penalty"])?
            .unwrap_or(d.presence_penalty),
        frequency_penalty: fields
            .float(&["frequency_penalty"])?
            .unwrap_or(d.frequency_penalty),
        min_length: fields
            .uint(&["min_length", "min_tokens"])?
            .map_or(0, |v| v as usize),
        random_seed: fields.uint(&["random_seed", "seed"])?,
        end_id: fields.token_id(&["end_id"])?,
        pad_id: fields.token_id(&["pad_id"])?,
        bad_words: word_ids("bad_words")?,
        stop_words: Vec::new(),
        stop_strings: fields.strings("stop_words")?,
        return_log_probs: fields.bool(&["return_log_probs"])?.unwrap_or(false),
        exclude_input_in_output: fields.bool(&["exclude_input_in_output"])?.unwrap_or(false),
        stream: fields.bool(&["stream", "streaming"])?.unwrap_or(false),
        stop_after_ms: fields.uint(&["stop_after_ms"])?,
        ignore_eos: fields.bool(&["ignore_eos"])?.unwrap_or(false),
        priority: priority(fields.int(&["priority"])?)?,
        num_draft_tokens: fields.uint(&["num_draft_tokens"])?.map(|v| v as usize),
        use_draft_logits: fields.bool(&["use_draft_logits"])?.unwrap_or(false),
        cache_salt: fields.strings("cache_salt")?.into_iter().next(),
        guide: super::guided::triton_guide(
            fields
                .strings("guided_decoding_guide_type")?
                .first()
                .map(String::as_str),
            fields
                .strings("guided_decoding_guide")?
                .first()
                .map(String::as_str),
        )?,
        compiled_guide: None,
        pooling: None,
        // TensorRT-LLM's min-p sampling (SamplingConfig::minP).
        min_p: fields.float(&["min_p"])?.unwrap_or(d.min_p),
        n: match beam_width {
            1 => returned,
            _ => 1,
        },
        beam_width,
        // With beam search, num_return_sequences is how many of the beams come back.
        beams_returned: match beam_width {
            1 => 0,
            _ => asked_returns.map_or(0, |_| returned),
        },
        length_penalty: fields
            .float(&["length_penalty", "len_penalty"])?
            .unwrap_or(d.length_penalty),
        early_stopping: early_stopping(fields)?.unwrap_or(d.early_stopping),
        return_context_logits: fields.bool(&["return_context_logits"])?.unwrap_or(false),
        return_generation_logits: fields.bool(&["return_generation_logits"])?.unwrap_or(false),
        ..d
    };
    Ok(Request {
        id: request_id(fields)?,
        prompts,
        params,
    })
}

/// TensorRT-LLM's `num_return_sequences`: sequences sampled per prompt (our `n`), each
/// answered with its `sequence_index`.
fn num_return_sequences(v: Option<i64>) -> ApiResult<usize> {
    let most = crate::actors::preprocess::MAX_CHOICES as i64;
    match v {
        None => Ok(1),
        Some(n) if (1..=most).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::BadRequest(format!(
            "num_return_sequences must be between 1 and {most}, got {n}"
        ))),
    }
}

/// TensorRT-LLM's `early_stopping`: an integer, or a boolean (its Triton models declare one).
fn early_stopping(fields: &Fields<'_>) -> ApiResult<Option<i32>> {
    let v = match fields.int(&["early_stopping"]) {
        Ok(v) => v,
        Err(_) => fields.bool(&["early_stopping"])?.map(i64::from),
    };
    v.map(|v| {
        i32::try_from(v).map_err(|_| {
            ApiError::BadRequest(format!("early_stopping must be a small integer, got {v}"))
        })
    })
    .transpose()
}

/// Options we recognise but do not implement: refused with a clear message.
fn unsupported(fields: &Fields<'_>) -> ApiResult<()> {
    let no = |m: String| Err(ApiError::Unsupported(m));
    if let Some(r) = fields.float(&["beam_search_diversity_rate"])? {
        if r != 0.0 {
            return no(format!(
                "beam_search_diversity_rate {r} is not supported: beams are ranked by log-probability alone"
            ));
        }
    }
    for key in ["return_perf_metrics"] {
        if fields.bool(&[key])? == Some(true) {
            return no(format!("'{key}' is not supported yet"));
        }
    }
    if !fields.strings("decoder_text_input")?.is_empty() {
        return no(
            "'decoder_text_input' is for encoder-decoder models; this model is decoder-only".into(),
        );
    }
    Ok(())
}
