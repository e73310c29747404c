//! All-reduce `rsag_zero_copy`: reduce-scatter + all-gather straight between the user buffers.
//! Both buffers are registered once per `(address, size)` through the framework's cache
//! ([`super::super::user_buffers`]) and every rank's buffers are mapped here; rank r reads its
//! slice from every rank's input (remote 16-byte loads), reduces in rank order and stores the
//! result into its own output and every peer's output. No scratch, one hop each way.
//!
//! Slices: `S` bytes per rank (`ceil(count / n)` elements rounded up to whole 16-byte vectors);
//! block b owns `mesh::part(len, nb, b)` of the own slice. Per block: 1. handshake with block b
//! of every peer (their inputs are ready and their outputs free: they are inside this launch);
//! 2. reduce the part from every rank's input into every rank's output; 3. handshake (the peers'
//! parts have landed in this output, and nobody reads this input any more). In place, slice r of
//! every buffer is only touched by rank r, each element read before it is written.
//!
//! Buffers the cache cannot register on every rank (e.g. not allocated through this library), or
//! first seen under graph capture, go to `rsag_pipeline` (else `rsag`) instead, on every rank
//! alike (the registration outcome is agreed collectively).
//! Kernel: kernels/cuda/src/collectives/allreduce/rsag_zero_copy.cu.

use std::sync::Arc;

use super::super::algorithm::{host_barrier, native_algorithm, Algorithm, Call};
use super::super::host_math::{reduce_into, with_elem, HostElem};
use super::super::mesh::{self, host_copy, part, peers, Grid, VEC};
use super::super::setup::Resources;
use super::super::user_buffers::UserBuffer;
use super::super::zero_copy;
use super::rsag_pipeline::RsagPipeline;
use crate::error::Result;
use crate::kernels;

/// The algorithm object.
pub struct RsagZeroCopy;

/// Bytes of the own slice per block the grid is sized for.
const BYTES_PER_BLOCK: usize = 64 << 10;

/// The copying algorithm taken for buffers that are not registered.
fn fallback() -> Result<&'static dyn Algorithm> {
    static FALLBACK: RsagPipeline = RsagPipeline;
    Ok(&FALLBACK)
}

/// Bytes of one rank's slice.
fn slice_bytes(call: &Call, n: usize) -> usize {
    let size = call.dtype.size_in_bytes();
    call.count.div_ceil(n).next_multiple_of(VEC / size) * size
}

/// The registered input and output (`None`: use the fallback), each looked up by `get(ptr,
/// size)`.
fn registered(
    call: &Call,
    get: impl Fn(u64, usize) -> Result<Option<Arc<UserBuffer>>>,
) -> Result<Option<(Arc<UserBuffer>, Arc<UserBuffer>)>> {
    let b = call.bytes();
    let Some(i) = get(call.send, b)? else {
        return Ok(None);
    };
    if call.recv == call.send {
        return Ok(Some((i.clone(), i)));
    }
    Ok(get(call.recv, b)?.map(|o| (i, o)))
}

native_algorithm! {
    RsagZeroCopy: "rsag_zero_copy", AllReduce;
    check(self, res, call) {
        // The fallback must be able to run it too.
        fallback()?.check(res, call)
    }

    launch_gpu(self, res, gpu, call, stream) {
        // The cache first: a hit costs no driver call (graph capture is queried on a miss only).
        let get = |p, b| zero_copy::registered_gpu(res, gpu, stream, p, b);
        let Some((ins, outs)) = registered(call, get)? else {
            return fallback()?.launch_gpu(res, gpu, call, stream);
        };
        let s = slice_bytes(call, res.nranks());
        let want = s.div_ceil(BYTES_PER_BLOCK);
        let k = kernels::collectives::allreduce::RSAG_ZERO_COPY.instance(call.dtype, call.op)?;
        let extra = [ins.table.ptr(), outs.table.ptr(), s as u64, ins.offset, outs.offset];
        // SAFETY: the kernel takes one CollArgs; the tables live in the cache (kept by `res`),
        // the caller keeps the buffers alive.
        unsafe { mesh::launch(res, gpu, call, stream, k, Grid { want, limit: 64 }, &extra) }
    }

    run_host(self, res, call) {
        let get = |p, b| zero_copy::registered(res, p, b, false);
        let Some((ins, outs)) = registered(call, get)? else {
            return fallback()?.run_host(res, call);
        };
        with_elem!(call.dtype, T => host::<T>(res, call, &ins.bases, &outs.bases))
    }
}

fn host<T: HostElem>(res: &Resources, call: &Call, ins: &[u64], outs: &[u64]) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    let size = std::mem::size_of::<T>();
    let (s, total) = (slice_bytes(call, n), call.bytes());
    let begin = (me * s).min(total);
    let len = s.min(total - begin);
    let mut srcs: Vec<*const T> = vec![std::ptr::null(); n];
    for b in 0..nb {
        let (x0, x1) = part(len, nb, b);
        let at = (begin + x0) as u64;
        host_barrier(res, b)?;
        for (r, p) in srcs.iter_mut().enumerate() {
            *p = (ins[r] + at) as usize as *const T;
        }
        let out = call.recv + at;
        // SAFETY: every rank's input is mapped here and holds the part; the own output holds it
        // too; in place, each element is read before it is written.
        unsafe { reduce_into::<T>(call.op, n, out as usize as *mut T, &srcs, (x1 - x0) / size) };
        for p in peers(me, n) {
            // SAFETY: peer p's output is mapped here; only this rank writes this part of it,
            // and p reads it only after the handshake below.
            unsafe { host_copy(outs[p] + at, out, x1 - x0) };
        }
        host_barrier(res, b)?;
    }
    Ok(())
}
