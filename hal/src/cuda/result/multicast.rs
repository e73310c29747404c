//! Multicast objects (NVLS). Every wrapper takes an [`NvlsPermit`], which exists only while the
//! environment allows NVLS, so no code path reaches `cuMulticast*` under
//! `MSCCLPP_FORCE_DISABLE_NVLS=1` / `NCCL_NVLS_ENABLE=0`.
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MULTICAST.html>

use super::*;
use crate::NvlsPermit;

/// `cuMulticastGetGranularity(prop, MINIMUM or RECOMMENDED)`.
pub(in crate::cuda) fn granularity(
    _permit: NvlsPermit,
    prop: &sys::CUmulticastObjectProp,
    recommended: bool,
) -> Result<usize> {
    let option = if recommended {
        sys::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_RECOMMENDED
    } else {
        sys::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_MINIMUM
    };
    // SAFETY: valid out pointer and property struct.
    checked_out("cuMulticastGetGranularity", 0usize, |g| unsafe {
        sys::cuMulticastGetGranularity(g, prop, option)
    })
}

/// `cuMulticastCreate(prop)`: a new handle the caller releases with `vmm::release`.
pub(in crate::cuda) fn create(
    _permit: NvlsPermit,
    prop: &sys::CUmulticastObjectProp,
) -> Result<sys::CUmemGenericAllocationHandle> {
    // SAFETY: valid out pointer and property struct.
    checked_out("cuMulticastCreate", 0, |handle| unsafe {
        sys::cuMulticastCreate(handle, prop)
    })
}

/// `cuMulticastAddDevice(mc, dev)`.
///
/// # Safety
/// `mc` is a live multicast handle.
pub(in crate::cuda) unsafe fn add_device(
    _permit: NvlsPermit,
    mc: sys::CUmemGenericAllocationHandle,
    dev: sys::CUdevice,
) -> Result<()> {
    // SAFETY: forwarded from the caller; a bad device is an error status.
    checked("cuMulticastAddDevice", || unsafe {
        sys::cuMulticastAddDevice(mc, dev)
    })
}

/// `cuMulticastBindMem(mc, mc_offset, mem, mem_offset, size, 0)`; blocks until every device
/// of the object was added.
///
/// # Safety
/// `mc` and `mem` are live handles; `mem` stays allocated while bound.
pub(in crate::cuda) unsafe fn bind_mem(
    _permit: NvlsPermit,
    mc: sys::CUmemGenericAllocationHandle,
    mc_offset: usize,
    mem: sys::CUmemGenericAllocationHandle,
    mem_offset: usize,
    size: usize,
) -> Result<()> {
    // SAFETY: forwarded from the caller; bad offsets or sizes are an error status.
    checked("cuMulticastBindMem", || unsafe {
        sys::cuMulticastBindMem(mc, mc_offset, mem, mem_offset, size, 0)
    })
}

/// `cuMulticastUnbind(mc, dev, mc_offset, size)`.
///
/// # Safety
/// `mc` is live and `[mc_offset, mc_offset + size)` was bound for `dev` by [`bind_mem`]; no
/// work uses it any more.
pub(in crate::cuda) unsafe fn unbind(
    _permit: NvlsPermit,
    mc: sys::CUmemGenericAllocationHandle,
    dev: sys::CUdevice,
    mc_offset: usize,
    size: usize,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuMulticastUnbind", || unsafe {
        sys::cuMulticastUnbind(mc, dev, mc_offset, size)
    })
}
