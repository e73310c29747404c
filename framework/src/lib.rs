//! `mscclpp-framework`: the in-house test framework that replaces GoogleTest for the
//! multi-process test binary `mp_unit_tests`.
//!
//! # Design
//!
//! **Registration.** `TEST!(Suite, Name, |ctx| ...)` and `PERF_TEST!` expand to an anonymous
//! `const _: () = { ... };` block holding the test function and a `#[used]` static function
//! pointer placed in the ELF `.init_array` section. The loader calls it before `main`; it
//! pushes a [`TestCase`] `{ suite, name, file, line, is_perf, body }` into a global
//! `Mutex<Vec<_>>`. No extra crates (no `ctor`, no `inventory`). Because the order in which
//! the loader runs those constructors is an implementation detail, the runner sorts the
//! registry by `(file, line)`: the run order depends only on the binary, so every rank of an
//! `mpirun` job runs the same tests in the same order, which the verdict exchange relies on.
//! (Linux/ELF only, which is all this project targets.)
//!
//! **Fixtures.** The form `|ctx, fx: &mut Suite|` runs `Suite::setup(ctx)` (a [`Fixture`]),
//! then the body, then `teardown`. Setup failure fails the test and skips teardown; once
//! setup succeeded teardown always runs, whether the body passed, failed, panicked or skipped.
//!
//! **Assertions.** `EXPECT_*!` record a failure and continue; `ASSERT_*!`, `FAIL!` and
//! `SKIP!` also end the test. Failures go into a process-global "current test" record (tests
//! run one at a time), so they work from helper functions and from threads the test spawns.
//! The failure text is printed as it is recorded, in gtest's layout
//! (`file:line: Failure` / `Expected: a == b` / `Actual: 1 vs 2` / message): on rank 0 to
//! stdout, on other ranks to stderr with a `[rank R]` prefix. Ending a test is
//! `std::panic::resume_unwind` with a private payload: `resume_unwind` does not run the panic
//! hook, so it is silent, and the runner's `catch_unwind` recognises the payload. Any other
//! panic in the body is caught too and reported as a failure with its message and location;
//! the panic hook (installed once by [`run`]) stays silent for those on the runner thread and
//! delegates to the previous hook everywhere else.
//!
//! **Ranks.** The framework links no MPI. The binary hands [`run`] a [`World`] (rank, size,
//! and `combine`). After every selected test each rank calls `combine(local verdict)`; the
//! result ([`combine_verdicts`]: failed if any rank failed, else skipped if any skipped, else
//! passed) is what rank 0 prints and counts, so all ranks agree on counts and exit status and
//! stay in step test by test. [`Verdict::to_bytes`] is a small versioned, length-checked
//! format for shipping verdicts over a socket. A `combine` error (a peer gone) fails the test
//! and stops the run with exit 1 instead of hanging. [`SingleProcessWorld`] is rank 0 of 1.
//!
//! **Runner.** [`run`] parses the CLI (`--filter`, `--exclude-perf-tests`,
//! `--only-perf-tests`, `--list`, `--help`; anything else exits 2, and so does a selection that
//! matches no registered test), sets up the
//! [`Environment`]s in order (a failure exits 1), runs the tests, tears the environments down
//! in reverse, prints the `[   PERF   ]` block of perf results reported on rank 0, the list of
//! failed tests, and as the very last line `N passed, N failed, N skipped`. Every line is
//! flushed, as `mpirun` interleaves the ranks' output.
//!
//! ```no_run
//! use mscclpp_framework::*;
//! TEST!(Math, Adds, |ctx| { EXPECT_EQ!(1 + 1, 2, "on rank {}", ctx.rank()); });
//! fn main() { std::process::exit(run_main()); }
//! ```

// No unwrap() a peer, a file or the environment could make panic (tests may).
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod macros;
mod runner;
mod state;
mod verdict;

pub mod env;

pub use runner::{
    checked_selection, parse_args, run, run_main, select_tests, Environment, Filter, Options,
    PerfSelection, USAGE,
};
#[doc(hidden)]
pub use state::__private;
pub use state::{registered_tests, Fixture, PerfRecord, TestCase, TestContext};
pub use verdict::{combine_verdicts, SingleProcessWorld, Verdict, World};

pub use env::fuzz_cases;
