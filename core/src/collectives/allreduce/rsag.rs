//! All-reduce `rsag`: reduce-scatter + all-gather over memory channels with plain 16-byte
//! stores and semaphores, for large messages. The input goes in chunks that fit the plain
//! scratch; per chunk and per block:
//! 1. copy the block's part of every slice of the input chunk into the own scratch; barrier
//!    with the same block of every peer (semaphore (block, peer));
//! 2. reduce the block's part of the own slice, reading every rank's scratch (remote reads,
//!    rank order), store it into the output and into every peer's scratch; barrier;
//! 3. copy the block's part of the other slices from the own scratch into the output.
//!
//! Slices: `S` elements per rank (rounded up to 16-byte vectors), scratch offset = element
//! offset in the chunk. Block b owns vectors `split(SV, blocks, b)` of every slice.
//! Kernel: kernels/cuda/src/collectives/allreduce/rsag.cu.

use super::super::algorithm::{host_barrier, native_algorithm, split, Call, CollArgs};
use super::super::host_math::{reduce_into, with_elem, HostElem};
use super::super::mesh;
use super::super::setup::{Resources, MAX_SEM_BLOCKS};
use crate::error::Result;
use crate::kernels;

/// The algorithm object.
pub struct Rsag;

const VEC: usize = 16;

/// Elements per chunk: the most that fit the plain scratch, a multiple of `n` vectors.
fn chunk_elems(res: &Resources, size: usize) -> usize {
    let unit = res.nranks() * VEC / size;
    (res.layout().plain_bytes / size) / unit * unit
}

/// Elements per slice of a chunk of `cnt` elements.
fn slice_elems(cnt: usize, n: usize, size: usize) -> usize {
    cnt.div_ceil(n).next_multiple_of(VEC / size)
}

native_algorithm! {
    Rsag: "rsag", AllReduce;
    check(self, res, _call) {
        // Each of n slots holds a vector: plain_bytes >= n * VEC.
        mesh::check_slots(res, res.nranks(), "allreduce rsag")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let size = call.dtype.size_in_bytes();
        let chunk =
            chunk_elems(res, size).min(call.count.next_multiple_of(res.nranks() * VEC / size));
        let sv = slice_elems(chunk, res.nranks(), size) * size / VEC;
        let blocks = sv
            .div_ceil(1024)
            .clamp(1, MAX_SEM_BLOCKS.min(res.max_waiting_blocks())) as u32;
        let mut args = CollArgs::new(res, call);
        args.extra[0] = chunk_elems(res, size) as u64;
        let k = kernels::collectives::allreduce::RSAG.instance(call.dtype, call.op)?;
        // SAFETY: CollArgs mirrors the kernel's parameter; the caller keeps the buffers alive.
        unsafe { gpu.launch(k, blocks, 1024, &args, stream) }
    }

    run_host(self, res, call) {
        with_elem!(call.dtype, T => host::<T>(res, call))
    }
}

fn host<T: HostElem>(res: &Resources, call: &Call) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    let size = std::mem::size_of::<T>();
    let chunk = chunk_elems(res, size);
    let scratch = |r: usize| res.peer_bases()[r] + res.layout().plain_offset as u64;
    let mut ptrs: Vec<*const T> = vec![std::ptr::null(); n];
    for b in 0..nb {
        let mut start = 0;
        while start < call.count {
            let cnt = chunk.min(call.count - start);
            let s = slice_elems(cnt, n, size);
            let (v0, v1) = split(s * size / VEC, nb, b);
            let (e0, e1) = (v0 * VEC / size, v1 * VEC / size);
            // Elements [lo, hi) of slice r inside the chunk, this block's part.
            let part = |r: usize| {
                let lo = (r * s + e0).min(cnt);
                (lo, (r * s + e1).min(cnt))
            };
            let send = call.send as usize + start * size;
            let recv = call.recv as usize + start * size;
            for r in 0..n {
                let (lo, hi) = part(r);
                // SAFETY: [lo, hi) lies inside the chunk of the send buffer and of the scratch.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (send + lo * size) as *const u8,
                        (scratch(me) as usize + lo * size) as *mut u8,
                        (hi - lo) * size,
                    )
                };
            }
            host_barrier(res, b)?;
            let (lo, hi) = part(me);
            for (r, p) in ptrs.iter_mut().enumerate() {
                *p = (scratch(r) as usize + lo * size) as *const T;
            }
            let out = (recv + lo * size) as *mut T;
            // SAFETY: every rank's scratch holds the chunk; the output range lies in recv.
            unsafe { reduce_into::<T>(call.op, n, out, &ptrs, hi - lo) };
            for p in (0..n).filter(|&p| p != me) {
                // SAFETY: peer p's scratch is mapped here; only this rank writes slice `me`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        out.cast_const().cast::<u8>(),
                        (scratch(p) as usize + lo * size) as *mut u8,
                        (hi - lo) * size,
                    )
                };
            }
            host_barrier(res, b)?;
            for r in (0..n).filter(|&r| r != me) {
                let (lo, hi) = part(r);
                // SAFETY: as in the first copy.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (scratch(me) as usize + lo * size) as *const u8,
                        (recv + lo * size) as *mut u8,
                        (hi - lo) * size,
                    )
                };
            }
            start += cnt;
        }
    }
    Ok(())
}
