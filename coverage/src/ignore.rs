//! The `--ignore-filename-regex` given to `cargo llvm-cov report`.
//!
//! Excluded: test code (`tests/` folders, `tests.rs` modules, `benches/`), `examples/`, the
//! verbs test provider (`mp_tests/ibv-testprov`), the multi-process suites and their test kernels
//! (`mp_tests`, test code through and through), the kernel build helper (`hal/kernel-build`,
//! build-script code), the framework's self-test fixture binary (`framework/src/bin`,
//! `framework/fixtures`), the Python bindings (`core/python`, run by pytest, not by the
//! instrumented cargo runs), generated sources (build script `OUT_DIR`s, `.../build/<pkg>-<hash>/out/`),
//! and this crate. cargo-llvm-cov itself already leaves out dependencies and the standard
//! library. The pattern is a POSIX extended regex, as llvm-cov expects.

use std::path::Path;

/// Escape regex metacharacters so a path matches itself.
fn escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Workspace folders left out of the report, relative to the root.
pub const EXCLUDED_FOLDERS: &[&str] = &[
    "coverage",
    "hal/kernel-build",
    "mp_tests/ibv-testprov",
    "mp_tests",
    "framework/src/bin",
    "framework/fixtures",
    // The Python bindings run under pytest (core/python/test.sh), not in the instrumented
    // cargo runs: counted, they would only read 0 %.
    "core/python",
];

/// The regex for a workspace at `root`.
pub fn default_ignore_regex(root: &Path) -> String {
    let root = escape(root.to_string_lossy().trim_end_matches('/'));
    let folders = EXCLUDED_FOLDERS
        .iter()
        .map(|f| escape(f))
        .collect::<Vec<_>>()
        .join("|");
    format!("(^|/)(tests|examples|benches)/|/tests\\.rs$|/build/[^/]+/out/|^{root}/({folders})/")
}
