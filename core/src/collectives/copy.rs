//! World size 1: every collective is a copy (out of place) or nothing (in place). On a GPU,
//! copies up to [`DRIVER_COPY_ENV`] bytes (default 256 MiB) go through the driver's
//! asynchronous copy (`cuMemcpyAsync`, a memcpy node under graph capture) and larger ones through
//! a vectorised kernel (kernels/cuda/src/collectives/copy.cu). Measured on one H200 under
//! nccl-tests (docs/perf.md, 2026-12-01): the driver's copy took 1.05 / 1.29 / 2.44 / 127.75 us
//! at 1 KiB / 16 KiB / 1 MiB / 256 MiB where the kernel took 1.13 / 1.66 / 2.63 / 139.52, but
//! 790 us at 1 GiB where the kernel took 544.

use super::algorithm::native_algorithm;
use super::gpu::GpuCtx;
use super::types::{CollectiveKind, RawStream};
use crate::error::{Error, Result};
use crate::kernels;
use mscclpp_hal::prelude::*;
use mscclpp_hal::{Gpu, StreamInterop};

/// Copies of at most this many bytes use the driver's copy, larger ones the kernel
/// (`0`: always the kernel). Bytes, with an optional K/M/G suffix (powers of 1024).
pub const DRIVER_COPY_ENV: &str = crate::env::COPY_DRIVER_MAX_BYTES;

/// This process's [`DRIVER_COPY_ENV`], read once ([`crate::env::Env::copy_driver_max_bytes`]).
pub(crate) fn driver_copy_max() -> Result<usize> {
    crate::env::env().copy_driver_max_bytes()
}

/// The copy "algorithm" of one collective at world size 1.
pub struct Copy(pub CollectiveKind);

/// Arguments of `coll_copy` (kernels/cuda/src/collectives/copy.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CopyArgs {
    /// Destination device address.
    pub dst: u64,
    /// Source device address.
    pub src: u64,
    /// Bytes to copy.
    pub bytes: u64,
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
            kernels::collectives::copy::COLL_COPY,
            blocks,
            threads,
            &args,
            stream,
        )
    }
}

native_algorithm! {
    Copy: "copy", kind = self.0;
    check(self, res, _call) {
        if res.nranks() != 1 {
            return Err(Error::invalid(format!(
                "{} copy: expected a world of 1 rank, got {}",
                self.0,
                res.nranks()
            )));
        }
        // The copy threshold's env value is validated once by `Collectives::with_config`
        // (and `launch_gpu` reports it should it ever be read without).
        Ok(())
    }
    launch_gpu(self, res, gpu, call, stream) {
        if call.send == call.recv {
            return Ok(());
        }
        if call.bytes() <= driver_copy_max()? {
            // SAFETY: the caller's live stream of this device; the caller of the collective
            // keeps both (non-overlapping) buffers alive until the stream ran the copy.
            return unsafe {
                let s = <Gpu as StreamInterop>::borrow_stream(gpu.device(), stream);
                Gpu::memcpy_async(&s, call.recv, call.send, call.bytes())
            }
            .map_err(Error::from);
        }
        // SAFETY: the caller of the collective keeps both buffers alive.
        unsafe {
            gpu_copy(
                gpu,
                res.sm_count(),
                call.recv,
                call.send,
                call.bytes(),
                stream,
            )
        }
    }
    run_host(self, _res, call) {
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
