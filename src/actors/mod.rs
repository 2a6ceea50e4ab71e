//! The actors of one model tree (docs/architecture.md, "The actor tree"): one file per actor,
//! their messages in `messages`, the tree built and supervised by `supervisor`.

pub(crate) mod engine;
pub(crate) mod engine_pooling;
pub(crate) mod engine_sampling;
pub mod messages;
pub(crate) mod postprocess;
pub(crate) mod preprocess;
pub(crate) mod sampler;
pub(crate) mod scheduler;
pub(crate) mod speculative;
pub(crate) mod supervisor;
