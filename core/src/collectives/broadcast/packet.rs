//! Broadcast `packet`: the root writes its buffer as LL16 packets into region `root` of every
//! peer's scratch (every warp of every block sends) and, out of place, copies it into its own
//! output; every other rank unpacks the root's region into its output. One hop where `fullmesh`
//! shakes hands before its copies: for small messages (the selector takes it up to
//! [`super::super::selector::broadcast_packet_max_bytes`]).
//!
//! Notes: the one-hop exchanges (allpair.rs) may write into a peer's LL half of two launches ago
//! because a rank that finished a launch has read packets of every peer, so every peer had
//! entered it (and finished the launch before). A broadcast's root hears from nobody, so each
//! rank other than the root writes one note packet per block (word `b * 32` of its region, which
//! the data does not use) into every other rank's LL half when it enters the launch, and each
//! block ends only after the notes of the same block of every other rank but the root (whose data
//! packets say as much). Scratch: LL half `flag & 1`, region of rank `r` at `r * words * 16`
//! (8 payload bytes per 16-byte packet, the tail word zero-padded). Blocks own stripes of 32
//! words, round robin.
//! Kernel: kernels/cuda/src/collectives/broadcast/packet.cu.

use super::super::algorithm::{host_bump_flags, native_algorithm, Call};
use super::super::allpair::{self, host_half, in_stripe, units, STRIPE, UNIT_BYTES as UNIT};
use super::super::host_ll::{get_packet, load_unit, packet_bytes, put_packet, store_unit};
use super::super::mesh;
use super::super::setup::Resources;
use crate::error::Result;
use crate::kernels;

/// The algorithm object (built by [`super::super::collection::native_algorithms`]).
pub struct Packet;

native_algorithm! {
    Packet: "packet", Broadcast;
    check(self, res, call) {
        allpair::check(res, call, "broadcast packet")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let k = kernels::collectives::broadcast::PACKET;
        // SAFETY: the kernel takes one CollArgs with extra[0] = words, extra[1] = bytes; the
        // caller keeps the buffers alive.
        unsafe { allpair::launch(res, gpu, k, call, call.bytes() as u64, stream) }
    }

    run_host(self, res, call) {
        host(res, call)
    }
}

/// The host backend's broadcast: the same packets and notes, host block after host block.
fn host(res: &Resources, call: &Call) -> Result<()> {
    let (me, n, root) = (res.rank(), res.nranks(), call.root);
    let (total, units, nb) = (call.bytes(), units(call), res.config().host_blocks);
    let pkt = packet_bytes(UNIT);
    let (flag, half) = host_half(res);
    let timeout = res.config().host_timeout;
    // Rank `to`'s slot `idx` of the region written by rank `from`.
    let slot = |to: usize, from: usize, idx: usize| {
        res.peer_bases()[to] + half + ((from * units + idx) * pkt) as u64
    };
    // The note of each host block that owns a stripe: its first word.
    let notes = (0..nb).map(|b| b * STRIPE).filter(|&w| w < units);
    if me != root {
        for p in mesh::peers(me, n) {
            for w in notes.clone() {
                // SAFETY: the slot lies in rank p's LL half (the algorithm's check).
                unsafe { put_packet(slot(p, me, w), UNIT, &[0; 8], flag) };
            }
        }
    }
    for b in 0..nb {
        for idx in (0..units).filter(|&idx| in_stripe(idx, nb, b)) {
            if me == root {
                // SAFETY: the input holds `total` bytes.
                let u = unsafe { load_unit(call.send, idx, UNIT, total) };
                for p in mesh::peers(me, n) {
                    // SAFETY: the slot lies in rank p's LL half.
                    unsafe { put_packet(slot(p, me, idx), UNIT, &u, flag) };
                }
                if call.send != call.recv {
                    // SAFETY: the output holds `total` bytes, apart from the input.
                    unsafe { store_unit(call.recv, idx, UNIT, total, &u) };
                }
            } else {
                // SAFETY: the slot lies in this rank's LL half; the output holds `total` bytes.
                unsafe {
                    let u = get_packet(slot(me, root, idx), UNIT, flag, timeout)?;
                    store_unit(call.recv, idx, UNIT, total, &u);
                }
            }
        }
    }
    for p in mesh::peers(me, n).filter(|&p| p != root) {
        for w in notes.clone() {
            // SAFETY: the slot lies in this rank's LL half.
            unsafe { get_packet(slot(me, p, w), UNIT, flag, timeout)? };
        }
    }
    host_bump_flags(res, flag);
    Ok(())
}
