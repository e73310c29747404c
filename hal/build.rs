//! Emits the backend cfg aliases once and publishes which GPU backend this build uses; compiles
//! no device code.
//!
//! cfgs: `hal_cuda` / `hal_rocm` (backend built), `hal_gpu_cuda` / `hal_gpu_rocm` /
//! `hal_gpu_host` (which backend `Gpu` names). The build metadata `gpu` (`DEP_MSCCLPP_HAL_GPU`
//! for dependents' build scripts; `cuda` wins when both features are on) names the GPU backend,
//! so each crate that launches kernels compiles them for the same vendor: `core/build.rs` the
//! library's (`kernels/cuda/src/`, named by `mscclpp::kernels`), mscclpp-test-kernels the test
//! kernels (`kernels/cuda/test_kernels/`); both through mscclpp-kernel-build.

use mscclpp_kernel_build::Backend;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
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
        println!("cargo::warning=both `cuda` and `rocm` are on: Gpu = Cuda and only CUDA kernels are compiled");
    }
}
