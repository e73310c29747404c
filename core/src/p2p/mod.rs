//! Point-to-point: sends and receives between ranks of a communicator, in batches (one batch =
//! one NCCL group), beside [`crate::collectives::Collectives`].
//!
//! A batch's operations are progressed together, so matched sends and receives complete in any
//! order without deadlock; per (peer, direction) messages match in call order, as NCCL
//! specifies. Both ends of a message must agree on its size: a receive whose size differs from
//! the matching send's is an error naming both sizes where the backend can tell (always on the
//! host backend, on both ends at once: the receiver that finds it tells the sender through the
//! bootstrap; on the GPU it is recorded on the device, see [`PointToPoint::device_error`]).
//! Sends to and receives from this rank itself are matched in call order and copied.
//!
//! Two implementations of the same API:
//!
//! * host backend ([`Device::CPU`], host.rs): chunks staged through a per-peer slot ring in the
//!   receiver's registered memory, written over a connection (CudaIpc within a host, Ethernet
//!   across hosts), announced and acknowledged with host semaphores; [`PointToPoint::run`]
//!   returns when the batch is done (liveness checks and an abort callback through
//!   [`Hooks`], a stall timeout).
//! * GPU (gpu.rs, kernels/cuda/src/p2p/batch.cu): one kernel launch per batch on the caller's
//!   stream (at most [`MAX_OPS_PER_LAUNCH`] operations to other ranks per launch), through
//!   receive rings in GPU memory every peer of the node maps (CudaIpc). Only peers on this
//!   node: [`PointToPoint::reaches`] tells; a batch naming another node's rank fails with
//!   "point-to-point between nodes on GPU builds is not supported yet".
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn f(comm: Arc<mscclpp::Communicator>, send: u64, recv: u64) -> mscclpp::Result<()> {
//! use mscclpp::p2p::{Dir, P2pOp, PointToPoint};
//! let p2p = PointToPoint::new(comm.clone(), mscclpp::Device::CPU)?; // every rank calls it
//! let (me, n) = (p2p.rank(), p2p.nranks());
//! let ops = [
//!     P2pOp::new(Dir::Send, (me + 1) % n, send, 1024),
//!     P2pOp::new(Dir::Recv, (me + n - 1) % n, recv, 1024),
//! ];
//! // SAFETY: both buffers hold 1024 bytes until the batch is done (host backend: on return).
//! unsafe { p2p.run(&ops, 0) }?;
//! # Ok(()) }
//! ```

mod gpu;
mod host;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::collectives::RawStream;
use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::transport::{Device, DeviceType};

pub use gpu::{chunk_of, GpuLayout, CHANNELS, CHUNK, MAX_OPS_PER_LAUNCH, MIN_CHUNK, SLOTS};

/// The default bound on a batch that makes no progress (host: the calling thread gives up;
/// GPU: the kernel records an error and returns): `MSCCLPP_P2P_TIMEOUT` (read when a
/// [`PointToPoint`] is made) overrides it, [`PointToPoint::set_timeout`] overrides both. A
/// host-backend batch also warns, naming the peers and sizes it waits for, after 5 s without
/// progress (a quarter of the timeout when that is shorter) and at every doubling.
pub const P2P_STALL_TIMEOUT: Duration = crate::env::P2P_TIMEOUT_DEFAULT;

/// Direction of a point-to-point operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// Send `bytes` from `buf` to `peer`.
    Send,
    /// Receive `bytes` from `peer` into `buf`.
    Recv,
}

/// One point-to-point operation.
#[derive(Clone, Copy, Debug)]
pub struct P2pOp {
    /// Send or receive.
    pub dir: Dir,
    /// The peer rank (may be this rank).
    pub peer: usize,
    /// The buffer's address: device memory on GPUs, host memory on the host backend.
    pub buf: u64,
    /// Bytes.
    pub bytes: usize,
}

/// What a host-backend batch asks its caller while it waits (the NCCL library's abort flag
/// and peer liveness); the GPU path never blocks and ignores them.
pub struct Hooks<'a> {
    /// Whether the caller gave up (checked while the batch stalls).
    pub aborted: &'a dyn Fn() -> bool,
    /// An error when rank `p` is known dead (checked every few ms while the batch stalls).
    pub check_peer: &'a dyn Fn(usize) -> Result<()>,
}

impl Hooks<'_> {
    /// No abort flag, no liveness checks (only the stall timeout).
    pub fn none() -> Hooks<'static> {
        Hooks {
            aborted: &|| false,
            check_peer: &|_| Ok(()),
        }
    }
}

impl P2pOp {
    /// A send (`Dir::Send`) or receive of `bytes` at `buf` with `peer`: `p2p.run(&[P2pOp::new(Dir::Send, peer, buf, bytes)], stream)` sends one message.
    pub fn new(dir: Dir, peer: usize, buf: u64, bytes: usize) -> P2pOp {
        P2pOp {
            dir,
            peer,
            buf,
            bytes,
        }
    }
}

/// The rooted helpers of [`PointToPoint::rooted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rooted {
    /// Every rank's buffer into block `rank` of the root's.
    Gather,
    /// Block `rank` of the root's buffer to every rank.
    Scatter,
}

enum Inner {
    Host(Mutex<host::HostP2p>),
    Gpu(Box<gpu::GpuP2p>),
}

/// The point-to-point state of one communicator (see the module doc).
pub struct PointToPoint {
    rank: usize,
    nranks: usize,
    device: Device,
    timeout: Duration,
    inner: Inner,
    /// `MSCCLPP_CHECK_CALLS` (collectives/check.rs).
    check: crate::collectives::check::P2pCheck,
}

impl PointToPoint {
    /// Sets up the links of this rank (collective: every rank of `comm` calls it, with its own
    /// device: [`Device::CPU`] on the host backend).
    pub fn new(comm: Arc<Communicator>, device: Device) -> Result<PointToPoint> {
        let b = comm.bootstrap();
        let (rank, nranks) = (b.rank(), b.nranks());
        let inner = match device.kind {
            DeviceType::Cpu => Inner::Host(Mutex::new(host::HostP2p::setup(&comm)?)),
            DeviceType::Gpu => Inner::Gpu(Box::new(gpu::GpuP2p::setup(&comm, device)?)),
        };
        Ok(PointToPoint {
            rank,
            nranks,
            device,
            timeout: crate::env::Env::current().p2p_timeout(),
            inner,
            check: crate::collectives::check::P2pCheck::new(&comm),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// World size.
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    /// The device the batches run on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Sets the stall timeout (default `MSCCLPP_P2P_TIMEOUT`, else [`P2P_STALL_TIMEOUT`]).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Whether batches may name `peer` (GPU: peers of this node and this rank; host: all).
    pub fn reaches(&self, peer: usize) -> bool {
        peer < self.nranks
            && match &self.inner {
                Inner::Host(_) => true,
                Inner::Gpu(g) => g.reaches(peer),
            }
    }

    /// Runs one batch (see the module doc): on a GPU enqueued on `stream` (returns without
    /// waiting for it; graph capture works, nothing on the host per launch), on the host
    /// backend done on return (`stream` ignored).
    ///
    /// # Safety
    /// Every buffer is valid for its `bytes` (readable for sends, writable for receives) on
    /// this rank's device until the batch is done (GPU: until `stream` has run it); `stream`
    /// is 0 or a live stream of the device.
    pub unsafe fn run(&self, ops: &[P2pOp], stream: RawStream) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.run_with(ops, stream, &Hooks::none()) }
    }

    /// [`PointToPoint::run`] with the caller's abort flag and liveness checks (host backend).
    ///
    /// # Safety
    /// As [`PointToPoint::run`].
    pub unsafe fn run_with(&self, ops: &[P2pOp], stream: RawStream, hooks: &Hooks) -> Result<()> {
        for op in ops {
            if op.peer >= self.nranks {
                return Err(Error::invalid(format!(
                    "point-to-point: peer {} of a {:?}: expected a rank below {}",
                    op.peer, op.dir, self.nranks
                )));
            }
        }
        let pairs = self_pairs(ops, self.rank)?;
        let prints = || ops.iter().map(|o| (o.peer, o.dir == Dir::Send, o.bytes));
        self.check.check_ops(prints)?;
        match &self.inner {
            Inner::Host(h) => {
                for (s, r) in pairs {
                    if s.bytes > 0 && s.buf != r.buf {
                        // SAFETY: the caller's contract; `copy` allows overlap.
                        unsafe {
                            std::ptr::copy(
                                s.buf as usize as *const u8,
                                r.buf as usize as *mut u8,
                                s.bytes,
                            )
                        };
                    }
                }
                let mut h = h.lock().unwrap_or_else(|p| p.into_inner());
                // SAFETY: forwarded.
                unsafe { h.run(ops, hooks, self.timeout) }
            }
            // SAFETY: forwarded.
            Inner::Gpu(g) => unsafe { g.run(ops, &pairs, stream, self.timeout) },
        }
    }

    /// GPU: the error a kernel recorded (a stall past the timeout naming the peer, a size
    /// mismatch naming the sizes), read from host-mapped memory without waiting for the GPU
    /// (every `run` checks it first and fails with it); `Ok` when none, and always on the host
    /// backend (whose errors are returned by `run`). After such an error the counters of the
    /// links are out of step: create a new `PointToPoint`.
    pub fn device_error(&self) -> Result<()> {
        match &self.inner {
            Inner::Host(_) => Ok(()),
            Inner::Gpu(g) => g.device_error(self.timeout),
        }
    }

    /// All-to-all: block `p` (of `per` bytes) of `send` to rank `p`, block `p` of `recv` from
    /// it, on stream `s`; in place when `send == recv` (each receive waits for the send out of
    /// its block), otherwise the buffers must not overlap.
    ///
    /// # Safety
    /// As [`PointToPoint::run`], for `nranks * per` bytes of each buffer.
    pub unsafe fn all_to_all(&self, send: u64, recv: u64, per: usize, s: RawStream) -> Result<()> {
        // SAFETY: forwarded.
        if unsafe { self.all_to_all_direct(send, recv, per, s) }? {
            return Ok(());
        }
        let n = self.nranks;
        let mut ops = blocks(Dir::Send, send, per, n);
        ops.extend(blocks(Dir::Recv, recv, per, n));
        // SAFETY: forwarded.
        unsafe { self.run(&ops, s) }
    }

    /// [`PointToPoint::all_to_all`]'s direct path alone (GPU, `s` capturing a graph, blocks of
    /// at least `MSCCLPP_P2P_TUNE`'s `direct` KiB, every rank on this node and able to
    /// register its receive buffer: each rank writes its blocks straight into the peers'
    /// receive buffers, one copy instead of two; see `gpu::GpuP2p::all_to_all_direct`).
    /// `Ok(true)` when it ran, `Ok(false)` when every rank declined (run the sends and
    /// receives instead). Collective: every rank of the communicator calls it alike (an
    /// all-to-all), capturing alike.
    ///
    /// # Safety
    /// As [`PointToPoint::all_to_all`].
    pub unsafe fn all_to_all_direct(
        &self,
        send: u64,
        recv: u64,
        per: usize,
        s: RawStream,
    ) -> Result<bool> {
        match &self.inner {
            Inner::Gpu(g) if self.nranks > 1 && per > 0 => {
                let prints = || (0..self.nranks).flat_map(|p| [(p, true, per), (p, false, per)]);
                self.check.check_ops(prints)?;
                // SAFETY: forwarded.
                unsafe { g.all_to_all_direct((send, recv), per, s, self.timeout) }
            }
            _ => Ok(false),
        }
    }

    /// Gather ([`Rooted::Gather`]: every rank's `bytes` at `send` into block `rank` of the
    /// root's `recv`, used only on the root) or scatter ([`Rooted::Scatter`]: block `rank` of
    /// the root's `send`, used only on the root, into every rank's `recv`).
    ///
    /// # Safety
    /// As [`PointToPoint::run`] (the root's block buffer: `nranks * bytes`).
    pub unsafe fn rooted(
        &self,
        kind: Rooted,
        (send, recv): (u64, u64),
        bytes: usize,
        root: usize,
        stream: RawStream,
    ) -> Result<()> {
        let (dir, own, root_dir, blocks_at) = match kind {
            Rooted::Gather => (Dir::Send, send, Dir::Recv, recv),
            Rooted::Scatter => (Dir::Recv, recv, Dir::Send, send),
        };
        let mut ops = vec![P2pOp::new(dir, root, own, bytes)];
        if self.rank == root {
            ops.extend(blocks(root_dir, blocks_at, bytes, self.nranks));
        }
        // SAFETY: forwarded.
        unsafe { self.run(&ops, stream) }
    }
}
/// One op of direction `dir` with every rank `p` of `n` on block `p` (of `per` bytes) at `base`.
pub fn blocks(dir: Dir, base: u64, per: usize, n: usize) -> Vec<P2pOp> {
    (0..n)
        .map(|p| P2pOp {
            dir,
            peer: p,
            buf: base + (p * per) as u64,
            bytes: per,
        })
        .collect()
}

/// The sends to and receives from `rank` itself, matched in call order: (send, receive).
fn self_pairs(ops: &[P2pOp], rank: usize) -> Result<Vec<(P2pOp, P2pOp)>> {
    let sends: Vec<P2pOp> = ops
        .iter()
        .filter(|o| o.peer == rank && o.dir == Dir::Send)
        .copied()
        .collect();
    let recvs: Vec<P2pOp> = ops
        .iter()
        .filter(|o| o.peer == rank && o.dir == Dir::Recv)
        .copied()
        .collect();
    if sends.len() != recvs.len() {
        return Err(Error::invalid(format!(
            "point-to-point: {} sends to this rank itself but {} receives from it in one batch: \
             expected them in matching pairs (ncclSend(peer=self) and ncclRecv(peer=self) \
             between one ncclGroupStart/ncclGroupEnd)",
            sends.len(),
            recvs.len()
        )));
    }
    for (s, r) in sends.iter().zip(&recvs) {
        if s.bytes != r.bytes {
            return Err(Error::invalid(format!(
                "point-to-point: a send to this rank itself sends {} bytes but the matching \
                 receive from itself expects {}: expected the same count and datatype",
                s.bytes, r.bytes
            )));
        }
    }
    Ok(sends.into_iter().zip(recvs).collect())
}
