//! Connections: a value type over the transport object chosen per peer at run time.
//!
//! [`Connection`] wraps an `Arc<dyn BaseConnection>`; cloning it shares the transport. Every
//! operation is bounds-checked here, against both memories, before the transport sees it, so
//! a transport never writes outside a registered range. Transports: `ipc` (CudaIpc, same
//! host: GPU copies on a context-owned stream, memcpy on the host backend) and `ethernet`
//! (TCP with a receive thread, any two hosts) and `ib` (an RC queue pair per connection;
//! Host and HostNoAtomic signalling).
//!
//! # Failure
//! A connection knows its peer's rank when the [`crate::Communicator`] built it (errors then
//! say "rank 3"; else they name the peer's address). The first fatal error of an operation (the
//! peer closed or died, a flush timed out behind a frozen peer, a transport error) marks the
//! connection broken: every later operation fails at once with [`Error::Remote`] (or an I/O
//! error naming the address where no rank is known), carrying that first error.
//! [`Connection::health`] reports what the transport already knows about the peer without
//! blocking (waits poll it), and [`Connection::abort`] breaks a connection from outside, waking
//! an operation blocked on the peer (the proxy's stop deadline uses it). Invalid arguments and
//! writes the peer rejected are reported but do not break the connection.

pub(crate) mod ethernet;
#[cfg(test)]
mod fuzz;
pub(crate) mod ib;
pub(crate) mod ipc;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, ErrorCode, Result};
use crate::registered_memory::RegisteredMemory;
use crate::transport::{Device, Transport};

/// What a transport does. Implementations are shared between threads; `write` and
/// `update_and_sync` are asynchronous with respect to the peer (ordered among themselves per
/// connection) and `flush` waits until all earlier ones are complete at the peer.
///
/// Arguments arrive already checked by [`Connection`]: ranges lie inside both memories, the
/// source is local, the destination is reachable over this transport, and `update_and_sync`'s
/// destination is an 8-byte aligned u64.
pub trait BaseConnection: Send + Sync {
    /// Copies `size` bytes from `src + src_offset` (local) to `dst + dst_offset` (remote).
    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &RegisteredMemory,
        src_offset: u64,
        size: u64,
    ) -> Result<()>;
    /// Stores `new_value` into `src` and makes the u64 at `dst + dst_offset` equal to it,
    /// after every earlier write of this connection.
    fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()>;
    /// Waits (at most `timeout`) until every earlier operation is complete at the peer.
    fn flush(&self, timeout: Duration) -> Result<()>;
    /// This side's transport.
    fn transport(&self) -> Transport;
    /// The peer's transport.
    fn remote_transport(&self) -> Transport;
    /// The device of the local endpoint.
    fn local_device(&self) -> Device;
    /// `Ok` unless the transport already knows the peer is gone (closed, died, QP in error);
    /// never blocks. The default knows nothing (CudaIpc: no liveness signal).
    fn health(&self) -> Result<()> {
        Ok(())
    }
    /// Breaks the transport with `reason`: operations blocked on the peer return, later ones
    /// fail. The default does nothing (CudaIpc operations are bounded by their timeouts).
    fn abort(&self, _reason: &str) {}
}

/// Who is on the other side of a connection: the rank when known, and the address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) rank: Option<usize>,
    pub(crate) addr: String,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.rank, self.addr.is_empty()) {
            (Some(r), true) => write!(f, "rank {r}"),
            (Some(r), false) => write!(f, "rank {r} ({})", self.addr),
            (None, _) => f.write_str(&self.addr),
        }
    }
}

struct ConnState {
    rank: Option<usize>,
    /// Whether `broken` is set (read on every operation without taking the lock).
    is_broken: AtomicBool,
    /// The first fatal error; set once, then every operation fails with it.
    broken: Mutex<Option<String>>,
    /// The bootstrap of the communicator that made it: [`Connection::health`] asks it whether
    /// the peer died (the only liveness signal a CudaIpc connection has).
    liveness: std::sync::OnceLock<std::sync::Weak<dyn crate::bootstrap::Bootstrap>>,
}

static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// A connection to one peer endpoint. A value type: clones share the transport, which closes
/// when the last clone is dropped.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<dyn BaseConnection>,
    id: u64,
    state: Arc<ConnState>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.id)
            .field("transport", &self.inner.transport())
            .field("remote_transport", &self.inner.remote_transport())
            .field("local_device", &self.inner.local_device())
            .field("remote_rank", &self.state.rank)
            .finish()
    }
}

impl Connection {
    /// Wraps a transport object whose peer's rank is unknown.
    pub fn new(inner: Arc<dyn BaseConnection>) -> Connection {
        Connection::with_rank(inner, None)
    }

    /// Wraps a transport object connected to rank `rank` (when known): errors name the rank.
    pub fn with_rank(inner: Arc<dyn BaseConnection>, rank: Option<usize>) -> Connection {
        Connection {
            inner,
            id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
            state: Arc::new(ConnState {
                rank,
                is_broken: AtomicBool::new(false),
                broken: Mutex::new(None),
                liveness: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The peer's rank, when the connection was built knowing it (through the communicator).
    pub fn remote_rank(&self) -> Option<usize> {
        self.state.rank
    }

    /// The first fatal error once the connection is broken (see the module docs).
    pub fn broken(&self) -> Option<String> {
        if !self.state.is_broken.load(Ordering::Acquire) {
            return None;
        }
        self.state
            .broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `Ok` while the connection is usable as far as this side knows; the error (naming the
    /// peer) once it is broken or the transport saw the peer go. Never blocks: waits on data
    /// the peer sends poll it.
    pub fn health(&self) -> Result<()> {
        self.check_broken()?;
        let r = self.inner.health();
        self.track(r)?;
        let (Some(rank), Some(b)) = (self.state.rank, self.state.liveness.get()) else {
            return Ok(());
        };
        match b.upgrade().and_then(|b| b.peer_failure(rank)) {
            None => Ok(()),
            Some(why) => {
                let why = format!("the bootstrap lost rank {rank}: {why}");
                self.mark_broken(why.clone());
                Err(Error::remote(rank, why))
            }
        }
    }

    /// From now on [`Connection::health`] also asks `bootstrap` whether the peer failed.
    pub(crate) fn watch_liveness(&self, bootstrap: &Arc<dyn crate::bootstrap::Bootstrap>) {
        let _ = self.state.liveness.set(Arc::downgrade(bootstrap));
    }

    /// Breaks the connection with `reason`: an operation blocked on the peer returns with an
    /// error, every later one fails at once.
    pub fn abort(&self, reason: &str) {
        self.mark_broken(format!("aborted: {reason}"));
        self.inner.abort(reason);
    }

    fn mark_broken(&self, msg: String) {
        let mut b = self.state.broken.lock().unwrap_or_else(|p| p.into_inner());
        if b.is_none() {
            *b = Some(msg);
            self.state.is_broken.store(true, Ordering::Release);
        }
    }

    /// The error of a broken connection, naming the rank when known.
    fn broken_error(&self, first: &str) -> Error {
        let what = format!(
            "{} connection is broken (later operations fail at once): {first}",
            self.inner.transport()
        );
        match self.state.rank {
            Some(r) => Error::remote(r, what),
            None => Error::io(
                what,
                std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "connection broken"),
            ),
        }
    }

    fn check_broken(&self) -> Result<()> {
        match self.broken() {
            Some(first) => Err(self.broken_error(&first)),
            None => Ok(()),
        }
    }

    /// Marks the connection broken when `r` is a fatal error (anything but invalid usage: a
    /// bad argument or a write the peer rejected leaves the connection usable).
    fn track<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if e.code() != ErrorCode::InvalidUsage {
                self.mark_broken(e.to_string());
            }
        }
        r
    }

    /// A process-unique id of this connection (shared by its clones).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Copies `size` bytes from local `src + src_offset` to `dst + dst_offset` at the peer.
    /// Errors (never writes) when a range is outside its memory, `src` is not local, or `dst`
    /// is not reachable over this connection's transport.
    pub fn write(
        &self,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &RegisteredMemory,
        src_offset: u64,
        size: u64,
    ) -> Result<()> {
        check_range("write destination", dst, dst_offset, size)?;
        check_range("write source", src, src_offset, size)?;
        if src.data() == 0 {
            return Err(Error::invalid(format!(
                "write: expected a source memory usable in this process, got {:#x} (+{} bytes) \
                 registered by another host",
                src.original_data_ptr(),
                src.size()
            )));
        }
        self.check_reachable("write", dst)?;
        self.check_broken()?;
        if size == 0 {
            return Ok(());
        }
        let r = self.inner.write(dst, dst_offset, src, src_offset, size);
        self.track(r)
    }

    /// Stores `new_value` into `src` and makes the u64 at `dst + dst_offset` equal to it after
    /// every earlier write of this connection.
    pub fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()> {
        check_range("update_and_sync destination", dst, dst_offset, 8)?;
        let addr = dst.original_data_ptr().wrapping_add(dst_offset);
        if addr & 7 != 0 {
            return Err(Error::invalid(format!(
                "update_and_sync: expected an 8-byte aligned destination, got {addr:#x}"
            )));
        }
        self.check_reachable("update_and_sync", dst)?;
        self.check_broken()?;
        let r = self.inner.update_and_sync(dst, dst_offset, src, new_value);
        self.track(r)
    }

    /// Waits (at most `timeout`) until every earlier operation is complete at the peer. A
    /// timeout breaks the connection (the peer is frozen or gone); later calls fail at once.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.check_broken()?;
        let r = self.inner.flush(timeout);
        self.track(r)
    }
    /// This side's transport.
    pub fn transport(&self) -> Transport {
        self.inner.transport()
    }
    /// The peer's transport.
    pub fn remote_transport(&self) -> Transport {
        self.inner.remote_transport()
    }
    /// The device of the local endpoint.
    pub fn local_device(&self) -> Device {
        self.inner.local_device()
    }
    /// The transport object.
    pub fn base(&self) -> &Arc<dyn BaseConnection> {
        &self.inner
    }

    fn check_reachable(&self, op: &str, dst: &RegisteredMemory) -> Result<()> {
        let t = self.inner.remote_transport();
        if !dst.transports().has(t) {
            return Err(Error::invalid(format!(
                "{op}: destination memory {:#x} is registered for {:?}, expected it to include \
                 this connection's transport {t}",
                dst.original_data_ptr(),
                dst.transports()
            )));
        }
        if t == Transport::CudaIpc && dst.data() == 0 {
            return Err(Error::invalid(format!(
                "{op}: CudaIpc destination {:#x} is not mapped in this process (registered on \
                 another host)",
                dst.original_data_ptr()
            )));
        }
        // An imported mapping whose registration the owner has dropped: never write into it
        // (the owner may have registered other data there).
        dst.check_live(op)
    }
}

fn check_range(what: &str, mem: &RegisteredMemory, offset: u64, size: u64) -> Result<()> {
    match offset.checked_add(size) {
        Some(end) if end <= mem.size() as u64 => Ok(()),
        _ => Err(Error::invalid(format!(
            "{what}: expected offset + size within the memory's {} bytes, got offset {offset} + \
             size {size}",
            mem.size()
        ))),
    }
}
