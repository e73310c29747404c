//! CUDA status codes to [`Error`], and the driver-presence check done before the first call.

use crate::{Error, Result};
use cudarc::driver::sys;
use std::sync::OnceLock;

/// Turns a `CUresult` into `Ok` or an [`Error::Driver`] naming `op`.
pub(super) fn check(op: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver {
            op,
            code: r as i64,
            name: format!("{r:?}"),
        })
    }
}

/// Loads libcuda (checked first, so a missing driver is an error and not a panic) and runs
/// `cuInit` once per process.
pub(super) fn ensure_driver() -> Result<()> {
    static READY: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let r = READY.get_or_init(|| {
        // SAFETY: only tries to dlopen the candidate library names.
        if !unsafe { sys::is_culib_present() } {
            return Err(String::new());
        }
        // SAFETY: cuInit has no preconditions; the library is present.
        check("cuInit", unsafe { sys::cuInit(0) }).map_err(|e| e.to_string())
    });
    match r {
        Ok(()) => Ok(()),
        Err(msg) if msg.is_empty() => Err(Error::NoDriver {
            backend: "cuda",
            tried: ["cuda", "nvcuda"]
                .iter()
                .flat_map(|n| cudarc::get_lib_name_candidates(n))
                .collect(),
            detail: "is the NVIDIA driver installed?".into(),
        }),
        Err(msg) => Err(Error::NoDriver {
            backend: "cuda",
            tried: vec!["libcuda (loaded)".into()],
            detail: msg.clone(),
        }),
    }
}
