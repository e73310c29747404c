//! Virtual memory management (cuMem): physical allocations, reserved ranges, mappings,
//! shareable handles. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html>

use super::*;

/// `cuMemGetAllocationGranularity(prop, MINIMUM)`.
pub(in crate::cuda) fn min_granularity(prop: &sys::CUmemAllocationProp) -> Result<usize> {
    // SAFETY: valid out pointer and property struct.
    checked_out("cuMemGetAllocationGranularity", 0usize, |g| unsafe {
        sys::cuMemGetAllocationGranularity(
            g,
            prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })
}

/// `cuMemCreate(len, prop, 0)`.
pub(in crate::cuda) fn create(
    len: usize,
    prop: &sys::CUmemAllocationProp,
) -> Result<sys::CUmemGenericAllocationHandle> {
    // SAFETY: valid out pointer and property struct.
    checked_out("cuMemCreate", 0, |handle| unsafe {
        sys::cuMemCreate(handle, len, prop, 0)
    })
}

/// `cuMemRelease`.
///
/// # Safety
/// `handle` came from [`create`] or an import and is released once.
pub(in crate::cuda) unsafe fn release(handle: sys::CUmemGenericAllocationHandle) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMemRelease", || unsafe { sys::cuMemRelease(handle) })
}

/// `cuMemAddressReserve(len, align, 0, 0)`: a fresh range chosen by the driver.
pub(in crate::cuda) fn address_reserve(len: usize, align: usize) -> Result<sys::CUdeviceptr> {
    // SAFETY: valid out pointer; no fixed address requested.
    checked_out("cuMemAddressReserve", 0, |ptr| unsafe {
        sys::cuMemAddressReserve(ptr, len, align, 0, 0)
    })
}

/// `cuMemAddressFree`.
///
/// # Safety
/// `ptr..ptr+len` was reserved by [`address_reserve`], is unmapped, and is freed once.
pub(in crate::cuda) unsafe fn address_free(ptr: sys::CUdeviceptr, len: usize) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMemAddressFree", || unsafe {
        sys::cuMemAddressFree(ptr, len)
    })
}

/// `cuMemMap(ptr, len, 0, handle, 0)`.
///
/// # Safety
/// `ptr..ptr+len` is a reserved, unmapped range; `handle` is live and at least `len` bytes.
pub(in crate::cuda) unsafe fn map(
    ptr: sys::CUdeviceptr,
    len: usize,
    handle: sys::CUmemGenericAllocationHandle,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMemMap", || unsafe {
        sys::cuMemMap(ptr, len, 0, handle, 0)
    })
}

/// `cuMemUnmap`.
///
/// # Safety
/// `ptr..ptr+len` was mapped by [`map`] and no work uses it any more.
pub(in crate::cuda) unsafe fn unmap(ptr: sys::CUdeviceptr, len: usize) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMemUnmap", || unsafe { sys::cuMemUnmap(ptr, len) })
}

/// `cuMemSetAccess` for every descriptor in `descs`.
///
/// # Safety
/// `ptr..ptr+len` is mapped.
pub(in crate::cuda) unsafe fn set_access(
    ptr: sys::CUdeviceptr,
    len: usize,
    descs: &[sys::CUmemAccessDesc],
) -> Result<()> {
    // SAFETY: forwarded from the caller; `descs` is a live array of its length.
    checked("cuMemSetAccess", || unsafe {
        sys::cuMemSetAccess(ptr, len, descs.as_ptr(), descs.len())
    })
}

/// `cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)`: a new fd the caller owns.
pub(in crate::cuda) fn export_posix_fd(handle: sys::CUmemGenericAllocationHandle) -> Result<i32> {
    // SAFETY: for POSIX_FILE_DESCRIPTOR the out parameter is an int; a bad handle is an
    // error status.
    checked_out("cuMemExportToShareableHandle(POSIX_FD)", -1, |fd| unsafe {
        sys::cuMemExportToShareableHandle(
            (fd as *mut i32).cast(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    })
}

/// `cuMemExportToShareableHandle(FABRIC)`.
pub(in crate::cuda) fn export_fabric(
    handle: sys::CUmemGenericAllocationHandle,
) -> Result<sys::CUmemFabricHandle> {
    // SAFETY: a plain C struct; all-zero is a valid value.
    // SAFETY: for FABRIC the out parameter is a CUmemFabricHandle.
    checked_out(
        "cuMemExportToShareableHandle(FABRIC)",
        unsafe { std::mem::zeroed() },
        |fh| unsafe {
            sys::cuMemExportToShareableHandle(
                (fh as *mut sys::CUmemFabricHandle).cast(),
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
                0,
            )
        },
    )
}

/// `cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)`; the driver does not take
/// ownership of `fd`.
///
/// # Safety
/// `fd` is a live descriptor exported by [`export_posix_fd`] (here or in a peer).
pub(in crate::cuda) unsafe fn import_posix_fd(
    fd: i32,
) -> Result<sys::CUmemGenericAllocationHandle> {
    // SAFETY: the driver takes the fd value itself as the "pointer" argument.
    checked_out(
        "cuMemImportFromShareableHandle(POSIX_FD)",
        0,
        |handle| unsafe {
            sys::cuMemImportFromShareableHandle(
                handle,
                fd as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        },
    )
}

/// `cuMemImportFromShareableHandle(FABRIC)`.
pub(in crate::cuda) fn import_fabric(
    fh: &sys::CUmemFabricHandle,
) -> Result<sys::CUmemGenericAllocationHandle> {
    let mut copy = *fh;
    // SAFETY: for FABRIC the os handle is a pointer to a live fabric handle.
    checked_out(
        "cuMemImportFromShareableHandle(FABRIC)",
        0,
        |handle| unsafe {
            sys::cuMemImportFromShareableHandle(
                handle,
                (&mut copy as *mut sys::CUmemFabricHandle).cast(),
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
            )
        },
    )
}
