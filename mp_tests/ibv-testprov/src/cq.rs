//! Completion queues: `ibv_create_cq`, `ibv_destroy_cq` and the inline `poll_cq` /
//! `req_notify_cq` entries of the context ops table.

use super::*;

/// `ibv_create_cq` (no completion channels).
///
/// # Safety
/// `ctx` is a live context of this provider.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut sys::ibv_cq {
    // SAFETY: caller contract.
    if unsafe { prov_ctx(ctx) }.is_none() || cqe <= 0 || cqe > MAX_CQE || !channel.is_null() {
        set_errno(EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: plain data (pthread objects all-zero = initializers in glibc).
    let mut ibv: sys::ibv_cq = unsafe { std::mem::zeroed() };
    ibv.context = ctx;
    ibv.cq_context = cq_context;
    ibv.handle = state::next_handle();
    ibv.cqe = cqe;
    let shared = Arc::new(CqShared {
        entries: Default::default(),
        users: AtomicUsize::new(0),
    });
    Box::into_raw(Box::new(ProvCq { ibv, shared })).cast()
}

/// `ibv_destroy_cq`: `EBUSY` while QPs use it.
///
/// # Safety
/// `cq` is a live CQ of this provider.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut sys::ibv_cq) -> c_int {
    let p = cq.cast::<ProvCq>();
    // SAFETY: caller contract.
    let Some(r) = (unsafe { p.as_ref() }) else {
        return EINVAL;
    };
    if r.shared.users.load(Ordering::SeqCst) != 0 {
        return EBUSY;
    }
    // SAFETY: allocated as Box<ProvCq>.
    drop(unsafe { Box::from_raw(p) });
    0
}

pub(crate) unsafe extern "C" fn tp_poll_cq(
    cq: *mut sys::ibv_cq,
    num_entries: c_int,
    wc: *mut sys::ibv_wc,
) -> c_int {
    // SAFETY: called through our ops table with one of our CQs.
    let Some(r) = (unsafe { cq.cast::<ProvCq>().as_ref() }) else {
        return -EINVAL;
    };
    if num_entries < 0 || (num_entries > 0 && wc.is_null()) {
        return -EINVAL;
    }
    let mut q = lock(&r.shared.entries);
    let n = (num_entries as usize).min(q.len());
    for i in 0..n {
        if let Some(e) = q.pop_front() {
            // SAFETY: the caller provides room for num_entries; RawWc has ibv_wc's layout.
            unsafe { wc.add(i).cast::<RawWc>().write(e) };
        }
    }
    n as c_int
}

pub(crate) unsafe extern "C" fn tp_req_notify_cq(
    _cq: *mut sys::ibv_cq,
    _solicited_only: c_int,
) -> c_int {
    EOPNOTSUPP
}
