//! All-gather `packet`: every rank writes its input as LL16 packets into region `rank` of every
//! peer's scratch (one warp per peer in each block) and, out of place, copies it into its own
//! output slot; then it unpacks every peer's region into that peer's output slot. One hop where
//! `fullmesh` makes two handshakes around its copies: for small messages (the selector takes it
//! up to [`super::super::selector::ALLGATHER_PACKET_MAX_BYTES`] per rank).
//!
//! Scratch: LL half `flag & 1`, region of source rank `r` at `r * words * 16` (8 payload bytes
//! per 16-byte packet; the tail word is zero-padded). Blocks own stripes of 32 consecutive
//! words, round robin (`(idx / 32) % blocks == b`), so a block only waits for the same block of
//! its peers. In place the input is this rank's output slot, which nothing writes.
//! Kernel: kernels/cuda/src/collectives/allgather/packet.cu.

use super::super::algorithm::{host_bump_flags, host_flag, native_algorithm, Call, CollArgs};
use super::super::host_ll::{get_packet, load_unit, packet_bytes, put_packet, store_unit};
use super::super::mesh;
use super::super::setup::Resources;
use crate::error::Result;
use crate::kernels;

/// The algorithm object (built by [`super::super::collection::native_algorithms`]).
pub struct Packet;

/// Payload bytes per packet (LL16).
const UNIT: usize = 8;
/// Stripe width in words (one warp).
const STRIPE: usize = 32;

/// Packet payload words per rank.
fn words(call: &Call) -> usize {
    call.bytes().div_ceil(UNIT)
}

native_algorithm! {
    Packet: "packet", AllGather;
    check(self, res, call) {
        let need = res.nranks() * words(call) * packet_bytes(UNIT);
        mesh::check_ll_half(res, call, "allgather packet", need, "use a larger scratch or another algorithm")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let w = words(call);
        let peers = res.nranks() - 1;
        // One warp per peer for the sends, at least 8 warps for the unpacking.
        let threads = (32 * peers.max(8)).min(1024) as u32;
        let blocks = w
            .div_ceil(STRIPE * 4)
            .clamp(1, 32)
            .min(res.max_waiting_blocks()) as u32;
        let mut args = CollArgs::new(res, call);
        args.extra[0] = w as u64;
        args.extra[1] = call.bytes() as u64;
        let k = kernels::collectives::allgather::PACKET;
        // SAFETY: CollArgs mirrors the kernel's parameter; the caller keeps the buffers alive.
        unsafe { gpu.launch(k, blocks, threads, &args, stream) }
    }

    run_host(self, res, call) {
        host(res, call)
    }
}

fn host(res: &Resources, call: &Call) -> Result<()> {
    let (w, total) = (words(call), call.bytes());
    let pkt = packet_bytes(UNIT);
    let nb = res.config().host_blocks;
    let (me, n) = (res.rank(), res.nranks());
    let own = call.recv + (me * total) as u64;
    let in_place = call.send == own;
    let flag = host_flag(res, 0);
    let half =
        res.layout().ll_offset as u64 + u64::from(flag & 1) * res.layout().ll_half_bytes as u64;
    for b in 0..nb {
        let stripe = (0..w).filter(|idx| (idx / STRIPE) % nb == b);
        // Sends: the block's stripe to every peer, and into the own slot out of place.
        for p in (0..n).filter(|&p| p != me) {
            let region = res.peer_bases()[p] + half + (me * w * pkt) as u64;
            for idx in stripe.clone() {
                // SAFETY: send holds `total` bytes; the slot lies in peer p's LL half (check()).
                unsafe {
                    put_packet(
                        region + (idx * pkt) as u64,
                        UNIT,
                        &load_unit(call.send, idx, UNIT, total),
                        flag,
                    )
                };
            }
        }
        if !in_place {
            for idx in stripe.clone() {
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
        }
        // Unpacking of the same stripe from every peer's region.
        let base = res.peer_bases()[me] + half;
        for idx in stripe {
            for p in (0..n).filter(|&p| p != me) {
                let addr = base + ((p * w + idx) * pkt) as u64;
                // SAFETY: the slot lies in this rank's LL half; recv holds n * total bytes.
                unsafe {
                    let u = get_packet(addr, UNIT, flag, res.config().host_timeout)?;
                    store_unit(call.recv + (p * total) as u64, idx, UNIT, total, &u);
                }
            }
        }
    }
    host_bump_flags(res, flag);
    Ok(())
}
