//! Reduce-scatter `packet`: every rank writes block p of its input as LL packets into region
//! `rank` of rank p's scratch (all warps of each block send), then reduces its own block over
//! the ranks in rank order (its own input for itself, the peers' packets otherwise). One hop where
//! `fullmesh` makes two handshakes around its copies: for small messages (the selector takes it
//! up to [`super::super::selector::reducescatter_packet_max_bytes`] per rank).
//!
//! Packets: LL16 (8-byte payload) for every type (`allpair::UNIT_BYTES`). Scratch: LL half
//! `flag & 1`, region of source rank `r` at `r * units * packet`.
//! Blocks own stripes of 32 consecutive units, round robin, so a block only waits for the same
//! block of its peers (the exchange: allpair.rs). In place (`recv == send + me * bytes`) each
//! unit of the own block is read before it is written; the sends read only the other blocks.
//! Kernel: kernels/cuda/src/collectives/reduce_scatter/packet.cu.

use super::super::algorithm::native_algorithm;
use super::super::allpair;
use super::super::host_math::with_elem;
use crate::kernels;

/// The algorithm object (built by [`super::super::collection::native_algorithms`]).
pub struct Packet;

native_algorithm! {
    Packet: "packet", ReduceScatter;
    check(self, res, call) {
        allpair::check(res, call, "reducescatter packet")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let k = kernels::collectives::reduce_scatter::PACKET.instance(call.dtype, call.op)?;
        // SAFETY: the kernel takes one CollArgs with extra[0] = units; the caller keeps the
        // buffers alive.
        unsafe { allpair::launch(res, gpu, k, call, 0, stream) }
    }

    run_host(self, res, call) {
        // Peer p gets block p of the input; the own block is folded here.
        let block = |p: usize| call.send + (p * call.bytes()) as u64;
        with_elem!(call.dtype, T => allpair::host_reduce::<T>(res, call, block, block(res.rank())))
    }
}
