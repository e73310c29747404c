//! Builds and runs a layout dump program of kernels/cuda/tests with the host C++ compiler, for
//! the tests that compare `#[repr(C)]` structs with the C headers.

use std::path::PathBuf;
use std::process::Command;

/// Compiles kernels/cuda/tests/`name`.cpp against kernels/cuda/include with `$CXX` (else
/// `c++`) into this test's temporary folder, runs it and returns its standard output. Panics
/// when the compiler or the program fails.
pub fn run(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let src = root.join(format!("kernels/cuda/tests/{name}.cpp"));
    let inc = root.join("kernels/cuda/include");
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let status = Command::new(&cxx)
        .args(["-std=c++17", "-O0", "-I"])
        .arg(&inc)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| {
            panic!("running the host C++ compiler `{cxx}` (set CXX to choose another): {e}")
        });
    assert!(
        status.success(),
        "`{cxx}` failed to compile {}",
        src.display()
    );
    let out = Command::new(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    assert!(out.status.success(), "{name} exited with {}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}
