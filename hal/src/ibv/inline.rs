//! The `static inline` data-path verbs of `verbs.h`, written once.
//!
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are not exported by libibverbs: verbs.h
//! defines them as inline functions that jump through the provider's `ops` table inside
//! `struct ibv_context`. Since we load the library at run time we cannot link to them, so these
//! functions do exactly what the C inlines do. Providers always fill these three entries; a
//! missing entry is reported as `EOPNOTSUPP` (95) rather than a NULL call.

use std::ffi::c_int;

use ibverbs_sys as sys;

const EOPNOTSUPP: c_int = 95;

/// `ibv_post_send`: posts a chain of send work requests through `qp->context->ops.post_send`.
///
/// Exists because verbs.h makes it `static inline`; returns 0 or an errno, and sets `*bad_wr`
/// to the first request that was not posted.
///
/// # Safety
/// `qp` must be a live QP of a live context from the same library; `wr` must point to a valid,
/// NULL-terminated chain of `ibv_send_wr` whose `sg_list`s are valid for `num_sge` entries;
/// `bad_wr` must be writable.
pub unsafe fn post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad_wr: *mut *mut sys::ibv_send_wr,
) -> c_int {
    // SAFETY: the caller guarantees `qp` and its context are live; reading the ops table is
    // what the C inline does.
    let f = unsafe { (*(*qp).context).ops.post_send };
    match f {
        // SAFETY: forwarded caller guarantees.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => EOPNOTSUPP,
    }
}

/// `ibv_post_recv`: posts a chain of receive work requests through
/// `qp->context->ops.post_recv`.
///
/// Exists because verbs.h makes it `static inline`; returns 0 or an errno.
///
/// # Safety
/// `qp` must be a live QP; `wr` a valid NULL-terminated chain of `ibv_recv_wr`; `bad_wr`
/// writable.
pub unsafe fn post_recv(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller guarantees `qp` and its context are live.
    let f = unsafe { (*(*qp).context).ops.post_recv };
    match f {
        // SAFETY: forwarded caller guarantees.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => EOPNOTSUPP,
    }
}

/// `ibv_poll_cq`: takes up to `num_entries` completions through `cq->context->ops.poll_cq`.
///
/// Exists because verbs.h makes it `static inline`; returns the number of completions written
/// (>= 0) or a negative value on error.
///
/// # Safety
/// `cq` must be a live CQ; `wc` must be writable for `num_entries` entries.
pub unsafe fn poll_cq(cq: *mut sys::ibv_cq, num_entries: c_int, wc: *mut sys::ibv_wc) -> c_int {
    // SAFETY: the caller guarantees `cq` and its context are live.
    let f = unsafe { (*(*cq).context).ops.poll_cq };
    match f {
        // SAFETY: forwarded caller guarantees.
        Some(f) => unsafe { f(cq, num_entries, wc) },
        None => -EOPNOTSUPP,
    }
}
