//! mlx5 Direct Verbs (`libmlx5.so`) loaded at run time, like libibverbs: nothing links it, and
//! every entry point is optional (a library without one simply lacks that feature).
//!
//! [`Mlx5Lib::load`] opens `MSCCLPP_MLX5_SO` when set (and only it). Otherwise it opens the
//! system `libmlx5.so.1` / `libmlx5.so`, but only when the verbs library is the system one too
//! (`MSCCLPP_IBV_SO` unset): the system mlx5 provider must never be handed objects of another
//! verbs library (a test provider).
//!
//! Used for Data Direct dma-buf registration: [`Mlx5Lib::data_direct_sysfs_path`] tells whether
//! a device has a Data Direct PCIe function, and [`ProtectionDomain::reg_dmabuf_mr_data_direct`]
//! registers through it (`MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT`).

use std::ffi::{c_char, c_int, OsStr};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys as sys;

use super::device::Context;
use super::{AccessFlags, IbvError, MemoryRegion, ProtectionDomain};

/// The environment variable naming the mlx5dv library to load.
pub const MLX5_SO_ENV: &str = crate::env::MLX5_SO;
const DEFAULT_CANDIDATES: [&str; 2] = ["libmlx5.so.1", "libmlx5.so"];
/// `MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT` (mlx5dv.h).
pub const MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT: c_int = 1;

// Prototypes from mlx5dv.h (rdma-core v55); no maintained crate binds mlx5dv, and the library
// is optional, so they are resolved at run time.
type GetDataDirectSysfsPath =
    unsafe extern "C" fn(*mut sys::ibv_context, *mut c_char, usize) -> c_int;
type RegDmabufMr = unsafe extern "C" fn(
    *mut sys::ibv_pd,
    u64,
    usize,
    u64,
    c_int,
    c_int,
    c_int,
) -> *mut sys::ibv_mr;
type IsSupported = unsafe extern "C" fn(*mut sys::ibv_device) -> bool;

/// The optional mlx5dv entry points of one opened library.
pub struct Mlx5Lib {
    path: String,
    get_data_direct_sysfs_path: Option<GetDataDirectSysfsPath>,
    reg_dmabuf_mr: Option<RegDmabufMr>,
    is_supported: Option<IsSupported>,
    _lib: libloading::Library,
}

impl std::fmt::Debug for Mlx5Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mlx5Lib")
            .field("path", &self.path)
            .field("data_direct", &self.get_data_direct_sysfs_path.is_some())
            .field("reg_dmabuf_mr", &self.reg_dmabuf_mr.is_some())
            .finish()
    }
}

impl Mlx5Lib {
    /// Loads mlx5dv as the module docs say: `Ok(None)` when there is none to load (not set and
    /// not the system verbs, or no system libmlx5); an error when `MSCCLPP_MLX5_SO` names a
    /// library that does not load.
    pub fn load() -> Result<Option<Arc<Mlx5Lib>>, IbvError> {
        let (mlx5, ibv) = (crate::env::mlx5_so(), crate::env::ibv_so());
        Self::load_with(
            mlx5.as_deref().map(Path::as_os_str),
            ibv.as_deref().map(Path::as_os_str),
        )
    }

    /// [`Mlx5Lib::load`] with the two variables' values given explicitly.
    pub fn load_with(
        mlx5_so: Option<&OsStr>,
        ibv_so: Option<&OsStr>,
    ) -> Result<Option<Arc<Mlx5Lib>>, IbvError> {
        if let Some(p) = mlx5_so.filter(|v| !v.is_empty()) {
            let path = PathBuf::from(p);
            // SAFETY: loading mlx5dv runs its initialisers; it is trusted native code named by
            // the user.
            return match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => Ok(Some(Arc::new(Self::resolve(
                    lib,
                    path.display().to_string(),
                )))),
                Err(e) => Err(IbvError::LibraryNotFound {
                    tried: vec![(path.display().to_string(), e.to_string())],
                }),
            };
        }
        if ibv_so.is_some_and(|v| !v.is_empty()) {
            return Ok(None);
        }
        for name in DEFAULT_CANDIDATES {
            // SAFETY: as above, the system mlx5 provider.
            if let Ok(lib) = unsafe { libloading::Library::new(name) } {
                return Ok(Some(Arc::new(Self::resolve(lib, name.to_string()))));
            }
        }
        Ok(None)
    }

    fn resolve(lib: libloading::Library, path: String) -> Mlx5Lib {
        const SYSFS: &[u8] = b"mlx5dv_get_data_direct_sysfs_path\0";
        // SAFETY: (each) the type matches the prototype in mlx5dv.h; a missing symbol is None.
        let get_data_direct_sysfs_path =
            unsafe { crate::optional_symbol::<GetDataDirectSysfsPath>(&lib, SYSFS) };
        // SAFETY: as above.
        let reg_dmabuf_mr =
            unsafe { crate::optional_symbol::<RegDmabufMr>(&lib, b"mlx5dv_reg_dmabuf_mr\0") };
        // SAFETY: as above.
        let is_supported =
            unsafe { crate::optional_symbol::<IsSupported>(&lib, b"mlx5dv_is_supported\0") };
        Mlx5Lib {
            path,
            get_data_direct_sysfs_path,
            reg_dmabuf_mr,
            is_supported,
            _lib: lib,
        }
    }

    /// The path the library was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether both Data Direct entry points are present.
    pub fn has_data_direct(&self) -> bool {
        self.get_data_direct_sysfs_path.is_some() && self.reg_dmabuf_mr.is_some()
    }

    /// `mlx5dv_is_supported` for the device of `ctx` (`None` when the library lacks it).
    pub fn is_mlx5(&self, ctx: &Context) -> Option<bool> {
        let f = self.is_supported?;
        // SAFETY: a live context's device pointer.
        Some(unsafe { f((*ctx.as_ptr()).device) })
    }

    /// `mlx5dv_get_data_direct_sysfs_path`: the sysfs path of the device's Data Direct
    /// function, or why there is none.
    pub fn data_direct_sysfs_path(&self, ctx: &Context) -> Result<String, IbvError> {
        let Some(f) = self.get_data_direct_sysfs_path else {
            return Err(IbvError::Unsupported {
                what: "mlx5dv_get_data_direct_sysfs_path",
                by: self.path.clone(),
            });
        };
        let mut buf = vec![0 as c_char; 4096];
        // SAFETY: live context; the buffer holds buf.len() chars.
        let ret = unsafe { f(ctx.as_ptr(), buf.as_mut_ptr(), buf.len()) };
        if ret != 0 {
            return Err(IbvError::from_ret("mlx5dv_get_data_direct_sysfs_path", ret));
        }
        let bytes: Vec<u8> = buf
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl ProtectionDomain {
    /// `mlx5dv_reg_dmabuf_mr(.., MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT)`: like
    /// [`ProtectionDomain::reg_dmabuf_mr`], through the device's Data Direct function.
    ///
    /// # Safety
    /// As [`ProtectionDomain::reg_dmabuf_mr`]; `mlx5` must be the mlx5dv library of this PD's
    /// verbs library.
    pub unsafe fn reg_dmabuf_mr_data_direct(
        self: &Arc<Self>,
        mlx5: &Mlx5Lib,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: AccessFlags,
    ) -> Result<MemoryRegion, IbvError> {
        let Some(f) = mlx5.reg_dmabuf_mr else {
            return Err(IbvError::Unsupported {
                what: "mlx5dv_reg_dmabuf_mr",
                by: mlx5.path.clone(),
            });
        };
        let access_int = access.as_c_int("mlx5dv_reg_dmabuf_mr")?;
        // SAFETY: live PD; the caller guarantees the dma-buf stays valid while registered.
        let raw = unsafe {
            f(
                self.as_ptr(),
                offset,
                len,
                iova,
                fd,
                access_int,
                MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| IbvError::from_errno("mlx5dv_reg_dmabuf_mr"))?;
        Ok(MemoryRegion::from_raw(self.clone(), raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_mlx5_is_not_loaded_next_to_another_verbs_library() {
        let got = Mlx5Lib::load_with(None, Some(OsStr::new("/some/testprov.so")))
            .expect("no explicit library: not an error");
        assert!(got.is_none());
    }

    #[test]
    fn a_named_library_that_does_not_load_is_an_error_naming_it() {
        let err = Mlx5Lib::load_with(Some(OsStr::new("/nonexistent/libmlx5.so")), None)
            .expect_err("missing library");
        assert!(err.to_string().contains("/nonexistent/libmlx5.so"), "{err}");
    }

    #[test]
    fn a_library_without_mlx5dv_symbols_has_no_data_direct() {
        let lib = Mlx5Lib::load_with(Some(OsStr::new("libc.so.6")), None)
            .expect("libc loads")
            .expect("named library");
        assert!(!lib.has_data_direct());
    }
}
