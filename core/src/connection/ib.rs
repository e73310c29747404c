//! The InfiniBand connection: one reliable-connected queue pair per connection.
//!
//! # Endpoint
//! Creating an IB endpoint opens the transport's device ([`crate::ib`]), picks the port and GID,
//! creates a send CQ, a receive CQ and an RC QP (moved to INIT, with `max_recv_wr` zero-length
//! receives posted so that signals never find an empty receive queue), and registers a small
//! host "mailbox" ring (see HostNoAtomic below). Its transport payload (`MIBQ` envelope,
//! version 1): `port u8 | lid u32 | gid blob(16) | qpn u32 | psn u32 | mtu u8 | link layer u8 |
//! mode u8 (1 Host, 2 HostNoAtomic) | mailbox address u64 | mailbox rkey u32 | mailbox slots
//! u32`. Connecting moves the QP to RTR towards the peer's QP, then to RTS; an endpoint connects
//! once.
//!
//! # Data path
//! `write` posts RDMA_WRITEs (chunks of at most 1 GiB), in batches of at most
//! `max_wr_per_send`; every `max_wr_per_send`-th WR and the last WR of each operation are
//! signaled, so the send queue never holds more than `max_send_wr` WRs (the poster polls the
//! send CQ for room) and `flush` waits until no signaled WR is outstanding. Error completions
//! (remote access error, retry exceeded after a peer died, flush errors) make the connection
//! broken: that and every later operation fails naming the peer and the status.
//!
//! # Signals
//! Both sides agree on one mode: HostNoAtomic when either endpoint asked for it (or its device
//! lacks atomics, which turns Host into HostNoAtomic with a warning), else Host.
//! * Host: `update_and_sync` is an RDMA fetch-and-add of `new - old` on the remote token.
//! * HostNoAtomic: per signal, an 8-byte RDMA write of the destination token's address into
//!   slot `n mod slots` of the peer's mailbox ring, then a 0-byte RDMA write-with-immediate
//!   carrying the low 32 bits of the new value. The peer's receive thread takes the completion,
//!   reads the slot (RC ordering puts it there first; a slot is reused only after the thread
//!   reposted enough receives, because the ring has twice as many slots as posted receives),
//!   rebuilds the 64-bit value from the previous one it forwarded to that address
//!   (`prev + ((imm - low32(prev)) mod 2^32)`), and stores it into the token: a release store
//!   for host memory; for GPU memory a GDRCopy mapping when GDRCopy is available, else a
//!   blocking GPU copy (correct, slower). Jumps of 2^32 or more are sent as several signals;
//!   a decreasing value is an error. The destination must be a live local memory registered for
//!   this IB transport, else the thread records an error. Errors of the receive thread surface
//!   on the next `flush` (and `write`/`update_and_sync`) of this side.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_hal::ibv::{
    self, AccessFlags, Gid, MemoryRegion, QpCaps, QueuePair, RecvWr, RtrParams, RtsParams, SendOp,
    SendWr, Sge, WorkCompletion,
};

use super::ipc::host_addressable;
use super::BaseConnection;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::ib::{ib_ctx, ibv_err, IbCtx, RemoteMr};
use crate::registered_memory::{find_local, RegisteredMemory};
use crate::transport::{Device, EndpointConfig, IbMode, Transport};

const QP_MAGIC: &[u8; 4] = b"MIBQ";
const QP_VERSION: u16 = 1;
/// Largest RDMA write one work request carries.
const MAX_CHUNK: u64 = 1 << 30;
/// How long an operation waits for send-queue room before the peer counts as stuck.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(60);
/// Staging slots for HostNoAtomic destination addresses on the sending side.
const STAGING_SLOTS: usize = 256;

/// Host memory registered for one QP's local use (atomics' old values, staging, mailbox).
/// The region is declared first so it is deregistered before the buffer is freed.
struct HostRing {
    mr: MemoryRegion,
    buf: Box<[AtomicU64]>,
}

impl HostRing {
    fn new(ctx: &IbCtx, slots: usize, access: AccessFlags) -> Result<HostRing> {
        let buf: Box<[AtomicU64]> = (0..slots.max(1)).map(|_| AtomicU64::new(0)).collect();
        let len = buf.len() * 8;
        // SAFETY: `buf` is owned by the returned ring and freed only after `mr` is dropped
        // (field order); the device writes it only through atomics-compatible 8-byte stores.
        let mr = unsafe { ctx.pd.reg_mr(buf.as_ptr() as *mut u8, len, access) }.map_err(|e| {
            ibv_err(
                &format!("{}: registering a {len}-byte ring", ctx.transport),
                e,
            )
        })?;
        Ok(HostRing { mr, buf })
    }
    fn slot_addr(&self, i: usize) -> u64 {
        self.buf.as_ptr() as u64 + (i % self.buf.len()) as u64 * 8
    }
}

/// What the peer's endpoint says about its QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpInfo {
    pub port: u8,
    pub lid: u16,
    pub gid: Gid,
    pub qpn: u32,
    pub psn: u32,
    pub mtu: u8,
    pub link_layer: u8,
    pub mode: IbMode,
    pub mailbox_addr: u64,
    pub mailbox_rkey: u32,
    pub mailbox_slots: u32,
}

impl QpInfo {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(QP_MAGIC, QP_VERSION);
        w.u8(self.port)
            .u32(u32::from(self.lid))
            .blob(&self.gid.0)
            .u32(self.qpn)
            .u32(self.psn)
            .u8(self.mtu)
            .u8(self.link_layer)
            .u8(match self.mode {
                IbMode::HostNoAtomic => 2,
                _ => 1,
            })
            .u64(self.mailbox_addr)
            .u32(self.mailbox_rkey)
            .u32(self.mailbox_slots);
        w.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<QpInfo> {
        let mut r = Reader::new("IB endpoint info", bytes, QP_MAGIC, QP_VERSION)?;
        let port = r.u8("port")?;
        let lid = r.u32("lid")?;
        let lid = u16::try_from(lid).map_err(|_| r.bad("lid", "a 16-bit LID", lid))?;
        let g = r.blob("gid", 16)?;
        let gid = <[u8; 16]>::try_from(g).map_err(|_| r.bad("gid", "16 bytes", g.len()))?;
        let qpn = r.u32("qpn")?;
        let psn = r.u32("psn")?;
        let mtu = r.u8("mtu")?;
        let link_layer = r.u8("link layer")?;
        let mode = match r.u8("mode")? {
            1 => IbMode::Host,
            2 => IbMode::HostNoAtomic,
            m => return Err(r.bad("mode", "1 (Host) or 2 (HostNoAtomic)", m)),
        };
        let mailbox_addr = r.u64("mailbox address")?;
        let mailbox_rkey = r.u32("mailbox rkey")?;
        let mailbox_slots = r.u32("mailbox slots")?;
        r.finish()?;
        if port == 0 {
            return Err(Error::invalid(
                "IB endpoint info: port: expected 1..=255, got 0".to_string(),
            ));
        }
        if qpn == 0 || qpn > 0x00FF_FFFF || psn > 0x00FF_FFFF {
            return Err(Error::invalid(format!(
                "IB endpoint info: expected a 24-bit QP number above 0 and a 24-bit PSN, got \
                 qpn {qpn:#x}, psn {psn:#x}"
            )));
        }
        if !(1..=5).contains(&mtu) {
            return Err(Error::invalid(format!(
                "IB endpoint info: mtu: expected IBV_MTU_256..IBV_MTU_4096 (1..=5), got {mtu}"
            )));
        }
        if mailbox_slots == 0 {
            return Err(Error::invalid(
                "IB endpoint info: mailbox slots: expected above 0, got 0".to_string(),
            ));
        }
        Ok(QpInfo {
            port,
            lid,
            gid: Gid(gid),
            qpn,
            psn,
            mtu,
            link_layer,
            mode,
            mailbox_addr,
            mailbox_rkey,
            mailbox_slots,
        })
    }
}

use crate::serialize::{Reader, Writer};

/// The QP side of a local IB endpoint, taken by the first `connect`.
pub(crate) struct IbQp {
    ctx: Arc<IbCtx>,
    qp: Arc<QueuePair>,
    info: QpInfo,
    gid_index: u8,
    is_ethernet: bool,
    mailbox: Arc<HostRing>,
    max_send_wr: usize,
    max_recv_wr: usize,
    max_wr_per_send: usize,
    poll_num: usize,
}

impl std::fmt::Debug for IbQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbQp").field("info", &self.info).finish()
    }
}

fn positive(what: &str, v: i32) -> Result<usize> {
    if v <= 0 {
        return Err(Error::invalid(format!(
            "IbConfig.{what}: expected a positive value, got {v}"
        )));
    }
    Ok(v as usize)
}

/// The mode an endpoint asks for: the config's, `Default` read from `MSCCLPP_IBV_MODE`; Host
/// on a device without atomics falls back to HostNoAtomic with a warning.
fn resolve_mode(cfg: &EndpointConfig, ctx: &IbCtx) -> Result<IbMode> {
    let mode = match cfg.ib.mode {
        IbMode::Default => match crate::env::env().ibv_mode()? {
            crate::env::IbvMode::Host => IbMode::Host,
            crate::env::IbvMode::HostNoAtomic => IbMode::HostNoAtomic,
        },
        m => m,
    };
    if mode == IbMode::Host && !ctx.atomics {
        crate::log_warn!(
            "NET",
            "{}: device `{}` has no RDMA atomics; using HostNoAtomic instead of Host",
            cfg.transport,
            ctx.name()
        );
        return Ok(IbMode::HostNoAtomic);
    }
    Ok(mode)
}

fn fresh_psn() -> u32 {
    static N: AtomicU64 = AtomicU64::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    (crate::bootstrap::fnv1a(&n.to_le_bytes(), crate::endpoint::pid_hash()) as u32) & 0x00FF_FFFF
}

impl IbQp {
    /// Creates the QP of a new endpoint of `cfg` and returns it with its payload.
    pub(crate) fn create(cfg: &EndpointConfig) -> Result<(Vec<u8>, IbQp)> {
        let t = cfg.transport;
        let ctx = ib_ctx(t)?;
        let (port, pa, gid, gid_index) = ctx.select_port(&cfg.ib)?;
        let mode = resolve_mode(cfg, &ctx)?;
        let limit = (ctx.max_qp_wr as usize).max(1);
        let max_send_wr = positive("max_send_wr", cfg.ib.max_send_wr)?.min(limit);
        let max_recv_wr = positive("max_recv_wr", cfg.ib.max_recv_wr)?.min(limit);
        let max_wr_per_send = positive("max_wr_per_send", cfg.ib.max_wr_per_send)?.min(max_send_wr);
        let poll_num = positive("max_cq_poll_num", cfg.ib.max_cq_poll_num)?;
        let cq_size = positive("max_cq_size", cfg.ib.max_cq_size)?;
        let ctx_ib = ctx.pd.context();
        let send_cq = ctx_ib
            .create_cq(cq_size.max(max_send_wr) as i32)
            .map_err(|e| ibv_err(&format!("{t}: creating the send CQ"), e))?;
        let recv_cq = ctx_ib
            .create_cq(cq_size.max(max_recv_wr) as i32)
            .map_err(|e| ibv_err(&format!("{t}: creating the receive CQ"), e))?;
        let caps = QpCaps {
            max_send_wr: max_send_wr as u32,
            max_recv_wr: max_recv_wr as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = ctx
            .pd
            .create_rc_qp(&send_cq, &recv_cq, caps)
            .map_err(|e| ibv_err(&format!("{t}: creating an RC QP on `{}`", ctx.name()), e))?;
        qp.to_init(port, AccessFlags::ALL_REMOTE)
            .map_err(|e| ibv_err(&format!("{t}: QP {} to INIT", qp.qp_num()), e))?;
        let recvs: Vec<RecvWr> = (0..max_recv_wr)
            .map(|i| RecvWr {
                wr_id: i as u64,
                local: None,
            })
            .collect();
        qp.post_recv(&recvs)
            .map_err(|e| ibv_err(&format!("{t}: posting {max_recv_wr} receives"), e))?;
        let mailbox = HostRing::new(
            &ctx,
            2 * max_recv_wr,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )?;
        let info = QpInfo {
            port,
            lid: pa.lid,
            gid,
            qpn: qp.qp_num(),
            psn: fresh_psn(),
            mtu: pa.active_mtu as u8,
            link_layer: pa.link_layer,
            mode,
            mailbox_addr: mailbox.mr.addr(),
            mailbox_rkey: mailbox.mr.rkey(),
            mailbox_slots: mailbox.buf.len() as u32,
        };
        let payload = info.encode();
        Ok((
            payload,
            IbQp {
                ctx,
                qp: Arc::new(qp),
                info,
                gid_index,
                is_ethernet: pa.is_ethernet(),
                mailbox: Arc::new(mailbox),
                max_send_wr,
                max_recv_wr,
                max_wr_per_send,
                poll_num,
            },
        ))
    }
}

struct SendState {
    next_wr_id: u64,
    /// WRs posted and not yet retired by a completion.
    in_queue: usize,
    /// Signaled WRs in post order: (wr_id, WRs it retires, is a HostNoAtomic signal).
    pending: VecDeque<(u64, usize, bool)>,
    /// WRs posted since the last signaled one.
    run: usize,
    /// HostNoAtomic signals posted (the next mailbox slot) and completed.
    signals_posted: u64,
    signals_done: u64,
    broken: Option<String>,
    wcs: Vec<WorkCompletion>,
}

/// Shared with the receive thread.
struct RecvShared {
    closing: AtomicBool,
    /// Fatal (the thread stopped) errors stay; reported ones are returned once.
    fatal: Mutex<Option<String>>,
    reported: Mutex<Vec<String>>,
}

impl RecvShared {
    fn take_error(&self, peer: &str) -> Option<Error> {
        if let Some(f) = self
            .fatal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return Some(Error::io(
                format!("IB connection to {peer}: receive thread"),
                std::io::Error::new(std::io::ErrorKind::ConnectionAborted, f.clone()),
            ));
        }
        let mut r = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_empty() {
            return None;
        }
        let msgs = std::mem::take(&mut *r);
        Some(Error::invalid(format!(
            "IB connection to {peer}: {}",
            msgs.join("; ")
        )))
    }
}

pub(crate) struct IbConnection {
    transport: Transport,
    remote_transport: Transport,
    local_device: Device,
    peer: String,
    mode: IbMode,
    remote: QpInfo,
    send: Mutex<SendState>,
    max_send_wr: usize,
    max_wr_per_send: usize,
    poll_num: usize,
    recv: Arc<RecvShared>,
    thread: Option<JoinHandle<()>>,
    /// Old values of fetch-and-add land here.
    scratch: HostRing,
    /// Destination addresses of HostNoAtomic signals being sent.
    staging: HostRing,
    qp: Arc<QueuePair>,
    _mailbox: Arc<HostRing>,
    _ctx: Arc<IbCtx>,
}

impl Drop for IbConnection {
    fn drop(&mut self) {
        self.recv.closing.store(true, Ordering::Release);
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

fn backoff(idle: &mut u32) {
    *idle = idle.saturating_add(1);
    if *idle < 64 {
        std::hint::spin_loop();
    } else if *idle < 256 {
        std::thread::yield_now();
    } else {
        let us = (u64::from(*idle - 256) * 5).clamp(20, 1000);
        std::thread::sleep(Duration::from_micros(us));
    }
}

impl IbConnection {
    /// Connects the QP of `local` (taken from it) to the peer's endpoint `remote`.
    pub(crate) fn connect(local: &Endpoint, remote: &Endpoint, res: IbQp) -> Result<IbConnection> {
        let t = local.transport();
        let r = QpInfo::decode(remote.transport_payload())?;
        let peer = format!(
            "{} QP {:#x} at {}",
            remote.transport(),
            r.qpn,
            r.gid
                .ipv4()
                .map(|a| a.to_string())
                .unwrap_or_else(|| format!("{:02x?}", r.gid.0))
        );
        let mode = if res.info.mode == IbMode::HostNoAtomic || r.mode == IbMode::HostNoAtomic {
            IbMode::HostNoAtomic
        } else {
            IbMode::Host
        };
        let mut rtr = RtrParams::new(res.info.port, r.qpn, res.info.mtu.min(r.mtu) as u32);
        rtr.remote_psn = r.psn;
        rtr.remote_lid = r.lid;
        rtr.sgid_index = res.gid_index;
        if res.is_ethernet || !r.gid.is_zero() && r.lid == 0 {
            rtr.remote_gid = Some(r.gid);
        }
        res.qp.to_rtr(&rtr).map_err(|e| {
            ibv_err(
                &format!("{t}: QP {:#x} to RTR towards {peer}", res.info.qpn),
                e,
            )
        })?;
        let rts = RtsParams {
            sq_psn: res.info.psn,
            ..RtsParams::default()
        };
        res.qp
            .to_rts(&rts)
            .map_err(|e| ibv_err(&format!("{t}: QP {:#x} to RTS", res.info.qpn), e))?;
        let scratch = HostRing::new(&res.ctx, 1, AccessFlags::LOCAL_WRITE)?;
        let staging = HostRing::new(&res.ctx, STAGING_SLOTS, AccessFlags::LOCAL_WRITE)?;
        let recv = Arc::new(RecvShared {
            closing: AtomicBool::new(false),
            fatal: Mutex::new(None),
            reported: Mutex::new(Vec::new()),
        });
        let thread = if mode == IbMode::HostNoAtomic {
            let (sh, qp, mb, p) = (
                recv.clone(),
                res.qp.clone(),
                res.mailbox.clone(),
                peer.clone(),
            );
            let max_recv = res.max_recv_wr;
            Some(
                std::thread::Builder::new()
                    .name(format!("mscclpp-ib-recv-{t}"))
                    .spawn(move || recv_loop(sh, qp, mb, t, p, max_recv))
                    .map_err(|e| Error::io("spawning the IB receive thread", e))?,
            )
        } else {
            None
        };
        Ok(IbConnection {
            transport: t,
            remote_transport: remote.transport(),
            local_device: local.device(),
            peer,
            mode,
            remote: r,
            send: Mutex::new(SendState {
                next_wr_id: 1,
                in_queue: 0,
                pending: VecDeque::new(),
                run: 0,
                signals_posted: 0,
                signals_done: 0,
                broken: None,
                wcs: Vec::new(),
            }),
            max_send_wr: res.max_send_wr,
            max_wr_per_send: res.max_wr_per_send,
            poll_num: res.poll_num,
            recv,
            thread,
            scratch,
            staging,
            qp: res.qp,
            _mailbox: res.mailbox,
            _ctx: res.ctx,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SendState> {
        self.send.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn broken_err(&self, msg: &str) -> Error {
        Error::io(
            format!("{} connection to {}", self.transport, self.peer),
            std::io::Error::new(std::io::ErrorKind::ConnectionAborted, msg.to_string()),
        )
    }

    /// The first error to report: the send side's sticky one, else the receive thread's.
    fn pending_error(&self, st: &SendState) -> Option<Error> {
        if let Some(b) = &st.broken {
            return Some(self.broken_err(b));
        }
        self.recv.take_error(&self.peer)
    }

    /// Polls the send CQ once, retiring completed WRs; an error completion breaks the
    /// connection.
    fn poll_send(&self, st: &mut SendState) -> Result<usize> {
        st.wcs.clear();
        let mut wcs = std::mem::take(&mut st.wcs);
        let n = self
            .qp
            .send_cq()
            .poll(&mut wcs, self.poll_num)
            .map_err(|e| ibv_err(&format!("{}: polling the send CQ", self.transport), e))?;
        for wc in &wcs {
            if !wc.is_success() {
                if st.broken.is_none() {
                    let hint = if wc.status == ibv::sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                        "; the QP is in the error state (the peer may have died or closed)"
                    } else {
                        ""
                    };
                    st.broken = Some(format!(
                        "work completion error: {} (vendor error {:#x}){hint}",
                        wc.describe(),
                        wc.vendor_err
                    ));
                }
                continue;
            }
            while let Some(&(id, wrs, signal)) = st.pending.front() {
                st.pending.pop_front();
                st.in_queue = st.in_queue.saturating_sub(wrs);
                if signal {
                    st.signals_done += 1;
                }
                if id == wc.wr_id {
                    break;
                }
            }
        }
        st.wcs = wcs;
        Ok(n)
    }

    /// Waits until `cond` holds (polling the send CQ), failing on a broken connection or after
    /// QUEUE_TIMEOUT.
    fn wait_until(
        &self,
        st: &mut std::sync::MutexGuard<'_, SendState>,
        what: &str,
        cond: impl Fn(&SendState) -> bool,
    ) -> Result<()> {
        let start = Instant::now();
        let mut idle = 0;
        loop {
            if let Some(e) = self.pending_error(st) {
                return Err(e);
            }
            if cond(st) {
                return Ok(());
            }
            if self.poll_send(st)? == 0 {
                if start.elapsed() > QUEUE_TIMEOUT {
                    return Err(Error::timeout(
                        format!(
                            "{} connection to {}: waiting for {what} ({} WRs outstanding)",
                            self.transport, self.peer, st.in_queue
                        ),
                        QUEUE_TIMEOUT,
                    ));
                }
                backoff(&mut idle);
            }
        }
    }

    /// Posts `wrs` (their signaled flags already set), after waiting for send-queue room.
    fn post(
        &self,
        st: &mut std::sync::MutexGuard<'_, SendState>,
        wrs: &[SendWr],
        signal_flags: &[bool],
    ) -> Result<()> {
        let need = wrs.len();
        let cap = self.max_send_wr;
        self.wait_until(st, "send queue room", |s| s.in_queue + need <= cap)?;
        self.qp.post_send(wrs).map_err(|e| {
            ibv_err(
                &format!(
                    "{} connection to {}: posting {need} WRs",
                    self.transport, self.peer
                ),
                e,
            )
        })?;
        st.in_queue += need;
        for (w, &is_signal) in wrs.iter().zip(signal_flags) {
            st.run += 1;
            if w.signaled {
                let run = st.run;
                st.pending.push_back((w.wr_id, run, is_signal));
                st.run = 0;
            }
        }
        Ok(())
    }

    fn lkey_of(&self, src: &RegisteredMemory, at: u64, len: u64) -> Result<u32> {
        if let Some(k) = src.ib_lkey(self.transport) {
            return Ok(k);
        }
        find_local(at, len, self.transport)
            .and_then(|m| m.ib_lkey(self.transport))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{}: source {at:#x} (+{len} bytes) is not registered for {} in this process",
                    self.transport, self.transport
                ))
            })
    }

    fn rkey_of(&self, dst: &RegisteredMemory) -> Result<RemoteMr> {
        let blob = dst.transport_info(self.remote_transport).ok_or_else(|| {
            Error::invalid(format!(
                "{}: destination {:#x} carries no {} registration info",
                self.transport,
                dst.original_data_ptr(),
                self.remote_transport
            ))
        })?;
        RemoteMr::decode(blob)
    }
}

impl BaseConnection for IbConnection {
    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &RegisteredMemory,
        src_offset: u64,
        size: u64,
    ) -> Result<()> {
        let remote = self.rkey_of(dst)?;
        let src_addr = src.data() + src_offset;
        let lkey = self.lkey_of(src, src_addr, size)?;
        let dst_addr = dst.original_data_ptr() + dst_offset;
        let mut st = self.lock();
        if let Some(e) = self.pending_error(&st) {
            return Err(e);
        }
        let n = self.max_wr_per_send;
        let mut batch: Vec<SendWr> = Vec::with_capacity(n.min(64));
        let mut done = 0u64;
        while done < size {
            let len = (size - done).min(MAX_CHUNK);
            let last = done + len == size;
            let signaled = last || (st.run + batch.len() + 1).is_multiple_of(n);
            batch.push(SendWr {
                wr_id: st.next_wr_id,
                op: SendOp::Write {
                    remote_addr: dst_addr + done,
                    rkey: remote.rkey,
                },
                local: Some(Sge {
                    addr: src_addr + done,
                    length: len as u32,
                    lkey,
                }),
                signaled,
            });
            st.next_wr_id += 1;
            done += len;
            if batch.len() == n || last {
                let flags = vec![false; batch.len()];
                self.post(&mut st, &batch, &flags)?;
                batch.clear();
            }
        }
        Ok(())
    }

    fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()> {
        let remote = self.rkey_of(dst)?;
        let dst_addr = dst.original_data_ptr() + dst_offset;
        let mut st = self.lock();
        if let Some(e) = self.pending_error(&st) {
            return Err(e);
        }
        let old = src.swap(new_value, Ordering::AcqRel);
        match self.mode {
            IbMode::HostNoAtomic => {
                if new_value < old {
                    src.store(old, Ordering::Release);
                    return Err(Error::invalid(format!(
                        "{} update_and_sync (HostNoAtomic): expected a value >= the previous \
                         {old}, got {new_value}",
                        self.transport
                    )));
                }
                let mut cur = old;
                loop {
                    let next = if new_value - cur > u64::from(u32::MAX) {
                        cur + u64::from(u32::MAX)
                    } else {
                        new_value
                    };
                    self.post_signal(&mut st, dst_addr, remote.rkey, next)?;
                    cur = next;
                    if cur == new_value {
                        break;
                    }
                }
                Ok(())
            }
            _ => {
                let wr = SendWr {
                    wr_id: st.next_wr_id,
                    op: SendOp::FetchAndAdd {
                        remote_addr: dst_addr,
                        rkey: remote.rkey,
                        add: new_value.wrapping_sub(old),
                    },
                    local: Some(Sge {
                        addr: self.scratch.slot_addr(0),
                        length: 8,
                        lkey: self.scratch.mr.lkey(),
                    }),
                    signaled: true,
                };
                st.next_wr_id += 1;
                self.post(&mut st, &[wr], &[false])
            }
        }
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut idle = 0;
        loop {
            {
                let mut st = self.lock();
                if let Some(e) = self.pending_error(&st) {
                    return Err(e);
                }
                if st.in_queue == 0 {
                    return Ok(());
                }
                let got = self.poll_send(&mut st)?;
                if let Some(e) = self.pending_error(&st) {
                    return Err(e);
                }
                if st.in_queue == 0 {
                    return Ok(());
                }
                if got > 0 {
                    idle = 0;
                    continue;
                }
                if start.elapsed() > timeout {
                    return Err(Error::timeout(
                        format!(
                            "flushing {} connection to {}: {} work requests still outstanding",
                            self.transport, self.peer, st.in_queue
                        ),
                        timeout,
                    ));
                }
            }
            backoff(&mut idle);
        }
    }

    fn transport(&self) -> Transport {
        self.transport
    }
    fn remote_transport(&self) -> Transport {
        self.remote_transport
    }
    fn local_device(&self) -> Device {
        self.local_device
    }
}

impl IbConnection {
    /// One HostNoAtomic signal: the destination address into the peer's mailbox slot, then a
    /// 0-byte write-with-immediate carrying the low 32 bits of `value`.
    fn post_signal(
        &self,
        st: &mut std::sync::MutexGuard<'_, SendState>,
        dst_addr: u64,
        rkey: u32,
        value: u64,
    ) -> Result<()> {
        let slots = STAGING_SLOTS as u64;
        self.wait_until(st, "a free staging slot", |s| {
            s.signals_posted - s.signals_done < slots
        })?;
        let n = st.signals_posted;
        let stage = (n % slots) as usize;
        self.staging.buf[stage].store(dst_addr, Ordering::Release);
        let mbox_slot = n % u64::from(self.remote.mailbox_slots);
        let wrs = [
            SendWr {
                wr_id: st.next_wr_id,
                op: SendOp::Write {
                    remote_addr: self.remote.mailbox_addr + mbox_slot * 8,
                    rkey: self.remote.mailbox_rkey,
                },
                local: Some(Sge {
                    addr: self.staging.slot_addr(stage),
                    length: 8,
                    lkey: self.staging.mr.lkey(),
                }),
                signaled: false,
            },
            SendWr {
                wr_id: st.next_wr_id + 1,
                op: SendOp::WriteWithImm {
                    remote_addr: dst_addr,
                    rkey,
                    imm: value as u32,
                },
                local: None,
                signaled: true,
            },
        ];
        st.next_wr_id += 2;
        self.post(st, &wrs, &[false, true])?;
        st.signals_posted += 1;
        Ok(())
    }
}

/// Where forwarded values go: a host store, a GDRCopy mapping, or a GPU copy.
struct Forwarder {
    transport: Transport,
    peer: String,
    prev: HashMap<u64, u64>,
    gdr: Option<Option<mscclpp_hal::gdr::Gdr>>,
    /// Mappings first in each tuple: a mapping is dropped before the memory it maps.
    maps: HashMap<u64, (mscclpp_hal::gdr::GdrMapping, RegisteredMemory)>,
}

impl Forwarder {
    fn forward(&mut self, addr: u64, imm: u32) -> std::result::Result<(), String> {
        if addr & 7 != 0 {
            return Err(format!(
                "peer {} signalled the unaligned address {addr:#x}",
                self.peer
            ));
        }
        let mem = find_local(addr, 8, self.transport).ok_or_else(|| {
            format!(
                "peer {} signalled {addr:#x}, which is not inside a live local memory registered \
                 for {}",
                self.peer, self.transport
            )
        })?;
        let device = mem.device();
        let host = host_addressable(device);
        let prev = match self.prev.get(&addr) {
            Some(&p) => p,
            None if host => {
                // SAFETY: `addr` is 8 aligned bytes of a live registered host memory (kept alive
                // by `mem`); tokens are only accessed atomically.
                unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) }.load(Ordering::Acquire)
            }
            None => 0,
        };
        let step = imm.wrapping_sub(prev as u32);
        let value = prev.wrapping_add(u64::from(step));
        self.prev.insert(addr, value);
        if host {
            // SAFETY: as above.
            unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) }
                .store(value, Ordering::Release);
            return Ok(());
        }
        let gdr = self.gdr.get_or_insert_with(|| {
            if crate::env::env().force_disable_gdr().unwrap_or(false) {
                None
            } else {
                mscclpp_hal::gdr::Gdr::open().ok().flatten()
            }
        });
        if let Some(g) = gdr {
            if let std::collections::hash_map::Entry::Vacant(slot) = self.maps.entry(addr) {
                // SAFETY: `addr..addr+8` lies in a live device allocation kept alive by `mem`,
                // which is stored next to the mapping and dropped after it.
                match unsafe { g.map(addr, 8) } {
                    Ok(m) => {
                        slot.insert((m, mem.clone()));
                    }
                    Err(e) => {
                        crate::log_warn!("NET", "GDRCopy map of {addr:#x} failed ({e}); copying");
                    }
                }
            }
            if let Some((m, _)) = self.maps.get(&addr) {
                return m
                    .store_u64(0, value)
                    .map_err(|e| format!("GDRCopy store to {addr:#x}: {e}"));
            }
        }
        // SAFETY: `addr..addr+8` is live memory of `device` (kept alive by `mem`).
        unsafe { crate::memory::write_to(device, addr, &value.to_le_bytes()) }
            .map_err(|e| format!("forwarding to GPU token {addr:#x}: {e}"))
    }
}

fn recv_loop(
    sh: Arc<RecvShared>,
    qp: Arc<QueuePair>,
    mailbox: Arc<HostRing>,
    transport: Transport,
    peer: String,
    _max_recv: usize,
) {
    let fatal = |msg: String| {
        *sh.fatal.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg);
    };
    let slots = mailbox.buf.len() as u64;
    let mut fw = Forwarder {
        transport,
        peer: peer.clone(),
        prev: HashMap::new(),
        gdr: None,
        maps: HashMap::new(),
    };
    let mut count: u64 = 0;
    let mut wcs = Vec::new();
    let mut idle = 0;
    loop {
        if sh.closing.load(Ordering::Acquire) {
            return;
        }
        wcs.clear();
        match qp.recv_cq().poll(&mut wcs, 16) {
            Err(e) => return fatal(format!("polling the receive CQ: {e}")),
            Ok(0) => {
                backoff(&mut idle);
                continue;
            }
            Ok(_) => idle = 0,
        }
        for wc in &wcs {
            if !wc.is_success() {
                if !sh.closing.load(Ordering::Acquire) {
                    fatal(format!(
                        "receive completion from {peer}: {} (vendor error {:#x})",
                        wc.describe(),
                        wc.vendor_err
                    ));
                }
                return;
            }
            let Some(imm) = wc.imm_data else {
                return fatal(format!(
                    "receive completion from {peer}: expected immediate data, got none ({})",
                    wc.describe()
                ));
            };
            let addr = mailbox.buf[(count % slots) as usize].load(Ordering::Acquire);
            count += 1;
            if let Err(msg) = fw.forward(addr, imm) {
                sh.reported
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(msg);
            }
            if let Err(e) = qp.post_recv(&[RecvWr {
                wr_id: count,
                local: None,
            }]) {
                return fatal(format!("reposting a receive: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> QpInfo {
        QpInfo {
            port: 1,
            lid: 0,
            gid: Gid([7; 16]),
            qpn: 0x1234,
            psn: 0x55,
            mtu: 5,
            link_layer: 2,
            mode: IbMode::HostNoAtomic,
            mailbox_addr: 0x1000,
            mailbox_rkey: 9,
            mailbox_slots: 32,
        }
    }

    #[test]
    fn qp_info_round_trips_and_rejects_malformed() {
        let i = info();
        let b = i.encode();
        assert_eq!(QpInfo::decode(&b).unwrap(), i);
        assert!(QpInfo::decode(&b[..b.len() - 1]).is_err());
        let mut bad = i;
        bad.qpn = 0x0100_0000;
        assert!(QpInfo::decode(&bad.encode()).is_err());
        bad = i;
        bad.mtu = 9;
        assert!(QpInfo::decode(&bad.encode()).is_err());
        bad = i;
        bad.port = 0;
        assert!(QpInfo::decode(&bad.encode()).is_err());
    }

    #[test]
    fn wrap_around_rebuild_is_exact() {
        // prev + ((imm - low32(prev)) mod 2^32), as the receive thread computes it.
        let rebuild =
            |prev: u64, imm: u32| prev.wrapping_add(u64::from(imm.wrapping_sub(prev as u32)));
        let mut prev = 0u64;
        for k in 1..10u64 {
            let v = k * ((1 << 31) - 1);
            prev = rebuild(prev, v as u32);
            assert_eq!(prev, v);
        }
        assert_eq!(rebuild(u32::MAX as u64, 3), (1u64 << 32) + 3);
    }
}
