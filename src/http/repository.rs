//! Triton's model repository extension over HTTP: `POST /v2/repository/index` (every
//! model and name with its state), `POST /v2/repository/models/{model}/load` and
//! `.../unload` (the server's [`Models`](crate::repository::Models) does the work).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::{parse_json, ApiError, ApiResult, AppState};
use crate::repository::{ChangeError, State as ModelState};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v2/repository/index", post(index))
        .route("/v2/repository/models/{model}/load", post(load))
        .route("/v2/repository/models/{model}/unload", post(unload))
}

/// The body's object (an empty body is an empty object), its keys limited to `allowed`.
fn object(body: &Bytes, allowed: &[&str]) -> ApiResult<serde_json::Map<String, Value>> {
    if body.is_empty() {
        return Ok(Default::default());
    }
    let Value::Object(o) = parse_json(body)? else {
        return Err(ApiError::BadRequest(
            "the request body must be a JSON object".into(),
        ));
    };
    if let Some(k) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::BadRequest(format!("unexpected field '{k}'")));
    }
    Ok(o)
}

/// The body's `parameters`, refused unless each is one of `allowed`.
fn parameters(body: &Bytes, allowed: &[&str]) -> ApiResult<()> {
    let o = object(body, &["parameters"])?;
    match o.get("parameters") {
        None => Ok(()),
        Some(Value::Object(p)) => match p.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(ApiError::Unsupported(format!(
                "parameter '{k}' is not supported: a model loads from its folder's config"
            ))),
            None => Ok(()),
        },
        Some(_) => Err(ApiError::BadRequest(
            "'parameters' must be an object".into(),
        )),
    }
}

fn refused(e: ChangeError) -> ApiError {
    match e {
        ChangeError::Unknown(m) => ApiError::NotFound(m),
        ChangeError::Refused(m) => ApiError::BadRequest(m),
    }
}

async fn index(State(state): State<AppState>, body: Bytes) -> ApiResult<Response> {
    let o = object(&body, &["ready"])?;
    let ready_only = match o.get("ready") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::BadRequest("'ready' must be a boolean".into())),
    };
    let rows: Vec<Value> = state
        .models()
        .index(true)
        .into_iter()
        .filter(|r| !ready_only || r.state == ModelState::Ready)
        .map(|r| {
            let mut row = json!({"name": r.name, "version": "1", "state": r.state.as_str()});
            if !r.reason.is_empty() {
                row["reason"] = json!(r.reason);
            }
            row
        })
        .collect();
    Ok(Json(Value::Array(rows)).into_response())
}

async fn load(
    State(state): State<AppState>,
    Path(model): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    parameters(&body, &[])?;
    state.models().load(&model).await.map_err(refused)?;
    Ok(Json(json!({})).into_response())
}

async fn unload(
    State(state): State<AppState>,
    Path(model): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    parameters(&body, &["unload_dependents"])?;
    state.models().unload(&model).await.map_err(refused)?;
    Ok(Json(json!({})).into_response())
}
