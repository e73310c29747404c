//! MSCCL++ in Rust: bootstrap, connections, registered memory, semaphores, channels, proxy.

pub mod bootstrap;
pub mod env;
pub mod error;

pub use error::{Error, ErrorCode, Result};
