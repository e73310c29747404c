//! A GDRCopy (`libgdrapi.so`) **stand-in** for tests, over host memory: the host backend's
//! "GPU" memory is host memory, so pinning records the range and mapping returns its own
//! address. It lets the GDRCopy status and forwarding paths of mscclpp-rs run without a GPU.
//!
//! Loaded only through `MSCCLPP_GDRCOPY_SO=/path/to/libmscclpp_gdr_testprov.so`.
//!
//! * `gdr_open`: a handle; NULL when `GDR_TESTPROV_OPEN_FAIL=1` (as without the gdrdrv module).
//! * `gdr_pin_buffer` / `gdr_unpin_buffer`: record / forget `(addr, size)`; `gdr_map` returns
//!   the pinned address, `gdr_get_info` reports it (64 KiB pages); unknown handles are `EINVAL`.
//! * `gdr_runtime_get_version`: 2.4; `gdr_driver_get_version`: `GDR_TESTPROV_DRIVER_VERSION`
//!   (`major.minor`, default 2.4), so an old driver can be simulated.
//! * `gdr_testprov_maps()`: how many mappings were made (for tests).

#![allow(clippy::missing_safety_doc)] // every exported function documents its contract below

use std::collections::HashMap;
use std::ffi::{c_int, c_ulong, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const EINVAL: c_int = 22;

/// `gdr_mh_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GdrMh {
    h: c_ulong,
}

/// `gdr_info_t` (GDRCopy 2.x).
#[repr(C)]
pub struct GdrInfo {
    va: u64,
    mapped_size: u64,
    page_size: u32,
    tm_cycles: u64,
    cycles_per_ms: u32,
    mapped: u32,
    mapping_type: c_int,
}

/// One open handle: the pinned ranges by handle number.
struct Handle {
    pins: Mutex<HashMap<c_ulong, (u64, usize)>>,
    next: AtomicU64,
}

static MAPS: AtomicU64 = AtomicU64::new(0);

fn flag(name: &str) -> bool {
    matches!(
        std::env::var(name).as_deref(),
        Ok("1") | Ok("true") | Ok("yes")
    )
}

/// # Safety
/// `g` came from [`gdr_open`] and is not closed.
unsafe fn handle<'a>(g: *mut c_void) -> Option<&'a Handle> {
    // SAFETY: caller contract.
    unsafe { g.cast::<Handle>().as_ref() }
}

/// `gdr_open`.
#[no_mangle]
pub extern "C" fn gdr_open() -> *mut c_void {
    if flag("GDR_TESTPROV_OPEN_FAIL") {
        return std::ptr::null_mut();
    }
    Box::into_raw(Box::new(Handle {
        pins: Mutex::new(HashMap::new()),
        next: AtomicU64::new(1),
    }))
    .cast()
}

/// `gdr_close`.
///
/// # Safety
/// `g` came from [`gdr_open`] and is closed once.
#[no_mangle]
pub unsafe extern "C" fn gdr_close(g: *mut c_void) -> c_int {
    if g.is_null() {
        return EINVAL;
    }
    // SAFETY: allocated as Box<Handle> by gdr_open.
    drop(unsafe { Box::from_raw(g.cast::<Handle>()) });
    0
}

/// `gdr_pin_buffer`.
///
/// # Safety
/// `g` is open; `mh` is writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_pin_buffer(
    g: *mut c_void,
    addr: c_ulong,
    size: usize,
    _p2p_token: u64,
    _va_space: u32,
    mh: *mut GdrMh,
) -> c_int {
    // SAFETY: caller contract.
    let Some(h) = (unsafe { handle(g) }) else {
        return EINVAL;
    };
    if size == 0 || mh.is_null() || !addr.is_multiple_of(65536) {
        return EINVAL;
    }
    let id = h.next.fetch_add(1, Ordering::SeqCst) as c_ulong;
    h.pins
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, (addr, size));
    // SAFETY: caller contract.
    unsafe { mh.write(GdrMh { h: id }) };
    0
}

fn pinned(g: *mut c_void, mh: GdrMh) -> Option<(u64, usize)> {
    // SAFETY: callers pass handles from gdr_open (their contract).
    let h = unsafe { handle(g) }?;
    h.pins
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&mh.h)
        .copied()
}

/// `gdr_unpin_buffer`.
///
/// # Safety
/// `g` is open.
#[no_mangle]
pub unsafe extern "C" fn gdr_unpin_buffer(g: *mut c_void, mh: GdrMh) -> c_int {
    // SAFETY: caller contract.
    let Some(h) = (unsafe { handle(g) }) else {
        return EINVAL;
    };
    match h
        .pins
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&mh.h)
    {
        Some(_) => 0,
        None => EINVAL,
    }
}

/// `gdr_map`: the pinned address itself (host memory).
///
/// # Safety
/// `g` is open; `va` is writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_map(
    g: *mut c_void,
    mh: GdrMh,
    va: *mut *mut c_void,
    size: usize,
) -> c_int {
    let Some((addr, len)) = pinned(g, mh) else {
        return EINVAL;
    };
    if va.is_null() || size != len {
        return EINVAL;
    }
    MAPS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: caller contract.
    unsafe { va.write(addr as usize as *mut c_void) };
    0
}

/// `gdr_unmap`.
///
/// # Safety
/// `g` is open.
#[no_mangle]
pub unsafe extern "C" fn gdr_unmap(
    g: *mut c_void,
    mh: GdrMh,
    _va: *mut c_void,
    _size: usize,
) -> c_int {
    if pinned(g, mh).is_some() {
        0
    } else {
        EINVAL
    }
}

/// `gdr_get_info`.
///
/// # Safety
/// `g` is open; `info` is writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_get_info(g: *mut c_void, mh: GdrMh, info: *mut GdrInfo) -> c_int {
    let Some((addr, len)) = pinned(g, mh) else {
        return EINVAL;
    };
    if info.is_null() {
        return EINVAL;
    }
    // SAFETY: caller contract.
    unsafe {
        info.write(GdrInfo {
            va: addr,
            mapped_size: len as u64,
            page_size: 65536,
            tm_cycles: 0,
            cycles_per_ms: 0,
            mapped: 1,
            mapping_type: 1,
        })
    };
    0
}

/// `gdr_runtime_get_version`: 2.4.
///
/// # Safety
/// Both pointers are writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_runtime_get_version(major: *mut c_int, minor: *mut c_int) -> c_int {
    if major.is_null() || minor.is_null() {
        return EINVAL;
    }
    // SAFETY: caller contract.
    unsafe {
        major.write(2);
        minor.write(4);
    }
    0
}

/// `gdr_driver_get_version`: `GDR_TESTPROV_DRIVER_VERSION` or 2.4.
///
/// # Safety
/// `g` is open; both pointers are writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_driver_get_version(
    g: *mut c_void,
    major: *mut c_int,
    minor: *mut c_int,
) -> c_int {
    if g.is_null() || major.is_null() || minor.is_null() {
        return EINVAL;
    }
    let v = std::env::var("GDR_TESTPROV_DRIVER_VERSION").unwrap_or_else(|_| "2.4".into());
    let mut it = v.trim().split('.').map(|p| p.parse::<c_int>());
    let (Some(Ok(a)), Some(Ok(b))) = (it.next(), it.next()) else {
        return EINVAL;
    };
    // SAFETY: caller contract.
    unsafe {
        major.write(a);
        minor.write(b);
    }
    0
}

/// How many mappings `gdr_map` made in this process (for tests).
#[no_mangle]
pub extern "C" fn gdr_testprov_maps() -> u64 {
    MAPS.load(Ordering::SeqCst)
}
