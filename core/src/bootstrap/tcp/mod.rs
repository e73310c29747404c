//! `TcpBootstrap`: the built-in [`Bootstrap`] over TCP.
//!
//! Setup (`initialize`), all bounded by one deadline (the timeout given to it):
//! 1. Rank 0 runs the root on the root address (the socket reserved by
//!    [`TcpBootstrap::create_unique_id`] when the id was made in this process, else a fresh
//!    bind; a port another program listens on is an error at once, naming its holder). A rank whose interface is named (`ifname:ip:port`,
//!    `MSCCLPP_SOCKET_IFNAME`) binds its peer listener first, so a bad interface is reported at
//!    once, before any root starts.
//! 2. Every rank binds a listener for its peers, connects to the root (retrying refusals until
//!    the deadline) and sends a hello: rank, nranks, nonce, host hash, listen address. The
//!    nonce authenticates the job: the `UniqueId`'s random nonce, or in `ip:port` mode the hash
//!    of the job key (see `job_key`: `MSCCLPP_BOOTSTRAP_KEY`, else the launcher's job id).
//! 3. The root serves all connections at once (a `poll` loop, a deadline per connection), and
//!    refuses a hello of another job or another wire version with an answer saying why,
//!    without touching the job. A hello with the job's nonce but a wrong nranks or rank, or a
//!    rank that joined twice, is refused too and stops the job: every rank that joined gets
//!    an abort naming the refused rank and why, at once (not at the deadline). When all
//!    `nranks` hellos are in, it closes its listener and answers each rank with the table of
//!    addresses and host hashes plus a fresh session number; at the deadline it answers
//!    everyone with an abort naming the missing ranks (and what it refused).
//! 4. Ranks build a full mesh: each connects to every lower rank while accepting every higher
//!    one, then closes its listener. One receive thread per rank (an event loop over all peer
//!    sockets) reads `(kind, tag, len, payload)` frames into a mailbox keyed by
//!    `(peer, kind, tag)`; kind 0 is user traffic, kind 1 the collectives, so collectives never
//!    steal a user's tag. A frame's length is checked against [`MAX_MESSAGE_BYTES`] and its
//!    memory committed only as its bytes arrive.
//!
//! A peer whose connection closes (EOF, reset) is dead at once: receives from it fail with
//! [`Error::Remote`] naming it, and so does any collective still missing its message, even
//! while other peers are slow. Every call waits at most the `initialize` timeout (one deadline
//! for a whole collective), or the one passed to [`TcpBootstrap::recv_timeout`]. After a
//! collective failed on a rank, later collectives there fail at once (their message sequences
//! no longer match the other ranks'); point-to-point traffic keeps working.
//!
//! # Files
//! [`address`] parses where the root is ([`InitAddr`]); `job_key` says which job a rank
//! belongs to; `wire` lays out every message (pure codecs, fuzzed); `accept` serves setup
//! connections concurrently; `root` is rank 0's setup server; `join` a rank's hello and the
//! root's reply; `mesh` the full mesh and the session it leaves; `receiver` the receive event
//! loop; `mailbox` the `(peer, kind, tag)` queues; this file is [`TcpBootstrap`] itself (send,
//! receive, collectives).

mod accept;
mod address;
mod job_key;
mod join;
mod mailbox;
mod mesh;
mod receiver;
mod root;
mod wire;
#[cfg(test)]
mod wire_fuzz;

pub use address::InitAddr;
pub use wire::MAX_MESSAGE_BYTES;

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use self::job_key::JobKey;
use self::join::{JoinLimits, Member};
use self::mailbox::{show_tag, MailKey};
use self::mesh::Session;
use self::root::{run_root, Auth, RootStop};
use self::wire::{encode_frame_header, KIND_COLLECTIVE, KIND_USER, ROOT_ACK_WAIT};
use super::netif::{iface_bind_addr, select_interface};
use super::socket::{
    bind_listener, lock, random_u64, write_all_by, Cancel, Deadline, RefusedLimit,
};
use super::unique_id::UniqueId;
use super::{check_group, Bootstrap};
use crate::error::{Error, ErrorCode, Result};

/// Listeners reserved by `create_unique_id`, by nonce, for rank 0 of this process to take.
fn reserved_listeners() -> &'static Mutex<HashMap<u64, TcpListener>> {
    static RESERVED: OnceLock<Mutex<HashMap<u64, TcpListener>>> = OnceLock::new();
    RESERVED.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The most ranks a bootstrap takes: every rank keeps one socket per peer (a full mesh), and
/// Linux caps a process's descriptors at 2^20 by default (`fs.nr_open`).
pub const MAX_NRANKS: usize = 1 << 20;

/// Descriptors a rank needs besides its peers' sockets (listener, wake-up pair, files).
const FD_HEADROOM: u64 = 64;

/// `Err` at once when `nranks - 1` peer sockets cannot fit under this process's hard
/// descriptor limit (RLIMIT_NOFILE): the mesh would fail late with "Too many open files".
fn check_fd_budget(nranks: usize) -> Result<()> {
    use nix::sys::resource::{getrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return Ok(());
    };
    let need = nranks as u64 - 1 + FD_HEADROOM;
    if need > hard {
        return Err(Error::invalid(format!(
            "nranks {nranks}: every rank keeps a socket per peer, {need} descriptors with its \
             own, but this process may open at most {hard} (RLIMIT_NOFILE hard limit): expected \
             nranks up to {} or a higher limit (ulimit -Hn)",
            (hard + 1).saturating_sub(FD_HEADROOM)
        )));
    }
    if need > soft {
        crate::log_warn!(
            "BOOTSTRAP",
            "nranks {nranks} needs about {need} descriptors per rank, above the soft limit {soft} \
             (ulimit -n): the mesh may fail with \"Too many open files\""
        );
    }
    Ok(())
}

const TAG_ALL_GATHER: u64 = 1;
const TAG_BROADCAST: u64 = 2;
const TAG_GROUP_BARRIER: u64 = 3;

/// The built-in TCP bootstrap. Create with [`TcpBootstrap::new`], then call
/// [`initialize`](TcpBootstrap::initialize) on every rank with the same [`InitAddr`].
pub struct TcpBootstrap {
    rank: usize,
    nranks: usize,
    job_key: Option<String>,
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
        // The first thing every rank makes: the logger warns malformed variables now.
        crate::logger::init();
        if nranks == 0 || rank >= nranks {
            return Err(Error::invalid(format!(
                "TcpBootstrap::new(rank {rank}, nranks {nranks}): expected nranks >= 1 and rank < nranks"
            )));
        }
        if nranks > MAX_NRANKS {
            return Err(Error::invalid(format!(
                "TcpBootstrap::new: nranks {nranks}: expected at most {MAX_NRANKS} (every rank \
                 keeps one socket per peer)"
            )));
        }
        check_fd_budget(nranks)?;
        Ok(TcpBootstrap {
            rank,
            nranks,
            job_key: None,
            session: None,
        })
    }

    /// Sets the job key for `ip:port` mode (instead of `MSCCLPP_BOOTSTRAP_KEY` or the
    /// launcher's job id): every rank of the job must set the same key; ranks with another key
    /// are refused by the root. Call before `initialize`; a `UniqueId` ignores it (its nonce
    /// names the job).
    pub fn set_job_key(&mut self, key: &str) -> Result<()> {
        if self.session.is_some() {
            return Err(Error::invalid(
                "TcpBootstrap::set_job_key after initialize: expected it before initialize",
            ));
        }
        self.job_key = Some(key.to_string());
        Ok(())
    }

    /// Makes a new group id: picks the interface (per `MSCCLPP_SOCKET_IFNAME` /
    /// `MSCCLPP_SOCKET_FAMILY`, else the first up non-loopback interface, else loopback) and
    /// reserves a listening port on it. Rank 0 of this process takes that socket over in
    /// `initialize`; if the id is never used here, release it with
    /// [`TcpBootstrap::release_unique_id`].
    pub fn create_unique_id() -> Result<UniqueId> {
        let bind_at = iface_bind_addr(&select_interface()?);
        let listener = bind_listener(bind_at)?;
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
    /// an error by `timeout` (naming the ranks that never came). A failure of this rank's own
    /// setup (a bad interface, a port in use) is returned at once with its cause.
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
        let (root, auth, ifname) = match &addr {
            InitAddr::Id(id) => (id.root_addr(), Auth::UniqueId(id.nonce()), None),
            InitAddr::Addr { ifname, addr } => {
                let key = match &self.job_key {
                    Some(k) => JobKey::explicit(k),
                    None => JobKey::of_process(),
                };
                let auth = Auth::JobKey {
                    hash: key.hash,
                    source: key.source,
                };
                (*addr, auth, ifname.clone())
            }
        };
        let me = Member {
            rank: self.rank,
            nranks: self.nranks,
        };
        // Local setup first: a bad interface fails here, before a root is started.
        let early = me.early_listener(root, ifname.as_deref())?;

        let root_stop = Arc::new(RootStop::default());
        let root_failed = Arc::new(Cancel::new(false));
        let root_thread = if self.rank == 0 {
            let reserved = match &addr {
                InitAddr::Id(id) => lock(reserved_listeners()).remove(&id.nonce()),
                InitAddr::Addr { .. } => None,
            };
            let listener = match reserved {
                Some(l) => l,
                None => bind_listener(root)?,
            };
            let (n, auth, stop, failed) = (
                self.nranks,
                auth.clone(),
                root_stop.clone(),
                root_failed.clone(),
            );
            let t = std::thread::Builder::new()
                .name("mscclpp-bootstrap-root".into())
                .spawn(move || {
                    let r = run_root(listener, n, auth, deadline, stop);
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

        let key_source = match &auth {
            Auth::JobKey { source, .. } => Some(source.as_str()),
            Auth::UniqueId(_) => None,
        };
        let limits = JoinLimits {
            refused: refused_limit(&addr),
            ack_wait: matches!(addr, InitAddr::Addr { .. }).then_some(ROOT_ACK_WAIT),
        };
        let joined = me.join(
            root,
            auth.nonce(),
            key_source,
            early,
            &deadline,
            &root_failed,
            &limits,
        );
        let table = match root_thread {
            None => joined?,
            Some(t) => {
                // This rank's own failure (not a timeout, not the root's) stops the root at
                // once; the root then tells the ranks that joined.
                let local = matches!(&joined, Err(e) if !matches!(e.code(), ErrorCode::Timeout | ErrorCode::Aborted));
                if let (true, Err(e)) = (local, &joined) {
                    root_stop.stop(e.to_string());
                }
                let root_result = t.join().unwrap_or_else(|_| {
                    Err(Error::Internal("the bootstrap root thread panicked".into()))
                });
                match (root_result, joined) {
                    (_, Err(e)) if local => return Err(e),
                    // The root's error names the missing ranks: prefer it over this rank's view.
                    (Err(root_err), _) => return Err(root_err),
                    (Ok(()), joined) => joined?,
                }
            }
        };
        let session = me.connect_mesh(table, &deadline, timeout)?;
        self.session = Some(session);
        crate::log_info!(
            "BOOTSTRAP",
            "rank {} of {} connected (root {root})",
            self.rank,
            self.nranks
        );
        Ok(())
    }
}

/// How long a joining rank retries a root address that refuses connections: a `UniqueId`'s
/// root listens from the moment the id is made, so refusals mean it is gone (default 5 s); an
/// `ip:port` root may start after its ranks, so there only `MSCCLPP_BOOTSTRAP_REFUSED_TIMEOUT`
/// bounds them (else the bootstrap's timeout does).
fn refused_limit(addr: &InitAddr) -> Option<RefusedLimit> {
    let set = crate::env::env().bootstrap_refused_timeout();
    let var = crate::env::BOOTSTRAP_REFUSED_TIMEOUT;
    match addr {
        InitAddr::Id(_) => Some(RefusedLimit {
            limit: set.unwrap_or(crate::env::BOOTSTRAP_REFUSED_TIMEOUT_DEFAULT),
            hint: format!(
                "the UniqueId's rank 0 is not listening: it has exited or failed, or the id is \
                 stale (made by an earlier run or by a process that has ended); expected rank 0 \
                 to initialize with this same id ({var} sets this bound)"
            ),
        }),
        InitAddr::Addr { .. } => set.map(|limit| RefusedLimit {
            limit,
            hint: format!(
                "rank 0 has not started its bootstrap root there, or has exited; expected rank \
                 0 to initialize with this address ({var} sets this bound)"
            ),
        }),
    }
}

impl TcpBootstrap {
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

    /// Sends one frame to `peer` by `deadline`; `what` names the operation in errors.
    fn send_kind(
        &self,
        kind: u8,
        data: &[u8],
        peer: usize,
        tag: u64,
        deadline: &Deadline,
        what: &str,
    ) -> Result<()> {
        let s = self.session("send")?;
        self.check_peer("send", peer)?;
        if data.len() > MAX_MESSAGE_BYTES {
            return Err(Error::invalid(format!(
                "{what}: a message of {} bytes: expected at most {MAX_MESSAGE_BYTES}",
                data.len()
            )));
        }
        if peer == self.rank {
            s.mailbox.push((peer, kind, tag), data.to_vec());
            return Ok(());
        }
        let conn = s.peers[peer]
            .as_ref()
            .ok_or_else(|| Error::Internal(format!("no connection to rank {peer}")))?;
        if let Some(why) = s.mailbox.dead_reason(peer) {
            return Err(Error::remote(peer, format!("{what}: {why}")));
        }
        let mut broken = lock(&conn.broken);
        if let Some(why) = &*broken {
            return Err(Error::remote(
                peer,
                format!("{what}: the connection is unusable: {why}"),
            ));
        }
        let header = encode_frame_header(kind, tag, data.len());
        let mut result = write_all_by(&conn.stream, &header, deadline);
        if result.is_ok() && !data.is_empty() {
            result = write_all_by(&conn.stream, data, deadline);
        }
        result.map_err(|e| {
            let err = match e {
                None => deadline.timeout_error(format!(
                    "{what}: sending {} bytes to rank {peer} (it is not reading)",
                    data.len()
                )),
                Some(e) => {
                    let why = format!("sending to rank {peer} ({}) failed: {e}", conn.addr);
                    s.mailbox.mark_dead(peer, why.clone());
                    Error::remote(peer, format!("{what}: {why}"))
                }
            };
            *broken = Some(err.to_string());
            err
        })
    }

    /// Why `peer` failed (its connection closed without a goodbye: it died, was killed or
    /// lost the network), if it did. Never blocks.
    pub fn peer_failure(&self, peer: usize) -> Option<String> {
        self.session.as_ref()?.mailbox.failure(peer)
    }

    /// The lowest rank that failed (see [`TcpBootstrap::peer_failure`]) and why.
    pub fn first_peer_failure(&self) -> Option<(usize, String)> {
        self.session.as_ref()?.mailbox.first_failure()
    }

    /// [`Bootstrap::recv`] with its own timeout instead of the one given to `initialize`.
    pub fn recv_timeout(&self, peer: usize, tag: u64, timeout: Duration) -> Result<Vec<u8>> {
        let s = self.session("recv")?;
        self.check_peer("recv", peer)?;
        let what = format!(
            "receiving a message with tag {} from rank {peer}",
            show_tag(tag)
        );
        s.mailbox
            .take((peer, KIND_USER, tag), &Deadline::after(timeout), &what)
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

    /// Runs collective `op` under one deadline; a failure disables later collectives here.
    fn collective<T>(
        &self,
        op: &str,
        body: impl FnOnce(&Session, &Deadline, &str) -> Result<T>,
    ) -> Result<T> {
        let s = self.session(op)?;
        let mut st = lock(&s.collective);
        if let Some((peer, why)) = &st.failed {
            let msg = format!(
                "{op}: an earlier collective failed on rank {} ({why}), so the ranks' collective \
                 messages no longer match: expected a new TcpBootstrap",
                self.rank
            );
            return Err(match peer {
                Some(p) => Error::remote(*p, msg),
                None => Error::Aborted(msg),
            });
        }
        let what = format!("{op} on rank {}", self.rank);
        let r = body(s, &Deadline::after(s.timeout), &what);
        if let Err(e) = &r {
            let peer = match e {
                Error::Remote { peer, .. } => Some(*peer),
                _ => None,
            };
            st.failed = Some((peer, e.to_string()));
        }
        r
    }

    /// Sends `data` to every rank of `to`, then takes one message from every rank of `from`.
    #[allow(clippy::too_many_arguments)] // one all-to-all step: session, peers, payload
    fn exchange(
        &self,
        s: &Session,
        d: &Deadline,
        what: &str,
        tag: u64,
        data: &[u8],
        to: &[usize],
        from: &[usize],
    ) -> Result<Vec<Vec<u8>>> {
        for &peer in to {
            self.send_kind(KIND_COLLECTIVE, data, peer, tag, d, what)?;
        }
        let keys: Vec<MailKey> = from.iter().map(|&p| (p, KIND_COLLECTIVE, tag)).collect();
        s.mailbox.take_all(&keys, d, what)
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
    fn peer_failure(&self, peer: usize) -> Option<String> {
        TcpBootstrap::peer_failure(self, peer)
    }

    fn first_peer_failure(&self) -> Option<(usize, String)> {
        TcpBootstrap::first_peer_failure(self)
    }

    fn operation_timeout(&self) -> Option<Duration> {
        self.session.as_ref().map(|s| s.timeout)
    }

    fn send(&self, data: &[u8], peer: usize, tag: u64) -> Result<()> {
        let s = self.session("send")?;
        let what = format!(
            "sending a message with tag {} to rank {peer}",
            show_tag(tag)
        );
        let d = Deadline::after(s.timeout);
        self.send_kind(KIND_USER, data, peer, tag, &d, &what)
    }

    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        let timeout = self.session("recv")?.timeout;
        self.recv_timeout(peer, tag, timeout)
    }

    fn try_recv(&self, peer: usize, tag: u64) -> Result<Option<Vec<u8>>> {
        let s = self.session("try_recv")?;
        self.check_peer("try_recv", peer)?;
        Ok(s.mailbox.try_take((peer, KIND_USER, tag)))
    }

    fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (me, n) = (self.rank, self.nranks);
        self.collective("all_gather", |s, d, what| {
            // Ring order spreads the load: rank r sends to r+1, r+2, ... (receives all at once).
            let to: Vec<usize> = (1..n).map(|k| (me + k) % n).collect();
            let from: Vec<usize> = (0..n).filter(|&p| p != me).collect();
            let got = self.exchange(s, d, what, TAG_ALL_GATHER, data, &to, &from)?;
            let mut out = Vec::with_capacity(n);
            let mut got = got.into_iter();
            for p in 0..n {
                out.push(if p == me {
                    data.to_vec()
                } else {
                    got.next().unwrap_or_default()
                });
            }
            Ok(out)
        })
    }

    fn barrier(&self) -> Result<()> {
        self.all_gather(&[]).map(|_| ())
    }

    fn broadcast(&self, data: &[u8], root: usize) -> Result<Vec<u8>> {
        self.session("broadcast")?;
        if root >= self.nranks {
            return Err(Error::invalid(format!(
                "broadcast root {root}: expected a rank below nranks {}",
                self.nranks
            )));
        }
        let me = self.rank;
        self.collective("broadcast", |s, d, what| {
            if me == root {
                let to: Vec<usize> = (0..self.nranks).filter(|&p| p != root).collect();
                self.exchange(s, d, what, TAG_BROADCAST, data, &to, &[])?;
                Ok(data.to_vec())
            } else {
                let mut got = self.exchange(s, d, what, TAG_BROADCAST, &[], &[], &[root])?;
                Ok(got.pop().unwrap_or_default())
            }
        })
    }

    fn group_barrier(&self, ranks: &[usize]) -> Result<()> {
        self.session("group_barrier")?;
        let me = self.rank;
        check_group(ranks, me, self.nranks)?;
        let others: Vec<usize> = ranks.iter().copied().filter(|&p| p != me).collect();
        self.collective("group_barrier", |s, d, what| {
            self.exchange(s, d, what, TAG_GROUP_BARRIER, &[], &others, &others)
                .map(|_| ())
        })
    }
}

/// `TcpBootstrap` is `Send + Sync` (checked at compile time).
const _: fn() = || {
    fn is<T: Send + Sync>() {}
    is::<TcpBootstrap>();
};

#[cfg(test)]
mod tests {
    use super::*;

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
