//! All-reduce `allpair_packet`: every rank writes its whole input as LL packets into every
//! peer's scratch (all warps of each block send), then reduces all ranks' packets in rank
//! order. One hop; for small messages (the selector uses it up to 2 MiB with 2 ranks, 128 KiB
//! with 3 or 4, 64 KiB with 5 to 8, 16 KiB with more: `selector::allpair_packet_max_bytes`).
//!
//! Packets: LL16 (8-byte payload) for every type (`allpair::UNIT_BYTES`). Scratch: LL half
//! `flag & 1`, region of source rank `r` at `r * units * packet`.
//! Blocks own stripes of 32 consecutive units, round robin, so a block only waits for the same
//! block of its peers and in-place calls are safe (the exchange: allpair.rs).
//! Kernel: kernels/cuda/src/collectives/allreduce/allpair_packet.cu.

use super::super::algorithm::native_algorithm;
use super::super::allpair;
use super::super::host_math::with_elem;
use crate::kernels;

/// The algorithm object (built by [`super::super::collection::native_algorithms`]).
pub struct AllpairPacket;

native_algorithm! {
    AllpairPacket: "allpair_packet", AllReduce;
    check(self, res, call) {
        allpair::check(res, call, "allreduce allpair_packet")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let k = kernels::collectives::allreduce::ALLPAIR_PACKET.instance(call.dtype, call.op)?;
        // SAFETY: the kernel takes one CollArgs with extra[0] = units; the caller keeps the
        // buffers alive.
        unsafe { allpair::launch(res, gpu, k, call, 0, stream) }
    }

    run_host(self, res, call) {
        // Every peer gets the whole input.
        with_elem!(call.dtype, T => allpair::host_reduce::<T>(res, call, |_| call.send, call.send))
    }
}
