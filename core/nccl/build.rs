//! Passes the target and host triples to the crate's tests, which compile C programs against
//! include/nccl.h with the `cc` crate (it needs them outside a build script).
fn main() {
    for var in ["TARGET", "HOST"] {
        let v = std::env::var(var).unwrap_or_default();
        println!("cargo:rustc-env=MSCCLPP_NCCL_{var}={v}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
