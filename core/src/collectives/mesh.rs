//! Shared pieces of the scratch-based ("mesh") algorithms of all-gather, reduce-scatter,
//! broadcast and the pipelined / zero-copy / port-channel all-reduces: how many ranks share a
//! GPU (so grids stay small enough for every rank's blocks to be resident at once: blocks wait
//! for the same block of their peers), the block partition of a chunk, and the host backend's
//! copies. Device counterpart: kernels/cuda/src/collectives/mesh.hpp.
//!
//! Invariant of every algorithm here: a block writes into a peer's plain scratch (or a peer's
//! user buffer) only after a handshake with that peer inside the same launch. The peer is then
//! inside this launch, so its previous call (of any algorithm, on the same stream) is complete.

use mscclpp_hal::{prelude::*, Gpu};

use super::algorithm::{split, Call, CollArgs};
use super::gpu::GpuCtx;
use super::setup::{Resources, MAX_SEM_BLOCKS};
pub(crate) use super::topology::Census;
use super::types::RawStream;
use crate::error::{Error, Result};
use crate::kernels::Kernel;
use crate::memory::hal_err;

/// Bytes of one vector (the partition granularity).
pub(crate) const VEC: usize = 16;
/// Threads of a mesh kernel's block.
pub(crate) const THREADS: u32 = 1024;

/// The census of `res` (collective on first use, outside capture: one bootstrap all-gather of
/// every rank's GPU PCI bus id and SM count). During a capture before any census, the
/// conservative guess "every rank of the node on one GPU" (still identical on every rank).
pub(crate) fn census(res: &Resources, gpu: &GpuCtx, stream: RawStream) -> Result<Census> {
    let cell = res.census_cell();
    if let Some(c) = cell.get() {
        return Ok(*c);
    }
    if gpu.is_capturing(stream)? {
        return Ok(Census {
            share: res.nranks_per_node().max(1),
            min_sms: res.sm_count(),
        });
    }
    // Calls are serialised by the launch lock, so only one thread takes the census.
    let p = Gpu::properties(gpu.device()).map_err(|e| hal_err("GPU properties", e))?;
    let mut blob = p.sm_count.to_le_bytes().to_vec();
    blob.extend_from_slice(p.pci_bus_id.as_bytes());
    let all = res.comm().bootstrap().all_gather(&blob)?;
    let mut min_sms = u32::MAX;
    let mut ids: Vec<&[u8]> = Vec::with_capacity(all.len());
    for (r, b) in all.iter().enumerate() {
        let sms: [u8; 4] = b.get(..4).and_then(|s| s.try_into().ok()).ok_or_else(|| {
            Error::remote(
                r,
                "collectives census: expected an SM count and a PCI bus id",
            )
        })?;
        min_sms = min_sms.min(u32::from_le_bytes(sms));
        ids.push(&b[4..]);
    }
    let share = ids
        .iter()
        .map(|id| ids.iter().filter(|o| *o == id).count())
        .max()
        .unwrap_or(1);
    let c = Census {
        share,
        min_sms: min_sms.max(1),
    };
    Ok(*cell.get_or_init(|| c))
}

/// Blocks of a launch that wants `want`: at most one block per multiprocessor for each rank
/// sharing the GPU, at most `limit` (and [`MAX_SEM_BLOCKS`]), at least 1.
pub(crate) fn grid(c: &Census, want: usize, limit: usize) -> u32 {
    let cap = (c.min_sms as usize / c.share.max(1)).max(1);
    want.min(cap).min(limit).clamp(1, MAX_SEM_BLOCKS) as u32
}

/// The grid a mesh launch asks for: `want` blocks, at most `limit` ([`grid`] applies the census).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grid {
    /// Blocks the work would use.
    pub want: usize,
    /// The algorithm's cap.
    pub limit: usize,
}

/// The launch of every census-sized collective kernel: `k` with [`THREADS`] threads on the
/// [`grid`] of `g` over this call's [`census`], its one parameter `CollArgs::new(res, call)`
/// with `extra` in the first words of `CollArgs::extra`.
///
/// # Safety
/// `k` takes one `CollArgs`; every address in `extra` and in the call stays valid until the
/// kernel finished; `stream` is 0 or a live stream of `gpu`'s device.
pub(crate) unsafe fn launch(
    res: &Resources,
    gpu: &GpuCtx,
    call: &Call,
    stream: RawStream,
    k: Kernel,
    g: Grid,
    extra: &[u64],
) -> Result<()> {
    let census = census(res, gpu, stream)?;
    let blocks = grid(&census, g.want, g.limit);
    let mut args = CollArgs::new(res, call);
    args.extra
        .get_mut(..extra.len())
        .ok_or_else(|| {
            Error::Internal(format!(
                "{}: {} extra argument words, CollArgs has 5",
                k.name(),
                extra.len()
            ))
        })?
        .copy_from_slice(extra);
    // SAFETY: forwarded from the caller; CollArgs mirrors the kernel's parameter (common.hpp).
    unsafe { gpu.launch(k, blocks, THREADS, &args, stream) }
}

/// Bytes of one of `nslots` equal slots of the plain scratch (a multiple of [`VEC`]).
pub(crate) fn slot_bytes(res: &Resources, nslots: usize) -> usize {
    (res.layout().plain_bytes / nslots.max(1)) / VEC * VEC
}

/// Bytes per block per chunk the grids of the slotted kernels ([`launch_slotted`]) are sized for.
const SLOTTED_BYTES_PER_BLOCK: usize = 64 << 10;

/// The error of an algorithm `what` whose plain scratch is smaller than the `need` bytes it
/// must have at least.
pub(crate) fn small_scratch(res: &Resources, what: &str, need: usize) -> Error {
    Error::invalid(format!(
        "{what}: expected a plain scratch of at least {need} bytes, got {}",
        res.layout().plain_bytes
    ))
}

/// The check of an algorithm that cuts the plain scratch into `nslots` slots: each slot holds
/// at least one vector; the error names `what` (e.g. "allgather fullmesh").
pub(crate) fn check_slots(res: &Resources, nslots: usize, what: &str) -> Result<()> {
    check_piece(res, slot_bytes(res, nslots), what, nslots * VEC)
}

/// The check of an algorithm that moves pieces of `piece` bytes cut from the plain scratch:
/// a piece holds at least one vector, else the error [`small_scratch`] with `need` bytes.
pub(crate) fn check_piece(res: &Resources, piece: usize, what: &str, need: usize) -> Result<()> {
    if piece < VEC {
        return Err(small_scratch(res, what, need));
    }
    Ok(())
}

/// The check of a packet (LL) algorithm whose call needs `need` bytes of each LL scratch
/// half; `hint` is what to do instead.
pub(crate) fn check_ll_half(
    res: &Resources,
    call: &Call,
    what: &str,
    need: usize,
    hint: &str,
) -> Result<()> {
    let have = res.layout().ll_half_bytes;
    if need > have {
        return Err(Error::invalid(format!(
            "{what}: {} bytes need {need} bytes of LL scratch per half, expected at most {have} (ll_half_bytes); {hint}",
            call.bytes()
        )));
    }
    Ok(())
}

/// The launch of the fullmesh kernels: chunks of one of `nslots` plain scratch slots, a grid
/// of up to 32 blocks sized for 64 KiB per block per chunk, `extra = [slot bytes, call bytes]`.
///
/// # Safety
/// As [`launch`]: `k` takes one `CollArgs` whose first extra words are those two.
pub(crate) unsafe fn launch_slotted(
    res: &Resources,
    gpu: &GpuCtx,
    call: &Call,
    stream: RawStream,
    k: Kernel,
    nslots: usize,
) -> Result<()> {
    let c = slot_bytes(res, nslots);
    let want = call.bytes().min(c).div_ceil(SLOTTED_BYTES_PER_BLOCK);
    let extra = [c as u64, call.bytes() as u64];
    // SAFETY: forwarded from the caller.
    unsafe { launch(res, gpu, call, stream, k, Grid { want, limit: 32 }, &extra) }
}

/// The host loop of the chunked algorithms: for every block `b` of `nb` and every chunk of at
/// most `c_max` bytes of `total` (starting at byte `start`), `f(b, start, part)` with block
/// b's [`part`] of the chunk. Stops at the first error.
pub(crate) fn for_each_part(
    nb: usize,
    total: usize,
    c_max: usize,
    mut f: impl FnMut(usize, usize, (usize, usize)) -> Result<()>,
) -> Result<()> {
    for b in 0..nb {
        let mut start = 0;
        while start < total {
            let c = c_max.min(total - start);
            f(b, start, part(c, nb, b))?;
            start += c;
        }
    }
    Ok(())
}

/// `[x0, x1)`: the bytes block `b` of `nb` owns in a chunk of `c` bytes (whole vectors, the
/// last block's part clipped at `c`). mesh.hpp `blockPart`.
pub(crate) fn part(c: usize, nb: usize, b: usize) -> (usize, usize) {
    let (v0, v1) = split(c.div_ceil(VEC), nb, b);
    ((v0 * VEC).min(c), (v1 * VEC).min(c))
}

/// Host backend: copies `bytes` from `src` to `dst` (memmove).
///
/// # Safety
/// Both ranges are live host memory of at least `bytes` bytes.
pub(crate) unsafe fn host_copy(dst: u64, src: u64, bytes: usize) {
    if bytes > 0 && dst != src {
        // SAFETY: forwarded from the caller.
        unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes) };
    }
}

/// Rank `me`'s peers starting after it (the order kernels visit them in).
pub(crate) fn peers(me: usize, n: usize) -> impl Iterator<Item = usize> {
    (1..n).map(move |q| (me + q) % n)
}

/// Device address of slot `slot` (of `slot_bytes`) in rank `r`'s plain scratch, plus `at`.
pub(crate) fn scratch_at(
    res: &Resources,
    r: usize,
    slot: usize,
    slot_bytes: usize,
    at: usize,
) -> u64 {
    res.peer_bases()[r] + (res.layout().plain_offset + slot * slot_bytes + at) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_chunk() {
        for c in [0usize, 1, 15, 16, 17, 1000, 4099] {
            for nb in [1usize, 2, 3, 64] {
                let mut end = 0;
                for b in 0..nb {
                    let (x0, x1) = part(c, nb, b);
                    assert_eq!(x0, end, "c {c} nb {nb} b {b}");
                    assert!(
                        x1 >= x0 && (x0 % VEC == 0 || x0 == c),
                        "c {c} nb {nb} b {b}"
                    );
                    end = x1;
                }
                assert_eq!(end, c);
            }
        }
    }

    #[test]
    fn grid_caps() {
        let c = Census {
            share: 4,
            min_sms: 132,
        };
        assert_eq!(grid(&c, 1000, 1000), 33);
        assert_eq!(grid(&c, 0, 1000), 1);
        let one = Census {
            share: 1,
            min_sms: 132,
        };
        assert_eq!(grid(&one, 1000, 1000), MAX_SEM_BLOCKS as u32);
        assert_eq!(peers(2, 4).collect::<Vec<_>>(), vec![3, 0, 1]);
    }
}
