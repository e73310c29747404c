//! World size 1: every collective is a copy (out of place) or nothing (in place). The GPU
//! copy is a vectorised kernel (kernels/cuda/src/collectives/copy.cu): on H200 it beats
//! cuMemcpy for device-to-device copies.

use super::algorithm::{Algorithm, Call};
use super::gpu::GpuCtx;
use super::setup::Resources;
use super::types::{CollectiveKind, RawStream};
use crate::error::{Error, Result};

/// The copy "algorithm" of one collective at world size 1.
pub struct Copy(pub CollectiveKind);

/// Arguments of `coll_copy`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CopyArgs {
    dst: u64,
    src: u64,
    bytes: u64,
}

/// Blocks and threads of a copy of `bytes` on a GPU with `sms` multiprocessors.
pub fn copy_grid(bytes: usize, sms: u32) -> (u32, u32) {
    let threads = 512u32;
    // 64 bytes (4 vectors) per thread per step; at most 4 blocks per SM.
    let want = bytes.div_ceil(threads as usize * 64).max(1);
    (want.min(sms.max(1) as usize * 4) as u32, threads)
}

/// Enqueues a device copy of `bytes` from `src` to `dst` with the vectorised kernel.
///
/// # Safety
/// Both ranges are live device memory until the stream has run the copy; they do not overlap.
pub(crate) unsafe fn gpu_copy(
    gpu: &GpuCtx,
    sms: u32,
    dst: u64,
    src: u64,
    bytes: usize,
    stream: RawStream,
) -> Result<()> {
    let (blocks, threads) = copy_grid(bytes, sms);
    let args = CopyArgs {
        dst,
        src,
        bytes: bytes as u64,
    };
    // SAFETY: CopyArgs mirrors coll_copy's parameters; forwarded from the caller.
    unsafe {
        gpu.launch(
            "collectives/copy",
            "coll_copy",
            blocks,
            threads,
            &args,
            stream,
        )
    }
}

impl Algorithm for Copy {
    fn name(&self) -> &'static str {
        "copy"
    }
    fn kind(&self) -> CollectiveKind {
        self.0
    }
    fn check(&self, res: &Resources, _call: &Call) -> Result<()> {
        if res.nranks != 1 {
            return Err(Error::invalid(format!(
                "{} copy: expected a world of 1 rank, got {}",
                self.0, res.nranks
            )));
        }
        Ok(())
    }
    fn launch_gpu(
        &self,
        res: &Resources,
        gpu: &GpuCtx,
        call: &Call,
        stream: RawStream,
    ) -> Result<()> {
        if call.send == call.recv {
            return Ok(());
        }
        // SAFETY: the caller of the collective keeps both buffers alive.
        unsafe {
            gpu_copy(
                gpu,
                res.sm_count,
                call.recv,
                call.send,
                call.bytes(),
                stream,
            )
        }
    }
    fn run_host(&self, _res: &Resources, call: &Call) -> Result<()> {
        if call.send != call.recv {
            // SAFETY: the caller passes live host buffers of `bytes` bytes (memmove semantics).
            unsafe {
                std::ptr::copy(
                    call.send as usize as *const u8,
                    call.recv as usize as *mut u8,
                    call.bytes(),
                )
            };
        }
        Ok(())
    }
}
