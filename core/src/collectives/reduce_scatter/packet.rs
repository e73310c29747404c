//! Reduce-scatter `packet`: every rank writes block p of its input as LL packets into region
//! `rank` of rank p's scratch (one warp per peer in each block), then reduces its own block over
//! the ranks in rank order (its own input for itself, the peers' packets otherwise). One hop where
//! `fullmesh` makes two handshakes around its copies: for small messages (the selector takes it
//! up to [`super::super::selector::REDUCESCATTER_PACKET_MAX_BYTES`] per rank).
//!
//! Packets: LL8 (4-byte payload) for elements of up to 4 bytes, LL16 (8 bytes) for 8-byte
//! elements. Scratch: LL half `flag & 1`, region of source rank `r` at `r * units * packet`.
//! Blocks own stripes of 32 consecutive units, round robin (`(idx / 32) % blocks == b`), so a
//! block only waits for the same block of its peers. In place (`recv == send + me * bytes`) each
//! unit of the own block is read before it is written; the sends read only the other blocks.
//! Kernel: kernels/cuda/src/collectives/reduce_scatter/packet.cu.

use super::super::algorithm::{host_bump_flags, host_flag, native_algorithm, Call, CollArgs};
use super::super::host_ll::{
    get_packet, load_unit, packet_bytes, put_packet, reduce_units, store_unit, Unit,
};
use super::super::host_math::with_elem;
use super::super::mesh;
use super::super::setup::Resources;
use crate::error::Result;
use crate::kernels;

/// The algorithm object (built by [`super::super::collection::native_algorithms`]).
pub struct Packet;

/// Stripe width in units (one warp).
const STRIPE: usize = 32;

fn unit_bytes(call: &Call) -> usize {
    if call.dtype.size_in_bytes() <= 4 {
        4
    } else {
        8
    }
}

/// Packet payload units of one rank's block.
fn units(call: &Call) -> usize {
    call.bytes().div_ceil(unit_bytes(call))
}

native_algorithm! {
    Packet: "packet", ReduceScatter;
    check(self, res, call) {
        let need = res.nranks() * units(call) * packet_bytes(unit_bytes(call));
        mesh::check_ll_half(res, call, "reducescatter packet", need, "use a larger scratch or another algorithm")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let w = units(call);
        let peers = res.nranks() - 1;
        // One warp per peer for the sends, at least 8 warps for the reduction.
        let threads = (32 * peers.max(8)).min(1024) as u32;
        let blocks = w
            .div_ceil(STRIPE * 4)
            .clamp(1, 32)
            .min(res.max_waiting_blocks()) as u32;
        let mut args = CollArgs::new(res, call);
        args.extra[0] = w as u64;
        let k = kernels::collectives::reduce_scatter::PACKET.instance(call.dtype, call.op)?;
        // SAFETY: CollArgs mirrors the kernel's parameter; the caller keeps the buffers alive.
        unsafe { gpu.launch(k, blocks, threads, &args, stream) }
    }

    run_host(self, res, call) {
        with_elem!(call.dtype, T => host::<T>(res, call))
    }
}

fn host<T: super::super::host_math::HostElem>(res: &Resources, call: &Call) -> Result<()> {
    let (unit, w, total) = (unit_bytes(call), units(call), call.bytes());
    let pkt = packet_bytes(unit);
    let nb = res.config().host_blocks;
    let (me, n) = (res.rank(), res.nranks());
    let flag = host_flag(res, 0);
    let half =
        res.layout().ll_offset as u64 + u64::from(flag & 1) * res.layout().ll_half_bytes as u64;
    let own = call.send + (me * total) as u64;
    let mut all: Vec<Unit> = vec![[0u8; 8]; n];
    for b in 0..nb {
        let stripe = (0..w).filter(|idx| (idx / STRIPE) % nb == b);
        // Sends: the block's stripe of peer p's block to peer p.
        for p in (0..n).filter(|&p| p != me) {
            let region = res.peer_bases()[p] + half + (me * w * pkt) as u64;
            let src = call.send + (p * total) as u64;
            for idx in stripe.clone() {
                // SAFETY: send holds n * total bytes; the slot lies in peer p's LL half (check()).
                unsafe {
                    put_packet(
                        region + (idx * pkt) as u64,
                        unit,
                        &load_unit(src, idx, unit, total),
                        flag,
                    )
                };
            }
        }
        // Reduction of the same stripe of the own block, ranks in order.
        let base = res.peer_bases()[me] + half;
        for idx in stripe {
            for (r, slot) in all.iter_mut().enumerate() {
                *slot = if r == me {
                    // SAFETY: the own block holds `total` bytes of send.
                    unsafe { load_unit(own, idx, unit, total) }
                } else {
                    let addr = base + ((r * w + idx) * pkt) as u64;
                    // SAFETY: the slot lies in this rank's LL half.
                    unsafe { get_packet(addr, unit, flag, res.config().host_timeout)? }
                };
            }
            let out = reduce_units::<T>(call.op, n, &all);
            // SAFETY: recv holds `total` bytes (in place: the own block, read above).
            unsafe { store_unit(call.recv, idx, unit, total, &out) };
        }
    }
    host_bump_flags(res, flag);
    Ok(())
}
