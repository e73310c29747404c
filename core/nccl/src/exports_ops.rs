//! The exported collectives and point-to-point functions of `nccl.h` (2.28.3), each as
//! `ncclX` and its profiling twin `pncclX`: one line per function handing its C arguments to
//! the operation that checks, routes and issues them (`ops::collective`,
//! `ops::point_to_point`), then to the group, which queues or issues the work.

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
    guard(call, || group::submit(op.prepare(call, comm, a)?))
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

nccl_export! {
    /// Reduces `count` elements from every rank into `recvbuff` on `root`.
    fn ncclReduce, pncclReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        op: c_int, root: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        collective("ncclReduce", &REDUCE, comm, args(sendbuff, recvbuff, count, datatype, op, root, stream))
    }
}

nccl_export! {
    /// Broadcast in place (deprecated form of `ncclBroadcast`).
    fn ncclBcast, pncclBcast(
        buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        collective("ncclBcast", &BROADCAST, comm, args(buff, buff, count, datatype, 0, root, stream))
    }
}

nccl_export! {
    /// Copies `count` elements of `root`'s `sendbuff` into every rank's `recvbuff`.
    fn ncclBroadcast, pncclBroadcast(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        root: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        collective("ncclBroadcast", &BROADCAST, comm, args(sendbuff, recvbuff, count, datatype, 0, root, stream))
    }
}

nccl_export! {
    /// Reduces `count` elements across ranks into every rank's `recvbuff`.
    fn ncclAllReduce, pncclAllReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        op: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        collective("ncclAllReduce", &ALL_REDUCE, comm, args(sendbuff, recvbuff, count, datatype, op, 0, stream))
    }
}

nccl_export! {
    /// Reduces `nranks * recvcount` elements; rank i keeps block i.
    fn ncclReduceScatter, pncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int,
        op: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        collective("ncclReduceScatter", &REDUCE_SCATTER, comm, args(sendbuff, recvbuff, recvcount, datatype, op, 0, stream))
    }
}

nccl_export! {
    /// Gathers `sendcount` elements from every rank, rank i's at offset `i * sendcount`.
    fn ncclAllGather, pncclAllGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int,
        comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        collective("ncclAllGather", &ALL_GATHER, comm, args(sendbuff, recvbuff, sendcount, datatype, 0, 0, stream))
    }
}

nccl_export! {
    /// Rank j receives block i of rank i's `sendbuff` at block i of its `recvbuff`.
    fn ncclAlltoAll, pncclAlltoAll(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        point_to_point("ncclAlltoAll", &ALL_TO_ALL, comm, args(sendbuff, recvbuff, count, datatype, 0, 0, stream))
    }
}

nccl_export! {
    /// Every rank's `count` elements to `root`, rank i's at block i.
    fn ncclGather, pncclGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        root: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        point_to_point("ncclGather", &GATHER, comm, args(sendbuff, recvbuff, count, datatype, 0, root, stream))
    }
}

nccl_export! {
    /// Block i of `root`'s `sendbuff` to rank i.
    fn ncclScatter, pncclScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        root: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        point_to_point("ncclScatter", &SCATTER, comm, args(sendbuff, recvbuff, count, datatype, 0, root, stream))
    }
}

nccl_export! {
    /// Sends `count` elements to `peer` (matched with its `ncclRecv` in call order).
    fn ncclSend, pncclSend(
        sendbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: *mut Comm,
        stream: Stream
    ) -> NcclResult {
        point_to_point("ncclSend", &SEND, comm, args(sendbuff, std::ptr::null_mut(), count, datatype, 0, peer, stream))
    }
}

nccl_export! {
    /// Receives `count` elements from `peer`.
    fn ncclRecv, pncclRecv(
        recvbuff: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: *mut Comm,
        stream: Stream
    ) -> NcclResult {
        point_to_point("ncclRecv", &RECV, comm, args(std::ptr::null(), recvbuff, count, datatype, 0, peer, stream))
    }
}
