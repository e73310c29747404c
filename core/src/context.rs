//! The context: registers memory, creates endpoints and connects them. Owns the per-device
//! streams CudaIpc connections copy on.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mscclpp_hal::{prelude::*, Gpu};

use crate::connection::ethernet::EthernetConnection;
use crate::connection::ib::IbConnection;
use crate::connection::ipc::IpcConnection;
use crate::connection::Connection;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::ib::qp::IbQp;
use crate::memory::{
    adopt_allocation, find_allocation, gpu_device, hal_err, host_addressable, LocalMemory,
};
use crate::registered_memory::RegisteredMemory;
use crate::serialize::encode_socket_addr;
use crate::transport::{DeviceType, EndpointConfig, Transport, TransportFlags};

/// How long [`Context::connect`] waits for the peer when nobody set a timeout (Ethernet
/// pairing). The communicator uses its bootstrap's timeout instead when it has one.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// The library's context. Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

struct ContextInner {
    streams: Mutex<HashMap<i32, Arc<<Gpu as Api>::Stream>>>,
    /// Set by [`Context::set_connect_timeout`]; `None`: the caller's (or the default).
    connect_timeout: Mutex<Option<Duration>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// A new context. Devices and streams are opened lazily.
    pub fn new() -> Result<Context> {
        Ok(Context {
            inner: Arc::new(ContextInner {
                streams: Mutex::new(HashMap::new()),
                connect_timeout: Mutex::new(None),
            }),
        })
    }

    /// How long `connect` waits for the peer: the one set with [`Context::set_connect_timeout`],
    /// else [`DEFAULT_CONNECT_TIMEOUT`].
    pub fn connect_timeout(&self) -> Duration {
        self.explicit_connect_timeout()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
    }

    /// The timeout set with [`Context::set_connect_timeout`], if any.
    pub fn explicit_connect_timeout(&self) -> Option<Duration> {
        *self
            .inner
            .connect_timeout
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Sets how long `connect` waits for the peer (also for connections the communicator
    /// makes, overriding its bootstrap's timeout).
    pub fn set_connect_timeout(&self, timeout: Duration) {
        *self
            .inner
            .connect_timeout
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(timeout);
    }

    /// Registers `size` bytes at device address `ptr` for `transports`; CudaIpc exports it for
    /// processes on this host. `ptr..ptr+size` lies inside a live allocation made through
    /// [`LocalMemory`] (the registration keeps it alive), or inside one allocation the
    /// application made on the current GPU: `cudaMalloc`/`cuMemAlloc` memory, a cuMem/VMM
    /// mapping made with a shareable handle type (POSIX fd or fabric), a PyTorch tensor; on the
    /// host backend a MAP_SHARED memfd or file mapping. Such memory the application keeps alive
    /// while the registration (and every peer's import of it) is used. Memory no peer can map
    /// (private `malloc` memory, managed memory, VMM memory without a shareable handle type, a
    /// range spanning two allocations) is an error naming the pointer and why.
    pub fn register_memory(
        &self,
        ptr: u64,
        size: usize,
        transports: TransportFlags,
    ) -> Result<RegisteredMemory> {
        if size == 0 {
            return Err(Error::invalid(format!(
                "register_memory({ptr:#x}): expected a size above 0, got 0"
            )));
        }
        if transports.has(Transport::Unknown) {
            return Err(Error::invalid(
                "register_memory: transports contain Unknown".to_string(),
            ));
        }
        let (alloc, offset) = match find_allocation(ptr, size) {
            Some(found) => found,
            None => adopt_allocation(ptr, size)?,
        };
        RegisteredMemory::register_local(alloc, offset, size, transports)
    }

    /// Registers the whole of `mem` for `transports`.
    pub fn register_buffer(
        &self,
        mem: &LocalMemory,
        transports: TransportFlags,
    ) -> Result<RegisteredMemory> {
        if transports.has(Transport::Unknown) {
            return Err(Error::invalid(
                "register_buffer: transports contain Unknown".to_string(),
            ));
        }
        RegisteredMemory::register_local(mem.allocation().clone(), 0, mem.size(), transports)
    }

    /// Creates an endpoint of `config` (Ethernet: a listening socket on the interface chosen by
    /// `MSCCLPP_SOCKET_IFNAME` / `MSCCLPP_SOCKET_FAMILY`).
    pub fn create_endpoint(&self, config: EndpointConfig) -> Result<Endpoint> {
        if config.max_write_queue_size < -1 || config.max_write_queue_size == 0 {
            return Err(Error::invalid(format!(
                "create_endpoint: max_write_queue_size: expected -1 or a positive size, got {}",
                config.max_write_queue_size
            )));
        }
        if config.device.kind == DeviceType::Gpu {
            gpu_device(config.device.id)?;
        }
        match config.transport {
            Transport::Unknown => Err(Error::invalid(
                "create_endpoint: expected a transport, got Unknown".to_string(),
            )),
            Transport::CudaIpc => Ok(Endpoint::new_local(config, Vec::new(), None)),
            Transport::Ethernet => {
                let iface = crate::bootstrap::select_interface()?;
                let unspecified = match iface.addr {
                    IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                };
                let listener = TcpListener::bind(SocketAddr::new(unspecified, 0)).map_err(|e| {
                    Error::io(format!("bind Ethernet endpoint on {unspecified}"), e)
                })?;
                let port = listener
                    .local_addr()
                    .map_err(|e| Error::io("Ethernet endpoint local_addr", e))?
                    .port();
                let advertised = SocketAddr::new(iface.addr, port);
                Ok(Endpoint::new_local(
                    config,
                    encode_socket_addr(advertised),
                    Some(listener),
                ))
            }
            t if t.is_ib() => {
                let (payload, qp) = IbQp::create(&config)?;
                Ok(Endpoint::new_local_ib(config, payload, qp))
            }
            t => Err(Error::invalid(format!(
                "create_endpoint: expected a concrete transport, got {t}"
            ))),
        }
    }

    /// Connects `local` (created by this context) to `remote` (the peer's endpoint). Both
    /// sides call this; the transports must match and be able to reach each other. Waits at
    /// most [`Context::connect_timeout`]; errors name the peer by address.
    pub fn connect(&self, local: &Endpoint, remote: &Endpoint) -> Result<Connection> {
        self.connect_to(local, remote, None, self.connect_timeout())
    }

    /// [`Context::connect`] to the endpoint of rank `rank` (when known: errors then name the
    /// rank), waiting at most `timeout` for the peer. Both sides return `Ok` only together
    /// (Ethernet confirms the pairing both ways).
    pub fn connect_to(
        &self,
        local: &Endpoint,
        remote: &Endpoint,
        rank: Option<usize>,
        timeout: Duration,
    ) -> Result<Connection> {
        if timeout.is_zero() {
            return Err(Error::invalid(
                "connect: timeout 0: expected a positive timeout".to_string(),
            ));
        }
        if !local.is_local() {
            return Err(Error::invalid(format!(
                "connect: expected a local endpoint created by this process, got a deserialized \
                 {} endpoint",
                local.transport()
            )));
        }
        let (lt, rt) = (local.transport(), remote.transport());
        if lt != rt {
            return Err(Error::invalid(format!(
                "connect: cannot pair a local {lt} endpoint with a remote {rt} endpoint: \
                 expected the same transport on both sides"
            )));
        }
        match lt {
            Transport::CudaIpc => {
                if local.host_hash() != remote.host_hash() {
                    return Err(Error::invalid(format!(
                        "connect: local {lt} and remote {rt} endpoints are on different hosts \
                         (host hash {:#x} vs {:#x}); CudaIpc needs both on one host, use \
                         Ethernet or IB between hosts",
                        local.host_hash(),
                        remote.host_hash()
                    )));
                }
                let device = local.device();
                let stream = if host_addressable(device) {
                    None
                } else {
                    Some(self.stream_for(device.id)?)
                };
                Ok(Connection::with_rank(
                    Arc::new(IpcConnection::new(device, stream)),
                    rank,
                ))
            }
            Transport::Ethernet => {
                let conn = EthernetConnection::connect(local, remote, timeout, rank)?;
                Ok(Connection::with_rank(Arc::new(conn), rank))
            }
            t if t.is_ib() => {
                let qp = local.take_ib_qp().ok_or_else(|| {
                    Error::invalid(format!(
                        "connect: the local {t} endpoint was already connected (an IB endpoint \
                         owns one queue pair and connects once)"
                    ))
                })?;
                let conn = IbConnection::connect(local, remote, qp, rank)?;
                Ok(Connection::with_rank(Arc::new(conn), rank))
            }
            t => Err(Error::invalid(format!(
                "connect: expected a concrete transport, got {t}"
            ))),
        }
    }

    /// The context's copy stream on GPU `id` (created on first use).
    pub(crate) fn stream_for(&self, id: i32) -> Result<Arc<<Gpu as Api>::Stream>> {
        let mut map = self.inner.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = map.get(&id) {
            return Ok(Arc::clone(s));
        }
        let dev = gpu_device(id)?;
        let s = Arc::new(
            Gpu::create_stream(&dev)
                .map_err(|e| hal_err(&format!("create stream on GPU {id}"), e))?,
        );
        map.insert(id, Arc::clone(&s));
        Ok(s)
    }
}
