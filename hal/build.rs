//! Emits the backend cfg aliases once and compiles the kernels the library launches.
//!
//! cfgs: `hal_cuda` / `hal_rocm` (backend built), `hal_gpu_cuda` / `hal_gpu_rocm` /
//! `hal_gpu_host` (which backend `Gpu` names). With `cuda` every `kernels/cuda/src/**/*.cu` is
//! compiled by nvcc into a fatbin; with `rocm` (and not `cuda`) the same sources by hipcc into
//! code objects (mscclpp-kernel-build does both). `OUT_DIR/kernels.rs` embeds them as
//! `KERNEL_OBJECTS`. Test kernels live in `kernels/cuda/test_kernels/` and are built by
//! mscclpp-test-kernels, never here. The build metadata `gpu` (`DEP_MSCCLPP_HAL_GPU` for
//! dependents' build scripts) names the GPU backend, so a dependent compiles its own device
//! code for the same vendor.

use mscclpp_kernel_build::{compile_tree, kernels_dir, rerun_if_changed, write_index, Backend};
use std::path::PathBuf;

fn main() {
    for cfg in [
        "hal_cuda",
        "hal_rocm",
        "hal_gpu_cuda",
        "hal_gpu_rocm",
        "hal_gpu_host",
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
    let rocm = std::env::var_os("CARGO_FEATURE_ROCM").is_some();
    if cuda {
        println!("cargo::rustc-cfg=hal_cuda");
    }
    if rocm {
        println!("cargo::rustc-cfg=hal_rocm");
    }
    let backend = Backend::from_flags(cuda, rocm);
    println!("cargo::rustc-cfg=hal_gpu_{}", backend.name());
    println!("cargo::metadata=gpu={}", backend.name());
    if cuda && rocm {
        println!("cargo::warning=both `cuda` and `rocm` are on: Gpu = Cuda and only CUDA kernels are embedded");
    }

    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernels = kernels_dir(1);
    let src = kernels.join("cuda").join("src");
    rerun_if_changed(&[
        &src,
        &kernels.join("cuda").join("include"),
        &kernels.join("hip").join("include"),
    ]);
    let objects = compile_tree(backend, &kernels, &src, &out);
    write_index(&out.join("kernels.rs"), &objects);
}
