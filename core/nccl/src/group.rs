//! Group semantics (`ncclGroupStart`/`ncclGroupEnd`): per thread, calls between start and the
//! outermost end are queued and issued together at the end. The group knows no operation:
//! it queues [`Work`] and communicator inits and flushes them.
//!
//! At the end: queued inits run concurrently (so one thread can create the ranks of several
//! communicators); fallback work goes to the real NCCL inside one of its own groups; then
//! each communicator's native work runs ([`run_native`]), the communicators in the same order
//! on every rank ([`Comm::order_key`]). On the host backend, where native work blocks until
//! done, several communicators of one group run on their own threads, since they are usually
//! ranks of the same collective.
//!
//! The open-group trap: a group left open (an exception between `ncclGroupStart` and
//! `ncclGroupEnd`, as when PyTorch's `batch_isend_irecv` raises on a failed `ncclSend`) makes
//! every later call of the thread only queued. A communicator finalized, destroyed or aborted,
//! or polled with `ncclCommGetAsyncError` while calls are queued, is the point where that goes
//! unnoticed; [`warn_if_open`] logs a WARN there naming the queued calls (once per
//! communicator and call within one open group).

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
    /// (communicator address, call) pairs already warned about in this group.
    warned: Vec<(usize, &'static str)>,
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
    // The depth first, then the work by reference: moving `Work` (152 bytes) into the
    // thread-local's closure and back out cost four `memcpy` calls, a third of an eager
    // in-place call's host time (perf, issue 28).
    if !in_group() {
        return issue_one(&w);
    }
    GROUP.with(|g| g.borrow_mut().work.push(w));
    Ok(abi::SUCCESS)
}

/// Issues one call outside a group: [`flush`] of a single call without its batching (no
/// heap allocation on this path: an eager call's host cost, issue 28).
fn issue_one(w: &Work) -> NResult<NcclResult> {
    let one = [w];
    if w.is_fallback() {
        // SAFETY: the caller of the NCCL function vouched for its buffers and stream.
        unsafe { issue_fallback(&one)? };
    } else {
        // SAFETY: as above.
        unsafe { run_native(w.comm(), w.ready(), &one)? };
    }
    Ok(abi::SUCCESS)
}

/// What a call on an open group warns about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenGroupCheck {
    /// Teardown (finalize, destroy, abort): always, queued calls or not.
    Teardown,
    /// A query whose answer depends on queued work having run (`ncclCommGetAsyncError`):
    /// only when calls are queued.
    Query,
}

/// Logs a WARN (and returns its text) when `call` on communicator `comm` (its handle's
/// address) comes while a group is open on this thread: the open-group trap. Once per
/// communicator and call within one open group; nothing outside a group.
pub fn warn_if_open(call: &'static str, comm: usize, check: OpenGroupCheck) -> Option<String> {
    // Queued work holds the communicator itself; the handle is a separate cell (comm.rs).
    let target = crate::comm::lookup(comm as *const crate::comm::Comm)
        .map_or(comm, |c| Arc::as_ptr(&c) as usize);
    let msg = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 || g.warned.contains(&(comm, call)) {
            return None;
        }
        let queued: Vec<(&'static str, bool)> = g
            .work
            .iter()
            .map(|w| (w.call(), Arc::as_ptr(w.comm()) as usize == target))
            .collect();
        if check == OpenGroupCheck::Query && queued.is_empty() {
            return None;
        }
        g.warned.push((comm, call));
        let failed = g.error.as_ref().map(|e| e.msg.as_str());
        Some(open_group_warning(
            call,
            g.depth,
            g.inits.len(),
            &queued,
            failed,
        ))
    })?;
    mscclpp::log_warn!("NCCL", "{msg}");
    Some(msg)
}

/// The text of [`warn_if_open`]: `call`, the group depth, queued inits and the queued calls
/// (name, whether on the communicator `call` is about) in call order, repeated names counted;
/// `failed`: the error of an earlier call in the group.
fn open_group_warning(
    call: &str,
    depth: usize,
    inits: usize,
    queued: &[(&'static str, bool)],
    failed: Option<&str>,
) -> String {
    let mut names: Vec<(&str, usize)> = Vec::new();
    for (name, _) in queued {
        match names.iter_mut().find(|(n, _)| n == name) {
            Some((_, k)) => *k += 1,
            None => names.push((name, 1)),
        }
    }
    let list: Vec<String> = names
        .iter()
        .map(|(n, k)| {
            if *k > 1 {
                format!("{n} x{k}")
            } else {
                n.to_string()
            }
        })
        .collect();
    let nesting = if depth > 1 {
        format!(", {depth} levels deep")
    } else {
        String::new()
    };
    let what = match queued.len() {
        0 => "no calls are queued".to_string(),
        1 => format!("1 call is queued and has not run: {}", list.join(", ")),
        n => format!("{n} calls are queued and have not run: {}", list.join(", ")),
    };
    let mine = queued.iter().filter(|(_, mine)| *mine).count();
    let on_this = if queued.is_empty() {
        String::new()
    } else {
        format!(" ({mine} of them on this communicator)")
    };
    let inits = match inits {
        0 => String::new(),
        1 => "; 1 communicator init is queued too".to_string(),
        n => format!("; {n} communicator inits are queued too"),
    };
    let failed = failed
        .map(|m| {
            format!(
                "; an earlier call in this group failed ({m}), so ncclGroupEnd will return its \
                 error and run none of them"
            )
        })
        .unwrap_or_default();
    format!(
        "{call} while a group is open on this thread (ncclGroupStart without ncclGroupEnd{nesting}); \
         {what}{on_this}{inits}{failed}. Queued calls run only at the outermost ncclGroupEnd: an error \
         or exception between ncclGroupStart and ncclGroupEnd (e.g. a failed ncclSend inside \
         PyTorch's batch_isend_irecv) leaves the group open"
    )
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
    // Every rank takes the communicators in one order: a blocking part of one (a first-use
    // buffer exchange of a collective on GPUs, run one communicator after the other) then
    // never waits for a rank that is blocked in another communicator waiting for this one.
    per_comm.sort_by_key(|(first, _)| first.comm().order_key());
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

#[cfg(test)]
mod tests {
    use super::*;
    use OpenGroupCheck::{Query, Teardown};

    #[test]
    fn an_open_group_warns_once_per_communicator_and_call() {
        assert_eq!(warn_if_open("ncclCommDestroy", 1, Teardown), None);
        start().unwrap();
        start().unwrap();
        let m = warn_if_open("ncclCommDestroy", 1, Teardown).expect("a warning");
        assert!(
            m.starts_with(
                "ncclCommDestroy while a group is open on this thread (ncclGroupStart without \
                 ncclGroupEnd, 2 levels deep); no calls are queued."
            ),
            "{m}"
        );
        assert_eq!(warn_if_open("ncclCommDestroy", 1, Teardown), None);
        assert!(warn_if_open("ncclCommFinalize", 1, Teardown).is_some());
        assert!(warn_if_open("ncclCommDestroy", 2, Teardown).is_some());
        // A query warns only when something is queued (nothing is).
        assert_eq!(warn_if_open("ncclCommGetAsyncError", 1, Query), None);
        end(false).unwrap();
        // Still the same open group (the outer level).
        assert_eq!(warn_if_open("ncclCommDestroy", 1, Teardown), None);
        end(false).unwrap();
        assert_eq!(warn_if_open("ncclCommAbort", 1, Teardown), None);
        // A new open group warns again.
        start().unwrap();
        let m = warn_if_open("ncclCommDestroy", 1, Teardown).expect("a warning");
        assert!(m.contains("without ncclGroupEnd);"), "{m}");
        end(false).unwrap();
    }

    #[test]
    fn the_warning_names_the_queued_calls_in_order() {
        let q = [
            ("ncclSend", true),
            ("ncclRecv", true),
            ("ncclAllReduce", false),
        ];
        let m = open_group_warning("ncclCommDestroy", 1, 0, &q, None);
        assert!(
            m.starts_with(
                "ncclCommDestroy while a group is open on this thread (ncclGroupStart without \
                 ncclGroupEnd); 3 calls are queued and have not run: ncclSend, ncclRecv, \
                 ncclAllReduce (2 of them on this communicator). Queued calls run only at the \
                 outermost ncclGroupEnd"
            ),
            "{m}"
        );
        assert!(m.contains("batch_isend_irecv"), "{m}");
        // Send, recv, send, recv, send: the sends on this communicator.
        let q: Vec<_> = (0..5)
            .map(|i| match i % 2 {
                0 => ("ncclSend", true),
                _ => ("ncclRecv", false),
            })
            .collect();
        let m = open_group_warning("ncclCommGetAsyncError", 1, 2, &q, None);
        assert!(
            m.contains(
                "5 calls are queued and have not run: ncclSend x3, ncclRecv x2 (3 of them on \
                 this communicator); 2 communicator inits are queued too."
            ),
            "{m}"
        );
        let m = open_group_warning(
            "ncclCommFinalize",
            1,
            0,
            &[("ncclAlltoAll", false)],
            Some("ncclSend: peer 9: expected a rank in 0..2"),
        );
        assert!(
            m.contains(
                "1 call is queued and has not run: ncclAlltoAll (0 of them on this \
                 communicator); an earlier call in this group failed (ncclSend: peer 9: expected \
                 a rank in 0..2), so ncclGroupEnd will return its error and run none of them. \
                 Queued calls"
            ),
            "{m}"
        );
    }
}
