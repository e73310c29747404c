//! Errors of the NCCL interface: an `ncclResult_t` code plus a message, and the process-wide
//! "last error" that `ncclGetLastError` returns (recorded by the C boundary's guard).

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::sync::Mutex;

use mscclpp::ErrorCode;

use crate::abi::{self, NcclResult};

/// A failed call: the code the C caller gets and the message `ncclGetLastError` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclError {
    /// The `ncclResult_t`.
    pub code: NcclResult,
    /// What went wrong and what was expected.
    pub msg: String,
}

/// `Result` of this crate.
pub type NResult<T> = std::result::Result<T, NcclError>;

impl NcclError {
    /// `ncclInvalidArgument` with `msg`.
    pub fn arg(msg: impl Into<String>) -> NcclError {
        NcclError {
            code: abi::INVALID_ARGUMENT,
            msg: msg.into(),
        }
    }
    /// `ncclInvalidUsage` with `msg`.
    pub fn usage(msg: impl Into<String>) -> NcclError {
        NcclError {
            code: abi::INVALID_USAGE,
            msg: msg.into(),
        }
    }
    /// `ncclInternalError` with `msg`.
    pub fn internal(msg: impl Into<String>) -> NcclError {
        NcclError {
            code: abi::INTERNAL_ERROR,
            msg: msg.into(),
        }
    }
    /// `ncclRemoteError` with `msg`.
    pub fn remote(msg: impl Into<String>) -> NcclError {
        NcclError {
            code: abi::REMOTE_ERROR,
            msg: msg.into(),
        }
    }
    /// `ncclSystemError` with `msg`.
    pub fn system(msg: impl Into<String>) -> NcclError {
        NcclError {
            code: abi::SYSTEM_ERROR,
            msg: msg.into(),
        }
    }
    /// This error with `what: ` in front of its message.
    pub fn context(mut self, what: impl std::fmt::Display) -> NcclError {
        self.msg = format!("{what}: {}", self.msg);
        self
    }
}

/// The NCCL code for an error of the core library: bad input -> `ncclInvalidUsage`, a peer
/// that failed, left or never answered -> `ncclRemoteError`, a driver failure on a GPU build
/// -> `ncclUnhandledCudaError`, the operating system -> `ncclSystemError`.
pub fn code_of(e: &mscclpp::Error) -> NcclResult {
    match e.code() {
        ErrorCode::InvalidUsage => abi::INVALID_USAGE,
        ErrorCode::RemoteError | ErrorCode::Timeout | ErrorCode::Aborted => abi::REMOTE_ERROR,
        ErrorCode::SystemError => match e {
            mscclpp::Error::Hal { .. } if !crate::HOST_BACKEND => abi::UNHANDLED_CUDA_ERROR,
            _ => abi::SYSTEM_ERROR,
        },
        ErrorCode::InternalError | ErrorCode::ExecutorError => abi::INTERNAL_ERROR,
    }
}

impl From<mscclpp::Error> for NcclError {
    fn from(e: mscclpp::Error) -> NcclError {
        NcclError {
            code: code_of(&e),
            msg: e.to_string(),
        }
    }
}

/// `ncclGetErrorString`: NCCL's text for a result code, with no detail (the detail of the last
/// failure is `ncclGetLastError`'s, and the log's: WARN for system, remote and internal errors,
/// INFO for bad arguments and usage).
pub fn result_string(r: NcclResult) -> &'static std::ffi::CStr {
    match r {
        abi::SUCCESS => c"no error",
        abi::UNHANDLED_CUDA_ERROR => c"unhandled cuda error",
        abi::SYSTEM_ERROR => c"unhandled system error",
        abi::INTERNAL_ERROR => c"internal error",
        abi::INVALID_ARGUMENT => c"invalid argument",
        abi::INVALID_USAGE => c"invalid usage",
        abi::REMOTE_ERROR => c"remote process exited or there was a network error",
        abi::IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

thread_local! {
    /// The copy of the last error that this thread's `ncclGetLastError` pointer points into;
    /// replaced only by this thread's next call, so the pointer stays valid meanwhile.
    static LAST_ERROR_COPY: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as the last error and logs it.
pub fn set_last_error(code: NcclResult, msg: &str) {
    let level_warn = !matches!(code, abi::INVALID_ARGUMENT | abi::INVALID_USAGE);
    if level_warn {
        mscclpp::log_warn!("NCCL", "{msg}");
    } else {
        mscclpp::log_info!("NCCL", "{msg}");
    }
    let mut g = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    g.clear();
    g.push_str(msg);
}

/// The last error's message as a C string owned by the calling thread.
pub fn last_error_ptr() -> *const c_char {
    let text = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()).clone();
    // Interior NULs cannot come from our messages, but a path in one could hold one.
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR_COPY.with(|slot| {
        let mut slot = slot.borrow_mut();
        *slot = c;
        slot.as_ptr()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_strings_are_nccls_without_detail() {
        let cases = [
            (abi::SUCCESS, "no error"),
            (abi::UNHANDLED_CUDA_ERROR, "unhandled cuda error"),
            (abi::SYSTEM_ERROR, "unhandled system error"),
            (abi::INTERNAL_ERROR, "internal error"),
            (abi::INVALID_ARGUMENT, "invalid argument"),
            (abi::INVALID_USAGE, "invalid usage"),
            (
                abi::REMOTE_ERROR,
                "remote process exited or there was a network error",
            ),
            (abi::IN_PROGRESS, "NCCL operation in progress"),
            (12345, "unknown result code"),
        ];
        for (code, want) in cases {
            assert_eq!(result_string(code).to_str(), Ok(want), "code {code}");
        }
    }

    #[test]
    fn the_detail_is_the_last_errors() {
        set_last_error(
            abi::INVALID_USAGE,
            "ncclAllReduce: count 3 is not a multiple of 4",
        );
        // SAFETY: last_error_ptr returns a NUL-terminated string owned by this thread.
        let got = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert_eq!(
            got.to_str(),
            Ok("ncclAllReduce: count 3 is not a multiple of 4")
        );
    }
}
