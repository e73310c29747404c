//! World size 1: every collective is a copy (out of place) or nothing (in place). On a GPU,
//! copies up to [`DRIVER_COPY_ENV`] bytes (default 256 MiB) go through the driver's
//! asynchronous copy (`cuMemcpyAsync`, a memcpy node under graph capture) and larger ones through
//! a vectorised kernel (kernels/cuda/src/collectives/copy.cu). Measured on one H200 under
//! nccl-tests (docs/perf.md, 2026-12-01): the driver's copy took 1.05 / 1.29 / 2.44 / 127.75 us
//! at 1 KiB / 16 KiB / 1 MiB / 256 MiB where the kernel took 1.13 / 1.66 / 2.63 / 139.52, but
//! 790 us at 1 GiB where the kernel took 544.

use super::algorithm::{Algorithm, Call};
use super::gpu::GpuCtx;
use super::setup::Resources;
use super::types::{CollectiveKind, RawStream};
use crate::error::{Error, Result};
use crate::kernels;
use mscclpp_hal::prelude::*;
use mscclpp_hal::{Gpu, StreamInterop};
use std::sync::OnceLock;

/// Copies of at most this many bytes use the driver's copy, larger ones the kernel
/// (`0`: always the kernel). Bytes, with an optional K/M/G suffix (powers of 1024).
pub const DRIVER_COPY_ENV: &str = "MSCCLPP_COPY_DRIVER_MAX_BYTES";
const DRIVER_COPY_DEFAULT: usize = 256 << 20;

/// Parses a [`DRIVER_COPY_ENV`] value (`None`: unset).
pub(crate) fn parse_driver_copy_max(v: Option<&str>) -> Result<usize> {
    let Some(v) = v.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(DRIVER_COPY_DEFAULT);
    };
    let (digits, shift) = match v.as_bytes()[v.len() - 1].to_ascii_uppercase() {
        b'K' => (&v[..v.len() - 1], 10),
        b'M' => (&v[..v.len() - 1], 20),
        b'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1usize << shift))
        .ok_or_else(|| {
            Error::invalid(format!(
                "{DRIVER_COPY_ENV}={v}: expected a byte count such as 0, 65536, 64K, 256M or 1G"
            ))
        })
}

/// This process's [`DRIVER_COPY_ENV`], read once.
pub(crate) fn driver_copy_max() -> Result<usize> {
    static V: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    V.get_or_init(|| {
        // Kept as the bare message: `Error::invalid` below adds the "invalid usage" prefix.
        parse_driver_copy_max(std::env::var(DRIVER_COPY_ENV).ok().as_deref()).map_err(|e| match e {
            Error::InvalidUsage(m) => m,
            other => other.to_string(),
        })
    })
    .clone()
    .map_err(Error::invalid)
}

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
            kernels::collectives::copy::COLL_COPY,
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
        // The copy threshold's env value is validated once by `Collectives::with_config`
        // (and `launch_gpu` reports it should it ever be read without).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_copy_threshold_parses_sizes_and_refuses_junk() {
        assert_eq!(parse_driver_copy_max(None).unwrap(), 256 << 20);
        assert_eq!(parse_driver_copy_max(Some("")).unwrap(), 256 << 20);
        assert_eq!(parse_driver_copy_max(Some("0")).unwrap(), 0);
        assert_eq!(parse_driver_copy_max(Some("65536")).unwrap(), 65536);
        assert_eq!(parse_driver_copy_max(Some("64K")).unwrap(), 64 << 10);
        assert_eq!(parse_driver_copy_max(Some("256m")).unwrap(), 256 << 20);
        assert_eq!(parse_driver_copy_max(Some("1G")).unwrap(), 1 << 30);
        for bad in ["x", "-1", "1.5G", "K", "99999999999999999999G", "1T"] {
            let e = parse_driver_copy_max(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains(DRIVER_COPY_ENV) && e.contains("expected"),
                "{bad}: {e}"
            );
        }
    }
}
