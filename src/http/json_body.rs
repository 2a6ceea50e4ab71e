//! Request bodies read into serde types (the routes whose bodies are typed: tokenize,
//! detokenize, embeddings, responses; their types also give the OpenAPI document its
//! schemas). JSON whatever the Content-Type; unknown fields are refused by the types
//! (`deny_unknown_fields`), and every refusal is a 400 that names the field at fault by
//! its path in the body.

use axum::body::Bytes;
use serde::de::DeserializeOwned;

use super::{ApiError, ApiResult};

/// `body` as a `T`, or a 400 naming the field at fault.
pub(super) fn parse<T: DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    if body.is_empty() {
        return Err(ApiError::BadRequest(
            "the request body is empty; expected a JSON object".into(),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = if inner.is_syntax() || inner.is_eof() {
            format!("malformed JSON in the request body: {inner}")
        } else if path.is_empty() || path == "." {
            inner.to_string()
        } else {
            format!("'{path}': {inner}")
        };
        ApiError::BadRequest(message)
    })?;
    de.end()
        .map_err(|e| ApiError::BadRequest(format!("malformed JSON in the request body: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        model: String,
        inner: Option<Inner>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        n: u32,
    }

    fn err(text: &str) -> String {
        parse::<Body>(&Bytes::from(text.to_owned()))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn refusals_name_the_field() {
        assert!(parse::<Body>(&Bytes::from_static(b"{\"model\": \"m\"}")).is_ok());
        assert!(err("{\"model\": 3}").starts_with("'model': invalid type"));
        assert!(err("{\"model\": \"m\", \"inner\": {\"n\": -1}}").starts_with("'inner.n': "));
        let unknown = err("{\"model\": \"m\", \"tools\": []}");
        assert!(unknown.contains("unknown field `tools`"), "{unknown}");
        assert!(err("{\"model\": ").starts_with("malformed JSON"));
        assert!(err("{\"model\": \"m\"} x").starts_with("malformed JSON"));
        assert!(err("").contains("empty"));
        assert!(err("{}").contains("missing field `model`"));
    }
}
