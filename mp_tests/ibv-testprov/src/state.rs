//! The provider's objects behind the C structs: contexts (with their TCP listener), memory
//! regions, completion queues and RC queue pairs with their state machine and transport.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ibverbs_sys::{ibv_qp_state as qps, ibv_wc_opcode as wco, ibv_wc_status as wcs};

use crate::wire::{self, Request, Response};

mod requester;
mod responder;

use responder::accept_loop;

/// Linux errno `EINVAL` (invalid argument), an error code of the provider's verbs entry points.
pub const EINVAL: i32 = 22;
/// Linux errno `ENOMEM` (out of memory), an error code of the provider's verbs entry points.
pub const ENOMEM: i32 = 12;
/// Linux errno `EBUSY` (resource busy), an error code of the provider's verbs entry points.
pub const EBUSY: i32 = 16;
/// Linux errno `EOPNOTSUPP` (operation not supported), an error code of the provider's verbs entry points.
pub const EOPNOTSUPP: i32 = 95;

/// Access bits (`ibv_access_flags`).
/// `IBV_ACCESS_LOCAL_WRITE`.
pub const ACCESS_LOCAL_WRITE: u32 = 1;
/// `IBV_ACCESS_REMOTE_WRITE`.
pub const ACCESS_REMOTE_WRITE: u32 = 2;
/// `IBV_ACCESS_REMOTE_ATOMIC`.
pub const ACCESS_REMOTE_ATOMIC: u32 = 8;

/// How long a connect / hello exchange may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A send that cannot make progress for this long fails the connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Payload chunk copied under one lock of the MR table.
const CHUNK: usize = 1 << 20;

/// Locks a mutex, ignoring poisoning (a panicking thread cannot leave our data half-updated in a
/// way that matters more than aborting would; and we must never panic across the C ABI).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Mirror of `struct ibv_wc` (the ibverbs-sys type keeps its fields private); the layout is
/// checked against it at compile time in `lib.rs`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawWc {
    /// `ibv_wc.wr_id`: id of the completed work request.
    pub wr_id: u64,
    /// `ibv_wc.status`: an `ibv_wc_status` (0 success).
    pub status: u32,
    /// `ibv_wc.opcode`: an `ibv_wc_opcode`.
    pub opcode: u32,
    /// `ibv_wc.vendor_err`: vendor error syndrome.
    pub vendor_err: u32,
    /// `ibv_wc.byte_len`: bytes transferred.
    pub byte_len: u32,
    /// `ibv_wc.imm_data`: immediate data, in network order.
    pub imm_data: u32,
    /// `ibv_wc.qp_num`: the local QP number.
    pub qp_num: u32,
    /// `ibv_wc.src_qp`: the remote QP number (UD only).
    pub src_qp: u32,
    /// `ibv_wc.wc_flags`: `IBV_WC_*` flags (e.g. `IBV_WC_WITH_IMM`).
    pub wc_flags: u32,
    /// `ibv_wc.pkey_index`: P_Key index (UD only).
    pub pkey_index: u16,
    /// `ibv_wc.slid`: source LID (UD only).
    pub slid: u16,
    /// `ibv_wc.sl`: service level (UD only).
    pub sl: u8,
    /// `ibv_wc.dlid_path_bits`: destination LID path bits (UD only).
    pub dlid_path_bits: u8,
}

/// Configuration read from the environment when a device is opened.
#[derive(Debug, Clone)]
pub struct Config {
    /// The address the device's TCP listener binds and its GID encodes (`IBV_TESTPROV_ADDR`,
    /// default 127.0.0.1).
    pub addr: Ipv4Addr,
    /// The device reports no atomics (`IBV_TESTPROV_NO_ATOMICS=1`), as some NICs do.
    pub no_atomics: bool,
    /// How long a write with immediate waits for a posted receive before failing with the RNR retry
    /// error (`IBV_TESTPROV_RNR_TIMEOUT_MS`, default 10 s).
    pub rnr_timeout: Duration,
}

impl Config {
    /// Reads the `IBV_TESTPROV_*` variables; an unparsable value is an error naming it.
    pub fn from_env() -> Result<Config, String> {
        let addr = match std::env::var("IBV_TESTPROV_ADDR") {
            Ok(s) => s.trim().parse::<Ipv4Addr>().map_err(|e| {
                format!("IBV_TESTPROV_ADDR: expected an IPv4 address, got `{s}` ({e})")
            })?,
            Err(_) => Ipv4Addr::LOCALHOST,
        };
        let no_atomics = matches!(
            std::env::var("IBV_TESTPROV_NO_ATOMICS").as_deref(),
            Ok("1") | Ok("true") | Ok("yes")
        );
        let rnr_ms = match std::env::var("IBV_TESTPROV_RNR_TIMEOUT_MS") {
            Ok(s) => s.trim().parse::<u64>().map_err(|e| {
                format!("IBV_TESTPROV_RNR_TIMEOUT_MS: expected milliseconds, got `{s}` ({e})")
            })?,
            Err(_) => 10_000,
        };
        Ok(Config {
            addr,
            no_atomics,
            rnr_timeout: Duration::from_millis(rnr_ms),
        })
    }
}

/// A registered region as the context's table sees it.
#[derive(Debug, Clone, Copy)]
pub struct MrInfo {
    /// The address the region is registered at (what work requests name: the iova).
    pub addr: usize,
    /// Where this process reaches `addr`: `addr` itself for `ibv_reg_mr`, the provider's own
    /// mapping of the fd for `ibv_reg_dmabuf_mr`.
    pub host: usize,
    /// Its length in bytes.
    pub len: usize,
    /// The `ibv_access_flags` it was registered with.
    pub access: u32,
    /// The handle of its protection domain.
    pub pd: u32,
}

impl MrInfo {
    fn contains(&self, addr: u64, len: u64) -> bool {
        let start = self.addr as u64;
        let end = start + self.len as u64;
        addr >= start && addr.checked_add(len).is_some_and(|e| e <= end)
    }

    /// The pointer this process uses for `addr` (which `MrInfo::contains` accepted).
    pub fn host_addr(&self, addr: u64) -> usize {
        self.host + (addr - self.addr as u64) as usize
    }
}

/// Max QPs per context: the QP index is the low 8 bits of the QP number.
pub const MAX_QP: usize = 256;

/// One open device.
pub struct CtxShared {
    /// The device name (`testprov0`, ...).
    pub name: String,
    /// The address of its TCP listener (from the configuration).
    pub addr: Ipv4Addr,
    /// The port of its TCP listener, where peers' requesters connect to this device's QPs.
    pub port: u16,
    /// What the environment said when it was opened.
    pub config: Config,
    /// Keyed by the key (lkey == rkey).
    pub mrs: RwLock<HashMap<u32, MrInfo>>,
    /// The QPs by index (the low 8 bits of the QP number); `None` for a free slot.
    pub qps: Mutex<Vec<Option<Arc<QpShared>>>>,
    /// Set by [`CtxShared::close`]: the accept thread stops.
    pub shutdown: AtomicBool,
    /// The thread accepting peers' connections, joined by [`CtxShared::close`].
    pub accept_thread: Mutex<Option<JoinHandle<()>>>,
}

static NEXT_KEY: AtomicU32 = AtomicU32::new(0);
static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

/// A fresh object handle (PDs, MRs, CQs, QPs).
pub fn next_handle() -> u32 {
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed)
}

/// A fresh memory key: a counter in the high bits and a per-process salt in the low byte, so
/// stale or foreign keys rarely collide.
pub fn next_key() -> u32 {
    let n = NEXT_KEY.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
    let salt = (std::process::id() as u32).wrapping_mul(2_654_435_761) >> 24;
    (n << 8) | (salt & 0xff)
}

impl CtxShared {
    /// Binds the listener and starts the accept thread.
    pub fn open(name: String, config: Config) -> Result<Arc<CtxShared>, String> {
        let listener = TcpListener::bind(SocketAddrV4::new(config.addr, 0))
            .map_err(|e| format!("binding a TCP listener on {}: {e}", config.addr))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("local address of the listener: {e}"))?
            .port();
        let ctx = Arc::new(CtxShared {
            name,
            addr: config.addr,
            port,
            config,
            mrs: RwLock::new(HashMap::new()),
            qps: Mutex::new(vec![None; MAX_QP]),
            shutdown: AtomicBool::new(false),
            accept_thread: Mutex::new(None),
        });
        let c2 = ctx.clone();
        let handle = std::thread::Builder::new()
            .name(format!("testprov-accept-{port}"))
            .spawn(move || accept_loop(c2, listener))
            .map_err(|e| format!("spawning the accept thread: {e}"))?;
        *lock(&ctx.accept_thread) = Some(handle);
        Ok(ctx)
    }

    /// Stops the accept thread (wakes it with a connection to itself) and joins it.
    pub fn close(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(
            &SocketAddrV4::new(self.addr, self.port).into(),
            CONNECT_TIMEOUT,
        );
        if let Some(h) = lock(&self.accept_thread).take() {
            let _ = h.join();
        }
    }

    /// The region registered under `key`, if any.
    pub fn mr_lookup(&self, key: u32) -> Option<MrInfo> {
        self.mrs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied()
    }
}

/// A completion queue.
pub struct CqShared {
    /// Completions not yet polled, oldest first.
    pub entries: Mutex<VecDeque<RawWc>>,
    /// How many QPs use it (a CQ in use cannot be destroyed: `EBUSY`).
    pub users: AtomicUsize,
}

impl CqShared {
    /// Queues one completion.
    pub fn push(&self, wc: RawWc) {
        lock(&self.entries).push_back(wc);
    }
}

/// A send work request waiting for its response.
#[derive(Debug, Clone, Copy)]
struct Pending {
    wr_id: u64,
    signaled: bool,
    opcode: u32,
    byte_len: u32,
    /// Where a fetch-and-add's old value goes: (address, lkey).
    result_at: Option<(u64, u32)>,
}

/// A posted receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvEntry {
    /// The caller's id, reported in the completion that consumes it.
    pub wr_id: u64,
}

/// QP attributes and the receive queue, under one lock.
pub struct QpInner {
    /// `ibv_qp_state` (RESET, INIT, RTR, RTS, ERR).
    pub state: u32,
    /// The port number given at INIT.
    pub port: u8,
    /// The remote access flags given at INIT (what peers may do to this QP's regions).
    pub access: u32,
    /// The path MTU given at RTR (reported back by query, not used for framing).
    pub path_mtu: u32,
    /// The peer's QP number, given at RTR.
    pub dest_qpn: u32,
    /// The peer device's TCP listener, decoded from the GID given at RTR.
    pub remote: Option<SocketAddrV4>,
    /// The GID given at RTR, as given.
    pub dgid: [u8; 16],
    /// The local ACK timeout given at RTS (reported back by query).
    pub timeout: u8,
    /// The retry count given at RTS (reported back by query).
    pub retry_cnt: u8,
    /// The RNR retry count given at RTS (reported back by query).
    pub rnr_retry: u8,
    /// Posted receives, consumed in order by incoming writes with immediate.
    pub recvs: VecDeque<RecvEntry>,
}

/// The send side: the connection to the peer's responder and the in-flight requests.
struct SendSide {
    stream: Option<TcpStream>,
    generation: u64,
    pending: VecDeque<Pending>,
    /// Why there is no usable connection (connect failed, peer said bye).
    broken: Option<String>,
}

/// Capacities fixed at creation.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    /// Most send requests in flight.
    pub max_send_wr: u32,
    /// Most receives posted.
    pub max_recv_wr: u32,
    /// Most scatter/gather entries per send.
    pub max_send_sge: u32,
    /// Most scatter/gather entries per receive.
    pub max_recv_sge: u32,
}

/// An RC queue pair.
pub struct QpShared {
    /// The device it was created on.
    pub ctx: Arc<CtxShared>,
    /// Its QP number.
    pub qpn: u32,
    /// Its slot in the device's QP table.
    pub index: usize,
    /// The handle of its protection domain.
    pub pd: u32,
    /// Capacities fixed at creation.
    pub caps: QpCaps,
    /// Every send completes with a completion (`sq_sig_all`), not only signaled ones.
    pub sq_sig_all: bool,
    /// Where send completions go.
    pub send_cq: Arc<CqShared>,
    /// Where receive completions go.
    pub recv_cq: Arc<CqShared>,
    /// Attributes and posted receives.
    pub inner: Mutex<QpInner>,
    /// Notified when `inner` changes (a receive posted, a state change), for responders
    /// waiting on a receive.
    pub cond: Condvar,
    send: Mutex<SendSide>,
    /// Set by [`QpShared::destroy`]: its threads stop.
    pub destroyed: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    responder_streams: Mutex<Vec<TcpStream>>,
}

/// A send work request as the C layer decoded it.
#[derive(Debug, Clone)]
pub enum SendKind {
    /// RDMA write (with immediate when `imm` is set, which consumes a receive at the peer).
    Write {
        /// The peer region's key.
        rkey: u32,
        /// Where in the peer region.
        addr: u64,
        /// The immediate value.
        imm: Option<u32>,
    },
    /// 64-bit fetch-and-add on the peer; the old value lands in the one SGE.
    FetchAdd {
        /// The peer region's key.
        rkey: u32,
        /// The 8-byte aligned address in the peer region.
        addr: u64,
        /// What to add.
        add: u64,
    },
}

/// One send work request.
#[derive(Debug, Clone)]
pub struct SendReq {
    /// The caller's id, reported in its completion.
    pub wr_id: u64,
    /// Whether it completes with a completion (or `sq_sig_all`).
    pub signaled: bool,
    /// What it does at the peer.
    pub kind: SendKind,
    /// (addr, length, lkey) of each SGE.
    pub sges: Vec<(u64, u32, u32)>,
}

fn wc(wr_id: u64, status: u32, opcode: u32, byte_len: u32, qpn: u32) -> RawWc {
    RawWc {
        wr_id,
        status,
        opcode,
        byte_len,
        qp_num: qpn,
        ..RawWc::default()
    }
}

impl QpShared {
    /// A QP in RESET with no connection yet.
    #[allow(clippy::too_many_arguments)] // the attributes of ibv_create_qp, one each
    pub fn new(
        ctx: Arc<CtxShared>,
        index: usize,
        pd: u32,
        caps: QpCaps,
        sq_sig_all: bool,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
    ) -> QpShared {
        let qpn = ((ctx.port as u32) << 8) | index as u32;
        QpShared {
            ctx,
            qpn,
            index,
            pd,
            caps,
            sq_sig_all,
            send_cq,
            recv_cq,
            inner: Mutex::new(QpInner {
                state: qps::IBV_QPS_RESET,
                port: 1,
                access: 0,
                path_mtu: 5,
                dest_qpn: 0,
                remote: None,
                dgid: [0; 16],
                timeout: 0,
                retry_cnt: 0,
                rnr_retry: 0,
                recvs: VecDeque::new(),
            }),
            cond: Condvar::new(),
            send: Mutex::new(SendSide {
                stream: None,
                generation: 0,
                pending: VecDeque::new(),
                broken: None,
            }),
            destroyed: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            responder_streams: Mutex::new(Vec::new()),
        }
    }

    /// Its `ibv_qp_state`.
    pub fn state(&self) -> u32 {
        lock(&self.inner).state
    }

    /// Moves to ERR: the failing request (if any) completes with `first`, every other pending
    /// send and every posted receive is flushed, the connection is closed. Caller holds `send`.
    fn enter_error(&self, send: &mut SendSide, first: Option<u32>) {
        // The state changes before any completion is visible, so a caller that polled an error
        // completion always finds the QP in ERR.
        let flushed_recvs: Vec<RecvEntry> = {
            let mut inner = lock(&self.inner);
            inner.state = qps::IBV_QPS_ERR;
            inner.recvs.drain(..).collect()
        };
        self.cond.notify_all();
        if let Some(s) = send.stream.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        send.generation += 1;
        if let Some(status) = first {
            if let Some(p) = send.pending.pop_front() {
                self.send_cq
                    .push(wc(p.wr_id, status, p.opcode, 0, self.qpn));
            }
        }
        while let Some(p) = send.pending.pop_front() {
            self.send_cq
                .push(wc(p.wr_id, wcs::IBV_WC_WR_FLUSH_ERR, p.opcode, 0, self.qpn));
        }
        for r in flushed_recvs {
            self.recv_cq.push(wc(
                r.wr_id,
                wcs::IBV_WC_WR_FLUSH_ERR,
                wco::IBV_WC_RECV,
                0,
                self.qpn,
            ));
        }
    }

    /// Public entry to the ERR transition (modify_qp to ERR, responder saw the peer vanish).
    pub fn to_error(&self) {
        let mut send = lock(&self.send);
        self.enter_error(&mut send, None);
    }

    /// Closes connections cleanly (bye to the peer) and forgets all work (RESET / destroy).
    pub fn reset(&self) {
        let mut send = lock(&self.send);
        if let Some(mut s) = send.stream.take() {
            let _ = s.write_all(&wire::encode_request(&Request::Bye));
            let _ = s.shutdown(Shutdown::Both);
        }
        send.generation += 1;
        send.pending.clear();
        send.broken = None;
        drop(send);
        for mut s in lock(&self.responder_streams).drain(..) {
            let _ = s.write_all(&wire::encode_response(&Response::Bye));
            let _ = s.shutdown(Shutdown::Both);
        }
        let mut inner = lock(&self.inner);
        inner.state = qps::IBV_QPS_RESET;
        inner.recvs.clear();
        inner.remote = None;
        drop(inner);
        self.cond.notify_all();
    }

    /// Destroys: closes everything and joins the service threads of this QP.
    pub fn destroy(&self) {
        self.destroyed.store(true, Ordering::SeqCst);
        self.reset();
        let threads: Vec<_> = lock(&self.threads).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }

    /// Validates and copies the local SGEs (at post time, as the data is "on the wire" from
    /// now on). Returns the payload or a local error status.
    fn gather(&self, sges: &[(u64, u32, u32)]) -> Result<Vec<u8>, u32> {
        let total: u64 = sges.iter().map(|s| s.1 as u64).sum();
        if total > wire::MAX_MSG as u64 {
            return Err(wcs::IBV_WC_LOC_LEN_ERR);
        }
        let mut out = Vec::with_capacity(total as usize);
        let mrs = self.ctx.mrs.read().unwrap_or_else(|e| e.into_inner());
        for &(addr, len, lkey) in sges {
            if len == 0 {
                continue;
            }
            match mrs.get(&lkey) {
                Some(mr) if mr.pd == self.pd && mr.contains(addr, len as u64) => {
                    // SAFETY: the range lies inside a registered region, alive while registered
                    // (dereg waits for our read lock).
                    let src = unsafe {
                        std::slice::from_raw_parts(mr.host_addr(addr) as *const u8, len as usize)
                    };
                    out.extend_from_slice(src);
                }
                _ => return Err(wcs::IBV_WC_LOC_PROT_ERR),
            }
        }
        Ok(out)
    }

    /// Posts one send request. `Err(errno)` rejects it (nothing posted).
    pub fn post_send(&self, req: SendReq) -> Result<(), i32> {
        let mut send = lock(&self.send);
        let state = self.state();
        let opcode = match req.kind {
            SendKind::Write { imm: None, .. } => wco::IBV_WC_RDMA_WRITE,
            SendKind::Write { imm: Some(_), .. } => wco::IBV_WC_RDMA_WRITE,
            SendKind::FetchAdd { .. } => wco::IBV_WC_FETCH_ADD,
        };
        if state == qps::IBV_QPS_ERR {
            self.send_cq
                .push(wc(req.wr_id, wcs::IBV_WC_WR_FLUSH_ERR, opcode, 0, self.qpn));
            return Ok(());
        }
        if state != qps::IBV_QPS_RTS {
            return Err(EINVAL);
        }
        if req.sges.len() > self.caps.max_send_sge as usize {
            return Err(EINVAL);
        }
        if send.pending.len() >= self.caps.max_send_wr as usize {
            return Err(ENOMEM);
        }
        let signaled = req.signaled || self.sq_sig_all;
        let mut pending = Pending {
            wr_id: req.wr_id,
            signaled,
            opcode,
            byte_len: 0,
            result_at: None,
        };
        let (header, payload) = match req.kind {
            SendKind::Write { rkey, addr, imm } => match self.gather(&req.sges) {
                Ok(data) => {
                    pending.byte_len = data.len() as u32;
                    let h = Request::Write {
                        rkey,
                        addr,
                        len: data.len() as u32,
                        imm,
                    };
                    (h, data)
                }
                Err(status) => {
                    send.pending.push_back(pending);
                    self.enter_error(&mut send, Some(status));
                    return Ok(());
                }
            },
            SendKind::FetchAdd { rkey, addr, add } => {
                if self.ctx.config.no_atomics {
                    return Err(EOPNOTSUPP);
                }
                let ok = req.sges.len() == 1 && req.sges[0].1 == 8;
                if !ok {
                    send.pending.push_back(pending);
                    self.enter_error(&mut send, Some(wcs::IBV_WC_LOC_LEN_ERR));
                    return Ok(());
                }
                pending.byte_len = 8;
                pending.result_at = Some((req.sges[0].0, req.sges[0].2));
                (Request::FetchAdd { rkey, addr, add }, Vec::new())
            }
        };
        send.pending.push_back(pending);
        if send.stream.is_none() {
            self.enter_error(&mut send, Some(wcs::IBV_WC_RETRY_EXC_ERR));
            return Ok(());
        }
        let written = match send.stream.as_mut() {
            Some(s) => s
                .write_all(&wire::encode_request(&header))
                .and_then(|_| s.write_all(&payload)),
            None => Ok(()),
        };
        if let Err(e) = written {
            send.broken = Some(format!("sending to the peer: {e}"));
            self.enter_error(&mut send, Some(wcs::IBV_WC_RETRY_EXC_ERR));
        }
        Ok(())
    }

    /// Posts one receive. `Err(errno)` rejects it.
    pub fn post_recv(&self, wr_id: u64, nsge: usize) -> Result<(), i32> {
        let mut inner = lock(&self.inner);
        match inner.state {
            qps::IBV_QPS_RESET => Err(EINVAL),
            qps::IBV_QPS_ERR => {
                self.recv_cq.push(wc(
                    wr_id,
                    wcs::IBV_WC_WR_FLUSH_ERR,
                    wco::IBV_WC_RECV,
                    0,
                    self.qpn,
                ));
                Ok(())
            }
            _ if nsge > self.caps.max_recv_sge as usize => Err(EINVAL),
            _ if inner.recvs.len() >= self.caps.max_recv_wr as usize => Err(ENOMEM),
            _ => {
                inner.recvs.push_back(RecvEntry { wr_id });
                drop(inner);
                self.cond.notify_all();
                Ok(())
            }
        }
    }
}
