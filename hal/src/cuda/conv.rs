//! Pure mappings between our types and the driver's: status codes to [`Error`], the C
//! structs the cuMem calls take, IPC handle bytes.

use crate::{Error, IpcDescriptor, Result};
use cudarc::driver::sys;

/// An [`Error::Driver`] naming `op` for a failed `CUresult`.
pub(super) fn driver_error(op: &'static str, r: sys::CUresult) -> Error {
    Error::Driver {
        op,
        code: r as i64,
        name: format!("{r:?}"),
    }
}

/// The location of device `ordinal`.
pub(super) fn device_location(ordinal: i32) -> sys::CUmemLocation {
    // SAFETY: CUmemLocation is a plain C struct; all-zero is a valid starting value.
    let mut loc: sys::CUmemLocation = unsafe { std::mem::zeroed() };
    loc.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = ordinal;
    loc
}

/// Pinned device memory on `ordinal` exportable as `handle_types` (a bit set of
/// `CUmemAllocationHandleType`), GPUDirect RDMA capable when `rdma`.
pub(super) fn alloc_prop(ordinal: i32, handle_types: u32, rdma: bool) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct; zero is the documented default for every field.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = device_location(ordinal);
    prop.requestedHandleTypes = sys::CUmemAllocationHandleType(handle_types);
    prop.allocFlags.gpuDirectRDMACapable = u8::from(rdma);
    prop
}

/// Read/write access for device `ordinal`.
pub(super) fn rw_access(ordinal: i32) -> sys::CUmemAccessDesc {
    // SAFETY: plain C struct; all-zero is a valid starting value.
    let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    d.location = device_location(ordinal);
    d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d
}

/// The 64 bytes of a legacy IPC handle.
pub(super) fn ipc_handle_bytes(h: &sys::CUipcMemHandle) -> Vec<u8> {
    h.reserved.iter().map(|c| *c as u8).collect()
}

/// A legacy IPC handle from the 64 descriptor bytes.
pub(super) fn ipc_handle_from(desc: &IpcDescriptor) -> Result<sys::CUipcMemHandle> {
    if desc.handle.len() != 64 {
        return Err(Error::BadDescriptor(format!(
            "Legacy: expected a 64-byte handle, got {}",
            desc.handle.len()
        )));
    }
    // SAFETY: plain C struct.
    let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    for (d, s) in h.reserved.iter_mut().zip(&desc.handle) {
        *d = *s as std::ffi::c_char;
    }
    Ok(h)
}

/// A multicast object of `size` bytes over `ndevices` devices, exportable as `handle_types`.
pub(super) fn multicast_prop(
    size: usize,
    ndevices: usize,
    handle_types: u32,
) -> sys::CUmulticastObjectProp {
    // SAFETY: a plain C struct; zero is the documented default for every field.
    let mut prop: sys::CUmulticastObjectProp = unsafe { std::mem::zeroed() };
    prop.size = size;
    prop.numDevices = ndevices as std::ffi::c_uint;
    prop.handleTypes = u64::from(handle_types);
    prop
}
