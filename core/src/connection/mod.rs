//! Connections: a value type over the transport object chosen per peer at run time.
//!
//! [`Connection`] wraps an `Arc<dyn BaseConnection>`; cloning it shares the transport. Every
//! operation is bounds-checked here, against both memories, before the transport sees it, so
//! a transport never writes outside a registered range. Transports: [`ipc`] (CudaIpc, same
//! host: GPU copies on a context-owned stream, memcpy on the host backend) and [`ethernet`]
//! (TCP with a receive thread, any two hosts) and [`ib`] (an RC queue pair per connection;
//! Host and HostNoAtomic signalling).

pub(crate) mod ethernet;
pub(crate) mod ib;
pub(crate) mod ipc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
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
}

static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// A connection to one peer endpoint. A value type: clones share the transport, which closes
/// when the last clone is dropped.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<dyn BaseConnection>,
    id: u64,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.id)
            .field("transport", &self.inner.transport())
            .field("remote_transport", &self.inner.remote_transport())
            .field("local_device", &self.inner.local_device())
            .finish()
    }
}

impl Connection {
    /// Wraps a transport object (the IB transport uses this too).
    pub fn new(inner: Arc<dyn BaseConnection>) -> Connection {
        Connection {
            inner,
            id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
        }
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
        if size == 0 {
            return Ok(());
        }
        self.inner.write(dst, dst_offset, src, src_offset, size)
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
        self.inner.update_and_sync(dst, dst_offset, src, new_value)
    }

    /// Waits (at most `timeout`) until every earlier operation is complete at the peer.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.inner.flush(timeout)
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
        Ok(())
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
