//! API keys: with `api_key` set, every request but those to the exempt paths (health and
//! metrics by default) must carry `Authorization: Bearer <key>`, compared in constant time;
//! anything else is a JSON 401 (OpenAI's error object on its routes).

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The key and the paths that need none.
#[derive(Debug, Clone)]
pub(crate) struct ApiKey {
    key: Arc<[u8]>,
    exempt: Arc<[String]>,
}

impl ApiKey {
    /// `key` guards every path but those in `exempt` (exact paths).
    pub(crate) fn new(key: &str, exempt: &[String]) -> Self {
        ApiKey {
            key: key.as_bytes().into(),
            exempt: exempt.into(),
        }
    }

    /// Whether `request` may pass.
    fn admits(&self, request: &Request) -> bool {
        if self.exempt.iter().any(|p| p == request.uri().path()) {
            return true;
        }
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        given.is_some_and(|g| same(g.as_bytes(), &self.key))
    }
}

/// Equal bytes, in time that depends on the lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses requests without the key (no key configured: all pass).
pub(crate) async fn check_key(key: Option<ApiKey>, request: Request, next: Next) -> Response {
    match key {
        Some(k) if !k.admits(&request) => {
            let mut response = (
                StatusCode::UNAUTHORIZED,
                axum::Json(serde_json::json!({
                    "error": "a valid API key is required: Authorization: Bearer <key>"
                })),
            )
                .into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
        _ => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str, auth: Option<&str>) -> Request {
        let mut b = axum::http::Request::builder().uri(path);
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn only_the_key_or_an_exempt_path_passes() {
        let k = ApiKey::new("s3cret", &["/v2/health/ready".to_string()]);
        assert!(k.admits(&request("/v1/models", Some("Bearer s3cret"))));
        assert!(!k.admits(&request("/v1/models", Some("Bearer s3cre"))));
        assert!(!k.admits(&request("/v1/models", Some("Bearer s3cret!"))));
        assert!(!k.admits(&request("/v1/models", Some("s3cret"))));
        assert!(!k.admits(&request("/v1/models", None)));
        assert!(k.admits(&request("/v2/health/ready", None)));
        assert!(!k.admits(&request("/v2/health/ready/x", None)));
        assert!(same(b"", b"") && !same(b"a", b"b") && !same(b"a", b"ab"));
    }
}
