//! Group semantics (`ncclGroupStart`/`ncclGroupEnd`): per thread, calls between start and the
//! outermost end are queued and issued together at the end. The group knows no operation:
//! it queues [`Work`] and communicator inits and flushes them.
//!
//! At the end: queued inits run concurrently (so one thread can create the ranks of several
//! communicators); fallback work goes to the real NCCL inside one of its own groups; then
//! each communicator's native work runs ([`run_native`]). On the host backend, where native
//! work blocks until done, several communicators of one group run on their own threads,
//! since they are usually ranks of the same collective.

use std::cell::RefCell;
use std::sync::Arc;

use crate::abi::{self, NcclResult};
use crate::comm::{Comm, InitJob};
use crate::error::{NResult, NcclError};
use crate::ops::work::{issue_fallback, run_native, Work};

#[derive(Default)]
struct State {
    depth: usize,
    inits: Vec<(Arc<Comm>, InitJob)>,
    work: Vec<Work>,
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

/// Queues `w` inside a group, else issues it now.
pub fn submit(w: Work) -> NResult<NcclResult> {
    let now = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.work.push(w);
            None
        } else {
            Some(w)
        }
    });
    match now {
        None => Ok(abi::SUCCESS),
        Some(w) => flush(vec![w]),
    }
}

/// Queues the init of `comm` (inside a group: the caller checked [`in_group`]).
pub fn submit_init(comm: Arc<Comm>, job: InitJob) -> NResult<NcclResult> {
    GROUP.with(|g| g.borrow_mut().inits.push((comm, job)));
    Ok(abi::SUCCESS)
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
        let State {
            inits, work, error, ..
        } = std::mem::take(&mut *g);
        Ok(Some((inits, work, error)))
    })?;
    let Some((inits, work, error)) = taken else {
        return Ok(abi::SUCCESS);
    };
    let init_result = run_inits(inits);
    if let Some(e) = error {
        return Err(e.context("an earlier call in this group failed, so the group was not issued"));
    }
    let code = init_result?;
    if simulate {
        return Ok(code);
    }
    flush(work)?;
    Ok(code)
}

/// Runs queued inits concurrently. Non-blocking communicators among them make the whole
/// set finish in the background (`ncclInProgress`).
fn run_inits(jobs: Vec<(Arc<Comm>, InitJob)>) -> NResult<NcclResult> {
    if jobs.is_empty() {
        return Ok(abi::SUCCESS);
    }
    if jobs.iter().any(|(c, _)| c.nonblocking) {
        for (comm, job) in jobs {
            Comm::init_in_background(comm, job)?;
        }
        return Ok(abi::IN_PROGRESS);
    }
    let results = on_threads(jobs, |(comm, job)| {
        let r = job();
        let out = r.as_ref().map(|_| ()).map_err(Clone::clone);
        comm.finish_init(r);
        out
    });
    results
        .into_iter()
        .find_map(Result::err)
        .map_or(Ok(abi::SUCCESS), Err)
}

/// Runs `f` on every item, each on a thread of its own; a panic becomes an error.
fn on_threads<T: Send>(items: Vec<T>, f: impl Fn(T) -> NResult<()> + Sync) -> Vec<NResult<()>> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = items
            .into_iter()
            .map(|item| s.spawn(move || f(item)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(NcclError::internal("a group's thread panicked")))
            })
            .collect()
    })
}

/// Issues `work`: fallback work in one fallback group, then native work per communicator.
fn flush(work: Vec<Work>) -> NResult<NcclResult> {
    let (fallback, native): (Vec<&Work>, Vec<&Work>) = work.iter().partition(|w| w.is_fallback());
    if !fallback.is_empty() {
        // SAFETY: the callers of the NCCL functions vouched for their buffers and streams.
        unsafe { issue_fallback(&fallback)? };
    }
    let mut per_comm: Vec<(&Work, Vec<&Work>)> = Vec::new();
    for w in native {
        match per_comm
            .iter_mut()
            .find(|(first, _)| Arc::ptr_eq(first.comm(), w.comm()))
        {
            Some((_, list)) => list.push(w),
            None => per_comm.push((w, vec![w])),
        }
    }
    // SAFETY: (both) as above.
    let run = |(first, list): (&Work, Vec<&Work>)| unsafe {
        run_native(first.comm(), first.ready(), &list)
    };
    if per_comm.len() > 1 && crate::HOST_BACKEND {
        on_threads(per_comm, run).into_iter().try_for_each(|r| r)?;
    } else {
        per_comm.into_iter().try_for_each(run)?;
    }
    Ok(abi::SUCCESS)
}
