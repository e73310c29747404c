//! All-reduce `packet`: two phases in LL16 packets. Rank r owns slice r (`S` elements,
//! rounded up to 8-byte words; the last slices may hold padding). Phase 1 (reduce-scatter):
//! every rank sends slice p of its input to rank p's phase-1 area; phase 2: the owner
//! reduces the ranks' words in rank order, stores its slice and sends the result to every
//! peer's phase-2 area; phase 3 (all-gather): every rank unpacks the other slices. Used up to
//! ~1 MiB.
//!
//! Scratch (LL half `flag & 1`): phase-1 area at 0, region of source rank s at
//! `s * SW` packets (SW = words per slice); phase-2 area at `n * SW` packets, same regions.
//! Block b owns the 32-word stripes `(j / 32) % blocks == b` of every slice in all phases,
//! so a block depends only on the same block of its peers.
//! Kernel: kernels/cuda/src/collectives/allreduce/packet.cu.

use super::super::algorithm::{host_bump_flags, native_algorithm, Call, CollArgs};
use super::super::allpair::{host_half, in_stripe};
use super::super::host_ll::{get_packet, load_unit, put_packet, reduce_units, store_unit, Unit};
use super::super::host_math::{with_elem, HostElem};
use super::super::mesh;
use super::super::setup::Resources;
use crate::error::Result;
use crate::kernels;

/// The algorithm object.
pub struct Packet;

const WORD: usize = 8;
const PKT: usize = 16;

/// Words per slice.
fn slice_words(call: &Call, n: usize) -> usize {
    let epw = WORD / call.dtype.size_in_bytes();
    call.count.div_ceil(n).div_ceil(epw)
}

native_algorithm! {
    Packet: "packet", AllReduce;
    check(self, res, call) {
        let need = 2 * res.nranks() * slice_words(call, res.nranks()) * PKT;
        mesh::check_ll_half(res, call, "allreduce packet", need, "use rsag for this size")
    }

    launch_gpu(self, res, gpu, call, stream) {
        let sw = slice_words(call, res.nranks());
        let threads = 512u32;
        let blocks = (sw * (res.nranks() - 1))
            .div_ceil(threads as usize)
            .clamp(1, res.max_waiting_blocks()) as u32;
        let mut args = CollArgs::new(res, call);
        args.extra[0] = sw as u64;
        let k = kernels::collectives::allreduce::PACKET.instance(call.dtype, call.op)?;
        // SAFETY: CollArgs mirrors the kernel's parameter; the caller keeps the buffers alive.
        unsafe { gpu.launch(k, blocks, threads, &args, stream) }
    }

    run_host(self, res, call) {
        with_elem!(call.dtype, T => host::<T>(res, call))
    }
}

fn host<T: HostElem>(res: &Resources, call: &Call) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    let total = call.bytes();
    let sw = slice_words(call, n);
    let (flag, half) = host_half(res);
    let p1 = |rank: usize, src: usize, j: usize| {
        res.peer_bases()[rank] + half + ((src * sw + j) * PKT) as u64
    };
    let p2 = |rank: usize, src: usize, j: usize| {
        res.peer_bases()[rank] + half + (((n + src) * sw + j) * PKT) as u64
    };
    let t = res.config().host_timeout;
    let mut all: Vec<Unit> = vec![[0u8; 8]; n];
    for b in 0..nb {
        let stripe = || (0..sw).filter(move |&j| in_stripe(j, nb, b));
        for p in (0..n).filter(|&p| p != me) {
            for j in stripe() {
                // SAFETY: send/recv hold `total` bytes; the packet slots lie in the mapped LL halves (check()).
                unsafe {
                    put_packet(
                        p1(p, me, j),
                        WORD,
                        &load_unit(call.send, p * sw + j, WORD, total),
                        flag,
                    )
                };
            }
        }
        for j in stripe() {
            for (r, slot) in all.iter_mut().enumerate() {
                *slot = if r == me {
                    // SAFETY: send/recv hold `total` bytes; the packet slots lie in the mapped LL halves (check()).
                    unsafe { load_unit(call.send, me * sw + j, WORD, total) }
                } else {
                    // SAFETY: send/recv hold `total` bytes; the packet slots lie in the mapped LL halves (check()).
                    unsafe { get_packet(p1(me, r, j), WORD, flag, t)? }
                };
            }
            let out = reduce_units::<T>(call.op, n, &all);
            // SAFETY: send/recv hold `total` bytes; the packet slots lie in the mapped LL halves (check()).
            unsafe { store_unit(call.recv, me * sw + j, WORD, total, &out) };
            for p in (0..n).filter(|&p| p != me) {
                // SAFETY: send/recv hold `total` bytes; the packet slots lie in the mapped LL halves (check()).
                unsafe { put_packet(p2(p, me, j), WORD, &out, flag) };
            }
        }
        for s in (0..n).filter(|&s| s != me) {
            for j in stripe() {
                // SAFETY: send/recv hold `total` bytes; the packet slots lie in the mapped LL halves (check()).
                let w = unsafe { get_packet(p2(me, s, j), WORD, flag, t)? };
                // SAFETY: send/recv hold `total` bytes; the packet slots lie in the mapped LL halves (check()).
                unsafe { store_unit(call.recv, s * sw + j, WORD, total, &w) };
            }
        }
    }
    host_bump_flags(res, flag);
    Ok(())
}
