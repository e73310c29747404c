//! The operations behind the exported collective and point-to-point functions: argument
//! checks, the routing decision (native, fallback, or an `ncclInvalidUsage` naming why), and
//! issuing the work.
//!
//! Routing depends only on the arguments, the environment and the communicator, so every
//! rank of a collective decides the same way (the environment must match across ranks).

use std::ffi::c_int;
use std::sync::Arc;

use crate::abi::{self, NcclResult};
use crate::comm::{lookup, Comm, Ready};
use crate::error::{NResult, NcclError};
use crate::group::{self, Pending};
use crate::native::CollArgs;
use crate::options::Op;
use crate::p2p::{Dir, P2pOp};

/// Where a call goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Our implementation.
    Native,
    /// The fallback NCCL.
    Fallback,
}

/// A point-to-point call as the caller made it (the fallback needs count and type).
#[derive(Clone, Copy, Debug)]
pub struct P2pCall {
    /// The bytes-level operation.
    pub op: P2pOp,
    /// NCCL's count.
    pub count: usize,
    /// `ncclDataType_t`.
    pub dtype: c_int,
    /// The caller's stream.
    pub stream: u64,
}

/// The comm behind `handle`, initialized.
pub fn ready_comm(handle: *const Comm) -> NResult<(Arc<Comm>, Arc<Ready>)> {
    let comm = lookup(handle)?;
    let ready = comm.ready()?;
    Ok((comm, ready))
}

/// Element size of `dtype`, or `ncclInvalidArgument`.
pub fn elem_size(dtype: c_int) -> NResult<usize> {
    abi::type_size(dtype).ok_or_else(|| {
        NcclError::arg(format!(
            "datatype {dtype}: expected an ncclDataType_t in 0..{} (ncclInt8 .. ncclFloat8e5m2)",
            abi::NUM_TYPES
        ))
    })
}

/// `count * size(dtype) * factor` bytes, or `ncclInvalidArgument` when it overflows.
pub fn byte_len(what: &str, count: usize, dtype: c_int, factor: usize) -> NResult<usize> {
    let size = elem_size(dtype)?;
    count
        .checked_mul(size)
        .and_then(|b| b.checked_mul(factor))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            NcclError::arg(format!(
                "{what}: count {count} of {} x {factor} overflows the address space: expected \
                 a count whose byte size fits in isize",
                abi::type_name(dtype)
            ))
        })
}

/// `ncclInvalidArgument` unless `ptr` is non-NULL (when `bytes > 0`).
pub fn need_ptr(name: &str, ptr: u64, bytes: usize) -> NResult<()> {
    if ptr == 0 && bytes > 0 {
        return Err(NcclError::arg(format!(
            "{name} is NULL: expected a buffer of {bytes} bytes"
        )));
    }
    Ok(())
}

/// `ncclInvalidArgument` unless `rank` names a rank of `comm`.
pub fn check_rank(what: &str, rank: c_int, nranks: usize) -> NResult<usize> {
    usize::try_from(rank)
        .ok()
        .filter(|&r| r < nranks)
        .ok_or_else(|| NcclError::arg(format!("{what} {rank}: expected a rank in 0..{nranks}")))
}

/// `ncclInvalidArgument` unless `op` is a built-in operator or one created on this comm.
pub fn check_op(op: c_int, ready: &Ready) -> NResult<()> {
    if abi::is_builtin_op(op) || ready.has_custom_op(op) {
        return Ok(());
    }
    Err(NcclError::arg(format!(
        "reduction operator {op}: expected ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg or an \
         operator from ncclRedOpCreatePreMulSum on this communicator"
    )))
}

/// Where `op` goes: native when possible and not forced away, else the fallback, else an
/// `ncclInvalidUsage` naming the call and why.
pub fn route(call: &str, ready: &Ready, op: Op, native: Result<(), String>) -> NResult<Route> {
    let why = if ready.forced.has(op) {
        format!(
            "MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION names {} so it must go to the fallback NCCL",
            op.name()
        )
    } else {
        match native {
            Ok(()) => return Ok(Route::Native),
            Err(why) => why,
        }
    };
    if ready.fallback.is_some() {
        return Ok(Route::Fallback);
    }
    let fallback = match &ready.fallback_note {
        Some(note) => format!("no fallback NCCL is loaded ({note})"),
        None => "no fallback NCCL is loaded (set MSCCLPP_NCCL_LIB_PATH to a libnccl.so.2 to \
                 run it there)"
            .to_string(),
    };
    Err(NcclError::usage(format!(
        "{call} is not supported here: {why}; and {fallback}"
    )))
}

/// Checks, routes and issues (or queues, inside a group) one collective.
pub fn collective(call: &'static str, handle: *const Comm, args: CollArgs) -> NResult<NcclResult> {
    let (comm, ready) = ready_comm(handle)?;
    comm.check_usable()?;
    let route = route(call, &ready, args.op, ready.native.supports(&args))?;
    if route == Route::Fallback && args.redop >= abi::NUM_OPS && !ready.has_custom_op(args.redop) {
        return Err(NcclError::internal(format!(
            "{call}: custom operator {} vanished",
            args.redop
        )));
    }
    group::submit(Pending::Coll {
        comm,
        ready,
        call,
        args,
        route,
    })
}

/// Checks, routes and issues (or queues) point-to-point calls (one send/recv, or the parts
/// of an all-to-all, gather or scatter).
pub fn point_to_point(
    call: &'static str,
    comm: Arc<Comm>,
    ready: Arc<Ready>,
    kind: Op,
    calls: Vec<P2pCall>,
    in_place_all_to_all: bool,
) -> NResult<NcclResult> {
    comm.check_usable()?;
    let native = if in_place_all_to_all {
        Err("in-place ncclAlltoAll has no native path".to_string())
    } else {
        ready.native_p2p(calls.iter().map(|c| c.op.peer))
    };
    let route = route(call, &ready, kind, native)?;
    group::submit(Pending::P2p {
        comm,
        ready,
        call,
        calls,
        route,
    })
}

/// The calls of `ncclSend` / `ncclRecv`.
#[allow(clippy::too_many_arguments)]
pub fn send_recv(
    call: &'static str,
    dir: Dir,
    buf: u64,
    count: usize,
    dtype: c_int,
    peer: c_int,
    handle: *const Comm,
    stream: u64,
) -> NResult<NcclResult> {
    let (comm, ready) = ready_comm(handle)?;
    let bytes = byte_len(call, count, dtype, 1)?;
    let peer = check_rank("peer", peer, comm.nranks)?;
    need_ptr(
        if dir == Dir::Send {
            "sendbuff"
        } else {
            "recvbuff"
        },
        buf,
        bytes,
    )?;
    let op = P2pOp {
        dir,
        peer,
        buf,
        bytes,
    };
    point_to_point(
        call,
        comm,
        ready,
        Op::SendRecv,
        vec![P2pCall {
            op,
            count,
            dtype,
            stream,
        }],
        false,
    )
}
