//! Reliable-connected queue pairs: creation, the RESET -> INIT -> RTR -> RTS transitions with
//! the usual attributes, and posting work requests.

use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys as sys;
use sys::ibv_qp_attr_mask as mask;

use super::cq::CompletionQueue;
use super::device::Gid;
use super::memory::{AccessFlags, ProtectionDomain};
use super::{inline, IbvError};

/// Queue sizes for [`ProtectionDomain::create_rc_qp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// `ibv_qp_cap.max_send_wr`: outstanding work requests the send queue can hold.
    pub max_send_wr: u32,
    /// `ibv_qp_cap.max_recv_wr`: outstanding work requests the receive queue can hold.
    pub max_recv_wr: u32,
    /// `ibv_qp_cap.max_send_sge`: scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// `ibv_qp_cap.max_recv_sge`: scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// `ibv_qp_cap.max_inline_data`: largest payload, in bytes, that may be posted inline.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// QP states (`ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// `IBV_QPS_RESET`: freshly created, or reset; no work can be posted.
    Reset,
    /// `IBV_QPS_INIT`: port and access flags set; receives may be posted.
    Init,
    /// `IBV_QPS_RTR`: ready to receive; connected to the remote QP.
    Rtr,
    /// `IBV_QPS_RTS`: ready to send; the normal operating state.
    Rts,
    /// `IBV_QPS_SQD`: send queue drained.
    Sqd,
    /// `IBV_QPS_SQE`: send queue error (a send failed; receives still work).
    Sqe,
    /// `IBV_QPS_ERR`: error; every outstanding request is flushed with an error.
    Err,
    /// A state value this crate does not know, as the library returned it.
    Unknown(u32),
}

impl QpState {
    fn from_sys(s: u32) -> QpState {
        use sys::ibv_qp_state::*;
        match s {
            IBV_QPS_RESET => QpState::Reset,
            IBV_QPS_INIT => QpState::Init,
            IBV_QPS_RTR => QpState::Rtr,
            IBV_QPS_RTS => QpState::Rts,
            IBV_QPS_SQD => QpState::Sqd,
            IBV_QPS_SQE => QpState::Sqe,
            IBV_QPS_ERR => QpState::Err,
            other => QpState::Unknown(other),
        }
    }
}

/// What the RTR transition needs to know about the remote QP.
#[derive(Debug, Clone, Copy)]
pub struct RtrParams {
    /// `ah_attr.port_num`: the local port (1-based) the QP sends from.
    pub port: u8,
    /// `dest_qp_num`: the remote QP's number.
    pub remote_qpn: u32,
    /// `rq_psn`: the first packet sequence number expected from the remote QP (its `sq_psn`).
    pub remote_psn: u32,
    /// `ah_attr.dlid`: the remote port's LID (InfiniBand; 0 on RoCE).
    pub remote_lid: u16,
    /// Required on Ethernet (RoCE) ports: the remote GID, with `sgid_index` our GID index.
    pub remote_gid: Option<Gid>,
    /// `ah_attr.grh.sgid_index`: index of our GID in the local port's table (with `remote_gid`).
    pub sgid_index: u8,
    /// `IBV_MTU_*`, normally the port's active MTU.
    pub path_mtu: u32,
    /// `max_dest_rd_atomic`: RDMA reads/atomics the remote side may have outstanding on us.
    pub max_dest_rd_atomic: u8,
    /// `min_rnr_timer`: IB-encoded delay the peer waits before retrying when no receive is posted.
    pub min_rnr_timer: u8,
}

impl RtrParams {
    /// The usual values (PSN 0, 1 outstanding read/atomic, RNR timer 12) for `remote_qpn`.
    pub fn new(port: u8, remote_qpn: u32, path_mtu: u32) -> Self {
        RtrParams {
            port,
            remote_qpn,
            remote_psn: 0,
            remote_lid: 0,
            remote_gid: None,
            sgid_index: 0,
            path_mtu,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
        }
    }
}

/// RTS attributes; `Default` holds the usual values (timeout 18, 7 retries, infinite RNR).
#[derive(Debug, Clone, Copy)]
pub struct RtsParams {
    /// `sq_psn`: our first send packet sequence number (the peer's `remote_psn`).
    pub sq_psn: u32,
    /// `timeout`: IB-encoded ACK timeout, 4.096 us * 2^timeout (0 means infinite).
    pub timeout: u8,
    /// `retry_cnt`: times a send is retried after an ACK timeout before failing.
    pub retry_cnt: u8,
    /// `rnr_retry`: times a send is retried on receiver-not-ready (7 means forever).
    pub rnr_retry: u8,
    /// `max_rd_atomic`: RDMA reads/atomics we may have outstanding on the peer.
    pub max_rd_atomic: u8,
}

impl Default for RtsParams {
    fn default() -> Self {
        RtsParams {
            sq_psn: 0,
            timeout: 18,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

/// A scatter/gather entry: `length` bytes at `addr` inside the region with `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// `ibv_sge.addr`: start address of the local buffer.
    pub addr: u64,
    /// `ibv_sge.length`: length of the buffer in bytes.
    pub length: u32,
    /// `ibv_sge.lkey`: local key of the memory region that contains it.
    pub lkey: u32,
}

/// The RDMA operations the core uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// `IBV_WR_RDMA_WRITE` of the local SGE to `remote_addr`.
    Write {
        /// `wr.rdma.remote_addr`: destination address in the peer's region.
        remote_addr: u64,
        /// `wr.rdma.rkey`: the peer region's remote key.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`; consumes a receive on the peer, which completes with
    /// `imm` (host order here; sent in network order). A write of 0 bytes is allowed.
    WriteWithImm {
        /// `wr.rdma.remote_addr`: destination address in the peer's region.
        remote_addr: u64,
        /// `wr.rdma.rkey`: the peer region's remote key.
        rkey: u32,
        /// The 32-bit immediate value delivered in the peer's receive completion.
        imm: u32,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD` of `add` on the 8 aligned bytes at `remote_addr`; the old
    /// value lands in the local SGE (8 bytes, LOCAL_WRITE).
    FetchAndAdd {
        /// `wr.atomic.remote_addr`: the 8-byte aligned target in the peer's region.
        remote_addr: u64,
        /// `wr.atomic.rkey`: the peer region's remote key.
        rkey: u32,
        /// `wr.atomic.compare_add`: the value added.
        add: u64,
    },
}

/// One send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// `ibv_send_wr.wr_id`: returned in the completion's `wr_id`.
    pub wr_id: u64,
    /// The operation and its remote target (`opcode` plus `wr.rdma` / `wr.atomic`).
    pub op: SendOp,
    /// The local buffer (`None` for a 0-byte write).
    pub local: Option<Sge>,
    /// Whether a successful completion is generated (errors always are).
    pub signaled: bool,
}

/// One receive work request (RDMA_WRITE_WITH_IMM needs no buffer, so `local` may be `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// `ibv_recv_wr.wr_id`: returned in the completion's `wr_id`.
    pub wr_id: u64,
    /// The buffer incoming data lands in; `None` posts a receive with no SGE.
    pub local: Option<Sge>,
}

impl ProtectionDomain {
    /// `ibv_create_qp` for a reliable-connected QP.
    pub fn create_rc_qp(
        self: &Arc<Self>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<QueuePair, IbvError> {
        QueuePair::create_rc(self.clone(), send_cq.clone(), recv_cq.clone(), caps)
    }
}

/// A reliable-connected queue pair; destroyed on drop.
pub struct QueuePair {
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    raw: NonNull<sys::ibv_qp>,
}

// Thread-safe: verbs QPs are thread-safe (providers lock their queues); the pointer is only passed
// to verbs calls.
thread_safe!(QueuePair);

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

fn sge_to_sys(s: &Option<Sge>) -> sys::ibv_sge {
    match s {
        Some(s) => sys::ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        },
        None => sys::ibv_sge::default(),
    }
}

impl QueuePair {
    pub(crate) fn create_rc(
        pd: Arc<ProtectionDomain>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<QueuePair, IbvError> {
        // SAFETY: ibv_qp_init_attr is plain data; zero is valid for every field.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.as_ptr();
        init.recv_cq = recv_cq.as_ptr();
        init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap = sys::ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: caps.max_inline_data,
        };
        // SAFETY: live PD and CQs (we hold Arcs); `init` is a valid init attr.
        let raw = unsafe { (pd.context().lib().create_qp)(pd.as_ptr(), &mut init) };
        let raw = NonNull::new(raw).ok_or_else(|| IbvError::from_errno("ibv_create_qp"))?;
        Ok(QueuePair {
            pd,
            send_cq,
            recv_cq,
            raw,
        })
    }

    /// The raw `ibv_qp` (valid while `self` lives).
    pub fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.raw.as_ptr()
    }

    /// The QP number the peer needs for its RTR transition.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP; qp_num is set at creation and never changes.
        unsafe { self.raw.as_ref().qp_num }
    }

    /// The PD this QP belongs to.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The send completion queue.
    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }

    /// The receive completion queue.
    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    /// `ibv_modify_qp` with a raw attribute struct and mask.
    ///
    /// # Safety
    /// `attr` must be consistent with `attr_mask` (the provider reads the fields the mask names;
    /// pointers inside must be valid).
    pub unsafe fn modify_raw(
        &self,
        attr: &mut sys::ibv_qp_attr,
        attr_mask: u32,
    ) -> Result<(), IbvError> {
        // SAFETY: live QP; the caller guarantees `attr` matches the mask.
        let ret =
            unsafe { (self.pd.context().lib().modify_qp)(self.as_ptr(), attr, attr_mask as i32) };
        if ret != 0 {
            return Err(IbvError::from_ret("ibv_modify_qp", ret));
        }
        Ok(())
    }

    fn zeroed_attr() -> sys::ibv_qp_attr {
        // SAFETY: ibv_qp_attr is plain data; zero is valid for every field.
        unsafe { std::mem::zeroed() }
    }

    /// RESET -> INIT on `port` with the given remote access flags (pkey index 0).
    pub fn to_init(&self, port: u8, access: AccessFlags) -> Result<(), IbvError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = access.0;
        let m = mask::IBV_QP_STATE
            | mask::IBV_QP_PKEY_INDEX
            | mask::IBV_QP_PORT
            | mask::IBV_QP_ACCESS_FLAGS;
        // SAFETY: the fields named by the mask are set above.
        unsafe { self.modify_raw(&mut a, m.0) }
    }

    /// INIT -> RTR towards the remote QP described by `p`.
    pub fn to_rtr(&self, p: &RtrParams) -> Result<(), IbvError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = p.path_mtu;
        a.dest_qp_num = p.remote_qpn;
        a.rq_psn = p.remote_psn;
        a.max_dest_rd_atomic = p.max_dest_rd_atomic;
        a.min_rnr_timer = p.min_rnr_timer;
        a.ah_attr.dlid = p.remote_lid;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = p.port;
        if let Some(gid) = p.remote_gid {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = gid.to_sys();
            a.ah_attr.grh.sgid_index = p.sgid_index;
            a.ah_attr.grh.hop_limit = 255;
            a.ah_attr.grh.flow_label = 0;
            a.ah_attr.grh.traffic_class = 0;
        }
        let m = mask::IBV_QP_STATE
            | mask::IBV_QP_AV
            | mask::IBV_QP_PATH_MTU
            | mask::IBV_QP_DEST_QPN
            | mask::IBV_QP_RQ_PSN
            | mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | mask::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: the fields named by the mask are set above.
        unsafe { self.modify_raw(&mut a, m.0) }
    }

    /// RTR -> RTS.
    pub fn to_rts(&self, p: &RtsParams) -> Result<(), IbvError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = p.sq_psn;
        a.timeout = p.timeout;
        a.retry_cnt = p.retry_cnt;
        a.rnr_retry = p.rnr_retry;
        a.max_rd_atomic = p.max_rd_atomic;
        let m = mask::IBV_QP_STATE
            | mask::IBV_QP_TIMEOUT
            | mask::IBV_QP_RETRY_CNT
            | mask::IBV_QP_RNR_RETRY
            | mask::IBV_QP_SQ_PSN
            | mask::IBV_QP_MAX_QP_RD_ATOMIC;
        // SAFETY: the fields named by the mask are set above.
        unsafe { self.modify_raw(&mut a, m.0) }
    }

    /// Moves the QP to ERR (outstanding work is flushed) or RESET.
    pub fn set_state(&self, state: QpState) -> Result<(), IbvError> {
        let s = match state {
            QpState::Err => sys::ibv_qp_state::IBV_QPS_ERR,
            QpState::Reset => sys::ibv_qp_state::IBV_QPS_RESET,
            other => {
                return Err(IbvError::InvalidArgument {
                    op: "QueuePair::set_state",
                    reason: format!(
                        "expected Err or Reset (use to_init/to_rtr/to_rts), got {other:?}"
                    ),
                })
            }
        };
        let mut a = Self::zeroed_attr();
        a.qp_state = s;
        // SAFETY: only the state is named by the mask.
        unsafe { self.modify_raw(&mut a, mask::IBV_QP_STATE.0) }
    }

    /// `ibv_query_qp`: the current state.
    pub fn state(&self) -> Result<QpState, IbvError> {
        let mut a = Self::zeroed_attr();
        // SAFETY: plain data, zero is valid.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live QP; both out-structs are writable.
        let ret = unsafe {
            (self.pd.context().lib().query_qp)(
                self.as_ptr(),
                &mut a,
                mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        if ret != 0 {
            return Err(IbvError::from_ret("ibv_query_qp", ret));
        }
        Ok(QpState::from_sys(a.qp_state))
    }

    /// Posts `wrs` in order (one `ibv_post_send` call with a chained list).
    ///
    /// This is safe because the device only touches memory through registered regions: the
    /// SGE must lie inside a region with its `lkey` (checked by the device), and the region's
    /// memory is kept alive by the contract of [`ProtectionDomain::reg_mr`].
    pub fn post_send(&self, wrs: &[SendWr]) -> Result<(), IbvError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<sys::ibv_sge> = wrs.iter().map(|w| sge_to_sys(&w.local)).collect();
        // SAFETY: ibv_send_wr is plain data (pointers and integers); zero is valid.
        let mut raw: Vec<sys::ibv_send_wr> = (0..wrs.len())
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        for (i, w) in wrs.iter().enumerate() {
            let r = &mut raw[i];
            r.wr_id = w.wr_id;
            r.num_sge = i32::from(w.local.is_some());
            r.sg_list = if w.local.is_some() {
                &mut sges[i]
            } else {
                std::ptr::null_mut()
            };
            r.send_flags = if w.signaled {
                sys::ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            };
            match w.op {
                SendOp::Write { remote_addr, rkey } => {
                    r.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                    r.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
                }
                SendOp::WriteWithImm {
                    remote_addr,
                    rkey,
                    imm,
                } => {
                    r.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                    r.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
                    r.__bindgen_anon_1.imm_data = imm.to_be();
                }
                SendOp::FetchAndAdd {
                    remote_addr,
                    rkey,
                    add,
                } => {
                    r.opcode = sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
                    r.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                        remote_addr,
                        compare_add: add,
                        swap: 0,
                        rkey,
                    };
                }
            }
        }
        let base = raw.as_mut_ptr();
        for i in 0..wrs.len().saturating_sub(1) {
            // SAFETY: `i + 1` is in bounds; the Vec is not reallocated while we hold pointers.
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; `raw` is a valid NULL-terminated chain whose SGE pointers point into
        // `sges`, both alive for the call (providers copy what they need before returning).
        let ret = unsafe { inline::post_send(self.as_ptr(), base, &mut bad) };
        if ret != 0 {
            let idx = if bad.is_null() {
                0
            } else {
                // SAFETY: `bad` points into `raw` when set by the provider.
                unsafe { bad.offset_from(base) }.max(0) as usize
            };
            return Err(IbvError::Call {
                op: "ibv_post_send",
                source: std::io::Error::new(
                    std::io::Error::from_raw_os_error(ret.abs()).kind(),
                    format!(
                        "work request {idx} (wr_id {}) rejected: {}",
                        wrs.get(idx).map(|w| w.wr_id).unwrap_or(0),
                        std::io::Error::from_raw_os_error(ret.abs())
                    ),
                ),
            });
        }
        Ok(())
    }

    /// Posts receive work requests in order.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), IbvError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<sys::ibv_sge> = wrs.iter().map(|w| sge_to_sys(&w.local)).collect();
        let mut raw: Vec<sys::ibv_recv_wr> = wrs
            .iter()
            .map(|w| sys::ibv_recv_wr {
                wr_id: w.wr_id,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: i32::from(w.local.is_some()),
            })
            .collect();
        for (i, w) in wrs.iter().enumerate() {
            if w.local.is_some() {
                raw[i].sg_list = &mut sges[i];
            }
        }
        let base = raw.as_mut_ptr();
        for i in 0..wrs.len().saturating_sub(1) {
            // SAFETY: `i + 1` is in bounds; no reallocation while pointers are held.
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live QP; valid chain alive for the call.
        let ret = unsafe { inline::post_recv(self.as_ptr(), base, &mut bad) };
        if ret != 0 {
            return Err(IbvError::from_ret("ibv_post_recv", ret));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: live QP, destroyed exactly once; its CQs and PD outlive it (we hold Arcs).
        let ret = unsafe { (self.pd.context().lib().destroy_qp)(self.as_ptr()) };
        if ret != 0 {
            log::warn!(
                "ibv_destroy_qp({}) failed: {}",
                self.qp_num(),
                IbvError::from_ret("ibv_destroy_qp", ret)
            );
        }
    }
}
