//! Helpers shared by the integration tests; each test binary uses only some of them.
#![allow(dead_code)]

pub mod direct;
pub mod handle;
pub mod json;
pub mod reference;
pub mod scratch;
pub mod server;
