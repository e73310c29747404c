//! What every operation shares from the checked call on: the routing decision (native,
//! fallback, or an `ncclInvalidUsage` naming why neither), the [`Work`] a call becomes, and
//! running a batch of work (the group's flush calls [`run_native`] and [`issue_fallback`]).
//!
//! Routing depends only on the arguments, the environment and the communicator, so every
//! rank of a collective decides the same way (the environment must match across ranks).

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use crate::abi;
use crate::comm::{Comm, Ready};
use crate::env::FallbackName;
use crate::error::{NResult, NcclError};
use crate::fallback::FallbackComm;
use crate::native::{Choice, Scratch};
use mscclpp::p2p::{Dir, Hooks, P2pOp};

/// The C arguments of a collective or point-to-point call (arguments a call lacks are 0).
#[derive(Clone, Copy, Debug, Default)]
pub struct CArgs {
    /// `sendbuff` (device address; host address on the host backend).
    pub send: u64,
    /// `recvbuff`.
    pub recv: u64,
    /// NCCL's count (per rank for all-gather, reduce-scatter and the point-to-point calls).
    pub count: usize,
    /// `ncclDataType_t`.
    pub dtype: c_int,
    /// `ncclRedOp_t` (reductions).
    pub redop: c_int,
    /// The root (broadcast, reduce, gather, scatter) or the peer (send, recv).
    pub root: c_int,
    /// The caller's stream (`cudaStream_t` as an integer).
    pub stream: u64,
}

impl CArgs {
    /// `sendbuff` as the C pointer.
    pub fn send_ptr(&self) -> *const c_void {
        self.send as usize as *const c_void
    }
    /// `recvbuff` as the C pointer.
    pub fn recv_ptr(&self) -> *mut c_void {
        self.recv as usize as *mut c_void
    }
    /// The stream as the C pointer.
    pub fn stream_ptr(&self) -> *mut c_void {
        self.stream as usize as *mut c_void
    }
    /// The arguments every collective of `nccl.h` begins with: `sendbuff, recvbuff, count,
    /// datatype`.
    pub fn head(&self) -> (*const c_void, *mut c_void, usize, c_int) {
        (self.send_ptr(), self.recv_ptr(), self.count, self.dtype)
    }
}

/// One send or receive of a point-to-point call, as the caller made it (the fallback needs
/// count and type).
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

/// A call of the fallback NCCL, its arguments checked.
pub trait FallbackCall: Send + Sync {
    /// Issues it on `fb` (`call` names the NCCL function for messages).
    ///
    /// # Safety
    /// The buffers and stream of the call must be valid as `nccl.h` documents for it.
    unsafe fn issue(&self, fb: &FallbackComm, call: &str) -> NResult<()>;
}

/// A native path an operation found for a call.
pub enum NativeWork {
    /// A collective: the choice made while routing, run on `stream`; `scratch` is kept alive
    /// for it (the buffer a rank's discarded result goes to).
    Collective {
        /// The converted call and its algorithm.
        choice: Choice,
        /// The caller's stream.
        stream: u64,
        /// The scratch buffer the call writes, if any (held, never read).
        _scratch: Option<Scratch>,
    },
    /// Sends and receives, progressed together with the rest of the group's on this
    /// communicator; an `ncclAlltoAll`'s also name the call ([`AllToAll`]), which may take
    /// core's direct path instead.
    Parts(Vec<P2pCall>, Option<AllToAll>),
}

/// An `ncclAlltoAll` on one rank (a collective: every rank makes it), for
/// `mscclpp::p2p::PointToPoint::all_to_all_direct`.
#[derive(Clone, Copy, Debug)]
pub struct AllToAll {
    /// The send and receive buffers (`nranks * per` bytes each).
    pub send: u64,
    /// See `send`.
    pub recv: u64,
    /// Bytes per block.
    pub per: usize,
    /// The caller's stream.
    pub stream: u64,
}

enum Path {
    Native(NativeWork),
    Fallback(Box<dyn FallbackCall>),
}

/// One checked and routed call: queued inside a group, issued at once outside.
pub struct Work {
    comm: Arc<Comm>,
    ready: Arc<Ready>,
    call: &'static str,
    path: Path,
}

/// A call on its way to being routed: its communicator, looked up, and its operation's name.
pub struct Request<'a> {
    /// The NCCL function (for messages).
    pub call: &'static str,
    /// The communicator.
    pub comm: Arc<Comm>,
    /// Its state.
    pub ready: Arc<Ready>,
    /// The operation's names in `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`.
    pub name: &'a FallbackName,
}

impl<'a> Request<'a> {
    /// The request of `call` on `handle` (`ncclInvalidArgument` for a bad handle, the
    /// communicator's error when it is not ready), for the operation named `name`.
    pub fn new(call: &'static str, handle: *const Comm, name: &'a FallbackName) -> NResult<Self> {
        let (comm, ready) = crate::comm::ready(handle)?;
        Ok(Request {
            call,
            comm,
            ready,
            name,
        })
    }

    /// Routes the call: `native` (asked only when the operation is not forced to the
    /// fallback) gives its native path or why it has none (an `Err` of the outer result is a
    /// failure of the call itself); then the fallback's `fallback`, else an
    /// `ncclInvalidUsage` naming the call and why.
    pub fn route(
        self,
        native: impl FnOnce(&Ready) -> NResult<Result<NativeWork, String>>,
        fallback: impl FnOnce() -> Box<dyn FallbackCall>,
    ) -> NResult<Work> {
        let Request {
            call,
            comm,
            ready,
            name,
        } = self;
        comm.check_usable()?;
        let why = if ready.forced.has(name.name) {
            format!(
                "MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION names {} so it must go to the fallback NCCL",
                name.name
            )
        } else {
            match native(&ready)? {
                Ok(work) => {
                    return Ok(Work {
                        comm,
                        ready,
                        call,
                        path: Path::Native(work),
                    })
                }
                Err(why) => why,
            }
        };
        if ready.fallback.is_some() {
            return Ok(Work {
                comm,
                ready,
                call,
                path: Path::Fallback(fallback()),
            });
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
}

impl Work {
    /// The communicator.
    pub fn comm(&self) -> &Arc<Comm> {
        &self.comm
    }

    /// Its state.
    pub fn ready(&self) -> &Arc<Ready> {
        &self.ready
    }

    /// The NCCL function it came from (`ncclSend`, ...).
    pub fn call(&self) -> &'static str {
        self.call
    }

    /// Whether it goes to the fallback NCCL.
    pub fn is_fallback(&self) -> bool {
        matches!(self.path, Path::Fallback(_))
    }
}

/// Issues fallback work inside one group of the fallback library.
///
/// # Safety
/// The buffers and streams of every call must be valid as `nccl.h` documents for it.
pub unsafe fn issue_fallback(list: &[&Work]) -> NResult<()> {
    let Some(lib) = list
        .iter()
        .find_map(|w| w.ready.fallback.as_ref().map(|f| f.lib))
    else {
        return Err(NcclError::internal(
            "fallback work without a fallback communicator",
        ));
    };
    lib.group_start()?;
    let issued = list.iter().try_for_each(|w| match &w.path {
        Path::Fallback(f) => {
            let fb = w.ready.fallback.as_ref().ok_or_else(|| {
                NcclError::internal(format!(
                    "{}: routed to a fallback that is not loaded",
                    w.call
                ))
            })?;
            // SAFETY: the caller's contract.
            unsafe { f.issue(fb, w.call) }
        }
        Path::Native(_) => Ok(()),
    });
    let ended = lib.group_end();
    issued.and(ended)
}

/// One communicator's native work: its sends and receives progressed together, then its
/// collectives in call order. A remote error is recorded on the communicator.
///
/// # Safety
/// The buffers and streams of every call must be valid as `nccl.h` documents for it.
pub unsafe fn run_native(comm: &Comm, ready: &Ready, list: &[&Work]) -> NResult<()> {
    // An abort from another thread or a dead peer ends the host-side waits of these calls.
    let result = mscclpp::backoff::watching(comm.watch(ready), || -> NResult<()> {
        // An all-to-all (collective: every rank has it in its group alike) first tries core's
        // direct path on its own stream (captured calls on registrable buffers); what it
        // declines joins the group's sends and receives. (No allocation unless the group has
        // sends or receives: an eager collective allocates nothing per call.)
        let mut failed: Option<NcclError> = None;
        let parts: Vec<P2pCall> = list
            .iter()
            .filter_map(|w| match &w.path {
                Path::Native(NativeWork::Parts(parts, a2a)) => {
                    if let (Some(a), Some(p2p)) = (a2a, &ready.p2p) {
                        if failed.is_some() {
                            return None;
                        }
                        // SAFETY: the caller's contract (the all-to-all's buffers and stream).
                        match unsafe { p2p.all_to_all_direct(a.send, a.recv, a.per, a.stream) } {
                            Ok(true) => return None,
                            Ok(false) => {}
                            Err(e) => {
                                failed = Some(NcclError::from(e).context(w.call));
                                return None;
                            }
                        }
                    }
                    Some(parts.iter().copied())
                }
                _ => None,
            })
            .flatten()
            // A zero-count send or receive is a no-op, as in NCCL: it matches nothing (a lone
            // zero-count send to this rank itself included).
            .filter(|c| c.op.bytes > 0)
            .collect();
        if let Some(e) = failed {
            return Err(e);
        }
        if !parts.is_empty() {
            // SAFETY: the caller's contract.
            unsafe { run_parts(comm, ready, &parts)? };
        }
        for w in list {
            if let Path::Native(NativeWork::Collective { choice, stream, .. }) = &w.path {
                // SAFETY: the caller's contract.
                unsafe { ready.native.run(choice, *stream) }.map_err(|e| e.context(w.call))?;
            }
        }
        Ok(())
    });
    if let Err(e) = &result {
        if e.code == abi::REMOTE_ERROR {
            comm.set_async_error(e);
        }
    }
    result
}

/// # Safety
/// As [`run_native`].
///
/// The batch runs on the first call's stream (GPU: one launch of core's point-to-point
/// kernel). When the calls use several streams, this thread waits for the others before and
/// for the batch's stream after (outside graph capture: correct, not asynchronous).
unsafe fn run_parts(comm: &Comm, ready: &Ready, calls: &[P2pCall]) -> NResult<()> {
    let ops: Vec<P2pOp> = calls.iter().map(|c| c.op).collect();
    let Some(p2p) = &ready.p2p else {
        // GPU builds at world size 1 (or without a point-to-point setup): only sends to self
        // are routed here, copied in the receiving call's stream order.
        // SAFETY: the caller's contract.
        return unsafe { device_self_copies(ready, calls, comm.rank) };
    };
    let stream = calls.first().map_or(0, |c| c.stream);
    let others: Vec<u64> = calls
        .iter()
        .map(|c| c.stream)
        .filter(|&s| s != stream)
        .collect();
    for &s in &others {
        sync_stream(comm.device, s)?;
    }
    let check_peer = |p: usize| {
        ready
            .peers
            .check_peer(p)
            .map_err(|e| mscclpp::Error::remote(p, e.msg))
    };
    let hooks = Hooks {
        aborted: &|| comm.is_aborted(),
        check_peer: &check_peer,
    };
    // SAFETY: buffers the caller vouched for, valid until the group ends (host) or until the
    // stream ran the batch (GPU).
    unsafe { p2p.run_with(&ops, stream, &hooks) }.map_err(NcclError::from)?;
    if !others.is_empty() {
        sync_stream(comm.device, stream)?;
    }
    Ok(())
}

/// Waits for `stream` of GPU `device` (a no-op on the host backend).
fn sync_stream(device: i32, stream: u64) -> NResult<()> {
    use mscclpp_hal::{prelude::*, Gpu, StreamInterop};
    if crate::HOST_BACKEND {
        return Ok(());
    }
    let hal = |e: mscclpp_hal::Error| {
        NcclError::from(mscclpp::Error::from(e)).context("joining the streams of a send/recv group")
    };
    let dev = Gpu::open_device(usize::try_from(device).unwrap_or(0)).map_err(hal)?;
    // SAFETY: a stream the caller passed to one of the group's calls (live until it returns).
    let s = unsafe { <Gpu as StreamInterop>::borrow_stream(&dev, stream) };
    // The kernels give up at the point-to-point timeout (MSCCLPP_P2P_TIMEOUT) and record why;
    // wait a little longer, so that error is the one reported.
    let bound = mscclpp::Env::current().p2p_timeout() + std::time::Duration::from_secs(5);
    Gpu::stream_synchronize(&s, bound).map_err(hal)
}

/// # Safety
/// As [`run_native`].
unsafe fn device_self_copies(ready: &Ready, calls: &[P2pCall], rank: usize) -> NResult<()> {
    let sends: Vec<&P2pCall> = calls.iter().filter(|c| c.op.dir == Dir::Send).collect();
    let recvs: Vec<&P2pCall> = calls.iter().filter(|c| c.op.dir == Dir::Recv).collect();
    if sends.len() != recvs.len() || calls.iter().any(|c| c.op.peer != rank) {
        return Err(NcclError::usage(
            "sends to and receives from this rank must come in matching pairs within one group",
        ));
    }
    for (s, r) in sends.iter().zip(&recvs) {
        if s.op.bytes != r.op.bytes {
            return Err(NcclError::usage(format!(
                "ncclSend to self sends {} bytes, the matching ncclRecv expects {}",
                s.op.bytes, r.op.bytes
            )));
        }
        // SAFETY: device buffers the caller vouched for.
        unsafe {
            ready
                .native
                .copy(r.op.buf, s.op.buf, r.op.bytes, r.stream)?
        };
    }
    Ok(())
}
