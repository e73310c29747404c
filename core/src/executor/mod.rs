//! The executor: runs JSON execution plans (upstream MSCCL++'s format, as its Python DSL
//! writes them) as one kernel launch on GPUs, or on CPU threads on the host backend.
//!
//! - [`ExecutionPlan`] parses a plan with serde and validates it for every rank before
//!   anything is set up; errors ([`PlanError`]) name the JSON path and the operation.
//! - [`Executor::execute`] sets up connections, channels, remote buffers, scratch and
//!   semaphores on first use of a (plan, buffers) pair and caches them; lowers the plan for
//!   the message size into `#[repr(C)]` per-block op lists ([`device`]); then either launches
//!   `kernels/cuda/src/executor/executor_body.cuh` (each block copies its op list into shared memory
//!   and interprets it) or interprets the same lists on one CPU thread per thread block
//!   through [`crate::device_emu`].
//! - [`cache`] finds plans under `MSCCLPP_CACHE_DIR` for the collectives and the NCCL library.
//!
//! # Layers
//! Each layer imports only from the ones above it in this list (no file imports one that
//! imports it back):
//! 1. `limits` (the `MAX_*` sizes), [`json`] (the file format), `model` (the plan's
//!    in-memory form), `error` ([`PlanError`]);
//! 2. `validate`: JSON to the in-memory form, every check that does not depend on the message
//!    size (`shape` holds the table of operation shapes);
//! 3. `ports` (a plan's port channels as memory channels, for ranks on one node) and `plan`:
//!    [`ExecutionPlan`], a validated plan for one rank;
//! 4. `lower`: the device form ([`device`]), chunk geometry for a message size (`layout`),
//!    what a message size can refuse (`LowerError`), and lowering a plan into the device form;
//! 5. [`cache`] (finding a plan for a call) and `run`: [`Executor`], the resources of a plan
//!    (`context`), the GPU launch (`gpu`) and the host interpreter (`host`).

pub mod cache;
mod error;
pub mod json;
mod limits;
mod lower;
mod model;
mod plan;
mod ports;
mod run;
mod validate;

pub use cache::{find_plan, PlanQuery};
pub use error::{OpLocation, PlanError};
pub use json::{BufferType, ChannelType, OpName, PlanReduceOp, Protocol};
pub use limits::{
    MAX_BARRIERS, MAX_BUFFERS_PER_OP, MAX_CHANNELS_PER_BLOCK, MAX_CHANNELS_PER_OP,
    MAX_OPS_PER_BLOCK, MAX_REMOTE_BUFFERS_PER_BLOCK, MAX_SEMAPHORES_PER_OP, MAX_THREADBLOCKS,
    REUSE_SCRATCH_BYTES,
};
pub use lower::device;
pub use plan::ExecutionPlan;
pub use run::config::{ExecutorConfig, PacketType, PortChannels};
pub use run::trace::{BlockTrace, OpTrace, PlanTrace};
pub use run::Executor;
