//! Copies the device headers (kernels/cuda/include) into the Python package's source folder
//! (`python/mscclpp/include`, ignored by git), so maturin ships them in the wheel and
//! `mscclpp.get_include()` finds them.

use std::path::{Path, PathBuf};

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type()?.is_dir() {
            copy_dir(&src, &dst)?;
        } else if std::fs::read(&dst).ok() != Some(std::fs::read(&src)?) {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

fn main() {
    // At run time (cargo sets it for the build script), not env!: a build-script binary
    // compiled for one checkout may be reused for another sharing the target directory.
    let here =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let headers = here.join("../../kernels/cuda/include");
    println!("cargo:rerun-if-changed={}", headers.display());
    if let Err(e) = copy_dir(&headers, &here.join("python/mscclpp/include")) {
        panic!(
            "copying the device headers {} into the package: {e}",
            headers.display()
        );
    }
}
