//! KServe v2 / Open Inference Protocol (placeholder: health only, until the full set lands).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use super::AppState;

pub fn routes() -> Router<AppState> {
    Router::new().route("/v2/health/live", get(live)).route("/v2/health/ready", get(ready))
}

pub async fn live() -> StatusCode {
    StatusCode::OK
}

pub async fn ready(State(state): State<AppState>) -> StatusCode {
    if state.model().is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}
