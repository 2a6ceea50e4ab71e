//! `POST /v1/embeddings` (OpenAI's shape): each input (a string, a list of strings, a
//! list of token ids or a list of such lists) becomes one prompt of an embedding request
//! (`GenerationParams::embedding`, with the model's configured pooling), run by the
//! engine like a generation of no tokens; the answer holds each prompt's final hidden
//! state pooled and L2-normalized, as floats or as base64 of little-endian f32 (what the
//! official client asks for by default). `dimensions` is refused: truncating a vector is
//! only meaningful for models trained for it.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use futures::StreamExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::json_body::parse;
use super::openai::{named_model, request_id, with_request_id};
use super::{ApiError, ApiResult, AppState};
use crate::request::{GenerationParams, Prompt, Request};

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/embeddings", post(embeddings))
}

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    /// A served model name.
    pub model: String,
    /// What to embed: each string or token-id list is one input.
    pub input: EmbeddingInput,
    /// `float` (default) or `base64` (little-endian f32).
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    /// Not supported: refused when set.
    pub dimensions: Option<u32>,
    /// Accepted and ignored.
    #[allow(dead_code)]
    pub user: Option<String>,
}

/// The inputs of an embedding request.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

impl EmbeddingInput {
    /// The prompts, one per input; an empty list is refused.
    fn prompts(self) -> ApiResult<Vec<Prompt>> {
        let prompts: Vec<Prompt> = match self {
            EmbeddingInput::Text(t) => vec![Prompt::Text(t)],
            EmbeddingInput::Texts(ts) => ts.into_iter().map(Prompt::Text).collect(),
            EmbeddingInput::Tokens(ids) => vec![Prompt::Tokens(ids)],
            EmbeddingInput::TokenLists(lists) => lists.into_iter().map(Prompt::Tokens).collect(),
        };
        if prompts.is_empty() {
            return Err(ApiError::BadRequest("'input' is an empty list".into()));
        }
        Ok(prompts)
    }
}

/// How each vector is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    /// A list of numbers.
    #[default]
    Float,
    /// Base64 of the vector's little-endian f32 bytes.
    Base64,
}

/// The answer of `POST /v1/embeddings`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EmbeddingResponse {
    /// Always `list`.
    pub object: &'static str,
    /// One per input, in order.
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

/// One input's embedding.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Embedding {
    /// Always `embedding`.
    pub object: &'static str,
    /// The input's position.
    pub index: usize,
    pub embedding: Vector,
}

/// A vector as the request's `encoding_format` asked.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

/// Tokens the inputs took.
#[derive(Debug, Default, Serialize, JsonSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

/// The request's body, with `input`'s refusal saying what it may be.
fn embedding_request(body: &Bytes) -> ApiResult<EmbeddingRequest> {
    parse(body).map_err(|e| match e {
        ApiError::BadRequest(m) if m.starts_with("'input'") => ApiError::BadRequest(
            "'input' must be a string, a list of strings, a list of token ids or a list of lists of token ids".into(),
        ),
        other => other,
    })
}

async fn embeddings(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let req = embedding_request(&body)?;
    let model = named_model(&state, Some(&req.model))?;
    if let Some(d) = req.dimensions {
        return Err(ApiError::Unsupported(format!(
            "'dimensions' is not supported: the model's embeddings have {} dimensions, and \
             shortening them is only meaningful for models trained for it (got {d})",
            model.config().hidden_size
        )));
    }
    let prompts = req.input.prompts()?;
    let n = prompts.len();
    let request = Request {
        id: request_id(&headers)?,
        prompts,
        params: GenerationParams::embedding(model.pooling()),
    };
    let stream = state.submit(&model, &req.model, request).await?;
    let rid = stream.id().to_owned();
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; n];
    let mut usage = EmbeddingUsage::default();
    let chunks: Vec<_> = stream.collect().await;
    for c in chunks {
        if let Some(e) = c.error {
            return Err(ApiError::EngineFailed(e));
        }
        if c.finish_reason.is_some() {
            usage.prompt_tokens += c.prompt_tokens;
        }
        if let (Some(v), Some(slot)) = (c.embedding, vectors.get_mut(c.batch_index)) {
            *slot = Some(v);
        }
    }
    usage.total_tokens = usage.prompt_tokens;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let v = v.ok_or_else(|| {
                ApiError::EngineFailed(format!("input {index} ended without its embedding"))
            })?;
            Ok(Embedding {
                object: "embedding",
                index,
                embedding: encode(v, req.encoding_format),
            })
        })
        .collect::<ApiResult<_>>()?;
    let answer = EmbeddingResponse {
        object: "list",
        data,
        model: req.model,
        usage,
    };
    Ok(with_request_id(Json(answer).into_response(), &rid))
}

fn encode(v: Vec<f32>, format: EncodingFormat) -> Vector {
    match format {
        EncodingFormat::Float => Vector::Float(v),
        EncodingFormat::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: &str) -> ApiResult<EmbeddingRequest> {
        embedding_request(&Bytes::from(body.to_owned()))
    }

    #[test]
    fn inputs_of_every_shape() {
        let prompts = |b: &str| req(b).unwrap().input.prompts().unwrap();
        assert_eq!(
            prompts(r#"{"model": "m", "input": "hi"}"#),
            vec![Prompt::Text("hi".into())]
        );
        assert_eq!(prompts(r#"{"model": "m", "input": ["a", "b"]}"#).len(), 2);
        assert_eq!(
            prompts(r#"{"model": "m", "input": [1, 2]}"#),
            vec![Prompt::Tokens(vec![1, 2])]
        );
        assert_eq!(
            prompts(r#"{"model": "m", "input": [[1], [2, 3]]}"#).len(),
            2
        );
        let e = req(r#"{"model": "m", "input": [1, "a"]}"#).unwrap_err();
        assert!(e.to_string().starts_with("'input' must be"), "{e}");
        let e = req(r#"{"model": "m", "input": []}"#)
            .unwrap()
            .input
            .prompts();
        assert!(e.unwrap_err().to_string().contains("empty"));
        let e = req(r#"{"model": "m", "input": "x", "encoding_format": "hex"}"#).unwrap_err();
        assert!(e.to_string().contains("'encoding_format'"), "{e}");
        let e = req(r#"{"model": "m", "input": "x", "truncate": 3}"#).unwrap_err();
        assert!(e.to_string().contains("truncate"), "{e}");
    }

    #[test]
    fn base64_is_little_endian_f32() {
        let Vector::Base64(b) = encode(vec![1.0, -2.5], EncodingFormat::Base64) else {
            panic!("not base64")
        };
        let bytes = base64::engine::general_purpose::STANDARD.decode(b).unwrap();
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat()
        );
    }
}
