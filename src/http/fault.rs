//! `POST /v2/debug/fault` (only with `[server] fault_injection`, `--fault-injection`): the
//! named model's engine (the only one when none is named) meets a fault at its next step,
//! `{"fault": "panic" | "illegal_address" | "launch_error"}` (`model::Fault`), and fails
//! and recovers as on a real one: held requests get errors, readiness goes false until
//! the engine serves again. For recovery tests and an orchestrator's chaos drills.

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::json_body::parse;
use super::{ApiError, ApiResult, AppState};
use crate::model::{Device, Fault};

pub fn routes() -> Router<AppState> {
    Router::new().route("/v2/debug/fault", post(inject))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultRequest {
    /// A served model name; the only model when none is given.
    model: Option<String>,
    /// Which fault.
    fault: String,
}

async fn inject(State(state): State<AppState>, body: Bytes) -> ApiResult<Json<Value>> {
    let req: FaultRequest = parse(&body)?;
    let fault: Fault = req
        .fault
        .parse()
        .map_err(|e: crate::Error| ApiError::BadRequest(e.to_string()))?;
    let handle = match &req.model {
        Some(name) => state.route(name)?.0,
        None => state.models().only().ok_or_else(|| {
            ApiError::BadRequest("several models are served: name one in \"model\"".into())
        })?,
    };
    if handle.device() == Device::Cpu && fault != Fault::Panic {
        return Err(ApiError::BadRequest(format!(
            "model '{}' runs on the CPU, which cannot meet the {fault} fault, only \"panic\"",
            handle.name()
        )));
    }
    if !handle.is_ready() {
        return Err(ApiError::Unavailable(format!(
            "model '{}' is not ready",
            handle.name()
        )));
    }
    tracing::warn!(model = handle.name(), %fault, "fault injection requested");
    handle.inject_fault(fault);
    Ok(Json(json!({"model": handle.name(), "fault": fault.name()})))
}
