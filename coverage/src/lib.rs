//! Coverage for mscclpp-rs: turn llvm-cov's lcov output into a per-crate table and a gate.
//!
//! The `coverage` binary (see `main.rs`) drives cargo-llvm-cov to produce `lcov.info` from the
//! workspace's unit tests and from `mp_unit_tests` under mpirun. This library holds the parts that
//! need no subprocess and are tested directly on small lcov fixtures:
//!
//! - [`lcov`]: normalise llvm-cov's lcov quirks so that lcov-parser 3.2 can read and merge it
//!   (missing trailing newline, missing `TN:`, counts above `u32::MAX`), then merge records.
//! - [`workspace`]: map source paths to workspace folders (`hal`, `core`, ...).
//! - [`summary`]: line and function counts per crate and overall, and the printed table.
//! - [`thresholds`]: the checked-in `thresholds.json` and the gate that compares a summary to it.
//! - [`show_env`]: parse `cargo llvm-cov show-env --export-prefix` output into variables.
//! - [`ignore`]: the `--ignore-filename-regex` that keeps tests, examples, the verbs test
//!   provider, generated bindings and this crate out of the report.
//!
//! What it promises: no input file can make it panic; every malformed input is an error that
//! names the file, the line and what was expected.

pub mod ignore;
pub mod lcov;
pub mod show_env;
pub mod summary;
pub mod thresholds;
pub mod workspace;

use std::path::PathBuf;

/// Everything that can go wrong in the library part of the coverage tool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoverageError {
    /// Reading or writing a file failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done (e.g. `reading`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        #[source]
        /// The cause.
        source: std::io::Error,
    },
    /// A line of an lcov file is not what lcov allows.
    #[error("{path}:{line}: {message}")]
    Lcov {
        /// The lcov file.
        path: String,
        /// The line number in it.
        line: usize,
        /// What is wrong with the line.
        message: String,
    },
    /// lcov-parser rejected the normalised input or could not merge records.
    #[error("lcov-parser could not merge {path}: {message}")]
    Merge {
        /// The lcov file.
        path: String,
        /// lcov-parser's message.
        message: String,
    },
    /// The thresholds config is unreadable or inconsistent.
    #[error("thresholds config {path}: {message}")]
    Config {
        /// The config file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// `cargo metadata` output did not have the expected shape.
    #[error("cargo metadata: {0}")]
    Metadata(String),
    /// `cargo llvm-cov show-env` output did not have the expected shape.
    #[error("cargo llvm-cov show-env output, line {line}: {message}")]
    ShowEnv {
        /// The line number in the output.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
}

pub use lcov::{load_report, normalise, Normalised};
pub use summary::{format_table, summarise, Counts, Summary};
pub use thresholds::{gate, GateFailure, Metric, Thresholds};
pub use workspace::CrateMap;
