//! libibverbs loaded at run time, with thin owning wrappers for the verbs the core uses.
//!
//! # What this layer promises
//!
//! * [`IbvLib::load`] opens `MSCCLPP_IBV_SO` when that variable is set (and only it), otherwise
//!   `libibverbs.so`, then `libibverbs.so.1`. Nothing links against libibverbs at build time, so
//!   binaries start on machines without it; a failed load names every path tried with the
//!   loader's message for each.
//! * Exported verbs are resolved once into function pointers ([`IbvLib`]); the `static inline`
//!   data-path verbs of `verbs.h` (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) are written
//!   once, in [`inline`], and go through the context's `ops` table exactly like the C inlines.
//! * Owning wrappers ([`Context`], [`ProtectionDomain`], [`MemoryRegion`], [`CompletionQueue`],
//!   [`QueuePair`]) hold an `Arc` of their parent, so a child can never outlive what it was
//!   created from (context -> pd -> mr/qp, context -> cq, qp -> cq).
//! * Types and constants come from `ibverbs-sys` (bindgen of rdma-core v55), re-exported as
//!   [`sys`].
//!
//! # What it leaves to the caller
//!
//! * Choosing a device, port and GID index, exchanging QP numbers/GIDs/rkeys with the peer, and
//!   deciding what a failed completion means. [`Context::first_active_port`] is a convenience
//!   for the usual "first ACTIVE port with a valid GID" rule.
//! * Keeping registered memory alive while its [`MemoryRegion`] lives (see
//!   [`ProtectionDomain::reg_mr`]).
//!
//! Immediate data: [`SendOp::WriteWithImm`] takes the value in host order and puts it on the
//! wire in network order (as `verbs.h` expects); [`WorkCompletion::imm_data`] converts back.

mod conv;
mod cq;
mod device;
pub mod inline;
mod loader;
mod memory;
mod mlx5;
mod qp;

pub use ibverbs_sys as sys;

pub use conv::{wc_opcode_name, wc_status_name};
pub use cq::{CompletionQueue, WorkCompletion};
pub use device::{Context, DeviceAttr, Gid, PortAttr};
pub use loader::{IbvLib, IBV_SO_ENV};
pub use memory::{AccessFlags, MemoryRegion, ProtectionDomain};
pub use mlx5::{Mlx5Lib, MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT, MLX5_SO_ENV};
pub use qp::{QpCaps, QpState, QueuePair, RecvWr, RtrParams, RtsParams, SendOp, SendWr, Sge};

/// Errors of the run-time verbs layer.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum IbvError {
    /// No candidate library could be opened; `tried` holds `(path, loader message)` pairs.
    #[error("could not load libibverbs; tried {}", format_tried(.tried))]
    LibraryNotFound { tried: Vec<(String, String)> },
    /// The library was opened but lacks a required symbol.
    #[error("{path} does not export required symbol `{symbol}`: {message}")]
    MissingSymbol {
        path: String,
        symbol: &'static str,
        message: String,
    },
    /// A verbs call failed; `source` carries the errno it reported.
    #[error("{op} failed: {source}")]
    Call {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// No device with the requested name.
    #[error("IB device `{name}` not found; available devices: {available:?}")]
    DeviceNotFound {
        name: String,
        available: Vec<String>,
    },
    /// The port exists but is not ACTIVE, or has no usable link layer / GID.
    #[error("port {port} of `{device}` is not usable: {reason}")]
    PortNotActive {
        device: String,
        port: u8,
        reason: String,
    },
    /// The library or device does not offer the requested feature.
    #[error("{what} is not supported by {by}")]
    Unsupported { what: &'static str, by: String },
    /// An argument was out of range; the message names what was expected and what came.
    #[error("invalid argument to {op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },
}

fn format_tried(tried: &[(String, String)]) -> String {
    tried
        .iter()
        .map(|(path, msg)| format!("`{path}` ({msg})"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl IbvError {
    /// Builds [`IbvError::Call`] from a returned error code (positive errno, or negative errno,
    /// or -1 meaning "look at errno").
    pub(crate) fn from_ret(op: &'static str, ret: i32) -> Self {
        let source = if ret == -1 || ret == 0 {
            std::io::Error::last_os_error()
        } else {
            std::io::Error::from_raw_os_error(ret.abs())
        };
        IbvError::Call { op, source }
    }

    /// Builds [`IbvError::Call`] from the current `errno` (after a call returned NULL).
    pub(crate) fn from_errno(op: &'static str) -> Self {
        IbvError::Call {
            op,
            source: std::io::Error::last_os_error(),
        }
    }
}
