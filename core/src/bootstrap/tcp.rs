//! `TcpBootstrap`: the built-in [`Bootstrap`] over TCP.
//!
//! Setup (`initialize`), all bounded by one deadline:
//! 1. Rank 0 runs the root on the root address (the socket reserved by
//!    [`TcpBootstrap::create_unique_id`] when the id was made in this process, else a fresh
//!    bind with EADDRINUSE retries).
//! 2. Every rank binds a listener for its peers, connects to the root (retrying refusals until
//!    the deadline) and sends a hello: rank, nranks, group nonce, host hash, listen address.
//! 3. When all `nranks` hellos are in, the root closes its listener and answers each rank with
//!    the table of addresses and host hashes plus a fresh session number; if some rank never
//!    comes, it answers everyone with an abort naming the missing ranks.
//! 4. Ranks build a full mesh: each connects to every lower rank and accepts every higher one,
//!    then closes its listener. A receive thread per connection reads `(kind, tag, len,
//!    payload)` frames into a mailbox keyed by `(peer, kind, tag)`; kind 0 is user traffic,
//!    kind 1 the collectives, so collectives never steal a user's tag.
//!
//! A peer that closes its connection makes receives from it fail promptly with
//! [`Error::Remote`]; every receive waits at most the timeout given to `initialize` (or the one
//! passed to [`TcpBootstrap::recv_timeout`]).

use super::netif::{
    choose_interface, interface_index, list_interfaces, select_interface, Interface,
};
use super::socket::{
    bind_listener, cancelled, connect_retry, read_exact_by, write_all_by, Backoff, Cancel,
    Deadline, ReadFail,
};
use super::unique_id::{decode_addr, encode_addr, UniqueId, ADDR_BYTES};
use super::{check_group, host_hash, Bootstrap};
use crate::env::SocketFamily;
use crate::error::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read};
use std::net::{IpAddr, Shutdown, SocketAddr, SocketAddrV6, TcpListener, TcpStream};
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Where to find the bootstrap root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitAddr {
    /// A [`UniqueId`] from [`TcpBootstrap::create_unique_id`].
    Id(UniqueId),
    /// `"ip:port"` (`ifname: None`) or `"ifname:ip:port"`: the root listens on `addr`; with an
    /// interface name, this rank's peer sockets use that interface's address.
    Addr {
        /// Interface for this rank's own sockets.
        ifname: Option<String>,
        /// The root's address.
        addr: SocketAddr,
    },
}

impl InitAddr {
    /// Parses `"ip:port"`, `"[ipv6]:port"`, `"ifname:ip:port"` or `"ifname:[ipv6]:port"`.
    pub fn parse(s: &str) -> Result<InitAddr> {
        let s = s.trim();
        let bad = || {
            Error::invalid(format!(
                "bootstrap address {s:?}: expected \"ip:port\" or \"ifname:ip:port\" \
                 (IPv6 as [addr]), with a non-zero port"
            ))
        };
        let (ifname, addr) = match SocketAddr::from_str(s) {
            Ok(a) => (None, a),
            Err(_) => {
                let (name, rest) = s.split_once(':').ok_or_else(bad)?;
                if name.is_empty() || name.contains('[') {
                    return Err(bad());
                }
                let addr = match SocketAddr::from_str(rest) {
                    Ok(a) => a,
                    Err(_) => {
                        // "ifname:fe80::1:5000": the last colon separates the port.
                        let (ip, port) = rest.rsplit_once(':').ok_or_else(bad)?;
                        let ip = IpAddr::from_str(ip).map_err(|_| bad())?;
                        let port = u16::from_str(port).map_err(|_| bad())?;
                        SocketAddr::new(ip, port)
                    }
                };
                (Some(name.to_string()), addr)
            }
        };
        if addr.port() == 0 {
            return Err(bad());
        }
        let addr = match (addr, &ifname) {
            (SocketAddr::V6(a), Some(name)) if a.scope_id() == 0 && is_link_local(a.ip()) => {
                SocketAddr::V6(SocketAddrV6::new(
                    *a.ip(),
                    a.port(),
                    a.flowinfo(),
                    interface_index(name)?,
                ))
            }
            (a, _) => a,
        };
        Ok(InitAddr::Addr { ifname, addr })
    }
}

fn is_link_local(ip: &std::net::Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

impl FromStr for InitAddr {
    type Err = Error;
    fn from_str(s: &str) -> Result<InitAddr> {
        InitAddr::parse(s)
    }
}

impl From<UniqueId> for InitAddr {
    fn from(id: UniqueId) -> InitAddr {
        InitAddr::Id(id)
    }
}

impl From<&UniqueId> for InitAddr {
    fn from(id: &UniqueId) -> InitAddr {
        InitAddr::Id(*id)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked while holding it; the data here
    // (queues, a stream) stays consistent, so keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Listeners reserved by `create_unique_id`, by nonce, for rank 0 of this process to take.
fn reserved_listeners() -> &'static Mutex<HashMap<u64, TcpListener>> {
    static RESERVED: OnceLock<Mutex<HashMap<u64, TcpListener>>> = OnceLock::new();
    RESERVED.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A random u64 from std's per-process random hasher keys, the clock and a counter.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

// ---- wire messages -------------------------------------------------------------------------

const HELLO_MAGIC: u32 = 0x4d53_4248; // "MSBH"
const PEER_MAGIC: u32 = 0x4d53_4250; // "MSBP"
const WIRE_VERSION: u16 = 1;
const HELLO_BYTES: usize = 4 + 2 + 4 + 4 + 8 + 8 + ADDR_BYTES;
const PEER_HELLO_BYTES: usize = 4 + 2 + 8 + 4;
const REPLY_OK: u8 = 0;
const REPLY_ABORT: u8 = 1;
const ABORT_TIMEOUT: u8 = 0;
const ABORT_INVALID: u8 = 1;
const MAX_ABORT_MSG: usize = 64 * 1024;
const FRAME_HEADER: usize = 1 + 8 + 8;
const KIND_USER: u8 = 0;
const KIND_COLLECTIVE: u8 = 1;
/// Largest frame payload a peer may announce (16 GiB); more means a corrupt stream.
const MAX_FRAME: u64 = 1 << 34;

/// How long past the deadline a rank waits for the root's answer (the root sends its abort
/// at the deadline).
const ROOT_REPLY_GRACE: Duration = Duration::from_millis(100);

const TAG_ALL_GATHER: u64 = 1;
const TAG_BROADCAST: u64 = 2;
const TAG_GROUP_BARRIER: u64 = 3;

fn rd_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn rd_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn rd_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

struct Hello {
    rank: usize,
    nranks: usize,
    nonce: u64,
    host_hash: u64,
    listen: SocketAddr,
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HELLO_BYTES);
        v.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
        v.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        v.extend_from_slice(&(self.rank as u32).to_le_bytes());
        v.extend_from_slice(&(self.nranks as u32).to_le_bytes());
        v.extend_from_slice(&self.nonce.to_le_bytes());
        v.extend_from_slice(&self.host_hash.to_le_bytes());
        encode_addr(&self.listen, &mut v);
        v
    }

    fn decode(b: &[u8; HELLO_BYTES]) -> std::result::Result<Hello, String> {
        let magic = rd_u32(b, 0);
        if magic != HELLO_MAGIC {
            return Err(format!(
                "expected hello magic {HELLO_MAGIC:#x}, got {magic:#x} (not a bootstrap client?)"
            ));
        }
        let version = rd_u16(b, 4);
        if version != WIRE_VERSION {
            return Err(format!(
                "expected bootstrap wire version {WIRE_VERSION}, got {version}"
            ));
        }
        Ok(Hello {
            rank: rd_u32(b, 6) as usize,
            nranks: rd_u32(b, 10) as usize,
            nonce: rd_u64(b, 14),
            host_hash: rd_u64(b, 22),
            listen: decode_addr(&b[30..])?,
        })
    }
}

fn encode_abort(code: u8, msg: &str) -> Vec<u8> {
    let msg = &msg.as_bytes()[..msg.len().min(MAX_ABORT_MSG)];
    let mut v = vec![REPLY_ABORT, code];
    v.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    v.extend_from_slice(msg);
    v
}

/// Deadline for the first bytes of an accepted connection: a real rank sends them at once, so
/// a silent stranger holds up the accept loop for at most 5 s (or what is left of `deadline`).
fn first_bytes_deadline(deadline: &Deadline) -> Deadline {
    deadline.capped(Duration::from_secs(5))
}

// ---- root ----------------------------------------------------------------------------------

struct RootClient {
    stream: TcpStream,
    hello: Hello,
}

fn root_abort_all(clients: &mut [Option<RootClient>], code: u8, msg: &str, deadline: &Deadline) {
    let bytes = encode_abort(code, msg);
    // Give the aborts a moment even when the deadline has just passed.
    let grace = Deadline::after(Duration::from_millis(500));
    let d = if deadline.remaining().is_some() {
        deadline
    } else {
        &grace
    };
    for c in clients.iter_mut().flatten() {
        // Best effort: a rank that cannot be told times out on its own deadline.
        let _ = write_all_by(&mut c.stream, &bytes, d);
    }
}

/// Collects `nranks` hellos on `listener`, then answers everyone with the table.
fn run_root(listener: TcpListener, nranks: usize, nonce: u64, deadline: Deadline) -> Result<()> {
    let root_addr = listener
        .local_addr()
        .map_err(|e| Error::io("getsockname on the bootstrap root listener", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io(format!("set non-blocking on root listener {root_addr}"), e))?;
    let mut clients: Vec<Option<RootClient>> = (0..nranks).map(|_| None).collect();
    let mut joined = 0;
    let mut backoff = Backoff::new(Duration::from_millis(20));
    while joined < nranks {
        let (mut stream, from) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if deadline.remaining().is_none() {
                    let missing: Vec<usize> =
                        (0..nranks).filter(|&r| clients[r].is_none()).collect();
                    let msg = format!(
                        "ranks {missing:?} of {nranks} did not connect to the bootstrap root at \
                         {root_addr} within {:?}",
                        deadline.timeout
                    );
                    root_abort_all(&mut clients, ABORT_TIMEOUT, &msg, &deadline);
                    return Err(deadline.timeout_error(format!("bootstrap root (rank 0): {msg}")));
                }
                backoff.sleep(Some(&deadline));
                continue;
            }
            Err(e) => {
                crate::log_warn!(
                    "BOOTSTRAP",
                    "root {root_addr}: accept failed: {e}; continuing"
                );
                backoff.sleep(Some(&deadline));
                continue;
            }
        };
        backoff = Backoff::new(Duration::from_millis(20));
        if let Err(e) = stream.set_nonblocking(false) {
            crate::log_warn!("BOOTSTRAP", "root {root_addr}: connection from {from}: {e}");
            continue;
        }
        let mut buf = [0u8; HELLO_BYTES];
        if let Err(e) = read_exact_by(&mut stream, &mut buf, &first_bytes_deadline(&deadline)) {
            crate::log_warn!(
                "BOOTSTRAP",
                "root {root_addr}: connection from {from} sent no hello ({e}); ignored"
            );
            continue;
        }
        let hello = match Hello::decode(&buf) {
            Ok(h) => h,
            Err(e) => {
                crate::log_warn!("BOOTSTRAP", "root {root_addr}: from {from}: {e}; ignored");
                continue;
            }
        };
        if hello.nonce != nonce {
            let msg = format!(
                "rank {} at {from} joined with group nonce {:#x}, but this root serves {nonce:#x}: \
                 expected every rank to use the same UniqueId / address",
                hello.rank, hello.nonce
            );
            crate::log_warn!("BOOTSTRAP", "root {root_addr}: {msg}; ignored");
            let _ = write_all_by(&mut stream, &encode_abort(ABORT_INVALID, &msg), &deadline);
            continue;
        }
        let problem = if hello.nranks != nranks {
            Some(format!(
                "rank {} at {from} says nranks = {}, but rank 0 says {nranks}: expected every rank \
                 to pass the same nranks",
                hello.rank, hello.nranks
            ))
        } else if hello.rank >= nranks {
            Some(format!(
                "a rank at {from} says it is rank {}: expected a rank below nranks {nranks}",
                hello.rank
            ))
        } else if clients[hello.rank].is_some() {
            Some(format!(
                "rank {} joined twice (again from {from}): expected each rank exactly once",
                hello.rank
            ))
        } else {
            None
        };
        if let Some(msg) = problem {
            let _ = write_all_by(&mut stream, &encode_abort(ABORT_INVALID, &msg), &deadline);
            root_abort_all(&mut clients, ABORT_INVALID, &msg, &deadline);
            return Err(Error::invalid(format!("bootstrap root (rank 0): {msg}")));
        }
        let r = hello.rank;
        clients[r] = Some(RootClient { stream, hello });
        joined += 1;
    }
    // Everyone is in: stop listening before anyone can start a new round on this port.
    drop(listener);

    let session = random_u64();
    let mut reply = Vec::with_capacity(13 + nranks * (ADDR_BYTES + 8));
    reply.push(REPLY_OK);
    reply.extend_from_slice(&session.to_le_bytes());
    reply.extend_from_slice(&(nranks as u32).to_le_bytes());
    for c in clients.iter().flatten() {
        encode_addr(&c.hello.listen, &mut reply);
        reply.extend_from_slice(&c.hello.host_hash.to_le_bytes());
    }
    for (r, c) in clients.iter_mut().enumerate() {
        if let Some(c) = c {
            if let Err(e) = write_all_by(&mut c.stream, &reply, &deadline) {
                crate::log_warn!(
                    "BOOTSTRAP",
                    "root {root_addr}: sending the address table to rank {r} failed: {e:?}"
                );
            }
        }
    }
    Ok(())
}

// ---- mailbox and receive threads ----------------------------------------------------------

type MailKey = (usize, u8, u64);

#[derive(Default)]
struct MailState {
    queues: HashMap<MailKey, VecDeque<Vec<u8>>>,
    dead: HashMap<usize, String>,
    closing: bool,
}

#[derive(Default)]
struct Mailbox {
    state: Mutex<MailState>,
    arrived: Condvar,
}

impl Mailbox {
    fn push(&self, key: MailKey, msg: Vec<u8>) {
        lock(&self.state)
            .queues
            .entry(key)
            .or_default()
            .push_back(msg);
        self.arrived.notify_all();
    }

    fn mark_dead(&self, peer: usize, reason: String) {
        let mut st = lock(&self.state);
        if st.closing {
            return;
        }
        st.dead.entry(peer).or_insert(reason);
        drop(st);
        self.arrived.notify_all();
    }

    fn take(&self, key: MailKey, timeout: Duration) -> Result<Vec<u8>> {
        let (peer, _, tag) = key;
        let deadline = Deadline::after(timeout);
        let mut st = lock(&self.state);
        loop {
            if let Some(q) = st.queues.get_mut(&key) {
                if let Some(msg) = q.pop_front() {
                    if q.is_empty() {
                        st.queues.remove(&key);
                    }
                    return Ok(msg);
                }
            }
            if let Some(reason) = st.dead.get(&peer) {
                return Err(Error::remote(
                    peer,
                    format!("{reason}; no message with tag {tag} arrived before that"),
                ));
            }
            let Some(left) = deadline.remaining() else {
                return Err(deadline.timeout_error(format!(
                    "receiving a message with tag {tag} from rank {peer}"
                )));
            };
            st = self
                .arrived
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

fn receive_loop(stream: TcpStream, peer: usize, addr: SocketAddr, mailbox: Arc<Mailbox>) {
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, stream);
    let fail = |e: std::io::Error| {
        if e.kind() == ErrorKind::UnexpectedEof || e.kind() == ErrorKind::ConnectionReset {
            format!("connection to rank {peer} at {addr} closed (EOF): the peer exited or dropped its bootstrap")
        } else {
            format!("reading from rank {peer} at {addr} failed: {e}")
        }
    };
    loop {
        let mut hdr = [0u8; FRAME_HEADER];
        if let Err(e) = reader.read_exact(&mut hdr) {
            mailbox.mark_dead(peer, fail(e));
            return;
        }
        let kind = hdr[0];
        let tag = rd_u64(&hdr, 1);
        let len = rd_u64(&hdr, 9);
        if kind > KIND_COLLECTIVE || len > MAX_FRAME {
            mailbox.mark_dead(
                peer,
                format!(
                    "rank {peer} at {addr} sent a corrupt frame header (kind {kind}, length {len}): \
                     expected kind 0 or 1 and a length up to {MAX_FRAME}"
                ),
            );
            return;
        }
        let mut payload = Vec::new();
        if payload.try_reserve_exact(len as usize).is_err() {
            mailbox.mark_dead(
                peer,
                format!("cannot allocate {len} bytes for a message from rank {peer} at {addr}"),
            );
            return;
        }
        payload.resize(len as usize, 0);
        if let Err(e) = reader.read_exact(&mut payload) {
            mailbox.mark_dead(peer, fail(e));
            return;
        }
        mailbox.push((peer, kind, tag), payload);
    }
}

// ---- session -------------------------------------------------------------------------------

struct PeerConn {
    addr: SocketAddr,
    writer: Mutex<Writer>,
}

struct Writer {
    stream: TcpStream,
    /// Set after a failed write: the stream may hold a partial frame, so it is unusable.
    broken: Option<String>,
}

/// Everything an initialized `TcpBootstrap` owns; dropping it closes every socket and joins
/// every receive thread.
struct Session {
    timeout: Duration,
    host_hashes: Vec<u64>,
    nranks_per_node: usize,
    peers: Vec<Option<PeerConn>>,
    mailbox: Arc<Mailbox>,
    threads: Vec<JoinHandle<()>>,
    collective: Mutex<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        lock(&self.mailbox.state).closing = true;
        for p in self.peers.iter().flatten() {
            // Wakes the receive thread (its read returns EOF); errors mean it is already closed.
            let _ = lock(&p.writer).stream.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            // A receive thread never panics; if one did, there is nothing left to clean up.
            let _ = t.join();
        }
    }
}

/// The built-in TCP bootstrap. Create with [`TcpBootstrap::new`], then call
/// [`initialize`](TcpBootstrap::initialize) on every rank with the same [`InitAddr`].
pub struct TcpBootstrap {
    rank: usize,
    nranks: usize,
    session: Option<Session>,
}

impl std::fmt::Debug for TcpBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpBootstrap")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("initialized", &self.session.is_some())
            .finish()
    }
}

impl TcpBootstrap {
    /// A bootstrap for `rank` of `nranks`; nothing is connected until `initialize`.
    pub fn new(rank: usize, nranks: usize) -> Result<TcpBootstrap> {
        if nranks == 0 || rank >= nranks {
            return Err(Error::invalid(format!(
                "TcpBootstrap::new(rank {rank}, nranks {nranks}): expected nranks >= 1 and rank < nranks"
            )));
        }
        if nranks > u32::MAX as usize {
            return Err(Error::invalid(format!(
                "TcpBootstrap::new: nranks {nranks}: expected at most {}",
                u32::MAX
            )));
        }
        Ok(TcpBootstrap {
            rank,
            nranks,
            session: None,
        })
    }

    /// Makes a new group id: picks the interface (per `MSCCLPP_SOCKET_IFNAME` /
    /// `MSCCLPP_SOCKET_FAMILY`, else the first up non-loopback interface, else loopback) and
    /// reserves a listening port on it. Rank 0 of this process takes that socket over in
    /// `initialize`; if the id is never used here, release it with
    /// [`TcpBootstrap::release_unique_id`].
    pub fn create_unique_id() -> Result<UniqueId> {
        let bind_at = iface_bind_addr(&select_interface()?);
        let listener = bind_listener(bind_at, None)?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(format!("getsockname on listener bound at {bind_at}"), e))?;
        let nonce = loop {
            let n = random_u64();
            if n != 0 {
                break n;
            }
        };
        let id = UniqueId::new(addr, nonce)?;
        lock(reserved_listeners()).insert(nonce, listener);
        Ok(id)
    }

    /// Closes the port reserved for `id` by `create_unique_id` in this process, if rank 0 has
    /// not taken it. Returns whether one was closed.
    pub fn release_unique_id(id: &UniqueId) -> bool {
        lock(reserved_listeners()).remove(&id.nonce()).is_some()
    }

    /// [`initialize`](TcpBootstrap::initialize) with a [`UniqueId`].
    pub fn initialize_with_id(&mut self, id: &UniqueId, timeout: Duration) -> Result<()> {
        self.initialize(InitAddr::Id(*id), timeout)
    }

    /// [`initialize`](TcpBootstrap::initialize) with `"ip:port"` or `"ifname:ip:port"`.
    pub fn initialize_with_addr(&mut self, addr: &str, timeout: Duration) -> Result<()> {
        self.initialize(InitAddr::parse(addr)?, timeout)
    }

    /// Joins the group at `addr`: returns once this rank is connected to every other rank, or
    /// an error once `timeout` has passed (naming the ranks that never came).
    pub fn initialize(&mut self, addr: InitAddr, timeout: Duration) -> Result<()> {
        if self.session.is_some() {
            return Err(Error::invalid(format!(
                "TcpBootstrap::initialize called twice on rank {}: expected a new TcpBootstrap per group",
                self.rank
            )));
        }
        if timeout.is_zero() {
            return Err(Error::invalid(
                "TcpBootstrap::initialize: timeout 0: expected a positive timeout",
            ));
        }
        let deadline = Deadline::after(timeout);
        let (root, nonce, ifname) = match &addr {
            InitAddr::Id(id) => (id.root_addr(), id.nonce(), None),
            InitAddr::Addr { ifname, addr } => (*addr, 0, ifname.clone()),
        };

        let root_failed = Arc::new(Cancel::new(false));
        let root_thread = if self.rank == 0 {
            let reserved = match &addr {
                InitAddr::Id(id) => lock(reserved_listeners()).remove(&id.nonce()),
                InitAddr::Addr { .. } => None,
            };
            let listener = match reserved {
                Some(l) => l,
                None => bind_listener(root, Some(&deadline))?,
            };
            let n = self.nranks;
            let failed = root_failed.clone();
            let t = std::thread::Builder::new()
                .name("mscclpp-bootstrap-root".into())
                .spawn(move || {
                    let r = run_root(listener, n, nonce, deadline);
                    if r.is_err() {
                        failed.store(true, std::sync::atomic::Ordering::Release);
                    }
                    r
                })
                .map_err(|e| Error::io("spawn the bootstrap root thread", e))?;
            Some(t)
        } else {
            None
        };

        let joined = self.join(root, nonce, ifname.as_deref(), &deadline, &root_failed);
        let root_result = match root_thread {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(Error::Internal("the bootstrap root thread panicked".into()))
            }),
            None => Ok(()),
        };
        // The root's error names the missing ranks: prefer it over this rank's view.
        let table = match (root_result, joined) {
            (Err(root_err), _) => return Err(root_err),
            (Ok(()), Err(e)) => return Err(e),
            (Ok(()), Ok(t)) => t,
        };
        let session = self.connect_mesh(table, &deadline, timeout)?;
        self.session = Some(session);
        crate::log_info!(
            "BOOTSTRAP",
            "rank {} of {} connected (root {root})",
            self.rank,
            self.nranks
        );
        Ok(())
    }

    /// Binds this rank's listener for its peers: on `ifname`'s address, else on the interface
    /// `MSCCLPP_SOCKET_IFNAME` selects, else on the local address of the root connection.
    fn bind_peer_listener(
        &self,
        root_conn: &TcpStream,
        root: SocketAddr,
        ifname: Option<&str>,
    ) -> Result<TcpListener> {
        let local = match ifname {
            Some(name) => {
                let family = if root.is_ipv4() {
                    SocketFamily::Inet
                } else {
                    SocketFamily::Inet6
                };
                let spec = format!("={name}");
                iface_bind_addr(&choose_interface(
                    &list_interfaces()?,
                    Some(&spec),
                    Some(family),
                )?)
            }
            None if crate::env::env().socket_ifname().is_some() => {
                iface_bind_addr(&select_interface()?)
            }
            None => {
                let mut a = root_conn
                    .local_addr()
                    .map_err(|e| Error::io(format!("getsockname on connection to {root}"), e))?;
                a.set_port(0);
                a
            }
        };
        bind_listener(local, None)
    }

    /// Client side of setup: hello to the root, then the table back.
    fn join(
        &self,
        root: SocketAddr,
        nonce: u64,
        ifname: Option<&str>,
        deadline: &Deadline,
        cancel: &Cancel,
    ) -> Result<Table> {
        let root_who = "the bootstrap root (rank 0)";
        let read_fail = |what: &str, e: ReadFail| match e {
            ReadFail::Timeout => deadline.timeout_error(format!(
                "waiting for {what} from {root_who} at {root} (rank {} of {})",
                self.rank, self.nranks
            )),
            e => Error::remote(0, format!("reading {what} from the root at {root}: {e}")),
        };
        let mut listener: Option<(TcpListener, SocketAddr)> = None;
        let mut backoff = Backoff::new(Duration::from_millis(50));
        // A connection that closes before the root answered (a stale listener on the port, a
        // root that restarted) is retried until the deadline.
        let (mut stream, status) = loop {
            let mut stream = connect_retry(root, deadline, root_who, cancel)?;
            let listen = match &listener {
                Some((_, a)) => *a,
                None => {
                    let l = self.bind_peer_listener(&stream, root, ifname)?;
                    let a = l
                        .local_addr()
                        .map_err(|e| Error::io("getsockname on the peer listener", e))?;
                    listener = Some((l, a));
                    a
                }
            };
            let hello = Hello {
                rank: self.rank,
                nranks: self.nranks,
                nonce,
                host_hash: host_hash(),
                listen,
            };
            let retry_why = match write_all_by(&mut stream, &hello.encode(), deadline) {
                Err(None) => {
                    return Err(
                        deadline.timeout_error(format!("sending hello to {root_who} at {root}"))
                    )
                }
                Err(Some(e)) => e.to_string(),
                Ok(()) => {
                    // The root answers at the deadline at the latest (with an abort naming the
                    // missing ranks): give its answer a moment to arrive.
                    let mut status = [0u8; 1];
                    match read_exact_by(
                        &mut stream,
                        &mut status,
                        &deadline.extended(ROOT_REPLY_GRACE),
                    ) {
                        Ok(()) => break (stream, status[0]),
                        Err(ReadFail::Timeout) => {
                            return Err(read_fail("the address table", ReadFail::Timeout))
                        }
                        Err(e) => e.to_string(),
                    }
                }
            };
            if cancel.load(std::sync::atomic::Ordering::Acquire) {
                return Err(cancelled());
            }
            if deadline.remaining().is_none() {
                return Err(deadline.timeout_error(format!(
                    "joining {root_who} at {root} (last error: {retry_why})"
                )));
            }
            crate::log_info!(
                "BOOTSTRAP",
                "rank {}: root {root} closed the connection ({retry_why}); retrying",
                self.rank
            );
            backoff.sleep(Some(deadline));
        };
        let Some((listener, _)) = listener else {
            return Err(Error::Internal(
                "peer listener missing after joining the root".into(),
            ));
        };
        match status {
            REPLY_OK => {}
            REPLY_ABORT => {
                let late = deadline.extended(Duration::from_secs(1));
                let mut head = [0u8; 5];
                read_exact_by(&mut stream, &mut head, &late)
                    .map_err(|e| read_fail("the abort message", e))?;
                let len = (rd_u32(&head, 1) as usize).min(MAX_ABORT_MSG);
                let mut msg = vec![0u8; len];
                read_exact_by(&mut stream, &mut msg, &late)
                    .map_err(|e| read_fail("the abort message", e))?;
                let msg = String::from_utf8_lossy(&msg);
                return Err(match head[0] {
                    ABORT_TIMEOUT => deadline.timeout_error(format!("{root_who} at {root}: {msg}")),
                    _ => Error::invalid(format!(
                        "{root_who} at {root} rejected rank {}: {msg}",
                        self.rank
                    )),
                });
            }
            s => {
                return Err(Error::remote(
                    0,
                    format!(
                    "the root at {root} replied with status {s}: expected 0 (table) or 1 (abort)"
                ),
                ))
            }
        }
        let late = deadline.extended(Duration::from_secs(1));
        let mut head = [0u8; 12];
        read_exact_by(&mut stream, &mut head, &late)
            .map_err(|e| read_fail("the address table", e))?;
        let session = rd_u64(&head, 0);
        let n = rd_u32(&head, 8) as usize;
        if n != self.nranks {
            return Err(Error::remote(
                0,
                format!(
                    "the root at {root} sent a table of {n} ranks: expected {}",
                    self.nranks
                ),
            ));
        }
        let mut body = vec![0u8; n * (ADDR_BYTES + 8)];
        read_exact_by(&mut stream, &mut body, &late)
            .map_err(|e| read_fail("the address table", e))?;
        let mut addrs = Vec::with_capacity(n);
        let mut hashes = Vec::with_capacity(n);
        for entry in body.chunks_exact(ADDR_BYTES + 8) {
            let a = decode_addr(entry).map_err(|e| {
                Error::remote(
                    0,
                    format!("the root at {root} sent a bad address table: {e}"),
                )
            })?;
            addrs.push(a);
            hashes.push(rd_u64(entry, ADDR_BYTES));
        }
        Ok(Table {
            session,
            addrs,
            hashes,
            listener,
        })
    }

    /// Connects to every lower rank, accepts every higher one, starts the receive threads.
    fn connect_mesh(
        &self,
        table: Table,
        deadline: &Deadline,
        timeout: Duration,
    ) -> Result<Session> {
        let Table {
            session,
            addrs,
            hashes,
            listener,
        } = table;
        let me = self.rank;
        let n = self.nranks;
        let mut streams: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();

        let mut hs = Vec::with_capacity(PEER_HELLO_BYTES);
        hs.extend_from_slice(&PEER_MAGIC.to_le_bytes());
        hs.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        hs.extend_from_slice(&session.to_le_bytes());
        hs.extend_from_slice(&(me as u32).to_le_bytes());
        for (peer, slot) in streams.iter_mut().enumerate().take(me) {
            let who = format!("rank {peer}");
            let mut s = connect_retry(addrs[peer], deadline, &who, &Cancel::new(false))?;
            write_all_by(&mut s, &hs, deadline).map_err(|e| match e {
                None => deadline.timeout_error(format!(
                    "sending handshake to rank {peer} at {}",
                    addrs[peer]
                )),
                Some(e) => Error::remote(
                    peer,
                    format!("sending handshake to {} failed: {e}", addrs[peer]),
                ),
            })?;
            *slot = Some(s);
        }

        let listen_addr = listener
            .local_addr()
            .map_err(|e| Error::io("getsockname on the peer listener", e))?;
        listener.set_nonblocking(true).map_err(|e| {
            Error::io(
                format!("set non-blocking on peer listener {listen_addr}"),
                e,
            )
        })?;
        let mut missing = n - 1 - me;
        let mut backoff = Backoff::new(Duration::from_millis(20));
        while missing > 0 {
            match listener.accept() {
                Ok((mut s, from)) => {
                    backoff = Backoff::new(Duration::from_millis(20));
                    if s.set_nonblocking(false).is_err() {
                        continue;
                    }
                    let mut buf = [0u8; PEER_HELLO_BYTES];
                    if let Err(e) = read_exact_by(&mut s, &mut buf, &first_bytes_deadline(deadline))
                    {
                        crate::log_warn!(
                            "BOOTSTRAP",
                            "rank {me}: connection from {from} sent no handshake ({e}); ignored"
                        );
                        continue;
                    }
                    let peer = rd_u32(&buf, 14) as usize;
                    let ok = rd_u32(&buf, 0) == PEER_MAGIC
                        && rd_u16(&buf, 4) == WIRE_VERSION
                        && rd_u64(&buf, 6) == session
                        && peer > me
                        && peer < n
                        && streams[peer].is_none();
                    if !ok {
                        crate::log_warn!(
                            "BOOTSTRAP",
                            "rank {me}: unexpected handshake from {from} (claims rank {peer}; expected a higher rank of session {session:#x}); ignored"
                        );
                        continue;
                    }
                    if let Err(e) = s.set_nodelay(true) {
                        return Err(Error::io(
                            format!("set TCP_NODELAY on connection from rank {peer}"),
                            e,
                        ));
                    }
                    streams[peer] = Some(s);
                    missing -= 1;
                }
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted =>
                {
                    if deadline.remaining().is_none() {
                        let who: Vec<String> = (me + 1..n)
                            .filter(|&r| streams[r].is_none())
                            .map(|r| format!("rank {r} ({})", addrs[r]))
                            .collect();
                        return Err(deadline.timeout_error(format!(
                            "rank {me} waiting for {} to connect to its listener at {listen_addr}",
                            who.join(", ")
                        )));
                    }
                    backoff.sleep(Some(deadline));
                }
                Err(e) => {
                    return Err(Error::io(
                        format!("accept on peer listener {listen_addr}"),
                        e,
                    ))
                }
            }
        }
        // All peers are in: no listening socket stays open.
        drop(listener);

        let mailbox = Arc::new(Mailbox::default());
        let mut peers = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n.saturating_sub(1));
        let mut session_obj = Session {
            timeout,
            nranks_per_node: hashes.iter().filter(|&&h| h == hashes[me]).count(),
            host_hashes: hashes,
            peers: Vec::new(),
            mailbox: mailbox.clone(),
            threads: Vec::new(),
            collective: Mutex::new(()),
        };
        for (peer, s) in streams.into_iter().enumerate() {
            let Some(s) = s else {
                peers.push(None);
                continue;
            };
            let addr = addrs[peer];
            let reader = s
                .try_clone()
                .map_err(|e| Error::io(format!("dup the socket to rank {peer}"), e))?;
            // Clear the setup read timeout: the receive thread blocks until data or shutdown.
            reader.set_read_timeout(None).map_err(|e| {
                Error::io(format!("clear read timeout on socket to rank {peer}"), e)
            })?;
            peers.push(Some(PeerConn {
                addr,
                writer: Mutex::new(Writer {
                    stream: s,
                    broken: None,
                }),
            }));
            let mb = mailbox.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("mscclpp-bootstrap-recv-{peer}"))
                .spawn(move || receive_loop(reader, peer, addr, mb));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    session_obj.peers = peers;
                    session_obj.threads = threads;
                    return Err(Error::io(
                        format!("spawn the receive thread for rank {peer}"),
                        e,
                    ));
                }
            }
        }
        session_obj.peers = peers;
        session_obj.threads = threads;
        Ok(session_obj)
    }

    fn session(&self, op: &str) -> Result<&Session> {
        self.session.as_ref().ok_or_else(|| {
            Error::invalid(format!(
                "TcpBootstrap::{op} on rank {} before initialize: expected initialize first",
                self.rank
            ))
        })
    }

    fn check_peer(&self, op: &str, peer: usize) -> Result<()> {
        if peer >= self.nranks {
            return Err(Error::invalid(format!(
                "TcpBootstrap::{op}: peer {peer}: expected a rank below nranks {}",
                self.nranks
            )));
        }
        Ok(())
    }

    fn send_kind(&self, kind: u8, data: &[u8], peer: usize, tag: u64) -> Result<()> {
        let s = self.session("send")?;
        self.check_peer("send", peer)?;
        if peer == self.rank {
            s.mailbox.push((peer, kind, tag), data.to_vec());
            return Ok(());
        }
        let conn = s.peers[peer]
            .as_ref()
            .ok_or_else(|| Error::Internal(format!("no connection to rank {peer}")))?;
        let mut frame = Vec::with_capacity(FRAME_HEADER + data.len().min(1 << 16));
        frame.push(kind);
        frame.extend_from_slice(&tag.to_le_bytes());
        frame.extend_from_slice(&(data.len() as u64).to_le_bytes());
        let small = data.len() <= 1 << 16;
        if small {
            frame.extend_from_slice(data);
        }
        let mut w = lock(&conn.writer);
        if let Some(why) = &w.broken {
            return Err(Error::remote(
                peer,
                format!("connection at {} is unusable: {why}", conn.addr),
            ));
        }
        let deadline = Deadline::after(s.timeout);
        let mut result = write_all_by(&mut w.stream, &frame, &deadline);
        if result.is_ok() && !small {
            result = write_all_by(&mut w.stream, data, &deadline);
        }
        result.map_err(|e| {
            let err = match e {
                None => deadline.timeout_error(format!(
                    "sending {} bytes with tag {tag} to rank {peer} at {} (the peer is not reading)",
                    data.len(),
                    conn.addr
                )),
                Some(e) => Error::remote(
                    peer,
                    format!("sending {} bytes with tag {tag} to {} failed: {e}", data.len(), conn.addr),
                ),
            };
            w.broken = Some(err.to_string());
            err
        })
    }

    fn recv_kind(
        &self,
        kind: u8,
        peer: usize,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>> {
        let s = self.session("recv")?;
        self.check_peer("recv", peer)?;
        s.mailbox
            .take((peer, kind, tag), timeout.unwrap_or(s.timeout))
    }

    /// [`Bootstrap::recv`] with its own timeout instead of the one given to `initialize`.
    pub fn recv_timeout(&self, peer: usize, tag: u64, timeout: Duration) -> Result<Vec<u8>> {
        self.recv_kind(KIND_USER, peer, tag, Some(timeout))
    }

    /// Every rank's host hash, indexed by rank (after `initialize`).
    pub fn host_hashes(&self) -> Result<&[u64]> {
        Ok(&self.session("host_hashes")?.host_hashes)
    }

    /// The timeout given to `initialize`: the bound on every later blocking call.
    pub fn timeout(&self) -> Option<Duration> {
        self.session.as_ref().map(|s| s.timeout)
    }

    /// Whether `initialize` has succeeded.
    pub fn is_initialized(&self) -> bool {
        self.session.is_some()
    }
}

struct Table {
    session: u64,
    addrs: Vec<SocketAddr>,
    hashes: Vec<u64>,
    listener: TcpListener,
}

/// The address to bind on interface `i`, with an ephemeral port.
fn iface_bind_addr(i: &Interface) -> SocketAddr {
    match i.addr {
        IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, 0, 0, i.scope_id)),
        IpAddr::V4(_) => SocketAddr::new(i.addr, 0),
    }
}

impl Bootstrap for TcpBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        self.nranks
    }

    /// Ranks sharing this rank's host hash; 0 before `initialize`.
    fn nranks_per_node(&self) -> usize {
        self.session.as_ref().map_or(0, |s| s.nranks_per_node)
    }

    fn send(&self, data: &[u8], peer: usize, tag: u64) -> Result<()> {
        self.send_kind(KIND_USER, data, peer, tag)
    }

    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.recv_kind(KIND_USER, peer, tag, None)
    }

    fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let s = self.session("all_gather")?;
        let _serial = lock(&s.collective);
        let (me, n) = (self.rank, self.nranks);
        // Ring order spreads the load: rank r sends to r+1, r+2, ... and receives likewise.
        for k in 1..n {
            self.send_kind(KIND_COLLECTIVE, data, (me + k) % n, TAG_ALL_GATHER)?;
        }
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); n];
        out[me] = data.to_vec();
        for k in 1..n {
            let peer = (me + n - k) % n;
            out[peer] = self.recv_kind(KIND_COLLECTIVE, peer, TAG_ALL_GATHER, None)?;
        }
        Ok(out)
    }

    fn barrier(&self) -> Result<()> {
        self.all_gather(&[]).map(|_| ())
    }

    fn broadcast(&self, data: &[u8], root: usize) -> Result<Vec<u8>> {
        let s = self.session("broadcast")?;
        if root >= self.nranks {
            return Err(Error::invalid(format!(
                "broadcast root {root}: expected a rank below nranks {}",
                self.nranks
            )));
        }
        let _serial = lock(&s.collective);
        if self.rank == root {
            for peer in (0..self.nranks).filter(|&p| p != root) {
                self.send_kind(KIND_COLLECTIVE, data, peer, TAG_BROADCAST)?;
            }
            Ok(data.to_vec())
        } else {
            self.recv_kind(KIND_COLLECTIVE, root, TAG_BROADCAST, None)
        }
    }

    fn group_barrier(&self, ranks: &[usize]) -> Result<()> {
        let s = self.session("group_barrier")?;
        let me = self.rank;
        check_group(ranks, me, self.nranks)?;
        let _serial = lock(&s.collective);
        for &peer in ranks.iter().filter(|&&p| p != me) {
            self.send_kind(KIND_COLLECTIVE, &[], peer, TAG_GROUP_BARRIER)?;
        }
        for &peer in ranks.iter().filter(|&&p| p != me) {
            self.recv_kind(KIND_COLLECTIVE, peer, TAG_GROUP_BARRIER, None)?;
        }
        Ok(())
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<TcpBootstrap>();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_init_addr() {
        let a = InitAddr::parse("127.0.0.1:5000").expect("ip:port");
        assert_eq!(
            a,
            InitAddr::Addr {
                ifname: None,
                addr: "127.0.0.1:5000".parse().expect("addr")
            }
        );
        let a = InitAddr::parse("lo:127.0.0.1:5000").expect("ifname:ip:port");
        assert!(matches!(a, InitAddr::Addr { ifname: Some(ref n), .. } if n == "lo"));
        let a = InitAddr::parse("[::1]:7").expect("v6");
        assert!(matches!(a, InitAddr::Addr { ifname: None, addr } if addr.is_ipv6()));
        let a = InitAddr::parse("lo:::1:7").expect("ifname v6 without brackets");
        assert!(matches!(a, InitAddr::Addr { addr, .. } if addr.port() == 7 && addr.is_ipv6()));
        for bad in [
            "",
            "127.0.0.1",
            "127.0.0.1:0",
            "x:y:z",
            ":1.2.3.4:5",
            "1.2.3.4:99999",
        ] {
            let e = InitAddr::parse(bad).expect_err(bad);
            assert!(e.to_string().contains("expected \"ip:port\""), "{e}");
        }
    }

    #[test]
    fn new_checks_rank() {
        assert!(TcpBootstrap::new(0, 0).is_err());
        assert!(TcpBootstrap::new(2, 2).is_err());
        let b = TcpBootstrap::new(1, 2).expect("valid");
        assert_eq!(b.nranks_per_node(), 0);
        let e = b.send(&[1], 0, 0).expect_err("not initialized");
        assert_eq!(e.code(), crate::ErrorCode::InvalidUsage);
    }
}
