//! The HAL's one error type: every variant names the operation that failed.

use std::time::Duration;

/// Errors from every HAL backend.
///
/// Each variant names the operation (`op`) that failed. Conditions callers branch on
/// (`NoDriver`, `Unsupported`, `Timeout`, `PeerGone`) have their own variants.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A GPU driver call returned an error status.
    #[error("{op}: driver error {code} ({name})")]
    Driver {
        /// The driver call, e.g. `cuMemCreate`.
        op: &'static str,
        /// The raw status code.
        code: i64,
        /// The driver's name for the code, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
    },
    /// The GPU driver library could not be loaded.
    #[error("no {backend} driver: tried [{}]{}", tried.join(", "), if detail.is_empty() { String::new() } else { format!(" ({detail})") })]
    NoDriver {
        /// Backend name (`cuda`, `rocm`).
        backend: &'static str,
        /// Every library path that was tried.
        tried: Vec<String>,
        /// Extra detail (the loader's last message), may be empty.
        detail: String,
    },
    /// The backend or device cannot do this.
    #[error("{op} is not supported by the {backend} backend: {reason}")]
    Unsupported {
        /// The operation asked for.
        op: &'static str,
        /// Backend name.
        backend: &'static str,
        /// Why.
        reason: String,
    },
    /// A blocking wait ran past its limit.
    #[error("{op}: timed out after {waited:?}")]
    Timeout {
        /// What was waited on.
        op: &'static str,
        /// How long.
        waited: Duration,
    },
    /// An operating-system call failed.
    #[error("{op}: {source}")]
    Os {
        /// The call or step, e.g. `memfd_create`.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An argument was out of range or inconsistent.
    #[error("{op}: expected {expected}, got {got}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What was expected.
        expected: String,
        /// What came.
        got: String,
    },
    /// The work waited for may have ended its device waits early: the abort word
    /// ([`crate::abort`]) was raised while it ran, by an abort or by `peer`'s death.
    #[error("{op}: aborted{}: {why}", peer.map(|p| format!(" (rank {p} failed)")).unwrap_or_default())]
    Aborted {
        /// The synchronisation that saw it.
        op: &'static str,
        /// The rank whose death raised the word (`None`: an abort call).
        peer: Option<usize>,
        /// What raised it.
        why: String,
    },
    /// IPC descriptor bytes could not be decoded.
    #[error("bad IPC descriptor: {0}")]
    BadDescriptor(String),
    /// The exporting process of an IPC handle is gone or refused the request.
    #[error("{op}: exporter pid {pid} is unreachable: {reason}")]
    PeerGone {
        /// The operation.
        op: &'static str,
        /// Exporter pid.
        pid: u32,
        /// What happened.
        reason: String,
    },
    /// A symbol was missing from a dynamically loaded library.
    #[error("{library}: missing symbol {symbol}: {reason}")]
    MissingSymbol {
        /// Library path.
        library: String,
        /// Symbol name.
        symbol: &'static str,
        /// Loader message.
        reason: String,
    },
    /// A multicast (NVLS) entry point was called while the environment disables NVLS
    /// (`MSCCLPP_FORCE_DISABLE_NVLS=1` or `NCCL_NVLS_ENABLE=0`); refused before any driver call.
    #[error("{op}: NVLS disabled by MSCCLPP_FORCE_DISABLE_NVLS/NCCL_NVLS_ENABLE (refused before any driver call; no multicast object is created while either disables NVLS)")]
    NvlsDisabled {
        /// The entry point that refused, e.g. `create_multicast(cuda)`.
        op: &'static str,
    },
    /// A failure inside an earlier `Drop` (a free or unmap), surfaced by the next fallible call.
    #[error("earlier release failed: {0}")]
    Deferred(Box<Error>),
}

/// `Result` with the HAL's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for an [`Error::InvalidArgument`].
    pub(crate) fn invalid(
        op: &'static str,
        expected: impl Into<String>,
        got: impl Into<String>,
    ) -> Self {
        Error::InvalidArgument {
            op,
            expected: expected.into(),
            got: got.into(),
        }
    }
}
