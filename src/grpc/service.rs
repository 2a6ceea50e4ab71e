//! The GRPCInferenceService handlers: each reads its message, runs what the HTTP route of
//! the same name runs (src/http/kserve.rs, kserve_stats.rs) and answers in protobuf.
//! `ModelStreamInfer` is decoupled: every request on a stream runs at once, each sends
//! its responses as its tokens come (with `triton_final_response` on the last, which
//! always comes, with empty tensors when the end brought no new token), a stop
//! request cancels its target, errors travel as stream responses, and a client that
//! cancels the call or goes away cancels every request it had running.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::codec;
use super::proto::grpc_inference_service_server::GrpcInferenceService;
use super::proto::*;
use crate::handle::ModelHandle;
use crate::http::kserve::{self, Prepared, EXTENSIONS};
use crate::http::{ApiError, AppState, ModelKind};
use crate::repository::{ChangeError, State};

/// The service over the shared application state; `key` guards every call but the
/// server's live and ready checks when set.
pub struct TritonGrpc {
    state: AppState,
    key: Option<std::sync::Arc<str>>,
}

impl TritonGrpc {
    /// The service for `state`, guarded by `key` when one is set.
    pub fn new(state: AppState, key: Option<&str>) -> Self {
        TritonGrpc {
            state,
            key: key.map(Into::into),
        }
    }

    /// `authorization: Bearer <key>` in the call's metadata, when a key is set.
    fn admit<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .unwrap_or_default();
        let same = given.len() == key.len()
            && given
                .bytes()
                .zip(key.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(Status::unauthenticated(
                "a valid API key is required: authorization: Bearer <key>",
            ))
        }
    }

    fn served(&self, name: &str, version: &str) -> Result<(ModelHandle, ModelKind), Status> {
        served(&self.state, name, version).map_err(status)
    }
}

/// The serving model behind the named one and the name's kind; only version 1 (or none)
/// is served.
fn served(
    state: &AppState,
    name: &str,
    version: &str,
) -> Result<(ModelHandle, ModelKind), ApiError> {
    let routed = state.route(name)?;
    if !matches!(version, "" | "1") {
        return Err(ApiError::NotFound(format!(
            "Request for unknown model: '{name}' version {version} is not found"
        )));
    }
    Ok(routed)
}

/// The gRPC status of a refused load or unload.
fn change_status(e: ChangeError) -> Status {
    match e {
        ChangeError::Unknown(m) => Status::not_found(m),
        ChangeError::Refused(m) => Status::failed_precondition(m),
    }
}

/// The gRPC status of an error the HTTP routes answer with a 4xx/5xx.
pub fn status(e: ApiError) -> Status {
    let m = e.to_string();
    match e {
        ApiError::BadRequest(_) | ApiError::Unsupported(_) => Status::invalid_argument(m),
        ApiError::UnknownModel(_) | ApiError::NotFound(_) => Status::not_found(m),
        ApiError::MethodNotAllowed => Status::unimplemented(m),
        ApiError::Unavailable(_) | ApiError::QueueFull(_) | ApiError::EngineFailed(_) => {
            Status::unavailable(m)
        }
        ApiError::Internal(detail) => {
            tracing::error!("gRPC request failed: {detail}");
            Status::internal(m)
        }
    }
}

type Answer<T> = Result<Response<T>, Status>;
type StreamOut = Result<ModelStreamInferResponse, Status>;

fn unimplemented<T>(what: &str) -> Answer<T> {
    Err(Status::unimplemented(format!(
        "{what} is not supported by this server"
    )))
}

#[tonic::async_trait]
impl GrpcInferenceService for TritonGrpc {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Answer<ServerLiveResponse> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Answer<ServerReadyResponse> {
        Ok(Response::new(ServerReadyResponse {
            ready: self.state.models().is_ready(),
        }))
    }

    async fn model_ready(&self, r: Request<ModelReadyRequest>) -> Answer<ModelReadyResponse> {
        self.admit(&r)?;
        let r = r.into_inner();
        if !matches!(r.version.as_str(), "" | "1") {
            // Only version 1 is served (`served`'s answer for another).
            self.served(&r.name, &r.version)?;
        }
        let ready = self.state.model_ready(&r.name).map_err(status)?;
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        r: Request<ServerMetadataRequest>,
    ) -> Answer<ServerMetadataResponse> {
        self.admit(&r)?;
        Ok(Response::new(ServerMetadataResponse {
            name: "inflight".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        r: Request<ModelMetadataRequest>,
    ) -> Answer<ModelMetadataResponse> {
        self.admit(&r)?;
        let r = r.into_inner();
        let (_, kind) = self.served(&r.name, &r.version)?;
        Ok(Response::new(codec::metadata(&kserve::metadata_json(
            &r.name, kind,
        ))))
    }

    async fn model_infer(&self, r: Request<ModelInferRequest>) -> Answer<ModelInferResponse> {
        self.admit(&r)?;
        let r = r.into_inner();
        let (handle, kind) = self.served(&r.model_name, &r.model_version)?;
        let model = r.model_name.clone();
        let req = codec::infer_request(r).map_err(status)?;
        let outputs =
            match kserve::prepare(&self.state, &handle, &model, kind, &req).map_err(status)? {
                Prepared::Stop(_) => Vec::new(),
                Prepared::Run(mut run) => {
                    run.request.params.stream = false;
                    run.whole(&self.state, &model).await.map_err(status)?
                }
            };
        Ok(Response::new(codec::infer_response(
            &model,
            req.id.as_deref(),
            outputs,
            None,
        )))
    }

    type ModelStreamInferStream = Pin<Box<dyn Stream<Item = StreamOut> + Send + 'static>>;

    async fn model_stream_infer(
        &self,
        r: Request<Streaming<ModelInferRequest>>,
    ) -> Answer<Self::ModelStreamInferStream> {
        self.admit(&r)?;
        let mut incoming = r.into_inner();
        let (tx, rx) = mpsc::channel::<StreamOut>(256);
        let state = self.state.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    m = incoming.message() => m,
                    _ = tx.closed() => break,
                };
                match next {
                    Ok(Some(req)) => {
                        tokio::spawn(stream_one(state.clone(), req, tx.clone()));
                    }
                    // The client finished sending (its requests run on) or left.
                    Ok(None) | Err(_) => break,
                }
            }
        });
        let out =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        Ok(Response::new(Box::pin(out)))
    }

    async fn model_config(&self, r: Request<ModelConfigRequest>) -> Answer<ModelConfigResponse> {
        self.admit(&r)?;
        let r = r.into_inner();
        let (handle, kind) = self.served(&r.name, &r.version)?;
        let json = kserve::config_json(&handle, &r.name, kind)
            .await
            .map_err(status)?;
        Ok(Response::new(ModelConfigResponse {
            config: Some(codec::config(&json)),
        }))
    }

    async fn model_statistics(
        &self,
        r: Request<ModelStatisticsRequest>,
    ) -> Answer<ModelStatisticsResponse> {
        self.admit(&r)?;
        let r = r.into_inner();
        let names = if r.name.is_empty() {
            let mut names = self.state.served_names();
            let mut seen = std::collections::HashSet::new();
            names.retain(|n| seen.insert(n.clone()));
            names
        } else {
            self.served(&r.name, &r.version)?;
            vec![r.name]
        };
        let json = crate::http::kserve_stats::stats(&self.state, &names)
            .await
            .map_err(status)?;
        Ok(Response::new(codec::statistics(&json)))
    }

    async fn repository_index(
        &self,
        r: Request<RepositoryIndexRequest>,
    ) -> Answer<RepositoryIndexResponse> {
        self.admit(&r)?;
        let ready_only = r.get_ref().ready;
        let models = self
            .state
            .models()
            .index(true)
            .into_iter()
            .filter(|row| !ready_only || row.state == State::Ready)
            .map(|row| repository_index_response::ModelIndex {
                name: row.name,
                version: "1".into(),
                state: row.state.as_str().into(),
                reason: row.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        r: Request<RepositoryModelLoadRequest>,
    ) -> Answer<RepositoryModelLoadResponse> {
        self.admit(&r)?;
        let r = r.into_inner();
        if let Some(k) = r.parameters.keys().next() {
            return Err(Status::invalid_argument(format!(
                "load parameter '{k}' is not supported: a model loads from its folder's config"
            )));
        }
        self.state
            .models()
            .load(&r.model_name)
            .await
            .map_err(change_status)?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        r: Request<RepositoryModelUnloadRequest>,
    ) -> Answer<RepositoryModelUnloadResponse> {
        self.admit(&r)?;
        let r = r.into_inner();
        if let Some(k) = r.parameters.keys().find(|k| *k != "unload_dependents") {
            return Err(Status::invalid_argument(format!(
                "unload parameter '{k}' is not supported"
            )));
        }
        self.state
            .models()
            .unload(&r.model_name)
            .await
            .map_err(change_status)?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        _: Request<SystemSharedMemoryStatusRequest>,
    ) -> Answer<SystemSharedMemoryStatusResponse> {
        unimplemented("shared memory")
    }

    async fn system_shared_memory_register(
        &self,
        _: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Answer<SystemSharedMemoryRegisterResponse> {
        unimplemented("shared memory")
    }

    async fn system_shared_memory_unregister(
        &self,
        _: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Answer<SystemSharedMemoryUnregisterResponse> {
        unimplemented("shared memory")
    }

    async fn cuda_shared_memory_status(
        &self,
        _: Request<CudaSharedMemoryStatusRequest>,
    ) -> Answer<CudaSharedMemoryStatusResponse> {
        unimplemented("CUDA shared memory")
    }

    async fn cuda_shared_memory_register(
        &self,
        _: Request<CudaSharedMemoryRegisterRequest>,
    ) -> Answer<CudaSharedMemoryRegisterResponse> {
        unimplemented("CUDA shared memory")
    }

    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> Answer<CudaSharedMemoryUnregisterResponse> {
        unimplemented("CUDA shared memory")
    }

    async fn trace_setting(&self, _: Request<TraceSettingRequest>) -> Answer<TraceSettingResponse> {
        unimplemented("tracing")
    }

    async fn log_settings(&self, _: Request<LogSettingsRequest>) -> Answer<LogSettingsResponse> {
        unimplemented("log settings")
    }
}

/// One request of a stream, run to its end: its responses (or its error) go to `tx`;
/// when the stream's receiver is gone, the request is dropped, which cancels it.
async fn stream_one(state: AppState, req: ModelInferRequest, tx: mpsc::Sender<StreamOut>) {
    let model = req.model_name.clone();
    let id = (!req.id.is_empty()).then(|| req.id.clone());
    let result = run_streamed(&state, req, &tx).await;
    if let Err(e) = result {
        let error_message = status(e).message().to_string();
        let infer_response = Some(ModelInferResponse {
            model_name: model,
            model_version: "1".into(),
            id: id.unwrap_or_default(),
            ..Default::default()
        });
        let _ = tx
            .send(Ok(ModelStreamInferResponse {
                error_message,
                infer_response,
            }))
            .await;
    }
}

async fn run_streamed(
    state: &AppState,
    req: ModelInferRequest,
    tx: &mpsc::Sender<StreamOut>,
) -> Result<(), ApiError> {
    let model = req.model_name.clone();
    let (handle, kind) = served(state, &model, &req.model_version)?;
    let decoded = codec::infer_request(req)?;
    let id = decoded.id.as_deref();
    let send = |outputs, last| {
        let r = codec::infer_response(&model, id, outputs, Some(last));
        tx.send(Ok(ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(r),
        }))
    };
    let run = match kserve::prepare(state, &handle, &model, kind, &decoded)? {
        // TRT-LLM answers a stop request with one empty final response.
        Prepared::Stop(_) => {
            let _ = send(Vec::new(), true).await;
            return Ok(());
        }
        Prepared::Run(run) => run,
    };
    if !run.request.params.stream {
        let outputs = run.whole(state, &model).await?;
        let _ = send(outputs, true).await;
        return Ok(());
    }
    let shape = run.shape;
    let mut open = shape.prompts;
    let mut chunks = state.submit(&run.model, &model, run.request).await?;
    loop {
        let chunk = tokio::select! {
            c = chunks.next() => c,
            _ = tx.closed() => return Ok(()),
        };
        let Some(chunk) = chunk else {
            return Ok(());
        };
        if let Some(err) = chunk.error {
            return Err(ApiError::EngineFailed(err));
        }
        if chunk.finish_reason.is_some() {
            open = open.saturating_sub(1);
        }
        let last = open == 0;
        // A chunk with nothing new is skipped, unless it ends the request: the final
        // response always comes (its tensors empty then), so no client waits for it.
        let empty = chunk.token_ids.is_empty()
            && chunk.text.is_empty()
            && chunk.context_logits.is_empty()
            && chunk.generation_logits.is_empty()
            && chunk.beams.is_empty();
        if (!empty || last)
            && send(shape.outputs(std::slice::from_ref(&chunk)), last)
                .await
                .is_err()
        {
            return Ok(());
        }
        if last {
            return Ok(());
        }
    }
}
