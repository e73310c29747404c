//! All-reduce `rsag_pipeline`: reduce-scatter + all-gather pushed through the plain scratch in
//! iterations, with the phases of different iterations overlapping. Any size (the scratch is
//! reused stage by stage), for large messages.
//!
//! Iteration i covers input bytes `[i n W, (i + 1) n W)`: slice r = `[i n W + r W, + W)`
//! (clipped at the end). Scratch stage `i % D` (stage = `2 n W` bytes): RS area (slot r: rank
//! r's contribution to this rank's slice), then AG area (slot r: rank r's reduced slice).
//! Blocks: `P` PUT blocks and `R = K P` REDUCE blocks; REDUCE r owns `mesh::part(len, R, r)`
//! of a slice, PUT g the parts of REDUCE `gK .. gK + K - 1`.
//! * PUT g (iteration i): once PUT 0 shook hands with every peer (semaphore row 63: the peers
//!   are inside this launch) and, for i >= D, its REDUCE blocks freed stage i % D (iteration
//!   i - D done), write its part of slice p of the input into slot `me` of peer p's RS area
//!   (remote stores), then mark the iteration ready for its REDUCE blocks.
//! * REDUCE r (iteration i): wait for the local PUT; handshake with block r of every peer (row
//!   r: their PUT parts have landed here); reduce its part of the own slice (own input, then RS
//!   slots, in rank order) into the output and into slot `me` of every peer's AG area;
//!   handshake; copy its part of every peer's AG slot into the output; mark the stage free.
//!
//! A stage is rewritten only after the REDUCE blocks of every peer finished it (the second
//! handshake precedes the "free" mark), so PUT runs up to D iterations ahead of REDUCE.
//!
//! The host backend runs the same roles in a fixed order per iteration (PUT blocks, then
//! REDUCE blocks), so the local waits hold by construction and every rank meets its peers'
//! handshakes in the same order. Kernel: kernels/cuda/src/collectives/allreduce/rsag_pipeline.cu.

use super::super::algorithm::{host_barrier, native_algorithm, Call, CollArgs};
use super::super::host_math::{reduce_into, with_elem, HostElem};
use super::super::mesh::{self, host_copy, part, peers, THREADS, VEC};
use super::super::setup::{Resources, MAX_SEM_BLOCKS};
use crate::error::Result;
use crate::kernels;

/// The algorithm object.
pub struct RsagPipeline;

/// REDUCE blocks per PUT block.
const K: usize = 2;
/// Scratch stages aimed for (the pipeline depth when the slice is capped by the scratch).
const STAGES: usize = 2;
/// Bytes of a slice per REDUCE block the grid is sized for.
const BYTES_PER_BLOCK: usize = 64 << 10;
/// The semaphore row of PUT 0's handshake.
const HANDSHAKE_ROW: usize = MAX_SEM_BLOCKS - 1;

/// The shape of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    /// Slice bytes per iteration.
    w: usize,
    /// Scratch stages.
    d: usize,
    /// Iterations.
    iters: usize,
}

fn plan(res: &Resources, call: &Call) -> Result<Plan> {
    let n = res.nranks();
    let cap = (res.layout().plain_bytes / (2 * n * STAGES)) / VEC * VEC;
    let whole = call.bytes().div_ceil(n).next_multiple_of(VEC);
    let w = whole.min(cap);
    if w < VEC {
        return Err(mesh::small_scratch(
            res,
            "allreduce rsag_pipeline",
            2 * n * STAGES * VEC,
        ));
    }
    Ok(Plan {
        w,
        d: res.layout().plain_bytes / (2 * n * w),
        iters: call.bytes().div_ceil(n * w),
    })
}

/// Bytes of the slice at `at` that exist in a buffer of `total` bytes.
fn slice_len(total: usize, at: usize, w: usize) -> usize {
    total.saturating_sub(at).min(w)
}

native_algorithm! {
    RsagPipeline: "rsag_pipeline", AllReduce;
    check(self, res, call) {
        plan(res, call).map(|_| ())
    }

    launch_gpu(self, res, gpu, call, stream) {
        let pl = plan(res, call)?;
        let census = mesh::census(res, gpu, stream)?;
        // P PUT + K P REDUCE blocks within the grid cap; REDUCE rows stay below row 63.
        let want = pl.w.div_ceil(BYTES_PER_BLOCK * K).max(1);
        let total = mesh::grid(&census, want * (K + 1), (HANDSHAKE_ROW / K) * (K + 1)) as usize;
        let p = (total / (K + 1)).max(1);
        let mut args = CollArgs::new(res, call);
        args.extra[..4].copy_from_slice(&[pl.w as u64, pl.d as u64, p as u64, K as u64]);
        let k = kernels::collectives::allreduce::RSAG_PIPELINE.instance(call.dtype, call.op)?;
        // SAFETY: CollArgs mirrors the kernel's parameter; the caller keeps the buffers alive.
        unsafe { gpu.launch(k, (p * (K + 1)) as u32, THREADS, &args, stream) }
    }

    run_host(self, res, call) {
        with_elem!(call.dtype, T => host::<T>(res, call))
    }
}

fn host<T: HostElem>(res: &Resources, call: &Call) -> Result<()> {
    let Plan { w, d, iters } = plan(res, call)?;
    let (me, n) = (res.rank(), res.nranks());
    let p_blocks = res.config().host_blocks.min(HANDSHAKE_ROW / K);
    let (size, total) = (std::mem::size_of::<T>(), call.bytes());
    let r_blocks = K * p_blocks;
    let stage_bytes = 2 * n * w;
    let slot = |rank: usize, i: usize, area: usize, from: usize| {
        res.peer_bases()[rank]
            + (res.layout().plain_offset + (i % d) * stage_bytes + (area * n + from) * w) as u64
    };
    host_barrier(res, HANDSHAKE_ROW)?;
    let mut srcs: Vec<*const T> = vec![std::ptr::null(); n];
    for i in 0..iters {
        for g in 0..p_blocks {
            for p in peers(me, n) {
                let at = i * n * w + p * w;
                let len = slice_len(total, at, w);
                let (y0, y1) = (
                    part(len, r_blocks, g * K).0,
                    part(len, r_blocks, g * K + K - 1).1,
                );
                // SAFETY: the part lies inside the input and inside slot `me` of peer p's RS
                // area (mapped here), which p reads only after the handshake of its REDUCE.
                unsafe {
                    host_copy(
                        slot(p, i, 0, me) + y0 as u64,
                        call.send + (at + y0) as u64,
                        y1 - y0,
                    )
                };
            }
        }
        for r in 0..r_blocks {
            let at = i * n * w + me * w;
            let (x0, x1) = part(slice_len(total, at, w), r_blocks, r);
            host_barrier(res, r)?;
            for (q, s) in srcs.iter_mut().enumerate() {
                *s = if q == me {
                    (call.send + (at + x0) as u64) as usize as *const T
                } else {
                    (slot(me, i, 0, q) + x0 as u64) as usize as *const T
                };
            }
            let out = call.recv + (at + x0) as u64;
            // SAFETY: the sources hold the part (handshake above); the output part lies in
            // recv; in place, each element is read before it is written.
            unsafe {
                reduce_into::<T>(call.op, n, out as usize as *mut T, &srcs, (x1 - x0) / size)
            };
            for p in peers(me, n) {
                // SAFETY: slot `me` of peer p's AG area is mapped here and read by p only after
                // the handshake below.
                unsafe { host_copy(slot(p, i, 1, me) + x0 as u64, out, x1 - x0) };
            }
            host_barrier(res, r)?;
            for p in peers(me, n) {
                let atp = i * n * w + p * w;
                let (p0, p1) = part(slice_len(total, atp, w), r_blocks, r);
                // SAFETY: peer p's reduced part has landed in the own AG slot p (handshake).
                unsafe {
                    host_copy(
                        call.recv + (atp + p0) as u64,
                        slot(me, i, 1, p) + p0 as u64,
                        p1 - p0,
                    )
                };
            }
        }
    }
    Ok(())
}
