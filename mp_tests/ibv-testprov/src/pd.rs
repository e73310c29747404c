//! Protection domains and memory regions: `ibv_alloc_pd`, `ibv_dealloc_pd`, `ibv_reg_mr`,
//! `ibv_reg_mr_iova2`, `ibv_dereg_mr`.

use super::*;

/// `ibv_alloc_pd`.
///
/// # Safety
/// `ctx` is a live context of this provider.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut sys::ibv_context) -> *mut sys::ibv_pd {
    // SAFETY: caller contract.
    let Some(c) = (unsafe { prov_ctx(ctx) }) else {
        set_errno(EINVAL);
        return std::ptr::null_mut();
    };
    let pd = ProvPd {
        ibv: sys::ibv_pd {
            context: ctx,
            handle: state::next_handle(),
        },
        shared: c.shared.clone(),
        users: AtomicUsize::new(0),
    };
    Box::into_raw(Box::new(pd)).cast()
}

/// `ibv_dealloc_pd`: `EBUSY` while MRs or QPs use it.
///
/// # Safety
/// `pd` is a live PD of this provider.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut sys::ibv_pd) -> c_int {
    let p = pd.cast::<ProvPd>();
    // SAFETY: caller contract; ibv is the first field.
    let Some(r) = (unsafe { p.as_ref() }) else {
        return EINVAL;
    };
    if r.users.load(Ordering::SeqCst) != 0 {
        return EBUSY;
    }
    // SAFETY: allocated as Box<ProvPd>.
    drop(unsafe { Box::from_raw(p) });
    0
}

unsafe fn reg_mr_common(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut sys::ibv_mr {
    let p = pd.cast::<ProvPd>();
    // SAFETY: caller contract; ibv is the first field.
    let Some(pr) = (unsafe { p.as_ref() }) else {
        set_errno(EINVAL);
        return std::ptr::null_mut();
    };
    let remote = ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC;
    let bad = addr.is_null()
        || length == 0
        || iova != addr as u64
        || (access & remote != 0 && access & ACCESS_LOCAL_WRITE == 0)
        || (addr as usize).checked_add(length).is_none();
    if bad {
        set_errno(EINVAL);
        return std::ptr::null_mut();
    }
    let key = state::next_key();
    let info = MrInfo {
        addr: addr as usize,
        len: length,
        access,
        pd: pr.ibv.handle,
    };
    pr.shared
        .mrs
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, info);
    pr.users.fetch_add(1, Ordering::SeqCst);
    let mr = ProvMr {
        ibv: sys::ibv_mr {
            context: pr.ibv.context,
            pd,
            addr,
            length,
            handle: state::next_handle(),
            lkey: key,
            rkey: key,
        },
        shared: pr.shared.clone(),
        pd: p,
    };
    Box::into_raw(Box::new(mr)).cast()
}

/// `ibv_reg_mr` (host memory only).
///
/// # Safety
/// `pd` is a live PD of this provider; the memory stays valid while registered.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut sys::ibv_mr {
    // SAFETY: forwarded caller contract.
    unsafe { reg_mr_common(pd, addr, length, addr as u64, access as u32) }
}

/// `ibv_reg_mr_iova2` (only `iova == addr` is supported).
///
/// # Safety
/// As [`ibv_reg_mr`].
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut sys::ibv_mr {
    // SAFETY: forwarded caller contract.
    unsafe { reg_mr_common(pd, addr, length, iova, access) }
}

/// `ibv_dereg_mr`: waits for in-flight remote accesses to the region, then forgets it.
///
/// # Safety
/// `mr` is a live MR of this provider.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut sys::ibv_mr) -> c_int {
    let p = mr.cast::<ProvMr>();
    if p.is_null() {
        return EINVAL;
    }
    // SAFETY: allocated as Box<ProvMr>.
    let b = unsafe { Box::from_raw(p) };
    b.shared
        .mrs
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&b.ibv.lkey);
    // SAFETY: the PD outlives its MRs (dealloc_pd refuses while users != 0).
    if let Some(pd) = unsafe { b.pd.as_ref() } {
        pd.users.fetch_sub(1, Ordering::SeqCst);
    }
    0
}
