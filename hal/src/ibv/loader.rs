//! Opening libibverbs at run time and resolving the exported verbs into function pointers.

use std::ffi::{c_int, c_void, OsStr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ibverbs_sys as sys;

use super::IbvError;

/// The environment variable naming the verbs library to load instead of the system one.
pub const IBV_SO_ENV: &str = crate::env::IBV_SO;

/// Default library names, tried in order when [`IBV_SO_ENV`] is not set.
const DEFAULT_CANDIDATES: [&str; 2] = ["libibverbs.so", "libibverbs.so.1"];

// Signatures of the exported libibverbs functions, resolved at run time with libloading (the
// library is optional and may be a test provider named by MSCCLPP_IBV_SO). ibverbs-sys gives
// the types but links libibverbs at build time, so these pointer types are written here.
type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut sys::ibv_device;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut sys::ibv_device);
type GetDeviceName = unsafe extern "C" fn(*mut sys::ibv_device) -> *const std::ffi::c_char;
type OpenDevice = unsafe extern "C" fn(*mut sys::ibv_device) -> *mut sys::ibv_context;
type CloseDevice = unsafe extern "C" fn(*mut sys::ibv_context) -> c_int;
type QueryDevice = unsafe extern "C" fn(*mut sys::ibv_context, *mut sys::ibv_device_attr) -> c_int;
/// The exported `ibv_query_port` is declared with the short compat struct; we always pass a
/// zeroed full `ibv_port_attr`, which is what every provider fills.
type QueryPort = unsafe extern "C" fn(*mut sys::ibv_context, u8, *mut sys::ibv_port_attr) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut sys::ibv_context, u8, c_int, *mut sys::ibv_gid) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut sys::ibv_context) -> *mut sys::ibv_pd;
type DeallocPd = unsafe extern "C" fn(*mut sys::ibv_pd) -> c_int;
type RegMr = unsafe extern "C" fn(*mut sys::ibv_pd, *mut c_void, usize, c_int) -> *mut sys::ibv_mr;
type RegDmabufMr =
    unsafe extern "C" fn(*mut sys::ibv_pd, u64, usize, u64, c_int, c_int) -> *mut sys::ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut sys::ibv_mr) -> c_int;
type CreateCq = unsafe extern "C" fn(
    *mut sys::ibv_context,
    c_int,
    *mut c_void,
    *mut sys::ibv_comp_channel,
    c_int,
) -> *mut sys::ibv_cq;
type DestroyCq = unsafe extern "C" fn(*mut sys::ibv_cq) -> c_int;
type CreateQp =
    unsafe extern "C" fn(*mut sys::ibv_pd, *mut sys::ibv_qp_init_attr) -> *mut sys::ibv_qp;
type ModifyQp = unsafe extern "C" fn(*mut sys::ibv_qp, *mut sys::ibv_qp_attr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut sys::ibv_qp) -> c_int;
type QueryQp = unsafe extern "C" fn(
    *mut sys::ibv_qp,
    *mut sys::ibv_qp_attr,
    c_int,
    *mut sys::ibv_qp_init_attr,
) -> c_int;

/// The exported verbs, resolved from one opened library.
///
/// The pointers stay valid while `_lib` is alive, which is as long as this value; every wrapper
/// object holds (indirectly) an `Arc<IbvLib>`.
pub struct IbvLib {
    path: String,
    pub(crate) get_device_list: GetDeviceList,
    pub(crate) free_device_list: FreeDeviceList,
    pub(crate) get_device_name: GetDeviceName,
    pub(crate) open_device: OpenDevice,
    pub(crate) close_device: CloseDevice,
    pub(crate) query_device: QueryDevice,
    pub(crate) query_port: QueryPort,
    pub(crate) query_gid: QueryGid,
    pub(crate) alloc_pd: AllocPd,
    pub(crate) dealloc_pd: DeallocPd,
    pub(crate) reg_mr: RegMr,
    pub(crate) reg_dmabuf_mr: Option<RegDmabufMr>,
    pub(crate) dereg_mr: DeregMr,
    pub(crate) create_cq: CreateCq,
    pub(crate) destroy_cq: DestroyCq,
    pub(crate) create_qp: CreateQp,
    pub(crate) modify_qp: ModifyQp,
    pub(crate) destroy_qp: DestroyQp,
    pub(crate) query_qp: QueryQp,
    _lib: libloading::Library,
}

impl std::fmt::Debug for IbvLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvLib")
            .field("path", &self.path)
            .field("dmabuf", &self.reg_dmabuf_mr.is_some())
            .finish()
    }
}

impl IbvLib {
    /// Loads libibverbs: `MSCCLPP_IBV_SO` if set (and only it), else `libibverbs.so`, else
    /// `libibverbs.so.1`. The error lists every path tried with each `dlopen` message.
    pub fn load() -> Result<Arc<IbvLib>, IbvError> {
        let env = crate::env::ibv_so();
        Self::load_candidates(&Self::candidates(env.as_deref().map(Path::as_os_str)))
    }

    /// The paths [`IbvLib::load`] tries for a given value of `MSCCLPP_IBV_SO`.
    pub fn candidates(env_value: Option<&OsStr>) -> Vec<PathBuf> {
        match env_value {
            Some(v) if !v.is_empty() => vec![PathBuf::from(v)],
            _ => DEFAULT_CANDIDATES.iter().map(PathBuf::from).collect(),
        }
    }

    /// Opens the first candidate that loads and resolves the verbs from it. A library that
    /// opens but lacks a required symbol is an error at once (not a reason to try the next).
    pub fn load_candidates(candidates: &[PathBuf]) -> Result<Arc<IbvLib>, IbvError> {
        let mut tried = Vec::new();
        for path in candidates {
            // SAFETY: loading a shared library runs its initialisers; libibverbs (or a provider
            // standing in for it) is trusted native code, exactly as if it were linked.
            match unsafe { libloading::Library::new(path) } {
                Ok(lib) => return Self::resolve(lib, path.display().to_string()).map(Arc::new),
                Err(e) => tried.push((path.display().to_string(), e.to_string())),
            }
        }
        Err(IbvError::LibraryNotFound { tried })
    }

    fn resolve(lib: libloading::Library, path: String) -> Result<IbvLib, IbvError> {
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol is one of libibverbs' exported C functions and the type
                // alias it is read as matches its prototype in verbs.h (rdma-core v55).
                match unsafe { lib.get(concat!($name, "\0").as_bytes()) } {
                    Ok(s) => *s,
                    Err(e) => {
                        return Err(IbvError::MissingSymbol {
                            path: path.clone(),
                            symbol: $name,
                            message: e.to_string(),
                        })
                    }
                }
            }};
        }
        // SAFETY: as above; ibv_reg_dmabuf_mr is optional (older libraries and test providers).
        let reg_dmabuf_mr: Option<RegDmabufMr> =
            unsafe { crate::optional_symbol::<RegDmabufMr>(&lib, b"ibv_reg_dmabuf_mr\0") };
        Ok(IbvLib {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_device: sym!("ibv_query_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            reg_dmabuf_mr,
            dereg_mr: sym!("ibv_dereg_mr"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            query_qp: sym!("ibv_query_qp"),
            path: path.clone(),
            _lib: lib,
        })
    }

    /// The path (or name) the library was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether the library exports `ibv_reg_dmabuf_mr`.
    pub fn has_dmabuf(&self) -> bool {
        self.reg_dmabuf_mr.is_some()
    }

    /// Runs `f` over the raw device list and frees the list afterwards.
    pub(super) fn with_device_list<R>(
        &self,
        f: impl FnOnce(&[*mut sys::ibv_device]) -> Result<R, IbvError>,
    ) -> Result<R, IbvError> {
        let mut n: c_int = 0;
        // SAFETY: ibv_get_device_list writes the count into `n` and returns a NULL-terminated
        // array (or NULL with errno set).
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            // Real libibverbs returns NULL (ENOSYS) when the kernel module is absent: that is
            // simply "no devices".
            return f(&[]);
        }
        let n = usize::try_from(n).unwrap_or(0);
        // SAFETY: the library returned `n` valid entries followed by NULL; the slice lives until
        // we free the list below.
        let devices = unsafe { std::slice::from_raw_parts(list, n) };
        let result = f(devices);
        // SAFETY: `list` came from ibv_get_device_list of this library and is freed once.
        unsafe { (self.free_device_list)(list) };
        result
    }

    pub(super) fn device_name(&self, dev: *mut sys::ibv_device) -> String {
        // SAFETY: `dev` is an entry of a live device list; the name is a NUL-terminated string
        // owned by the device.
        let p = unsafe { (self.get_device_name)(dev) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated, valid while the list is.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }

    /// Names of all devices, in the library's order. Empty when there are none (for example
    /// the system libibverbs on a machine without RDMA hardware).
    pub fn device_names(&self) -> Result<Vec<String>, IbvError> {
        self.with_device_list(|devs| Ok(devs.iter().map(|&d| self.device_name(d)).collect()))
    }
}
