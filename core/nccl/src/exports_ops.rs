//! The exported collectives and point-to-point functions of `nccl.h` (2.28.3), each as
//! `ncclX` and its profiling twin `pncclX`. Arguments are checked here (NULL buffers with a
//! non-zero count, count overflow, unknown types and operators, bad roots and peers), then
//! `crate::ops` routes and issues the call.

#![allow(non_snake_case)]

use std::ffi::{c_int, c_void};

use crate::abi::NcclResult;
use crate::comm::Comm;
use crate::error::{guard, NResult};
use crate::native::CollArgs;
use crate::ops::{self, byte_len, check_op, check_rank, need_ptr, ready_comm, P2pCall};
use crate::options::Op;
use crate::p2p::{Dir, P2pOp};

type Stream = *mut c_void;

/// Checks and issues a reduction-like collective.
#[allow(clippy::too_many_arguments)]
fn reduction(
    call: &'static str,
    op: Op,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    redop: c_int,
    root: c_int,
    comm: *mut Comm,
    stream: Stream,
) -> NResult<NcclResult> {
    let (c, ready) = ready_comm(comm)?;
    let n = c.nranks;
    // Bytes of the buffers: all-gather's receive and reduce-scatter's send hold n counts.
    let (send_factor, recv_factor) = match op {
        Op::AllGather => (1, n),
        Op::ReduceScatter => (n, 1),
        _ => (1, 1),
    };
    let send_bytes = byte_len(call, count, dtype, send_factor)?;
    let recv_bytes = byte_len(call, count, dtype, recv_factor)?;
    let root = match op {
        Op::Broadcast | Op::Reduce => check_rank("root", root, n)?,
        _ => 0,
    };
    if matches!(op, Op::AllReduce | Op::ReduceScatter | Op::Reduce) {
        check_op(redop, &ready)?;
    }
    let is_root = c.rank == root;
    if op != Op::Broadcast || is_root {
        need_ptr("sendbuff", send as u64, send_bytes)?;
    }
    if op != Op::Reduce || is_root {
        need_ptr("recvbuff", recv as u64, recv_bytes)?;
    }
    let args = CollArgs {
        op,
        send: send as u64,
        recv: recv as u64,
        count,
        dtype,
        redop,
        root,
        stream: stream as u64,
    };
    drop(ready);
    ops::collective(call, comm, args)
}

nccl_export! {
    /// Reduces `count` elements from every rank into `recvbuff` on `root`.
    fn ncclReduce, pncclReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        op: c_int, root: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        guard("ncclReduce", || {
            reduction("ncclReduce", Op::Reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream)
        })
    }
}

nccl_export! {
    /// Broadcast in place (deprecated form of `ncclBroadcast`).
    fn ncclBcast, pncclBcast(
        buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        guard("ncclBcast", || {
            reduction("ncclBcast", Op::Broadcast, buff, buff, count, datatype, 0, root, comm, stream)
        })
    }
}

nccl_export! {
    /// Copies `count` elements of `root`'s `sendbuff` into every rank's `recvbuff`.
    fn ncclBroadcast, pncclBroadcast(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        root: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        guard("ncclBroadcast", || {
            reduction("ncclBroadcast", Op::Broadcast, sendbuff, recvbuff, count, datatype, 0, root, comm, stream)
        })
    }
}

nccl_export! {
    /// Reduces `count` elements across ranks into every rank's `recvbuff`.
    fn ncclAllReduce, pncclAllReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        op: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        guard("ncclAllReduce", || {
            reduction("ncclAllReduce", Op::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream)
        })
    }
}

nccl_export! {
    /// Reduces `nranks * recvcount` elements; rank i keeps block i.
    fn ncclReduceScatter, pncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int,
        op: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        guard("ncclReduceScatter", || {
            reduction("ncclReduceScatter", Op::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream)
        })
    }
}

nccl_export! {
    /// Gathers `sendcount` elements from every rank, rank i's at offset `i * sendcount`.
    fn ncclAllGather, pncclAllGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int,
        comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        guard("ncclAllGather", || {
            reduction("ncclAllGather", Op::AllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0, comm, stream)
        })
    }
}

/// Checks and issues a call made of point-to-point parts: `parts(rank, nranks, per_rank_bytes)`
/// lists (direction, peer, buffer offset) triples.
#[allow(clippy::too_many_arguments)]
fn composite(
    call: &'static str,
    kind: Op,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: Option<c_int>,
    comm: *mut Comm,
    stream: Stream,
) -> NResult<NcclResult> {
    let (c, ready) = ready_comm(comm)?;
    let (me, n) = (c.rank, c.nranks);
    let per = byte_len(call, count, dtype, 1)?;
    let total = byte_len(call, count, dtype, n)?;
    let root = root.map(|r| check_rank("root", r, n)).transpose()?;
    let (s, r) = (send as u64, recv as u64);
    let mut parts: Vec<(Dir, usize, u64)> = Vec::new();
    match (kind, root) {
        (Op::AllToAll, _) => {
            need_ptr("sendbuff", s, total)?;
            need_ptr("recvbuff", r, total)?;
            for p in 0..n {
                parts.push((Dir::Send, p, s + (p * per) as u64));
                parts.push((Dir::Recv, p, r + (p * per) as u64));
            }
        }
        (Op::Gather, Some(root)) => {
            need_ptr("sendbuff", s, per)?;
            parts.push((Dir::Send, root, s));
            if me == root {
                need_ptr("recvbuff", r, total)?;
                parts.extend((0..n).map(|p| (Dir::Recv, p, r + (p * per) as u64)));
            }
        }
        (Op::Scatter, Some(root)) => {
            need_ptr("recvbuff", r, per)?;
            if me == root {
                need_ptr("sendbuff", s, total)?;
                parts.extend((0..n).map(|p| (Dir::Send, p, s + (p * per) as u64)));
            }
            parts.push((Dir::Recv, root, r));
        }
        _ => {
            return Err(crate::error::NcclError::internal(format!(
                "{call}: not a composite"
            )))
        }
    }
    let calls: Vec<P2pCall> = parts
        .into_iter()
        .map(|(dir, peer, buf)| P2pCall {
            op: P2pOp {
                dir,
                peer,
                buf,
                bytes: per,
            },
            count,
            dtype,
            stream: stream as u64,
        })
        .collect();
    // In-place all-to-all would overwrite blocks before they are sent: no native path.
    let in_place = kind == Op::AllToAll && s == r && n > 1 && per > 0;
    ops::point_to_point(call, c, ready, kind, calls, in_place)
}

nccl_export! {
    /// Rank j receives block i of rank i's `sendbuff` at block i of its `recvbuff`.
    fn ncclAlltoAll, pncclAlltoAll(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        guard("ncclAlltoAll", || {
            composite("ncclAlltoAll", Op::AllToAll, sendbuff, recvbuff, count, datatype, None, comm, stream)
        })
    }
}

nccl_export! {
    /// Every rank's `count` elements to `root`, rank i's at block i.
    fn ncclGather, pncclGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        root: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        guard("ncclGather", || {
            composite("ncclGather", Op::Gather, sendbuff, recvbuff, count, datatype, Some(root), comm, stream)
        })
    }
}

nccl_export! {
    /// Block i of `root`'s `sendbuff` to rank i.
    fn ncclScatter, pncclScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        root: c_int, comm: *mut Comm, stream: Stream
    ) -> NcclResult {
        guard("ncclScatter", || {
            composite("ncclScatter", Op::Scatter, sendbuff, recvbuff, count, datatype, Some(root), comm, stream)
        })
    }
}

nccl_export! {
    /// Sends `count` elements to `peer` (matched with its `ncclRecv` in call order).
    fn ncclSend, pncclSend(
        sendbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: *mut Comm,
        stream: Stream
    ) -> NcclResult {
        guard("ncclSend", || {
            ops::send_recv("ncclSend", Dir::Send, sendbuff as u64, count, datatype, peer, comm, stream as u64)
        })
    }
}

nccl_export! {
    /// Receives `count` elements from `peer`.
    fn ncclRecv, pncclRecv(
        recvbuff: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: *mut Comm,
        stream: Stream
    ) -> NcclResult {
        guard("ncclRecv", || {
            ops::send_recv("ncclRecv", Dir::Recv, recvbuff as u64, count, datatype, peer, comm, stream as u64)
        })
    }
}
