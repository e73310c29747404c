//! The one-hop LL exchange the all-reduce `allpair_packet` and the all-gather and reduce-scatter
//! `packet` share: every rank writes units of its input as LL packets into region `rank` (`units`
//! packets each) of every peer's LL half (all warps of each block send), then reads the regions
//! its peers wrote into its own. Blocks own stripes of [`STRIPE`] consecutive units, round robin
//! (`(idx / STRIPE) % blocks == b`), on both sides, so a block only waits for the same block of
//! its peers. Device side: `llSendToPeers`, `llFirstWord`, `llWordStep` and `llReduceFromPeers`
//! in kernels/cuda/src/collectives/common.hpp.

use super::algorithm::{host_bump_flags, host_flag, Call, CollArgs};
use super::gpu::GpuCtx;
use super::host_ll::{
    get_packet, load_unit, packet_bytes, put_packet, reduce_units, store_unit, Unit,
};
use super::host_math::HostElem;
use super::mesh;
use super::setup::Resources;
use super::types::RawStream;
use crate::error::Result;
use crate::kernels::Kernel;

/// Stripe width in units (one warp).
pub(crate) const STRIPE: usize = 32;

/// Payload bytes per packet: LL16 (8) for every type. LL8 (4 bytes, once used for elements of
/// up to 4 bytes) needs twice the packets for the same bytes; on an H100 shared by 2 and 4 ranks
/// LL16 was as fast up to 64 KiB and faster above (the reduce-scatter at 4 MiB in all 9.2 us
/// against 13.8 with 2 ranks, 30 against 44 with 4; docs/perf.md round 28).
pub(crate) const UNIT_BYTES: usize = 8;

/// Packet payload units of the call's `count` elements (one rank's part).
pub(crate) fn units(call: &Call) -> usize {
    call.bytes().div_ceil(UNIT_BYTES)
}

/// Refuses a call whose [`units`] packets per rank do not fit one LL half.
pub(crate) fn check(res: &Resources, call: &Call, what: &str) -> Result<()> {
    let need = res.nranks() * units(call) * packet_bytes(UNIT_BYTES);
    mesh::check_ll_half(
        res,
        call,
        what,
        need,
        "use a larger scratch or another algorithm",
    )
}

/// Units per rank from which the exchange launches blocks of 1024 threads (else 512).
const WIDE_FROM_UNITS: usize = 64 << 10;

/// Launches `k` for the call's [`units`] per rank: a block per 4 stripes (1 to 64, at most the
/// blocks that may wait on each other), 512 threads, 1024 from [`WIDE_FROM_UNITS`] units; every
/// warp sends and receives. Measured on an H100 shared by 2 and 4 ranks (docs/perf.md round 27):
/// against the one warp per peer and the 256 threads and 32 blocks before, 512 threads and 64
/// blocks were as fast or faster at every size from 1 KiB to 1 MiB, and 1024 threads faster from
/// 256 KiB but slower below 64 KiB. `extra[0]` = units, `extra[1]` = `extra1`.
///
/// # Safety
/// `k` takes one `CollArgs` with those extra words; the caller keeps the buffers alive.
pub(crate) unsafe fn launch(
    res: &Resources,
    gpu: &GpuCtx,
    k: Kernel,
    call: &Call,
    extra1: u64,
    stream: RawStream,
) -> Result<()> {
    let units = units(call);
    let threads = if units >= WIDE_FROM_UNITS { 1024 } else { 512 };
    let blocks = units
        .div_ceil(STRIPE * 4)
        .clamp(1, 64)
        .min(res.max_waiting_blocks()) as u32;
    let mut args = CollArgs::new(res, call);
    args.extra[0] = units as u64;
    args.extra[1] = extra1;
    // SAFETY: forwarded from the caller.
    unsafe { gpu.launch(k, blocks, threads, &args, stream) }
}

/// The host backend's LL flag of this launch and the offset of its LL half in a rank's scratch.
pub(crate) fn host_half(res: &Resources) -> (u32, u64) {
    let flag = host_flag(res, 0);
    let half =
        res.layout().ll_offset as u64 + u64::from(flag & 1) * res.layout().ll_half_bytes as u64;
    (flag, half)
}

/// Whether unit `idx` lies in host block `b`'s stripes (of `nb` blocks); the all-reduce `packet`
/// stripes its slices alike.
pub(crate) fn in_stripe(idx: usize, nb: usize, b: usize) -> bool {
    (idx / STRIPE) % nb == b
}

/// The host backend's exchange of the call's [`units`] per rank: for each block (one after
/// another), the sends of its stripe (unit `idx` of the `call.bytes()`-byte buffer at `src(p)`,
/// to peer p), then `take(idx, read)` for each unit of the stripe, where `read(r)` waits for
/// rank r's packet of that unit (r != this rank). Bumps the LL flags at the end.
pub(crate) fn host_exchange(
    res: &Resources,
    call: &Call,
    src: impl Fn(usize) -> u64,
    mut take: impl FnMut(usize, &dyn Fn(usize) -> Result<Unit>) -> Result<()>,
) -> Result<()> {
    let (units, unit, total) = (units(call), UNIT_BYTES, call.bytes());
    let pkt = packet_bytes(unit);
    let nb = res.config().host_blocks;
    let (me, n) = (res.rank(), res.nranks());
    let (flag, half) = host_half(res);
    let base = res.peer_bases()[me] + half;
    let timeout = res.config().host_timeout;
    let read = |idx: usize| {
        move |r: usize| {
            let addr = base + ((r * units + idx) * pkt) as u64;
            // SAFETY: the slot lies in this rank's LL half (the algorithm's check).
            unsafe { get_packet(addr, unit, flag, timeout) }
        }
    };
    for b in 0..nb {
        let stripe = (0..units).filter(|&idx| in_stripe(idx, nb, b));
        for p in mesh::peers(me, n) {
            let region = res.peer_bases()[p] + half + (me * units * pkt) as u64;
            let from = src(p);
            for idx in stripe.clone() {
                // SAFETY: `src(p)` holds `total` bytes; the slot lies in peer p's LL half.
                unsafe {
                    put_packet(
                        region + (idx * pkt) as u64,
                        unit,
                        &load_unit(from, idx, unit, total),
                        flag,
                    )
                };
            }
        }
        for idx in stripe {
            take(idx, &read(idx))?;
        }
    }
    host_bump_flags(res, flag);
    Ok(())
}

/// The host backend's reducing exchange: block `src(p)` of the call to peer p, then each unit
/// folded over the ranks in rank order (this rank's from `own`) into `call.recv` (`call.bytes()`
/// per rank; `own` may be the output: each unit is read before it is written).
pub(crate) fn host_reduce<T: HostElem>(
    res: &Resources,
    call: &Call,
    src: impl Fn(usize) -> u64,
    own: u64,
) -> Result<()> {
    let (unit, total) = (UNIT_BYTES, call.bytes());
    let (me, n) = (res.rank(), res.nranks());
    let mut all: Vec<Unit> = vec![[0u8; 8]; n];
    host_exchange(res, call, src, |idx, read| {
        for (r, slot) in all.iter_mut().enumerate() {
            *slot = if r == me {
                // SAFETY: `own` holds `total` bytes.
                unsafe { load_unit(own, idx, unit, total) }
            } else {
                read(r)?
            };
        }
        let out = reduce_units::<T>(call.op, n, &all);
        // SAFETY: recv holds `total` bytes.
        unsafe { store_unit(call.recv, idx, unit, total, &out) };
        Ok(())
    })
}
