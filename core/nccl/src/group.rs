//! Group semantics (`ncclGroupStart`/`ncclGroupEnd`): per thread, calls between start and the
//! outermost end are queued and issued together at the end.
//!
//! At the end: queued inits run concurrently (so one thread can create the ranks of several
//! communicators); fallback operations go to the real NCCL inside one of its own groups; then
//! each communicator's native work runs: its point-to-point operations progressed together
//! (matched pairs complete in any order), then its collectives in call order. On the host
//! backend, where native work blocks until done, several communicators of one group run on
//! their own threads, since they are usually ranks of the same collective.

use std::cell::RefCell;
use std::sync::Arc;

use crate::abi::{self, NcclResult};
use crate::comm::{Comm, Ready};
use crate::error::{NResult, NcclError};
use crate::fallback::FallbackComm;
use crate::native::CollArgs;
use crate::ops::{P2pCall, Route};
use crate::options::Op;
use crate::p2p::{Dir, P2pOp};

/// Work of a communicator's init, run at the end of the group.
pub type InitJob = Box<dyn FnOnce() -> NResult<Arc<Ready>> + Send + Sync>;

/// One queued call.
pub enum Pending {
    /// `ncclCommInitRank*` inside a group.
    Init {
        /// The handle already returned to the caller.
        comm: Arc<Comm>,
        /// The init work.
        job: InitJob,
    },
    /// A collective.
    Coll {
        /// The communicator.
        comm: Arc<Comm>,
        /// Its state.
        ready: Arc<Ready>,
        /// The NCCL function name.
        call: &'static str,
        /// Checked arguments.
        args: CollArgs,
        /// Where it goes.
        route: Route,
    },
    /// Point-to-point parts of one call.
    P2p {
        /// The communicator.
        comm: Arc<Comm>,
        /// Its state.
        ready: Arc<Ready>,
        /// The NCCL function name.
        call: &'static str,
        /// The sends and receives.
        calls: Vec<P2pCall>,
        /// Where they go.
        route: Route,
    },
}

#[derive(Default)]
struct State {
    depth: usize,
    ops: Vec<Pending>,
    error: Option<NcclError>,
}

thread_local! {
    static GROUP: RefCell<State> = RefCell::new(State::default());
}

/// `ncclGroupStart`.
pub fn start() -> NResult<NcclResult> {
    GROUP.with(|g| g.borrow_mut().depth += 1);
    Ok(abi::SUCCESS)
}

/// Whether this thread is inside a group.
pub fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Remembers the first error of a call inside a group: the group's end reports it too.
pub fn note_error(e: &NcclError) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error.is_none() {
            g.error = Some(e.clone());
        }
    });
}

/// Queues `p` inside a group, else issues it now.
pub fn submit(p: Pending) -> NResult<NcclResult> {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.ops.push(p);
            None
        } else {
            Some(p)
        }
    });
    match queued {
        None => Ok(abi::SUCCESS),
        Some(p) => execute(vec![p]),
    }
}

/// `ncclGroupEnd` (`simulate`: `ncclGroupSimulateEnd`, which ends the group without issuing
/// the queued operations).
pub fn end(simulate: bool) -> NResult<NcclResult> {
    let taken = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(NcclError::usage(
                "ncclGroupEnd without a matching ncclGroupStart on this thread",
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some((std::mem::take(&mut g.ops), g.error.take())))
    })?;
    let Some((ops, error)) = taken else {
        return Ok(abi::SUCCESS);
    };
    let (inits, work): (Vec<_>, Vec<_>) = ops
        .into_iter()
        .partition(|p| matches!(p, Pending::Init { .. }));
    let init_result = run_inits(inits);
    if let Some(e) = error {
        return Err(e.context("an earlier call in this group failed, so the group was not issued"));
    }
    let code = init_result?;
    if simulate {
        return Ok(code);
    }
    execute(work)?;
    Ok(code)
}

/// Runs queued inits concurrently. Non-blocking communicators among them make the whole
/// set finish in the background (`ncclInProgress`).
fn run_inits(inits: Vec<Pending>) -> NResult<NcclResult> {
    let jobs: Vec<(Arc<Comm>, InitJob)> = inits
        .into_iter()
        .filter_map(|p| match p {
            Pending::Init { comm, job } => Some((comm, job)),
            _ => None,
        })
        .collect();
    if jobs.is_empty() {
        return Ok(abi::SUCCESS);
    }
    if jobs.iter().any(|(c, _)| c.nonblocking) {
        for (comm, job) in jobs {
            crate::init::spawn_init(comm, job)?;
        }
        return Ok(abi::IN_PROGRESS);
    }
    let results: Vec<NResult<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(comm, job)| {
                s.spawn(move || {
                    let r = job();
                    let out = r.as_ref().map(|_| ()).map_err(Clone::clone);
                    comm.finish_init(r);
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(NcclError::internal("a communicator init panicked")))
            })
            .collect()
    });
    results
        .into_iter()
        .find_map(Result::err)
        .map_or(Ok(abi::SUCCESS), Err)
}

/// Issues `work`: fallback operations in one fallback group, then native work per comm.
fn execute(work: Vec<Pending>) -> NResult<NcclResult> {
    let (fallback, native): (Vec<_>, Vec<_>) = work.into_iter().partition(|p| match p {
        Pending::Coll { route, .. } | Pending::P2p { route, .. } => *route == Route::Fallback,
        Pending::Init { .. } => false,
    });
    if !fallback.is_empty() {
        run_fallback(&fallback)?;
    }
    let mut per_comm: Vec<(Arc<Comm>, Arc<Ready>, Vec<Pending>)> = Vec::new();
    for p in native {
        let (comm, ready) = match &p {
            Pending::Coll { comm, ready, .. } | Pending::P2p { comm, ready, .. } => {
                (comm.clone(), ready.clone())
            }
            Pending::Init { .. } => continue,
        };
        match per_comm.iter_mut().find(|(c, _, _)| Arc::ptr_eq(c, &comm)) {
            Some((_, _, list)) => list.push(p),
            None => per_comm.push((comm, ready, vec![p])),
        }
    }
    if per_comm.len() > 1 && crate::HOST_BACKEND {
        let results: Vec<NResult<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = per_comm
                .iter()
                .map(|(c, r, list)| s.spawn(move || run_native(c, r, list)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(NcclError::internal("a native batch panicked")))
                })
                .collect()
        });
        results.into_iter().try_for_each(|r| r)?;
    } else {
        for (c, r, list) in &per_comm {
            run_native(c, r, list)?;
        }
    }
    Ok(abi::SUCCESS)
}

/// One communicator's native work: point-to-point together, then collectives in order.
fn run_native(comm: &Comm, ready: &Ready, list: &[Pending]) -> NResult<()> {
    let calls: Vec<P2pCall> = list
        .iter()
        .filter_map(|p| match p {
            Pending::P2p { calls, .. } => Some(calls.iter().copied()),
            _ => None,
        })
        .flatten()
        .collect();
    let result = (|| -> NResult<()> {
        if !calls.is_empty() {
            run_p2p(comm, ready, &calls)?;
        }
        for p in list {
            if let Pending::Coll { call, args, .. } = p {
                // SAFETY: the caller of the NCCL function vouches for its buffers and stream.
                unsafe { ready.native.run(args) }.map_err(|e| e.context(call))?;
            }
        }
        Ok(())
    })();
    if let Err(e) = &result {
        if e.code == abi::REMOTE_ERROR {
            comm.set_async_error(e);
        }
    }
    result
}

fn run_p2p(comm: &Comm, ready: &Ready, calls: &[P2pCall]) -> NResult<()> {
    let ops: Vec<P2pOp> = calls.iter().map(|c| c.op).collect();
    if !crate::HOST_BACKEND {
        // GPU builds route only sends to self here (see Ready::native_p2p): copies in the
        // receiving call's stream order.
        return device_self_copies(ready, calls, comm.rank);
    }
    match &ready.p2p {
        // SAFETY: host buffers the caller vouched for, valid until the group ends.
        Some(p2p) => unsafe {
            p2p.lock()
                .unwrap_or_else(|p| p.into_inner())
                .run(&ops, comm, ready)
        },
        // SAFETY: as above.
        None => unsafe { crate::p2p::run_self(&ops, comm.rank) },
    }
}

fn device_self_copies(ready: &Ready, calls: &[P2pCall], rank: usize) -> NResult<()> {
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

/// Issues fallback work inside one group of the fallback library.
fn run_fallback(list: &[Pending]) -> NResult<()> {
    let first = list.iter().find_map(|p| match p {
        Pending::Coll { ready, .. } | Pending::P2p { ready, .. } => ready.fallback.as_ref(),
        Pending::Init { .. } => None,
    });
    let Some(lib) = first.map(|f| f.lib) else {
        return Err(NcclError::internal(
            "fallback work without a fallback communicator",
        ));
    };
    lib.group_start()?;
    let issued = list.iter().try_for_each(|p| match p {
        Pending::Coll {
            ready, call, args, ..
        } => fallback_comm(ready, call).and_then(|fb| fallback_coll(fb, call, args)),
        Pending::P2p {
            ready, call, calls, ..
        } => fallback_comm(ready, call)
            .and_then(|fb| calls.iter().try_for_each(|c| fallback_p2p(fb, call, c))),
        Pending::Init { .. } => Ok(()),
    });
    let ended = lib.group_end();
    issued.and(ended)
}

fn fallback_comm<'a>(ready: &'a Ready, call: &str) -> NResult<&'a FallbackComm> {
    ready.fallback.as_ref().ok_or_else(|| {
        NcclError::internal(format!("{call}: routed to a fallback that is not loaded"))
    })
}

fn missing(fb: &FallbackComm, name: &str) -> NcclError {
    NcclError::usage(format!("the fallback NCCL {} has no {name}", fb.lib.path))
}

fn fallback_coll(fb: &FallbackComm, call: &str, a: &CollArgs) -> NResult<()> {
    let (s, r) = (a.send as usize as *const _, a.recv as usize as *mut _);
    let st = a.stream as usize as *mut _;
    let root = a.root as i32;
    // SAFETY: the caller's arguments, checked, passed on unchanged with the fallback's comm.
    let rc = unsafe {
        match a.op {
            Op::AllReduce => fb.lib.all_reduce.ok_or_else(|| missing(fb, call))?(
                s, r, a.count, a.dtype, a.redop, fb.comm, st,
            ),
            Op::ReduceScatter => fb.lib.reduce_scatter.ok_or_else(|| missing(fb, call))?(
                s, r, a.count, a.dtype, a.redop, fb.comm, st,
            ),
            Op::AllGather => fb.lib.all_gather.ok_or_else(|| missing(fb, call))?(
                s, r, a.count, a.dtype, fb.comm, st,
            ),
            Op::Broadcast => fb.lib.broadcast.ok_or_else(|| missing(fb, call))?(
                s, r, a.count, a.dtype, root, fb.comm, st,
            ),
            Op::Reduce => fb.lib.reduce.ok_or_else(|| missing(fb, call))?(
                s, r, a.count, a.dtype, a.redop, root, fb.comm, st,
            ),
            other => {
                return Err(NcclError::internal(format!(
                    "{} is not a collective",
                    other.name()
                )))
            }
        }
    };
    fb.check(call, rc)
}

fn fallback_p2p(fb: &FallbackComm, call: &str, c: &P2pCall) -> NResult<()> {
    let st = c.stream as usize as *mut _;
    let peer = c.op.peer as i32;
    // SAFETY: the caller's arguments, checked, passed on unchanged with the fallback's comm.
    let rc = unsafe {
        match c.op.dir {
            Dir::Send => fb.lib.send.ok_or_else(|| missing(fb, "ncclSend"))?(
                c.op.buf as usize as *const _,
                c.count,
                c.dtype,
                peer,
                fb.comm,
                st,
            ),
            Dir::Recv => fb.lib.recv.ok_or_else(|| missing(fb, "ncclRecv"))?(
                c.op.buf as usize as *mut _,
                c.count,
                c.dtype,
                peer,
                fb.comm,
                st,
            ),
        }
    };
    fb.check(call, rc)
}
