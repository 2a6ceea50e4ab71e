//! The HTTP surface (axum): Triton's generate extension, KServe v2 (enough for
//! tritonclient), the OpenAI API (completions, chat, embeddings, responses), vLLM's
//! tokenizer routes, Triton's model repository routes, an OpenAPI document of them all (`/openapi.json`), health, and
//! Prometheus metrics on their own port.
//! [`app`] and [`metrics_app`] build the routers apart from `main` so tests can serve
//! them on ephemeral ports; [`serve()`] runs both with graceful shutdown.

mod auth;
mod embeddings;
mod error;
mod error_body;
mod fault;
mod fields;
mod guided;
mod json_body;
mod known_fields;
pub(crate) mod kserve;
pub(crate) mod kserve_stats;
mod listener;
mod openai;
mod openai_types;
mod openapi;
mod openapi_bodies;
mod repository;
mod request_body;
mod responses;
mod responses_types;
mod serve;
pub(crate) mod tensors;
pub mod tls;
mod tokenize;
mod tools;
mod tracked;
mod triton;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

pub use error::{ApiError, ApiResult};
pub use serve::{serve, serve_on, Ports, ServeLimits};

use crate::handle::ModelHandle;
use crate::metrics::{Metrics, Outcome, RequestTiming};
use crate::request::Request;
use tracked::TrackedStream;

pub use crate::repository::{ModelKind, BLS, CORE, ENSEMBLE};
use crate::repository::{Models, RouteError};

struct AppInner {
    models: Arc<Models>,
    metrics: Metrics,
    started: Instant,
    requests: AtomicU64,
}

/// What every handler shares: the models, the metrics. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<AppInner>,
}

impl AppState {
    /// The state for serving the one model `model` under its own name and Triton's
    /// default names, with fresh metrics.
    pub fn new(model: ModelHandle) -> Self {
        Self::with_models(Models::single(model, None))
    }

    /// The state for serving `models`, with fresh metrics.
    pub fn with_models(models: impl Into<Arc<Models>>) -> Self {
        AppState {
            inner: Arc::new(AppInner {
                models: models.into(),
                metrics: Metrics::new(),
                started: Instant::now(),
                requests: AtomicU64::new(0),
            }),
        }
    }

    /// The served models.
    pub fn models(&self) -> &Arc<Models> {
        &self.inner.models
    }

    /// The request and engine metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Time since the state was built.
    pub fn uptime(&self) -> std::time::Duration {
        self.inner.started.elapsed()
    }

    /// The serving model behind a served name and the kind of input the name takes;
    /// Triton's unknown-model error, or a 503 while its model is not serving.
    pub fn route(&self, name: &str) -> ApiResult<(ModelHandle, ModelKind)> {
        self.models().route(name).map_err(|e| match e {
            RouteError::Unknown(n) => ApiError::UnknownModel(n),
            RouteError::NotReady(m) => ApiError::Unavailable(m),
        })
    }

    /// Whether the model behind a served name is ready: false while it loads or after an
    /// unload (rather than unknown); Triton's unknown-model error for a name never served.
    pub fn model_ready(&self, name: &str) -> ApiResult<bool> {
        match self.route(name) {
            Ok((handle, _)) => Ok(handle.is_ready()),
            Err(ApiError::Unavailable(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The model of a route where naming one is optional: the named one, else the only
    /// serving one.
    pub fn model_or_only(&self, name: Option<&str>) -> ApiResult<ModelHandle> {
        match name {
            Some(n) => Ok(self.route(n)?.0),
            None => self.models().only().ok_or_else(|| {
                ApiError::BadRequest(
                    "this server serves several models (or none is ready): name one with 'model'"
                        .into(),
                )
            }),
        }
    }

    /// Names listed by metadata endpoints.
    pub fn served_names(&self) -> Vec<String> {
        self.models().names()
    }

    /// Submits a request to `handle` (served as `model`); a refusal is counted and
    /// returned as an HTTP error.
    pub async fn submit(
        &self,
        handle: &ModelHandle,
        model: &str,
        request: Request,
    ) -> ApiResult<TrackedStream> {
        let timing = RequestTiming::start();
        let prompts = request.prompts.len();
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        let composing = self.models().composing_of(model);
        match handle.submit(request).await {
            Ok(stream) => Ok(TrackedStream::new(
                stream,
                self.clone(),
                (model, composing),
                prompts,
                timing,
            )),
            Err(e) => {
                let outcome = match e {
                    crate::actors::messages::SubmitError::QueueFull(_)
                    | crate::actors::messages::SubmitError::Unavailable(_) => Outcome::Rejected,
                    _ => Outcome::Other,
                };
                self.metrics().request_done(
                    (model, composing.as_deref()),
                    outcome,
                    prompts,
                    &timing,
                    std::time::Duration::ZERO,
                );
                Err(e.into())
            }
        }
    }

    /// Refreshes every serving model's scheduler gauges (labelled with its Triton names,
    /// else its own) and renders every metric.
    pub async fn render_metrics(&self) -> String {
        for (model, names, handle) in self.models().serving() {
            let Ok(stats) = handle.stats().await else {
                continue;
            };
            let triton: Vec<&str> = names.iter().filter(|n| *n != model).collect();
            let labels = if triton.is_empty() {
                vec![model.as_str()]
            } else {
                triton
            };
            // TRT-LLM labels its engine's gauges with the core model's name.
            let core = names.core().unwrap_or(&model);
            let on_gpu = handle.device() != crate::model::device::Device::Cpu;
            self.metrics().scheduler(
                (&labels, core),
                &stats,
                stats.iteration,
                handle.kv_cache_bytes(),
                on_gpu,
            );
        }
        self.metrics().render()
    }
}

/// Parses a JSON body whatever its Content-Type (tritonclient sends none).
pub fn parse_json(body: &Bytes) -> ApiResult<serde_json::Value> {
    if body.is_empty() {
        return Err(ApiError::BadRequest(
            "the request body is empty; expected a JSON object".into(),
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("malformed JSON in the request body: {e}")))
}

/// The inference port's routes.
pub fn app(state: AppState) -> Router {
    app_with(
        state,
        request_body::BodyLimits::from_limits(&ServeLimits::default()),
        None,
        false,
    )
}

/// [`app`] with the request body limits `body`.
pub(crate) fn app_with(
    state: AppState,
    body: request_body::BodyLimits,
    key: Option<auth::ApiKey>,
    fault_injection: bool,
) -> Router {
    let faults = match fault_injection {
        true => fault::routes(),
        false => Router::new(),
    };
    Router::new()
        .merge(faults)
        .merge(kserve::routes())
        .merge(triton::routes())
        .merge(openai::routes())
        .merge(embeddings::routes())
        .merge(responses::routes())
        .merge(tokenize::routes())
        .merge(repository::routes())
        .merge(openapi::routes())
        .route("/metrics", get(metrics))
        .route("/health", get(kserve::ready))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(served_version_only))
        .layer(axum::middleware::from_fn(move |r, n| {
            request_body::read_body(body, r, n)
        }))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(move |r, n| {
            auth::check_key(key.clone(), r, n)
        }))
        .layer(axum::middleware::from_fn(error_body::shape_errors))
        .with_state(state)
}

/// Version 1 is the only one served: `/v2/models/{model}/versions/{v}/...` with any other
/// `v` is refused on every route with Triton's answer for a version it does not have (the
/// KServe handlers' own check says the same).
async fn served_version_only(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    let parts: Vec<&str> = path.split('/').collect();
    if let ["", "v2", "models", model, "versions", version, ..] = parts[..] {
        if !matches!(version, "" | "1") {
            return ApiError::BadRequest(format!(
                "Request for unknown model: '{model}' version {version} is not found"
            ))
            .into_response();
        }
    }
    next.run(request).await
}

/// The metrics port's routes (Triton serves Prometheus text on :8002/metrics).
pub fn metrics_app(state: AppState) -> Router {
    metrics_app_with(state, None)
}

/// [`metrics_app`] behind the API key `key` (its exempt paths still open).
pub(crate) fn metrics_app_with(state: AppState, key: Option<auth::ApiKey>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(move |r, n| {
            auth::check_key(key.clone(), r, n)
        }))
        .layer(axum::middleware::from_fn(error_body::shape_errors))
        .with_state(state)
}

async fn metrics(State(state): State<AppState>) -> Response {
    let body = state.render_metrics().await;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        body,
    )
        .into_response()
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Registers a POST route and its `/versions/{version}` twin.
pub(crate) fn versioned_post<H, T>(
    router: Router<AppState>,
    path: &str,
    handler: H,
) -> Router<AppState>
where
    H: axum::handler::Handler<T, AppState> + Clone,
    T: 'static,
{
    let versioned = path.replacen("/models/{model}", "/models/{model}/versions/{version}", 1);
    router
        .route(path, post(handler.clone()))
        .route(&versioned, post(handler))
}

/// Registers a GET route and its `/versions/{version}` twin.
pub(crate) fn versioned_get<H, T>(
    router: Router<AppState>,
    path: &str,
    handler: H,
) -> Router<AppState>
where
    H: axum::handler::Handler<T, AppState> + Clone,
    T: 'static,
{
    let versioned = path.replacen("/models/{model}", "/models/{model}/versions/{version}", 1);
    router
        .route(path, get(handler.clone()))
        .route(&versioned, get(handler))
}
