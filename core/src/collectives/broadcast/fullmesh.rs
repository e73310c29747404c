//! Broadcast `fullmesh`: the root writes its buffer into every peer's plain scratch over the
//! memory channels (remote 16-byte stores) and signals; every peer copies it into its output.
//! Any size: chunks of the whole plain scratch.
//!
//! Per chunk, block b (part `mesh::part(c, nb, b)`), with the semaphores of row b between the
//! root and each peer only: 1. root and peer shake hands (the peer finished reading the previous
//! chunk and is inside this launch); 2. the root writes the part into every peer's scratch at the
//! same offset (and into its own output when out of place), then signals every peer; 3. a peer
//! waits for that signal and copies the part into its output. Per launch every pair signals and
//! waits equally often (root->peer twice per chunk, peer->root once).
//! Kernel: kernels/cuda/src/collectives/broadcast/fullmesh.cu (one kernel for every type).

use super::super::algorithm::{host_signal, host_wait, native_algorithm};
use super::super::mesh::{self, host_copy, peers, scratch_at};
use crate::kernels;

/// The algorithm object.
pub struct Fullmesh;

native_algorithm! {
    Fullmesh: "fullmesh", Broadcast;
    check(self, res, _call) {
        mesh::check_slots(res, 1, "broadcast fullmesh")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let k = kernels::collectives::broadcast::FULLMESH;
        // SAFETY: the kernel takes one CollArgs with [slot bytes, call bytes] first in its
        // extra words; the caller keeps the buffers alive.
        unsafe { mesh::launch_slotted(res, gpu, call, stream, k, 1) }
    }

    run_host(self, res, call) {
        let (me, n, nb, root) = (
            res.rank(),
            res.nranks(),
            res.config().host_blocks,
            call.root,
        );
        let (c_max, total) = (mesh::slot_bytes(res, 1), call.bytes());
        mesh::for_each_part(nb, total, c_max, |b, start, (x0, x1)| {
            let len = x1 - x0;
            if me == root {
                for p in peers(me, n) {
                    host_signal(res, b, p);
                }
                for p in peers(me, n) {
                    host_wait(res, b, p)?;
                }
                let src = call.send + (start + x0) as u64;
                for p in peers(me, n) {
                    // SAFETY: the part lies inside the input and inside the peer's scratch
                    // (mapped here), which the peer reads only after the signal below.
                    unsafe { host_copy(scratch_at(res, p, 0, c_max, x0), src, len) };
                }
                // SAFETY: the output holds `total` bytes (memmove when in place).
                unsafe { host_copy(call.recv + (start + x0) as u64, src, len) };
                for p in peers(me, n) {
                    host_signal(res, b, p);
                }
            } else {
                host_signal(res, b, root);
                host_wait(res, b, root)?;
                host_wait(res, b, root)?;
                // SAFETY: the root's part has landed in the own scratch (signal above).
                unsafe {
                    host_copy(
                        call.recv + (start + x0) as u64,
                        scratch_at(res, me, 0, c_max, x0),
                        len,
                    )
                };
            }
            Ok(())
        })
    }
}
