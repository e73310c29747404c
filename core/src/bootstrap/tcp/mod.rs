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
//!
//! # Files
//! [`address`] parses where the root is ([`InitAddr`]); `wire` lays out the setup messages and
//! frame constants; `root` is rank 0's setup server; `mailbox` holds the receive threads and the
//! `(peer, kind, tag)` queues; `mesh` is a rank's side of setup (hello, table, full mesh) and the
//! session it leaves; this file is [`TcpBootstrap`] itself (send, receive, collectives).

mod address;
mod mailbox;
mod mesh;
mod root;
mod wire;

pub use address::InitAddr;

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use self::mesh::{Member, Session};
use self::root::run_root;
use self::wire::{FRAME_HEADER, KIND_COLLECTIVE, KIND_USER};
use super::netif::{iface_bind_addr, select_interface};
use super::socket::{bind_listener, lock, random_u64, write_all_by, Cancel, Deadline};
use super::unique_id::UniqueId;
use super::{check_group, Bootstrap};
use crate::error::{Error, Result};

/// Listeners reserved by `create_unique_id`, by nonce, for rank 0 of this process to take.
fn reserved_listeners() -> &'static Mutex<HashMap<u64, TcpListener>> {
    static RESERVED: OnceLock<Mutex<HashMap<u64, TcpListener>>> = OnceLock::new();
    RESERVED.get_or_init(|| Mutex::new(HashMap::new()))
}

const TAG_ALL_GATHER: u64 = 1;
const TAG_BROADCAST: u64 = 2;
const TAG_GROUP_BARRIER: u64 = 3;

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

        let me = Member {
            rank: self.rank,
            nranks: self.nranks,
        };
        let joined = me.join(root, nonce, ifname.as_deref(), &deadline, &root_failed);
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
    fn new_checks_rank() {
        assert!(TcpBootstrap::new(0, 0).is_err());
        assert!(TcpBootstrap::new(2, 2).is_err());
        let b = TcpBootstrap::new(1, 2).expect("valid");
        assert_eq!(b.nranks_per_node(), 0);
        let e = b.send(&[1], 0, 0).expect_err("not initialized");
        assert_eq!(e.code(), crate::ErrorCode::InvalidUsage);
    }
}
