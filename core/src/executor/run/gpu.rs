//! GPU launches of the executor kernel (`kernels/cuda/src/executor/executor_body.cuh`, built
//! three times: [`kernels::executor::EXECUTOR`] for up to 1024 threads per block,
//! [`kernels::executor::EXECUTOR_PREFETCH`] and [`kernels::executor::EXECUTOR_NARROW`] for up
//! to 256): one launch per execution, `lanes` GPU blocks per thread block of the plan, on the
//! caller's stream.

use mscclpp_hal::prelude::*;
use mscclpp_hal::Gpu;

use super::context::ExecContext;
use crate::collectives::gpu::GpuCtx;
use crate::collectives::DataType;
use crate::env::ExecutorKernel;
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

/// The SM count and compute capability of `g`'s GPU (one properties query).
pub(crate) fn sms_and_arch(g: &GpuCtx) -> Result<(u32, (u32, u32))> {
    let p = Gpu::properties(g.device()).map_err(|e| hal_err("query the GPU's properties", e))?;
    Ok((p.sm_count, p.compute_capability))
}

/// The most GPU blocks per plan thread block (the kernel's lanes; `MSCCLPP_EXECUTOR_MAX_LANES`
/// lowers it). A one-block plan of 2 ranks
/// sharing an H200 may use 64 of their 66 SMs each (the native algorithms use up to all of
/// them at 16 MiB); plans of more blocks are bounded by the SMs first.
pub(crate) const MAX_LANES: usize = 64;

/// GPU blocks per plan thread block for a message of `bytes` on `nblocks` plan blocks: one
/// per `per_lane` bytes of each block's share (below it another lane does not pay for its lane
/// barriers), at most [`MAX_LANES`] (`MSCCLPP_EXECUTOR_MAX_LANES` lowers it) and what the SMs
/// left to this rank hold (`max_grid`: every block must be resident), at least 1.
pub(crate) fn lanes(max_grid: u32, nblocks: u32, bytes: usize, per_lane: usize) -> u32 {
    let nb = nblocks.max(1) as usize;
    let want = bytes.div_ceil(nb * per_lane.max(1));
    let fit = max_grid as usize / nb;
    let most = crate::env::env().executor_max_lanes().min(MAX_LANES);
    want.min(fit).clamp(1, most) as u32
}

/// The fewest threads per GPU block a one-lane launch gets (whole warps).
const MIN_THREADS: usize = 128;

/// Bytes of a lane's share per thread an LL plan's multi-lane launch aims at (each thread
/// polls its packets in turn).
const LL_BYTES_PER_THREAD: usize = 256;

/// A launch's shape: lanes per plan block and threads per GPU block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub lanes: u32,
    pub threads: u32,
}

/// What decides a launch's shape besides the message: the plan and the knobs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShapeInputs {
    /// The plan's `num_threads_per_block`.
    pub plan_threads: u32,
    /// LL (packet) plan.
    pub packet: bool,
    /// Port channels: one lane (their data moves through the proxy's copies, which on one GPU
    /// are kernels of their own; with every SM held by lanes spinning on the signals after
    /// those copies, `allgather_port_n4` hung at 1 MiB on the H200, 4 ranks sharing it).
    pub ports: bool,
    /// The SMs left to this rank (`ExecContext::max_grid`).
    pub max_grid: u32,
    /// `MSCCLPP_EXECUTOR_BYTES_PER_LANE` when set.
    pub bytes_per_lane: Option<usize>,
    /// `MSCCLPP_EXECUTOR_THREADS` when set.
    pub threads: Option<u32>,
}

/// The shape of a launch of `bytes` on `nblocks` plan blocks. By the H200's plan-sweep of
/// round 12 (2 ranks sharing it, docs/perf.md), unless the knobs say otherwise:
/// - lanes: one per 32 KiB of a block's share, 8 KiB for LL plans ([`lanes`]);
/// - one lane: the threads its vectors need ([`threads`]);
/// - several lanes, Simple plans: [`NARROW_THREADS`] per lane (a 256-thread build; 1.3-1.6x
///   faster than the plan's 1024 at 1 and 16 MiB);
/// - several lanes, LL plans: one thread per [`LL_BYTES_PER_THREAD`] of a lane's share, from
///   [`NARROW_THREADS`] up to the plan's (256 narrow threads won at 1 MiB, 1024 at 16 MiB).
pub(crate) fn shape(inp: &ShapeInputs, nblocks: u32, bytes: usize) -> Shape {
    let default_per_lane = if inp.packet {
        crate::env::EXECUTOR_BYTES_PER_LANE_LL
    } else {
        crate::env::EXECUTOR_BYTES_PER_LANE_DEFAULT
    };
    let lanes = if inp.ports {
        1
    } else {
        lanes(
            inp.max_grid,
            nblocks,
            bytes,
            inp.bytes_per_lane.unwrap_or(default_per_lane),
        )
    };
    let threads = match inp.threads {
        Some(t) => threads(t, nblocks, bytes, lanes),
        None if lanes == 1 => threads(inp.plan_threads, nblocks, bytes, 1),
        None if !inp.packet => inp.plan_threads.min(NARROW_THREADS),
        None => {
            let share = bytes.div_ceil(nblocks.max(1) as usize * lanes as usize);
            let want = share.div_ceil(LL_BYTES_PER_THREAD).div_ceil(32) * 32;
            u32::try_from(want)
                .unwrap_or(u32::MAX)
                .max(NARROW_THREADS)
                .min(inp.plan_threads)
        }
    };
    Shape { lanes, threads }
}

/// Threads per GPU block for a launch of `lanes` lanes per plan block, a message of `bytes` on
/// `nblocks` plan blocks and `plan_threads` (the plan's, or the knob's): those, but a one-lane
/// launch only as many as its block's share has 16-byte vectors (whole warps, at least
/// [`MIN_THREADS`]). Every op costs each thread of a block its dispatch, while a 1 KiB message
/// has 64 vectors; no op depends on the thread count (the host interpreter runs the same lists
/// on 1 or more threads per block), so it is a matter of speed only.
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

/// Threads per block the 256-thread builds of the kernel (`executor_prefetch.cu`,
/// `executor_narrow.cu`) are compiled for.
pub(crate) const NARROW_THREADS: u32 = 256;

/// The build of the executor kernel a launch of `threads` threads per block takes: a 256-thread
/// build whenever it fits (compiled for 256 threads, the compiler may give each thread up to
/// 255 registers where the 1024-thread build has 64 and spills): the prefetch one (its
/// reductions load the next input while they combine one: 3-9 % faster at 16 MiB on the H100,
/// docs/perf.md), or with `MSCCLPP_EXECUTOR_KERNEL=narrow` the one without; `wide` takes the
/// 1024-thread build always.
pub(crate) fn kernel(threads: u32, choice: ExecutorKernel) -> kernels::Kernel {
    match choice {
        ExecutorKernel::Auto if threads <= NARROW_THREADS => kernels::executor::EXECUTOR_PREFETCH,
        ExecutorKernel::Narrow if threads <= NARROW_THREADS => kernels::executor::EXECUTOR_NARROW,
        _ => kernels::executor::EXECUTOR,
    }
}

/// The thread bound a compiled plan (jit.rs) is built for when launched with `threads` threads
/// per block: [`NARROW_THREADS`] where they fit (as [`kernel`] picks the 256-thread build), else
/// 1024; `None` above `max` (`MSCCLPP_EXECUTOR_JIT_THREADS`, default 1024: never), where the
/// launch runs on the interpreter. History: on the H200 in round 15 every one-lane launch of
/// 1024 threads was slower compiled than interpreted (`allreduce_simple_n2` at 32 KiB 39.0
/// against 29.3 us), so only launches of up to 256 were compiled. The generated kernels then
/// kept their `ExecOp`s in local memory (`ptxas -v`, sm_90: a 1920-byte stack frame in
/// `allreduce_simple_n2`, every thread writing its own copy). With the ops' loops unrolled in
/// generated kernels (executor_body.cuh's EXEC_FOR_EACH and EXEC_FOR_THREAD) and a
/// `__grid_constant__` parameter, the 1024-thread launches were the fastest of the three on an
/// H100 (round 16, docs/perf.md: `allreduce_simple_n2` at 16 KiB 10.53 us compiled, 28.69
/// interpreted).
pub(crate) fn jit_bound(threads: u32, max: u32) -> Option<u32> {
    (threads <= max).then_some(if threads <= NARROW_THREADS {
        NARROW_THREADS
    } else {
        1024
    })
}

/// Every plan block must be resident at once (they wait on each other).
pub(crate) fn check_resident(
    plan: &ExecutionPlan,
    ctx: &ExecContext,
    args: &ExecArgs,
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{kernel, shape, threads, ExecutorKernel, Shape, ShapeInputs};
    use crate::kernels;

    #[test]
    fn launch_shapes_follow_the_protocol_and_the_knobs() {
        let simple = ShapeInputs {
            plan_threads: 1024,
            packet: false,
            ports: false,
            max_grid: 66,
            bytes_per_lane: None,
            threads: None,
        };
        let ll = ShapeInputs {
            packet: true,
            ..simple
        };
        let s = |lanes, threads| Shape { lanes, threads };
        // 1 KiB: one lane, the threads of its vectors (narrow), either protocol.
        assert_eq!(shape(&simple, 1, 1 << 10), s(1, 128));
        assert_eq!(shape(&ll, 1, 1 << 10), s(1, 128));
        // Simple: a lane per 32 KiB, 256 threads each once there are several.
        assert_eq!(shape(&simple, 1, 1 << 20), s(32, 256));
        assert_eq!(shape(&simple, 1, 16 << 20), s(64, 256));
        // LL: a lane per 8 KiB; a thread per 256 bytes of a lane's share, 256 at least.
        assert_eq!(shape(&ll, 1, 1 << 20), s(64, 256));
        assert_eq!(shape(&ll, 1, 16 << 20), s(64, 1024));
        assert_eq!(shape(&ll, 1, 4 << 20), s(64, 256));
        assert_eq!(shape(&ll, 1, 8 << 20), s(64, 512));
        // Never more threads than the plan's, never more lanes than the SMs hold.
        assert_eq!(
            shape(
                &ShapeInputs {
                    plan_threads: 128,
                    ..ll
                },
                1,
                16 << 20
            ),
            s(64, 128)
        );
        assert_eq!(
            shape(
                &ShapeInputs {
                    max_grid: 8,
                    ..simple
                },
                2,
                16 << 20
            ),
            s(4, 256)
        );
        // Port channels: one lane.
        assert_eq!(
            shape(
                &ShapeInputs {
                    ports: true,
                    ..simple
                },
                1,
                16 << 20
            ),
            s(1, 1024)
        );
        // The knobs replace the defaults.
        let knobs = ShapeInputs {
            bytes_per_lane: Some(1 << 20),
            threads: Some(512),
            ..ll
        };
        assert_eq!(shape(&knobs, 1, 16 << 20), s(16, 512));
        assert_eq!(shape(&knobs, 1, 1 << 10), s(1, 128));
    }

    #[test]
    fn launches_that_fit_take_a_256_thread_build() {
        let prefetch = kernels::executor::EXECUTOR_PREFETCH.name();
        let narrow = kernels::executor::EXECUTOR_NARROW.name();
        let wide = kernels::executor::EXECUTOR.name();
        assert_eq!(prefetch, "executor_kernel_prefetch");
        assert_eq!(narrow, "executor_kernel_narrow");
        let auto = ExecutorKernel::Auto;
        assert_eq!(kernel(128, auto).name(), prefetch);
        assert_eq!(kernel(256, auto).name(), prefetch);
        assert_eq!(kernel(288, auto).name(), wide);
        assert_eq!(kernel(1024, auto).name(), wide);
        // MSCCLPP_EXECUTOR_KERNEL=wide: never a 256-thread one.
        assert_eq!(kernel(128, ExecutorKernel::Wide).name(), wide);
        // MSCCLPP_EXECUTOR_KERNEL=narrow: the 256-thread build without the prefetch.
        let nar = ExecutorKernel::Narrow;
        assert_eq!(kernel(256, nar).name(), narrow);
        assert_eq!(kernel(1024, nar).name(), wide);
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
