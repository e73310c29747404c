//! `mscclppNcclRegisterAlgorithm` (include/mscclpp_nccl_ext.h): algorithms of one's own,
//! registered through C, in the algorithm collection of every communicator created afterwards.
//!
//! `libmscclpp_nccl.so` carries its own copy of mscclpp, so a program's
//! `mscclpp::collectives::register_global` cannot reach its communicators; this C entry point
//! can. A registration is kept in a process-wide list (`registered`); the first one installs
//! two hooks in this library's copy of the collectives: a process-wide builder
//! (`ExtBuilder`: every communicator built afterwards gets one `ExtAlgorithm` per
//! registration made so far) and the process-wide selector (`ExtSelector`: the first
//! registered algorithm of the call's collective whose `select` callback takes the call, else
//! the library's default choice). Nothing else in the library sets a process-wide selector.
//!
//! An `ExtAlgorithm` is an adapter implementing [`Algorithm`]: its `check` asks `select`
//! (so a forced `MSCCLPP_<KIND>_ALGO=<name>` is checked too), `launch_gpu` and `run_host` call
//! `launch` with the call ([`CallInfo`]) and the communicator's shared resources
//! ([`Context`]: what the native kernels get in `CollArgs`, plus the host backend's semaphore
//! helpers). The collection's INFO line (subsystem `COLL`) names it when it starts running a
//! collective. No panic leaves a callback boundary: the exported function runs in the C
//! boundary's guard, the callbacks are called inside `catch_unwind` and the helpers handed to
//! C catch their own.

// The exported name is C's (`mscclppNcclRegisterAlgorithm`), not snake case.
#![allow(non_snake_case)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, Once};

use mscclpp::collectives::algorithm::{host_barrier, host_signal, host_wait};
use mscclpp::collectives::gpu::GpuCtx;
use mscclpp::collectives::setup::{MAX_FLAGS, MAX_SEM_BLOCKS};
use mscclpp::collectives::{
    native_algorithms, register_global, set_global_selector, Algorithm, AlgorithmBuilder,
    BuildContext, Call, CollectiveKind, RawStream, Resources, SelectContext, Selector,
};

use crate::abi::{self, NcclResult};
use crate::boundary::guard;
use crate::error::{set_last_error, NResult, NcclError};
use crate::native::{data_type, reduce_op};

/// `MSCCLPP_NCCL_ALGORITHM_VERSION`: the only version accepted.
pub const ALGORITHM_VERSION: c_int = 1;
/// The longest name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// `mscclppNcclCollective_t` values, in the order of the header.
const KINDS: [CollectiveKind; 4] = [
    CollectiveKind::AllReduce,
    CollectiveKind::AllGather,
    CollectiveKind::ReduceScatter,
    CollectiveKind::Broadcast,
];

/// `mscclppNcclCallInfo`: one call as the callbacks see it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CallInfo {
    /// `mscclppNcclCollective_t`.
    pub collective: c_int,
    /// `ncclDataType_t`.
    pub datatype: c_int,
    /// `ncclRedOp_t` (a built-in operator).
    pub op: c_int,
    /// Broadcast root (0 otherwise).
    pub root: c_int,
    /// World size.
    pub nranks: c_int,
    /// Elements (meaning as `Call::count`).
    pub count: usize,
    /// `count` times the element size.
    pub bytes: usize,
    /// Send buffer.
    pub sendbuff: *const c_void,
    /// Receive buffer.
    pub recvbuff: *mut c_void,
}

/// `mscclppNcclHostBarrierFn`.
pub type HostBarrierFn = unsafe extern "C" fn(*const Context, c_int) -> NcclResult;
/// `mscclppNcclHostSyncFn`.
pub type HostSyncFn = unsafe extern "C" fn(*const Context, c_int, c_int) -> NcclResult;

/// `mscclppNcclContext`: what `launch` gets to run a call on its communicator.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Context {
    /// This rank.
    pub rank: c_int,
    /// World size.
    pub nranks: c_int,
    /// The GPU ordinal (-1 on the host backend).
    pub device: c_int,
    /// 1 when `launch` runs the call on the calling thread (host backend).
    pub host_backend: c_int,
    /// `u64[nranks]`: every rank's shared buffer mapped here (`Resources::peer_bases_ptr`).
    pub peer_bases: *const u64,
    /// The semaphore handle table (`Resources::sems_ptr`).
    pub semaphores: *mut c_void,
    /// The LL flags (`Resources::flags_ptr`).
    pub flags: *mut u32,
    /// Entries of `flags`.
    pub nflags: u32,
    /// The semaphore table's first dimension.
    pub max_sem_blocks: u32,
    /// `Resources::max_waiting_blocks`.
    pub max_waiting_blocks: u32,
    /// Zero.
    pub reserved: u32,
    /// `Layout::ll_offset`.
    pub ll_offset: u64,
    /// `Layout::ll_half_bytes`.
    pub ll_half_bytes: u64,
    /// `Layout::plain_offset`.
    pub plain_offset: u64,
    /// `Layout::plain_bytes`.
    pub plain_bytes: u64,
    /// Host backend: [`host_barrier`] (None on GPUs).
    pub host_barrier: Option<HostBarrierFn>,
    /// Host backend: [`host_signal`].
    pub host_signal: Option<HostSyncFn>,
    /// Host backend: [`host_wait`].
    pub host_wait: Option<HostSyncFn>,
    /// The `Resources` of the communicator (for the helpers).
    pub internal: *const c_void,
}

/// The `select` callback.
pub type SelectFn = unsafe extern "C" fn(*const CallInfo, *mut c_void) -> c_int;
/// The `launch` callback (`stream` is a `cudaStream_t`).
pub type LaunchFn =
    unsafe extern "C" fn(*const CallInfo, *const Context, *mut c_void, *mut c_void) -> NcclResult;

/// `mscclppNcclAlgorithm`: what `mscclppNcclRegisterAlgorithm` registers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AlgorithmDesc {
    /// `sizeof(mscclppNcclAlgorithm)`.
    pub size: usize,
    /// [`ALGORITHM_VERSION`].
    pub version: c_int,
    /// `mscclppNcclCollective_t`.
    pub collective: c_int,
    /// The name (a C string, copied).
    pub name: *const c_char,
    /// Passed to the callbacks.
    pub user: *mut c_void,
    /// The selector.
    pub select: Option<SelectFn>,
    /// Runs a call.
    pub launch: Option<LaunchFn>,
}

impl AlgorithmDesc {
    /// `MSCCLPP_NCCL_ALGORITHM_INITIALIZER`.
    pub fn initializer() -> AlgorithmDesc {
        AlgorithmDesc {
            size: std::mem::size_of::<AlgorithmDesc>(),
            version: ALGORITHM_VERSION,
            collective: 0,
            name: std::ptr::null(),
            user: std::ptr::null_mut(),
            select: None,
            launch: None,
        }
    }
}

/// One registration.
struct Entry {
    kind: CollectiveKind,
    name: &'static str,
    /// The user pointer, as an address (the callbacks are documented thread-safe).
    user: usize,
    select: SelectFn,
    launch: LaunchFn,
}

/// The registrations so far, in order.
fn registered() -> &'static Mutex<Vec<Arc<Entry>>> {
    static R: Mutex<Vec<Arc<Entry>>> = Mutex::new(Vec::new());
    &R
}

fn snapshot() -> Vec<Arc<Entry>> {
    registered()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// The name of `kind` in the header.
fn c_name(kind: CollectiveKind) -> &'static str {
    match kind {
        CollectiveKind::AllReduce => "mscclppNcclAllReduce",
        CollectiveKind::AllGather => "mscclppNcclAllGather",
        CollectiveKind::ReduceScatter => "mscclppNcclReduceScatter",
        CollectiveKind::Broadcast => "mscclppNcclBroadcast",
    }
}

/// Checks `desc` and adds it to the registrations.
///
/// # Safety
/// `desc` is NULL or points to `desc.size` readable bytes; its name is NULL or a C string.
unsafe fn register(desc: *const AlgorithmDesc) -> NResult<NcclResult> {
    if desc.is_null() {
        return Err(NcclError::arg(
            "desc is NULL: expected a mscclppNcclAlgorithm (MSCCLPP_NCCL_ALGORITHM_INITIALIZER)",
        ));
    }
    // Read the two leading fields first: a desc of another size may be shorter than ours.
    // SAFETY: every version starts with `size_t size; int version;` (caller's pointer).
    let (size, version) = unsafe { ((*desc).size, (*desc).version) };
    let want = std::mem::size_of::<AlgorithmDesc>();
    if version != ALGORITHM_VERSION || size != want {
        return Err(NcclError::arg(format!(
            "desc has version {version} and size {size}: expected version {ALGORITHM_VERSION} \
             (MSCCLPP_NCCL_ALGORITHM_VERSION) and size {want} (sizeof(mscclppNcclAlgorithm))"
        )));
    }
    // SAFETY: the size says the whole struct is there.
    let d = unsafe { *desc };
    let kind = usize::try_from(d.collective)
        .ok()
        .and_then(|i| KINDS.get(i).copied())
        .ok_or_else(|| {
            NcclError::arg(format!(
                "collective {}: expected one of {}",
                d.collective,
                KINDS
                    .iter()
                    .enumerate()
                    .map(|(i, k)| format!("{} ({i})", c_name(*k)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    if d.name.is_null() {
        return Err(NcclError::arg(
            "name is NULL: expected the algorithm's name",
        ));
    }
    // SAFETY: checked non-NULL; the caller's C string.
    let name = unsafe { CStr::from_ptr(d.name) }
        .to_str()
        .map_err(|_| NcclError::arg("name is not UTF-8: expected a UTF-8 name"))?;
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(NcclError::arg(format!(
            "name {name:?} has {} bytes: expected 1 to {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    let (Some(select), Some(launch)) = (d.select, d.launch) else {
        return Err(NcclError::arg(format!(
            "`{name}`: select {} and launch {}: expected both callbacks",
            if d.select.is_some() { "set" } else { "NULL" },
            if d.launch.is_some() { "set" } else { "NULL" },
        )));
    };
    if native_algorithms()
        .iter()
        .any(|a| a.kind() == kind && a.name() == name)
    {
        return Err(NcclError::arg(format!(
            "{kind} algorithm `{name}`: expected a name that is not a native algorithm's"
        )));
    }
    let mut list = registered().lock().unwrap_or_else(|p| p.into_inner());
    if list.iter().any(|e| e.kind == kind && e.name == name) {
        return Err(NcclError::arg(format!(
            "{kind} algorithm `{name}`: expected a name not registered yet"
        )));
    }
    list.push(Arc::new(Entry {
        kind,
        // Registrations are few and live for the process.
        name: Box::leak(name.to_owned().into_boxed_str()),
        user: d.user as usize,
        select,
        launch,
    }));
    drop(list);
    static HOOKS: Once = Once::new();
    HOOKS.call_once(|| {
        register_global(ExtBuilder);
        set_global_selector(Some(Arc::new(ExtSelector)));
    });
    mscclpp::log_info!(
        "COLL",
        "registered {kind} algorithm `{name}` (mscclppNcclRegisterAlgorithm): communicators \
         created from now on get it"
    );
    Ok(abi::SUCCESS)
}

/// Registers an algorithm of one's own for every communicator created afterwards (see
/// include/mscclpp_nccl_ext.h).
///
/// # Safety
/// `desc` is NULL or a valid `mscclppNcclAlgorithm` whose callbacks stay callable with its
/// `user` pointer, from any thread, for the life of the process.
#[no_mangle]
pub unsafe extern "C" fn mscclppNcclRegisterAlgorithm(desc: *const AlgorithmDesc) -> NcclResult {
    // SAFETY: forwarded from the caller.
    guard("mscclppNcclRegisterAlgorithm", || unsafe { register(desc) })
}

/// Every communicator built after the first registration: one adapter per registration made
/// so far.
struct ExtBuilder;

impl AlgorithmBuilder for ExtBuilder {
    fn build(&self, _ctx: &BuildContext<'_>) -> mscclpp::Result<Vec<Arc<dyn Algorithm>>> {
        Ok(snapshot()
            .into_iter()
            .map(|entry| Arc::new(ExtAlgorithm { entry }) as Arc<dyn Algorithm>)
            .collect())
    }
}

/// The process-wide selector: the first registration of the call's collective that the
/// communicator has and whose `select` takes the call; else the default choice. Worlds
/// spanning nodes are left to the default (only multi-node algorithms run there).
struct ExtSelector;

impl Selector for ExtSelector {
    fn select(&self, ctx: &SelectContext<'_>) -> mscclpp::Result<Option<Arc<dyn Algorithm>>> {
        if ctx.query.nnodes > 1 {
            return Ok(None);
        }
        for e in snapshot().iter().filter(|e| e.kind == ctx.call.kind) {
            let Some(a) = ctx.find(e.kind, e.name) else {
                continue;
            };
            if ask_select(e, ctx.call, ctx.query.nranks)? {
                return Ok(Some(a));
            }
        }
        Ok(None)
    }
}

/// `call` as the callbacks see it.
fn call_info(call: &Call, nranks: usize) -> mscclpp::Result<CallInfo> {
    let datatype = (0..abi::NUM_TYPES)
        .find(|&v| data_type(v) == Some(call.dtype))
        .ok_or_else(|| mscclpp::Error::invalid(format!("{}: no ncclDataType_t", call.dtype)))?;
    let op = (0..abi::NUM_OPS)
        .find(|&v| reduce_op(v) == Some(call.op))
        .ok_or_else(|| mscclpp::Error::invalid(format!("{}: no ncclRedOp_t", call.op)))?;
    Ok(CallInfo {
        collective: KINDS.iter().position(|k| *k == call.kind).unwrap_or(0) as c_int,
        datatype,
        op,
        root: call.root as c_int,
        nranks: nranks as c_int,
        count: call.count,
        bytes: call.bytes(),
        sendbuff: call.send as usize as *const c_void,
        recvbuff: call.recv as usize as *mut c_void,
    })
}

/// Whether `e`'s `select` takes `call`.
fn ask_select(e: &Entry, call: &Call, nranks: usize) -> mscclpp::Result<bool> {
    let info = call_info(call, nranks)?;
    // SAFETY: the registration's callback and user pointer (valid for the process, as
    // documented); `info` outlives the call.
    let r = catch_unwind(AssertUnwindSafe(|| unsafe {
        (e.select)(&info, e.user as *mut c_void)
    }));
    r.map(|v| v != 0).map_err(|_| {
        mscclpp::Error::Internal(format!("`{}`: its select callback panicked", e.name))
    })
}

/// The adapter of one registration on one communicator.
struct ExtAlgorithm {
    entry: Arc<Entry>,
}

impl ExtAlgorithm {
    /// Calls `launch` for `call` (on the host backend when `stream` is None).
    fn launch(
        &self,
        res: &Resources,
        call: &Call,
        stream: Option<RawStream>,
    ) -> mscclpp::Result<()> {
        let e = &self.entry;
        let info = call_info(call, res.nranks())?;
        let host = stream.is_none();
        let l = res.layout();
        let ctx = Context {
            rank: res.rank() as c_int,
            nranks: res.nranks() as c_int,
            device: res.device().id,
            host_backend: c_int::from(host),
            peer_bases: res.peer_bases_ptr() as usize as *const u64,
            semaphores: res.sems_ptr() as usize as *mut c_void,
            flags: res.flags_ptr() as usize as *mut u32,
            nflags: MAX_FLAGS as u32,
            max_sem_blocks: MAX_SEM_BLOCKS as u32,
            max_waiting_blocks: res.max_waiting_blocks() as u32,
            reserved: 0,
            ll_offset: l.ll_offset as u64,
            ll_half_bytes: l.ll_half_bytes as u64,
            plain_offset: l.plain_offset as u64,
            plain_bytes: l.plain_bytes as u64,
            host_barrier: host.then_some(c_host_barrier as HostBarrierFn),
            host_signal: host.then_some(c_host_signal as HostSyncFn),
            host_wait: host.then_some(c_host_wait as HostSyncFn),
            internal: res as *const Resources as *const c_void,
        };
        HELPER_ERROR.with(|h| h.borrow_mut().clear());
        // SAFETY: the registration's callback and user pointer; `info` and `ctx` (and the
        // `Resources` it points to) outlive the call; the stream is the caller's.
        let r = catch_unwind(AssertUnwindSafe(|| unsafe {
            (e.launch)(
                &info,
                &ctx,
                stream.unwrap_or(0) as usize as *mut c_void,
                e.user as *mut c_void,
            )
        }))
        .map_err(|_| {
            mscclpp::Error::Internal(format!("`{}`: its launch callback panicked", e.name))
        })?;
        if r == abi::SUCCESS {
            return Ok(());
        }
        let helper = HELPER_ERROR.with(|h| std::mem::take(&mut *h.borrow_mut()));
        let msg = format!(
            "{} algorithm `{}`: launch returned {r}{}",
            e.kind,
            e.name,
            if helper.is_empty() {
                String::new()
            } else {
                format!(" ({helper})")
            }
        );
        Err(match r {
            abi::INVALID_ARGUMENT | abi::INVALID_USAGE => mscclpp::Error::invalid(msg),
            _ => mscclpp::Error::Internal(msg),
        })
    }
}

impl Algorithm for ExtAlgorithm {
    fn name(&self) -> &'static str {
        self.entry.name
    }
    fn kind(&self) -> CollectiveKind {
        self.entry.kind
    }
    fn check(&self, res: &Resources, call: &Call) -> mscclpp::Result<()> {
        if ask_select(&self.entry, call, res.nranks())? {
            Ok(())
        } else {
            Err(mscclpp::Error::invalid(format!(
                "{} algorithm `{}`: its select callback declines {} {} ({}): expected a call it \
                 takes",
                call.kind, self.entry.name, call.count, call.dtype, call.op
            )))
        }
    }
    fn launch_gpu(
        &self,
        res: &Resources,
        _gpu: &GpuCtx,
        call: &Call,
        stream: RawStream,
    ) -> mscclpp::Result<()> {
        self.launch(res, call, Some(stream))
    }
    fn run_host(&self, res: &Resources, call: &Call) -> mscclpp::Result<()> {
        self.launch(res, call, None)
    }
    fn description(&self) -> String {
        format!("{} (mscclppNcclRegisterAlgorithm)", self.entry.name)
    }
}

thread_local! {
    /// The last failure of a host helper on this thread, added to the launch's error.
    static HELPER_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs a host helper for C: checks `ctx` and `block` (and `peer`), runs `f` on the
/// communicator's resources, records a failure for `ncclGetLastError` and the launch's error.
///
/// # Safety
/// `ctx` is NULL or the context of a running `launch` (its `internal` is live `Resources`).
unsafe fn helper(
    what: &str,
    ctx: *const Context,
    block: c_int,
    peer: Option<c_int>,
    f: impl FnOnce(&Resources, usize, usize) -> mscclpp::Result<()>,
) -> NcclResult {
    let run = || -> NResult<()> {
        // SAFETY: forwarded from the caller.
        let c = unsafe { ctx.as_ref() }
            .filter(|c| !c.internal.is_null())
            .ok_or_else(|| NcclError::arg("ctx: expected the context launch got"))?;
        // SAFETY: `internal` is the `Resources` of the running launch.
        let res = unsafe { &*(c.internal as *const Resources) };
        let blk = usize::try_from(block)
            .ok()
            .filter(|&b| b < MAX_SEM_BLOCKS)
            .ok_or_else(|| {
                NcclError::arg(format!(
                    "block {block}: expected 0 to {}",
                    MAX_SEM_BLOCKS - 1
                ))
            })?;
        let p = match peer {
            None => 0,
            Some(p) => usize::try_from(p)
                .ok()
                .filter(|&p| p < res.nranks() && p != res.rank())
                .ok_or_else(|| {
                    NcclError::arg(format!(
                        "peer {p}: expected a rank below {} other than {}",
                        res.nranks(),
                        res.rank()
                    ))
                })?,
        };
        f(res, blk, p).map_err(NcclError::from)
    };
    let r = catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|_| {
        Err(NcclError::internal(
            "internal error (a panic was caught at the C boundary)",
        ))
    });
    match r {
        Ok(()) => abi::SUCCESS,
        Err(e) => {
            let e = e.context(what);
            set_last_error(e.code, &e.msg);
            HELPER_ERROR.with(|h| *h.borrow_mut() = e.msg.clone());
            e.code
        }
    }
}

/// `ctx->hostBarrier`.
unsafe extern "C" fn c_host_barrier(ctx: *const Context, block: c_int) -> NcclResult {
    // SAFETY: the context of a running launch (documented).
    unsafe {
        helper("hostBarrier", ctx, block, None, |res, b, _| {
            host_barrier(res, b)
        })
    }
}

/// `ctx->hostSignal`.
unsafe extern "C" fn c_host_signal(ctx: *const Context, block: c_int, peer: c_int) -> NcclResult {
    // SAFETY: as above.
    unsafe {
        helper("hostSignal", ctx, block, Some(peer), |res, b, p| {
            host_signal(res, b, p);
            Ok(())
        })
    }
}

/// `ctx->hostWait`.
unsafe extern "C" fn c_host_wait(ctx: *const Context, block: c_int, peer: c_int) -> NcclResult {
    // SAFETY: as above.
    unsafe { helper("hostWait", ctx, block, Some(peer), host_wait) }
}
