//! Thin checked wrappers over `cudarc::driver::sys`, grouped by topic: each turns the
//! `CUresult` into a [`Result`] (an [`Error::Driver`] naming the call), fills its
//! out-parameters and returns them, and links the CUDA driver API page of the call it wraps.
//! The safe types of this backend call the driver only through these functions.
//!
//! Every call goes through [`call`], the one choke point, which counts it
//! ([`crate::auxil::driver_calls_on_this_thread`]). A wrapper is `unsafe` when a stale or
//! foreign handle or pointer it takes could make the driver touch freed memory; the caller
//! then promises what the `# Safety` section says.

use crate::auxil::count_driver_call;
use crate::Result;
use cudarc::driver::sys;
use std::ffi::{c_char, c_void};

/// Runs one driver call and counts it: the choke point every wrapper goes through.
fn call(f: impl FnOnce() -> sys::CUresult) -> sys::CUresult {
    count_driver_call();
    f()
}

/// Turns a `CUresult` into `Ok` or an [`Error::Driver`] naming `op`.
fn check(op: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(super::conv::driver_error(op, r))
    }
}

/// Runs `f` through [`call`] and checks its status.
fn checked(op: &'static str, f: impl FnOnce() -> sys::CUresult) -> Result<()> {
    check(op, call(f))
}

/// Reads a NUL-terminated name the driver wrote into `buf`.
fn c_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Initialization. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__INITIALIZE.html>
pub(super) mod init {
    use super::*;

    /// `cuInit(0)`. The library must be present (`sys::is_culib_present`).
    pub(in crate::cuda) fn init() -> Result<()> {
        // SAFETY: cuInit has no preconditions; the caller checked that the library loads.
        checked("cuInit", || unsafe { sys::cuInit(0) })
    }
}

/// Devices and their attributes.
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html>
pub(super) mod device {
    use super::*;

    /// `cuDeviceGetCount`.
    pub(in crate::cuda) fn count() -> Result<i32> {
        let mut n = 0i32;
        // SAFETY: valid out pointer.
        checked("cuDeviceGetCount", || unsafe {
            sys::cuDeviceGetCount(&mut n)
        })?;
        Ok(n)
    }

    /// `cuDeviceGet`.
    pub(in crate::cuda) fn get(ordinal: i32) -> Result<sys::CUdevice> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: valid out pointer; an out-of-range ordinal is an error status.
        checked("cuDeviceGet", || unsafe {
            sys::cuDeviceGet(&mut dev, ordinal)
        })?;
        Ok(dev)
    }

    /// `cuDeviceGetAttribute`; `op` names the attribute in errors.
    pub(in crate::cuda) fn attribute(
        dev: sys::CUdevice,
        attr: sys::CUdevice_attribute,
        op: &'static str,
    ) -> Result<i32> {
        let mut v = 0i32;
        // SAFETY: valid out pointer; a bad device or attribute is an error status.
        checked(op, || unsafe {
            sys::cuDeviceGetAttribute(&mut v, attr, dev)
        })?;
        Ok(v)
    }

    /// `cuDeviceGetName`.
    pub(in crate::cuda) fn name(dev: sys::CUdevice) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 chars; the driver NUL-terminates within that length.
        checked("cuDeviceGetName", || unsafe {
            sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev)
        })?;
        Ok(c_string(&buf))
    }

    /// `cuDeviceGetPCIBusId` (documented with memory management:
    /// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>).
    pub(in crate::cuda) fn pci_bus_id(dev: sys::CUdevice) -> Result<String> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: as for the name: 64 chars, NUL-terminated by the driver.
        checked("cuDeviceGetPCIBusId", || unsafe {
            sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev)
        })?;
        Ok(c_string(&buf))
    }
}

/// Primary contexts and the current context.
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PRIMARY__CTX.html>,
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html>
pub(super) mod ctx {
    use super::*;

    /// `cuDevicePrimaryCtxRetain`.
    pub(in crate::cuda) fn primary_retain(dev: sys::CUdevice) -> Result<sys::CUcontext> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out pointer; a bad device is an error status.
        checked("cuDevicePrimaryCtxRetain", || unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        Ok(ctx)
    }

    /// `cuDevicePrimaryCtxRelease`.
    ///
    /// # Safety
    /// Balances one [`primary_retain`] of `dev`; no handle of that context is used afterwards
    /// unless another retain holds it.
    pub(in crate::cuda) unsafe fn primary_release(dev: sys::CUdevice) -> Result<()> {
        // SAFETY: the caller balances a retain.
        checked("cuDevicePrimaryCtxRelease", || unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(dev)
        })
    }

    /// `cuCtxSetCurrent`.
    ///
    /// # Safety
    /// `ctx` is a live (retained) context.
    pub(in crate::cuda) unsafe fn set_current(ctx: sys::CUcontext) -> Result<()> {
        // SAFETY: the caller keeps the context alive.
        checked("cuCtxSetCurrent", || unsafe { sys::cuCtxSetCurrent(ctx) })
    }

    /// `cuCtxSynchronize` of the current context (blocks without a timeout).
    pub(in crate::cuda) fn synchronize() -> Result<()> {
        // SAFETY: no arguments; without a current context it is an error status.
        checked("cuCtxSynchronize", || unsafe { sys::cuCtxSynchronize() })
    }
}

/// Peer access. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PEER__ACCESS.html>
pub(super) mod peer {
    use super::*;

    /// `cuDeviceCanAccessPeer`.
    pub(in crate::cuda) fn can_access(dev: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
        let mut v = 0i32;
        // SAFETY: valid out pointer; bad devices are an error status.
        checked("cuDeviceCanAccessPeer", || unsafe {
            sys::cuDeviceCanAccessPeer(&mut v, dev, peer)
        })?;
        Ok(v != 0)
    }

    /// `cuCtxEnablePeerAccess(peer_ctx, 0)` from the current context; "already enabled" is
    /// success.
    ///
    /// # Safety
    /// `peer_ctx` is a live (retained) context.
    pub(in crate::cuda) unsafe fn enable(peer_ctx: sys::CUcontext) -> Result<()> {
        // SAFETY: the caller keeps the peer context alive; flags must be 0.
        let r = call(|| unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) });
        if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check("cuCtxEnablePeerAccess", r)
    }
}

/// Linear allocations, pinned host memory, synchronous and stream-ordered copies and sets.
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>
pub(super) mod mem {
    use super::*;

    /// `cuMemAlloc` in the current context.
    pub(in crate::cuda) fn alloc(size: usize) -> Result<sys::CUdeviceptr> {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: valid out pointer.
        checked("cuMemAlloc", || unsafe { sys::cuMemAlloc_v2(&mut p, size) })?;
        Ok(p)
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
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        checked("cuMemHostAlloc", || unsafe {
            sys::cuMemHostAlloc(&mut h, size, flags)
        })?;
        Ok(h)
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
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: valid out pointer; the caller vouches for `p`; flags must be 0.
        checked("cuMemHostGetDevicePointer", || unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0)
        })?;
        Ok(d)
    }

    /// `cuMemHostRegister(p, len, flags)`.
    ///
    /// # Safety
    /// `p..p+len` is one live host allocation that outlives the registration.
    pub(in crate::cuda) unsafe fn host_register(
        p: *mut c_void,
        len: usize,
        flags: u32,
    ) -> Result<()> {
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

    /// `cuMemsetD8` (may return before the device is done; see the legacy-stream sync).
    ///
    /// # Safety
    /// `dst..dst+len` is live device memory.
    pub(in crate::cuda) unsafe fn set_d8(
        dst: sys::CUdeviceptr,
        value: u8,
        len: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("cuMemsetD8", || unsafe {
            sys::cuMemsetD8_v2(dst, value, len)
        })
    }

    /// `cuMemcpyHtoD`.
    ///
    /// # Safety
    /// `dst..dst+src.len()` is live device memory.
    pub(in crate::cuda) unsafe fn copy_htod(dst: sys::CUdeviceptr, src: &[u8]) -> Result<()> {
        // SAFETY: forwarded from the caller; `src` is a live host slice.
        checked("cuMemcpyHtoD", || unsafe {
            sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len())
        })
    }

    /// `cuMemcpyDtoH`.
    ///
    /// # Safety
    /// `src..src+dst.len()` is live device memory.
    pub(in crate::cuda) unsafe fn copy_dtoh(dst: &mut [u8], src: sys::CUdeviceptr) -> Result<()> {
        // SAFETY: forwarded from the caller; `dst` is a live host slice.
        checked("cuMemcpyDtoH", || unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    /// `cuMemcpy` between unified addresses.
    ///
    /// # Safety
    /// Both ranges of `len` bytes are live memory the device can reach.
    pub(in crate::cuda) unsafe fn copy(
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        len: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("cuMemcpy", || unsafe { sys::cuMemcpy(dst, src, len) })
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
}

/// Virtual memory management (cuMem): physical allocations, reserved ranges, mappings,
/// shareable handles. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html>
pub(super) mod vmm {
    use super::*;

    /// `cuMemGetAllocationGranularity(prop, MINIMUM)`.
    pub(in crate::cuda) fn min_granularity(prop: &sys::CUmemAllocationProp) -> Result<usize> {
        let mut g = 0usize;
        // SAFETY: valid out pointer and property struct.
        checked("cuMemGetAllocationGranularity", || unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        Ok(g)
    }

    /// `cuMemCreate(len, prop, 0)`.
    pub(in crate::cuda) fn create(
        len: usize,
        prop: &sys::CUmemAllocationProp,
    ) -> Result<sys::CUmemGenericAllocationHandle> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out pointer and property struct.
        checked("cuMemCreate", || unsafe {
            sys::cuMemCreate(&mut handle, len, prop, 0)
        })?;
        Ok(handle)
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
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out pointer; no fixed address requested.
        checked("cuMemAddressReserve", || unsafe {
            sys::cuMemAddressReserve(&mut ptr, len, align, 0, 0)
        })?;
        Ok(ptr)
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
    pub(in crate::cuda) fn export_posix_fd(
        handle: sys::CUmemGenericAllocationHandle,
    ) -> Result<i32> {
        let mut fd: i32 = -1;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the out parameter is an int; a bad handle is an
        // error status.
        checked("cuMemExportToShareableHandle(POSIX_FD)", || unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut i32).cast(),
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        Ok(fd)
    }

    /// `cuMemExportToShareableHandle(FABRIC)`.
    pub(in crate::cuda) fn export_fabric(
        handle: sys::CUmemGenericAllocationHandle,
    ) -> Result<sys::CUmemFabricHandle> {
        // SAFETY: a plain C struct; all-zero is a valid value.
        let mut fh: sys::CUmemFabricHandle = unsafe { std::mem::zeroed() };
        // SAFETY: for FABRIC the out parameter is a CUmemFabricHandle.
        checked("cuMemExportToShareableHandle(FABRIC)", || unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fh as *mut sys::CUmemFabricHandle).cast(),
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
                0,
            )
        })?;
        Ok(fh)
    }

    /// `cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)`; the driver does not take
    /// ownership of `fd`.
    ///
    /// # Safety
    /// `fd` is a live descriptor exported by [`export_posix_fd`] (here or in a peer).
    pub(in crate::cuda) unsafe fn import_posix_fd(
        fd: i32,
    ) -> Result<sys::CUmemGenericAllocationHandle> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: the driver takes the fd value itself as the "pointer" argument.
        checked("cuMemImportFromShareableHandle(POSIX_FD)", || unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        Ok(handle)
    }

    /// `cuMemImportFromShareableHandle(FABRIC)`.
    pub(in crate::cuda) fn import_fabric(
        fh: &sys::CUmemFabricHandle,
    ) -> Result<sys::CUmemGenericAllocationHandle> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let mut copy = *fh;
        // SAFETY: for FABRIC the os handle is a pointer to a live fabric handle.
        checked("cuMemImportFromShareableHandle(FABRIC)", || unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                (&mut copy as *mut sys::CUmemFabricHandle).cast(),
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
            )
        })?;
        Ok(handle)
    }
}

/// Legacy IPC handles of cuMemAlloc memory.
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>
pub(super) mod ipc {
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
}

/// Streams. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html>,
/// stream memory operations <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEMOP.html>
pub(super) mod stream {
    use super::*;

    /// `cuStreamCreate(NON_BLOCKING)` in the current context.
    pub(in crate::cuda) fn create_non_blocking() -> Result<sys::CUstream> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        checked("cuStreamCreate", || unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(s)
    }

    /// `cuStreamDestroy`.
    ///
    /// # Safety
    /// `s` came from [`create_non_blocking`] and is destroyed once.
    pub(in crate::cuda) unsafe fn destroy(s: sys::CUstream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("cuStreamDestroy", || unsafe { sys::cuStreamDestroy_v2(s) })
    }

    /// `cuStreamQuery`: `Ok(true)` when all its work is done, `Ok(false)` while not ready.
    ///
    /// # Safety
    /// `s` is a live stream.
    pub(in crate::cuda) unsafe fn query(s: sys::CUstream) -> Result<bool> {
        // SAFETY: forwarded from the caller.
        ready("cuStreamQuery", call(|| unsafe { sys::cuStreamQuery(s) }))
    }

    /// `cuStreamSynchronize` (blocks; the null stream is the legacy default stream).
    ///
    /// # Safety
    /// `s` is a live stream or null.
    pub(in crate::cuda) unsafe fn synchronize(op: &'static str, s: sys::CUstream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked(op, || unsafe { sys::cuStreamSynchronize(s) })
    }

    /// `cuStreamWriteValue64(s, dst, value, 0)`: flags 0 (`CU_STREAM_WRITE_VALUE_DEFAULT`)
    /// flush prior writes before the store.
    ///
    /// # Safety
    /// `dst` is 8-byte aligned device memory alive until `s` is done; `s` is live.
    pub(in crate::cuda) unsafe fn write_value64(
        s: sys::CUstream,
        dst: sys::CUdeviceptr,
        value: u64,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("cuStreamWriteValue64", || unsafe {
            sys::cuStreamWriteValue64_v2(s, dst, value, 0)
        })
    }
}

/// `NOT_READY` is `Ok(false)`, success `Ok(true)`, anything else an error.
fn ready(op: &'static str, r: sys::CUresult) -> Result<bool> {
    if r == sys::CUresult::CUDA_ERROR_NOT_READY {
        Ok(false)
    } else {
        check(op, r).map(|_| true)
    }
}

/// Events. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html>
pub(super) mod event {
    use super::*;

    /// `cuEventCreate(DEFAULT)` in the current context (timing enabled).
    pub(in crate::cuda) fn create() -> Result<sys::CUevent> {
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        checked("cuEventCreate", || unsafe {
            sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
        })?;
        Ok(e)
    }

    /// `cuEventDestroy`.
    ///
    /// # Safety
    /// `e` came from [`create`] and is destroyed once.
    pub(in crate::cuda) unsafe fn destroy(e: sys::CUevent) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("cuEventDestroy", || unsafe { sys::cuEventDestroy_v2(e) })
    }

    /// `cuEventRecord`.
    ///
    /// # Safety
    /// `e` and `s` are live.
    pub(in crate::cuda) unsafe fn record(e: sys::CUevent, s: sys::CUstream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("cuEventRecord", || unsafe { sys::cuEventRecord(e, s) })
    }

    /// `cuEventQuery`: `Ok(true)` once the recorded work is done.
    ///
    /// # Safety
    /// `e` is live.
    pub(in crate::cuda) unsafe fn query(e: sys::CUevent) -> Result<bool> {
        // SAFETY: forwarded from the caller.
        ready("cuEventQuery", call(|| unsafe { sys::cuEventQuery(e) }))
    }

    /// `cuEventElapsedTime` in milliseconds.
    ///
    /// # Safety
    /// Both events are live.
    pub(in crate::cuda) unsafe fn elapsed_ms(
        start: sys::CUevent,
        end: sys::CUevent,
    ) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: valid out pointer; the caller vouches for the events.
        checked("cuEventElapsedTime", || unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, start, end)
        })?;
        Ok(ms)
    }
}

/// Modules and kernels. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html>,
/// launch and parameter layout <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html>
pub(super) mod module {
    use super::*;
    use std::ffi::CStr;

    /// `cuModuleLoadData` of an image (fatbin, cubin or NUL-terminated PTX).
    ///
    /// # Safety
    /// `image` points at a complete code object, suitably aligned (8 bytes), alive for the call.
    pub(in crate::cuda) unsafe fn load_data(image: *const c_void) -> Result<sys::CUmodule> {
        let mut m: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: valid out pointer; the caller vouches for the image.
        checked("cuModuleLoadData", || unsafe {
            sys::cuModuleLoadData(&mut m, image)
        })?;
        Ok(m)
    }

    /// `cuModuleUnload`.
    ///
    /// # Safety
    /// `m` came from [`load_data`], is unloaded once, and none of its kernels runs or is used
    /// afterwards.
    pub(in crate::cuda) unsafe fn unload(m: sys::CUmodule) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("cuModuleUnload", || unsafe { sys::cuModuleUnload(m) })
    }

    /// `cuModuleGetFunction`.
    ///
    /// # Safety
    /// `m` is a live module.
    pub(in crate::cuda) unsafe fn get_function(
        m: sys::CUmodule,
        name: &CStr,
    ) -> Result<sys::CUfunction> {
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: valid out pointer; NUL-terminated name; the caller vouches for the module.
        checked("cuModuleGetFunction", || unsafe {
            sys::cuModuleGetFunction(&mut f, m, name.as_ptr())
        })?;
        Ok(f)
    }

    /// `cuFuncGetParamInfo`: (offset, size) of parameter `index`, `None` past the last one.
    ///
    /// # Safety
    /// `f` is a function of a live module.
    pub(in crate::cuda) unsafe fn param_info(
        f: sys::CUfunction,
        index: usize,
    ) -> Option<(usize, usize)> {
        let (mut off, mut size) = (0usize, 0usize);
        // SAFETY: valid out pointers; an index past the last parameter is an error status.
        let r = call(|| unsafe { sys::cuFuncGetParamInfo(f, index, &mut off, &mut size) });
        (r == sys::CUresult::CUDA_SUCCESS).then_some((off, size))
    }

    /// `cuLaunchKernel` with `params` pointing at each parameter's bytes.
    ///
    /// # Safety
    /// `f` and `stream` are live; `params` has one pointer per kernel parameter, each to a
    /// value of that parameter's size (the driver copies them at launch); device pointers
    /// among them stay valid until the kernel finishes.
    pub(in crate::cuda) unsafe fn launch(
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem_bytes: u32,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("cuLaunchKernel", || unsafe {
            sys::cuLaunchKernel(
                f,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared_mem_bytes,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}
