//! Linear allocations, pinned host memory, synchronous and stream-ordered copies and sets.
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>

use super::*;

/// `cuMemAlloc` in the current context.
pub(in crate::cuda) fn alloc(size: usize) -> Result<sys::CUdeviceptr> {
    // SAFETY: valid out pointer.
    checked_out("cuMemAlloc", 0, |p| unsafe { sys::cuMemAlloc_v2(p, size) })
}

/// `cuMemFree`.
///
/// # Safety
/// `ptr` came from [`alloc`], is freed once, and no work uses it any more.
pub(in crate::cuda) unsafe fn free(ptr: sys::CUdeviceptr) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMemFree", || unsafe { sys::cuMemFree_v2(ptr) })
}

/// `cuMemHostAlloc(size, flags)` in the current context.
pub(in crate::cuda) fn host_alloc(size: usize, flags: u32) -> Result<*mut c_void> {
    // SAFETY: valid out pointer.
    checked_out("cuMemHostAlloc", std::ptr::null_mut(), |h| unsafe {
        sys::cuMemHostAlloc(h, size, flags)
    })
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `p` came from [`host_alloc`], is freed once, and nothing uses it any more.
pub(in crate::cuda) unsafe fn free_host(p: *mut c_void) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMemFreeHost", || unsafe { sys::cuMemFreeHost(p) })
}

/// `cuMemHostGetDevicePointer(p, 0)`.
///
/// # Safety
/// `p` is live host memory allocated or registered with DEVICEMAP.
pub(in crate::cuda) unsafe fn host_device_pointer(p: *mut c_void) -> Result<sys::CUdeviceptr> {
    // SAFETY: valid out pointer; the caller vouches for `p`; flags must be 0.
    checked_out("cuMemHostGetDevicePointer", 0, |d| unsafe {
        sys::cuMemHostGetDevicePointer_v2(d, p, 0)
    })
}

/// `cuMemHostRegister(p, len, flags)`.
///
/// # Safety
/// `p..p+len` is one live host allocation that outlives the registration.
pub(in crate::cuda) unsafe fn host_register(p: *mut c_void, len: usize, flags: u32) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMemHostRegister", || unsafe {
        sys::cuMemHostRegister_v2(p, len, flags)
    })
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// `p` was registered by [`host_register`] and no device work uses it any more.
pub(in crate::cuda) unsafe fn host_unregister(p: *mut c_void) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMemHostUnregister", || unsafe {
        sys::cuMemHostUnregister(p)
    })
}

/// `cuMemcpyHtoDAsync` (from pageable memory: returns once the bytes are staged).
///
/// # Safety
/// `dst..dst+src.len()` stays live device memory until `stream` has done this work, and
/// `src` stays unchanged until then; `stream` is live.
pub(in crate::cuda) unsafe fn copy_htod_async(
    dst: sys::CUdeviceptr,
    src: &[u8],
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: forwarded from the caller; `src` is a live host slice.
    checked("cuMemcpyHtoDAsync", || unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream)
    })
}

/// `cuMemcpyDtoHAsync`.
///
/// # Safety
/// `src..src+dst.len()` stays live device memory and `dst` is not read until `stream` has
/// done this work; `stream` is live.
pub(in crate::cuda) unsafe fn copy_dtoh_async(
    dst: &mut [u8],
    src: sys::CUdeviceptr,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: forwarded from the caller; `dst` is a live host slice.
    checked("cuMemcpyDtoHAsync", || unsafe {
        sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), stream)
    })
}

/// `cuMemsetD8Async`.
///
/// # Safety
/// `dst..dst+len` stays live device memory until `stream` has done this work; `stream`
/// is live.
pub(in crate::cuda) unsafe fn set_d8_async(
    dst: sys::CUdeviceptr,
    value: u8,
    len: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMemsetD8Async", || unsafe {
        sys::cuMemsetD8Async(dst, value, len, stream)
    })
}

/// `cuMemcpyAsync` between unified addresses.
///
/// # Safety
/// Both ranges stay live until `stream` has done this work; `stream` is live.
pub(in crate::cuda) unsafe fn copy_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    len: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMemcpyAsync", || unsafe {
        sys::cuMemcpyAsync(dst, src, len, stream)
    })
}

/// `cuMemGetHandleForAddressRange(.., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)`: a dma-buf fd
/// for `ptr..ptr+size` (both host-page aligned).
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>
///
/// # Safety
/// `ptr..ptr+size` lies inside live device memory of the current context.
pub(in crate::cuda) unsafe fn dmabuf_fd(ptr: sys::CUdeviceptr, size: usize) -> Result<i32> {
    // SAFETY: the out pointer is a valid int (the driver writes an int fd); the caller vouches
    // for the range.
    checked_out(
        "cuMemGetHandleForAddressRange(DMA_BUF_FD)",
        -1,
        |fd| unsafe {
            sys::cuMemGetHandleForAddressRange(
                (fd as *mut i32).cast::<c_void>(),
                ptr,
                size,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        },
    )
}
