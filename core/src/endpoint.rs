//! Endpoints: one side of a future connection, created by a [`crate::Context`] and sent to the
//! peer in an explicit, versioned, length-checked format.
//!
//! Wire format (little endian), version 1, inside the `crate::serialize` envelope (magic
//! `MEPT`):
//!
//! | field | type |
//! |---|---|
//! | transport | u8 ([`Transport::to_u8`]) |
//! | device kind | u8 (0 = CPU, 1 = GPU) |
//! | device id | i32 (-1 for the CPU) |
//! | host hash | u64 |
//! | pid hash | u64 |
//! | max write queue size | i32 |
//! | endpoint id | u64 (random; pairs the TCP sockets of an Ethernet connection) |
//! | transport payload | u32 length (at most 4096) + bytes |
//!
//! The transport payload is opaque to this layer: empty for CudaIpc; for Ethernet the
//! listening address (`family u8 (4|6) | 16 address bytes | port u16`); for IB the queue
//! pair's description (port, LID, GID, QP number, PSN, MTU, mode, signal mailbox), versioned
//! and decoded by [`crate::connection`]'s IB transport.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::identity::{fresh_id, local_host_hash};
use crate::serialize::{decode_device, decode_socket_addr, Reader, Writer};
use crate::transport::{Device, DeviceType, EndpointConfig, Transport};

/// Re-exported from [`crate::identity`] (where it lives) for existing callers.
pub use crate::identity::pid_hash;

const MAGIC: &[u8; 4] = b"MEPT";
const VERSION: u16 = 1;
pub use crate::serialize::MAX_TRANSPORT_PAYLOAD;

/// One side of a connection. Cheap to clone. Endpoints created by a local [`crate::Context`]
/// own their transport resources (the Ethernet listening socket); deserialized ones only
/// describe the peer.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<EndpointInner>,
}

struct EndpointInner {
    transport: Transport,
    device: Device,
    host_hash: u64,
    pid_hash: u64,
    max_write_queue_size: i32,
    id: u64,
    payload: Vec<u8>,
    config: Option<EndpointConfig>,
    listener: Option<TcpListener>,
    /// The QP of a local IB endpoint until its connection takes it.
    ib_qp: std::sync::Mutex<Option<crate::ib::qp::IbQp>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("transport", &self.inner.transport)
            .field("device", &self.inner.device)
            .field("host_hash", &format_args!("{:#x}", self.inner.host_hash))
            .field("pid_hash", &format_args!("{:#x}", self.inner.pid_hash))
            .field("local", &self.is_local())
            .finish()
    }
}

impl Endpoint {
    /// A local endpoint of `config` with its transport payload and resources.
    pub(crate) fn new_local(
        config: EndpointConfig,
        payload: Vec<u8>,
        listener: Option<TcpListener>,
    ) -> Endpoint {
        Endpoint {
            inner: Arc::new(EndpointInner {
                transport: config.transport,
                device: config.device,
                host_hash: local_host_hash(),
                pid_hash: pid_hash(),
                max_write_queue_size: config.max_write_queue_size,
                id: fresh_id(),
                payload,
                config: Some(config),
                listener,
                ib_qp: std::sync::Mutex::new(None),
            }),
        }
    }

    /// A local IB endpoint of `config` owning `qp` (its payload describes the QP).
    pub(crate) fn new_local_ib(
        config: EndpointConfig,
        payload: Vec<u8>,
        qp: crate::ib::qp::IbQp,
    ) -> Endpoint {
        let ep = Endpoint::new_local(config, payload, None);
        *ep.inner.ib_qp.lock().unwrap_or_else(|p| p.into_inner()) = Some(qp);
        ep
    }

    /// Takes the QP of a local IB endpoint (an IB endpoint connects once).
    pub(crate) fn take_ib_qp(&self) -> Option<crate::ib::qp::IbQp> {
        self.inner
            .ib_qp
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The transport this endpoint connects over.
    pub fn transport(&self) -> Transport {
        self.inner.transport
    }
    /// The device whose memory and work the endpoint serves.
    pub fn device(&self) -> Device {
        self.inner.device
    }
    /// The host hash of the process that created it.
    pub fn host_hash(&self) -> u64 {
        self.inner.host_hash
    }
    /// The pid hash of the process that created it.
    pub fn pid_hash(&self) -> u64 {
        self.inner.pid_hash
    }
    /// The configured write queue size (-1: the transport's default).
    pub fn max_write_queue_size(&self) -> i32 {
        self.inner.max_write_queue_size
    }
    /// The transport-specific payload (empty for CudaIpc; IB decodes its own).
    pub fn transport_payload(&self) -> &[u8] {
        &self.inner.payload
    }
    /// The configuration it was created from (local endpoints only).
    pub fn config(&self) -> Option<&EndpointConfig> {
        self.inner.config.as_ref()
    }
    /// Whether this process created it (and so owns its resources).
    pub fn is_local(&self) -> bool {
        self.inner.config.is_some()
    }
    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }
    pub(crate) fn listener(&self) -> Option<&TcpListener> {
        self.inner.listener.as_ref()
    }

    /// The listening address of an Ethernet endpoint.
    pub fn ethernet_address(&self) -> Result<SocketAddr> {
        if self.inner.transport != Transport::Ethernet {
            return Err(Error::invalid(format!(
                "ethernet_address: expected an Ethernet endpoint, got {}",
                self.inner.transport
            )));
        }
        decode_socket_addr(&self.inner.payload)
    }

    /// Encodes the endpoint (see the module docs for the format).
    pub fn serialize(&self) -> Vec<u8> {
        let i = &self.inner;
        let mut w = Writer::new(MAGIC, VERSION);
        w.u8(i.transport.to_u8())
            .u8(match i.device.kind {
                DeviceType::Cpu => 0,
                DeviceType::Gpu => 1,
            })
            .i32(i.device.id)
            .u64(i.host_hash)
            .u64(i.pid_hash)
            .i32(i.max_write_queue_size)
            .u64(i.id)
            .blob(&i.payload);
        w.finish()
    }

    /// Decodes an endpoint; any malformed input is an error naming the field.
    pub fn deserialize(bytes: &[u8]) -> Result<Endpoint> {
        let mut r = Reader::new("endpoint", bytes, MAGIC, VERSION)?;
        let transport = Transport::from_u8(r.u8("transport")?)?;
        if transport == Transport::Unknown {
            return Err(r.bad("transport", "a concrete transport", "Unknown"));
        }
        let kind = r.u8("device kind")?;
        let id = r.i32("device id")?;
        let device = decode_device(&r, kind, id)?;
        let host_hash = r.u64("host hash")?;
        let pid_hash = r.u64("pid hash")?;
        let max_write_queue_size = r.i32("max write queue size")?;
        if max_write_queue_size < -1 || max_write_queue_size == 0 {
            return Err(r.bad(
                "max write queue size",
                "-1 or a positive size",
                max_write_queue_size,
            ));
        }
        let ep_id = r.u64("endpoint id")?;
        let payload = r.blob("transport payload", MAX_TRANSPORT_PAYLOAD)?.to_vec();
        r.finish()?;
        match transport {
            Transport::CudaIpc if !payload.is_empty() => {
                return Err(Error::invalid(format!(
                    "endpoint: CudaIpc carries no transport payload, got {} bytes",
                    payload.len()
                )))
            }
            Transport::Ethernet => {
                decode_socket_addr(&payload)?;
            }
            t if t.is_ib() => {
                crate::ib::qp::QpInfo::decode(&payload)?;
            }
            _ => {}
        }
        Ok(Endpoint {
            inner: Arc::new(EndpointInner {
                transport,
                device,
                host_hash,
                pid_hash,
                max_write_queue_size,
                id: ep_id,
                payload,
                config: None,
                listener: None,
                ib_qp: std::sync::Mutex::new(None),
            }),
        })
    }
}
