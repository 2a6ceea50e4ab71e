//! The HTTP error type of every front end (Triton, KServe, OpenAI): every failure is a
//! status plus `{"error": "..."}`, mapped to its status here and nowhere else. Client
//! mistakes are 4xx and not logged as server errors; internal causes are logged, not shown.
//! A failure in mid-stream (after the headers went out) is an event of the stream, whose
//! body each front end shapes as its clients expect; [`ApiError::EngineFailed`] gives its
//! message. Errors from layers below the handlers, and OpenAI's error object, are shaped
//! by `error_body`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::actors::messages::SubmitError;

/// Why an HTTP request failed; each variant has one status ([`ApiError::status`]).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON, missing or wrong-typed fields, impossible values (400).
    #[error("{0}")]
    BadRequest(String),
    /// A model name we do not serve (Triton answers 400 for it).
    #[error("Request for unknown model: '{0}' is not found")]
    UnknownModel(String),
    /// A path we do not serve (404).
    #[error("{0}")]
    NotFound(String),
    /// A route we serve, asked with another method (405).
    #[error("Method Not Allowed")]
    MethodNotAllowed,
    /// A feature we do not implement (400, with what is supported).
    #[error("{0}")]
    Unsupported(String),
    /// The model is not ready or the server is stopping (503).
    #[error("{0}")]
    Unavailable(String),
    /// The queue is full: try again shortly. 503 with `Retry-After` on Triton's and
    /// KServe's routes (what their clients know), 429 on OpenAI's.
    #[error("{0}")]
    QueueFull(String),
    /// The engine failed while it held the request (a device fault; the supervisor
    /// restarts it): 503, with the failure's message, which names no internals.
    #[error("generation failed: {0}")]
    EngineFailed(String),
    /// Our fault; the detail goes to the log only (500).
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::UnknownModel(_) | ApiError::Unsupported(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unavailable(_) | ApiError::EngineFailed(_) | ApiError::QueueFull(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Invalid(m) => ApiError::BadRequest(m),
            SubmitError::DuplicateId(_) => ApiError::BadRequest(e.to_string()),
            SubmitError::QueueFull(m) => ApiError::QueueFull(m),
            SubmitError::Unavailable(m) => ApiError::Unavailable(m),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(detail) = &self {
            tracing::error!(%detail, "internal error");
        }
        let mut response = (
            self.status(),
            Json(serde_json::json!({ "error": self.to_string() })),
        )
            .into_response();
        if let ApiError::QueueFull(_) = self {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_S),
            );
            response.extensions_mut().insert(QueueFullMark);
        }
        response
    }
}

/// Seconds a refused client is told to wait before trying again.
const RETRY_AFTER_S: &str = "1";

/// Marks a queue-full refusal, which OpenAI's routes answer with 429.
#[derive(Clone, Copy, Debug)]
pub(super) struct QueueFullMark;

/// The result of a handler step: an [`ApiError`] on failure.
pub type ApiResult<T> = Result<T, ApiError>;
