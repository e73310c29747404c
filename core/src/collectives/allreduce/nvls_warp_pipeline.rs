//! All-reduce `nvls_warp_pipeline` (upstream `AllreduceNvlsWarpPipeline`, formerly
//! `AllreduceNvlsWithCopy`): the input goes through the NVLS scratch buffer (bound once per
//! communicator, `nvls::state`), so any buffer works and nothing is bound per
//! call.
//!
//! The scratch is cut into one region per block; the input is cut into region-sized chunks,
//! chunk j done by block `j % blocks`. Per chunk a block 1. copies the whole chunk into its
//! region of this rank's scratch (zero padding the last vector), 2. handshakes with the same
//! block of every peer (all copies are in), 3. load-reduces its rank's share of the chunk over
//! every rank's scratch and stores the sums into every rank's scratch (`multimem.ld_reduce` +
//! `multimem.st` on the scratch's multicast address), 4. handshakes (every share has landed),
//! 5. copies the chunk out of its region into the output. Two handshakes per chunk; see
//! `nvls_block_pipeline` for the double-buffered form with one. f32/f16/bf16 sum only (any
//! count); other calls go to the copying fallback.
//! Kernel: kernels/cuda/src/collectives/allreduce/nvls_warp_pipeline.cu (a warp-strided loop per
//! phase).

use super::super::algorithm::{host_barrier, Call, CollArgs};
use super::super::gpu::GpuCtx;
use super::super::mesh::{self, host_copy, THREADS};
use super::super::nvls::{count_launch, fallback, multimem_reduces, split, NvlsShared, NvlsState};
use super::super::setup::Resources;
use super::super::types::RawStream;
use crate::device_emu::switch_channel::MultimemVector;
use crate::error::{Error, Result};
use crate::kernels::Family;

/// The algorithm object: the NVLS state it shares with the other NVLS variants.
#[derive(Debug, Default)]
pub struct NvlsWarpPipeline {
    /// The lazily built NVLS scratch (and bound user buffers) of this communicator.
    pub(crate) nvls: std::sync::Arc<super::super::nvls::NvlsShared>,
}

/// Bytes of each block's scratch region (whole vectors).
pub(crate) fn region_bytes(scratch: usize, blocks: usize, stages: usize) -> usize {
    (scratch / blocks / stages) / 16 * 16
}

/// Blocks of a launch: one per chunk up to what the census allows (identical on every rank).
pub(crate) fn gpu_blocks(
    res: &Resources,
    gpu: &GpuCtx,
    stream: RawStream,
    st: &NvlsState,
    stages: usize,
    bytes: usize,
) -> Result<u32> {
    let census = mesh::census(res, gpu, stream)?;
    let limit = 16usize;
    let want = bytes
        .div_ceil(region_bytes(st.bytes, limit, stages))
        .clamp(1, limit);
    Ok(mesh::grid(&census, want, limit))
}

/// The GPU launch both pipelines share: `family`'s kernel over one scratch region of `stages`
/// stages per block (`extra = [handle table, region bytes]`); the copying fallback when
/// multimem does not reduce the call or the scratch cannot be built now (stream capture).
pub(crate) fn launch_pipeline(
    nvls: &NvlsShared,
    res: &Resources,
    gpu: &GpuCtx,
    call: &Call,
    stream: RawStream,
    stages: usize,
    family: &Family,
) -> Result<()> {
    let st = if multimem_reduces(call) {
        nvls.state(res, Some((gpu, stream)))?
    } else {
        None
    };
    let Some(st) = st else {
        return fallback()?.launch_gpu(res, gpu, call, stream);
    };
    let blocks = gpu_blocks(res, gpu, stream, &st, stages, call.bytes())?;
    let mut args = CollArgs::new(res, call);
    args.extra[0] = st.table.ptr();
    args.extra[1] = region_bytes(st.bytes, blocks as usize, stages) as u64;
    let k = family.instance(call.dtype, call.op)?;
    count_launch();
    // SAFETY: CollArgs mirrors the kernel's parameter; the scratch and its handle table live
    // in `res.ext`; the caller keeps the buffers alive.
    unsafe { gpu.launch(k, blocks, THREADS, &args, stream) }
}

/// The host run both pipelines share: `host` over the NVLS scratch state; the copying
/// fallback when multimem does not reduce the call.
pub(crate) fn run_pipeline(
    nvls: &NvlsShared,
    res: &Resources,
    call: &Call,
    host: impl FnOnce(&NvlsState) -> Result<()>,
) -> Result<()> {
    let st = if multimem_reduces(call) {
        nvls.state(res, None)?
    } else {
        None
    };
    let Some(st) = st else {
        return fallback()?.run_host(res, call);
    };
    count_launch();
    host(&st)
}

/// The [`Algorithm`](super::super::Algorithm) of an NVLS pipeline (this one, 1 stage per
/// block region, and `nvls_block_pipeline`, 2): the NVLS check, [`launch_pipeline`] of kernel
/// `$family` and [`run_pipeline`] of the host function `$host`.
macro_rules! nvls_pipeline {
    ($ty:ty: $name:literal, $stages:literal, $family:ident, $host:ident) => {
        $crate::collectives::algorithm::native_algorithm! {
            $ty: $name, AllReduce;
            check(self, res, call) {
                $crate::collectives::nvls::check_with_fallback(self.name(), res, call)
            }

            launch_gpu(self, res, gpu, call, stream) {
                let family = &$crate::kernels::collectives::allreduce::$family;
                $crate::collectives::allreduce::nvls_warp_pipeline::launch_pipeline(
                    &self.nvls, res, gpu, call, stream, $stages, family,
                )
            }

            run_host(self, res, call) {
                $crate::collectives::allreduce::nvls_warp_pipeline::run_pipeline(
                    &self.nvls,
                    res,
                    call,
                    |st| $crate::collectives::nvls::with_vec16!(call.dtype, V => $host::<V>(res, call, st)),
                )
            }
        }
    };
}
pub(crate) use nvls_pipeline;

nvls_pipeline!(NvlsWarpPipeline: "nvls_warp_pipeline", 1, NVLS_WARP_PIPELINE, host);

/// Copies chunk bytes `[o, o + l)` of `src` into `dst` and zeroes `dst[l..pad)`.
///
/// # Safety
/// `src + o` readable for `l` bytes, `dst` writable for `pad >= l` bytes; no overlap.
pub(crate) unsafe fn copy_in(dst: u64, src: u64, l: usize, pad: usize) {
    // SAFETY: forwarded from the caller.
    unsafe {
        host_copy(dst, src, l);
        std::ptr::write_bytes((dst as usize + l) as *mut u8, 0, pad - l);
    }
}

fn host<V: MultimemVector>(res: &Resources, call: &Call, st: &NvlsState) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    let region = region_bytes(st.bytes, nb, 1);
    if region == 0 {
        return Err(Error::invalid(format!(
            "allreduce nvls_warp_pipeline: {} scratch bytes for {nb} blocks",
            st.bytes
        )));
    }
    let total = call.bytes();
    let chunks = total.div_ceil(region);
    let h = st.channel.device_handle();
    let local = st.channel.device_ptr();
    for b in 0..nb {
        let base = (b * region) as u64;
        for j in (b..chunks).step_by(nb) {
            let o = j * region;
            let l = region.min(total - o);
            let nv = l.div_ceil(16) as u64;
            // SAFETY: the region lies in this rank's scratch; the input holds `total` bytes.
            unsafe { copy_in(local + base, call.send + o as u64, l, nv as usize * 16) };
            host_barrier(res, b)?;
            let (v0, v1) = split(nv, n as u64, me as u64);
            // SAFETY: the scratch channel is live (kept by `res.ext`) and bound on every rank.
            unsafe { h.all_reduce::<V>(base / 16 + v0, v1 - v0, 0, 1) }?;
            host_barrier(res, b)?;
            // SAFETY: the output holds `total` bytes; the region holds the chunk's sums.
            unsafe { host_copy(call.recv + o as u64, local + base, l) };
        }
    }
    Ok(())
}
