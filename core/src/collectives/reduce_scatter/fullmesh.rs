//! Reduce-scatter `fullmesh`: every rank writes block p of its input into rank p's plain
//! scratch over the memory channels (remote 16-byte stores), then reduces its own block with
//! what its peers wrote, in rank order. Any size: chunks of one scratch slot.
//!
//! Scratch: `n` slots of `C = plain_bytes / n` bytes (rounded down to 16); slot `r` of rank
//! `p` holds rank r's contribution to p's current chunk. Per chunk, block b (part
//! `mesh::part(c, nb, b)`): 1. handshake with block b of every peer; 2. write the part of
//! every peer's block into slot `me` of that peer; 3. handshake; 4. reduce the part over the
//! ranks (own input for `me`, slot r otherwise) into the output. In place (`recv == send + me *
//! bytes`) each element is read before it is written by the same thread.
//! Kernel: kernels/cuda/src/collectives/reduce_scatter/fullmesh.cu.

use super::super::algorithm::{host_barrier, native_algorithm, Call};
use super::super::host_math::{reduce_into, with_elem, HostElem};
use super::super::mesh::{self, host_copy, peers, scratch_at};
use super::super::setup::Resources;
use crate::error::Result;
use crate::kernels;

/// The algorithm object.
pub struct Fullmesh;

native_algorithm! {
    Fullmesh: "fullmesh", ReduceScatter;
    check(self, res, _call) {
        mesh::check_slots(res, res.nranks(), "reducescatter fullmesh")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let k = kernels::collectives::reduce_scatter::FULLMESH.instance(call.dtype, call.op)?;
        // SAFETY: the kernel takes one CollArgs with [slot bytes, call bytes] first in its
        // extra words; the caller keeps the buffers alive.
        unsafe { mesh::launch_slotted(res, gpu, call, stream, k, res.nranks()) }
    }

    run_host(self, res, call) {
        with_elem!(call.dtype, T => host::<T>(res, call))
    }
}

fn host<T: HostElem>(res: &Resources, call: &Call) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    let size = std::mem::size_of::<T>();
    let (c_max, total) = (mesh::slot_bytes(res, n), call.bytes());
    let mut srcs: Vec<*const T> = vec![std::ptr::null(); n];
    mesh::for_each_part(nb, total, c_max, |b, start, (x0, x1)| {
        host_barrier(res, b)?;
        for p in peers(me, n) {
            let src = call.send + (p * total + start + x0) as u64;
            // SAFETY: the part lies inside block p of the input and inside slot `me` of peer
            // p's scratch (mapped here), which p reads only after the handshake.
            unsafe { host_copy(scratch_at(res, p, me, c_max, x0), src, x1 - x0) };
        }
        host_barrier(res, b)?;
        for (r, s) in srcs.iter_mut().enumerate() {
            *s = if r == me {
                (call.send + (me * total + start + x0) as u64) as usize as *const T
            } else {
                scratch_at(res, me, r, c_max, x0) as usize as *const T
            };
        }
        let out = (call.recv + (start + x0) as u64) as usize as *mut T;
        // SAFETY: every source holds the part (x0 and the chunk starts are whole elements);
        // the output part lies inside recv; in place, each element is read before written.
        unsafe { reduce_into::<T>(call.op, n, out, &srcs, (x1 - x0) / size) };
        Ok(())
    })
}
