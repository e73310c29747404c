//! Communicator creation: `ncclCommInitRank[Config|Scalable]`, `ncclCommInitAll`,
//! `ncclCommSplit`, `ncclCommShrink`, and bringing up the fallback NCCL beside ours.
//!
//! Init builds a [`TcpBootstrap`] from the unique id, a communicator, the native state and
//! core's point-to-point ([`PointToPoint`]: the host links, or on GPU builds with peers the
//! rings of the node's ranks). Blocking init does it in the call; inside a
//! group it runs at the group's end; with `config.blocking = 0` on a background thread (the
//! call returns `ncclInProgress` and `ncclCommGetAsyncError` reports when it is done).

use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

use mscclpp::p2p::PointToPoint;
use mscclpp::{Bootstrap, Communicator, Context, TcpBootstrap, UniqueId};

use crate::abi::{self, NcclConfig, NcclResult, NcclUniqueId};
use crate::backend;
use crate::checks::check_rank;
use crate::comm::{self, register, Comm, InitJob, Ready};
use crate::env;
use crate::error::{NResult, NcclError};
use crate::fallback::{FallbackComm, FallbackLib};
use crate::group;
use crate::native::Native;
use crate::ops;

/// Bound on communicator init (bootstrap, connections, fallback init).
pub const INIT_TIMEOUT: Duration = Duration::from_secs(300);

/// What one rank's init needs.
#[derive(Clone)]
pub struct InitParams {
    /// Ranks in the new communicator.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// Where the bootstrap root listens.
    pub id: UniqueId,
    /// The device ordinal.
    pub device: i32,
    /// The caller's config (copied), for the fallback.
    pub config: Option<NcclConfig>,
    /// Non-blocking init.
    pub nonblocking: bool,
}

/// Reads and checks a caller's `ncclConfig_t` (NULL: defaults). Fields beyond the caller's
/// `size` keep their `NCCL_CONFIG_INITIALIZER` values.
///
/// # Safety
/// `config` must be NULL or point to at least `config->size` readable bytes.
pub unsafe fn parse_config(config: *const NcclConfig) -> NResult<Option<NcclConfig>> {
    if config.is_null() {
        return Ok(None);
    }
    let head = 16 + std::mem::size_of::<c_int>(); // size, magic, version, blocking
                                                  // SAFETY: every config starts with size_t size (the caller's contract).
    let size = unsafe { std::ptr::read_unaligned(config as *const usize) };
    // SAFETY: as above; magic and version follow size in every version of the struct.
    let (magic, version) = unsafe { ((*config).magic, (*config).version) };
    if magic != abi::CONFIG_MAGIC {
        return Err(NcclError::arg(format!(
            "config: magic {magic:#x}, expected {:#x}: initialize ncclConfig_t with \
             NCCL_CONFIG_INITIALIZER",
            abi::CONFIG_MAGIC
        )));
    }
    if size < head || size > 1 << 20 {
        return Err(NcclError::arg(format!(
            "config: size {size}: expected sizeof(ncclConfig_t) from NCCL_CONFIG_INITIALIZER \
             (at least {head}; 2.28's is {})",
            std::mem::size_of::<NcclConfig>()
        )));
    }
    if !(21400..1_000_000).contains(&version) {
        return Err(NcclError::arg(format!(
            "config: version {version}: expected NCCL_VERSION_CODE of a header from 2.14 on"
        )));
    }
    let mut out = NcclConfig::initializer();
    let n = size.min(std::mem::size_of::<NcclConfig>());
    // SAFETY: `n` bytes are readable at `config` (the caller's contract) and fit in `out`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            config as *const u8,
            &mut out as *mut NcclConfig as *mut u8,
            n,
        )
    };
    out.size = std::mem::size_of::<NcclConfig>();
    match out.blocking {
        0 | 1 | abi::CONFIG_UNDEF_INT => Ok(Some(out)),
        b => Err(NcclError::arg(format!(
            "config: blocking {b}: expected 0 or 1"
        ))),
    }
}

fn nonblocking(config: &Option<NcclConfig>) -> bool {
    matches!(config, Some(c) if c.blocking == 0)
}

/// Builds one rank's ready state (collective over the new communicator's ranks). On failure
/// the root port this process may have reserved for the id is released.
pub fn build(p: &InitParams) -> NResult<Arc<Ready>> {
    let r = build_ready(p);
    if r.is_err() {
        TcpBootstrap::release_unique_id(&p.id);
    }
    r
}

fn build_ready(p: &InitParams) -> NResult<Arc<Ready>> {
    backend::bind_device(p.device)?;
    let forced = env::forced_fallback(&ops::fallback_names())?;
    let mut bootstrap = TcpBootstrap::new(p.rank, p.nranks).map_err(NcclError::from)?;
    bootstrap
        .initialize_with_id(&p.id, INIT_TIMEOUT)
        .map_err(|e| NcclError::from(e).context("bootstrap"))?;
    let bootstrap = Arc::new(bootstrap);
    let context = Context::new().map_err(NcclError::from)?;
    let dyn_bootstrap: Arc<dyn Bootstrap> = bootstrap.clone();
    let communicator = Arc::new(Communicator::new(dyn_bootstrap, context));
    let native = Native::new(&communicator, backend::device(p.device))?;
    let p2p = if crate::HOST_BACKEND {
        Some(
            PointToPoint::new(communicator.clone(), backend::device(p.device))
                .map_err(|e| NcclError::from(e).context("point-to-point setup"))?,
        )
    } else if p.nranks > 1 {
        // GPU builds: a failure (e.g. a build without device code) leaves send/recv between
        // ranks to the fallback; every rank fails alike.
        match PointToPoint::new(communicator.clone(), backend::device(p.device)) {
            Ok(p2p) => Some(p2p),
            Err(e) => {
                mscclpp::log_warn!("NCCL", "point-to-point setup failed (send/recv between ranks go to the fallback NCCL): {e}");
                None
            }
        }
    } else {
        None
    };
    let (fallback, note) = init_fallback(&bootstrap, p)?;
    mscclpp::log_info!(
        "NCCL",
        "libmscclpp_nccl: rank {} of {} on {} (native collectives: {}; fallback NCCL: {})",
        p.rank,
        p.nranks,
        if crate::HOST_BACKEND {
            "the host backend (CPU threads play the GPU)".to_string()
        } else {
            format!("device {}", p.device)
        },
        native
            .available()
            .map_or_else(|why| format!("none: {why}"), |()| "yes".into()),
        fallback.as_ref().map_or_else(
            || note.clone().unwrap_or_else(|| "none".into()),
            |f| format!("{} (version {})", f.lib.path, f.lib.version)
        )
    );
    let mut ready = Ready::new(bootstrap, communicator, native, p2p, fallback, forced);
    ready.fallback_note = note;
    Ok(Arc::new(ready))
}

/// Opens the fallback communicator when every rank loaded the library; otherwise none (and
/// a note for error messages saying why).
fn init_fallback(
    bootstrap: &TcpBootstrap,
    p: &InitParams,
) -> NResult<(Option<FallbackComm>, Option<String>)> {
    let lib = FallbackLib::get();
    let status: u8 = match lib {
        None => 0,
        Some(Ok(_)) => 1,
        Some(Err(_)) => 2,
    };
    let statuses = if p.nranks > 1 {
        bootstrap
            .all_gather(&[status])
            .map_err(|e| NcclError::from(e).context("fallback setup"))?
            .into_iter()
            .map(|v| v.first().copied().unwrap_or(0))
            .collect()
    } else {
        vec![status]
    };
    let lib = match lib {
        None => return Ok((None, None)),
        Some(Err(e)) => {
            mscclpp::log_warn!("NCCL", "no fallback: {e}");
            return Ok((None, Some(e.clone())));
        }
        Some(Ok(lib)) => lib,
    };
    if let Some(r) = statuses.iter().position(|&s| s != 1) {
        let why =
            format!(
            "the fallback NCCL is off: rank {r} {} (MSCCLPP_NCCL_LIB_PATH must name a loadable \
             NCCL on every rank)",
            if statuses[r] == 0 { "has no MSCCLPP_NCCL_LIB_PATH" } else { "could not load it" }
        );
        mscclpp::log_warn!("NCCL", "{why}");
        return Ok((None, Some(why)));
    }
    // Rank 0 makes the fallback's id; [1, id] on success, [0] when it failed.
    let mut msg = vec![0u8];
    if p.rank == 0 {
        match lib.unique_id() {
            Ok(id) => {
                msg[0] = 1;
                msg.extend_from_slice(&id.bytes());
            }
            Err(e) => mscclpp::log_warn!("NCCL", "fallback ncclGetUniqueId: {}", e.msg),
        }
    }
    let msg = if p.nranks > 1 {
        bootstrap
            .broadcast(&msg, 0)
            .map_err(|e| NcclError::from(e).context("fallback id broadcast"))?
    } else {
        msg
    };
    let id = match (msg.first(), msg.get(1..1 + abi::UNIQUE_ID_BYTES)) {
        (Some(1), Some(b)) => {
            let mut a = [0u8; abi::UNIQUE_ID_BYTES];
            a.copy_from_slice(b);
            NcclUniqueId::from_bytes(&a)
        }
        _ => {
            let why = "the fallback NCCL is off: its ncclGetUniqueId failed on rank 0".to_string();
            return Ok((None, Some(why)));
        }
    };
    let fb = lib.init(p.nranks, id, p.rank, p.config.as_ref());
    let ok = u8::from(fb.is_ok());
    let oks = if p.nranks > 1 {
        bootstrap
            .all_gather(&[ok])
            .map_err(|e| NcclError::from(e).context("fallback init"))?
    } else {
        vec![vec![ok]]
    };
    match (fb, oks.iter().position(|v| v.first() != Some(&1))) {
        (Ok(fb), None) => Ok((Some(fb), None)),
        (fb, Some(r)) => {
            if let Ok(fb) = fb {
                fb.destroy();
            }
            let why = format!("the fallback NCCL is off: its ncclCommInitRank failed on rank {r}");
            mscclpp::log_warn!("NCCL", "{why}");
            Ok((None, Some(why)))
        }
        (Err(e), None) => Err(NcclError::internal(format!(
            "fallback init status lost: {}",
            e.msg
        ))),
    }
}

/// Creates the handle for `p` and runs (or queues, or starts) its init; writes the handle to
/// `out` unless a blocking init failed.
///
/// # Safety
/// `out` must be valid for a write.
pub unsafe fn start(out: *mut *mut Comm, p: InitParams) -> NResult<NcclResult> {
    let comm = Arc::new(Comm::new(p.rank, p.nranks, p.device, p.nonblocking).with_id(&p.id));
    let handle = register(comm.clone());
    let job: InitJob = Box::new(move || build(&p));
    if group::in_group() {
        // SAFETY: the caller's contract.
        unsafe { *out = handle };
        return group::submit_init(comm, job);
    }
    if comm.nonblocking {
        Comm::init_in_background(comm, job)?;
        // SAFETY: the caller's contract.
        unsafe { *out = handle };
        return Ok(abi::IN_PROGRESS);
    }
    match job() {
        Ok(ready) => {
            comm.finish_init(Ok(ready));
            // SAFETY: the caller's contract.
            unsafe { *out = handle };
            Ok(abi::SUCCESS)
        }
        Err(e) => {
            let _ = comm::destroy(handle);
            Err(e)
        }
    }
}

/// Parses a caller's unique id.
pub fn parse_id(id: &NcclUniqueId) -> NResult<UniqueId> {
    UniqueId::from_bytes(&id.bytes()).map_err(|e| {
        NcclError::arg(format!(
            "commId: expected an id from this library's ncclGetUniqueId, copied unchanged to \
             every rank: {e}"
        ))
    })
}

/// `ncclCommInitRankConfig` (and `ncclCommInitRank` with a NULL config).
///
/// # Safety
/// `out` must be valid for a write; `config` as for [`parse_config`].
pub unsafe fn init_rank(
    out: *mut *mut Comm,
    nranks: c_int,
    id: &NcclUniqueId,
    rank: c_int,
    config: *const NcclConfig,
) -> NResult<NcclResult> {
    if out.is_null() {
        return Err(NcclError::arg("comm (the output pointer) is NULL"));
    }
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| NcclError::arg(format!("nranks {nranks}: expected at least 1")))?;
    let r = check_rank("rank", rank, n)?;
    let id = parse_id(id)?;
    // SAFETY: the caller's contract.
    let config = unsafe { parse_config(config)? };
    let p = InitParams {
        nranks: n,
        rank: r,
        id,
        device: backend::current_device()?,
        nonblocking: nonblocking(&config),
        config,
    };
    // SAFETY: checked non-NULL; the caller's contract.
    unsafe { start(out, p) }
}
