//! Protection domains and memory regions: `ibv_alloc_pd`, `ibv_dealloc_pd`, `ibv_reg_mr`,
//! `ibv_reg_mr_iova2`, `ibv_reg_dmabuf_mr` (maps the fd it is given), `ibv_dereg_mr`.

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
    dmabuf_map: Option<(usize, usize, usize)>,
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
        || (dmabuf_map.is_none() && iova != addr as u64)
        || (access & remote != 0 && access & ACCESS_LOCAL_WRITE == 0)
        || (addr as usize).checked_add(length).is_none();
    if bad {
        set_errno(EINVAL);
        return std::ptr::null_mut();
    }
    let key = state::next_key();
    // A dma-buf region is addressed by its iova and reached through our mapping of the fd.
    let (reg_addr, host) = match dmabuf_map {
        Some((_, _, host)) => (iova as usize, host),
        None => (addr as usize, addr as usize),
    };
    if reg_addr.checked_add(length).is_none() {
        set_errno(EINVAL);
        return std::ptr::null_mut();
    }
    let info = MrInfo {
        addr: reg_addr,
        host,
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
            addr: reg_addr as *mut c_void,
            length,
            handle: state::next_handle(),
            lkey: key,
            rkey: key,
        },
        shared: pr.shared.clone(),
        pd: p,
        mapping: dmabuf_map.map(|(base, len, _)| (base, len)),
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
    unsafe { reg_mr_common(pd, addr, length, addr as u64, access as u32, None) }
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
    unsafe { reg_mr_common(pd, addr, length, iova, access, None) }
}

/// `ibv_reg_dmabuf_mr`: maps `length` bytes at `offset` of `fd` (a memfd on the host backend)
/// into this process and registers that mapping at `iova`; remote writes land in the pages of
/// the fd, so they show through every other mapping of it. `EOPNOTSUPP` when
/// `IBV_TESTPROV_NO_DMABUF=1` (a library without dma-buf support at run time).
///
/// # Safety
/// `pd` is a live PD of this provider; `fd` is a mappable fd whose pages outlive the region.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut sys::ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut sys::ibv_mr {
    if matches!(
        std::env::var("IBV_TESTPROV_NO_DMABUF").as_deref(),
        Ok("1") | Ok("true") | Ok("yes")
    ) {
        set_errno(EOPNOTSUPP);
        return std::ptr::null_mut();
    }
    let page = rustix::param::page_size() as u64;
    let base_off = offset & !(page - 1);
    let Some(map_len) = (offset - base_off)
        .checked_add(length as u64)
        .map(|l| l.div_ceil(page) * page)
        .filter(|&l| length > 0 && l <= isize::MAX as u64)
    else {
        set_errno(EINVAL);
        return std::ptr::null_mut();
    };
    // SAFETY: the caller passes an fd it owns for the duration of the call; mmap dups what it
    // needs (the mapping keeps the pages alive after the fd is closed).
    let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    // SAFETY: a fresh shared mapping chosen by the kernel; nothing aliases it yet.
    let mapped = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            map_len as usize,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            bfd,
            base_off,
        )
    };
    let base = match mapped {
        Ok(p) => p as usize,
        Err(e) => {
            set_errno(e.raw_os_error());
            return std::ptr::null_mut();
        }
    };
    let host = base + (offset - base_off) as usize;
    // SAFETY: forwarded caller contract; the mapping is undone by dereg (or below).
    let mr = unsafe {
        reg_mr_common(
            pd,
            host as *mut c_void,
            length,
            iova,
            access as u32,
            Some((base, map_len as usize, host)),
        )
    };
    if mr.is_null() {
        let err = errno::errno();
        // SAFETY: mapped just above and not registered.
        let _ = unsafe { rustix::mm::munmap(base as *mut c_void, map_len as usize) };
        errno::set_errno(err);
    }
    mr
}

/// `ibv_dereg_mr`: waits for in-flight remote accesses to the region, then forgets it.
///
/// # Safety
/// `mr` is a live MR of this provider.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut sys::ibv_mr) -> c_int {
    // SAFETY: allocated as Box<ProvMr>, taken back once.
    let Some(b) = (unsafe { crate::unbox::<ProvMr, _>(mr) }) else {
        return EINVAL;
    };
    b.shared
        .mrs
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&b.ibv.lkey);
    // SAFETY: the PD outlives its MRs (dealloc_pd refuses while users != 0).
    if let Some(pd) = unsafe { b.pd.as_ref() } {
        pd.users.fetch_sub(1, Ordering::SeqCst);
    }
    if let Some((base, len)) = b.mapping {
        // SAFETY: our own mapping of a dma-buf region, now out of the table (no access left:
        // the table's write lock above waited for in-flight accesses).
        let _ = unsafe { rustix::mm::munmap(base as *mut c_void, len) };
    }
    0
}
