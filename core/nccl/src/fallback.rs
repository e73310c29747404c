//! The fallback: a real NCCL opened at run time from `MSCCLPP_NCCL_LIB_PATH` (libloading),
//! with a communicator of its own beside ours, for every operation the native paths do not
//! cover or `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION` sends there.
//!
//! The library is opened once per process with `RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND`, so
//! its internal calls of its own `nccl*` functions bind inside it, not to ours (which a
//! preload puts first in the global scope). It is never closed.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use crate::abi::{NcclConfig, NcclUniqueId, SUCCESS};
use crate::error::{NResult, NcclError};

/// `ncclComm_t` of the fallback library.
pub type Handle = *mut c_void;
/// `cudaStream_t`.
pub type Stream = *mut c_void;
type FnGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type FnGetUniqueId = unsafe extern "C" fn(*mut NcclUniqueId) -> c_int;
type FnInitRank = unsafe extern "C" fn(*mut Handle, c_int, NcclUniqueId, c_int) -> c_int;
type FnInitRankConfig =
    unsafe extern "C" fn(*mut Handle, c_int, NcclUniqueId, c_int, *mut NcclConfig) -> c_int;
type FnComm = unsafe extern "C" fn(Handle) -> c_int;
type FnGroup = unsafe extern "C" fn() -> c_int;
type FnErrStr = unsafe extern "C" fn(c_int) -> *const c_char;
type FnLastErr = unsafe extern "C" fn(Handle) -> *const c_char;
type FnAsyncErr = unsafe extern "C" fn(Handle, *mut c_int) -> c_int;
type FnPreMulSum = unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, Handle) -> c_int;
type FnOpDestroy = unsafe extern "C" fn(c_int, Handle) -> c_int;

/// The functions of a loaded NCCL that manage its communicators. Required ones are plain
/// pointers; the others are `None` when the library lacks them. The operations look up their
/// own functions ([`FallbackComm::function`]).
pub struct FallbackLib {
    lib: libloading::Library,
    /// Where it was loaded from.
    pub path: String,
    /// Its `ncclGetVersion`.
    pub version: c_int,
    get_unique_id: FnGetUniqueId,
    init_rank: FnInitRank,
    init_rank_config: Option<FnInitRankConfig>,
    destroy: FnComm,
    abort: Option<FnComm>,
    finalize: Option<FnComm>,
    group_start: FnGroup,
    group_end: FnGroup,
    error_string: Option<FnErrStr>,
    last_error: Option<FnLastErr>,
    async_error: Option<FnAsyncErr>,
    pre_mul_sum: Option<FnPreMulSum>,
    op_destroy: Option<FnOpDestroy>,
}

/// Copies the function `name` out of `lib`.
///
/// # Safety
/// `T` must be the function pointer type of `name`'s C declaration.
unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Option<T> {
    // SAFETY: the caller names the right type; the pointer stays valid because the library
    // is never unloaded (FallbackLib lives in a static).
    unsafe { lib.get::<T>(name.as_bytes()).ok().map(|s| *s) }
}

/// Whether addresses `a` and `b` lie in the same file mapped into this process (read from
/// `/proc/self/maps`): how the fallback recognises `MSCCLPP_NCCL_LIB_PATH` naming this very
/// library. `false` when the maps cannot be read.
fn same_object(a: usize, b: usize) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    // "start-end perms offset dev inode path": the (dev, inode) of the file mapping `addr`.
    let file_of = |addr: usize| {
        maps.lines().find_map(|line| {
            let mut f = line.split_whitespace();
            let (range, _perms, _offset) = (f.next()?, f.next()?, f.next()?);
            let (dev, inode) = (f.next()?, f.next()?);
            let (lo, hi) = range.split_once('-')?;
            let (lo, hi) = (
                usize::from_str_radix(lo, 16).ok()?,
                usize::from_str_radix(hi, 16).ok()?,
            );
            (lo <= addr && addr < hi && inode != "0").then_some((dev, inode))
        })
    };
    matches!((file_of(a), file_of(b)), (Some(x), Some(y)) if x == y)
}

fn need<T>(v: Option<T>, name: &str, path: &str) -> Result<T, String> {
    v.ok_or_else(|| format!("{path} has no {name}: expected an NCCL library (libnccl.so)"))
}

impl FallbackLib {
    fn load(path: &str) -> Result<FallbackLib, String> {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // RTLD_DEEPBIND (glibc): prefer the library's own symbols over the global scope.
        const RTLD_DEEPBIND: c_int = 0x0008;
        // SAFETY: loading runs the library's initializers; NCCL's are benign. The library is
        // never unloaded.
        let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND) }
            .map_err(|e| format!("dlopen failed: {e}"))?;
        let lib: libloading::Library = lib.into();
        // SAFETY: each name is paired with its nccl.h signature.
        unsafe {
            let get_version: FnGetVersion =
                need(sym(&lib, "ncclGetVersion"), "ncclGetVersion", path)?;
            let here: fn(usize, usize) -> bool = same_object;
            if same_object(get_version as usize, here as usize) {
                return Err(format!(
                    "{path} is libmscclpp_nccl itself: expected a real NCCL (libnccl.so.2)"
                ));
            }
            let mut version = 0;
            if get_version(&mut version) != SUCCESS {
                return Err(format!("{path}: ncclGetVersion failed"));
            }
            Ok(FallbackLib {
                path: path.to_string(),
                version,
                get_unique_id: need(sym(&lib, "ncclGetUniqueId"), "ncclGetUniqueId", path)?,
                init_rank: need(sym(&lib, "ncclCommInitRank"), "ncclCommInitRank", path)?,
                init_rank_config: sym(&lib, "ncclCommInitRankConfig"),
                destroy: need(sym(&lib, "ncclCommDestroy"), "ncclCommDestroy", path)?,
                abort: sym(&lib, "ncclCommAbort"),
                finalize: sym(&lib, "ncclCommFinalize"),
                group_start: need(sym(&lib, "ncclGroupStart"), "ncclGroupStart", path)?,
                group_end: need(sym(&lib, "ncclGroupEnd"), "ncclGroupEnd", path)?,
                error_string: sym(&lib, "ncclGetErrorString"),
                last_error: sym(&lib, "ncclGetLastError"),
                async_error: sym(&lib, "ncclCommGetAsyncError"),
                pre_mul_sum: sym(&lib, "ncclRedOpCreatePreMulSum"),
                op_destroy: sym(&lib, "ncclRedOpDestroy"),
                lib,
            })
        }
    }

    /// The process's fallback library: `None` when `MSCCLPP_NCCL_LIB_PATH` is unset, else
    /// the loaded library or why loading failed (tried once).
    pub fn get() -> Option<&'static Result<FallbackLib, String>> {
        static LIB: OnceLock<Option<Result<FallbackLib, String>>> = OnceLock::new();
        LIB.get_or_init(|| {
            let path = mscclpp::env()
                .nccl_lib_path()?
                .to_string_lossy()
                .into_owned();
            Some(FallbackLib::load(&path).map_err(|e| format!("MSCCLPP_NCCL_LIB_PATH={path}: {e}")))
        })
        .as_ref()
    }

    /// Turns the fallback's return code into a result naming `call`.
    pub fn check(&self, call: &str, comm: Handle, rc: c_int) -> NResult<()> {
        if rc == SUCCESS {
            return Ok(());
        }
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: NCCL returns NUL-terminated strings that live at least until its
                // next call on this thread.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // SAFETY: both take plain values; `comm` is the fallback's own handle or NULL.
        let what = self
            .error_string
            .map(|f| text(unsafe { f(rc) }))
            .unwrap_or_default();
        let last = self
            .last_error
            // SAFETY: as above.
            .map(|f| text(unsafe { f(comm) }))
            .unwrap_or_default();
        Err(NcclError {
            code: rc,
            msg: format!(
                "fallback NCCL ({}) {call} returned {rc} ({what}): {last}",
                self.path
            ),
        })
    }

    /// The fallback's `ncclGetUniqueId`.
    pub fn unique_id(&self) -> NResult<NcclUniqueId> {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a valid out pointer of the right type.
        let rc = unsafe { (self.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", std::ptr::null_mut(), rc)?;
        Ok(id)
    }

    /// A fallback communicator (blocking init, whatever the caller's config says).
    pub fn init(
        &'static self,
        nranks: usize,
        id: NcclUniqueId,
        rank: usize,
        config: Option<&NcclConfig>,
    ) -> NResult<FallbackComm> {
        let mut comm: Handle = std::ptr::null_mut();
        let (n, r) = (nranks as c_int, rank as c_int);
        let rc = match (config, self.init_rank_config) {
            (Some(cfg), Some(f)) => {
                let mut cfg = *cfg;
                cfg.blocking = 1;
                // SAFETY: `comm` and `cfg` are valid for the call.
                unsafe { f(&mut comm, n, id, r, &mut cfg) }
            }
            // SAFETY: `comm` is a valid out pointer.
            _ => unsafe { (self.init_rank)(&mut comm, n, id, r) },
        };
        self.check("ncclCommInitRank", std::ptr::null_mut(), rc)?;
        Ok(FallbackComm { lib: self, comm })
    }

    /// The fallback's `ncclGroupStart`.
    pub fn group_start(&self) -> NResult<()> {
        // SAFETY: no arguments.
        let rc = unsafe { (self.group_start)() };
        self.check("ncclGroupStart", std::ptr::null_mut(), rc)
    }

    /// The fallback's `ncclGroupEnd`.
    pub fn group_end(&self) -> NResult<()> {
        // SAFETY: no arguments.
        let rc = unsafe { (self.group_end)() };
        self.check("ncclGroupEnd", std::ptr::null_mut(), rc)
    }
}

/// A communicator of the fallback library.
pub struct FallbackComm {
    /// The library.
    pub lib: &'static FallbackLib,
    /// Its handle.
    pub comm: Handle,
}

// SAFETY: NCCL communicators may be used from any thread (one at a time per the NCCL rules,
// which the callers of this library follow for our communicator as well).
unsafe impl Send for FallbackComm {}
// SAFETY: as above; `FallbackComm` has no interior mutability of its own.
unsafe impl Sync for FallbackComm {}

impl FallbackComm {
    /// The library's function `name`, or `ncclInvalidUsage` naming it when it lacks it.
    ///
    /// # Safety
    /// `T` must be the function pointer type of `name`'s declaration in `nccl.h`.
    pub unsafe fn function<T: Copy>(&self, name: &str) -> NResult<T> {
        // SAFETY: the caller names the right type.
        unsafe { sym(&self.lib.lib, name) }.ok_or_else(|| {
            NcclError::usage(format!("the fallback NCCL {} has no {name}", self.lib.path))
        })
    }

    /// Turns a return code of a call on this communicator into a result.
    pub fn check(&self, call: &str, rc: c_int) -> NResult<()> {
        self.lib.check(call, self.comm, rc)
    }

    /// The fallback's `ncclCommFinalize`, when it has one.
    pub fn finalize(&self) -> NResult<()> {
        match self.lib.finalize {
            // SAFETY: our own live handle.
            Some(f) => self.check("ncclCommFinalize", unsafe { f(self.comm) }),
            None => Ok(()),
        }
    }

    /// The fallback's `ncclCommDestroy` (errors are logged: destroy cannot fail usefully).
    pub fn destroy(&self) {
        // SAFETY: our own live handle, destroyed once (the owner is being dropped).
        let rc = unsafe { (self.lib.destroy)(self.comm) };
        if let Err(e) = self.check("ncclCommDestroy", rc) {
            mscclpp::log_warn!("NCCL", "{}", e.msg);
        }
    }

    /// The fallback's `ncclCommAbort` (or destroy when it lacks one).
    pub fn abort(&self) {
        match self.lib.abort {
            Some(f) => {
                // SAFETY: our own live handle.
                let _ = unsafe { f(self.comm) };
            }
            None => self.destroy(),
        }
    }

    /// The fallback's asynchronous error, when it reports one.
    pub fn async_error(&self) -> c_int {
        let Some(f) = self.lib.async_error else {
            return SUCCESS;
        };
        let mut e = SUCCESS;
        // SAFETY: our own live handle and a valid out pointer.
        let rc = unsafe { f(self.comm, &mut e) };
        if rc != SUCCESS {
            rc
        } else {
            e
        }
    }

    /// The fallback's `ncclRedOpCreatePreMulSum`.
    ///
    /// # Safety
    /// `scalar` must be valid as NCCL documents for `residence`.
    pub unsafe fn pre_mul_sum(
        &self,
        scalar: *mut c_void,
        dtype: c_int,
        residence: c_int,
    ) -> NResult<c_int> {
        let f = self.lib.pre_mul_sum.ok_or_else(|| {
            NcclError::usage(format!("{} has no ncclRedOpCreatePreMulSum", self.lib.path))
        })?;
        let mut op = 0;
        // SAFETY: forwarded from the caller's contract.
        let rc = unsafe { f(&mut op, scalar, dtype, residence, self.comm) };
        self.check("ncclRedOpCreatePreMulSum", rc)?;
        Ok(op)
    }

    /// The fallback's `ncclRedOpDestroy`.
    pub fn op_destroy(&self, op: c_int) -> NResult<()> {
        let f = self.lib.op_destroy.ok_or_else(|| {
            NcclError::usage(format!("{} has no ncclRedOpDestroy", self.lib.path))
        })?;
        // SAFETY: plain values and our own handle.
        self.check("ncclRedOpDestroy", unsafe { f(op, self.comm) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_object_tells_this_binary_from_other_memory() {
        let a: fn(usize, usize) -> bool = same_object;
        let b: unsafe fn(&libloading::Library, &str) -> Option<usize> = sym::<usize>;
        assert!(same_object(a as usize, b as usize));
        let heap = Box::new(0u64);
        assert!(!same_object(a as usize, &*heap as *const u64 as usize));
    }
}
