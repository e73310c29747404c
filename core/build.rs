//! Compiles the examples' own kernels (`examples/kernels/*.cu`) for the GPU backend of the
//! `cuda` or `rocm` feature and writes `OUT_DIR/example_kernels.rs`, which embeds them, as a
//! crate using mscclpp would for its kernels. The host backend compiles nothing.

use std::path::PathBuf;

use mscclpp_kernel_build::{compile_tree, kernels_dir, rerun_if_changed, write_index, Backend};

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let src = PathBuf::from(manifest).join("examples").join("kernels");
    let kernels = kernels_dir(1);
    rerun_if_changed(&[
        &src,
        &kernels.join("cuda").join("include"),
        &kernels.join("hip").join("include"),
    ]);
    let objects = compile_tree(Backend::from_features(), &kernels, &src, &out);
    write_index(&out.join("example_kernels.rs"), &objects);
}
