//! All-gather `fullmesh`: every rank writes its input into every peer's plain scratch over the
//! memory channels (remote 16-byte stores), then copies what its peers wrote into its output.
//! Any size: the input goes in chunks of one scratch slot.
//!
//! Scratch: `n` slots of `C = plain_bytes / n` bytes (rounded down to 16); slot `r` of rank
//! `p`'s scratch holds rank r's current chunk. Per chunk, block b (part `mesh::part(c, nb, b)`
//! of the chunk): 1. handshake with block b of every peer (they finished reading the previous
//! chunk); 2. write the part into slot `me` of every peer (and into the own output slot when out
//! of place); 3. handshake (the peers' parts have landed here); 4. copy the part of every peer's
//! slot into the output. In place: `send == recv + me * bytes`, step 2 skips the own slot.
//! Kernel: kernels/cuda/src/collectives/allgather/fullmesh.cu (one kernel for every type).

use super::super::algorithm::{host_barrier, native_algorithm};
use super::super::mesh::{self, host_copy, peers, scratch_at};
use crate::kernels;

/// The algorithm object (built by [`super::super::collection::native_algorithms`]).
pub struct Fullmesh;

native_algorithm! {
    Fullmesh: "fullmesh", AllGather;
    check(self, res, _call) {
        mesh::check_slots(res, res.nranks(), "allgather fullmesh")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let k = kernels::collectives::allgather::FULLMESH;
        // SAFETY: the kernel takes one CollArgs with [slot bytes, call bytes] first in its
        // extra words; the caller keeps the buffers alive.
        unsafe { mesh::launch_slotted(res, gpu, call, stream, k, res.nranks()) }
    }

    run_host(self, res, call) {
        let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
        let (c_max, total) = (mesh::slot_bytes(res, n), call.bytes());
        let own = call.recv + (me * total) as u64;
        let in_place = call.send == own;
        mesh::for_each_part(nb, total, c_max, |b, start, (x0, x1)| {
            let len = x1 - x0;
            let src = call.send + (start + x0) as u64;
            host_barrier(res, b)?;
            for p in peers(me, n) {
                // SAFETY: the part lies inside the input and inside slot `me` of the peer's
                // scratch, mapped here; the peer does not read it until the handshake below.
                unsafe { host_copy(scratch_at(res, p, me, c_max, x0), src, len) };
            }
            if !in_place {
                // SAFETY: the output holds n * total bytes.
                unsafe { host_copy(own + (start + x0) as u64, src, len) };
            }
            host_barrier(res, b)?;
            for p in peers(me, n) {
                let dst = call.recv + (p * total + start + x0) as u64;
                // SAFETY: slot p of the own scratch holds the peer's part (handshake).
                unsafe { host_copy(dst, scratch_at(res, me, p, c_max, x0), len) };
            }
            Ok(())
        })
    }
}
