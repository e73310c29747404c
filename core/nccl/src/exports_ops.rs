//! The exported collectives and point-to-point functions of `nccl.h` (2.28.3), each as
//! `ncclX` and its profiling twin `pncclX`, grouped by C signature: one line per function
//! handing its C arguments to the operation that checks, routes and issues them
//! (`ops::collective`, `ops::point_to_point`), then to the group, which queues or issues the
//! work.

// The exported names are NCCL's (`ncclAllReduce`, ...), not snake case.
#![allow(non_snake_case)]

use std::ffi::{c_int, c_void};

use crate::abi::NcclResult;
use crate::boundary::guard;
use crate::comm::Comm;
use crate::group;
use crate::ops::collective::{
    Collective, ALL_GATHER, ALL_REDUCE, BROADCAST, REDUCE, REDUCE_SCATTER,
};
use crate::ops::point_to_point::{PointToPoint, ALL_TO_ALL, GATHER, RECV, SCATTER, SEND};
use crate::ops::work::CArgs;

type Stream = *mut c_void;

/// Runs collective `op` for exported function `call`.
fn collective(
    call: &'static str,
    op: &'static Collective,
    comm: *mut Comm,
    a: CArgs,
) -> NcclResult {
    guard(call, || op.submit(call, comm, a))
}

/// Runs point-to-point operation `op` for exported function `call`.
fn point_to_point(
    call: &'static str,
    op: &'static PointToPoint,
    comm: *mut Comm,
    a: CArgs,
) -> NcclResult {
    guard(call, || group::submit(op.prepare(call, comm, a)?))
}

/// The C arguments: buffers, count, type, operator, root (or peer) and stream.
#[allow(clippy::too_many_arguments)] // reason: one argument per C argument of the call
fn args(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    redop: c_int,
    root: c_int,
    stream: Stream,
) -> CArgs {
    CArgs {
        send: send as u64,
        recv: recv as u64,
        count,
        dtype,
        redop,
        root,
        stream: stream as u64,
    }
}

/// `nccl_export!` for each function of one C signature: `(parameters) => (comm, args(..))`
/// once, then `ncclX, pncclX => run(&OP);` per function (its docs first).
macro_rules! exports {
    (($($sig:tt)*) => ($($call:tt)*)) => {};
    (($($sig:tt)*) => ($($call:tt)*)
     $(#[doc = $doc:literal])* $name:ident, $pname:ident => $run:ident(&$op:ident); $($rest:tt)*) => {
        nccl_export! {
            $(#[doc = $doc])*
            fn $name, $pname($($sig)*) -> NcclResult {
                $run(stringify!($name), &$op, $($call)*)
            }
        }
        exports!(($($sig)*) => ($($call)*) $($rest)*);
    };
}

exports! {
    (
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        op: c_int, root: c_int, comm: *mut Comm, stream: Stream
    ) => (comm, args(sendbuff, recvbuff, count, datatype, op, root, stream))
    /// Reduces `count` elements from every rank into `recvbuff` on `root`.
    ncclReduce, pncclReduce => collective(&REDUCE);
}

exports! {
    (buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: *mut Comm, stream: Stream)
    => (comm, args(buff, buff, count, datatype, 0, root, stream))
    /// Broadcast in place (deprecated form of `ncclBroadcast`).
    ncclBcast, pncclBcast => collective(&BROADCAST);
}

exports! {
    (
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        root: c_int, comm: *mut Comm, stream: Stream
    ) => (comm, args(sendbuff, recvbuff, count, datatype, 0, root, stream))
    /// Copies `count` elements of `root`'s `sendbuff` into every rank's `recvbuff`.
    ncclBroadcast, pncclBroadcast => collective(&BROADCAST);
    /// Every rank's `count` elements to `root`, rank i's at block i.
    ncclGather, pncclGather => point_to_point(&GATHER);
    /// Block i of `root`'s `sendbuff` to rank i.
    ncclScatter, pncclScatter => point_to_point(&SCATTER);
}

exports! {
    (
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        op: c_int, comm: *mut Comm, stream: Stream
    ) => (comm, args(sendbuff, recvbuff, count, datatype, op, 0, stream))
    /// Reduces `count` elements across ranks into every rank's `recvbuff`.
    ncclAllReduce, pncclAllReduce => collective(&ALL_REDUCE);
    /// Reduces `nranks * count` elements; rank i keeps block i.
    ncclReduceScatter, pncclReduceScatter => collective(&REDUCE_SCATTER);
}

exports! {
    (
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        comm: *mut Comm, stream: Stream
    ) => (comm, args(sendbuff, recvbuff, count, datatype, 0, 0, stream))
    /// Gathers `count` elements from every rank, rank i's at offset `i * count`.
    ncclAllGather, pncclAllGather => collective(&ALL_GATHER);
    /// Rank j receives block i of rank i's `sendbuff` at block i of its `recvbuff`.
    ncclAlltoAll, pncclAlltoAll => point_to_point(&ALL_TO_ALL);
}

exports! {
    (
        sendbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: *mut Comm,
        stream: Stream
    ) => (comm, args(sendbuff, std::ptr::null_mut(), count, datatype, 0, peer, stream))
    /// Sends `count` elements to `peer` (matched with its `ncclRecv` in call order).
    ncclSend, pncclSend => point_to_point(&SEND);
}

exports! {
    (
        recvbuff: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: *mut Comm,
        stream: Stream
    ) => (comm, args(std::ptr::null(), recvbuff, count, datatype, 0, peer, stream))
    /// Receives `count` elements from `peer`.
    ncclRecv, pncclRecv => point_to_point(&RECV);
}
