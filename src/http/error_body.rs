//! The shape of every error answer, whichever layer produced it: a middleware rewrites
//! error bodies that are not JSON (axum's body-limit, path and header rejections) as
//! `{"error": "..."}`, and on OpenAI's routes (and vLLM's `/tokenize`, `/detokenize`)
//! turns `{"error": "..."}` into OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`) and a full queue into 429.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{json, Value};

use super::error::QueueFullMark;

/// Error bodies longer than this are cut (they are messages, not data).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Rewrites error answers as described in the module's note; other answers pass as they
/// are.
pub(super) async fn shape_errors(request: Request, next: Next) -> Response {
    let path = request.uri().path();
    // vLLM's tokenizer routes answer OpenAI's error object, as vLLM's do.
    let openai = path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize";
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let is_json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let bytes = axum::body::to_bytes(body, MAX_ERROR_BODY)
        .await
        .unwrap_or_default();
    let message = match is_json.then(|| serde_json::from_slice::<Value>(&bytes).ok()) {
        Some(Some(Value::Object(m))) => match m.get("error") {
            Some(Value::String(s)) => s.clone(),
            // Already an error object (or some other JSON error body): left as it is.
            _ => return Response::from_parts(parts, Body::from(bytes)),
        },
        _ => {
            let text = String::from_utf8_lossy(&bytes).trim().to_string();
            if text.is_empty() {
                status.canonical_reason().unwrap_or("error").to_string()
            } else {
                text
            }
        }
    };
    let queue_full = parts.extensions.get::<QueueFullMark>().is_some();
    let body = if openai {
        if queue_full {
            parts.status = StatusCode::TOO_MANY_REQUESTS;
        }
        openai_error(parts.status, &message)
    } else {
        json!({ "error": message })
    };
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body.to_string()))
}

/// OpenAI's error object for `status` and `message`.
fn openai_error(status: StatusCode, message: &str) -> Value {
    let (kind, code) = match status.as_u16() {
        401 => ("authentication_error", Value::Null),
        404 if message.starts_with("The model") => {
            ("invalid_request_error", json!("model_not_found"))
        }
        429 => ("rate_limit_error", json!("rate_limit_exceeded")),
        400..=499 => ("invalid_request_error", Value::Null),
        _ => ("server_error", Value::Null),
    };
    json!({ "error": { "message": message, "type": kind, "param": Value::Null, "code": code } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_errors_name_their_kind() {
        let e = openai_error(StatusCode::NOT_FOUND, "The model `x` does not exist.");
        assert_eq!(e["error"]["code"], "model_not_found");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert_eq!(e["error"]["message"], "The model `x` does not exist.");
        assert!(e["error"]["param"].is_null());
        let e = openai_error(StatusCode::TOO_MANY_REQUESTS, "queue full");
        assert_eq!(e["error"]["type"], "rate_limit_error");
        let e = openai_error(StatusCode::SERVICE_UNAVAILABLE, "not ready");
        assert_eq!(e["error"]["type"], "server_error");
        assert!(e["error"]["code"].is_null());
    }
}
