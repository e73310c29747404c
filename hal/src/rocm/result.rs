//! Thin checked wrappers over the HIP functions resolved at run time (`sys.rs`), grouped by
//! topic: each loads the table (an [`Error::NoDriver`] when HIP is absent), turns the
//! `hipError_t` into a [`Result`] (an [`Error::Driver`] naming the call and HIP's error
//! name), fills its out-parameters and returns them, and links the HIP API page of the call.
//! The safe types of this backend call HIP only through these functions.
//!
//! Every call goes through [`call`], the one choke point, which counts it
//! ([`crate::auxil::driver_calls_on_this_thread`]). A wrapper is `unsafe` when a stale or
//! foreign handle or pointer it takes could make the runtime touch freed memory.

use super::conv::{
    HIP_ERROR_NOT_FOUND, HIP_ERROR_NOT_READY, HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED,
    HIP_MEMCPY_DEFAULT, HIP_STREAM_NON_BLOCKING, HIP_SUCCESS,
};
use super::sys::{hip, Hip, HipEvent, HipFunction, HipModule, HipStream};
use crate::auxil::count_driver_call;
use crate::c_string;
use crate::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};

/// Runs one HIP call on the loaded table and counts it: the choke point every wrapper goes
/// through.
fn call(f: impl FnOnce(&'static Hip) -> c_int) -> Result<c_int> {
    let h = hip()?;
    count_driver_call();
    Ok(f(h))
}

/// Turns a `hipError_t` into `Ok` or an [`Error::Driver`] naming `op`.
fn check(op: &'static str, rc: c_int) -> Result<()> {
    if rc == HIP_SUCCESS {
        return Ok(());
    }
    let name = match hip() {
        Ok(h) => {
            // SAFETY: hipGetErrorName returns a static string (or null).
            let p = unsafe { (h.hipGetErrorName)(rc) };
            if p.is_null() {
                format!("hipError {rc}")
            } else {
                // SAFETY: non-null, NUL-terminated static string.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        }
        Err(_) => format!("hipError {rc}"),
    };
    Err(Error::Driver {
        op,
        code: i64::from(rc),
        name,
    })
}

/// [`call`], then [`check`].
fn checked(op: &'static str, f: impl FnOnce(&'static Hip) -> c_int) -> Result<()> {
    check(op, call(f)?)
}

/// [`checked`] for a call that returns its result through an out pointer: `f` gets `init` to
/// write into; its value once the call succeeded.
fn checked_out<T>(
    op: &'static str,
    init: T,
    f: impl FnOnce(&'static Hip, &mut T) -> c_int,
) -> Result<T> {
    let mut out = init;
    checked(op, |h| f(h, &mut out))?;
    Ok(out)
}

/// [`checked`] for a call that writes a NUL-terminated string into a buffer of `N` chars
/// (given to `f` as pointer and length); the string (all `N` chars without a NUL).
fn checked_str<const N: usize>(
    op: &'static str,
    f: impl FnOnce(&'static Hip, *mut c_char, i32) -> c_int,
) -> Result<String> {
    let mut buf = [0 as c_char; N];
    checked(op, |h| f(h, buf.as_mut_ptr(), N as i32))?;
    Ok(c_string(&buf))
}

/// `hipErrorNotReady` is `Ok(false)`, success `Ok(true)`, anything else an error.
fn ready(op: &'static str, rc: c_int) -> Result<bool> {
    if rc == HIP_ERROR_NOT_READY {
        Ok(false)
    } else {
        check(op, rc).map(|_| true)
    }
}

fn ptr(addr: u64) -> *mut c_void {
    addr as usize as *mut c_void
}

/// Devices and peer access.
/// <https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___device.html>,
/// <https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___peer_to_peer.html>
pub(super) mod device {
    use super::*;

    /// `hipGetDeviceCount`.
    pub(in crate::rocm) fn count() -> Result<i32> {
        // SAFETY: valid out pointer.
        checked_out("hipGetDeviceCount", 0, |h, n| unsafe {
            (h.hipGetDeviceCount)(n)
        })
    }

    /// `hipGetDevice`: the calling thread's device (HIP always has one, device 0 by default).
    pub(in crate::rocm) fn current() -> Result<i32> {
        // SAFETY: valid out pointer.
        checked_out("hipGetDevice", 0, |h, d| unsafe { (h.hipGetDevice)(d) })
    }

    /// `hipSetDevice`.
    pub(in crate::rocm) fn set(ordinal: i32) -> Result<()> {
        // SAFETY: a bad ordinal is an error status.
        checked("hipSetDevice", |h| unsafe { (h.hipSetDevice)(ordinal) })
    }

    /// `hipDeviceGetAttribute`; `op` names the attribute in errors.
    pub(in crate::rocm) fn attribute(ordinal: i32, attr: i32, op: &'static str) -> Result<i32> {
        // SAFETY: valid out pointer.
        checked_out(op, 0, |h, v| unsafe {
            (h.hipDeviceGetAttribute)(v, attr, ordinal)
        })
    }

    /// `hipDeviceGetName`.
    pub(in crate::rocm) fn name(ordinal: i32) -> Result<String> {
        // SAFETY: a buffer of 256 chars.
        checked_str::<256>("hipDeviceGetName", |h, p, n| unsafe {
            (h.hipDeviceGetName)(p, n, ordinal)
        })
    }

    /// `hipDeviceGetPCIBusId`.
    pub(in crate::rocm) fn pci_bus_id(ordinal: i32) -> Result<String> {
        // SAFETY: a buffer of 64 chars.
        checked_str::<64>("hipDeviceGetPCIBusId", |h, p, n| unsafe {
            (h.hipDeviceGetPCIBusId)(p, n, ordinal)
        })
    }

    /// `hipDeviceCanAccessPeer`.
    pub(in crate::rocm) fn can_access_peer(ordinal: i32, peer: i32) -> Result<bool> {
        // SAFETY: valid out pointer.
        let v = checked_out("hipDeviceCanAccessPeer", 0, |h, v| unsafe {
            (h.hipDeviceCanAccessPeer)(v, ordinal, peer)
        })?;
        Ok(v != 0)
    }

    /// `hipDeviceEnablePeerAccess(peer, 0)` from the current device; "already enabled" is
    /// success.
    pub(in crate::rocm) fn enable_peer_access(peer: i32) -> Result<()> {
        // SAFETY: flags must be 0.
        let rc = call(|h| unsafe { (h.hipDeviceEnablePeerAccess)(peer, 0) })?;
        if rc == HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check("hipDeviceEnablePeerAccess", rc)
    }

    /// `hipDeviceSynchronize` of the current device (blocks without a timeout).
    pub(in crate::rocm) fn synchronize() -> Result<()> {
        // SAFETY: no arguments.
        checked("hipDeviceSynchronize", |h| unsafe {
            (h.hipDeviceSynchronize)()
        })
    }
}

/// Allocations, pinned host memory, copies and sets.
/// <https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___memory.html>
pub(super) mod mem {
    use super::*;

    /// `hipMalloc` on the current device.
    pub(in crate::rocm) fn malloc(size: usize) -> Result<*mut c_void> {
        // SAFETY: valid out pointer.
        checked_out("hipMalloc", std::ptr::null_mut(), |h, p| unsafe {
            (h.hipMalloc)(p, size)
        })
    }

    /// `hipExtMallocWithFlags(size, flags)`; `op` names the flags in errors.
    pub(in crate::rocm) fn ext_malloc(
        op: &'static str,
        size: usize,
        flags: u32,
    ) -> Result<*mut c_void> {
        // SAFETY: valid out pointer.
        checked_out(op, std::ptr::null_mut(), |h, p| unsafe {
            (h.hipExtMallocWithFlags)(p, size, flags)
        })
    }

    /// `hipFree`.
    ///
    /// # Safety
    /// `p` came from [`malloc`] or [`ext_malloc`], is freed once, and no work uses it any more.
    pub(in crate::rocm) unsafe fn free(p: *mut c_void) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipFree", |h| unsafe { (h.hipFree)(p) })
    }

    /// `hipHostMalloc(size, flags)`.
    pub(in crate::rocm) fn host_malloc(size: usize, flags: u32) -> Result<*mut c_void> {
        // SAFETY: valid out pointer.
        checked_out("hipHostMalloc", std::ptr::null_mut(), |h, p| unsafe {
            (h.hipHostMalloc)(p, size, flags)
        })
    }

    /// `hipHostFree`.
    ///
    /// # Safety
    /// `p` came from [`host_malloc`], is freed once, and nothing uses it any more.
    pub(in crate::rocm) unsafe fn host_free(p: *mut c_void) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipHostFree", |h| unsafe { (h.hipHostFree)(p) })
    }

    /// `hipHostGetDevicePointer(p, 0)`.
    ///
    /// # Safety
    /// `p` is live host memory allocated or registered as mapped.
    pub(in crate::rocm) unsafe fn host_device_pointer(p: *mut c_void) -> Result<*mut c_void> {
        // SAFETY: valid out pointer; the caller vouches for `p`; flags must be 0.
        checked_out(
            "hipHostGetDevicePointer",
            std::ptr::null_mut(),
            |h, d| unsafe { (h.hipHostGetDevicePointer)(d, p, 0) },
        )
    }

    /// `hipHostRegister(p, len, flags)`.
    ///
    /// # Safety
    /// `p..p+len` is one live host allocation that outlives the registration.
    pub(in crate::rocm) unsafe fn host_register(
        p: *mut c_void,
        len: usize,
        flags: u32,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipHostRegister", |h| unsafe {
            (h.hipHostRegister)(p, len, flags)
        })
    }

    /// `hipHostUnregister`.
    ///
    /// # Safety
    /// `p` was registered by [`host_register`] and no device work uses it any more.
    pub(in crate::rocm) unsafe fn host_unregister(p: *mut c_void) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipHostUnregister", |h| unsafe { (h.hipHostUnregister)(p) })
    }

    /// `hipMemsetAsync`.
    ///
    /// # Safety
    /// `dst..dst+len` stays live until `stream` has done this work; `stream` is live.
    pub(in crate::rocm) unsafe fn set_async(
        dst: u64,
        value: u8,
        len: usize,
        stream: HipStream,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipMemsetAsync", |h| unsafe {
            (h.hipMemsetAsync)(ptr(dst), i32::from(value), len, stream)
        })
    }

    /// `hipMemcpyAsync(Default)`.
    ///
    /// # Safety
    /// Both ranges stay live until `stream` has done this work; `stream` is live.
    pub(in crate::rocm) unsafe fn copy_async(
        dst: u64,
        src: u64,
        len: usize,
        stream: HipStream,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipMemcpyAsync", |h| unsafe {
            (h.hipMemcpyAsync)(
                ptr(dst),
                ptr(src).cast_const(),
                len,
                HIP_MEMCPY_DEFAULT,
                stream,
            )
        })
    }
}

/// Streams and stream memory operations.
/// <https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___stream.html>,
/// <https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___stream_m.html>
pub(super) mod stream {
    use super::*;

    /// `hipStreamCreateWithFlags(NonBlocking)` on the current device.
    pub(in crate::rocm) fn create_non_blocking() -> Result<HipStream> {
        // SAFETY: valid out pointer.
        checked_out(
            "hipStreamCreateWithFlags",
            std::ptr::null_mut(),
            |h, s| unsafe { (h.hipStreamCreateWithFlags)(s, HIP_STREAM_NON_BLOCKING) },
        )
    }

    /// `hipStreamDestroy`.
    ///
    /// # Safety
    /// `s` came from [`create_non_blocking`] and is destroyed once.
    pub(in crate::rocm) unsafe fn destroy(s: HipStream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipStreamDestroy", |h| unsafe { (h.hipStreamDestroy)(s) })
    }

    /// `hipStreamQuery`: `Ok(true)` when all its work is done.
    ///
    /// # Safety
    /// `s` is live.
    pub(in crate::rocm) unsafe fn query(s: HipStream) -> Result<bool> {
        // SAFETY: forwarded from the caller.
        ready(
            "hipStreamQuery",
            call(|h| unsafe { (h.hipStreamQuery)(s) })?,
        )
    }

    /// `hipStreamSynchronize` (blocks until the work queued on `s` is done).
    ///
    /// # Safety
    /// `s` is live.
    pub(in crate::rocm) unsafe fn synchronize(op: &'static str, s: HipStream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked(op, |h| unsafe { (h.hipStreamSynchronize)(s) })
    }

    /// `hipStreamWriteValue64(s, dst, value, 0)`.
    ///
    /// # Safety
    /// `dst` is 8-byte aligned device memory alive until `s` is done; `s` is live.
    pub(in crate::rocm) unsafe fn write_value64(s: HipStream, dst: u64, value: u64) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipStreamWriteValue64", |h| unsafe {
            (h.hipStreamWriteValue64)(s, ptr(dst), value, 0)
        })
    }
}

/// Events. <https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___event.html>
pub(super) mod event {
    use super::*;

    /// `hipEventCreate`.
    pub(in crate::rocm) fn create() -> Result<HipEvent> {
        // SAFETY: valid out pointer.
        checked_out("hipEventCreate", std::ptr::null_mut(), |h, e| unsafe {
            (h.hipEventCreate)(e)
        })
    }

    /// `hipEventDestroy`.
    ///
    /// # Safety
    /// `e` came from [`create`] and is destroyed once.
    pub(in crate::rocm) unsafe fn destroy(e: HipEvent) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipEventDestroy", |h| unsafe { (h.hipEventDestroy)(e) })
    }

    /// `hipEventRecord`.
    ///
    /// # Safety
    /// `e` and `s` are live.
    pub(in crate::rocm) unsafe fn record(e: HipEvent, s: HipStream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipEventRecord", |h| unsafe { (h.hipEventRecord)(e, s) })
    }

    /// `hipEventQuery`: `Ok(true)` once the recorded work is done.
    ///
    /// # Safety
    /// `e` is live.
    pub(in crate::rocm) unsafe fn query(e: HipEvent) -> Result<bool> {
        // SAFETY: forwarded from the caller.
        ready("hipEventQuery", call(|h| unsafe { (h.hipEventQuery)(e) })?)
    }

    /// `hipEventElapsedTime` in milliseconds.
    ///
    /// # Safety
    /// Both events are live.
    pub(in crate::rocm) unsafe fn elapsed_ms(start: HipEvent, end: HipEvent) -> Result<f32> {
        // SAFETY: valid out pointer; the caller vouches for the events.
        checked_out("hipEventElapsedTime", 0f32, |h, ms| unsafe {
            (h.hipEventElapsedTime)(ms, start, end)
        })
    }
}

/// Modules and launch.
/// <https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___module.html>
pub(super) mod module {
    use super::*;

    /// `hipModuleLoadData`.
    ///
    /// # Safety
    /// `image` points at a complete, 8-byte-aligned code object alive for the call.
    pub(in crate::rocm) unsafe fn load_data(image: *const c_void) -> Result<HipModule> {
        // SAFETY: valid out pointer; the caller vouches for the image.
        checked_out("hipModuleLoadData", std::ptr::null_mut(), |h, m| unsafe {
            (h.hipModuleLoadData)(m, image)
        })
    }

    /// `hipModuleUnload`.
    ///
    /// # Safety
    /// `m` came from [`load_data`], is unloaded once, and none of its kernels is used after.
    pub(in crate::rocm) unsafe fn unload(m: HipModule) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipModuleUnload", |h| unsafe { (h.hipModuleUnload)(m) })
    }

    /// `hipModuleGetGlobal`: the device address and size of global `name`, `None` when the
    /// module has no such global.
    ///
    /// # Safety
    /// `m` is live.
    pub(in crate::rocm) unsafe fn get_global(
        m: HipModule,
        name: &CStr,
    ) -> Result<Option<(u64, usize)>> {
        let (mut p, mut size) = (std::ptr::null_mut(), 0usize);
        // SAFETY: valid out pointers; NUL-terminated name; the caller vouches for the module.
        let rc = call(|h| unsafe { (h.hipModuleGetGlobal)(&mut p, &mut size, m, name.as_ptr()) })?;
        if rc == HIP_ERROR_NOT_FOUND {
            return Ok(None);
        }
        check("hipModuleGetGlobal", rc)?;
        Ok(Some((p as usize as u64, size)))
    }

    /// `hipModuleGetFunction`.
    ///
    /// # Safety
    /// `m` is live.
    pub(in crate::rocm) unsafe fn get_function(m: HipModule, name: &CStr) -> Result<HipFunction> {
        // SAFETY: valid out pointer; NUL-terminated name; the caller vouches for the module.
        checked_out(
            "hipModuleGetFunction",
            std::ptr::null_mut(),
            |h, f| unsafe { (h.hipModuleGetFunction)(f, m, name.as_ptr()) },
        )
    }

    /// `hipModuleLaunchKernel` with the packed argument buffer passed through `extra`
    /// (`HIP_LAUNCH_PARAM_BUFFER_POINTER`, `_SIZE`, `_END`).
    ///
    /// # Safety
    /// `f` and `stream` are live; `args` is the kernel's parameters laid out as its C struct;
    /// device pointers inside stay valid until the kernel finishes.
    pub(in crate::rocm) unsafe fn launch(
        f: HipFunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem_bytes: u32,
        stream: HipStream,
        args: &[u8],
    ) -> Result<()> {
        let mut buf = vec![0u64; args.len().div_ceil(8).max(1)];
        // SAFETY: buf holds at least args.len() bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(args.as_ptr(), buf.as_mut_ptr().cast::<u8>(), args.len())
        };
        let mut size = args.len();
        let mut extra: [*mut c_void; 5] = [
            std::ptr::without_provenance_mut::<c_void>(1), // HIP_LAUNCH_PARAM_BUFFER_POINTER
            buf.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut::<c_void>(2), // HIP_LAUNCH_PARAM_BUFFER_SIZE
            (&mut size as *mut usize).cast(),
            std::ptr::without_provenance_mut::<c_void>(3), // HIP_LAUNCH_PARAM_END
        ];
        // SAFETY: extra points at live locals for the call; the caller vouches for the rest.
        checked("hipModuleLaunchKernel", |h| unsafe {
            (h.hipModuleLaunchKernel)(
                f,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared_mem_bytes,
                stream,
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        })
    }
}

/// IPC handles. <https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___memory.html>
pub(super) mod ipc {
    use super::*;
    use hip_sys::hiprt::hipIpcMemHandle_t;

    /// `hipIpcGetMemHandle` of the allocation that starts at `base`.
    pub(in crate::rocm) fn get_handle(base: u64) -> Result<hipIpcMemHandle_t> {
        // SAFETY: plain C struct; all-zero is a valid value.
        // SAFETY: valid out pointer; a pointer that is no allocation base is an error status.
        checked_out(
            "hipIpcGetMemHandle",
            unsafe { std::mem::zeroed() },
            |h, handle| unsafe { (h.hipIpcGetMemHandle)(handle, ptr(base)) },
        )
    }

    /// `hipIpcOpenMemHandle(handle, flags)`.
    pub(in crate::rocm) fn open_handle(handle: hipIpcMemHandle_t, flags: u32) -> Result<u64> {
        // SAFETY: valid out pointer; handle bytes naming no exported memory are an error status.
        let p: *mut c_void =
            checked_out("hipIpcOpenMemHandle", std::ptr::null_mut(), |h, p| unsafe {
                (h.hipIpcOpenMemHandle)(p, handle, flags)
            })?;
        Ok(p as usize as u64)
    }

    /// `hipIpcCloseMemHandle`.
    ///
    /// # Safety
    /// `base` came from [`open_handle`], is closed once, and no work uses it any more.
    pub(in crate::rocm) unsafe fn close_handle(base: u64) -> Result<()> {
        // SAFETY: forwarded from the caller.
        checked("hipIpcCloseMemHandle", |h| unsafe {
            (h.hipIpcCloseMemHandle)(ptr(base))
        })
    }
}
