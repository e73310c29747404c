//! `ncclMemAlloc`/`ncclMemFree` and buffer/window registration.
//!
//! Allocations are communication memory of the build's backend (the HAL's device memory on
//! GPUs, memfd host memory on the host backend), kept in a table by address until freed.
//!
//! Registration (`ncclCommRegister`, `ncclCommWindowRegister`) hands out an opaque handle and
//! enters the range in the communicator's index of registered ranges. A collective whose
//! buffers lie inside registered ranges asks the collectives for the zero-copy path
//! ([`mscclpp::collectives::Collectives::choose_registered`]): at the first use of a buffer
//! every rank exports the allocation behind it (memory of `ncclMemAlloc`, `cudaMalloc`,
//! cuMem/VMM with a shareable handle type such as PyTorch's expandable segments) and maps the
//! peers' (one bootstrap exchange, agreed: a buffer some rank cannot export makes every rank
//! copy); later calls, CUDA graph capture included, reuse the mappings. Registration itself
//! touches no driver and no peer, so it cannot fail for memory that turns out unexportable.
//!
//! As with NCCL's symmetric windows and upstream MSCCL++, ranks register, use and deregister
//! their corresponding buffers alike (PyTorch's allocator hook and nccl-tests `-R` do): whether
//! a call takes the zero-copy path is decided on each rank from its own registrations.

use std::collections::{BTreeMap, HashMap};
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

/// Registered ranges by communicator: start -> ends (a range may be registered twice).
type RangeIndex = HashMap<usize, BTreeMap<u64, Vec<u64>>>;

/// Whether any range was ever registered (in any communicator): until then
/// [`is_registered`] answers without the lock (an eager call's host time, issue 28).
static ANY_RANGE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn ranges() -> &'static Mutex<RangeIndex> {
    static T: OnceLock<Mutex<RangeIndex>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether `[ptr, ptr + bytes)` lies inside one range registered with `comm`.
pub fn is_registered(comm: usize, ptr: u64, bytes: usize) -> bool {
    let Some(end) = ptr.checked_add(bytes as u64) else {
        return false;
    };
    if !ANY_RANGE.load(std::sync::atomic::Ordering::Acquire) {
        return false;
    }
    let g = ranges().lock().unwrap_or_else(|p| p.into_inner());
    let Some(index) = g.get(&comm) else {
        return false;
    };
    index
        .range(..=ptr)
        .rev()
        .any(|(_, ends)| ends.iter().any(|e| *e >= end))
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
    let end = (ptr as u64).checked_add(size as u64).ok_or_else(|| {
        NcclError::arg(format!(
            "buff {ptr:p} size {size}: expected a range inside the address space"
        ))
    })?;
    let h = &*r as *const Registration as usize;
    regs()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(h, r);
    ranges()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(comm)
        .or_default()
        .entry(ptr as u64)
        .or_default()
        .push(end);
    ANY_RANGE.store(true, std::sync::atomic::Ordering::Release);
    Ok(h as *mut c_void)
}

/// Takes `[ptr, ptr + size)` out of `comm`'s index (one registration of it).
fn unindex(comm: usize, ptr: u64, size: usize) {
    let mut g = ranges().lock().unwrap_or_else(|p| p.into_inner());
    let Some(index) = g.get_mut(&comm) else {
        return;
    };
    let end = ptr + size as u64;
    if let Some(ends) = index.get_mut(&ptr) {
        if let Some(i) = ends.iter().position(|e| *e == end) {
            ends.swap_remove(i);
        }
        if ends.is_empty() {
            index.remove(&ptr);
        }
    }
    if index.is_empty() {
        g.remove(&comm);
    }
}

/// Forgets every registration of `comm` (it is destroyed).
pub fn forget_comm(comm: usize) {
    ranges()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&comm);
    regs()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|_, r| r.comm != comm);
}

/// Releases a handle from [`register`] made for `comm`; returns the range it named.
pub fn deregister(comm: usize, handle: *mut c_void) -> NResult<(u64, usize)> {
    let mut g = regs().lock().unwrap_or_else(|p| p.into_inner());
    match g.get(&(handle as usize)) {
        Some(r) if r.magic == REG_MAGIC && r.comm == comm => {
            let range = (r.ptr, r.size);
            g.remove(&(handle as usize));
            drop(g);
            unindex(comm, range.0, range.1);
            Ok(range)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_ranges_are_found_until_deregistered() {
        let comm = 0x5eed_0001;
        let h = register(comm, 0x10000 as *mut c_void, 4096).unwrap();
        assert!(is_registered(comm, 0x10000, 4096));
        assert!(is_registered(comm, 0x10100, 16));
        assert!(!is_registered(comm, 0x10100, 4096), "runs past the range");
        assert!(!is_registered(comm, 0xff00, 16), "starts before it");
        assert!(
            !is_registered(comm + 1, 0x10000, 16),
            "another communicator"
        );
        // The same range twice: one deregistration leaves the other.
        let h2 = register(comm, 0x10000 as *mut c_void, 4096).unwrap();
        assert_eq!(deregister(comm, h).unwrap(), (0x10000, 4096));
        assert!(is_registered(comm, 0x10000, 4096));
        assert!(
            deregister(comm + 1, h2).is_err(),
            "another communicator's handle"
        );
        deregister(comm, h2).unwrap();
        assert!(!is_registered(comm, 0x10000, 1));
        assert!(deregister(comm, h2).is_err(), "deregistered twice");
    }
}
