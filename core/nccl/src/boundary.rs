//! The C boundary: the guard every exported function runs its body in. An error is recorded
//! for `ncclGetLastError` (and, inside a group, for the group's end) and becomes its
//! `ncclResult_t`; a panic becomes `ncclInternalError`, never an unwind into C.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::abi::{self, NcclResult};
use crate::error::{set_last_error, NResult};
use crate::group;

/// Runs the body of exported function `call`: an error is recorded (prefixed with `call`)
/// and turned into its code; a panic becomes `ncclInternalError`.
pub fn guard(call: &'static str, body: impl FnOnce() -> NResult<NcclResult>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            let e = e.context(call);
            set_last_error(e.code, &e.msg);
            group::note_error(&e);
            e.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".to_string());
            set_last_error(
                abi::INTERNAL_ERROR,
                &format!("{call}: internal error (a panic was caught at the C boundary): {what}"),
            );
            abi::INTERNAL_ERROR
        }
    }
}

/// [`guard`] for the few functions that return a value instead of `ncclResult_t`: a panic
/// yields `fallback`.
pub fn guard_value<T>(call: &'static str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(_) => {
            set_last_error(
                abi::INTERNAL_ERROR,
                &format!("{call}: internal error (a panic was caught at the C boundary)"),
            );
            fallback
        }
    }
}
