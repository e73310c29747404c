//! Compiles every `kernels/cuda/test_kernels/**/*.cu` for the HAL's GPU backend (read from
//! its build metadata `DEP_MSCCLPP_HAL_GPU`) and writes `OUT_DIR/kernels.rs`.

use mscclpp_kernel_build::{compile_tree, kernels_dir, rerun_if_changed, write_index, Backend};
use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-env-changed=DEP_MSCCLPP_HAL_GPU");
    let gpu = std::env::var("DEP_MSCCLPP_HAL_GPU").unwrap_or_else(|_| "host".into());
    let backend = Backend::from_name(&gpu)
        .unwrap_or_else(|| panic!("DEP_MSCCLPP_HAL_GPU: expected host, cuda or rocm, got {gpu:?}"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernels = kernels_dir(2);
    let src = kernels.join("cuda").join("test_kernels");
    rerun_if_changed(&[
        &src,
        &kernels.join("cuda").join("include"),
        &kernels.join("hip").join("include"),
    ]);
    let objects = compile_tree(backend, &kernels, &src, &out);
    write_index(&out.join("kernels.rs"), &objects);
}
