//! `ncclSend`/`ncclRecv` and the calls made of them (`ncclAlltoAll`, `ncclGather`,
//! `ncclScatter`), each described once: its C arguments checked into sends and receives, and
//! its name in `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`. Natively they run on core's
//! `mscclpp::p2p::PointToPoint` (GPU builds: peers on this node); on the fallback
//! NCCL as its `ncclSend`/`ncclRecv` inside one of its groups. Adding such a call adds a value
//! here (and to [`ALL`] when it has a name of its own), its declaration in `nccl.h` and its
//! line in `exports_ops.rs`.

use std::ffi::{c_int, c_void};

use crate::checks::{byte_len, check_rank, need_ptr};
use crate::comm::Comm;
use crate::env::FallbackName;
use crate::error::NResult;
use crate::fallback::{FallbackComm, Handle, Stream};
use crate::ops::work::{AllToAll, CArgs, FallbackCall, NativeWork, P2pCall, Request, Work};
use mscclpp::p2p::{Dir, P2pOp};

/// A call's sends and receives on one rank: (direction, peer, buffer address), each of the
/// call's per-rank byte size; and why it has no native path, if it has none.
struct Parts {
    list: Vec<(Dir, usize, u64)>,
    not_native: Option<&'static str>,
}

impl Parts {
    fn of(list: Vec<(Dir, usize, u64)>) -> Parts {
        Parts {
            list,
            not_native: None,
        }
    }
}

/// Checks the C arguments of `call` on rank `me` of `n` (`per`: bytes per block) and lists
/// its sends and receives.
type PartsFn = fn(call: &str, a: &CArgs, me: usize, n: usize, per: usize) -> NResult<Parts>;

/// A point-to-point call of `nccl.h`.
pub struct PointToPoint {
    /// Its names in `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`.
    pub name: FallbackName,
    parts: PartsFn,
}

/// `ncclSend` and `ncclRecv` are one operation there: both ends of a message must agree.
const SEND_RECV: FallbackName = FallbackName {
    name: "sendrecv",
    aliases: &["send", "recv"],
};

/// Every point-to-point operation with a name of its own, in the order
/// `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`'s message lists them.
pub static ALL: [&PointToPoint; 4] = [&SEND, &ALL_TO_ALL, &GATHER, &SCATTER];

/// `ncclSend`.
pub static SEND: PointToPoint = PointToPoint {
    name: SEND_RECV,
    parts: |_, a, _, n, per| one_message(Dir::Send, a, n, per),
};

/// `ncclRecv`.
pub static RECV: PointToPoint = PointToPoint {
    name: SEND_RECV,
    parts: |_, a, _, n, per| one_message(Dir::Recv, a, n, per),
};

/// The C name and the address of `a`'s buffer of direction `dir`.
fn buffer(dir: Dir, a: &CArgs) -> (&'static str, u64) {
    match dir {
        Dir::Send => ("sendbuff", a.send),
        Dir::Recv => ("recvbuff", a.recv),
    }
}

/// `ncclSend` (`dir` Send) or `ncclRecv` (Recv): one message with peer `a.root`.
fn one_message(dir: Dir, a: &CArgs, n: usize, per: usize) -> NResult<Parts> {
    let peer = check_rank("peer", a.root, n)?;
    let (name, buf) = buffer(dir, a);
    need_ptr(name, buf, per)?;
    Ok(Parts::of(vec![(dir, peer, buf)]))
}

/// Block `i` of `base` (blocks of `per` bytes).
fn block(base: u64, i: usize, per: usize) -> u64 {
    base + (i * per) as u64
}

/// `ncclAlltoAll`: block `p` of the send buffer to rank `p`, block `p` of the receive buffer
/// from it. In place (one buffer) too: core's point-to-point holds each receive behind the send
/// out of the same block.
pub static ALL_TO_ALL: PointToPoint = PointToPoint {
    name: FallbackName::single("alltoall"),
    parts: |call, a, _, n, per| {
        let total = byte_len(call, a.count, a.dtype, n)?;
        need_ptr("sendbuff", a.send, total)?;
        need_ptr("recvbuff", a.recv, total)?;
        let list = (0..n)
            .flat_map(|p| {
                [
                    (Dir::Send, p, block(a.send, p, per)),
                    (Dir::Recv, p, block(a.recv, p, per)),
                ]
            })
            .collect();
        Ok(Parts::of(list))
    },
};

/// `ncclGather`: every rank's buffer to block `rank` of the root's.
pub static GATHER: PointToPoint = PointToPoint {
    name: FallbackName::single("gather"),
    parts: |call, a, me, n, per| rooted(Dir::Recv, call, a, me, n, per),
};

/// `ncclScatter`: block `rank` of the root's buffer to every rank.
pub static SCATTER: PointToPoint = PointToPoint {
    name: FallbackName::single("scatter"),
    parts: |call, a, me, n, per| rooted(Dir::Send, call, a, me, n, per),
};

/// A call between the root `a.root` and every rank: each rank's one message with the root
/// (its buffer of `per` bytes) and, on the root, one per rank in direction `at_root` (block
/// `p` of the root's buffer of `n * per` bytes with rank `p`). Sends are listed first.
fn rooted(at_root: Dir, call: &str, a: &CArgs, me: usize, n: usize, per: usize) -> NResult<Parts> {
    let total = byte_len(call, a.count, a.dtype, n)?;
    let root = check_rank("root", a.root, n)?;
    let at_rank = match at_root {
        Dir::Send => Dir::Recv,
        Dir::Recv => Dir::Send,
    };
    let (name, buf) = buffer(at_rank, a);
    need_ptr(name, buf, per)?;
    let mine = (at_rank, root, buf);
    let mut fan = Vec::new();
    if me == root {
        let (name, buf) = buffer(at_root, a);
        need_ptr(name, buf, total)?;
        fan.extend((0..n).map(|p| (at_root, p, block(buf, p, per))));
    }
    let list = match at_rank {
        Dir::Send => [vec![mine], fan].concat(),
        Dir::Recv => [fan, vec![mine]].concat(),
    };
    Ok(Parts::of(list))
}

impl PointToPoint {
    /// Checks the C arguments `a` of `call` on `handle` (NULL buffers with a non-zero count,
    /// count overflow, unknown types, bad roots and peers) and routes the call.
    pub fn prepare(
        &'static self,
        call: &'static str,
        handle: *const Comm,
        a: CArgs,
    ) -> NResult<Work> {
        let request = Request::new(call, handle, &self.name)?;
        let (me, n) = (request.comm.rank, request.comm.nranks);
        let per = byte_len(call, a.count, a.dtype, 1)?;
        let parts = (self.parts)(call, &a, me, n, per)?;
        let calls: Vec<P2pCall> = parts
            .list
            .into_iter()
            .map(|(dir, peer, buf)| P2pCall {
                op: P2pOp {
                    dir,
                    peer,
                    buf,
                    bytes: per,
                },
                count: a.count,
                dtype: a.dtype,
                stream: a.stream,
            })
            .collect();
        let a2a = std::ptr::eq(self, &ALL_TO_ALL).then_some(AllToAll {
            send: a.send,
            recv: a.recv,
            per,
            stream: a.stream,
        });
        let fallback_calls = calls.clone();
        request.route(
            |ready| {
                Ok(match parts.not_native {
                    Some(why) => Err(why.to_string()),
                    None if crate::HOST_BACKEND || calls.iter().all(|c| c.op.peer == me) => {
                        Ok(NativeWork::Parts(calls, a2a))
                    }
                    None => match &ready.p2p {
                        Some(p2p) if calls.iter().all(|c| p2p.reaches(c.op.peer)) => {
                            Ok(NativeWork::Parts(calls, a2a))
                        }
                        Some(_) => Err("point-to-point between nodes on GPU builds is not \
                                        supported yet"
                            .to_string()),
                        None => Err("point-to-point between different ranks has no native \
                                     path here (its setup failed at init, see the log)"
                            .to_string()),
                    },
                })
            },
            || Box::new(PartsFallback(fallback_calls)),
        )
    }
}

/// Sends and receives for the fallback NCCL.
struct PartsFallback(Vec<P2pCall>);

impl FallbackCall for PartsFallback {
    unsafe fn issue(&self, fb: &FallbackComm, call: &str) -> NResult<()> {
        type Send =
            unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Handle, Stream) -> c_int;
        type Recv = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Handle, Stream) -> c_int;
        for c in &self.0 {
            let (buf, st) = (c.op.buf as usize, c.stream as usize as Stream);
            let peer = c.op.peer as c_int;
            // SAFETY: (both arms) the types are nccl.h's declarations of the functions; the
            // caller's arguments, checked, passed on with the fallback's comm.
            let rc = unsafe {
                match c.op.dir {
                    Dir::Send => fb.function::<Send>("ncclSend")?(
                        buf as *const c_void,
                        c.count,
                        c.dtype,
                        peer,
                        fb.comm,
                        st,
                    ),
                    Dir::Recv => fb.function::<Recv>("ncclRecv")?(
                        buf as *mut c_void,
                        c.count,
                        c.dtype,
                        peer,
                        fb.comm,
                        st,
                    ),
                }
            };
            fb.check(call, rc)?;
        }
        Ok(())
    }
}
