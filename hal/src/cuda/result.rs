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
use crate::c_string;
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

/// [`checked`] for a call that writes a NUL-terminated string into a buffer of `N` chars
/// (given to `f` as pointer and length); the string (all `N` chars without a NUL).
fn checked_str<const N: usize>(
    op: &'static str,
    f: impl FnOnce(*mut c_char, i32) -> sys::CUresult,
) -> Result<String> {
    let mut buf = [0 as c_char; N];
    checked(op, || f(buf.as_mut_ptr(), N as i32))?;
    Ok(c_string(&buf))
}

/// Runs `f` through [`call`] and checks its status.
/// Runs one driver call through the counting choke point and turns its status into `Result`.
pub(in crate::cuda) fn checked(op: &'static str, f: impl FnOnce() -> sys::CUresult) -> Result<()> {
    check(op, call(f))
}

/// [`checked`] for a call that returns its result through an out pointer: `f` gets `init` to
/// write into; its value once the call succeeded.
pub(in crate::cuda) fn checked_out<T>(
    op: &'static str,
    init: T,
    f: impl FnOnce(&mut T) -> sys::CUresult,
) -> Result<T> {
    let mut out = init;
    checked(op, || f(&mut out))?;
    Ok(out)
}

/// Initialization. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__INITIALIZE.html>
pub(super) mod init {
    use super::*;

    /// `cuInit(0)`. The library must be present (`sys::is_culib_present`).
    pub(in crate::cuda) fn init() -> Result<()> {
        // SAFETY: cuInit has no preconditions; the caller checked that the library loads.
        checked("cuInit", || unsafe { sys::cuInit(0) })
    }

    /// `cuDriverGetVersion` (e.g. 13000 for CUDA 13.0).
    pub(in crate::cuda) fn driver_version() -> Result<i32> {
        // SAFETY: valid out pointer.
        checked_out("cuDriverGetVersion", 0i32, |v| unsafe {
            sys::cuDriverGetVersion(v)
        })
    }
}

/// Devices and their attributes.
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html>
pub(super) mod device {
    use super::*;

    /// `cuDeviceGetCount`.
    pub(in crate::cuda) fn count() -> Result<i32> {
        // SAFETY: valid out pointer.
        checked_out("cuDeviceGetCount", 0i32, |n| unsafe {
            sys::cuDeviceGetCount(n)
        })
    }

    /// `cuDeviceGet`.
    pub(in crate::cuda) fn get(ordinal: i32) -> Result<sys::CUdevice> {
        // SAFETY: valid out pointer; an out-of-range ordinal is an error status.
        checked_out("cuDeviceGet", 0, |dev| unsafe {
            sys::cuDeviceGet(dev, ordinal)
        })
    }

    /// `cuDeviceGetAttribute`; `op` names the attribute in errors.
    pub(in crate::cuda) fn attribute(
        dev: sys::CUdevice,
        attr: sys::CUdevice_attribute,
        op: &'static str,
    ) -> Result<i32> {
        // SAFETY: valid out pointer; a bad device or attribute is an error status.
        checked_out(op, 0i32, |v| unsafe {
            sys::cuDeviceGetAttribute(v, attr, dev)
        })
    }

    /// `cuDeviceGetName`.
    pub(in crate::cuda) fn name(dev: sys::CUdevice) -> Result<String> {
        // SAFETY: a buffer of 256 chars; the driver NUL-terminates within that length.
        checked_str::<256>("cuDeviceGetName", |p, n| unsafe {
            sys::cuDeviceGetName(p, n, dev)
        })
    }

    /// `cuDeviceGetPCIBusId` (documented with memory management:
    /// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>).
    pub(in crate::cuda) fn pci_bus_id(dev: sys::CUdevice) -> Result<String> {
        // SAFETY: as for the name: 64 chars, NUL-terminated by the driver.
        checked_str::<64>("cuDeviceGetPCIBusId", |p, n| unsafe {
            sys::cuDeviceGetPCIBusId(p, n, dev)
        })
    }
}

/// Primary contexts and the current context.
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PRIMARY__CTX.html>,
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html>
pub(super) mod ctx {
    use super::*;

    /// `cuDevicePrimaryCtxRetain`.
    pub(in crate::cuda) fn primary_retain(dev: sys::CUdevice) -> Result<sys::CUcontext> {
        // SAFETY: valid out pointer; a bad device is an error status.
        checked_out(
            "cuDevicePrimaryCtxRetain",
            std::ptr::null_mut(),
            |ctx| unsafe { sys::cuDevicePrimaryCtxRetain(ctx, dev) },
        )
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

    /// `cuCtxGetCurrent` then `cuCtxGetDevice`: the device of the calling thread's current
    /// context, `None` without one.
    /// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html>
    pub(in crate::cuda) fn current_device() -> Result<Option<sys::CUdevice>> {
        // SAFETY: valid out pointer.
        let ctx: sys::CUcontext =
            checked_out("cuCtxGetCurrent", std::ptr::null_mut(), |ctx| unsafe {
                sys::cuCtxGetCurrent(ctx)
            })?;
        if ctx.is_null() {
            return Ok(None);
        }
        // SAFETY: valid out pointer; a context is current.
        let dev: sys::CUdevice = checked_out("cuCtxGetDevice", 0, |dev| unsafe {
            sys::cuCtxGetDevice(dev)
        })?;
        Ok(Some(dev))
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
        // SAFETY: valid out pointer; bad devices are an error status.
        let v = checked_out("cuDeviceCanAccessPeer", 0i32, |v| unsafe {
            sys::cuDeviceCanAccessPeer(v, dev, peer)
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

pub(super) mod mem;

pub(super) mod vmm;

pub(super) mod ipc;

pub(super) mod multicast;

pub(super) mod graph;

/// Streams. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html>,
/// stream memory operations <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEMOP.html>
pub(super) mod stream {
    use super::*;

    /// `cuStreamCreate(NON_BLOCKING)` in the current context.
    pub(in crate::cuda) fn create_non_blocking() -> Result<sys::CUstream> {
        // SAFETY: valid out pointer.
        checked_out("cuStreamCreate", std::ptr::null_mut(), |s| unsafe {
            sys::cuStreamCreate(s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })
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
        // SAFETY: valid out pointer.
        checked_out("cuEventCreate", std::ptr::null_mut(), |e| unsafe {
            sys::cuEventCreate(e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
        })
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
        // SAFETY: valid out pointer; the caller vouches for the events.
        checked_out("cuEventElapsedTime", 0f32, |ms| unsafe {
            sys::cuEventElapsedTime_v2(ms, start, end)
        })
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
        // SAFETY: valid out pointer; the caller vouches for the image.
        checked_out("cuModuleLoadData", std::ptr::null_mut(), |m| unsafe {
            sys::cuModuleLoadData(m, image)
        })
    }

    /// Every function of `m` loaded now (`cuModuleGetFunctionCount`, `cuModuleEnumerateFunctions`,
    /// `cuFuncLoad`; CUDA 12.4 drivers and later).
    ///
    /// # Safety
    /// `m` is a live module.
    pub(in crate::cuda) unsafe fn load_all_functions(m: sys::CUmodule) -> Result<usize> {
        // SAFETY: valid out pointer; the caller vouches for the module.
        let n: std::ffi::c_uint = checked_out("cuModuleGetFunctionCount", 0, |n| unsafe {
            sys::cuModuleGetFunctionCount(n, m)
        })?;
        let mut funcs: Vec<sys::CUfunction> = vec![std::ptr::null_mut(); n as usize];
        // SAFETY: `funcs` holds `n` entries.
        checked("cuModuleEnumerateFunctions", || unsafe {
            sys::cuModuleEnumerateFunctions(funcs.as_mut_ptr(), n, m)
        })?;
        for f in &funcs {
            // SAFETY: a function handle of the live module.
            checked("cuFuncLoad", || unsafe { sys::cuFuncLoad(*f) })?;
        }
        Ok(funcs.len())
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

    /// `cuModuleGetGlobal`: the address and size of the module's global `name`, `None` when
    /// the module has no such global.
    ///
    /// # Safety
    /// `m` is a live module.
    pub(in crate::cuda) unsafe fn get_global(
        m: sys::CUmodule,
        name: &CStr,
    ) -> Result<Option<(sys::CUdeviceptr, usize)>> {
        let (mut p, mut n): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out pointers; NUL-terminated name; the caller vouches for the module.
        let r = call(|| unsafe { sys::cuModuleGetGlobal_v2(&mut p, &mut n, m, name.as_ptr()) });
        if r == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            return Ok(None);
        }
        check("cuModuleGetGlobal", r)?;
        Ok(Some((p, n)))
    }

    /// `cuModuleGetFunction`.
    ///
    /// # Safety
    /// `m` is a live module.
    pub(in crate::cuda) unsafe fn get_function(
        m: sys::CUmodule,
        name: &CStr,
    ) -> Result<sys::CUfunction> {
        // SAFETY: valid out pointer; NUL-terminated name; the caller vouches for the module.
        checked_out("cuModuleGetFunction", std::ptr::null_mut(), |f| unsafe {
            sys::cuModuleGetFunction(f, m, name.as_ptr())
        })
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
