//! Request bodies, read whole before any handler runs: at most `max_bytes` (a longer one
//! is a 413) within `timeout` from the request's head (a client that trickles or stalls
//! its body gets a 408 and the connection is closed).

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Limits on one request's body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    pub max_bytes: usize,
    pub timeout: Duration,
}

impl BodyLimits {
    /// The body limits of `limits`.
    pub(crate) fn from_limits(limits: &super::ServeLimits) -> Self {
        BodyLimits {
            max_bytes: limits.max_request_body_bytes,
            timeout: limits.request_body_timeout,
        }
    }
}

/// Reads the body under `limits`, then hands the request on with it.
pub(crate) async fn read_body(limits: BodyLimits, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let read = axum::body::to_bytes(body, limits.max_bytes);
    let bytes = match tokio::time::timeout(limits.timeout, read).await {
        Err(_) => {
            let message = format!(
                "the request body did not arrive within {} s (request_body_timeout_s)",
                limits.timeout.as_secs_f64()
            );
            return refusal(StatusCode::REQUEST_TIMEOUT, message);
        }
        Ok(Err(e)) if is_too_long(&e) => {
            let message = format!(
                "the request body is longer than {} bytes (max_request_body_bytes)",
                limits.max_bytes
            );
            return refusal(StatusCode::PAYLOAD_TOO_LARGE, message);
        }
        Ok(Err(e)) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                format!("reading the request body: {e}"),
            )
        }
        Ok(Ok(bytes)) => bytes,
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn is_too_long(e: &axum::Error) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        if s.downcast_ref::<http_body_util::LengthLimitError>()
            .is_some()
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// A JSON error that also closes the connection (its body may be half read).
fn refusal(status: StatusCode, message: String) -> Response {
    let mut response =
        (status, axum::Json(serde_json::json!({ "error": message }))).into_response();
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}
