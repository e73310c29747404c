//! A user-space libibverbs **test provider**: a shared library that exports the libibverbs ABI
//! (the same symbol names and struct layouts, from `ibverbs-sys`) and implements it over TCP,
//! so the real InfiniBand code path of mscclpp-rs runs on machines without RDMA hardware.
//!
//! It is loaded only through `MSCCLPP_IBV_SO=/path/to/libmscclpp_ibv_testprov.so`; nothing
//! links to it. It is not a performance transport and not a production provider.
//!
//! # What it implements
//!
//! * Devices `testprov0 .. testprov{N-1}` (`IBV_TESTPROV_NDEV`, default 1, read once per
//!   process), each with one port: ACTIVE, link layer Ethernet, MTU 4096, and a single GID
//!   (index 0) = the IPv4-mapped address of `IBV_TESTPROV_ADDR` (default `127.0.0.1`).
//! * Device attributes with `atomic_cap = IBV_ATOMIC_HCA`, or `IBV_ATOMIC_NONE` when
//!   `IBV_TESTPROV_NO_ATOMICS=1` (then fetch-and-add is rejected at post time, `EOPNOTSUPP`).
//! * PDs; MRs over host memory with lkey == rkey, access flags (REMOTE_WRITE/ATOMIC need
//!   LOCAL_WRITE), bounds and PD checks on both sides; CQs; RC QPs with the real state machine
//!   (RESET -> INIT -> RTR -> RTS, any -> ERR / RESET, required attribute masks, `EINVAL` for
//!   anything else).
//! * Transport: every context listens on `IBV_TESTPROV_ADDR:<ephemeral port>`; a QP number is
//!   `port << 8 | index` (24 bits), so moving to RTR with the peer's GID and QP number tells the
//!   provider where to connect. Requests run in order per QP: RDMA_WRITE (copied into the
//!   remote MR after rkey/bounds/access checks there), RDMA_WRITE_WITH_IMM (also consumes a
//!   posted receive on the remote, which completes as RECV_RDMA_WITH_IMM with `imm_data` and
//!   `byte_len`; 0-byte writes are allowed and skip the rkey check, as in the IB spec),
//!   ATOMIC_FETCH_AND_ADD (8-byte aligned, atomic on the remote memory, old value into the local
//!   SGE). Completions are in order, signaled or not (errors always complete).
//! * Statuses: `REM_ACCESS_ERR` for a bad rkey / out-of-bounds / missing MR access (remote memory
//!   untouched), `REM_INV_REQ_ERR` when the remote QP lacks the access flag or the atomic is
//!   misaligned, `LOC_PROT_ERR` for a bad local SGE, `RNR_RETRY_EXC_ERR` when no receive is
//!   posted within `IBV_TESTPROV_RNR_TIMEOUT_MS` (default 10000), `RETRY_EXC_ERR` when the peer
//!   is unreachable or its process died, `WR_FLUSH_ERR` for everything flushed after ERR.
//!
//! # Deliberate differences from hardware
//!
//! * When a requester vanishes without a clean close (its process died), the responder QP also
//!   moves to ERR and flushes its receives, so a process that only waits for receives notices
//!   the death instead of hanging. A clean `ibv_destroy_qp` sends a "bye" and changes nothing
//!   on the peer until it sends again (then `RETRY_EXC_ERR`).
//! * The send payload is copied when posted; CQs grow instead of overrunning; no completion
//!   channels (`ibv_req_notify_cq` returns `EOPNOTSUPP`), SRQs, UD, reads or dmabuf.

#![allow(clippy::missing_safety_doc)] // every exported function documents its contract below

pub mod state;
pub mod wire;

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use ibverbs_sys as sys;
use sys::ibv_qp_attr_mask as m;
use sys::ibv_qp_state as qps;

use state::{
    lock, Config, CqShared, CtxShared, MrInfo, QpCaps, QpShared, RawWc, SendKind, SendReq,
};
use state::{
    ACCESS_LOCAL_WRITE, ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_WRITE, EBUSY, EINVAL, ENOMEM,
    EOPNOTSUPP,
};

const _: () = assert!(std::mem::size_of::<RawWc>() == std::mem::size_of::<sys::ibv_wc>());
const _: () = assert!(std::mem::align_of::<RawWc>() == std::mem::align_of::<sys::ibv_wc>());

/// Deepest send queue we accept (keeps unread acknowledgements far below socket buffers).
const MAX_QP_WR: u32 = 4096;
const MAX_SGE: u32 = 4;
const MAX_CQE: i32 = 1 << 20;

extern "C" {
    fn __errno_location() -> *mut c_int;
}

fn set_errno(e: i32) {
    // SAFETY: glibc's thread-local errno location is always valid.
    unsafe { *__errno_location() = e };
}

// ---------------------------------------------------------------- devices

struct DevPtr(*mut sys::ibv_device);
// SAFETY: device structs are immutable after creation and live for the whole process.
unsafe impl Send for DevPtr {}
// SAFETY: as above.
unsafe impl Sync for DevPtr {}

static DEVICES: OnceLock<Vec<DevPtr>> = OnceLock::new();

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let max = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(max)) {
        *d = b as c_char;
    }
}

fn devices() -> &'static [DevPtr] {
    DEVICES.get_or_init(|| {
        let n = std::env::var("IBV_TESTPROV_NDEV")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(1)
            .min(64);
        (0..n)
            .map(|i| {
                // SAFETY: ibv_device is plain data; zero is valid.
                let mut d: sys::ibv_device = unsafe { std::mem::zeroed() };
                let name = format!("testprov{i}");
                copy_cstr(&mut d.name, &name);
                copy_cstr(&mut d.dev_name, &format!("uverbs{i}"));
                copy_cstr(&mut d.dev_path, &format!("/nonexistent/testprov/uverbs{i}"));
                copy_cstr(&mut d.ibdev_path, &format!("/nonexistent/testprov/{name}"));
                d.node_type = sys::IBV_NODE_CA;
                d.transport_type = sys::IBV_TRANSPORT_IB;
                DevPtr(Box::into_raw(Box::new(d)))
            })
            .collect()
    })
}

fn device_index(dev: *mut sys::ibv_device) -> Option<usize> {
    devices().iter().position(|d| d.0 == dev)
}

/// `ibv_get_device_list`: a NULL-terminated array of the provider's devices.
///
/// # Safety
/// `num_devices` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut sys::ibv_device {
    let mut v: Vec<*mut sys::ibv_device> = devices().iter().map(|d| d.0).collect();
    if !num_devices.is_null() {
        // SAFETY: caller contract.
        unsafe { *num_devices = v.len() as c_int };
    }
    v.push(std::ptr::null_mut());
    Box::into_raw(v.into_boxed_slice()).cast()
}

/// `ibv_free_device_list`.
///
/// # Safety
/// `list` came from [`ibv_get_device_list`] and is freed once.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut sys::ibv_device) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: the list is NULL-terminated.
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: rebuilds the boxed slice of n + 1 entries allocated by ibv_get_device_list.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

/// `ibv_get_device_name`.
///
/// # Safety
/// `dev` is a device of this provider.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut sys::ibv_device) -> *const c_char {
    if device_index(dev).is_none() {
        set_errno(EINVAL);
        return std::ptr::null();
    }
    // SAFETY: our device structs live forever.
    unsafe { (*dev).name.as_ptr() }
}

// ---------------------------------------------------------------- contexts

#[repr(C)]
struct ProvContext {
    ibv: sys::ibv_context,
    dev_index: usize,
    shared: Arc<CtxShared>,
}

#[repr(C)]
struct ProvPd {
    ibv: sys::ibv_pd,
    shared: Arc<CtxShared>,
    users: AtomicUsize,
}

#[repr(C)]
struct ProvMr {
    ibv: sys::ibv_mr,
    shared: Arc<CtxShared>,
    pd: *mut ProvPd,
}

#[repr(C)]
struct ProvCq {
    ibv: sys::ibv_cq,
    shared: Arc<CqShared>,
}

#[repr(C)]
struct ProvQp {
    ibv: sys::ibv_qp,
    shared: Arc<QpShared>,
    pd: *mut ProvPd,
}

/// # Safety
/// `ctx` is NULL or a context opened by this provider.
unsafe fn prov_ctx<'a>(ctx: *mut sys::ibv_context) -> Option<&'a ProvContext> {
    // SAFETY: ibv is the first field of the repr(C) ProvContext we allocated.
    unsafe { ctx.cast::<ProvContext>().as_ref() }
}

/// `ibv_open_device`: starts the context's TCP listener and service thread.
///
/// # Safety
/// `dev` is a device of this provider.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut sys::ibv_device) -> *mut sys::ibv_context {
    let Some(index) = device_index(dev) else {
        set_errno(EINVAL);
        return std::ptr::null_mut();
    };
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("ibv-testprov: {msg}");
            set_errno(EINVAL);
            return std::ptr::null_mut();
        }
    };
    let shared = match CtxShared::open(format!("testprov{index}"), config) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("ibv-testprov: opening testprov{index}: {msg}");
            set_errno(19); // ENODEV
            return std::ptr::null_mut();
        }
    };
    // SAFETY: ibv_context is plain data (pointers, ints, a pthread mutex whose all-zero value is
    // PTHREAD_MUTEX_INITIALIZER in glibc); zero is valid.
    let mut ibv: sys::ibv_context = unsafe { std::mem::zeroed() };
    ibv.device = dev;
    ibv.cmd_fd = -1;
    ibv.async_fd = -1;
    ibv.num_comp_vectors = 1;
    ibv.ops.post_send = Some(tp_post_send);
    ibv.ops.post_recv = Some(tp_post_recv);
    ibv.ops.poll_cq = Some(tp_poll_cq);
    ibv.ops.req_notify_cq = Some(tp_req_notify_cq);
    Box::into_raw(Box::new(ProvContext {
        ibv,
        dev_index: index,
        shared,
    }))
    .cast()
}

/// `ibv_close_device`: stops the listener; the context memory is freed.
///
/// # Safety
/// `ctx` was opened by this provider and is closed once.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut sys::ibv_context) -> c_int {
    if ctx.is_null() {
        return EINVAL;
    }
    // SAFETY: allocated as Box<ProvContext> in ibv_open_device.
    let b = unsafe { Box::from_raw(ctx.cast::<ProvContext>()) };
    b.shared.close();
    0
}

/// `ibv_query_device`.
///
/// # Safety
/// `ctx` is a live context of this provider, `attr` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_device_attr,
) -> c_int {
    // SAFETY: caller contract.
    let (Some(c), Some(a)) = (unsafe { prov_ctx(ctx) }, unsafe { attr.as_mut() }) else {
        return EINVAL;
    };
    // SAFETY: plain data, zero is valid.
    *a = unsafe { std::mem::zeroed() };
    copy_cstr(&mut a.fw_ver, "testprov-1.0");
    a.node_guid = (0x7e57_0000_0000_0000u64 | c.dev_index as u64).to_be();
    a.sys_image_guid = a.node_guid;
    a.max_mr_size = 1 << 40;
    a.page_size_cap = 4096;
    a.max_qp = state::MAX_QP as c_int;
    a.max_qp_wr = MAX_QP_WR as c_int;
    a.max_sge = MAX_SGE as c_int;
    a.max_sge_rd = MAX_SGE as c_int;
    a.max_cq = 1024;
    a.max_cqe = MAX_CQE;
    a.max_mr = 1 << 16;
    a.max_pd = 1024;
    a.max_qp_rd_atom = 16;
    a.max_qp_init_rd_atom = 16;
    a.max_res_rd_atom = 16 * state::MAX_QP as c_int;
    a.atomic_cap = if c.shared.config.no_atomics {
        sys::IBV_ATOMIC_NONE
    } else {
        sys::IBV_ATOMIC_HCA
    };
    a.max_pkeys = 1;
    a.phys_port_cnt = 1;
    0
}

/// `ibv_query_port`: fills a full `ibv_port_attr` (callers pass one, as verbs.h's inline does).
///
/// # Safety
/// `ctx` is a live context of this provider; `attr` points to a writable full `ibv_port_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut sys::ibv_context,
    port: u8,
    attr: *mut sys::ibv_port_attr,
) -> c_int {
    // SAFETY: caller contract.
    let (Some(_), Some(a)) = (unsafe { prov_ctx(ctx) }, unsafe { attr.as_mut() }) else {
        return EINVAL;
    };
    if port != 1 {
        return EINVAL;
    }
    // SAFETY: plain data, zero is valid.
    *a = unsafe { std::mem::zeroed() };
    a.state = sys::ibv_port_state::IBV_PORT_ACTIVE;
    a.max_mtu = sys::IBV_MTU_4096;
    a.active_mtu = sys::IBV_MTU_4096;
    a.gid_tbl_len = 1;
    a.max_msg_sz = wire::MAX_MSG;
    a.pkey_tbl_len = 1;
    a.lid = 0;
    a.active_width = 2; // 4X
    a.active_speed = 32; // 25 Gb/s class
    a.phys_state = 5; // LinkUp
    a.link_layer = sys::IBV_LINK_LAYER_ETHERNET as u8;
    0
}

/// `ibv_query_gid`: index 0 is the IPv4-mapped address of `IBV_TESTPROV_ADDR`.
///
/// # Safety
/// `ctx` is a live context of this provider; `gid` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut sys::ibv_context,
    port: u8,
    index: c_int,
    gid: *mut sys::ibv_gid,
) -> c_int {
    // SAFETY: caller contract.
    let (Some(c), Some(g)) = (unsafe { prov_ctx(ctx) }, unsafe { gid.as_mut() }) else {
        return EINVAL;
    };
    if port != 1 || index != 0 {
        return EINVAL;
    }
    g.raw = c.shared.addr.to_ipv6_mapped().octets();
    0
}

// ---------------------------------------------------------------- PDs and MRs

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

// ---------------------------------------------------------------- CQs

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

unsafe extern "C" fn tp_poll_cq(
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

unsafe extern "C" fn tp_req_notify_cq(_cq: *mut sys::ibv_cq, _solicited_only: c_int) -> c_int {
    EOPNOTSUPP
}

// ---------------------------------------------------------------- QPs

/// `ibv_create_qp`: RC only.
///
/// # Safety
/// `pd` is a live PD of this provider; `init` valid, with CQs of the same context.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut sys::ibv_pd,
    init: *mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    let fail = |e| {
        set_errno(e);
        std::ptr::null_mut()
    };
    // SAFETY: caller contract.
    let (Some(p), Some(ia)) = (unsafe { pd.cast::<ProvPd>().as_ref() }, unsafe {
        init.as_mut()
    }) else {
        return fail(EINVAL);
    };
    // SAFETY: caller contract: CQs of this provider.
    let (Some(scq), Some(rcq)) = (unsafe { ia.send_cq.cast::<ProvCq>().as_ref() }, unsafe {
        ia.recv_cq.cast::<ProvCq>().as_ref()
    }) else {
        return fail(EINVAL);
    };
    if ia.qp_type != sys::ibv_qp_type::IBV_QPT_RC || !ia.srq.is_null() {
        return fail(EOPNOTSUPP);
    }
    let c = &ia.cap;
    if c.max_send_wr == 0
        || c.max_send_wr > MAX_QP_WR
        || c.max_recv_wr > MAX_QP_WR
        || c.max_send_sge > MAX_SGE
        || c.max_recv_sge > MAX_SGE
    {
        return fail(EINVAL);
    }
    if scq.ibv.context != p.ibv.context || rcq.ibv.context != p.ibv.context {
        return fail(EINVAL);
    }
    let ctx = &p.shared;
    let mut qps_table = lock(&ctx.qps);
    let Some(index) = qps_table.iter().position(|s| s.is_none()) else {
        return fail(ENOMEM);
    };
    let caps = QpCaps {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr.max(1),
        max_send_sge: c.max_send_sge.max(1),
        max_recv_sge: c.max_recv_sge.max(1),
    };
    let shared = Arc::new(QpShared::new(
        ctx.clone(),
        index,
        p.ibv.handle,
        caps,
        ia.sq_sig_all != 0,
        scq.shared.clone(),
        rcq.shared.clone(),
    ));
    qps_table[index] = Some(shared.clone());
    drop(qps_table);
    p.users.fetch_add(1, Ordering::SeqCst);
    scq.shared.users.fetch_add(1, Ordering::SeqCst);
    rcq.shared.users.fetch_add(1, Ordering::SeqCst);
    ia.cap.max_inline_data = 0;
    // SAFETY: plain data (pthread objects all-zero = initializers in glibc).
    let mut ibv: sys::ibv_qp = unsafe { std::mem::zeroed() };
    ibv.context = p.ibv.context;
    ibv.qp_context = ia.qp_context;
    ibv.pd = pd;
    ibv.send_cq = ia.send_cq;
    ibv.recv_cq = ia.recv_cq;
    ibv.handle = state::next_handle();
    ibv.qp_num = shared.qpn;
    ibv.state = qps::IBV_QPS_RESET;
    ibv.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
    Box::into_raw(Box::new(ProvQp {
        ibv,
        shared,
        pd: pd.cast(),
    }))
    .cast()
}

fn has(mask: u32, need: m) -> bool {
    mask & need.0 == need.0
}

fn modify(q: &mut ProvQp, attr: &sys::ibv_qp_attr, mask: u32) -> Result<(), i32> {
    let s = q.shared.clone();
    let cur = s.state();
    let new = if has(mask, m::IBV_QP_STATE) {
        attr.qp_state
    } else {
        cur
    };
    if has(mask, m::IBV_QP_CUR_STATE) && attr.cur_qp_state != cur {
        return Err(EINVAL);
    }
    if has(mask, m::IBV_QP_PORT) && attr.port_num != 1 {
        return Err(EINVAL);
    }
    match (cur, new) {
        (_, qps::IBV_QPS_RESET) => s.reset(),
        (_, qps::IBV_QPS_ERR) => s.to_error(),
        (qps::IBV_QPS_RESET, qps::IBV_QPS_INIT) | (qps::IBV_QPS_INIT, qps::IBV_QPS_INIT) => {
            let need = m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS;
            if cur == qps::IBV_QPS_RESET && !has(mask, need) {
                return Err(EINVAL);
            }
            let mut inner = lock(&s.inner);
            if has(mask, m::IBV_QP_ACCESS_FLAGS) {
                inner.access = attr.qp_access_flags;
            }
            inner.state = qps::IBV_QPS_INIT;
        }
        (qps::IBV_QPS_INIT, qps::IBV_QPS_RTR) => {
            let need = m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER;
            if !has(mask, need) {
                return Err(EINVAL);
            }
            if !(1..=5).contains(&attr.path_mtu) || attr.dest_qp_num > 0x00ff_ffff {
                return Err(EINVAL);
            }
            let ah = &attr.ah_attr;
            if ah.port_num > 1 {
                return Err(EINVAL);
            }
            // Ethernet link layer: a GRH with the peer's GID is mandatory (as with RoCE).
            if ah.is_global == 0 {
                return Err(EINVAL);
            }
            // SAFETY: every bit pattern of the GID union is valid bytes.
            let dgid = unsafe { ah.grh.dgid.raw };
            let Some(ip) = std::net::Ipv6Addr::from(dgid).to_ipv4_mapped() else {
                return Err(EINVAL);
            };
            let port = (attr.dest_qp_num >> 8) as u16;
            let remote = SocketAddrV4::new(ip, port);
            {
                let mut inner = lock(&s.inner);
                inner.path_mtu = attr.path_mtu;
                inner.dest_qpn = attr.dest_qp_num;
                inner.dgid = dgid;
                inner.remote = Some(remote);
                inner.state = qps::IBV_QPS_RTR;
            }
            s.cond.notify_all();
            s.connect(remote, attr.dest_qp_num);
        }
        (qps::IBV_QPS_RTR, qps::IBV_QPS_RTS) | (qps::IBV_QPS_RTS, qps::IBV_QPS_RTS) => {
            let need = m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_MAX_QP_RD_ATOMIC;
            if cur == qps::IBV_QPS_RTR && !has(mask, need) {
                return Err(EINVAL);
            }
            let mut inner = lock(&s.inner);
            if has(mask, m::IBV_QP_TIMEOUT) {
                inner.timeout = attr.timeout;
            }
            if has(mask, m::IBV_QP_RETRY_CNT) {
                inner.retry_cnt = attr.retry_cnt;
            }
            if has(mask, m::IBV_QP_RNR_RETRY) {
                inner.rnr_retry = attr.rnr_retry;
            }
            if has(mask, m::IBV_QP_ACCESS_FLAGS) {
                inner.access = attr.qp_access_flags;
            }
            inner.state = qps::IBV_QPS_RTS;
        }
        _ => return Err(EINVAL),
    }
    q.ibv.state = s.state();
    Ok(())
}

/// `ibv_modify_qp`: the RC state machine.
///
/// # Safety
/// `qp` is a live QP of this provider; `attr` valid for the fields named by `mask`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: caller contract; ibv is the first field of ProvQp.
    let (Some(q), Some(a)) = (unsafe { qp.cast::<ProvQp>().as_mut() }, unsafe {
        attr.as_ref()
    }) else {
        return EINVAL;
    };
    match modify(q, a, mask as u32) {
        Ok(()) => 0,
        Err(e) => e,
    }
}

/// `ibv_query_qp`.
///
/// # Safety
/// `qp` is a live QP of this provider; `attr` and `init` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    _mask: c_int,
    init: *mut sys::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: caller contract.
    let (Some(q), Some(a), Some(ia)) = (
        unsafe { qp.cast::<ProvQp>().as_mut() },
        unsafe { attr.as_mut() },
        unsafe { init.as_mut() },
    ) else {
        return EINVAL;
    };
    let s = &q.shared;
    let inner = lock(&s.inner);
    // SAFETY: plain data, zero is valid.
    *a = unsafe { std::mem::zeroed() };
    a.qp_state = inner.state;
    a.cur_qp_state = inner.state;
    a.path_mtu = inner.path_mtu;
    a.dest_qp_num = inner.dest_qpn;
    a.qp_access_flags = inner.access;
    a.port_num = inner.port;
    a.timeout = inner.timeout;
    a.retry_cnt = inner.retry_cnt;
    a.rnr_retry = inner.rnr_retry;
    a.ah_attr.is_global = u8::from(inner.remote.is_some());
    a.ah_attr.grh.dgid = sys::ibv_gid { raw: inner.dgid };
    a.ah_attr.port_num = inner.port;
    let caps = sys::ibv_qp_cap {
        max_send_wr: s.caps.max_send_wr,
        max_recv_wr: s.caps.max_recv_wr,
        max_send_sge: s.caps.max_send_sge,
        max_recv_sge: s.caps.max_recv_sge,
        max_inline_data: 0,
    };
    a.cap = caps;
    // SAFETY: plain data, zero is valid.
    *ia = unsafe { std::mem::zeroed() };
    ia.qp_context = q.ibv.qp_context;
    ia.send_cq = q.ibv.send_cq;
    ia.recv_cq = q.ibv.recv_cq;
    ia.cap = caps;
    ia.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
    ia.sq_sig_all = c_int::from(s.sq_sig_all);
    q.ibv.state = inner.state;
    0
}

/// `ibv_destroy_qp`: says bye to the peer, joins the QP's service threads.
///
/// # Safety
/// `qp` is a live QP of this provider, destroyed once.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut sys::ibv_qp) -> c_int {
    let p = qp.cast::<ProvQp>();
    if p.is_null() {
        return EINVAL;
    }
    // SAFETY: allocated as Box<ProvQp>.
    let b = unsafe { Box::from_raw(p) };
    let s = b.shared.clone();
    lock(&s.ctx.qps)[s.index] = None;
    s.destroy();
    s.send_cq.users.fetch_sub(1, Ordering::SeqCst);
    s.recv_cq.users.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: the PD outlives its QPs (dealloc_pd refuses while users != 0).
    if let Some(pd) = unsafe { b.pd.as_ref() } {
        pd.users.fetch_sub(1, Ordering::SeqCst);
    }
    0
}

unsafe fn decode_send(wr: &sys::ibv_send_wr) -> Result<SendReq, i32> {
    if wr.num_sge < 0 || (wr.num_sge > 0 && wr.sg_list.is_null()) {
        return Err(EINVAL);
    }
    let sges = (0..wr.num_sge as usize)
        .map(|i| {
            // SAFETY: the caller's sg_list has num_sge entries.
            let s = unsafe { &*wr.sg_list.add(i) };
            (s.addr, s.length, s.lkey)
        })
        .collect();
    // SAFETY: the union member read matches the opcode, as verbs requires of the caller.
    let kind = unsafe {
        match wr.opcode {
            sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE => SendKind::Write {
                rkey: wr.wr.rdma.rkey,
                addr: wr.wr.rdma.remote_addr,
                imm: None,
            },
            sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM => SendKind::Write {
                rkey: wr.wr.rdma.rkey,
                addr: wr.wr.rdma.remote_addr,
                imm: Some(wr.__bindgen_anon_1.imm_data),
            },
            sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD => SendKind::FetchAdd {
                rkey: wr.wr.atomic.rkey,
                addr: wr.wr.atomic.remote_addr,
                add: wr.wr.atomic.compare_add,
            },
            _ => return Err(EINVAL),
        }
    };
    Ok(SendReq {
        wr_id: wr.wr_id,
        signaled: wr.send_flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0,
        kind,
        sges,
    })
}

unsafe extern "C" fn tp_post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad_wr: *mut *mut sys::ibv_send_wr,
) -> c_int {
    // SAFETY: called through our ops table with one of our QPs.
    let Some(q) = (unsafe { qp.cast::<ProvQp>().as_ref() }) else {
        return EINVAL;
    };
    let mut cur = wr;
    // SAFETY: the caller passes a valid NULL-terminated chain.
    while let Some(w) = unsafe { cur.as_ref() } {
        // SAFETY: w is a valid work request.
        let res = unsafe { decode_send(w) }.and_then(|r| q.shared.post_send(r));
        if let Err(e) = res {
            if !bad_wr.is_null() {
                // SAFETY: writable per the caller's contract.
                unsafe { *bad_wr = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

unsafe extern "C" fn tp_post_recv(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: called through our ops table with one of our QPs.
    let Some(q) = (unsafe { qp.cast::<ProvQp>().as_ref() }) else {
        return EINVAL;
    };
    let mut cur = wr;
    // SAFETY: the caller passes a valid NULL-terminated chain.
    while let Some(w) = unsafe { cur.as_ref() } {
        let res = if w.num_sge < 0 {
            Err(EINVAL)
        } else {
            q.shared.post_recv(w.wr_id, w.num_sge as usize)
        };
        if let Err(e) = res {
            if !bad_wr.is_null() {
                // SAFETY: writable per the caller's contract.
                unsafe { *bad_wr = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}
