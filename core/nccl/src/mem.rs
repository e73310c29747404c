//! `ncclMemAlloc`/`ncclMemFree` and buffer/window registration.
//!
//! Allocations are communication memory of the build's backend (the HAL's device memory on
//! GPUs, memfd host memory on the host backend), kept in a table by address until freed.
//! Registration hands out an opaque handle naming the range; the native paths find buffers by
//! address themselves, so registration only validates the range and tracks the handle.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use mscclpp::LocalMemory;

use crate::abi::{self, NcclResult};
use crate::error::{NResult, NcclError};

fn table() -> &'static Mutex<HashMap<u64, LocalMemory>> {
    static T: OnceLock<Mutex<HashMap<u64, LocalMemory>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

/// `ncclMemAlloc`.
///
/// # Safety
/// `out` must be valid for a write.
pub unsafe fn alloc(out: *mut *mut c_void, size: usize) -> NResult<NcclResult> {
    if out.is_null() {
        return Err(NcclError::arg("ptr (the output pointer) is NULL"));
    }
    if size == 0 {
        return Err(NcclError::arg("size 0: expected a size above 0"));
    }
    let device = crate::backend::device(crate::backend::current_device()?);
    let mem = LocalMemory::alloc(device, size)
        .map_err(|e| NcclError::from(e).context(format!("allocating {size} bytes")))?;
    let ptr = mem.ptr();
    table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(ptr, mem);
    // SAFETY: checked non-NULL; the caller's contract.
    unsafe { *out = ptr as usize as *mut c_void };
    Ok(abi::SUCCESS)
}

/// `ncclMemFree`.
pub fn free(ptr: *mut c_void) -> NResult<NcclResult> {
    if ptr.is_null() {
        return Ok(abi::SUCCESS);
    }
    let removed = table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(ptr as u64));
    match removed {
        Some(_) => Ok(abi::SUCCESS),
        None => Err(NcclError::arg(format!(
            "ptr {ptr:p}: expected a pointer returned by ncclMemAlloc and not freed yet"
        ))),
    }
}

/// What a registration handle names.
pub struct Registration {
    /// Marks a live registration.
    magic: u64,
    /// The communicator it belongs to.
    pub comm: usize,
    /// Start of the range.
    pub ptr: u64,
    /// Bytes.
    pub size: usize,
}

const REG_MAGIC: u64 = u64::from_le_bytes(*b"NCCLREG1");

fn regs() -> &'static Mutex<HashMap<usize, Box<Registration>>> {
    static T: OnceLock<Mutex<HashMap<usize, Box<Registration>>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Registers `[ptr, ptr + size)` for `comm`; returns the handle.
pub fn register(comm: usize, ptr: *mut c_void, size: usize) -> NResult<*mut c_void> {
    if ptr.is_null() || size == 0 {
        return Err(NcclError::arg(format!(
            "buff {ptr:p} size {size}: expected a non-NULL buffer of at least 1 byte"
        )));
    }
    let r = Box::new(Registration {
        magic: REG_MAGIC,
        comm,
        ptr: ptr as u64,
        size,
    });
    let h = &*r as *const Registration as usize;
    regs()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(h, r);
    Ok(h as *mut c_void)
}

/// Releases a handle from [`register`] made for `comm`.
pub fn deregister(comm: usize, handle: *mut c_void) -> NResult<NcclResult> {
    let mut g = regs().lock().unwrap_or_else(|p| p.into_inner());
    match g.get(&(handle as usize)) {
        Some(r) if r.magic == REG_MAGIC && r.comm == comm => {
            g.remove(&(handle as usize));
            Ok(abi::SUCCESS)
        }
        Some(r) => Err(NcclError::arg(format!(
            "handle {handle:p} (buffer {:#x}, {} bytes) was registered with another communicator",
            r.ptr, r.size
        ))),
        None => Err(NcclError::arg(format!(
            "handle {handle:p}: expected a handle from ncclCommRegister / \
             ncclCommWindowRegister not deregistered yet"
        ))),
    }
}
