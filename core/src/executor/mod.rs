//! The executor: runs JSON execution plans (upstream MSCCL++'s format, as its Python DSL
//! writes them) as one kernel launch on GPUs, or on CPU threads on the host backend.
//!
//! - [`ExecutionPlan`] parses a plan with serde and validates it for every rank before
//!   anything is set up (`validate`); errors name the JSON path.
//! - [`Executor::execute`] sets up connections, channels, remote buffers, scratch and
//!   semaphores on first use of a (plan, buffers) pair and caches them; lowers the plan for
//!   the message size into `#[repr(C)]` per-block op lists ([`device`]); then either launches
//!   `kernels/cuda/src/executor/executor.cu` (each block copies its op list into shared memory
//!   and interprets it) or interprets the same lists on one CPU thread per thread block
//!   through [`crate::device_emu`] (`host`).
//! - [`cache`] finds plans under `MSCCLPP_CACHE_DIR` for the collectives and the NCCL library.

pub mod cache;
mod context;
pub mod device;
mod gpu;
mod host;
pub mod json;
mod layout;
mod plan;
mod reduce;
mod run;
mod validate;
mod validate_ops;

pub use cache::{find_plan, PlanQuery};
pub use json::{BufferType, ChannelType, OpName, PlanReduceOp, Protocol};
pub use plan::ExecutionPlan;
pub use run::{Executor, ExecutorConfig, PacketType};

/// Thread blocks per rank a plan may have (a GPU launch is further limited by its SM count:
/// blocks spin on each other, so all must be resident).
pub const MAX_THREADBLOCKS: usize = 256;
/// Operations per thread block (a pipeline counts with its inner operations).
pub const MAX_OPS_PER_BLOCK: usize = 64;
/// Memory (and, separately, port) channels one thread block may name.
pub const MAX_CHANNELS_PER_BLOCK: usize = 16;
/// Remote buffers one thread block may name per channel type.
pub const MAX_REMOTE_BUFFERS_PER_BLOCK: usize = 16;
/// Channels one operation may name.
pub const MAX_CHANNELS_PER_OP: usize = 8;
/// Chunks on each side (src/dst) of one operation.
pub const MAX_BUFFERS_PER_OP: usize = 10;
/// Device semaphores one operation may name.
pub const MAX_SEMAPHORES_PER_OP: usize = 16;
/// Barrier ids (`barrier_id` below this).
pub const MAX_BARRIERS: usize = 16;
/// Scratch bytes a `reuse_resources` plan gets (upstream's predefined scratch size).
pub const REUSE_SCRATCH_BYTES: usize = 1 << 26;
