//! Legacy IPC handles of cuMemAlloc memory.
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>

use super::*;

/// `cuIpcGetMemHandle` of the allocation that starts at `ptr`.
pub(in crate::cuda) fn get_handle(ptr: sys::CUdeviceptr) -> Result<sys::CUipcMemHandle> {
    // SAFETY: a plain C struct; all-zero is a valid value.
    // SAFETY: valid out pointer; a pointer that is no allocation base is an error status.
    checked_out(
        "cuIpcGetMemHandle",
        unsafe { std::mem::zeroed() },
        |h| unsafe { sys::cuIpcGetMemHandle(h, ptr) },
    )
}

/// `cuIpcOpenMemHandle(LAZY_ENABLE_PEER_ACCESS)`.
pub(in crate::cuda) fn open_handle(h: sys::CUipcMemHandle) -> Result<sys::CUdeviceptr> {
    // SAFETY: valid out pointer; handle bytes that name no exported memory are an error
    // status.
    checked_out("cuIpcOpenMemHandle", 0, |base| unsafe {
        sys::cuIpcOpenMemHandle_v2(
            base,
            h,
            sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
        )
    })
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
