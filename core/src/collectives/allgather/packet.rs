//! All-gather `packet`: every rank writes its input as LL16 packets into region `rank` of every
//! peer's scratch (all warps of each block send) and, out of place, copies it into its own
//! output slot; then it unpacks every peer's region into that peer's output slot. One hop where
//! `fullmesh` makes two handshakes around its copies: for small messages (the selector takes it
//! up to [`super::super::selector::allgather_packet_max_bytes`] per rank).
//!
//! Scratch: LL half `flag & 1`, region of source rank `r` at `r * words * 16` (8 payload bytes
//! per 16-byte packet; the tail word is zero-padded). Blocks own stripes of 32 consecutive
//! words, round robin, so a block only waits for the same block of its peers (the exchange:
//! allpair.rs). In place the input is this rank's output slot, which nothing writes.
//! Kernel: kernels/cuda/src/collectives/allgather/packet.cu.

use super::super::algorithm::{native_algorithm, Call};
use super::super::allpair::{self, UNIT_BYTES as UNIT};
use super::super::host_ll::{load_unit, store_unit};
use super::super::mesh;
use super::super::setup::Resources;
use crate::error::Result;
use crate::kernels;

/// The algorithm object (built by [`super::super::collection::native_algorithms`]).
pub struct Packet;

native_algorithm! {
    Packet: "packet", AllGather;
    check(self, res, call) {
        allpair::check(res, call, "allgather packet")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let k = kernels::collectives::allgather::PACKET;
        // SAFETY: the kernel takes one CollArgs with extra[0] = words, extra[1] = bytes per
        // rank; the caller keeps the buffers alive.
        unsafe { allpair::launch(res, gpu, k, call, call.bytes() as u64, stream) }
    }

    run_host(self, res, call) {
        host(res, call)
    }
}

fn host(res: &Resources, call: &Call) -> Result<()> {
    let total = call.bytes();
    let me = res.rank();
    let own = call.recv + (me * total) as u64;
    let in_place = call.send == own;
    allpair::host_exchange(
        res,
        call,
        |_| call.send,
        |idx, read| {
            if !in_place {
                // SAFETY: send holds `total` bytes, the own slot of recv too; they do not overlap
                // (not in place, and the call was checked).
                unsafe {
                    store_unit(
                        own,
                        idx,
                        UNIT,
                        total,
                        &load_unit(call.send, idx, UNIT, total),
                    )
                };
            }
            for p in mesh::peers(me, res.nranks()) {
                let u = read(p)?;
                // SAFETY: recv holds n * total bytes.
                unsafe { store_unit(call.recv + (p * total) as u64, idx, UNIT, total, &u) };
            }
            Ok(())
        },
    )
}
