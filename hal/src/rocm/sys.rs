//! HIP loaded at run time: the library search and the function table (this backend's raw
//! layer, as `cudarc::driver::sys` is CUDA's). Only `result.rs` calls these functions.
//!
//! hip-sys is used only for opaque types (`hipIpcMemHandle_t`) and attribute numbers; every
//! function is resolved from `libamdhip64.so` (`.so.7`, `.so.6`, `.so.5`) with libloading so
//! one binary runs on ROCm 5 to 7 and starts where ROCm is absent.
//! <https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/modules.html>

use crate::{Error, Result};
use hip_sys::hiprt::hipIpcMemHandle_t;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

pub(super) type HipStream = *mut c_void;
pub(super) type HipEvent = *mut c_void;
pub(super) type HipModule = *mut c_void;
pub(super) type HipFunction = *mut c_void;

/// Library names tried, in order.
pub(super) const LIB_NAMES: [&str; 4] = [
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

// The HIP entry points as `extern "C"` function pointers resolved at run time with libloading:
// hip-sys declares them as link-time imports of one ROCm version (`libamdhip64.so.5`), which
// would keep the binary from starting on ROCm 6/7 or without ROCm.
macro_rules! hip_table {
    ($($name:ident : fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// Resolved HIP entry points.
        #[allow(non_snake_case)] // fields named as HIP's C functions (hipMalloc, ...)
        pub(super) struct Hip {
            _lib: libloading::Library,
            $(pub(super) $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }
        impl Hip {
            #[allow(non_snake_case)] // its locals are named as HIP's C functions
            fn load(lib: libloading::Library, path: &str) -> Result<Self> {
                $(
                    // SAFETY: the symbol is declared with HIP's C signature.
                    let $name = unsafe {
                        *lib.get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(concat!(stringify!($name), "\0").as_bytes())
                            .map_err(|e| Error::MissingSymbol { library: path.to_string(), symbol: stringify!($name), reason: e.to_string() })?
                    };
                )*
                Ok(Hip { _lib: lib, $($name,)* })
            }
        }
    };
}

hip_table! {
    hipInit: fn(c_uint) -> c_int;
    hipGetErrorName: fn(c_int) -> *const c_char;
    hipGetDeviceCount: fn(*mut c_int) -> c_int;
    hipSetDevice: fn(c_int) -> c_int;
    hipGetDevice: fn(*mut c_int) -> c_int;
    hipDeviceGetAttribute: fn(*mut c_int, c_int, c_int) -> c_int;
    hipDeviceGetName: fn(*mut c_char, c_int, c_int) -> c_int;
    hipDeviceGetPCIBusId: fn(*mut c_char, c_int, c_int) -> c_int;
    hipDeviceCanAccessPeer: fn(*mut c_int, c_int, c_int) -> c_int;
    hipDeviceEnablePeerAccess: fn(c_int, c_uint) -> c_int;
    hipDeviceSynchronize: fn() -> c_int;
    hipMalloc: fn(*mut *mut c_void, usize) -> c_int;
    hipExtMallocWithFlags: fn(*mut *mut c_void, usize, c_uint) -> c_int;
    hipFree: fn(*mut c_void) -> c_int;
    hipHostMalloc: fn(*mut *mut c_void, usize, c_uint) -> c_int;
    hipHostGetDevicePointer: fn(*mut *mut c_void, *mut c_void, c_uint) -> c_int;
    hipHostFree: fn(*mut c_void) -> c_int;
    hipHostRegister: fn(*mut c_void, usize, c_uint) -> c_int;
    hipHostUnregister: fn(*mut c_void) -> c_int;
    hipMemsetAsync: fn(*mut c_void, c_int, usize, HipStream) -> c_int;
    hipMemcpyAsync: fn(*mut c_void, *const c_void, usize, c_int, HipStream) -> c_int;
    hipStreamCreateWithFlags: fn(*mut HipStream, c_uint) -> c_int;
    hipStreamWriteValue64: fn(HipStream, *mut c_void, u64, c_uint) -> c_int;
    hipStreamQuery: fn(HipStream) -> c_int;
    hipStreamSynchronize: fn(HipStream) -> c_int;
    hipStreamDestroy: fn(HipStream) -> c_int;
    hipEventCreate: fn(*mut HipEvent) -> c_int;
    hipEventRecord: fn(HipEvent, HipStream) -> c_int;
    hipEventQuery: fn(HipEvent) -> c_int;
    hipEventElapsedTime: fn(*mut f32, HipEvent, HipEvent) -> c_int;
    hipEventDestroy: fn(HipEvent) -> c_int;
    hipModuleLoadData: fn(*mut HipModule, *const c_void) -> c_int;
    hipModuleGetFunction: fn(*mut HipFunction, HipModule, *const c_char) -> c_int;
    hipModuleUnload: fn(HipModule) -> c_int;
    hipModuleGetGlobal: fn(*mut *mut c_void, *mut usize, HipModule, *const c_char) -> c_int;
    hipModuleLaunchKernel: fn(HipFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, HipStream, *mut *mut c_void, *mut *mut c_void) -> c_int;
    hipIpcGetMemHandle: fn(*mut hipIpcMemHandle_t, *mut c_void) -> c_int;
    hipIpcOpenMemHandle: fn(*mut *mut c_void, hipIpcMemHandle_t, c_uint) -> c_int;
    hipIpcCloseMemHandle: fn(*mut c_void) -> c_int;
}

/// Why the HIP runtime is not usable (kept so every later call reports the same cause).
enum LoadFailure {
    /// No library name loaded; the loader's last message.
    NotFound(String),
    /// `lib` loaded but lacks a function we need.
    Symbols(String),
    /// `lib` loaded, but `hipInit` failed: no AMD GPU or kernel driver.
    Init { lib: &'static str, rc: c_int },
}

/// The HIP table, loaded once; `Error::NoDriver` naming every path tried when absent.
pub(super) fn hip() -> Result<&'static Hip> {
    static HIP: OnceLock<std::result::Result<Hip, LoadFailure>> = OnceLock::new();
    let r = HIP.get_or_init(|| {
        let mut last = String::new();
        for name in LIB_NAMES {
            // SAFETY: loading the HIP runtime runs its initialisers, which have no preconditions.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => {
                    let hip =
                        Hip::load(lib, name).map_err(|e| LoadFailure::Symbols(e.to_string()))?;
                    // SAFETY: hipInit takes flags 0.
                    let rc = unsafe { (hip.hipInit)(0) };
                    if rc != super::conv::HIP_SUCCESS {
                        return Err(LoadFailure::Init { lib: name, rc });
                    }
                    return Ok(hip);
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(LoadFailure::NotFound(last))
    });
    match r {
        Ok(h) => Ok(h),
        Err(LoadFailure::NotFound(last)) => Err(Error::NoDriver {
            backend: "rocm",
            tried: LIB_NAMES.iter().map(|s| s.to_string()).collect(),
            detail: last.clone(),
        }),
        Err(LoadFailure::Symbols(msg)) => Err(Error::NoDriver {
            backend: "rocm",
            tried: LIB_NAMES.iter().map(|s| s.to_string()).collect(),
            detail: format!("a HIP runtime loaded but is unusable: {msg}"),
        }),
        Err(LoadFailure::Init { lib, rc }) => Err(Error::NoDriver {
            backend: "rocm",
            tried: vec![lib.to_string()],
            detail: format!("{lib} loaded, but hipInit returned {rc}: no AMD GPU or kernel driver"),
        }),
    }
}
