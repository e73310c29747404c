//! The network side of the hierarchical (multi-node) collectives: one connection, one
//! registered copy of the shared buffer and one port channel per rail peer (the rank of the
//! same local index on every other node), served by one proxy thread. Built eagerly by
//! `Resources::new` (setup.rs) when the world spans nodes.
//!
//! Transport: `MSCCLPP_COLL_NET_TRANSPORT` = `ib` or `ethernet` when set; otherwise IB (`Ib0`,
//! in the mode of `MSCCLPP_IBV_MODE`) when an IB device is usable (a NIC, or the verbs test
//! provider named by `MSCCLPP_IBV_SO`), else Ethernet. Every rank must pick the same.
//!
//! Channel p (index p of `handles`; only rail peers have one) puts from this rank's network
//! buffer into peer p's network buffer at offsets from the buffers' starts, so plain-scratch
//! areas have the same offsets on both sides; the proxy signals the peer's semaphore after the
//! data (in order per connection), and `flush` waits until it handled every earlier request.
//!
//! The network buffer is the shared buffer itself, except for GPU ranks over Ethernet: there it
//! is a separate buffer of the same size in host-mapped memory (`staging`), so the Ethernet
//! threads move its bytes with the CPU and never wait on a GPU copy (which the application
//! can hold up indefinitely, see connection/ethernet). The kernels find it at
//! [`NetState::base`] (`CollArgs.extra[4]`) and keep there only what the network reads or
//! writes and no local peer reads (all-reduce and reduce-scatter: the R and NET slots;
//! all-gather copies its slots between the two buffers). Semaphore tokens of Ethernet
//! connections are host-mapped as well (semaphore.rs).

use crate::env::NetTransport;
use crate::error::{Error, Result};
use crate::fifo::{Fifo, DEFAULT_FIFO_SIZE};
use crate::gpu_buffer::GpuBuffer;
use crate::memory::{host_addressable, LocalMemory};
use crate::port_channel::{PortChannel, PortChannelDeviceHandle};
use crate::proxy::ProxyService;
use crate::semaphore::Host2DeviceSemaphore;
use crate::transport::{DeviceType, EndpointConfig, Transport};
use mscclpp_hal::MemoryKind;

use super::topology::Topology;
use crate::communicator::Communicator;
use crate::transport::Device;

/// Communicator tags of the setup exchanges.
const TAG_CONNECT: u64 = 0xC013_0000;
const TAG_MEMORY: u64 = 0xC013_0001;
const TAG_SEMAPHORE: u64 = 0xC013_0002;

/// The variable that forces the network transport.
pub const NET_TRANSPORT_ENV: &str = crate::env::COLL_NET_TRANSPORT;

/// The rail peers' port channels and their proxy.
pub struct NetState {
    /// The transport of the network connections (`Ib0` or `Ethernet`).
    pub transport: Transport,
    /// Device handles, index = rank (ranks that are not rail peers hold a copy of another
    /// entry, unused).
    pub handles: Vec<PortChannelDeviceHandle>,
    /// The same handles in device memory (host memory on the host backend).
    pub table: GpuBuffer<PortChannelDeviceHandle>,
    /// Device address of this rank's network buffer (see the module doc): the shared buffer's
    /// start, or the host-mapped staging buffer's.
    pub base: u64,
    _channels: Vec<PortChannel>,
    _proxy: ProxyService,
    /// The host-mapped network buffer of GPU ranks over Ethernet (last: after the proxy that
    /// reads it; its registrations keep it alive anyway).
    _staging: Option<LocalMemory>,
}

/// The transport [`NET_TRANSPORT_ENV`] chose ([`crate::env::Env::coll_net_transport`]), or,
/// when unset, what is available.
pub fn pick_transport(choice: Option<NetTransport>) -> Transport {
    match choice {
        Some(NetTransport::Ib) => Transport::Ib0,
        Some(NetTransport::Ethernet) => Transport::Ethernet,
        None if crate::ib::ib_unavailable_reason().is_none() => Transport::Ib0,
        None => Transport::Ethernet,
    }
}

impl NetState {
    /// Connects the rail peers of `topo` (collective over all ranks: every rank calls it after
    /// its intra-node setup): `shared` is this rank's shared buffer on `device`, `total` its
    /// bytes (the same on every rank).
    pub fn build(
        comm: &Communicator,
        topo: &Topology,
        device: Device,
        shared: u64,
        total: usize,
    ) -> Result<NetState> {
        // Read again per communicator, as the other collective switches.
        let transport = pick_transport(crate::env::Env::current().coll_net_transport()?);
        let n = comm.bootstrap().nranks();
        let rails: Vec<usize> = topo.rail_peers().collect();
        let mut proxy = new_proxy(device)?;
        let conns: Vec<_> = rails
            .iter()
            .map(|&p| {
                (
                    p,
                    comm.connect(EndpointConfig::new(transport, device), p, TAG_CONNECT),
                )
            })
            .collect();
        let staging = if transport == Transport::Ethernet && !host_addressable(device) {
            Some(LocalMemory::alloc_kind(
                device,
                total,
                MemoryKind::HostMapped,
            )?)
        } else {
            None
        };
        let base = staging.as_ref().map_or(shared, |m| m.ptr());
        let local = comm.register_memory(base, total, transport.into())?;
        let remote: Vec<_> = rails
            .iter()
            .map(|&p| comm.recv_memory(p, TAG_MEMORY))
            .collect();
        for &p in &rails {
            comm.send_memory(&local, p, TAG_MEMORY)?;
        }
        let mut sems = Vec::with_capacity(rails.len());
        for (p, f) in conns {
            let conn = f.get().map_err(|e| {
                Error::invalid(format!(
                    "collectives: connecting rank {p} on another node over {transport:?}: {e}"
                ))
            })?;
            sems.push(comm.build_semaphore(&conn, p, TAG_SEMAPHORE));
        }
        let src = proxy.add_memory(local)?;
        let mut channels = Vec::with_capacity(rails.len());
        let mut handles = Vec::with_capacity(rails.len());
        for ((&p, m), s) in rails.iter().zip(remote).zip(sems) {
            let m = m.get()?;
            if m.size() < total {
                return Err(Error::remote(
                    p,
                    format!(
                        "collectives: expected the peer's shared buffer of {} bytes, got {}",
                        total,
                        m.size()
                    ),
                ));
            }
            let dst = proxy.add_memory(m)?;
            let sid = proxy.add_semaphore(Host2DeviceSemaphore::new(s.get()?)?)?;
            let ch = proxy.port_channel(sid, dst, src)?;
            handles.push((p, ch.device_handle()));
            channels.push(ch);
        }
        let empty = "collectives: a multi-node world without rail peers";
        let (table_host, table) = finish_build(comm, &mut proxy, device, n, handles, empty)?;
        Ok(NetState {
            transport,
            handles: table_host,
            table,
            base,
            _channels: channels,
            _proxy: proxy,
            _staging: staging,
        })
    }
}

/// The proxy service of a proxy-channel build on `device`: a host FIFO on the host backend,
/// one in device memory otherwise.
pub(crate) fn new_proxy(device: Device) -> Result<ProxyService> {
    match device.kind {
        DeviceType::Cpu => ProxyService::new_host(),
        DeviceType::Gpu => {
            let dev = crate::memory::gpu_device(device.id)?;
            ProxyService::with_fifo(Fifo::new_on::<mscclpp_hal::Gpu>(&dev, DEFAULT_FIFO_SIZE)?)
        }
    }
}

/// The end of a proxy-channel build (collective): the table of `n` channel handles, `handles`
/// at their ranks and every other entry a copy of the first (`empty`: the error when there is
/// none), on the host and on `device`; then the proxy started and a barrier, so that every
/// rank's proxy runs before anyone pushes.
pub(crate) fn finish_build(
    comm: &Communicator,
    proxy: &mut ProxyService,
    device: Device,
    n: usize,
    handles: Vec<(usize, PortChannelDeviceHandle)>,
    empty: &str,
) -> Result<(
    Vec<PortChannelDeviceHandle>,
    GpuBuffer<PortChannelDeviceHandle>,
)> {
    let filler = handles
        .first()
        .map(|(_, h)| *h)
        .ok_or_else(|| Error::invalid(empty))?;
    let mut table_host = vec![filler; n];
    for (p, h) in handles {
        table_host[p] = h;
    }
    let table = GpuBuffer::new(device, n)?;
    table.copy_from_host(0, &table_host)?;
    proxy.start_proxy()?;
    comm.bootstrap().barrier()?;
    Ok((table_host, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_names() {
        assert_eq!(pick_transport(Some(NetTransport::Ib)), Transport::Ib0);
        assert_eq!(
            pick_transport(Some(NetTransport::Ethernet)),
            Transport::Ethernet
        );
    }
}
