//! RC queue pairs: `ibv_create_qp`, `ibv_modify_qp` (the state machine and its attribute
//! masks), `ibv_query_qp`, `ibv_destroy_qp` and the inline `post_send` / `post_recv` entries.

use super::*;

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
    // SAFETY: allocated as Box<ProvQp>, taken back once.
    let Some(b) = (unsafe { crate::unbox::<ProvQp, _>(qp) }) else {
        return EINVAL;
    };
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

/// A work request of a NULL-terminated chain, and how a QP takes it.
pub(crate) trait Chained {
    fn next(&self) -> *mut Self;
    /// Posts this request to `q`.
    ///
    /// # Safety
    /// `self` is a valid work request (its scatter/gather list included).
    unsafe fn post(&self, q: &ProvQp) -> Result<(), c_int>;
}

impl Chained for sys::ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    unsafe fn post(&self, q: &ProvQp) -> Result<(), c_int> {
        // SAFETY: forwarded from the caller.
        unsafe { decode_send(self) }.and_then(|r| q.shared.post_send(r))
    }
}

impl Chained for sys::ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    unsafe fn post(&self, q: &ProvQp) -> Result<(), c_int> {
        if self.num_sge < 0 {
            return Err(EINVAL);
        }
        q.shared.post_recv(self.wr_id, self.num_sge as usize)
    }
}

/// `post_send` / `post_recv` of the ops table: posts the requests of the chain `wr` to `qp`, in
/// order; at the first failure `*bad_wr` (when not null) is that request and its error is
/// returned.
///
/// # Safety
/// `qp` is one of our QPs (or null); `wr` a valid NULL-terminated chain; `bad_wr` null or
/// writable.
pub(crate) unsafe extern "C" fn tp_post<W: Chained>(
    qp: *mut sys::ibv_qp,
    wr: *mut W,
    bad_wr: *mut *mut W,
) -> c_int {
    // SAFETY: called through our ops table with one of our QPs.
    let Some(q) = (unsafe { qp.cast::<ProvQp>().as_ref() }) else {
        return EINVAL;
    };
    let mut cur = wr;
    // SAFETY: the caller passes a valid NULL-terminated chain.
    while let Some(w) = unsafe { cur.as_ref() } {
        // SAFETY: w is a valid work request of the chain.
        if let Err(e) = unsafe { w.post(q) } {
            if !bad_wr.is_null() {
                // SAFETY: writable per the caller's contract.
                unsafe { *bad_wr = cur };
            }
            return e;
        }
        cur = w.next();
    }
    0
}
