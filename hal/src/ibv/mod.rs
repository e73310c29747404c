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
    LibraryNotFound {
        /// Each candidate path that was tried, with the dynamic loader's error for it.
        tried: Vec<(String, String)>,
    },
    /// The library was opened but lacks a required symbol.
    #[error("{path} does not export required symbol `{symbol}`: {message}")]
    MissingSymbol {
        /// Path of the shared library that was opened.
        path: String,
        /// Name of the verbs function that could not be resolved.
        symbol: &'static str,
        /// The dynamic loader's error text.
        message: String,
    },
    /// A verbs call failed; `source` carries the errno it reported.
    #[error("{op} failed: {source}")]
    Call {
        /// Name of the verbs function that failed (e.g. `ibv_modify_qp`).
        op: &'static str,
        /// The OS error built from the errno the call returned or set.
        #[source]
        source: std::io::Error,
    },
    /// No device with the requested name.
    #[error("IB device `{name}` not found; available devices: {available:?}")]
    DeviceNotFound {
        /// The device name that was asked for (e.g. `mlx5_0`).
        name: String,
        /// Names of the devices `ibv_get_device_list` did report.
        available: Vec<String>,
    },
    /// The port exists but is not ACTIVE, or has no usable link layer / GID.
    #[error("port {port} of `{device}` is not usable: {reason}")]
    PortNotActive {
        /// Name of the IB device.
        device: String,
        /// The 1-based port number that was queried.
        port: u8,
        /// What is wrong with it (its state, link layer or GID).
        reason: String,
    },
    /// The library or device does not offer the requested feature.
    #[error("{what} is not supported by {by}")]
    Unsupported {
        /// The missing feature, usually the function name (e.g. `ibv_reg_dmabuf_mr`).
        what: &'static str,
        /// Path of the library (or name of the device) that lacks it.
        by: String,
    },
    /// An argument was out of range; the message names what was expected and what came.
    #[error("invalid argument to {op}: {reason}")]
    InvalidArgument {
        /// The function that rejected the argument.
        op: &'static str,
        /// What was expected and what was given.
        reason: String,
    },
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
