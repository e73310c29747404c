//! Legacy IPC handles of cuMemAlloc memory.
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>

use super::*;

/// `cuIpcGetMemHandle` of the allocation that starts at `ptr`.
pub(in crate::cuda) fn get_handle(ptr: sys::CUdeviceptr) -> Result<sys::CUipcMemHandle> {
    // SAFETY: a plain C struct; all-zero is a valid value.
    let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer; a pointer that is no allocation base is an error status.
    checked("cuIpcGetMemHandle", || unsafe {
        sys::cuIpcGetMemHandle(&mut h, ptr)
    })?;
    Ok(h)
}

/// `cuIpcOpenMemHandle(LAZY_ENABLE_PEER_ACCESS)`.
pub(in crate::cuda) fn open_handle(h: sys::CUipcMemHandle) -> Result<sys::CUdeviceptr> {
    let mut base: sys::CUdeviceptr = 0;
    // SAFETY: valid out pointer; handle bytes that name no exported memory are an error
    // status.
    checked("cuIpcOpenMemHandle", || unsafe {
        sys::cuIpcOpenMemHandle_v2(
            &mut base,
            h,
            sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
        )
    })?;
    Ok(base)
}

/// `cuIpcCloseMemHandle`.
///
/// # Safety
/// `base` came from [`open_handle`], is closed once, and no work uses it any more.
pub(in crate::cuda) unsafe fn close_handle(base: sys::CUdeviceptr) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuIpcCloseMemHandle", || unsafe {
        sys::cuIpcCloseMemHandle(base)
    })
}
