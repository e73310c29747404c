//! GDRCopy (`libgdrapi.so`) loaded at run time: CPU mappings of GPU memory, used to forward
//! semaphore values into GPU memory from a host thread.
//!
//! [`Gdr::probe`] reports one [`GdrStatus`] with a message: `Ok` (with the open handle),
//! `NotBuilt` (a GPU backend GDRCopy does not serve: ROCm), `DisabledByEnv`
//! (`MSCCLPP_FORCE_DISABLE_GDR=1`), `DriverMissing` (no library loads: `MSCCLPP_GDRCOPY_SO`
//! when set, else `libgdrapi.so`, `libgdrapi.so.2`), `OpenFailed` (`gdr_open` returned NULL,
//! usually no `gdrdrv` module, or a required symbol is missing) and `DriverTooOld` (runtime or
//! driver older than [`GDR_MIN_VERSION`], or without the version calls of GDRCopy 2).
//! [`Gdr::open`] is the older form: `Ok(None)` when disabled or absent.

use std::ffi::{c_int, c_ulong, c_void};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Set to `1` to turn GDRCopy off even when the library is present.
pub const GDR_DISABLE_ENV: &str = crate::env::FORCE_DISABLE_GDR;
/// Library names tried, in order.
pub const GDR_CANDIDATES: [&str; 2] = ["libgdrapi.so", "libgdrapi.so.2"];
/// Set to a path to load that GDRCopy library (and only it).
pub const GDR_SO_ENV: &str = crate::env::GDRCOPY_SO;
/// The oldest GDRCopy runtime and driver used (major, minor): the 2.x `gdr_info_t` layout.
pub const GDR_MIN_VERSION: (i32, i32) = (2, 0);
/// GPU pages pinned by GDRCopy are 64 KiB.
pub const GPU_PAGE_SIZE: u64 = 1 << 16;

/// Errors of the GDRCopy layer.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum GdrError {
    /// The library was opened but lacks a required symbol.
    #[error("{path} does not export required symbol `{symbol}`: {message}")]
    MissingSymbol {
        /// Path of the shared library that was opened.
        path: String,
        /// Name of the `gdr_*` function that could not be resolved.
        symbol: &'static str,
        /// The dynamic loader's error text.
        message: String,
    },
    /// A GDRCopy call returned an error code.
    #[error("{op} failed with {code} (for GPU address {addr:#x}, {size} bytes)")]
    Call {
        /// Name of the GDRCopy function that failed (e.g. `gdr_pin_buffer`).
        op: &'static str,
        /// Its non-zero return code.
        code: i32,
        /// Device address of the buffer being pinned or mapped.
        addr: u64,
        /// Length of that buffer in bytes.
        size: usize,
    },
    /// `gdr_open` returned NULL (usually: the gdrdrv kernel module is not loaded).
    #[error("gdr_open failed (is the gdrdrv kernel module loaded?) using {path}")]
    OpenFailed {
        /// Path of the libgdrapi shared library whose `gdr_open` failed.
        path: String,
    },
    /// An argument was out of range.
    #[error("invalid argument to {op}: {reason}")]
    InvalidArgument {
        /// The function that rejected the argument.
        op: &'static str,
        /// What was expected and what was given.
        reason: String,
    },
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct GdrMh {
    h: c_ulong,
}

/// `gdr_info_t` (identical prefix in GDRCopy 2.x; the last field was `wc_mapping` in 1.x).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct GdrInfo {
    va: u64,
    mapped_size: u64,
    page_size: u32,
    tm_cycles: u64,
    cycles_per_ms: u32,
    mapped: u32,
    mapping_type: c_int,
}

// Signatures of libgdrapi (GDRCopy), resolved at run time with libloading: no maintained crate
// binds it, and the library is optional (absent on most machines).
type GdrOpen = unsafe extern "C" fn() -> *mut c_void;
type GdrClose = unsafe extern "C" fn(*mut c_void) -> c_int;
type GdrPin = unsafe extern "C" fn(*mut c_void, c_ulong, usize, u64, u32, *mut GdrMh) -> c_int;
type GdrUnpin = unsafe extern "C" fn(*mut c_void, GdrMh) -> c_int;
type GdrMap = unsafe extern "C" fn(*mut c_void, GdrMh, *mut *mut c_void, usize) -> c_int;
type GdrUnmap = unsafe extern "C" fn(*mut c_void, GdrMh, *mut c_void, usize) -> c_int;
type GdrGetInfo = unsafe extern "C" fn(*mut c_void, GdrMh, *mut GdrInfo) -> c_int;
type GdrRuntimeVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type GdrDriverVersion = unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> c_int;

/// Whether GDRCopy can be used in this process, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GdrStatus {
    /// Loaded and opened; mappings can be made.
    Ok,
    /// This build's GPU backend has no GDRCopy support (ROCm).
    NotBuilt,
    /// `MSCCLPP_FORCE_DISABLE_GDR` is set.
    DisabledByEnv,
    /// No GDRCopy library could be loaded.
    DriverMissing,
    /// The library loaded but could not be opened (`gdr_open` failed or a symbol is missing).
    OpenFailed,
    /// The runtime or the gdrdrv driver is older than [`GDR_MIN_VERSION`].
    DriverTooOld,
}

impl GdrStatus {
    /// A short name for logs (`ok`, `not built`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GdrStatus::Ok => "ok",
            GdrStatus::NotBuilt => "not built",
            GdrStatus::DisabledByEnv => "disabled by MSCCLPP_FORCE_DISABLE_GDR",
            GdrStatus::DriverMissing => "driver missing",
            GdrStatus::OpenFailed => "open failed",
            GdrStatus::DriverTooOld => "driver too old",
        }
    }
}

/// The outcome of [`Gdr::probe`]: a status, a message saying why, and the handle when `Ok`.
#[derive(Debug, Clone)]
pub struct GdrProbe {
    /// What was found.
    pub status: GdrStatus,
    /// Why (library path, versions, the failing call).
    pub message: String,
    /// The open handle (only with [`GdrStatus::Ok`]).
    pub gdr: Option<Gdr>,
}

struct GdrInner {
    handle: *mut c_void,
    close: GdrClose,
    pin: GdrPin,
    unpin: GdrUnpin,
    map: GdrMap,
    unmap: GdrUnmap,
    get_info: GdrGetInfo,
    runtime_version: Option<GdrRuntimeVersion>,
    driver_version: Option<GdrDriverVersion>,
    /// GDRCopy handles are not documented as thread-safe: serialise calls.
    lock: Mutex<()>,
    path: String,
    _lib: libloading::Library,
}

// Thread-safe: the handle is only used under `lock`; function pointers are plain code addresses.
thread_safe!(GdrInner);

impl Drop for GdrInner {
    fn drop(&mut self) {
        // SAFETY: the handle came from gdr_open and every mapping holding an Arc is gone.
        let ret = unsafe { (self.close)(self.handle) };
        if ret != 0 {
            log::warn!("gdr_close failed with {ret}");
        }
    }
}

/// An open GDRCopy handle (cheap to clone).
#[derive(Clone)]
pub struct Gdr {
    inner: Arc<GdrInner>,
}

impl std::fmt::Debug for Gdr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gdr")
            .field("path", &self.inner.path)
            .finish()
    }
}

/// Whether a value of `MSCCLPP_FORCE_DISABLE_GDR` turns GDRCopy off: a true value
/// ([`crate::env::parse_bool`]) and, failing closed, a malformed one.
pub fn disabled_by(value: Option<&str>) -> bool {
    !matches!(crate::env::parse_bool(GDR_DISABLE_ENV, value), Ok(false))
}

impl Gdr {
    /// Probes GDRCopy under this process's environment (`MSCCLPP_FORCE_DISABLE_GDR`,
    /// `MSCCLPP_GDRCOPY_SO`) and this build's GPU backend.
    pub fn probe() -> GdrProbe {
        let not_built =
            cfg!(hal_rocm).then_some("GDRCopy serves CUDA GPUs; this build's GPU backend is rocm");
        let so = crate::env::gdrcopy_so();
        Self::probe_switched(crate::env::force_disable_gdr(), so.as_deref(), not_built)
    }

    /// [`Gdr::probe`] with the parsed `MSCCLPP_FORCE_DISABLE_GDR` ([`crate::env::parse_bool`])
    /// given: a true value or a malformed one (fail closed, the message says why) reports
    /// `DisabledByEnv`; false probes the library `so` (or the default candidates) unless
    /// `not_built` says why this backend has none.
    pub fn probe_switched(
        disable: Result<bool, String>,
        so: Option<&std::path::Path>,
        not_built: Option<&str>,
    ) -> GdrProbe {
        match disable {
            Ok(true) => Self::probe_with(Some("1"), None, None),
            Ok(false) => Self::probe_with(None, so.map(std::path::Path::as_os_str), not_built),
            Err(e) => GdrProbe {
                status: GdrStatus::DisabledByEnv,
                message: format!("{GDR_DISABLE_ENV} is malformed, GDRCopy stays off: {e}"),
                gdr: None,
            },
        }
    }

    /// [`Gdr::probe`] with the inputs given: the two variables' values and, for a backend
    /// GDRCopy does not serve, why.
    pub fn probe_with(
        disable: Option<&str>,
        so: Option<&std::ffi::OsStr>,
        not_built: Option<&str>,
    ) -> GdrProbe {
        let fail = |status, message: String| GdrProbe {
            status,
            message,
            gdr: None,
        };
        if let Some(why) = not_built {
            return fail(GdrStatus::NotBuilt, why.to_string());
        }
        if disabled_by(disable) {
            return fail(
                GdrStatus::DisabledByEnv,
                format!("{GDR_DISABLE_ENV}={}", disable.unwrap_or_default()),
            );
        }
        let cands: Vec<PathBuf> = match so.filter(|v| !v.is_empty()) {
            Some(p) => vec![PathBuf::from(p)],
            None => GDR_CANDIDATES.iter().map(PathBuf::from).collect(),
        };
        let mut tried = Vec::new();
        for path in &cands {
            // SAFETY: loading GDRCopy runs its initialisers; it is trusted native code.
            match unsafe { libloading::Library::new(path) } {
                Ok(lib) => {
                    let p = path.display().to_string();
                    return match Self::resolve(lib, p.clone()) {
                        Ok(g) => match g.check_versions() {
                            Ok(v) => GdrProbe {
                                status: GdrStatus::Ok,
                                message: format!("{p}: {v}"),
                                gdr: Some(g),
                            },
                            Err(m) => fail(GdrStatus::DriverTooOld, format!("{p}: {m}")),
                        },
                        Err(e) => fail(GdrStatus::OpenFailed, e.to_string()),
                    };
                }
                Err(e) => tried.push(format!("`{}` ({e})", path.display())),
            }
        }
        fail(
            GdrStatus::DriverMissing,
            format!("no GDRCopy library loads; tried {}", tried.join(", ")),
        )
    }

    /// The runtime and driver versions when both are at least [`GDR_MIN_VERSION`].
    fn check_versions(&self) -> Result<String, String> {
        let g = &self.inner;
        let (Some(rt), Some(drv)) = (g.runtime_version, g.driver_version) else {
            return Err("no gdr_runtime_get_version / gdr_driver_get_version (GDRCopy 1.x)".into());
        };
        let (mut rmaj, mut rmin, mut dmaj, mut dmin) = (0, 0, 0, 0);
        let _guard = g.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: valid out pointers; the handle is open.
        let (a, b) = unsafe {
            (
                rt(&mut rmaj, &mut rmin),
                drv(g.handle, &mut dmaj, &mut dmin),
            )
        };
        if a != 0 || b != 0 {
            return Err(format!("version queries failed ({a}, {b})"));
        }
        let v = format!("runtime {rmaj}.{rmin}, driver {dmaj}.{dmin}");
        if (rmaj, rmin) < GDR_MIN_VERSION || (dmaj, dmin) < GDR_MIN_VERSION {
            return Err(format!(
                "{v}: expected at least {}.{}",
                GDR_MIN_VERSION.0, GDR_MIN_VERSION.1
            ));
        }
        Ok(v)
    }

    /// Opens GDRCopy: `None` when disabled by `MSCCLPP_FORCE_DISABLE_GDR=1` or when no
    /// candidate library loads.
    pub fn open() -> Result<Option<Gdr>, GdrError> {
        if !matches!(crate::env::force_disable_gdr(), Ok(false)) {
            return Ok(None);
        }
        let cands: Vec<PathBuf> = GDR_CANDIDATES.iter().map(PathBuf::from).collect();
        Self::open_with(None, &cands)
    }

    /// [`Gdr::open`] with the variable's value and the candidate paths given explicitly.
    pub fn open_with(
        disable: Option<&str>,
        candidates: &[PathBuf],
    ) -> Result<Option<Gdr>, GdrError> {
        if disabled_by(disable) {
            return Ok(None);
        }
        for path in candidates {
            // SAFETY: loading GDRCopy runs its initialisers; it is trusted native code.
            if let Ok(lib) = unsafe { libloading::Library::new(path) } {
                return Self::resolve(lib, path.display().to_string()).map(Some);
            }
        }
        Ok(None)
    }

    fn resolve(lib: libloading::Library, path: String) -> Result<Gdr, GdrError> {
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the type alias matches the prototype in gdrapi.h.
                match unsafe { lib.get(concat!($name, "\0").as_bytes()) } {
                    Ok(s) => *s,
                    Err(e) => {
                        return Err(GdrError::MissingSymbol {
                            path: path.clone(),
                            symbol: $name,
                            message: e.to_string(),
                        })
                    }
                }
            }};
        }
        let open: GdrOpen = sym!("gdr_open");
        let close: GdrClose = sym!("gdr_close");
        let pin: GdrPin = sym!("gdr_pin_buffer");
        let unpin: GdrUnpin = sym!("gdr_unpin_buffer");
        let map: GdrMap = sym!("gdr_map");
        let unmap: GdrUnmap = sym!("gdr_unmap");
        let get_info: GdrGetInfo = sym!("gdr_get_info");
        // SAFETY: as above; the version calls are GDRCopy 2 additions, optional here.
        let runtime_version = unsafe {
            crate::optional_symbol::<GdrRuntimeVersion>(&lib, b"gdr_runtime_get_version\0")
        };
        // SAFETY: as above.
        let driver_version = unsafe {
            crate::optional_symbol::<GdrDriverVersion>(&lib, b"gdr_driver_get_version\0")
        };
        // SAFETY: gdr_open takes no arguments and returns a handle or NULL.
        let handle = unsafe { open() };
        if handle.is_null() {
            return Err(GdrError::OpenFailed { path });
        }
        Ok(Gdr {
            inner: Arc::new(GdrInner {
                handle,
                close,
                pin,
                unpin,
                map,
                unmap,
                get_info,
                runtime_version,
                driver_version,
                lock: Mutex::new(()),
                path,
                _lib: lib,
            }),
        })
    }

    /// Pins and maps `size` bytes of GPU memory at `gpu_addr` into this process.
    ///
    /// # Safety
    /// `gpu_addr..gpu_addr+size` must be a live device allocation that outlives the mapping.
    pub unsafe fn map(&self, gpu_addr: u64, size: usize) -> Result<GdrMapping, GdrError> {
        if size == 0 {
            return Err(GdrError::InvalidArgument {
                op: "gdr_map",
                reason: "size 0".into(),
            });
        }
        let base = gpu_addr & !(GPU_PAGE_SIZE - 1);
        let end = (gpu_addr + size as u64).div_ceil(GPU_PAGE_SIZE) * GPU_PAGE_SIZE;
        let pin_size = (end - base) as usize;
        let g = &self.inner;
        let _guard = g.lock.lock().unwrap_or_else(|e| e.into_inner());
        let call = |op, code: c_int| GdrError::Call {
            op,
            code,
            addr: gpu_addr,
            size,
        };
        let mut mh = GdrMh::default();
        // SAFETY: open handle; the caller guarantees the range is a live allocation.
        let ret = unsafe { (g.pin)(g.handle, base as c_ulong, pin_size, 0, 0, &mut mh) };
        if ret != 0 {
            return Err(call("gdr_pin_buffer", ret));
        }
        let mut va: *mut c_void = std::ptr::null_mut();
        // SAFETY: `mh` was just pinned.
        let ret = unsafe { (g.map)(g.handle, mh, &mut va, pin_size) };
        if ret != 0 {
            // SAFETY: undo the pin.
            unsafe { (g.unpin)(g.handle, mh) };
            return Err(call("gdr_map", ret));
        }
        let mut info = GdrInfo::default();
        // SAFETY: `mh` is pinned and mapped.
        let ret = unsafe { (g.get_info)(g.handle, mh, &mut info) };
        if ret != 0 {
            // SAFETY: undo map and pin.
            unsafe {
                (g.unmap)(g.handle, mh, va, pin_size);
                (g.unpin)(g.handle, mh);
            }
            return Err(call("gdr_get_info", ret));
        }
        let offset = gpu_addr.wrapping_sub(info.va) as usize;
        Ok(GdrMapping {
            gdr: self.inner.clone(),
            mh,
            va,
            pin_size,
            ptr: va.cast::<u8>().wrapping_add(offset),
            size,
        })
    }
}

/// A CPU mapping of pinned GPU memory; unmapped and unpinned on drop.
pub struct GdrMapping {
    gdr: Arc<GdrInner>,
    mh: GdrMh,
    va: *mut c_void,
    pin_size: usize,
    ptr: *mut u8,
    size: usize,
}

// Thread-safe: the mapping is plain memory; GDRCopy calls are serialised by the handle's lock;
// writes go through volatile stores.
thread_safe!(GdrMapping);

impl GdrMapping {
    /// The CPU address of the GPU address that was mapped.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes requested.
    pub fn len(&self) -> usize {
        self.size
    }

    /// Whether the mapping is empty (never: `map` rejects size 0).
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Stores a u64 at `offset` (8-byte aligned) with release ordering towards the GPU.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<(), GdrError> {
        if !offset.is_multiple_of(8) || offset.checked_add(8).is_none_or(|e| e > self.size) {
            return Err(GdrError::InvalidArgument {
                op: "GdrMapping::store_u64",
                reason: format!(
                    "expected an aligned offset with 8 bytes inside {}, got {offset}",
                    self.size
                ),
            });
        }
        // Full fences (mfence on x86) on both sides: a release fence alone emits no instruction
        // on x86 and does not order write-combining stores to the BAR mapping.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: in bounds and aligned (checked above); the mapping lives as long as self.
        unsafe { std::ptr::write_volatile(self.ptr.add(offset).cast::<u64>(), value) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for GdrMapping {
    fn drop(&mut self) {
        let g = &self.gdr;
        let _guard = g.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: mapped and pinned by `Gdr::map`, released exactly once.
        let (a, b) = unsafe {
            (
                (g.unmap)(g.handle, self.mh, self.va, self.pin_size),
                (g.unpin)(g.handle, self.mh),
            )
        };
        if a != 0 || b != 0 {
            log::warn!("gdr_unmap/gdr_unpin_buffer failed ({a}, {b})");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_by_env_value() {
        assert!(disabled_by(Some("1")));
        assert!(!disabled_by(Some("0")));
        assert!(!disabled_by(None));
        let cands = vec![PathBuf::from("libgdrapi.so")];
        assert!(Gdr::open_with(Some("1"), &cands)
            .expect("disabled is not an error")
            .is_none());
    }

    #[test]
    fn absent_library_is_none() {
        let cands = vec![
            PathBuf::from("/nonexistent/libgdrapi.so"),
            PathBuf::from("/nonexistent/libgdrapi.so.2"),
        ];
        assert!(Gdr::open_with(None, &cands)
            .expect("absent is not an error")
            .is_none());
    }

    #[test]
    fn probe_reports_each_status_with_its_reason() {
        let p = Gdr::probe_with(Some("1"), None, None);
        assert_eq!(p.status, GdrStatus::DisabledByEnv);
        assert!(p.message.contains(GDR_DISABLE_ENV) && p.gdr.is_none());
        let p = Gdr::probe_with(
            None,
            Some(std::ffi::OsStr::new("/nonexistent/libgdrapi.so")),
            None,
        );
        assert_eq!(p.status, GdrStatus::DriverMissing);
        assert!(
            p.message.contains("/nonexistent/libgdrapi.so"),
            "{}",
            p.message
        );
        let p = Gdr::probe_with(None, Some(std::ffi::OsStr::new("libc.so.6")), None);
        assert_eq!(p.status, GdrStatus::OpenFailed);
        assert!(p.message.contains("gdr_open"), "{}", p.message);
        let p = Gdr::probe_with(None, None, Some("rocm"));
        assert_eq!(p.status, GdrStatus::NotBuilt);
    }

    #[test]
    fn library_without_symbols_is_an_error_naming_the_symbol() {
        // libc loads but has no gdr_open.
        let cands = vec![PathBuf::from("libc.so.6")];
        let err = Gdr::open_with(None, &cands).expect_err("missing symbols");
        assert!(err.to_string().contains("gdr_open"), "{err}");
    }
}
