//! The communicator behind an `ncclComm_t`: the handle type, the registry that validates
//! every handle before use, liveness of peers, and teardown (finalize, destroy, abort).
//!
//! A handle is the address of a small [`HandleCell`] (magic and a process-unique serial
//! number) that is never freed, so no later communicator can get the same handle: a copy of
//! a destroyed handle stays a destroyed handle. The registry maps live handles to their
//! [`Comm`] (kept alive by an `Arc`); every entry point looks the handle up ([`lookup`]) before
//! touching it, so a NULL, foreign (e.g. a real NCCL's), destroyed or corrupted handle is an
//! `ncclInvalidArgument`, never a dereference. The cells cost 16 bytes per communicator ever
//! created in the process.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use mscclpp::p2p::PointToPoint;
use mscclpp::{Communicator, TcpBootstrap, UniqueId};

use crate::abi::{self, NcclResult};
use crate::env::ForcedOps;
use crate::error::{set_last_error, NResult, NcclError};
use crate::fallback::FallbackComm;
use crate::native::Native;
use crate::peers::Peers;

/// The first 8 bytes of every [`Comm`]: `MSCLNCCL`.
pub const COMM_MAGIC: u64 = u64::from_le_bytes(*b"MSCLNCCL");

/// Bootstrap tags of split id hand-outs: `TAG_SPLIT_BASE + sequence number`.
pub const TAG_SPLIT_BASE: u64 = 0x4e43_434c_0001_0000;
/// Bootstrap tags of shrink id hand-outs (counted apart: excluded ranks never call shrink).
pub const TAG_SHRINK_BASE: u64 = 0x4e43_434c_0002_0000;

/// How long an abort waits for teardown before it returns anyway (the rest continues on a
/// background thread).
const ABORT_WAIT: Duration = Duration::from_millis(800);

/// One communicator. `#[repr(C)]` so [`COMM_MAGIC`] is at offset 0.
#[repr(C)]
pub struct Comm {
    magic: u64,
    /// This rank, as given to init.
    pub rank: usize,
    /// The number of ranks, as given to init.
    pub nranks: usize,
    /// The device ordinal (`ncclCommCuDevice`); 0 on the host backend.
    pub device: i32,
    /// Whether init was non-blocking (`config.blocking == 0`).
    pub nonblocking: bool,
    /// Set once, by init: the ready state or why init failed.
    state: OnceLock<NResult<Arc<Ready>>>,
    /// Set by `ncclCommAbort`: blocking loops stop and every later call fails (shared with the
    /// [`Comm::watch`] of calls in progress).
    aborted: Arc<AtomicBool>,
    /// GPU builds: the process's abort word, raised by `ncclCommRevoke` (so kernels of this
    /// communicator waiting for peers end) until the communicator is destroyed or aborted.
    device_abort: Mutex<Option<mscclpp_hal::abort::Hold>>,
    /// Set by `ncclCommFinalize`.
    finalized: AtomicBool,
    /// The first asynchronous error seen (`ncclSuccess` while none).
    async_error: AtomicI32,
    /// The first remote failure (a peer died, or a call failed because of one): later
    /// collectives and point-to-point calls fail fast with it ([`Comm::check_usable`]).
    remote_failure: OnceLock<String>,
    /// The same on every rank of this communicator and (but for a hash collision) different
    /// from any other's: a hash of its unique id ([`Comm::with_id`]). A group's end runs
    /// communicators in this order on every rank, so blocking work of several communicators
    /// in one group cannot wait in a circle.
    order_key: u64,
    /// The watch of [`Comm::watch`], made at the first call and cloned by later ones (an
    /// eager call's host path allocates nothing, issue 28).
    watch: OnceLock<mscclpp::backoff::Watch>,
}

/// What an initialized communicator owns.
pub struct Ready {
    /// The bootstrap (also inside `communicator` and `peers`), kept concretely for the id
    /// hand-outs of split and shrink.
    pub bootstrap: Arc<TcpBootstrap>,
    /// Connections, memory exchange, semaphores.
    pub communicator: Arc<Communicator>,
    /// The native collectives and copies.
    pub native: Native,
    /// Point-to-point (core's [`PointToPoint`]): the host backend's links, or on GPU builds the
    /// rings of the node's peers; `None` on GPU builds at world size 1 or when its setup
    /// failed (sends to self are then driver copies).
    pub p2p: Option<PointToPoint>,
    /// The real NCCL's communicator, when a fallback library was loaded.
    pub fallback: Option<FallbackComm>,
    /// Operations `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION` sends to the fallback.
    pub forced: ForcedOps,
    /// Which peers died or left.
    pub peers: Arc<Peers>,
    /// Split calls so far (names the tag of the next one's id hand-out).
    pub split_seq: AtomicU64,
    /// Shrink calls so far (every remaining rank calls each shrink).
    pub shrink_seq: AtomicU64,
    /// Why there is no fallback although one was asked for (for error messages).
    pub fallback_note: Option<String>,
    /// Operators made by `ncclRedOpCreatePreMulSum` (the fallback's ids).
    custom_ops: Mutex<HashSet<c_int>>,
}

impl Ready {
    /// Assembles the ready state.
    pub fn new(
        bootstrap: Arc<TcpBootstrap>,
        communicator: Arc<Communicator>,
        native: Native,
        p2p: Option<PointToPoint>,
        fallback: Option<FallbackComm>,
        forced: ForcedOps,
    ) -> Ready {
        Ready {
            peers: Arc::new(Peers::new(bootstrap.clone())),
            bootstrap,
            communicator,
            native,
            p2p,
            fallback,
            forced,
            split_seq: AtomicU64::new(0),
            shrink_seq: AtomicU64::new(0),
            fallback_note: None,
            custom_ops: Mutex::new(HashSet::new()),
        }
    }

    /// Whether `op` was made by `ncclRedOpCreatePreMulSum` on this communicator.
    pub fn has_custom_op(&self, op: c_int) -> bool {
        self.custom_ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&op)
    }

    /// Records (`add`) or forgets a custom operator; forgetting an unknown one is an error.
    pub fn note_custom_op(&self, op: c_int, add: bool) -> NResult<()> {
        let mut set = self.custom_ops.lock().unwrap_or_else(|p| p.into_inner());
        if add {
            set.insert(op);
            Ok(())
        } else if set.remove(&op) {
            Ok(())
        } else {
            Err(NcclError::arg(format!(
                "op {op}: expected an operator from ncclRedOpCreatePreMulSum on this \
                 communicator that was not destroyed yet"
            )))
        }
    }
}

impl Comm {
    /// A communicator of `nranks` ranks, this one `rank`, not yet initialized.
    pub fn new(rank: usize, nranks: usize, device: i32, nonblocking: bool) -> Comm {
        crate::env::warn_malformed();
        Comm {
            magic: COMM_MAGIC,
            rank,
            nranks,
            device,
            nonblocking,
            state: OnceLock::new(),
            aborted: Arc::new(AtomicBool::new(false)),
            device_abort: Mutex::new(None),
            finalized: AtomicBool::new(false),
            async_error: AtomicI32::new(abi::SUCCESS),
            remote_failure: OnceLock::new(),
            order_key: 0,
            watch: OnceLock::new(),
        }
    }

    /// This communicator, its order key taken from `id`, the unique id its ranks were created
    /// with (FNV-1a of its bytes).
    pub fn with_id(mut self, id: &UniqueId) -> Comm {
        self.order_key = id.as_bytes().iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        self
    }

    /// The order of this communicator's work at a group's end (see the field).
    pub fn order_key(&self) -> u64 {
        self.order_key
    }

    /// Records the outcome of init (only the first call has an effect).
    pub fn finish_init(&self, result: NResult<Arc<Ready>>) {
        let _ = self.state.set(result);
    }

    /// The ready state, or the error a call on this communicator returns now.
    pub fn ready(&self) -> NResult<Arc<Ready>> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(NcclError::usage(
                "the communicator was aborted or revoked (ncclCommAbort/ncclCommRevoke): expected a live communicator",
            ));
        }
        match self.state.get() {
            None => Err(NcclError {
                code: abi::INVALID_USAGE,
                msg: "the communicator is still initializing (non-blocking init or inside a \
                      group): expected ncclCommGetAsyncError to report ncclSuccess first"
                    .into(),
            }),
            Some(Ok(r)) => Ok(r.clone()),
            Some(Err(e)) => Err(e.clone().context("the communicator failed to initialize")),
        }
    }

    /// `ncclCommRevoke`: later calls fail and blocking loops stop (on GPUs the kernels' waits
    /// too: the abort word is raised until the communicator is destroyed); destroy still works.
    pub fn revoke(&self) {
        self.aborted.store(true, Ordering::Release);
        self.raise_device_abort("ncclCommRevoke");
    }

    /// Raises the abort word for this communicator's kernels (GPU builds), once.
    fn raise_device_abort(&self, call: &str) {
        let mut a = self.device_abort.lock().unwrap_or_else(|p| p.into_inner());
        if a.is_none() {
            *a = mscclpp::communicator::raise_device_abort(
                None,
                format!("{call} on rank {} of {}", self.rank, self.nranks),
            );
        }
    }

    /// Whether `ncclCommAbort` or `ncclCommRevoke` was called.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// What ends the host-side waits of a call on this communicator in progress (installed
    /// with `mscclpp::backoff::watching` around it): `ncclCommAbort`/`ncclCommRevoke` from
    /// any thread, or a peer that died without destroying its communicator (naming it).
    /// Made once per communicator (its ready state is set once) and cloned.
    pub fn watch(&self, ready: &Ready) -> mscclpp::backoff::Watch {
        self.watch
            .get_or_init(|| Self::make_watch(self.aborted.clone(), ready.peers.clone()))
            .clone()
    }

    fn make_watch(aborted: Arc<AtomicBool>, peers: Arc<Peers>) -> mscclpp::backoff::Watch {
        Arc::new(move || {
            if aborted.load(Ordering::Acquire) {
                return Err(mscclpp::Error::Aborted(
                    "the communicator was aborted (ncclCommAbort/ncclCommRevoke) while the call \
                     was in progress"
                        .into(),
                ));
            }
            match peers.first_failure() {
                None => Ok(()),
                Some((peer, e)) => Err(mscclpp::Error::remote(peer, e.msg)),
            }
        })
    }

    /// Records an asynchronous error (the first one wins); a remote error also makes later
    /// collectives and point-to-point calls fail fast with its message.
    pub fn set_async_error(&self, e: &NcclError) {
        let _ = self.async_error.compare_exchange(
            abi::SUCCESS,
            e.code,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if e.code == abi::REMOTE_ERROR {
            let _ = self.remote_failure.set(e.msg.clone());
        }
    }

    /// `Err(ncclRemoteError)` once a remote failure was recorded: a collective or
    /// point-to-point call would wait for the failed peer until its timeout (on GPUs, a kernel
    /// spinning to its bound). `ncclCommShrink`, the queries and destroy/abort stay usable.
    pub fn check_usable(&self) -> NResult<()> {
        // A peer the bootstrap saw die: on GPUs the kernels of earlier calls ended their waits
        // early (the abort word), so nothing else would report it to a caller that does not
        // poll ncclCommGetAsyncError. One lock in the common case (no dead peer).
        if self.remote_failure.get().is_none() {
            if let Some(Ok(r)) = self.state.get() {
                if let Some((p, _)) = r.bootstrap.first_peer_failure() {
                    if let Err(e) = r.peers.check_peer(p) {
                        self.set_async_error(&e);
                    }
                }
            }
        }
        match self.remote_failure.get() {
            None => Ok(()),
            Some(m) => Err(NcclError::remote(format!(
                "this communicator saw a remote failure ({m}): expected ncclCommAbort, \
                 or ncclCommShrink without the failed ranks, before further communication"
            ))),
        }
    }

    /// `ncclCommGetAsyncError`'s answer: in progress while init runs, init's error, the first
    /// asynchronous error, or a peer that died.
    pub fn async_error(&self) -> NcclResult {
        if self.aborted.load(Ordering::Acquire) {
            return abi::INVALID_USAGE;
        }
        let recorded = self.async_error.load(Ordering::Acquire);
        if recorded != abi::SUCCESS {
            return recorded;
        }
        match self.state.get() {
            None => abi::IN_PROGRESS,
            Some(Err(e)) => e.code,
            Some(Ok(r)) => match r.peers.check_all() {
                Ok(()) => abi::SUCCESS,
                Err(e) => {
                    set_last_error(e.code, &format!("ncclCommGetAsyncError: {}", e.msg));
                    self.set_async_error(&e);
                    e.code
                }
            },
        }
    }
}

/// What an `ncclComm_t` points at: never freed, so its address is never handed out twice.
#[repr(C)]
pub struct HandleCell {
    magic: u64,
    serial: u64,
}

/// The live handles (address -> communicator) and the retired ones (destroyed or aborted).
#[derive(Default)]
struct Registry {
    // Ordered maps, not hash maps: a job has a handful of communicators, and hashing the
    // handle (SipHash) was a measurable part of an eager call's host time (issue 28).
    live: BTreeMap<usize, (u64, Arc<Comm>)>,
    retired: BTreeSet<usize>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static REG: OnceLock<Mutex<Registry>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(Registry::default()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Work of a communicator's init: its ready state or why it failed.
pub type InitJob = Box<dyn FnOnce() -> NResult<Arc<Ready>> + Send + Sync>;

impl Comm {
    /// Runs `job` on a background thread and records its outcome on `comm`.
    pub fn init_in_background(comm: Arc<Comm>, job: InitJob) -> NResult<()> {
        std::thread::Builder::new()
            .name("mscclpp-nccl-init".into())
            .spawn(move || {
                let r = job();
                comm.finish_init(r);
            })
            .map(|_| ())
            .map_err(|e| NcclError::system(format!("spawning the init thread failed: {e}")))
    }
}

/// Adds `comm` to the registry and returns its handle: the address of a fresh
/// [`HandleCell`], which no later communicator can share.
pub fn register(comm: Arc<Comm>) -> *mut Comm {
    static SERIAL: AtomicU64 = AtomicU64::new(1);
    let cell: &'static mut HandleCell = Box::leak(Box::new(HandleCell {
        magic: COMM_MAGIC,
        serial: SERIAL.fetch_add(1, Ordering::Relaxed),
    }));
    let serial = cell.serial;
    let ptr = cell as *mut HandleCell as *mut Comm;
    registry().live.insert(ptr as usize, (serial, comm));
    ptr
}

/// The communicator behind `handle`: `ncclInvalidArgument` for NULL and for any address that
/// is not a live communicator of this library.
pub fn lookup(handle: *const Comm) -> NResult<Arc<Comm>> {
    if handle.is_null() {
        return Err(NcclError::arg(
            "comm is NULL: expected a communicator from ncclCommInitRank",
        ));
    }
    let reg = registry();
    let comm = match reg.live.get(&(handle as usize)) {
        Some((serial, c)) => {
            // SAFETY: a live handle is the address of a `HandleCell` of `register`, never freed.
            let cell = unsafe { &*(handle as *const HandleCell) };
            if cell.magic != COMM_MAGIC || cell.serial != *serial {
                return Err(NcclError::arg(format!(
                    "comm {handle:p}: its handle cell was overwritten (magic {:#018x}, serial \
                     {} instead of {serial}): memory corrupted",
                    cell.magic, cell.serial
                )));
            }
            c.clone()
        }
        None if reg.retired.contains(&(handle as usize)) => {
            return Err(NcclError::arg(format!(
                "comm {handle:p} was destroyed or aborted already (a stale handle): expected a \
                 live communicator; a destroyed handle never names another communicator"
            )))
        }
        None => {
            return Err(NcclError::arg(format!(
                "comm {handle:p} is not a communicator of libmscclpp_nccl (a foreign NCCL's \
                 communicator or a corrupted pointer): expected a handle from this library's \
                 ncclCommInitRank"
            )))
        }
    };
    drop(reg);
    if comm.magic != COMM_MAGIC {
        return Err(NcclError::arg(format!(
            "comm {handle:p}: bad magic {:#018x}, expected {COMM_MAGIC:#018x}: memory corrupted",
            comm.magic
        )));
    }
    Ok(comm)
}

/// The communicator behind `handle` and its ready state.
pub fn ready(handle: *const Comm) -> NResult<(Arc<Comm>, Arc<Ready>)> {
    let comm = lookup(handle)?;
    let ready = comm.ready()?;
    Ok((comm, ready))
}

/// Removes `handle` from the registry (so later calls with it fail) and returns it.
fn unregister(handle: *const Comm) -> NResult<Arc<Comm>> {
    let comm = lookup(handle)?;
    {
        let mut reg = registry();
        reg.live.remove(&(handle as usize));
        reg.retired.insert(handle as usize);
    }
    // Its buffer registrations go with it (a later communicator may get the same address).
    crate::mem::forget_comm(Arc::as_ptr(&comm) as usize);
    Ok(comm)
}

/// `ncclCommFinalize`: tells the peers this rank leaves on purpose; later collectives fail.
pub fn finalize(handle: *const Comm) -> NResult<NcclResult> {
    let comm = lookup(handle)?;
    let ready = comm.ready()?;
    if let Some(fb) = &ready.fallback {
        fb.finalize()?;
    }
    if !comm.finalized.swap(true, Ordering::AcqRel) {
        ready.peers.say_goodbye();
    }
    Ok(abi::SUCCESS)
}

/// `ncclCommDestroy`: frees this rank's resources (peers are told it left on purpose).
pub fn destroy(handle: *const Comm) -> NResult<NcclResult> {
    let comm = unregister(handle)?;
    if let Some(Ok(ready)) = comm.state.get() {
        if !comm.finalized.swap(true, Ordering::AcqRel) {
            ready.peers.say_goodbye();
        }
        if let Some(fb) = &ready.fallback {
            fb.destroy();
        }
    }
    drop(comm);
    Ok(abi::SUCCESS)
}

/// `ncclCommAbort`: stops every blocking call of this communicator and frees it, returning
/// within about a second whatever the peers do (the rest of the teardown, if slow, finishes
/// on a background thread).
pub fn abort(handle: *const Comm) -> NResult<NcclResult> {
    let comm = unregister(handle)?;
    comm.aborted.store(true, Ordering::Release);
    // GPU builds: kernels waiting for peers leave their waits within milliseconds; the word is
    // lowered once the teardown below dropped the communicator and the device drained.
    comm.raise_device_abort("ncclCommAbort");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("mscclpp-nccl-abort".into())
        .spawn(move || {
            if let Some(Ok(ready)) = comm.state.get() {
                if let Some(fb) = &ready.fallback {
                    fb.abort();
                }
            }
            drop(comm);
            let _ = tx.send(());
        });
    match spawned {
        Ok(_) => {
            let _ = rx.recv_timeout(ABORT_WAIT);
        }
        Err(e) => {
            return Err(NcclError::system(format!(
            "spawning the teardown thread failed: {e} (the communicator is aborted but not freed)"
        )))
        }
    }
    Ok(abi::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_remote_failure_makes_the_comm_refuse_communication() {
        let c = Comm::new(0, 2, 0, false);
        assert!(c.check_usable().is_ok());
        // Another kind of recorded error leaves it usable.
        c.set_async_error(&NcclError::usage("a bad call"));
        assert!(c.check_usable().is_ok());

        let c = Comm::new(0, 2, 0, false);
        c.set_async_error(&NcclError::remote("rank 1 failed"));
        let e = c.check_usable().unwrap_err();
        assert_eq!(e.code, abi::REMOTE_ERROR);
        assert!(e.msg.contains("rank 1 failed"), "{}", e.msg);
        assert!(e.msg.contains("ncclCommAbort"), "{}", e.msg);
        // The first failure is the one reported.
        c.set_async_error(&NcclError::remote("rank 0 failed"));
        assert!(c.check_usable().unwrap_err().msg.contains("rank 1"));
    }

    #[test]
    fn the_group_order_key_is_the_same_for_one_id_and_differs_between_ids() {
        let root: std::net::SocketAddr = "10.0.0.1:4000".parse().unwrap();
        let a = UniqueId::new(root, 7).unwrap();
        let a2 = UniqueId::from_bytes(&a.to_bytes()).unwrap();
        let b = UniqueId::new(root, 8).unwrap();
        let key = |id: &UniqueId, rank| Comm::new(rank, 2, 0, false).with_id(id).order_key();
        assert_eq!(key(&a, 0), key(&a2, 1));
        assert_ne!(key(&a, 0), key(&b, 0));
    }
}
