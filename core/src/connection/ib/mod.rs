//! The InfiniBand connection: one reliable-connected queue pair per connection.
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
//!
//! # Peer liveness
//! A side that only waits for the peer's signals posts nothing, so its QP would never learn
//! that the peer died. [`BaseConnection::health`] (polled by waits) therefore retires send
//! completions, polls the receive CQ in Host mode (where no receive thread does; a responder
//! QP that went to the error state flushes the posted receives there) and, at most every
//! [`PROBE_INTERVAL`] while nothing is outstanding, posts a signaled 0-byte RDMA write (a
//! probe; it needs no remote key): a dead peer makes it complete with a retry error, which
//! breaks the connection. [`BaseConnection::abort`] breaks it from outside: waits for
//! send-queue room or completions return at once.

mod forwarder;
mod liveness;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_hal::ibv::{
    self, AccessFlags, QueuePair, RtrParams, RtsParams, SendOp, SendWr, Sge, WorkCompletion,
};

use self::forwarder::{recv_loop, RecvShared};
use super::BaseConnection;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::ib::mr::RemoteMr;
use crate::ib::qp::{HostRing, IbQp, QpInfo};
use crate::ib::{ibv_err, IbCtx, CQ_BACKOFF};
use crate::registered_memory::{find_local, RegisteredMemory};
use crate::transport::{Device, IbMode, Transport};

use super::Peer;

/// How often `health` may post a liveness probe while the connection is idle.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// Largest RDMA write one work request carries.
const MAX_CHUNK: u64 = 1 << 30;
/// How long an operation waits for send-queue room before the peer counts as stuck.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(60);
/// Staging slots for HostNoAtomic destination addresses on the sending side.
const STAGING_SLOTS: usize = 256;

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
    /// When `health` last posted a probe.
    last_probe: Option<Instant>,
}

pub(crate) struct IbConnection {
    transport: Transport,
    remote_transport: Transport,
    local_device: Device,
    peer: String,
    rank: Option<usize>,
    /// Set by `abort`, outside the send lock (an operation may hold it while it waits).
    aborted: Mutex<Option<String>>,
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

impl IbConnection {
    /// Connects the QP of `local` (taken from it) to the peer's endpoint `remote` (of rank
    /// `rank` when known: errors then name it).
    pub(crate) fn connect(
        local: &Endpoint,
        remote: &Endpoint,
        res: IbQp,
        rank: Option<usize>,
    ) -> Result<IbConnection> {
        let t = local.transport();
        let r = QpInfo::decode(remote.transport_payload())?;
        let peer = Peer {
            rank,
            addr: format!(
                "{} QP {:#x} at {}",
                remote.transport(),
                r.qpn,
                r.gid
                    .ipv4()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| format!("{:02x?}", r.gid.0))
            ),
        }
        .to_string();
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
            rank,
            aborted: Mutex::new(None),
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
                last_probe: None,
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
        match self.rank {
            Some(r) => Error::remote(
                r,
                format!("{} connection ({}): {msg}", self.transport, self.peer),
            ),
            None => Error::io(
                format!("{} connection to {}", self.transport, self.peer),
                std::io::Error::new(std::io::ErrorKind::ConnectionAborted, msg.to_string()),
            ),
        }
    }

    fn aborted(&self) -> Option<String> {
        self.aborted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The first error to report: an abort, the send side's sticky one, else the receive
    /// thread's.
    fn pending_error(&self, st: &SendState) -> Option<Error> {
        if let Some(a) = self.aborted() {
            return Some(self.broken_err(&a));
        }
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
        let mut backoff = CQ_BACKOFF;
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
                backoff.snooze();
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
        let mut backoff = CQ_BACKOFF;
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
                    backoff.reset();
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
            backoff.snooze();
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

    fn health(&self) -> Result<()> {
        self.check_health()
    }

    fn abort(&self, reason: &str) {
        let mut a = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        if a.is_none() {
            *a = Some(format!("aborted: {reason}"));
        }
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
