//! The actors of one model tree (docs/architecture.md, "The actor tree"): one file per actor,
//! their messages in `messages`, the tree built and supervised by `supervisor`.

pub mod engine;
pub mod engine_sampling;
pub mod messages;
pub mod postprocess;
pub mod preprocess;
pub mod sampler;
pub mod scheduler;
pub mod speculative;
pub mod supervisor;
