//! The collectives of `nccl.h`, each described once: its buffers and arguments (checked from
//! the C call), the native collective it runs as, its function in the fallback NCCL, and its
//! name in `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`. Adding a collective adds a value here (and
//! to [`ALL`]), its declaration in `nccl.h` and its line in `exports_ops.rs`.
//!
//! `ncclReduce` runs natively as an all-reduce whose non-root ranks write a scratch buffer;
//! `ncclBcast` is `ncclBroadcast` in place.

use std::ffi::{c_int, c_void};

use mscclpp::collectives::{Call, CollectiveKind, ReduceOp};

use crate::abi;
use crate::checks::{byte_len, check_rank, need_ptr};
use crate::comm::{Comm, Ready};
use crate::env::FallbackName;
use crate::error::{NResult, NcclError};
use crate::fallback::{FallbackComm, Handle, Stream};
use crate::native::{data_type, reduce_op};
use crate::ops::work::{CArgs, FallbackCall, NativeWork, Request};

/// How many of NCCL's counts a buffer holds.
#[derive(Clone, Copy, Debug)]
enum Blocks {
    /// One count.
    One,
    /// One count per rank.
    PerRank,
}

impl Blocks {
    fn factor(self, nranks: usize) -> usize {
        match self {
            Blocks::One => 1,
            Blocks::PerRank => nranks,
        }
    }
}

/// Calls the fallback NCCL's function of a collective with `a`, returning its result code.
///
/// # Safety
/// `a`'s buffers and stream must be valid as `nccl.h` documents for the function.
type FallbackFn = unsafe fn(&FallbackComm, &CArgs) -> NResult<c_int>;

/// `nccl.h`'s `(sendbuff, recvbuff, count, datatype, op or root, comm, stream)` functions.
type FnWithOne =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Handle, Stream) -> c_int;
/// `ncclAllGather`'s declaration: no operator, no root.
type FnAllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Handle, Stream) -> c_int;
/// `ncclReduce`'s declaration: operator and root.
type FnReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Handle,
    Stream,
) -> c_int;

/// The buffers and arguments of a collective: what its checks and its native path follow.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// Counts in `sendbuff` and in `recvbuff`.
    send: Blocks,
    recv: Blocks,
    /// Whether it takes a root rank and a reduction operator.
    rooted: bool,
    reduces: bool,
    /// Only the root reads `sendbuff` (broadcast: elsewhere it may be NULL and runs as
    /// `recvbuff`).
    send_on_root_only: bool,
    /// Only the root gets the result (reduce: elsewhere `recvbuff` may be NULL and the
    /// native path writes a scratch buffer).
    result_on_root_only: bool,
}

/// One count in each buffer, no root, no operator: the shape the others differ from.
const PLAIN: Shape = Shape {
    send: Blocks::One,
    recv: Blocks::One,
    rooted: false,
    reduces: false,
    send_on_root_only: false,
    result_on_root_only: false,
};

/// A collective of `nccl.h`.
pub struct Collective {
    /// Its names in `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`.
    pub name: FallbackName,
    /// The native collective it runs as.
    kind: CollectiveKind,
    /// Its buffers and arguments.
    shape: Shape,
    /// Its function in the fallback NCCL.
    fallback: FallbackFn,
}

/// Every collective, in the order `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`'s message lists them.
pub static ALL: [&Collective; 5] = [
    &ALL_REDUCE,
    &ALL_GATHER,
    &REDUCE_SCATTER,
    &BROADCAST,
    &REDUCE,
];

/// `ncclAllReduce`.
pub static ALL_REDUCE: Collective = Collective {
    name: FallbackName::single("allreduce"),
    kind: CollectiveKind::AllReduce,
    shape: Shape {
        reduces: true,
        ..PLAIN
    },
    // SAFETY: nccl.h's declaration; the caller's checked arguments, with the fallback's comm.
    fallback: |fb, a| unsafe {
        let f = fb.function::<FnWithOne>("ncclAllReduce")?;
        let (s, r, n, t) = a.head();
        Ok(f(s, r, n, t, a.redop, fb.comm, a.stream_ptr()))
    },
};

/// `ncclAllGather`.
pub static ALL_GATHER: Collective = Collective {
    name: FallbackName::single("allgather"),
    kind: CollectiveKind::AllGather,
    shape: Shape {
        recv: Blocks::PerRank,
        ..PLAIN
    },
    // SAFETY: nccl.h's declaration; the caller's checked arguments, with the fallback's comm.
    fallback: |fb, a| unsafe {
        let f = fb.function::<FnAllGather>("ncclAllGather")?;
        let (s, r, n, t) = a.head();
        Ok(f(s, r, n, t, fb.comm, a.stream_ptr()))
    },
};

/// `ncclReduceScatter`.
pub static REDUCE_SCATTER: Collective = Collective {
    name: FallbackName::single("reducescatter"),
    kind: CollectiveKind::ReduceScatter,
    shape: Shape {
        send: Blocks::PerRank,
        reduces: true,
        ..PLAIN
    },
    // SAFETY: nccl.h's declaration; the caller's checked arguments, with the fallback's comm.
    fallback: |fb, a| unsafe {
        let f = fb.function::<FnWithOne>("ncclReduceScatter")?;
        let (s, r, n, t) = a.head();
        Ok(f(s, r, n, t, a.redop, fb.comm, a.stream_ptr()))
    },
};

/// `ncclBroadcast` and `ncclBcast`.
pub static BROADCAST: Collective = Collective {
    name: FallbackName::single("broadcast"),
    kind: CollectiveKind::Broadcast,
    shape: Shape {
        rooted: true,
        send_on_root_only: true,
        ..PLAIN
    },
    // SAFETY: nccl.h's declaration; the caller's checked arguments, with the fallback's comm.
    fallback: |fb, a| unsafe {
        let f = fb.function::<FnWithOne>("ncclBroadcast")?;
        let (s, r, n, t) = a.head();
        Ok(f(s, r, n, t, a.root, fb.comm, a.stream_ptr()))
    },
};

/// `ncclReduce`.
pub static REDUCE: Collective = Collective {
    name: FallbackName::single("reduce"),
    kind: CollectiveKind::AllReduce,
    shape: Shape {
        rooted: true,
        reduces: true,
        result_on_root_only: true,
        ..PLAIN
    },
    // SAFETY: nccl.h's declaration; the caller's checked arguments, with the fallback's comm.
    fallback: |fb, a| unsafe {
        let f = fb.function::<FnReduce>("ncclReduce")?;
        let (s, r, n, t) = a.head();
        Ok(f(s, r, n, t, a.redop, a.root, fb.comm, a.stream_ptr()))
    },
};

/// `ncclInvalidArgument` unless `op` is a built-in operator or one created on this comm.
fn check_op(op: c_int, ready: &Ready) -> NResult<()> {
    if abi::is_builtin_op(op) || ready.has_custom_op(op) {
        return Ok(());
    }
    Err(NcclError::arg(format!(
        "reduction operator {op}: expected ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg or an \
         operator from ncclRedOpCreatePreMulSum on this communicator"
    )))
}

impl Collective {
    /// Checks the C arguments `a` of `call` on `handle` (NULL buffers with a non-zero count,
    /// count overflow, unknown types and operators, bad roots), routes the call and submits
    /// it ([`crate::group::submit`]: queued inside a group, issued outside); a call that does
    /// nothing natively (in place at world size 1) is answered at once.
    pub fn submit(
        &'static self,
        call: &'static str,
        handle: *const Comm,
        a: CArgs,
    ) -> NResult<abi::NcclResult> {
        let request = Request::new(call, handle, &self.name)?;
        let (comm, ready) = (&request.comm, &request.ready);
        let n = comm.nranks;
        let send_bytes = byte_len(call, a.count, a.dtype, self.shape.send.factor(n))?;
        let recv_bytes = byte_len(call, a.count, a.dtype, self.shape.recv.factor(n))?;
        let root = if self.shape.rooted {
            check_rank("root", a.root, n)?
        } else {
            0
        };
        if self.shape.reduces {
            check_op(a.redop, ready)?;
        }
        let is_root = comm.rank == root;
        if !self.shape.send_on_root_only || is_root {
            need_ptr("sendbuff", a.send, send_bytes)?;
        }
        if !self.shape.result_on_root_only || is_root {
            need_ptr("recvbuff", a.recv, recv_bytes)?;
        }
        // A call that does nothing natively (`Native::is_noop`) and would be routed to the
        // native path (not forced to the fallback, a native type and a built-in operator: the
        // decision `Request::route` and `Collective::native` make) is answered before any
        // work is built (building, moving and dropping it was most of such a call's host
        // time, issue 28): no algorithm choice, no launch lock, no call record.
        if ready.native.is_noop(a.send, a.recv, a.count)
            && !ready.forced.has(self.name.name)
            && data_type(a.dtype).is_some()
            && (!self.shape.reduces || reduce_op(a.redop).is_some())
        {
            comm.check_usable()?;
            return Ok(abi::SUCCESS);
        }
        let key = std::sync::Arc::as_ptr(comm) as usize;
        // Registered: both buffers inside ranges registered with this communicator, for the
        // collectives whose every rank has both buffers; broadcast (the root's input is read
        // only there): its output, which every rank has (the zero-copy broadcast writes only
        // into the outputs). A reduce's buffers differ in kind between the ranks, so they
        // could disagree: never.
        let both_everywhere = !self.shape.send_on_root_only && !self.shape.result_on_root_only;
        let out_everywhere = self.shape.send_on_root_only && !self.shape.result_on_root_only;
        // Asked only when an algorithm is chosen (not for a call with nothing to do).
        let registered = move || {
            let reg = |p: u64, b: usize| p != 0 && crate::mem::is_registered(key, p, b);
            (both_everywhere && reg(a.send, send_bytes) && reg(a.recv, recv_bytes))
                || (out_everywhere && reg(a.recv, recv_bytes))
        };
        crate::group::submit(request.route(
            |ready| self.native(&a, root, is_root, registered, ready),
            || Box::new(CollectiveFallback { op: self, args: a }),
        )?)
    }

    /// The native path of the checked call `a`, or why it has none.
    fn native(
        &self,
        a: &CArgs,
        root: usize,
        is_root: bool,
        registered: impl FnOnce() -> bool,
        ready: &Ready,
    ) -> NResult<Result<NativeWork, String>> {
        if let Err(why) = ready.native.available() {
            return Ok(Err(why));
        }
        let Some(dtype) = data_type(a.dtype) else {
            return Ok(Err(format!("datatype {} has no native type", a.dtype)));
        };
        let op = match (self.shape.reduces, reduce_op(a.redop)) {
            (false, _) => ReduceOp::Sum,
            (true, Some(op)) => op,
            (true, None) => {
                return Ok(Err(
                    "custom reduction operators (ncclRedOpCreatePreMulSum) have no \
                               native path"
                        .into(),
                ))
            }
        };
        let mut call = Call {
            kind: self.kind,
            send: a.send,
            recv: a.recv,
            count: a.count,
            dtype,
            op,
            root,
        };
        if self.shape.send_on_root_only && call.send == 0 {
            // Non-root ranks may pass a NULL send buffer (it is not read there).
            call.send = call.recv;
        }
        let mut scratch = None;
        if self.shape.result_on_root_only && !is_root && call.count > 0 {
            let s = ready.native.scratch(call.bytes())?;
            call.recv = s.ptr();
            scratch = Some(s);
        }
        Ok(ready
            .native
            .choose(call, registered)
            .map(|choice| NativeWork::Collective {
                choice,
                stream: a.stream,
                _scratch: scratch,
            }))
    }
}

/// A collective for the fallback NCCL.
struct CollectiveFallback {
    op: &'static Collective,
    args: CArgs,
}

impl FallbackCall for CollectiveFallback {
    unsafe fn issue(&self, fb: &FallbackComm, call: &str) -> NResult<()> {
        // SAFETY: the caller's contract.
        let rc = unsafe { (self.op.fallback)(fb, &self.args)? };
        fb.check(call, rc)
    }
}
