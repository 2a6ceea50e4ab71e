//! ModelSupervisor: spawns and supervises one model's actor tree (Sampler, Postprocess
//! pool, Scheduler, Engine, Preprocess pool), all linked to it.
//!
//! # Failure policy
//! - The Engine is the actor that meets device faults (a CUDA error, a panic in a kernel
//!   launcher). When it fails, the model is marked not ready, the Scheduler is told
//!   (`EngineFailed`) and sends an error chunk to every request whose KV state the engine
//!   held, a fresh Engine with an empty KV cache is spawned, and the Scheduler gets it
//!   (`EngineReady`): queued requests are then served. More than `MAX_RESTARTS` failures
//!   within `RESTART_WINDOW` stop the whole tree as below (queued requests too get their
//!   error instead of waiting for an engine that will not come), and the model stays not
//!   ready. Only failures of engines that completed no step count (a crash loop): an
//!   engine that served clears the count.
//! - A device error (`Error::Cuda`, such as an illegal address that leaves the CUDA context
//!   unusable) is recovered from before the restart: every backend of the engine group lets
//!   go of the device (`Backend::release`), then loads its weights onto a fresh context
//!   (`Backend::restore`), readiness false throughout. When that fails the model is lost:
//!   the tree stops and `lost` says why, so that `inflight serve` exits non-zero and an
//!   orchestrator restarts the process, instead of a dead engine behind a green health check.
//! - Any other actor holds request state that a restart would lose, so its failure stops
//!   the whole tree: every open stream closes, which clients see as an error (never a
//!   hang), and the model stays not ready.
//!
//! Messages: `SupervisorMsg::{Refs, InjectFault}` from the ModelHandle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::watch;

use super::engine::{Engine, EngineArgs};
use super::messages::{EngineMsg, PostprocessMsg, PreprocessMsg, SamplerMsg, SchedulerMsg};
use super::postprocess::{Postprocess, PostprocessArgs};
use super::preprocess::{Preprocess, PreprocessArgs};
use super::sampler::{Sampler, SamplerArgs};
use super::scheduler::{SchedulerActor, SchedulerArgs};
use super::speculative::{Drafter, Speculative, SpeculativeArgs};
use crate::error::Error;
use crate::guide::Guides;
use crate::model::{Backend, Fault, ModelConfig};
use crate::scheduler::SchedulerConfig;
use crate::speculative::{DraftSource, SpeculativeOptions};
use crate::tokenizer::Tokenizer;

const MAX_RESTARTS: usize = 5;
const RESTART_WINDOW: Duration = Duration::from_secs(60);

pub struct ModelSupervisor;

pub struct SupervisorArgs {
    pub config: ModelConfig,
    pub backend: Arc<dyn Backend>,
    pub speculative: Option<SpeculativeOptions>,
    pub tokenizer: Arc<Tokenizer>,
    pub scheduler: SchedulerConfig,
    pub preprocess_workers: usize,
    pub postprocess_workers: usize,
    pub ready: watch::Sender<bool>,
    /// Set, with the reason, when the model's device could not be recovered.
    pub lost: watch::Sender<Option<String>>,
}

/// The actors a ModelHandle talks to.
#[derive(Clone)]
pub struct TreeRefs {
    pub scheduler: ActorRef<SchedulerMsg>,
    pub preprocess: Vec<ActorRef<PreprocessMsg>>,
    pub postprocess: Vec<ActorRef<PostprocessMsg>>,
}

pub enum SupervisorMsg {
    /// The refs of the tree's entry points.
    Refs(RpcReplyPort<TreeRefs>),
    /// Fault injection: the current engine meets this fault at its next step.
    InjectFault(Fault),
}

pub struct SupervisorState {
    engines: EngineSpec,
    sampler: ActorRef<SamplerMsg>,
    scheduler: ActorRef<SchedulerMsg>,
    engine: EngineGroup,
    /// Actors of engine groups stopped after a failure, whose exits are expected.
    retired: Vec<ractor::ActorId>,
    postprocess: Vec<ActorRef<PostprocessMsg>>,
    preprocess: Vec<ActorRef<PreprocessMsg>>,
    ready: watch::Sender<bool>,
    lost: watch::Sender<Option<String>>,
    restarts: Vec<Instant>,
}

impl Actor for ModelSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let cell = myself.get_cell();
        let cfg = args.config.clone();
        let sampler_args = SamplerArgs {
            vocab_size: cfg.vocab_size,
            eos_ids: args.tokenizer.eos_token_ids().to_vec(),
        };
        let (sampler, _) = Actor::spawn_linked(None, Sampler, sampler_args, cell.clone()).await?;
        let mut postprocess = Vec::new();
        for _ in 0..args.postprocess_workers.max(1) {
            let pa = PostprocessArgs {
                tokenizer: args.tokenizer.clone(),
            };
            postprocess.push(
                Actor::spawn_linked(None, Postprocess, pa, cell.clone())
                    .await?
                    .0,
            );
        }
        let engines = EngineSpec {
            backend: args.backend,
            speculative: args.speculative,
            block_size: args.scheduler.block_size,
            num_blocks: args.scheduler.num_blocks,
            num_host_blocks: args.scheduler.num_host_blocks,
            vocab_size: cfg.vocab_size,
            eos_ids: args.tokenizer.eos_token_ids().to_vec(),
        };
        // Iterations are planned ahead when the engine samples on its device and no draft
        // source stands in front of it, unless the config turns it off.
        let overlap =
            engines.backend.samples() && engines.speculative.is_none() && args.scheduler.overlap;
        let sa = SchedulerArgs {
            default_draft_tokens: engines.speculative.as_ref().map(|s| s.num_draft_tokens),
            config: args.scheduler,
            sampler: sampler.clone(),
            postprocess: postprocess.clone(),
            overlap,
            eos_ids: args.tokenizer.eos_token_ids().to_vec(),
        };
        let (scheduler, _) = Actor::spawn_linked(None, SchedulerActor, sa, cell.clone()).await?;
        let engine = engines.spawn(&myself, &sampler).await?;
        scheduler.cast(SchedulerMsg::EngineReady(engine.front.clone()))?;
        let next_seq = Arc::new(AtomicU64::new(1));
        let guides = Arc::new(Guides::new(args.tokenizer.clone()));
        let mut preprocess = Vec::new();
        for _ in 0..args.preprocess_workers.max(1) {
            let pa = PreprocessArgs {
                tokenizer: args.tokenizer.clone(),
                guides: guides.clone(),
                vocab_size: cfg.vocab_size,
                max_seq_len: cfg.max_position_embeddings,
                speculative: engines.speculative.is_some(),
                scheduler: scheduler.clone(),
                postprocess: postprocess.clone(),
                next_seq: next_seq.clone(),
            };
            preprocess.push(
                Actor::spawn_linked(None, Preprocess, pa, cell.clone())
                    .await?
                    .0,
            );
        }
        let _ = args.ready.send(true);
        Ok(SupervisorState {
            engines,
            retired: Vec::new(),
            sampler,
            scheduler,
            engine,
            postprocess,
            preprocess,
            ready: args.ready,
            lost: args.lost,
            restarts: Vec::new(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Refs(reply) => {
                let _ = reply.send(TreeRefs {
                    scheduler: state.scheduler.clone(),
                    preprocess: state.preprocess.clone(),
                    postprocess: state.postprocess.clone(),
                });
            }
            SupervisorMsg::InjectFault(fault) => {
                state.engine.front.cast(EngineMsg::InjectFault(fault))?
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (who, error, device) = match event {
            SupervisionEvent::ActorFailed(who, err) => {
                let device = matches!(err.downcast_ref::<Error>(), Some(Error::Cuda(_)));
                (who, err.to_string(), device)
            }
            SupervisionEvent::ActorTerminated(who, _, reason) => {
                (who, reason.unwrap_or_else(|| "stopped".into()), false)
            }
            _ => return Ok(()),
        };
        if let Some(i) = state.retired.iter().position(|&id| id == who.get_id()) {
            state.retired.swap_remove(i);
            return Ok(());
        }
        if !state.engine.contains(&who) {
            tracing::error!(actor = %who.get_id(), %error, "a pipeline actor failed; stopping the model");
            let _ = state.ready.send(false);
            myself.stop(Some(format!("pipeline actor failed: {error}")));
            return Ok(());
        }
        tracing::error!(%error, "engine failed; restarting it");
        let _ = state.ready.send(false);
        // The rest of the group goes too: its state belongs to the failed engine's.
        state.engine.stop_all();
        state.retired.extend(
            state
                .engine
                .members
                .iter()
                .map(|m| m.get_id())
                .filter(|&id| id != who.get_id()),
        );
        state.scheduler.cast(SchedulerMsg::EngineFailed {
            error: error.clone(),
        })?;
        let now = Instant::now();
        if state.engine.served.load(Ordering::Relaxed) > 0 {
            state.restarts.clear();
        }
        state
            .restarts
            .retain(|t| now.duration_since(*t) < RESTART_WINDOW);
        state.restarts.push(now);
        if state.restarts.len() > MAX_RESTARTS {
            tracing::error!(
                "engine failed {} times within {:?}; giving up",
                state.restarts.len(),
                RESTART_WINDOW
            );
            myself.stop(Some(format!("the engine failed too often: {error}")));
            return Ok(());
        }
        let backends = state.engines.backends();
        let started = Instant::now();
        let recovered = tokio::task::spawn_blocking(move || {
            // An engine that failed otherwise (a messaging error of the speculative front
            // whose draft engine met the device error first) may have left the device
            // unusable too.
            if !device && backends.iter().all(|b| b.healthy()) {
                return Ok(false);
            }
            tracing::warn!("device error: releasing the device, then loading the model again");
            recover(&backends).map(|()| true)
        })
        .await;
        match recovered {
            Ok(Ok(false)) => {}
            Ok(Ok(true)) => tracing::info!(
                seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
                "device recovered: the model is loaded again"
            ),
            Ok(Err(e)) => return give_up(&myself, state, format!("{e}")),
            Err(e) => return give_up(&myself, state, format!("the recovery stopped: {e}")),
        }
        state.engine = match state.engines.spawn(&myself, &state.sampler).await {
            Ok(group) => group,
            Err(e) => return give_up(&myself, state, format!("no engine starts again: {e}")),
        };
        state
            .scheduler
            .cast(SchedulerMsg::EngineReady(state.engine.front.clone()))?;
        let _ = state.ready.send(true);
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.ready.send(false);
        for p in &state.preprocess {
            p.stop(None);
        }
        state.scheduler.stop(None);
        state.engine.stop_all();
        state.sampler.stop(None);
        for p in &state.postprocess {
            p.stop(None);
        }
        Ok(())
    }
}

/// Lets every backend go of its device, then restores each (they may share a device,
/// whose context is destroyed only once none holds it).
fn recover(backends: &[Arc<dyn Backend>]) -> crate::error::Result<()> {
    for b in backends {
        b.release()?;
    }
    for b in backends {
        b.restore()?;
    }
    Ok(())
}

/// The device cannot serve the model again: says so (`lost`) and stops the tree.
fn give_up(
    myself: &ActorRef<SupervisorMsg>,
    state: &SupervisorState,
    why: String,
) -> Result<(), ActorProcessingErr> {
    let why = format!("the device could not be recovered: {why}");
    tracing::error!("{why}; stopping the model");
    let _ = state.ready.send(false);
    let _ = state.lost.send(Some(why.clone()));
    myself.stop(Some(why));
    Ok(())
}

/// What the engine group is made of, to start it and restart it.
struct EngineSpec {
    backend: Arc<dyn Backend>,
    speculative: Option<SpeculativeOptions>,
    block_size: usize,
    num_blocks: usize,
    /// The target engine's host cache (the draft engine's has none).
    num_host_blocks: usize,
    vocab_size: usize,
    eos_ids: Vec<u32>,
}

/// The actors that hold KV state: the target engine, and with speculative decoding the
/// orchestrator in front of it and the draft model's engine. They fail and restart
/// together.
struct EngineGroup {
    /// What the scheduler sends steps to.
    front: ActorRef<EngineMsg>,
    members: Vec<ActorRef<EngineMsg>>,
    /// Steps its engines completed.
    served: Arc<AtomicU64>,
}

impl EngineGroup {
    fn contains(&self, who: &ractor::ActorCell) -> bool {
        self.members.iter().any(|m| m.get_id() == who.get_id())
    }

    fn stop_all(&self) {
        for m in &self.members {
            m.stop(None);
        }
    }
}

impl EngineSpec {
    /// The backends of the group's engines: the target's, and a draft model's.
    fn backends(&self) -> Vec<Arc<dyn Backend>> {
        let mut all = vec![self.backend.clone()];
        if let Some(SpeculativeOptions {
            draft: DraftSource::Model { backend, .. },
            ..
        }) = &self.speculative
        {
            all.push(backend.clone());
        }
        all
    }

    async fn spawn(
        &self,
        supervisor: &ActorRef<SupervisorMsg>,
        sampler: &ActorRef<SamplerMsg>,
    ) -> Result<EngineGroup, ActorProcessingErr> {
        let cell = supervisor.get_cell();
        let served = Arc::new(AtomicU64::new(0));
        let start = |backend: Arc<dyn Backend>, sampler: Option<ActorRef<SamplerMsg>>| EngineArgs {
            backend,
            block_size: self.block_size,
            num_blocks: self.num_blocks,
            num_host_blocks: if sampler.is_some() {
                self.num_host_blocks
            } else {
                0
            },
            sampler,
            eos_ids: self.eos_ids.clone(),
            vocab_size: self.vocab_size,
            served: served.clone(),
        };
        let args = start(self.backend.clone(), Some(sampler.clone()));
        let (target, _) = Actor::spawn_linked(None, Engine, args, cell.clone()).await?;
        let Some(spec) = &self.speculative else {
            return Ok(EngineGroup {
                front: target.clone(),
                members: vec![target],
                served,
            });
        };
        let mut members = vec![target.clone()];
        let drafter = match &spec.draft {
            DraftSource::Model { backend, .. } => {
                let args = start(backend.clone(), None);
                let (draft, _) = Actor::spawn_linked(None, Engine, args, cell.clone()).await?;
                members.push(draft.clone());
                Drafter::Engine(draft)
            }
            DraftSource::PromptLookup {
                min_ngram,
                max_ngram,
            } => Drafter::PromptLookup {
                min_ngram: *min_ngram,
                max_ngram: *max_ngram,
            },
        };
        let args = SpeculativeArgs {
            target,
            drafter,
            vocab_size: self.vocab_size,
        };
        let (front, _) = Actor::spawn_linked(None, Speculative, args, cell).await?;
        members.push(front.clone());
        Ok(EngineGroup {
            front,
            members,
            served,
        })
    }
}
