//! The `Algorithm` trait, the per-call description, the kernel argument block shared by every
//! collective kernel, and the helpers the host backend's "kernels" use.

use std::sync::atomic::{AtomicU32, Ordering};

use super::gpu::GpuCtx;
use super::setup::{Resources, MAX_FLAGS};
use super::types::{CollectiveKind, DataType, RawStream, ReduceOp};
use crate::error::Result;

/// One collective call as the algorithms see it.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// Which collective.
    pub kind: CollectiveKind,
    /// Send buffer (device address; host address on the host backend).
    pub send: u64,
    /// Receive buffer.
    pub recv: u64,
    /// Elements: all-reduce/broadcast: of the whole buffer; all-gather: sent per rank;
    /// reduce-scatter: received per rank.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (ignored by all-gather and broadcast).
    pub op: ReduceOp,
    /// Broadcast root (0 otherwise).
    pub root: usize,
}

impl Call {
    /// An all-reduce of `count` elements from `send` into `recv`.
    pub fn all_reduce(send: u64, recv: u64, count: usize, dtype: DataType, op: ReduceOp) -> Call {
        Call {
            kind: CollectiveKind::AllReduce,
            send,
            recv,
            count,
            dtype,
            op,
            root: 0,
        }
    }

    /// Bytes of `count` elements.
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size_in_bytes()
    }
    /// Whether the call is in place (all-gather: `send == recv + rank * bytes`; reduce-scatter:
    /// `recv == send + rank * bytes`).
    pub fn in_place(&self, rank: usize) -> bool {
        let b = self.bytes() as u64;
        match self.kind {
            CollectiveKind::AllGather => self.send == self.recv + rank as u64 * b,
            CollectiveKind::ReduceScatter => self.recv == self.send + rank as u64 * b,
            _ => self.send == self.recv,
        }
    }
}

/// An algorithm of a communicator's collection: a native one (one file under `allreduce/`,
/// `allgather/`, ... plus one kernel file under `kernels/cuda/src/collectives/<kind>/` and one
/// line in [`super::collection::native_algorithms`]), one a user adds through an
/// [`super::AlgorithmBuilder`] (its own kernel or host code; it may keep per-communicator
/// state in its own fields), or an execution plan ([`super::PlanAlgorithm`]).
pub trait Algorithm: Send + Sync + 'static {
    /// The name the selector and `MSCCLPP_<KIND>_ALGO` use (upstream's name).
    fn name(&self) -> &'static str;
    /// The collective it implements.
    fn kind(&self) -> CollectiveKind;
    /// `Ok` when it can run `call` (sizes fit the scratch, world size, dtype); otherwise an
    /// `InvalidUsage` error naming the limit.
    fn check(&self, res: &Resources, call: &Call) -> Result<()>;
    /// Enqueues the call on `stream` (GPU builds). Must not synchronise, allocate or talk
    /// to the bootstrap: it may be captured into a CUDA graph.
    fn launch_gpu(
        &self,
        res: &Resources,
        gpu: &GpuCtx,
        call: &Call,
        stream: RawStream,
    ) -> Result<()>;
    /// Runs the call with CPU threads (host backend); returns when it is complete.
    fn run_host(&self, res: &Resources, call: &Call) -> Result<()>;
    /// What the INFO line that names the running algorithm says (default: the name; plans add
    /// their file).
    fn description(&self) -> String {
        self.name().to_string()
    }
    /// Whether it runs on worlds spanning nodes (only the hierarchical algorithms do: the
    /// others map every peer's memory).
    fn multi_node(&self) -> bool {
        false
    }
}

/// Implements [`Algorithm`] for a native algorithm: the trait's signatures stand here once,
/// each algorithm file gives its name, kind (and `multi_node` for the hierarchical ones) and
/// the bodies, naming the receiver and parameters:
///
/// ```ignore
/// native_algorithm! {
///     Fullmesh: "fullmesh", AllGather;
///     check(self, res, call) { ... }
///     launch_gpu(self, res, gpu, call, stream) { ... }
///     run_host(self, res, call) { ... }
/// }
/// ```
macro_rules! native_algorithm {
    // One kind for every call (`CollectiveKind::$kind`).
    (
        $ty:ty: $name:literal, $kind:ident $(, multi_node = $multi:literal)?;
        $($rest:tt)*
    ) => {
        $crate::collectives::algorithm::native_algorithm! {
            @impl $ty: $name, [(&self) { $crate::collectives::types::CollectiveKind::$kind }]
            [$($multi)?];
            $($rest)*
        }
    };
    // The kind a field holds (`kind = self.<field>`).
    (
        $ty:ty: $name:literal, kind = $ks:ident.$field:tt $(, multi_node = $multi:literal)?;
        $($rest:tt)*
    ) => {
        $crate::collectives::algorithm::native_algorithm! {
            @impl $ty: $name, [(&$ks) { $ks.$field }] [$($multi)?];
            $($rest)*
        }
    };
    (
        @impl $ty:ty: $name:literal, [$kargs:tt $kind:block] [$($multi:literal)?];
        check($cs:ident, $cres:ident, $ccall:ident) $check:block
        launch_gpu($ls:ident, $lres:ident, $lgpu:ident, $lcall:ident, $lstream:ident) $launch:block
        run_host($hs:ident, $hres:ident, $hcall:ident) $host:block
    ) => {
        impl $crate::collectives::algorithm::Algorithm for $ty {
            fn name(&self) -> &'static str {
                $name
            }
            fn kind $kargs -> $crate::collectives::types::CollectiveKind $kind
            $(
                fn multi_node(&self) -> bool {
                    $multi
                }
            )?
            fn check(
                &$cs,
                $cres: &$crate::collectives::setup::Resources,
                $ccall: &$crate::collectives::algorithm::Call,
            ) -> $crate::error::Result<()> $check
            fn launch_gpu(
                &$ls,
                $lres: &$crate::collectives::setup::Resources,
                $lgpu: &$crate::collectives::gpu::GpuCtx,
                $lcall: &$crate::collectives::algorithm::Call,
                $lstream: $crate::collectives::types::RawStream,
            ) -> $crate::error::Result<()> $launch
            fn run_host(
                &$hs,
                $hres: &$crate::collectives::setup::Resources,
                $hcall: &$crate::collectives::algorithm::Call,
            ) -> $crate::error::Result<()> $host
        }
    };
}
pub(crate) use native_algorithm;

/// The kernel argument block (`struct CollArgs` of kernels/cuda/src/collectives/common.hpp).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollArgs {
    /// Send buffer.
    pub send: u64,
    /// Receive buffer.
    pub recv: u64,
    /// Elements (meaning as [`Call::count`]).
    pub count: u64,
    /// `u64[nranks]`: every rank's shared buffer mapped here.
    pub peer_bases: u64,
    /// `MemoryDevice2DeviceSemaphoreDeviceHandle[MAX_SEM_BLOCKS][nranks]`.
    pub sems: u64,
    /// `u32[MAX_FLAGS]`: the LL flags.
    pub flags: u64,
    /// Offset of the LL region in the shared buffer.
    pub ll_offset: u64,
    /// Bytes of one LL half.
    pub ll_half_bytes: u64,
    /// Offset of the plain scratch.
    pub plain_offset: u64,
    /// Bytes of the plain scratch.
    pub plain_bytes: u64,
    /// This rank.
    pub rank: i32,
    /// World size.
    pub nranks: i32,
    /// Broadcast root.
    pub root: i32,
    /// Entries of the flag array.
    pub nflags: u32,
    /// Algorithm-specific values.
    pub extra: [u64; 5],
}

impl CollArgs {
    /// The arguments of `call` on `res`.
    pub fn new(res: &Resources, call: &Call) -> CollArgs {
        CollArgs {
            send: call.send,
            recv: call.recv,
            count: call.count as u64,
            peer_bases: res.peer_bases_ptr(),
            sems: res.sems_ptr(),
            flags: res.flags_ptr(),
            ll_offset: res.layout().ll_offset as u64,
            ll_half_bytes: res.layout().ll_half_bytes as u64,
            plain_offset: res.layout().plain_offset as u64,
            plain_bytes: res.layout().plain_bytes as u64,
            rank: res.rank() as i32,
            nranks: res.nranks() as i32,
            root: call.root as i32,
            nflags: MAX_FLAGS as u32,
            extra: [0; 5],
        }
    }
}

/// Host backend: the flag block `blk` reads at its start.
pub fn host_flag(res: &Resources, blk: usize) -> u32 {
    // SAFETY: the meta buffer is live host memory of MAX_FLAGS u32 at flags_ptr (host backend).
    unsafe { flag_atomic(res, blk) }.load(Ordering::Relaxed)
}

/// Host backend: every flag entry becomes `flag + 1`, as the kernels leave them.
pub fn host_bump_flags(res: &Resources, flag: u32) {
    for i in 0..MAX_FLAGS {
        // SAFETY: as in host_flag; i < MAX_FLAGS.
        unsafe { flag_atomic(res, i) }.store(flag.wrapping_add(1), Ordering::Relaxed);
    }
}

/// # Safety
/// Host backend only (the meta buffer is host memory); `i < MAX_FLAGS`.
unsafe fn flag_atomic<'a>(res: &Resources, i: usize) -> &'a AtomicU32 {
    // SAFETY: forwarded from the caller; the flags are 4-byte aligned u32.
    unsafe { AtomicU32::from_ptr((res.flags_ptr() as usize as *mut u32).add(i)) }
}

/// Host backend: block `blk` signals peer `p` (its semaphore (blk, p)).
pub fn host_signal(res: &Resources, blk: usize, p: usize) {
    let h = res.sem_handle(blk, p);
    // SAFETY: the handle's tokens live in the shared buffers mapped here, kept alive by `res`.
    unsafe { crate::device_emu::semaphore::signal(h.remote_inbound_token) }
}

/// Host backend: block `blk` waits for the next signal of peer `p`.
pub fn host_wait(res: &Resources, blk: usize, p: usize) -> Result<()> {
    let h = res.sem_handle(blk, p);
    // SAFETY: as in host_signal; this thread is the only waiter of (blk, p).
    unsafe {
        crate::device_emu::semaphore::wait(
            h.inbound_token,
            h.expected_inbound_token,
            res.config().host_timeout,
        )
    }
    .map_err(|e| {
        crate::backoff::describe_wait_error(
            e,
            |e| format!("collectives: block {blk} waiting for rank {p}: {e}"),
            res.config().host_timeout,
        )
    })
}

/// Host backend: block `blk` synchronises with the same block of every peer.
pub fn host_barrier(res: &Resources, blk: usize) -> Result<()> {
    for p in (0..res.nranks()).filter(|&p| p != res.rank()) {
        host_signal(res, blk, p);
    }
    for p in (0..res.nranks()).filter(|&p| p != res.rank()) {
        host_wait(res, blk, p)?;
    }
    Ok(())
}

/// `[begin, end)` of part `i` when `n` items are split into `parts` near-equal parts.
pub fn split(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let per = n / parts;
    let rem = n % parts;
    let begin = i * per + i.min(rem);
    (begin, begin + per + usize::from(i < rem))
}

/// Host backend: block `blk` synchronises with the same block of every peer on this node
/// (the hierarchical algorithms; peers on other nodes have no memory semaphores).
pub fn host_local_barrier(res: &Resources, blk: usize) -> Result<()> {
    for p in res.topo().local_peers() {
        host_signal(res, blk, p);
    }
    for p in res.topo().local_peers() {
        host_wait(res, blk, p)?;
    }
    Ok(())
}
