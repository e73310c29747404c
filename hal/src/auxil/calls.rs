//! A count of GPU driver calls made by the calling thread, kept by the one choke point of each
//! GPU backend's result layer (`cuda/result.rs`, `rocm/result.rs`), so a test can assert that
//! an operation makes no driver call at all (e.g. NVLS entry points while NVLS is disabled).
//!
//! Per thread, so the count costs one thread-local add per call and no shared cache line,
//! and so work on other threads (a proxy, another test) does not disturb a measurement.

use std::cell::Cell;

thread_local! {
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

/// GPU driver calls the calling thread has made through the HAL since it started (always 0 on
/// the host backend). Take the difference around the code under test.
pub fn driver_calls_on_this_thread() -> u64 {
    CALLS.with(Cell::get)
}

/// Counts one driver call (called by the result layers only).
#[allow(dead_code)] // used only by the GPU backends
pub(crate) fn count_driver_call() {
    CALLS.with(|c| c.set(c.get().wrapping_add(1)));
}
