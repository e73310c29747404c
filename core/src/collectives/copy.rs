//! World size 1: every collective is a copy (out of place) or nothing (in place). On a GPU,
//! copies up to [`KERNEL_COPY_ENV`] bytes (default 4 MiB) go through a vectorised kernel
//! (kernels/cuda/src/collectives/copy.cu), copies up to [`DRIVER_COPY_ENV`] bytes (default
//! 256 MiB) through the driver's asynchronous copy (`cuMemcpyAsync`, a memcpy node under graph
//! capture), and larger ones through the kernel again. Measured on one H200:
//! * eager (nccl-tests `-c 0 -n 200`, rounds 7 and 8 of docs/perf.md, 2026-12-04): the host
//!   issues a kernel launch faster than the driver's copy, 4.0-5.1 us per call against 4.9-6.8
//!   from 1 KiB to 4 MiB (NCCL: 5.1-6.6); from 16 MiB the driver's copy is faster (10.9 against
//!   11.5 at 16 MiB, 128.9 against 141.1 at 256 MiB);
//! * in a CUDA graph (nccl-tests `-G`, 2026-12-01): the driver's copy took 1.05 / 1.29 / 2.44 /
//!   127.75 us at 1 KiB / 16 KiB / 1 MiB / 256 MiB where the kernel took 1.13 / 1.66 / 2.63 /
//!   139.52 (so a captured small copy costs up to 0.4 us more with the kernel), but 790 us at
//!   1 GiB where the kernel took 544.

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

/// Copies of at most this many bytes use the kernel before [`DRIVER_COPY_ENV`] is asked
/// (`0`: none). Bytes, with an optional K/M/G suffix (powers of 1024).
pub const KERNEL_COPY_ENV: &str = crate::env::COPY_KERNEL_MAX_BYTES;

/// This process's [`DRIVER_COPY_ENV`], read once ([`crate::env::Env::copy_driver_max_bytes`]).
pub(crate) fn driver_copy_max() -> Result<usize> {
    crate::env::env().copy_driver_max_bytes()
}

/// This process's [`KERNEL_COPY_ENV`], read once ([`crate::env::Env::copy_kernel_max_bytes`]).
pub(crate) fn kernel_copy_max() -> Result<usize> {
    crate::env::env().copy_kernel_max_bytes()
}

/// Whether a world-size-1 GPU copy of `bytes` goes through the driver's copy (else the
/// kernel): above [`KERNEL_COPY_ENV`] and at most [`DRIVER_COPY_ENV`].
pub(crate) fn uses_driver_copy(bytes: usize) -> Result<bool> {
    Ok(driver_copy_for(
        bytes,
        kernel_copy_max()?,
        driver_copy_max()?,
    ))
}

/// [`uses_driver_copy`] with the two thresholds given.
fn driver_copy_for(bytes: usize, kernel_max: usize, driver_max: usize) -> bool {
    bytes > kernel_max && bytes <= driver_max
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
        if uses_driver_copy(call.bytes())? {
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

#[cfg(test)]
mod tests {
    use super::driver_copy_for;

    #[test]
    fn small_copies_take_the_kernel_middle_ones_the_driver_huge_ones_the_kernel() {
        let (k, d) = (4 << 20, 256 << 20);
        assert!(!driver_copy_for(1024, k, d), "1 KiB: the kernel");
        assert!(!driver_copy_for(4 << 20, k, d), "4 MiB: the kernel");
        assert!(
            driver_copy_for((4 << 20) + 1, k, d),
            "just above: the driver"
        );
        assert!(driver_copy_for(256 << 20, k, d), "256 MiB: the driver");
        assert!(!driver_copy_for((256 << 20) + 1, k, d), "above: the kernel");
        assert!(driver_copy_for(1024, 0, d), "no kernel range: the driver");
        assert!(
            !driver_copy_for(16 << 20, k, 0),
            "no driver range: the kernel"
        );
    }
}
