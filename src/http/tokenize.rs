//! vLLM's tokenizer routes on the inference port: `POST /tokenize` (a prompt, or chat
//! messages through the model's template, to token ids: `{"count", "max_model_len",
//! "tokens"}`, and each token's text with `return_token_strs`) and `POST /detokenize`
//! (token ids to `{"prompt"}`). The ids are the ones a generation of the same input
//! would see: the same encoder, BOS and chat template as Preprocess. Errors are OpenAI's
//! error object, as vLLM answers them.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::json_body::parse;
use super::openai::{context, named_model};
use super::openai_types::chat_messages;
use super::{ApiError, ApiResult, AppState};
use crate::tokenizer::chat::ChatTemplate;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
}

/// `POST /tokenize`: either `prompt` or `messages`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// A served model name (optional, as in vLLM).
    pub model: Option<String>,
    /// Text to tokenize (control tokens written in it become their ids).
    pub prompt: Option<String>,
    /// A conversation, rendered through the model's chat template first.
    #[schemars(with = "Option<Vec<super::openapi_bodies::ChatMessageDoc>>")]
    pub messages: Option<Vec<Value>>,
    /// With `messages`: open the assistant's turn after them (default true).
    pub add_generation_prompt: Option<bool>,
    /// With `messages`: only false, continuing the last message is not supported.
    pub continue_final_message: Option<bool>,
    /// With `messages`: extra chat template variables.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Prepend BOS where the model asks for one (default true, as generation does); false
    /// leaves out the BOS the tokenizer would add.
    pub add_special_tokens: Option<bool>,
    /// Also return each token's text.
    pub return_token_strs: Option<bool>,
}

/// The answer of `POST /tokenize`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TokenizeResponse {
    /// How many tokens.
    pub count: usize,
    /// The model's context length.
    pub max_model_len: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
    /// Each token's text (lossy UTF-8 of its bytes), with `return_token_strs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// A served model name (optional, as in vLLM).
    pub model: Option<String>,
    /// Token ids of the model's vocabulary.
    pub tokens: Vec<u32>,
}

/// The answer of `POST /detokenize`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DetokenizeResponse {
    /// The ids' text, control tokens included.
    pub prompt: String,
}

async fn tokenize(State(state): State<AppState>, body: Bytes) -> ApiResult<Response> {
    let req: TokenizeRequest = parse(&body)?;
    let model = named_model(&state, req.model.as_deref())?;
    let tok = model.tokenizer();
    let text = match (&req.prompt, &req.messages) {
        (Some(prompt), None) => {
            for key in [
                ("add_generation_prompt", req.add_generation_prompt.is_some()),
                (
                    "continue_final_message",
                    req.continue_final_message.is_some(),
                ),
                ("chat_template_kwargs", req.chat_template_kwargs.is_some()),
            ] {
                if key.1 {
                    return Err(ApiError::BadRequest(format!(
                        "'{}' applies to 'messages', not to 'prompt'",
                        key.0
                    )));
                }
            }
            prompt.clone()
        }
        (None, Some(messages)) => {
            if req.continue_final_message == Some(true) {
                return Err(ApiError::Unsupported(
                    "'continue_final_message' is not supported: the template renders whole messages".into(),
                ));
            }
            let messages = chat_messages(Some(&Value::Array(messages.clone())))?;
            let template = ChatTemplate::for_tokenizer(tok)
                .map_err(|e| ApiError::BadRequest(e.to_string()))?;
            let vars = req.chat_template_kwargs.clone().unwrap_or_default();
            template
                .apply_with(&messages, req.add_generation_prompt.unwrap_or(true), &vars)
                .map_err(|e| ApiError::BadRequest(e.to_string()))?
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::BadRequest(
                "give either 'prompt' or 'messages', not both".into(),
            ))
        }
        (None, None) => {
            return Err(ApiError::BadRequest(
                "'prompt' or 'messages' is required".into(),
            ))
        }
    };
    let mut tokens = tok
        .encode(&text, true)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if req.add_special_tokens == Some(false) {
        // The BOS the encoder prepends, not one the text itself starts with.
        if let Some(bos) = tok.bos_token_id().filter(|_| tok.add_bos()) {
            let written = tok
                .token_text(bos)
                .is_some_and(|t| !t.is_empty() && text.starts_with(&t));
            if !written && tokens.first() == Some(&bos) {
                tokens.remove(0);
            }
        }
    }
    let token_strs = req.return_token_strs.unwrap_or(false).then(|| {
        tokens
            .iter()
            .map(|&id| tok.token_text(id).unwrap_or_default())
            .collect()
    });
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: context(&model),
        tokens,
        token_strs,
    })
    .into_response())
}

async fn detokenize(State(state): State<AppState>, body: Bytes) -> ApiResult<Response> {
    let req: DetokenizeRequest = parse(&body)?;
    let model = named_model(&state, req.model.as_deref())?;
    let tok = model.tokenizer();
    let vocab = model.config().vocab_size.min(tok.vocab_size());
    if let Some(bad) = req.tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::BadRequest(format!(
            "'tokens': id {bad} is outside the vocabulary ({vocab} tokens)"
        )));
    }
    let prompt = tok
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(Json(DetokenizeResponse { prompt }).into_response())
}
