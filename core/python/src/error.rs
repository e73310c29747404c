//! `mscclpp.MscclppError` and the conversion of the library's errors into it.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

pyo3::create_exception!(
    mscclpp,
    MscclppError,
    PyRuntimeError,
    "An error of the mscclpp library: its message says what came and what was expected; \
     `code` names its kind (InvalidUsage, Timeout, RemoteError, SystemError, InternalError, \
     Aborted, ExecutorError)."
);

/// A `MscclppError` with `msg` and `code`.
pub fn new_error(code: &str, msg: impl Into<String>) -> PyErr {
    let err = MscclppError::new_err(msg.into());
    Python::attach(|py| {
        // Best effort: an exception without `.code` still carries the message.
        let _ = err.value(py).setattr("code", code);
    });
    err
}

/// An invalid-argument `MscclppError` (code `InvalidUsage`).
pub fn invalid(msg: impl Into<String>) -> PyErr {
    new_error("InvalidUsage", msg)
}

/// The library's error as a `MscclppError`.
pub fn from_lib(e: mscclpp::Error) -> PyErr {
    new_error(&format!("{:?}", e.code()), e.to_string())
}

/// `map_err(from_lib)` for the library's results.
pub trait ResultExt<T> {
    /// The result with its error as a `MscclppError`.
    fn py(self) -> PyResult<T>;
    /// As [`ResultExt::py`], the message prefixed with `what: `.
    fn py_ctx(self, what: &str) -> PyResult<T>;
}

impl<T> ResultExt<T> for mscclpp::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(from_lib)
    }
    fn py_ctx(self, what: &str) -> PyResult<T> {
        self.map_err(|e| new_error(&format!("{:?}", e.code()), format!("{what}: {e}")))
    }
}
