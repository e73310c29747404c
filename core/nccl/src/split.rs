//! Communicators made from others or many at once: `ncclCommSplit`, `ncclCommShrink`,
//! `ncclCommInitAll` and `ncclCommInitRankScalable`.
//!
//! Split and shrink agree on the members over the parent's bootstrap; the new communicator's
//! rank 0 makes a fresh unique id and hands it to the other members over the parent's
//! bootstrap (tag `TAG_SPLIT_BASE + n` for the parent's n-th split, `TAG_SHRINK_BASE + n` for
//! its n-th shrink, counted apart because excluded ranks never call shrink), then every member
//! runs a normal init.

use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mscclpp::{Bootstrap, TcpBootstrap, UniqueId};

use crate::abi::{self, NcclConfig, NcclResult, NcclUniqueId};
use crate::backend;
use crate::checks::check_rank;
use crate::comm::{self, Comm, Ready, TAG_SHRINK_BASE, TAG_SPLIT_BASE};
use crate::error::{NResult, NcclError};
use crate::init::{self, InitParams, INIT_TIMEOUT};

/// Hands a fresh id from `members[0]` to the other members under `tag`; returns it.
fn hand_out_id(ready: &Ready, members: &[usize], tag: u64) -> NResult<UniqueId> {
    let me = ready.bootstrap.rank();
    if members.first() == Some(&me) {
        let id = TcpBootstrap::create_unique_id().map_err(NcclError::from)?;
        for &m in &members[1..] {
            ready.bootstrap.send(id.as_bytes(), m, tag).map_err(|e| {
                NcclError::from(e).context(format!("sending the new id to rank {m}"))
            })?;
        }
        Ok(id)
    } else {
        let leader = members[0];
        let bytes = ready
            .bootstrap
            .recv_timeout(leader, tag, INIT_TIMEOUT)
            .map_err(|e| {
                NcclError::from(e).context(format!("receiving the new id from rank {leader}"))
            })?;
        UniqueId::from_bytes(&bytes).map_err(NcclError::from)
    }
}

/// The config of a child: the caller's, else the parent's blocking mode.
///
/// # Safety
/// As [`init::parse_config`].
unsafe fn child_config(
    parent: &Comm,
    config: *const NcclConfig,
) -> NResult<(Option<NcclConfig>, bool)> {
    // SAFETY: forwarded.
    let cfg = unsafe { init::parse_config(config)? };
    let nb = match &cfg {
        Some(c) => c.blocking == 0,
        None => parent.nonblocking,
    };
    Ok((cfg, nb))
}

/// A communicator made of some of a parent's ranks.
struct Child {
    /// The parent's ranks in it, in the new rank order.
    members: Vec<usize>,
    /// The bootstrap tag of its id hand-out.
    tag: u64,
    config: Option<NcclConfig>,
    nonblocking: bool,
}

impl Child {
    /// Hands out the new id and runs (or queues, or starts) this rank's init of the child.
    ///
    /// # Safety
    /// `newcomm` must be valid for a write.
    unsafe fn start(
        self,
        parent: &Comm,
        ready: &Ready,
        newcomm: *mut *mut Comm,
    ) -> NResult<NcclResult> {
        let rank = self
            .members
            .iter()
            .position(|&r| r == parent.rank)
            .ok_or_else(|| {
                NcclError::internal("the calling rank is missing from its new communicator")
            })?;
        let id = hand_out_id(ready, &self.members, self.tag)?;
        let p = InitParams {
            nranks: self.members.len(),
            rank,
            id,
            device: parent.device,
            config: self.config,
            nonblocking: self.nonblocking,
        };
        // SAFETY: the caller's contract.
        unsafe { init::start(newcomm, p) }
    }
}

/// `ncclCommSplit`.
///
/// # Safety
/// `newcomm` must be valid for a write; `config` as for [`init::parse_config`].
pub unsafe fn split(
    handle: *const Comm,
    color: c_int,
    key: c_int,
    newcomm: *mut *mut Comm,
    config: *const NcclConfig,
) -> NResult<NcclResult> {
    let (parent, ready) = comm::ready(handle)?;
    if newcomm.is_null() {
        return Err(NcclError::arg("newcomm is NULL"));
    }
    if color < 0 && color != abi::SPLIT_NOCOLOR {
        return Err(NcclError::arg(format!(
            "color {color}: expected a non-negative color or NCCL_SPLIT_NOCOLOR (-1)"
        )));
    }
    // SAFETY: forwarded.
    let (cfg, nonblocking) = unsafe { child_config(&parent, config)? };
    let seq = ready.split_seq.fetch_add(1, Ordering::AcqRel);
    let mut mine = color.to_le_bytes().to_vec();
    mine.extend_from_slice(&key.to_le_bytes());
    let all = ready
        .bootstrap
        .all_gather(&mine)
        .map_err(|e| NcclError::from(e).context("exchanging colors"))?;
    let mut entries = Vec::with_capacity(all.len());
    for (r, b) in all.iter().enumerate() {
        if b.len() != 8 {
            return Err(NcclError::remote(format!(
                "rank {r} sent a malformed split entry"
            )));
        }
        let c = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let k = i32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        entries.push((c, k, r));
    }
    if color == abi::SPLIT_NOCOLOR {
        // SAFETY: checked non-NULL.
        unsafe { *newcomm = std::ptr::null_mut() };
        return Ok(abi::SUCCESS);
    }
    let mut members: Vec<(i32, usize)> = entries
        .iter()
        .filter(|(c, _, _)| *c == color)
        .map(|&(_, k, r)| (k, r))
        .collect();
    members.sort_unstable();
    let members: Vec<usize> = members.into_iter().map(|(_, r)| r).collect();
    let child = Child {
        members,
        tag: TAG_SPLIT_BASE + seq,
        config: cfg,
        nonblocking,
    };
    // SAFETY: checked non-NULL.
    unsafe { child.start(&parent, &ready, newcomm) }
}

/// `ncclCommShrink`: the ranks not in `exclude` form a new communicator (the excluded ones do
/// not call it and may be dead).
///
/// # Safety
/// `exclude` must hold `nexclude` ints; `newcomm` valid for a write; `config` as for
/// [`init::parse_config`].
pub unsafe fn shrink(
    handle: *const Comm,
    exclude: *const c_int,
    nexclude: c_int,
    newcomm: *mut *mut Comm,
    config: *const NcclConfig,
    flags: c_int,
) -> NResult<NcclResult> {
    let (parent, ready) = comm::ready(handle)?;
    if newcomm.is_null() {
        return Err(NcclError::arg("newcomm is NULL"));
    }
    if flags != 0 && flags != 1 {
        return Err(NcclError::arg(format!(
            "shrinkFlags {flags}: expected NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
        )));
    }
    let count = usize::try_from(nexclude)
        .map_err(|_| NcclError::arg(format!("excludeRanksCount {nexclude}: expected >= 0")))?;
    if count > 0 && exclude.is_null() {
        return Err(NcclError::arg(
            "excludeRanksList is NULL with a non-zero count",
        ));
    }
    let list: &[c_int] = if count == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(exclude, count) }
    };
    let mut excluded = vec![false; parent.nranks];
    for &r in list {
        let r = check_rank("excluded rank", r, parent.nranks)?;
        excluded[r] = true;
    }
    if excluded[parent.rank] {
        return Err(NcclError::arg(format!(
            "rank {} is in excludeRanksList: expected only the remaining ranks to call \
             ncclCommShrink",
            parent.rank
        )));
    }
    // SAFETY: forwarded.
    let (cfg, nonblocking) = unsafe { child_config(&parent, config)? };
    let members: Vec<usize> = (0..parent.nranks).filter(|&r| !excluded[r]).collect();
    let seq = ready.shrink_seq.fetch_add(1, Ordering::AcqRel);
    let child = Child {
        members,
        tag: TAG_SHRINK_BASE + seq,
        config: cfg,
        nonblocking,
    };
    // SAFETY: checked non-NULL.
    unsafe { child.start(&parent, &ready, newcomm) }
}

/// `ncclCommInitAll`: `ndev` ranks in this process, on `devlist` (NULL: devices 0..ndev).
///
/// # Safety
/// `comms` must have room for `ndev` handles; `devlist` NULL or `ndev` ints.
pub unsafe fn init_all(
    comms: *mut *mut Comm,
    ndev: c_int,
    devlist: *const c_int,
) -> NResult<NcclResult> {
    if comms.is_null() {
        return Err(NcclError::arg("comms is NULL"));
    }
    let n = usize::try_from(ndev)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| NcclError::arg(format!("ndev {ndev}: expected at least 1")))?;
    let devices: Vec<i32> = if devlist.is_null() {
        (0..n as i32).collect()
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
    };
    for &d in &devices {
        backend::check_device(d)?;
    }
    let id = TcpBootstrap::create_unique_id().map_err(NcclError::from)?;
    let results: Vec<NResult<(Arc<Comm>, Arc<Ready>)>> = std::thread::scope(|s| {
        let hs: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, &device)| {
                s.spawn(move || {
                    let p = InitParams {
                        nranks: n,
                        rank,
                        id,
                        device,
                        config: None,
                        nonblocking: false,
                    };
                    let comm = Arc::new(Comm::new(rank, n, device, false).with_id(&id));
                    init::build(&p).map(|r| (comm, r))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(NcclError::internal("an init thread panicked")))
            })
            .collect()
    });
    if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
        TcpBootstrap::release_unique_id(&id);
        return Err(e.clone());
    }
    for (i, r) in results.into_iter().enumerate() {
        if let Ok((comm, ready)) = r {
            comm.finish_init(Ok(ready));
            // SAFETY: `comms` has room for `ndev` handles (the caller's contract).
            unsafe { *comms.add(i) = comm::register(comm) };
        }
    }
    Ok(abi::SUCCESS)
}

/// `ncclCommInitRankScalable`: every rank passes the same `nid` ids; this library needs one
/// root, so it uses the first.
///
/// # Safety
/// `ids` must hold `nid` ids; otherwise as [`init::init_rank`].
pub unsafe fn init_scalable(
    out: *mut *mut Comm,
    nranks: c_int,
    rank: c_int,
    nid: c_int,
    ids: *const NcclUniqueId,
    config: *const NcclConfig,
) -> NResult<NcclResult> {
    if nid < 1 || ids.is_null() {
        return Err(NcclError::arg(format!(
            "nId {nid} / commIds {ids:p}: expected at least one id"
        )));
    }
    // SAFETY: `ids` holds at least one id (checked above, the caller's contract).
    let first = unsafe { *ids };
    // SAFETY: forwarded.
    unsafe { init::init_rank(out, nranks, &first, rank, config) }
}
