//! GPU launches of the executor kernel (`kernels/cuda/src/executor/executor_body.cuh`, built
//! twice: [`kernels::executor::EXECUTOR`] for up to 1024 threads per block,
//! [`kernels::executor::EXECUTOR_NARROW`] for up to 256): one launch per execution, `lanes` GPU
//! blocks per thread block of the plan, on the caller's stream.

use mscclpp_hal::prelude::*;
use mscclpp_hal::Gpu;

use super::context::ExecContext;
use crate::collectives::gpu::GpuCtx;
use crate::collectives::{DataType, RawStream};
use crate::error::{Error, Result};
use crate::executor::lower::device::ExecArgs;
use crate::executor::plan::ExecutionPlan;
use crate::kernels;
use crate::memory::hal_err;

/// `ExecDataType` of the C header.
pub(crate) fn dtype_code(d: DataType) -> u32 {
    match d {
        DataType::I8 => 0,
        DataType::U8 => 1,
        DataType::I32 => 2,
        DataType::U32 => 3,
        DataType::I64 => 4,
        DataType::U64 => 5,
        DataType::F16 => 6,
        DataType::F32 => 7,
        DataType::F64 => 8,
        DataType::Bf16 => 9,
        DataType::Fp8E4M3 => 10,
        DataType::Fp8E5M2 => 11,
    }
}

/// The SM count of `g`'s GPU.
pub(crate) fn sm_count(g: &GpuCtx) -> Result<u32> {
    Ok(Gpu::properties(g.device())
        .map_err(|e| hal_err("query the GPU's properties", e))?
        .sm_count)
}

/// The most GPU blocks per plan thread block (the kernel's lanes; `MSCCLPP_EXECUTOR_MAX_LANES`
/// lowers it). A one-block plan of 2 ranks
/// sharing an H200 may use 64 of their 66 SMs each (the native algorithms use up to all of
/// them at 16 MiB); plans of more blocks are bounded by the SMs first.
pub(crate) const MAX_LANES: usize = 64;

/// GPU blocks per plan thread block for a message of `bytes` on `nblocks` plan blocks: one
/// per `MSCCLPP_EXECUTOR_BYTES_PER_LANE` (default 32 KiB: below it another lane does not pay
/// for its lane barriers) of each block's share, at most [`MAX_LANES`] and what the SMs left
/// to this rank hold (every block must be resident), at least 1.
pub(crate) fn lanes(ctx: &ExecContext, nblocks: u32, bytes: usize) -> u32 {
    let nb = nblocks.max(1) as usize;
    let per_lane = crate::env::env().executor_bytes_per_lane().max(1);
    let want = bytes.div_ceil(nb * per_lane);
    let fit = ctx.max_grid as usize / nb;
    let most = crate::env::env().executor_max_lanes().min(MAX_LANES);
    want.min(fit).clamp(1, most) as u32
}

/// The fewest threads per GPU block a one-lane launch gets (whole warps).
const MIN_THREADS: usize = 128;

/// Threads per GPU block for a launch of `lanes` lanes per plan block, a message of `bytes` on
/// `nblocks` plan blocks and the plan's `plan_threads`: the plan's, but a one-lane launch only
/// as many as its block's share has 16-byte vectors (whole warps, at least [`MIN_THREADS`]).
/// Every op costs each thread of a block its dispatch, while a 1 KiB message has 64 vectors;
/// no op depends on the thread count (the host interpreter runs the same lists on 1 or more
/// threads per block), so it is a matter of speed only.
pub(crate) fn threads(plan_threads: u32, nblocks: u32, bytes: usize, lanes: u32) -> u32 {
    if lanes > 1 {
        return plan_threads;
    }
    let per_block = bytes.div_ceil(nblocks.max(1) as usize);
    let want = per_block.div_ceil(16).div_ceil(32) * 32;
    u32::try_from(want.max(MIN_THREADS))
        .unwrap_or(u32::MAX)
        .min(plan_threads)
}

/// Threads per block the narrow build of the kernel (`executor_narrow.cu`) is compiled for.
pub(crate) const NARROW_THREADS: u32 = 256;

/// The build of the executor kernel a launch of `threads` threads per block takes: the narrow
/// one whenever it fits (compiled for 256 threads, the compiler may give each thread up to 255
/// registers where the 1024-thread build has 64 and spills), unless `wide`
/// (`MSCCLPP_EXECUTOR_KERNEL=wide`).
pub(crate) fn kernel(threads: u32, wide: bool) -> kernels::Kernel {
    if !wide && threads <= NARROW_THREADS {
        kernels::executor::EXECUTOR_NARROW
    } else {
        kernels::executor::EXECUTOR
    }
}

/// Launches the executor kernel for `args` on `stream` (`args.lanes` GPU blocks per plan
/// block of `threads` threads).
///
/// # Safety
/// Every address in `args` stays valid until the kernel finished; `stream` is 0 or a live
/// stream of `g`'s device.
pub(crate) unsafe fn launch(
    g: &GpuCtx,
    plan: &ExecutionPlan,
    ctx: &ExecContext,
    args: ExecArgs,
    threads: u32,
    stream: RawStream,
) -> Result<()> {
    if args.nblocks > ctx.sms {
        return Err(Error::Executor(format!(
            "plan `{}`: {} thread blocks on GPU {} with {} SMs: every block must be resident (they wait on each other)",
            plan.name(),
            args.nblocks,
            ctx.device.id,
            ctx.sms
        )));
    }
    // SAFETY: forwarded from the caller; ExecArgs mirrors the kernel's parameter (both
    // builds take the same one).
    unsafe {
        g.launch(
            kernel(threads, crate::env::env().executor_kernel_wide()),
            args.nblocks * args.lanes.max(1),
            threads,
            &args,
            stream,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{kernel, threads};
    use crate::kernels;

    #[test]
    fn launches_that_fit_take_the_narrow_build() {
        let narrow = kernels::executor::EXECUTOR_NARROW.name();
        let wide = kernels::executor::EXECUTOR.name();
        assert_eq!(narrow, "executor_kernel_narrow");
        assert_eq!(kernel(128, false).name(), narrow);
        assert_eq!(kernel(256, false).name(), narrow);
        assert_eq!(kernel(288, false).name(), wide);
        assert_eq!(kernel(1024, false).name(), wide);
        // MSCCLPP_EXECUTOR_KERNEL=wide: never the narrow one.
        assert_eq!(kernel(128, true).name(), wide);
    }

    #[test]
    fn one_lane_launches_get_the_threads_their_vectors_need() {
        // 1 KiB on one block: 64 vectors, at least 128 threads.
        assert_eq!(threads(1024, 1, 1024, 1), 128);
        // 8 KiB: 512 vectors; 3 blocks: 171 vectors each, in whole warps.
        assert_eq!(threads(1024, 1, 8 << 10, 1), 512);
        assert_eq!(threads(1024, 3, 8 << 10, 1), 192);
        // 16 KiB and more per block, or several lanes: the plan's threads.
        assert_eq!(threads(1024, 1, 16 << 10, 1), 1024);
        assert_eq!(threads(1024, 1, 16 << 20, 1), 1024);
        assert_eq!(threads(1024, 1, 1024, 4), 1024);
        // Never more than the plan asks for.
        assert_eq!(threads(64, 1, 1024, 1), 64);
        assert_eq!(threads(256, 1, 1 << 20, 1), 256);
    }
}
