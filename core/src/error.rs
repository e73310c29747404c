//! The one error type of the `mscclpp` crate, with upstream MSCCL++'s error codes.
//!
//! Every variant names the operation that failed and carries enough context (peer rank,
//! address, the value that came and what was expected) to act on the message without a
//! debugger. Callers that need to branch use [`Error::code`].

use std::time::Duration;

/// Upstream MSCCL++'s error codes (`mscclpp::ErrorCode`): the coarse class of an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The operating system refused something (socket, file, memory map).
    SystemError,
    /// A bug or a broken invariant inside this library.
    InternalError,
    /// A peer failed, closed its connection or sent something malformed.
    RemoteError,
    /// The caller passed an invalid argument or configuration, or called out of order.
    InvalidUsage,
    /// A blocking operation did not complete within its timeout.
    Timeout,
    /// The operation was aborted (by the caller, or because the communicator shut down).
    Aborted,
    /// The executor (execution plans) failed.
    ExecutorError,
}

/// Errors of the `mscclpp` crate.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller passed an invalid argument, a malformed value or called out of order. The
    /// message says what came and what was expected.
    #[error("invalid usage: {0}")]
    InvalidUsage(String),

    /// `what` did not complete within `after`.
    #[error("timed out after {after:?}: {what}")]
    Timeout {
        /// The operation that timed out, naming the peer and address where there is one.
        what: String,
        /// The timeout that expired.
        after: Duration,
    },

    /// Rank `peer` failed, closed its connection or sent something malformed.
    #[error("remote rank {peer}: {what}")]
    Remote {
        /// The rank of the peer at fault.
        peer: usize,
        /// What happened, and what was expected instead.
        what: String,
    },

    /// An operating-system call failed.
    #[error("{op}: {source}")]
    Io {
        /// The operation, with its arguments (e.g. `bind 10.0.0.1:50000`).
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A broken invariant inside this library.
    #[error("internal error: {0}")]
    Internal(String),

    /// The operation was aborted.
    #[error("aborted: {0}")]
    Aborted(String),

    /// The executor failed.
    #[error("executor error: {0}")]
    Executor(String),

    /// The hardware abstraction layer (GPU driver, IPC, verbs library) failed during `op`.
    #[error("{}", hal_message(.op, .source))]
    Hal {
        /// What this library was doing (e.g. `CudaIpc write`, `open GPU 1`).
        op: String,
        /// The HAL's error, with the driver's code and name.
        #[source]
        source: mscclpp_hal::Error,
    },
}

impl From<mscclpp_hal::Error> for Error {
    fn from(source: mscclpp_hal::Error) -> Self {
        Error::Hal {
            op: String::new(),
            source,
        }
    }
}

/// `op: source`, or just the HAL's message when no operation was named.
fn hal_message(op: &str, source: &mscclpp_hal::Error) -> String {
    if op.is_empty() {
        source.to_string()
    } else {
        format!("{op}: {source}")
    }
}

impl Error {
    /// The upstream error code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidUsage(_) => ErrorCode::InvalidUsage,
            Error::Timeout { .. } => ErrorCode::Timeout,
            Error::Remote { .. } => ErrorCode::RemoteError,
            Error::Io { .. } => ErrorCode::SystemError,
            Error::Internal(_) => ErrorCode::InternalError,
            Error::Aborted(_) => ErrorCode::Aborted,
            Error::Executor(_) => ErrorCode::ExecutorError,
            Error::Hal { source: e, .. } => match e {
                mscclpp_hal::Error::Timeout { .. } => ErrorCode::Timeout,
                mscclpp_hal::Error::InvalidArgument { .. }
                | mscclpp_hal::Error::BadDescriptor(_)
                | mscclpp_hal::Error::NvlsDisabled { .. } => ErrorCode::InvalidUsage,
                mscclpp_hal::Error::PeerGone { .. } => ErrorCode::RemoteError,
                mscclpp_hal::Error::Aborted { peer: Some(_), .. } => ErrorCode::RemoteError,
                mscclpp_hal::Error::Aborted { peer: None, .. } => ErrorCode::Aborted,
                _ => ErrorCode::SystemError,
            },
        }
    }

    /// An [`Error::Io`] for the operation `op`.
    pub fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            op: op.into(),
            source,
        }
    }

    /// An [`Error::InvalidUsage`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidUsage(msg.into())
    }

    /// An [`Error::Timeout`].
    pub fn timeout(what: impl Into<String>, after: Duration) -> Self {
        Error::Timeout {
            what: what.into(),
            after,
        }
    }

    /// An [`Error::Remote`].
    pub fn remote(peer: usize, what: impl Into<String>) -> Self {
        Error::Remote {
            peer,
            what: what.into(),
        }
    }

    /// The same error with `what` in front of its message, its class (and so its prefix, e.g.
    /// `invalid usage: `) kept once: `invalid usage: X=y: allreduce algorithm ...` rather than
    /// a new error around the old one's text (`invalid usage: X=y: invalid usage: ...`).
    pub fn context(self, what: impl std::fmt::Display) -> Self {
        // An unnamed operation (`op` empty: `From<hal::Error>`) becomes `what` itself.
        let add = |m: String| {
            if m.is_empty() {
                what.to_string()
            } else {
                format!("{what}: {m}")
            }
        };
        match self {
            Error::InvalidUsage(m) => Error::InvalidUsage(add(m)),
            Error::Timeout { what: w, after } => Error::Timeout {
                what: add(w),
                after,
            },
            Error::Remote { peer, what: w } => Error::Remote { peer, what: add(w) },
            Error::Io { op, source } => Error::Io {
                op: add(op),
                source,
            },
            Error::Internal(m) => Error::Internal(add(m)),
            Error::Aborted(m) => Error::Aborted(add(m)),
            Error::Executor(m) => Error::Executor(add(m)),
            Error::Hal { op, source } => Error::Hal {
                op: add(op),
                source,
            },
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages() {
        let e = Error::timeout(
            "connecting to rank 0 at 10.0.0.1:5000",
            Duration::from_secs(2),
        );
        assert_eq!(e.code(), ErrorCode::Timeout);
        assert_eq!(
            e.to_string(),
            "timed out after 2s: connecting to rank 0 at 10.0.0.1:5000"
        );
        let e = Error::remote(3, "connection closed");
        assert_eq!(e.code(), ErrorCode::RemoteError);
        assert_eq!(e.to_string(), "remote rank 3: connection closed");
        let e = Error::io(
            "bind 127.0.0.1:1",
            std::io::Error::from(std::io::ErrorKind::AddrInUse),
        );
        assert_eq!(e.code(), ErrorCode::SystemError);
        assert!(e.to_string().starts_with("bind 127.0.0.1:1: "));
        assert_eq!(Error::invalid("x").code(), ErrorCode::InvalidUsage);
        assert_eq!(Error::Internal("x".into()).code(), ErrorCode::InternalError);
        assert_eq!(Error::Aborted("x".into()).code(), ErrorCode::Aborted);
        assert_eq!(Error::Executor("x".into()).code(), ErrorCode::ExecutorError);
        let hal = mscclpp_hal::Error::Timeout {
            op: "stream sync",
            waited: Duration::from_secs(1),
        };
        let e: Error = hal.into();
        assert_eq!(e.code(), ErrorCode::Timeout);
        assert_eq!(e.to_string(), "stream sync: timed out after 1s");
        let e: Error = mscclpp_hal::Error::BadDescriptor("short".into()).into();
        assert_eq!(e.code(), ErrorCode::InvalidUsage);
    }

    #[test]
    fn context_prefixes_the_message_and_keeps_the_class_once() {
        let e = Error::invalid("allreduce algorithm 'bogus': expected one of a, b")
            .context("MSCCLPP_ALLREDUCE_ALGO=bogus");
        assert_eq!(e.code(), ErrorCode::InvalidUsage);
        assert_eq!(
            e.to_string(),
            "invalid usage: MSCCLPP_ALLREDUCE_ALGO=bogus: allreduce algorithm 'bogus': expected one of a, b"
        );
        let e = Error::timeout("recv", Duration::from_secs(1)).context("rank 2");
        assert_eq!(e.to_string(), "timed out after 1s: rank 2: recv");
        let e = Error::remote(1, "closed").context("allgather");
        assert_eq!(e.to_string(), "remote rank 1: allgather: closed");
        let e: Error = mscclpp_hal::Error::BadDescriptor("short".into()).into();
        let e = e.context("open handle");
        assert!(e.to_string().starts_with("open handle: "), "{e}");
        assert_eq!(e.code(), ErrorCode::InvalidUsage);
        let e = Error::io("", std::io::Error::from(std::io::ErrorKind::NotFound)).context("read x");
        assert!(e.to_string().starts_with("read x: "), "{e}");
        let e = Error::Executor("bad plan".into()).context("plan p.json");
        assert_eq!(e.to_string(), "executor error: plan p.json: bad plan");
    }
}
