//! Zero-copy all-gather, reduce-scatter and broadcast (`zero_copy` of each): straight between
//! the user buffers of every rank, no scratch, one hop. The default choice on buffers the caller
//! registered on every rank ([`super::Collectives::choose_registered`], `ncclCommRegister`,
//! `ncclCommWindowRegister`) above [`super::selector::ZERO_COPY_MIN_BYTES`] per rank;
//! all-reduce's counterpart is `rsag_zero_copy`.
//!
//! The buffer every rank's peers touch is registered once per `(address, size)` through the
//! collectives' cache ([`super::user_buffers`]; a larger registration starting at the same
//! address is a hit) and every rank's copy of it is mapped here:
//! * all-gather: the output (`n * B` bytes). Rank r writes its input into slice r of every
//!   rank's output (remote 16-byte stores; its own slice too unless in place);
//! * reduce-scatter: the input (`n * B` bytes). Rank r reads slice r of every rank's input
//!   (remote loads), reduces in rank order (the same order as every other algorithm, so the
//!   results are bit-identical) and stores into its own output; in place each element is read
//!   before it is written, and only rank r touches slice r;
//! * broadcast: the output (`B` bytes). The root writes its input into every rank's output.
//!
//! Per block b (its part `mesh::part(B, nb, b)`): handshake with block b of every peer (their
//! buffers are ready and free: they are inside this launch); the copy or reduction; handshake
//! (what the peers wrote here has landed, and nobody reads this rank's input any more).
//!
//! Buffers the cache cannot map on every rank (e.g. private memory), or first seen under graph
//! capture, go to the collective's `fullmesh` instead, on every rank alike (the registration
//! outcome is agreed collectively).
//! Kernels: kernels/cuda/src/collectives/allgather/zero_copy.cu (all-gather and broadcast: one
//! push kernel for every type) and reduce_scatter/zero_copy.cu (per type and operator).

use std::sync::Arc;

use super::algorithm::{host_barrier, native_algorithm, Call};
use super::host_math::{reduce_into, with_elem, HostElem};
use super::mesh::{self, host_copy, part, peers, Grid};
use super::setup::Resources;
use super::user_buffers::UserBuffer;
use super::{allgather, broadcast, reduce_scatter};
use crate::error::Result;
use crate::kernels;

/// Zero-copy all-gather.
pub struct ZeroCopyAllGather;
/// Zero-copy reduce-scatter.
pub struct ZeroCopyReduceScatter;
/// Zero-copy broadcast.
pub struct ZeroCopyBroadcast;

/// Bytes of the per-rank slice per block the grid is sized for.
const BYTES_PER_BLOCK: usize = 64 << 10;
/// The most blocks of a launch.
const MAX_BLOCKS: usize = 64;

/// The registered buffer `(ptr, size)` mapped on every rank (`None`: the fallback runs).
pub(crate) fn registered(
    res: &Resources,
    ptr: u64,
    size: usize,
    capturing: bool,
) -> Result<Option<Arc<UserBuffer>>> {
    res.user_buffers()
        .get_or_register(res.comm(), res.device(), ptr, size, capturing)
}

/// [`registered`] for a GPU launch on `stream`: the cache first, graph capture queried (a
/// driver call) only when the cache cannot answer alone.
pub(crate) fn registered_gpu(
    res: &Resources,
    gpu: &super::gpu::GpuCtx,
    stream: super::types::RawStream,
    ptr: u64,
    size: usize,
) -> Result<Option<Arc<UserBuffer>>> {
    if let Some(entry) = res.user_buffers().cached(ptr, size) {
        return Ok(entry);
    }
    registered(res, ptr, size, gpu.is_capturing(stream)?)
}

/// The grid of a launch moving `bytes` per rank.
fn grid(bytes: usize) -> Grid {
    Grid {
        want: bytes.div_ceil(BYTES_PER_BLOCK),
        limit: MAX_BLOCKS,
    }
}

/// Host backend: the push of all-gather and broadcast. Every block of every rank handshakes
/// twice; in between, when `push`, this rank copies `bytes` of `src` to `at` of every rank's
/// output (`outs`, as mapped here; its own is `own`, skipped when it is `src + at`).
fn host_push(
    res: &Resources,
    outs: &[u64],
    own: u64,
    src: u64,
    at: u64,
    bytes: usize,
    push: bool,
) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    for b in 0..nb {
        let (x0, x1) = part(bytes, nb, b);
        host_barrier(res, b)?;
        if push {
            let from = src + x0 as u64;
            for p in peers(me, n) {
                // SAFETY: peer p's output is mapped here and holds `at + bytes` bytes; only this
                // rank writes this part of it, and p reads it only after the handshake below.
                unsafe { host_copy(outs[p] + at + x0 as u64, from, x1 - x0) };
            }
            // SAFETY: the own output holds it too (host_copy skips src == dst).
            unsafe { host_copy(own + at + x0 as u64, from, x1 - x0) };
        }
        host_barrier(res, b)?;
    }
    Ok(())
}

native_algorithm! {
    ZeroCopyAllGather: "zero_copy", AllGather;
    check(self, res, call) {
        allgather::fullmesh::Fullmesh.check(res, call)
    }

    launch_gpu(self, res, gpu, call, stream) {
        let b = call.bytes();
        let n = res.nranks();
        let Some(outs) = registered_gpu(res, gpu, stream, call.recv, n * b)? else {
            return allgather::fullmesh::Fullmesh.launch_gpu(res, gpu, call, stream);
        };
        let k = kernels::collectives::allgather::ZERO_COPY;
        let extra = [outs.table.ptr(), b as u64, (res.rank() * b) as u64, 1, outs.offset];
        // SAFETY: the kernel takes one CollArgs; the table lives in the cache (kept by `res`),
        // the caller keeps the buffers alive.
        unsafe { mesh::launch(res, gpu, call, stream, k, grid(b), &extra) }
    }

    run_host(self, res, call) {
        let b = call.bytes();
        let n = res.nranks();
        let Some(outs) = registered(res, call.recv, n * b, false)? else {
            return allgather::fullmesh::Fullmesh.run_host(res, call);
        };
        let at = (res.rank() * b) as u64;
        host_push(res, &outs.bases, call.recv, call.send, at, b, true)
    }
}

native_algorithm! {
    ZeroCopyBroadcast: "zero_copy", Broadcast;
    check(self, res, call) {
        broadcast::fullmesh::Fullmesh.check(res, call)
    }

    launch_gpu(self, res, gpu, call, stream) {
        let b = call.bytes();
        let Some(outs) = registered_gpu(res, gpu, stream, call.recv, b)? else {
            return broadcast::fullmesh::Fullmesh.launch_gpu(res, gpu, call, stream);
        };
        let k = kernels::collectives::allgather::ZERO_COPY;
        let push = u64::from(res.rank() == call.root);
        let extra = [outs.table.ptr(), b as u64, 0, push, outs.offset];
        // SAFETY: as for the all-gather.
        unsafe { mesh::launch(res, gpu, call, stream, k, grid(b), &extra) }
    }

    run_host(self, res, call) {
        let b = call.bytes();
        let Some(outs) = registered(res, call.recv, b, false)? else {
            return broadcast::fullmesh::Fullmesh.run_host(res, call);
        };
        let push = res.rank() == call.root;
        host_push(res, &outs.bases, call.recv, call.send, 0, b, push)
    }
}

native_algorithm! {
    ZeroCopyReduceScatter: "zero_copy", ReduceScatter;
    check(self, res, call) {
        reduce_scatter::fullmesh::Fullmesh.check(res, call)
    }

    launch_gpu(self, res, gpu, call, stream) {
        let b = call.bytes();
        let n = res.nranks();
        let Some(ins) = registered_gpu(res, gpu, stream, call.send, n * b)? else {
            return reduce_scatter::fullmesh::Fullmesh.launch_gpu(res, gpu, call, stream);
        };
        let k = kernels::collectives::reduce_scatter::ZERO_COPY.instance(call.dtype, call.op)?;
        let extra = [ins.table.ptr(), b as u64, ins.offset];
        // SAFETY: as for the all-gather.
        unsafe { mesh::launch(res, gpu, call, stream, k, grid(b), &extra) }
    }

    run_host(self, res, call) {
        let b = call.bytes();
        let n = res.nranks();
        let Some(ins) = registered(res, call.send, n * b, false)? else {
            return reduce_scatter::fullmesh::Fullmesh.run_host(res, call);
        };
        with_elem!(call.dtype, T => host_reduce::<T>(res, call, &ins.bases))
    }
}

fn host_reduce<T: HostElem>(res: &Resources, call: &Call, ins: &[u64]) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    let size = std::mem::size_of::<T>();
    let b = call.bytes();
    let mine = (me * b) as u64;
    let mut srcs: Vec<*const T> = vec![std::ptr::null(); n];
    for blk in 0..nb {
        let (x0, x1) = part(b, nb, blk);
        host_barrier(res, blk)?;
        for (r, p) in srcs.iter_mut().enumerate() {
            *p = (ins[r] + mine + x0 as u64) as usize as *const T;
        }
        let out = call.recv + x0 as u64;
        // SAFETY: every rank's input is mapped here and holds slice `me`; the own output holds
        // the part; in place (the output is slice `me` of the own input) each element is read
        // before it is written, and no peer reads slice `me`.
        unsafe { reduce_into::<T>(call.op, n, out as usize as *mut T, &srcs, (x1 - x0) / size) };
        host_barrier(res, blk)?;
    }
    Ok(())
}
