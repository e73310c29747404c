//! The executor's limits: how large a plan's device form may grow. The kernel
//! (`kernels/cuda/include/mscclpp/executor_device.hpp`) sizes its structs with the same numbers;
//! validation refuses plans above them.

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
