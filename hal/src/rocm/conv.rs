//! Pure mappings for HIP: status and flag numbers of the HIP headers, IPC handle bytes.
//! <https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/modules.html>

use crate::{Error, IpcDescriptor, Result};
use hip_sys::hiprt::hipIpcMemHandle_t;
use std::ffi::c_int;

/// `hipSuccess`.
pub(super) const HIP_SUCCESS: c_int = 0;
/// `hipErrorNotReady`.
pub(super) const HIP_ERROR_NOT_READY: c_int = 600;
/// `hipErrorNotFound` (e.g. a module global that does not exist).
pub(super) const HIP_ERROR_NOT_FOUND: c_int = 500;
/// `hipErrorPeerAccessAlreadyEnabled`.
pub(super) const HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED: c_int = 704;
/// `hipMemcpyDefault` (direction inferred from unified addresses).
pub(super) const HIP_MEMCPY_DEFAULT: c_int = 4;
/// `hipHostMallocPortable`.
pub(super) const HIP_HOST_MALLOC_PORTABLE: u32 = 0x1;
/// `hipHostMallocMapped`.
pub(super) const HIP_HOST_MALLOC_MAPPED: u32 = 0x2;
/// `hipDeviceMallocUncached` (fine-grained, uncached device memory).
pub(super) const HIP_DEVICE_MALLOC_UNCACHED: u32 = 0x3;
/// `hipHostRegisterPortable`.
pub(super) const HIP_HOST_REGISTER_PORTABLE: u32 = 0x1;
/// `hipHostRegisterMapped`.
pub(super) const HIP_HOST_REGISTER_MAPPED: u32 = 0x2;
/// `hipIpcMemLazyEnablePeerAccess`.
pub(super) const HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 1;
/// `hipStreamNonBlocking`.
pub(super) const HIP_STREAM_NON_BLOCKING: u32 = 1;

/// The 64 bytes of an IPC handle.
pub(super) fn ipc_handle_bytes(h: &hipIpcMemHandle_t) -> Vec<u8> {
    h.reserved.iter().map(|c| *c as u8).collect()
}

/// The 64 handle bytes of a Legacy descriptor.
pub(super) fn ipc_key(desc: &IpcDescriptor) -> Result<[u8; 64]> {
    desc.handle.as_slice().try_into().map_err(|_| {
        Error::BadDescriptor(format!(
            "Legacy: expected a 64-byte handle, got {}",
            desc.handle.len()
        ))
    })
}

/// An IPC handle from its 64 bytes.
pub(super) fn ipc_handle_from(key: &[u8; 64]) -> hipIpcMemHandle_t {
    // SAFETY: plain C struct of 64 bytes; all-zero is a valid value.
    let mut handle: hipIpcMemHandle_t = unsafe { std::mem::zeroed() };
    for (d, s) in handle.reserved.iter_mut().zip(key) {
        *d = *s as _;
    }
    handle
}
