//! ModelSupervisor: spawns and supervises one model's actor tree (Sampler, Postprocess
//! pool, Scheduler, Engine, Preprocess pool), all linked to it.
//!
//! # Failure policy
//! - The Engine is the actor that meets device faults (a CUDA error, a panic in a kernel
//!   launcher). When it fails, the model is marked not ready, the Scheduler is told
//!   (`EngineFailed`) and sends an error chunk to every request whose KV state the engine
//!   held, a fresh Engine with an empty KV cache is spawned, and the Scheduler gets it
//!   (`EngineReady`): queued requests are then served. More than `MAX_RESTARTS` failures
//!   within `RESTART_WINDOW` leave the model not ready for good.
//! - Any other actor holds request state that a restart would lose, so its failure stops
//!   the whole tree: every open stream closes, which clients see as an error (never a
//!   hang), and the model stays not ready.
//!
//! Messages: `SupervisorMsg::{Refs, InjectEngineFault}` from the ModelHandle.

use std::sync::atomic::AtomicU64;
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
use crate::model::Llama;
use crate::scheduler::SchedulerConfig;
use crate::tokenizer::Tokenizer;

const MAX_RESTARTS: usize = 5;
const RESTART_WINDOW: Duration = Duration::from_secs(60);

pub struct ModelSupervisor;

pub struct SupervisorArgs {
    pub model: Arc<Llama>,
    pub tokenizer: Arc<Tokenizer>,
    pub scheduler: SchedulerConfig,
    pub preprocess_workers: usize,
    pub postprocess_workers: usize,
    pub ready: watch::Sender<bool>,
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
    /// Test hook: make the current engine fail at its next step.
    InjectEngineFault,
}

pub struct SupervisorState {
    model: Arc<Llama>,
    block_size: usize,
    num_blocks: usize,
    sampler: ActorRef<SamplerMsg>,
    scheduler: ActorRef<SchedulerMsg>,
    engine: ActorRef<EngineMsg>,
    postprocess: Vec<ActorRef<PostprocessMsg>>,
    preprocess: Vec<ActorRef<PreprocessMsg>>,
    ready: watch::Sender<bool>,
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
        let cfg = args.model.config().clone();
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
        let (block_size, num_blocks) = (args.scheduler.block_size, args.scheduler.num_blocks);
        let sa = SchedulerArgs {
            config: args.scheduler,
            sampler: sampler.clone(),
            postprocess: postprocess.clone(),
        };
        let (scheduler, _) = Actor::spawn_linked(None, SchedulerActor, sa, cell.clone()).await?;
        let engine = spawn_engine(&myself, &args.model, block_size, num_blocks, &sampler).await?;
        scheduler.cast(SchedulerMsg::EngineReady(engine.clone()))?;
        let next_seq = Arc::new(AtomicU64::new(1));
        let mut preprocess = Vec::new();
        for _ in 0..args.preprocess_workers.max(1) {
            let pa = PreprocessArgs {
                tokenizer: args.tokenizer.clone(),
                vocab_size: cfg.vocab_size,
                max_seq_len: cfg.max_position_embeddings,
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
            model: args.model,
            block_size,
            num_blocks,
            sampler,
            scheduler,
            engine,
            postprocess,
            preprocess,
            ready: args.ready,
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
            SupervisorMsg::InjectEngineFault => state.engine.cast(EngineMsg::InjectFault)?,
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (who, error) = match event {
            SupervisionEvent::ActorFailed(who, err) => (who, err.to_string()),
            SupervisionEvent::ActorTerminated(who, _, reason) => {
                (who, reason.unwrap_or_else(|| "stopped".into()))
            }
            _ => return Ok(()),
        };
        if who.get_id() != state.engine.get_id() {
            tracing::error!(actor = %who.get_id(), %error, "a pipeline actor failed; stopping the model");
            let _ = state.ready.send(false);
            myself.stop(Some(format!("pipeline actor failed: {error}")));
            return Ok(());
        }
        tracing::error!(%error, "engine failed; restarting it");
        let _ = state.ready.send(false);
        state.scheduler.cast(SchedulerMsg::EngineFailed { error })?;
        let now = Instant::now();
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
            return Ok(());
        }
        state.engine = spawn_engine(
            &myself,
            &state.model,
            state.block_size,
            state.num_blocks,
            &state.sampler,
        )
        .await?;
        state
            .scheduler
            .cast(SchedulerMsg::EngineReady(state.engine.clone()))?;
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
        state.engine.stop(None);
        state.sampler.stop(None);
        for p in &state.postprocess {
            p.stop(None);
        }
        Ok(())
    }
}

async fn spawn_engine(
    supervisor: &ActorRef<SupervisorMsg>,
    model: &Arc<Llama>,
    block_size: usize,
    num_blocks: usize,
    sampler: &ActorRef<SamplerMsg>,
) -> Result<ActorRef<EngineMsg>, ActorProcessingErr> {
    let args = EngineArgs {
        model: model.clone(),
        block_size,
        num_blocks,
        sampler: sampler.clone(),
    };
    Ok(
        Actor::spawn_linked(None, Engine, args, supervisor.get_cell())
            .await?
            .0,
    )
}
