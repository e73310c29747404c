//! Passes the target and host triples to the crate's tests, which compile C programs against
//! include/nccl.h with the `cc` crate (it needs them outside a build script).
//!
//! Gives `libmscclpp_nccl.so` the SONAME `libmscclpp_nccl.so.<major>` (the workspace version's
//! major number), so a program linked against it records that name and an installed library
//! (`scripts/install.sh`: `.so.<version>` with the `.so.<major>` and `.so` links) can be
//! replaced by a compatible release. In the build tree `libmscclpp_nccl.so.<major>` is a link
//! to the library cargo writes, so programs linked there (the crate's C tests) still start.
use std::path::Path;

fn main() {
    for var in ["TARGET", "HOST"] {
        let v = std::env::var(var).unwrap_or_default();
        println!("cargo:rustc-env=MSCCLPP_NCCL_{var}={v}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    if !linux {
        return;
    }
    let soname = format!("libmscclpp_nccl.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    // OUT_DIR is <profile>/build/mscclpp-nccl-<hash>/out: the library lands in <profile> and
    // <profile>/deps (where the tests run from).
    let Some(out) = std::env::var_os("OUT_DIR") else {
        return;
    };
    let Some(profile) = Path::new(&out).ancestors().nth(3) else {
        return;
    };
    for dir in [profile.to_path_buf(), profile.join("deps")] {
        let link = dir.join(&soname);
        if dir.is_dir() && std::fs::symlink_metadata(&link).is_err() {
            // A missing link only costs LD_LIBRARY_PATH users of the build tree; say so.
            if let Err(e) = std::os::unix::fs::symlink("libmscclpp_nccl.so", &link) {
                println!("cargo:warning=could not link {}: {e}", link.display());
            }
        }
    }
}
