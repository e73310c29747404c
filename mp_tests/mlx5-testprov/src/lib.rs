//! An mlx5 Direct Verbs **stand-in** for tests: a shared library exporting the mlx5dv entry
//! points mscclpp-rs uses for Data Direct dma-buf registration, over the verbs test provider.
//!
//! Loaded only through `MSCCLPP_MLX5_SO=/path/to/libmscclpp_mlx5_testprov.so` next to
//! `MSCCLPP_IBV_SO` naming the verbs test provider; nothing links to it.
//!
//! * `mlx5dv_is_supported`: true for every device.
//! * `mlx5dv_get_data_direct_sysfs_path`: writes a made-up sysfs path of the device's Data
//!   Direct function; `ENODEV` when `MLX5_TESTPROV_NO_DATA_DIRECT=1` (a device without one),
//!   `ENOSPC` when the buffer is too small.
//! * `mlx5dv_reg_dmabuf_mr`: requires `MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT` in `mlx5_access`
//!   (`EINVAL` otherwise, so a caller that forgets the flag fails), then registers through the
//!   test provider's `ibv_reg_dmabuf_mr` (the same library instance the caller loaded: `dlopen`
//!   of an already loaded path returns it), so the region is an ordinary provider MR that
//!   `ibv_dereg_mr` releases. `mlx5_testprov_registrations()` counts successful ones.

#![allow(clippy::missing_safety_doc)] // every exported function documents its contract below

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

const ENODEV: i32 = 19;
const EINVAL: i32 = 22;
const ENOSPC: i32 = 28;
const ENOSYS: i32 = 38;
const DATA_DIRECT: c_int = 1;

type RegDmabufMr = unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut c_void;

static REGISTRATIONS: AtomicU64 = AtomicU64::new(0);

fn set_errno(e: i32) {
    errno::set_errno(errno::Errno(e));
}

/// The verbs provider's `ibv_reg_dmabuf_mr`, from the library `MSCCLPP_IBV_SO` names.
fn provider_reg_dmabuf_mr() -> Option<RegDmabufMr> {
    static F: OnceLock<Option<(libloading::Library, RegDmabufMr)>> = OnceLock::new();
    F.get_or_init(|| {
        let path = std::env::var_os("MSCCLPP_IBV_SO")?;
        // SAFETY: the verbs test provider, already loaded by the caller (same instance).
        let lib = unsafe { libloading::Library::new(path) }.ok()?;
        // SAFETY: the provider's ibv_reg_dmabuf_mr has this prototype (verbs.h).
        let f = unsafe { lib.get::<RegDmabufMr>(b"ibv_reg_dmabuf_mr\0") }
            .ok()
            .map(|s| *s)?;
        Some((lib, f))
    })
    .as_ref()
    .map(|(_, f)| *f)
}

/// `mlx5dv_is_supported`: every device of the test provider "is" an mlx5 device.
///
/// # Safety
/// Any pointer; it is not read.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_is_supported(_device: *mut c_void) -> bool {
    true
}

/// `mlx5dv_get_data_direct_sysfs_path`.
///
/// # Safety
/// `buf` holds `buf_len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_get_data_direct_sysfs_path(
    ctx: *mut c_void,
    buf: *mut c_char,
    buf_len: usize,
) -> c_int {
    if ctx.is_null() || buf.is_null() {
        return EINVAL;
    }
    if matches!(
        std::env::var("MLX5_TESTPROV_NO_DATA_DIRECT").as_deref(),
        Ok("1") | Ok("true") | Ok("yes")
    ) {
        return ENODEV;
    }
    let path = b"/sys/devices/pci0000:00/0000:00:00.0 (mlx5 test stand-in)\0";
    if path.len() > buf_len {
        return ENOSPC;
    }
    // SAFETY: the caller's buffer holds buf_len >= path.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(path.as_ptr().cast::<c_char>(), buf, path.len()) };
    0
}

/// `mlx5dv_reg_dmabuf_mr` (see the crate docs).
///
/// # Safety
/// As the provider's `ibv_reg_dmabuf_mr`: `pd` is a live PD of the verbs test provider and the
/// fd's pages outlive the region.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_reg_dmabuf_mr(
    pd: *mut c_void,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
    mlx5_access: c_int,
) -> *mut c_void {
    if mlx5_access & DATA_DIRECT == 0 {
        set_errno(EINVAL);
        return std::ptr::null_mut();
    }
    let Some(f) = provider_reg_dmabuf_mr() else {
        set_errno(ENOSYS);
        return std::ptr::null_mut();
    };
    // SAFETY: forwarded caller contract.
    let mr = unsafe { f(pd, offset, length, iova, fd, access) };
    if !mr.is_null() {
        REGISTRATIONS.fetch_add(1, Ordering::SeqCst);
    }
    mr
}

/// How many regions this stand-in registered (for tests).
#[no_mangle]
pub extern "C" fn mlx5_testprov_registrations() -> u64 {
    REGISTRATIONS.load(Ordering::SeqCst)
}
