// No unwrap() a peer, a file or the environment could make panic (tests may).
#![cfg_attr(not(test), warn(clippy::unwrap_used))]
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
//!   channels (`ibv_req_notify_cq` returns `EOPNOTSUPP`), SRQs, UD or reads.
//! * `ibv_reg_dmabuf_mr` maps the fd itself (the host backend exports a memfd) and translates
//!   the iova to that mapping; `IBV_TESTPROV_NO_DMABUF=1` makes it fail with `EOPNOTSUPP`.

#![allow(clippy::missing_safety_doc)] // every exported function documents its contract below

mod cq;
use cq::{tp_poll_cq, tp_req_notify_cq};
mod pd;
mod qp;
use qp::tp_post;
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

/// Sets the C library's thread-local `errno`, which verbs callers read after a NULL return.
fn set_errno(e: i32) {
    errno::set_errno(errno::Errno(e));
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
    /// `(base, len)` of the provider's own mapping of a dma-buf region.
    mapping: Option<(usize, usize)>,
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
    ibv.ops.post_send = Some(tp_post::<sys::ibv_send_wr>);
    ibv.ops.post_recv = Some(tp_post::<sys::ibv_recv_wr>);
    ibv.ops.poll_cq = Some(tp_poll_cq);
    ibv.ops.req_notify_cq = Some(tp_req_notify_cq);
    Box::into_raw(Box::new(ProvContext {
        ibv,
        dev_index: index,
        shared,
    }))
    .cast()
}

/// Takes back an object this provider handed out as a `*mut U` that is a leaked `Box<T>`; `None`
/// for null.
///
/// # Safety
/// `p` is null or came from `Box::<T>::into_raw` (cast to `U`), and is taken back once.
pub(crate) unsafe fn unbox<T, U>(p: *mut U) -> Option<Box<T>> {
    let p = p.cast::<T>();
    // SAFETY: non-null, and a leaked Box<T> per the caller's contract.
    (!p.is_null()).then(|| unsafe { Box::from_raw(p) })
}

/// `ibv_close_device`: stops the listener; the context memory is freed.
///
/// # Safety
/// `ctx` was opened by this provider and is closed once.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut sys::ibv_context) -> c_int {
    // SAFETY: allocated as Box<ProvContext> in ibv_open_device, closed once.
    let Some(b) = (unsafe { unbox::<ProvContext, _>(ctx) }) else {
        return EINVAL;
    };
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
