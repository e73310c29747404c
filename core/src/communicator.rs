//! The communicator: a bootstrap plus a context. Exchanges memories, endpoints and semaphore
//! tokens with peers and returns [`Future`]s.
//!
//! # Tags
//! Communicator tags are user tags in `0..=u32::MAX`. On the bootstrap they become
//! `COMM_TAG_BASE | kind << 32 | tag` (kind 1 = memory, 2 = endpoint, 3 = semaphore token, 4 = NVLS setup), so
//! they never collide with each other, with plain bootstrap users (who must stay below
//! [`COMM_TAG_BASE`]), or with the bootstrap's own collectives
//! ([`crate::bootstrap::RESERVED_TAG_BASE`] and up).
//!
//! # Ordering
//! For one `(remote rank, bootstrap tag)` every receive takes a ticket when it is called; its
//! future's `get` receives messages in ticket order, keeping the ones that belong to earlier
//! tickets, so receives complete in call order whatever order the futures are waited.
//! Messages sent to this rank itself are queued in process.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::bootstrap::Bootstrap;
use crate::connection::Connection;
use crate::context::Context;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::future::Future;
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::{Semaphore, SemaphoreStub};
use crate::transport::{EndpointConfig, TransportFlags};

/// The first bootstrap tag the communicator uses; plain bootstrap users stay below it.
pub const COMM_TAG_BASE: u64 = 0xFFFF_0000_0000_0000;
const KIND_MEMORY: u64 = 1;
const KIND_ENDPOINT: u64 = 2;
const KIND_SEMAPHORE: u64 = 3;
/// NVLS connection setup ([`crate::NvlsConnection::connect_collective`]): steps 0..=2.
pub(crate) const KIND_NVLS: u64 = 4;

pub(crate) fn wire_tag(kind: u64, tag: u64) -> Result<u64> {
    if tag > u64::from(u32::MAX) {
        return Err(Error::invalid(format!(
            "communicator tag {tag}: expected a tag in 0..={}",
            u32::MAX
        )));
    }
    Ok(COMM_TAG_BASE | (kind << 32) | tag)
}

#[derive(Default)]
struct KeyState {
    /// Tickets handed out (receives called).
    issued: u64,
    /// Messages received from the bootstrap so far.
    received: u64,
    /// Results of received tickets not yet taken by their futures.
    ready: HashMap<u64, Result<Vec<u8>>>,
}

/// Per `(remote rank, bootstrap tag)`: the ticket state of its receives.
type KeyMap = HashMap<(usize, u64), Arc<Mutex<KeyState>>>;

struct Inner {
    bootstrap: Arc<dyn Bootstrap>,
    context: Context,
    keys: Mutex<KeyMap>,
    to_self: Mutex<HashMap<u64, VecDeque<Vec<u8>>>>,
    connections: Mutex<HashMap<u64, (usize, u64)>>,
    /// Set by [`Communicator::abort`]: the process's abort word, raised until the
    /// communicator is dropped.
    aborted: Mutex<Option<mscclpp_hal::abort::Hold>>,
}

/// Raises the process's abort word ([`mscclpp_hal::abort`]) for the kernels of a GPU build,
/// which poll it in every device wait; `None` on the host backend, whose waits end through
/// their watches and connection liveness (a word there would end the waits of every
/// communicator of the process). Held until the returned hold is dropped.
pub fn raise_device_abort(
    peer: Option<usize>,
    why: impl Into<String>,
) -> Option<mscclpp_hal::abort::Hold> {
    use mscclpp_hal::Api;
    if <mscclpp_hal::Gpu as Api>::NAME == <mscclpp_hal::api::Host as Api>::NAME {
        return None;
    }
    Some(mscclpp_hal::abort::raise(peer, why))
}

impl Inner {
    fn send(&self, data: &[u8], peer: usize, wire: u64) -> Result<()> {
        if peer == self.bootstrap.rank() {
            self.to_self
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(wire)
                .or_default()
                .push_back(data.to_vec());
            return Ok(());
        }
        self.bootstrap.send(data, peer, wire)
    }

    fn recv_now(&self, peer: usize, wire: u64) -> Result<Vec<u8>> {
        if peer == self.bootstrap.rank() {
            return self
                .to_self
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(&wire)
                .and_then(|q| q.pop_front())
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "receive from self (rank {peer}) under bootstrap tag {wire:#x}: expected \
                         an earlier send to self, found none"
                    ))
                });
        }
        self.bootstrap.recv(peer, wire)
    }

    /// Takes a ticket for the next message from `peer` under `wire`.
    fn ticket(&self, peer: usize, wire: u64) -> Result<(Arc<Mutex<KeyState>>, u64)> {
        let n = self.bootstrap.nranks();
        if peer >= n {
            return Err(Error::invalid(format!(
                "remote rank {peer}: expected a rank below nranks {n}"
            )));
        }
        let key = Arc::clone(
            self.keys
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry((peer, wire))
                .or_default(),
        );
        let t = {
            let mut k = key.lock().unwrap_or_else(|p| p.into_inner());
            k.issued += 1;
            k.issued - 1
        };
        Ok((key, t))
    }

    /// Completes every ticket up to `ticket` in order and returns its message.
    fn redeem(
        &self,
        key: &Mutex<KeyState>,
        peer: usize,
        wire: u64,
        ticket: u64,
    ) -> Result<Vec<u8>> {
        let mut k = key.lock().unwrap_or_else(|p| p.into_inner());
        while k.received <= ticket {
            let r = self.recv_now(peer, wire);
            let t = k.received;
            k.ready.insert(t, r);
            k.received += 1;
        }
        k.ready.remove(&ticket).unwrap_or_else(|| {
            Err(Error::Internal(format!(
                "ticket {ticket} of rank {peer} tag {wire:#x} was taken twice"
            )))
        })
    }

    fn recv_future<T: Send + 'static>(
        self: &Arc<Self>,
        peer: usize,
        wire: u64,
        then: impl FnOnce(&Arc<Inner>, Vec<u8>) -> Result<T> + Send + 'static,
    ) -> Future<T> {
        match self.ticket(peer, wire) {
            Err(e) => Future::ready(Err(e)),
            Ok((key, ticket)) => {
                let me = Arc::clone(self);
                Future::new(move || {
                    let bytes = me.redeem(&key, peer, wire, ticket)?;
                    then(&me, bytes)
                })
            }
        }
    }
}

/// A bootstrap and a context: the entry point for setting up communication with peers.
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.inner.bootstrap.rank())
            .field("nranks", &self.inner.bootstrap.nranks())
            .finish()
    }
}

impl Communicator {
    /// A communicator over `bootstrap` and `context`.
    pub fn new(bootstrap: Arc<dyn Bootstrap>, context: Context) -> Communicator {
        Communicator {
            inner: Arc::new(Inner {
                bootstrap,
                context,
                keys: Mutex::new(HashMap::new()),
                to_self: Mutex::new(HashMap::new()),
                connections: Mutex::new(HashMap::new()),
                aborted: Mutex::new(None),
            }),
        }
    }

    /// Aborts: raises the process's abort word ([`mscclpp_hal::abort`]), so every device-side
    /// wait of this process (kernels on GPUs, `device_emu` waits on the host backend) ends
    /// within milliseconds instead of at its spin bound or timeout, and a later stream or event
    /// synchronisation of that work returns an aborted error. The word stays up until this
    /// communicator (every clone) is dropped; then the devices drain and it is lowered. Its
    /// scope is the process: waits of other communicators end too (docs/reliability.md).
    pub fn abort(&self, why: &str) {
        let mut a = self.inner.aborted.lock().unwrap_or_else(|p| p.into_inner());
        if a.is_none() {
            let rank = self.inner.bootstrap.rank();
            *a = Some(mscclpp_hal::abort::raise(
                None,
                format!("Communicator::abort on rank {rank}: {why}"),
            ));
        }
    }

    /// Whether [`Communicator::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.inner
            .aborted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The bootstrap.
    pub fn bootstrap(&self) -> &Arc<dyn Bootstrap> {
        &self.inner.bootstrap
    }
    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.context
    }

    /// Registers memory with the context (see [`Context::register_memory`]).
    pub fn register_memory(
        &self,
        ptr: u64,
        size: usize,
        transports: TransportFlags,
    ) -> Result<RegisteredMemory> {
        self.inner.context.register_memory(ptr, size, transports)
    }

    /// Sends `memory` to `remote_rank` under `tag` (may be this rank).
    pub fn send_memory(
        &self,
        memory: &RegisteredMemory,
        remote_rank: usize,
        tag: u64,
    ) -> Result<()> {
        let wire = wire_tag(KIND_MEMORY, tag)?;
        self.check_rank(remote_rank)?;
        self.inner.send(&memory.serialize(), remote_rank, wire)
    }

    /// Receives the next memory `remote_rank` sends under `tag`.
    pub fn recv_memory(&self, remote_rank: usize, tag: u64) -> Future<RegisteredMemory> {
        match wire_tag(KIND_MEMORY, tag) {
            Err(e) => Future::ready(Err(e)),
            Ok(wire) => self
                .inner
                .recv_future(remote_rank, wire, |_, b| RegisteredMemory::deserialize(&b)),
        }
    }

    /// Creates an endpoint of `config`, sends it to `remote_rank` under `tag` now, and returns
    /// a future that receives the peer's endpoint and connects the two.
    pub fn connect(
        &self,
        config: impl Into<EndpointConfig>,
        remote_rank: usize,
        tag: u64,
    ) -> Future<Connection> {
        let config = config.into();
        let start = || -> Result<(Endpoint, u64)> {
            let wire = wire_tag(KIND_ENDPOINT, tag)?;
            self.check_rank(remote_rank)?;
            let local = self.inner.context.create_endpoint(config)?;
            self.inner.send(&local.serialize(), remote_rank, wire)?;
            Ok((local, wire))
        };
        match start() {
            Err(e) => Future::ready(Err(e)),
            Ok((local, wire)) => self
                .inner
                .recv_future(remote_rank, wire, move |inner, bytes| {
                    let remote = Endpoint::deserialize(&bytes)?;
                    // The caller's timeout: the context's when set, else the bootstrap's.
                    let timeout = inner
                        .context
                        .explicit_connect_timeout()
                        .or_else(|| inner.bootstrap.operation_timeout())
                        .unwrap_or(crate::context::DEFAULT_CONNECT_TIMEOUT);
                    let conn =
                        inner
                            .context
                            .connect_to(&local, &remote, Some(remote_rank), timeout)?;
                    conn.watch_liveness(&inner.bootstrap);
                    inner
                        .connections
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(conn.id(), (remote_rank, tag));
                    Ok(conn)
                }),
        }
    }

    /// Allocates a local token for `connection`, sends it to `remote_rank` under `tag` now,
    /// and returns a future that receives the peer's token and joins them.
    pub fn build_semaphore(
        &self,
        connection: &Connection,
        remote_rank: usize,
        tag: u64,
    ) -> Future<Semaphore> {
        let start = || -> Result<(SemaphoreStub, u64)> {
            let wire = wire_tag(KIND_SEMAPHORE, tag)?;
            self.check_rank(remote_rank)?;
            let stub = SemaphoreStub::new(&self.inner.context, connection)?;
            self.inner
                .send(&stub.memory().serialize(), remote_rank, wire)?;
            Ok((stub, wire))
        };
        match start() {
            Err(e) => Future::ready(Err(e)),
            Ok((stub, wire)) => {
                let conn = connection.clone();
                self.inner.recv_future(remote_rank, wire, move |_, bytes| {
                    let remote = RegisteredMemory::deserialize(&bytes)?;
                    Semaphore::new(stub, remote, conn)
                })
            }
        }
    }

    /// The remote rank of a connection made by this communicator.
    pub fn remote_rank_of(&self, connection: &Connection) -> Result<usize> {
        self.info_of(connection).map(|(r, _)| r)
    }

    /// The tag of a connection made by this communicator.
    pub fn tag_of(&self, connection: &Connection) -> Result<u64> {
        self.info_of(connection).map(|(_, t)| t)
    }

    fn info_of(&self, connection: &Connection) -> Result<(usize, u64)> {
        self.inner
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&connection.id())
            .copied()
            .ok_or_else(|| {
                Error::invalid(format!(
                    "connection {} was not made by this communicator",
                    connection.id()
                ))
            })
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        let n = self.inner.bootstrap.nranks();
        if rank >= n {
            return Err(Error::invalid(format!(
                "remote rank {rank}: expected a rank below nranks {n}"
            )));
        }
        Ok(())
    }
}
