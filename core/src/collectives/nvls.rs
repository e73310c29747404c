//! Shared pieces of the NVLS all-reduces (`nvls_packet`, `nvls_zero_copy`, `nvls_warp_pipeline`,
//! `nvls_block_pipeline`): the per-communicator NVLS state built lazily in [`NvlsShared`]
//! (held by the four variants of one collection: one [`NvlsConnection`] over every rank with a
//! bound scratch buffer and its switch channel), the cache of bound user buffers of the
//! zero-copy variant, the work
//! partition, which element types multimem reduces, and the selector's NVLS preferences.
//!
//! Multimem reduces with `add` only, on f32/f16/bf16 (the switch's formats): the load-reduce
//! variants take exactly those with `sum` and hand every other call to a copying algorithm
//! (`rsag_pipeline`, else `rsag`) on every rank alike; `nvls_packet` only broadcasts through the
//! switch and reduces locally, so it takes any type and op.
//!
//! Work partition (host and kernels): the buffer is `nv` 16-byte vectors; rank r reduces
//! `split(nv, n, r)` and block b of it `split(len, blocks, b)`, so a block only waits for the
//! same block of its peers (`host_barrier` / `meshBarrier` on the framework's semaphores).
//!
//! The selector picks these only where NVLS is usable for the communicator's device and every
//! rank is on one node (`selector_prefs`); on the host backend only when forced
//! (`MSCCLPP_ALLREDUCE_ALGO=nvls_...`) or opted in with `MSCCLPP_NVLS_EMULATION=1`, so the
//! host tests keep their algorithms. They run over the multicast emulation there.
//! Kernels: kernels/cuda/src/collectives/allreduce/nvls_*.cu (sm_90+; `nvls.hpp`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mscclpp_hal::MemoryKind;

use super::algorithm::{Algorithm, Call};
use super::allreduce::rsag_pipeline::RsagPipeline;
use super::gpu::{GpuCtx, LazyState};
use super::setup::Resources;
use super::types::{DataType, RawStream, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::LocalMemory;
use crate::nvls::{nvls_usable, NvlsConnection};
use crate::switch_channel::{SwitchChannel, SwitchChannelDeviceHandle};
use crate::transport::DeviceType;

/// Bytes of the NVLS scratch buffer (rounded up to the multicast granularity).
pub(crate) const SCRATCH_BYTES: usize = 8 << 20;

static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// Calls of this process that went through the switch (an NVLS variant that did not hand the
/// call to its copying fallback). Tests compare it before and after a forced call.
pub fn nvls_launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

pub(crate) fn count_launch() {
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
}

/// The NVLS state of one communicator.
pub struct NvlsState {
    /// The connection of the scratch buffer.
    pub conn: NvlsConnection,
    /// The scratch channel (this rank's copy at `device_ptr`, the multicast address at `mc_ptr`).
    pub channel: SwitchChannel,
    /// Bytes of the scratch (a multiple of the granularity).
    pub bytes: usize,
    /// `[1]` device handle of the channel in device memory (for kernels).
    pub table: LocalMemory,
    _scratch: LocalMemory,
}

/// One bound user buffer (zero-copy): its own connection and channel, and the handle table.
pub struct UserChannel {
    /// The channel.
    pub channel: SwitchChannel,
    /// `[1]` device handle in device memory.
    pub table: LocalMemory,
    _conn: NvlsConnection,
}

type UserEntries = Mutex<HashMap<(u64, usize), Option<Arc<UserChannel>>>>;

/// The env opt-in that lets the selector pick the NVLS variants on the host backend (over the
/// multicast emulation): `MSCCLPP_NVLS_EMULATION=1` (`0` or unset: only when forced).
pub const EMULATION_ENV: &str = crate::env::NVLS_EMULATION;

/// Whether the selector may pick an NVLS variant for a communicator on `device` (asked once per
/// `Collectives`): on a GPU when [`nvls_usable`] is `Ok` (env switches first, then the GPU's
/// multicast support); on the host backend only when `opt_in` ([`crate::env::Env::nvls_emulation`]).
pub(crate) fn selectable(device: crate::transport::Device, opt_in: bool) -> bool {
    match device.kind {
        DeviceType::Cpu => opt_in && nvls_usable(device).is_ok(),
        DeviceType::Gpu => nvls_usable(device).is_ok(),
    }
}

/// The selector's all-reduce preferences where NVLS is selectable (`nvls`, see [`selectable`])
/// and every rank is on this node: small calls `nvls_packet`, medium `nvls_warp_pipeline`, large
/// `nvls_block_pipeline` (not `nvls_zero_copy`: binding a user buffer is collective, as for
/// `rsag_zero_copy`, so it only runs when forced).
pub(crate) fn selector_prefs(
    nvls: bool,
    nranks: usize,
    nranks_per_node: usize,
    bytes: usize,
) -> Option<&'static [&'static str]> {
    if !nvls || nranks_per_node != nranks {
        return None;
    }
    Some(if bytes <= 64 << 10 {
        &["nvls_packet", "allpair_packet", "packet"]
    } else if bytes <= 8 << 20 {
        &["nvls_warp_pipeline", "rsag_pipeline", "rsag"]
    } else {
        &["nvls_block_pipeline", "rsag_pipeline", "rsag"]
    })
}

/// Whether multimem reduces `call` (f32/f16/bf16, sum).
pub(crate) fn multimem_reduces(call: &Call) -> bool {
    matches!(call.dtype, DataType::F32 | DataType::F16 | DataType::Bf16) && call.op == ReduceOp::Sum
}

/// The copying algorithm the load-reduce variants hand other calls to (`rsag_pipeline`,
/// stateless: it keeps nothing but what the shared resources hold).
pub(crate) fn fallback() -> Result<&'static dyn Algorithm> {
    static FALLBACK: RsagPipeline = RsagPipeline;
    Ok(&FALLBACK)
}

/// `Ok` when NVLS can run on the device of `res` (the reason otherwise, naming the algorithm).
pub(crate) fn check_usable(name: &str, res: &Resources) -> Result<()> {
    nvls_usable(res.device()).map_err(|e| Error::invalid(format!("allreduce {name}: {e}")))
}

/// The check of the NVLS all-reduces that fall back to [`fallback`] where they cannot run the
/// call: NVLS usable ([`check_usable`]) and the call fits the fallback.
pub(crate) fn check_with_fallback(name: &str, res: &Resources, call: &Call) -> Result<()> {
    check_usable(name, res)?;
    fallback()?.check(res, call)
}

fn handle_table(res: &Resources, h: SwitchChannelDeviceHandle) -> Result<LocalMemory> {
    let t = LocalMemory::alloc(
        res.device(),
        std::mem::size_of::<SwitchChannelDeviceHandle>(),
    )?;
    let words = [
        h.device_ptr as usize as u64,
        h.mc_ptr as usize as u64,
        h.buffer_size,
    ];
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    t.write(0, &bytes)?;
    Ok(t)
}

fn bindable_kind(res: &Resources, granularity: usize) -> MemoryKind {
    match res.device().kind {
        DeviceType::Gpu => MemoryKind::Physical { granularity },
        DeviceType::Cpu => MemoryKind::Device,
    }
}

/// The NVLS state of one communicator, shared by the NVLS variants one collection built: the
/// scratch state (built by the first call outside capture, collective) and the bound user
/// buffers of `nvls_zero_copy`.
#[derive(Default)]
pub struct NvlsShared {
    scratch: LazyState<NvlsState>,
    user: UserEntries,
}

impl std::fmt::Debug for NvlsShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let built = self.scratch.is_built();
        f.debug_struct("NvlsShared")
            .field("scratch_built", &built)
            .finish_non_exhaustive()
    }
}

impl NvlsShared {
    /// The scratch state on `res`, built on first use (collective); `None` during a graph
    /// capture before it was built (the caller falls back). A failed build leaves it unbuilt.
    pub(crate) fn state(
        &self,
        res: &Resources,
        gpu: Option<(&GpuCtx, RawStream)>,
    ) -> Result<Option<Arc<NvlsState>>> {
        self.scratch.get_or_build(gpu, || build(res))
    }

    /// The channel of user buffer `(ptr, size)`, binding it on a miss outside capture
    /// (collective: one connection per buffer, then every rank says whether its bind worked;
    /// if any failed, every rank caches "not bindable"). `Ok(None)`: use the fallback.
    pub(crate) fn user_channel(
        &self,
        res: &Resources,
        ptr: u64,
        size: usize,
        capturing: bool,
    ) -> Result<Option<Arc<UserChannel>>> {
        user_channel(&self.user, res, ptr, size, capturing)
    }
}

fn build(res: &Resources) -> Result<NvlsState> {
    let ranks: Vec<usize> = (0..res.nranks()).collect();
    let conn = NvlsConnection::connect_collective(res.comm(), &ranks, res.device(), SCRATCH_BYTES)?;
    let bytes = SCRATCH_BYTES.next_multiple_of(conn.granularity());
    let scratch =
        LocalMemory::alloc_kind(res.device(), bytes, bindable_kind(res, conn.granularity()))?;
    let channel = conn.bind_allocated_memory(scratch.ptr(), bytes)?;
    let table = handle_table(res, channel.device_handle())?;
    // Every rank's scratch is bound before anyone reduces over it.
    res.comm().bootstrap().barrier()?;
    Ok(NvlsState {
        conn,
        channel,
        bytes,
        table,
        _scratch: scratch,
    })
}

fn user_channel(
    cache: &UserEntries,
    res: &Resources,
    ptr: u64,
    size: usize,
    capturing: bool,
) -> Result<Option<Arc<UserChannel>>> {
    if let Some(e) = cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(ptr, size))
    {
        return Ok(e.clone());
    }
    if capturing {
        return Ok(None);
    }
    let ranks: Vec<usize> = (0..res.nranks()).collect();
    let conn = NvlsConnection::connect_collective(res.comm(), &ranks, res.device(), size)?;
    let bound = conn.bind_allocated_memory(ptr, size);
    let all = res
        .comm()
        .bootstrap()
        .all_gather(&[u8::from(bound.is_ok())])?;
    let entry = match bound {
        Ok(channel) if all.iter().all(|x| x.first() == Some(&1)) => {
            let table = handle_table(res, channel.device_handle())?;
            Some(Arc::new(UserChannel {
                channel,
                table,
                _conn: conn,
            }))
        }
        _ => None,
    };
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert((ptr, size), entry.clone());
    Ok(entry)
}

/// `[begin, end)` of part `i` of `n` items in `parts` parts (as the kernels split).
pub(crate) fn split(n: u64, parts: u64, i: u64) -> (u64, u64) {
    let per = n / parts;
    let rem = n % parts;
    let begin = i * per + i.min(rem);
    (begin, begin + per + u64::from(i < rem))
}

/// Vectors `[begin, end)` that block `b` of `blocks` of rank `r` of `n` reduces, of `nv`.
pub(crate) fn block_vectors(nv: u64, n: usize, r: usize, blocks: usize, b: usize) -> (u64, u64) {
    let (s0, s1) = split(nv, n as u64, r as u64);
    let (x0, x1) = split(s1 - s0, blocks as u64, b as u64);
    (s0 + x0, s0 + x1)
}

/// Runs `$body` with `$V` the 16-byte multimem vector of `$dtype` (f32, f16, bf16 only).
macro_rules! with_vec16 {
    ($dtype:expr, $V:ident => $body:expr) => {
        $crate::collectives::host_math::bind_dtype!($dtype, $V => $body;
            F32: $crate::device_emu::switch_channel::F32x4,
            F16: $crate::device_emu::switch_channel::F16x8,
            Bf16: $crate::device_emu::switch_channel::Bf16x8;
            other => Err($crate::error::Error::Internal(format!(
                "NVLS vector of {other}: only f32, f16 and bf16 reach here"
            ))),
        )
    };
}
pub(crate) use with_vec16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_covers_each_vector_once() {
        for (nv, n, blocks) in [(0u64, 2usize, 2usize), (7, 3, 2), (1000, 8, 3), (5, 8, 4)] {
            let mut seen = vec![0u32; nv as usize];
            for r in 0..n {
                for b in 0..blocks {
                    let (x0, x1) = block_vectors(nv, n, r, blocks, b);
                    for v in x0..x1 {
                        seen[v as usize] += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&c| c == 1),
                "nv {nv} n {n} blocks {blocks}"
            );
        }
    }

    #[test]
    fn selection_needs_usable_nvls_on_one_node() {
        assert!(selector_prefs(false, 4, 4, 1 << 20).is_none());
        assert!(selector_prefs(true, 8, 4, 1 << 20).is_none());
        assert_eq!(
            selector_prefs(true, 4, 4, 1 << 10).unwrap()[0],
            "nvls_packet"
        );
        assert_eq!(
            selector_prefs(true, 4, 4, 1 << 20).unwrap()[0],
            "nvls_warp_pipeline"
        );
        assert_eq!(
            selector_prefs(true, 4, 4, 64 << 20).unwrap()[0],
            "nvls_block_pipeline"
        );
    }

    #[test]
    fn host_selects_nvls_only_when_opted_in() {
        let cpu = crate::transport::Device::CPU;
        assert!(!selectable(cpu, false));
        assert!(selectable(cpu, true));
    }
}
