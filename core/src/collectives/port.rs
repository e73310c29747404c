//! The proxy and port channels of the port-channel algorithms, built once per communicator
//! at the first port-channel call outside graph capture (collective: every rank registers its
//! shared buffer again for the proxy, exchanges it and one Host2Device semaphore per peer over
//! the existing CudaIpc connections), kept by the algorithms that use them ([`PortChannels`], shared by `allgather/port_channel.rs`
//! and `allreduce/rsag_port_channel.rs`).
//!
//! Channel p (at index p of the device table, none at this rank) puts from this rank's shared
//! buffer into peer p's shared buffer; offsets are from the buffers' starts, so the plain
//! scratch is at `layout.plain_offset` on both sides. The proxy (a host thread) performs the
//! copies on the connection (copy engine on GPUs, memcpy on the host backend) and signals the
//! peer's semaphore; `flush` waits until it handled every earlier request.

use std::sync::{Arc, Mutex};

use super::gpu::GpuCtx;
use super::setup::Resources;
use super::types::RawStream;
use crate::error::{Error, Result};
use crate::fifo::{Fifo, DEFAULT_FIFO_SIZE};
use crate::gpu_buffer::GpuBuffer;
use crate::port_channel::{PortChannel, PortChannelDeviceHandle};
use crate::proxy::ProxyService;
use crate::semaphore::Host2DeviceSemaphore;
use crate::transport::{DeviceType, Transport};

/// Communicator tags of the setup exchanges.
const TAG_MEMORY: u64 = 0xC012_0000;
const TAG_SEMAPHORE: u64 = 0xC012_0001;

/// The proxy, the channels and their device table.
pub struct PortState {
    /// Device handles, index = peer rank (this rank's entry is a copy of another, unused).
    pub handles: Vec<PortChannelDeviceHandle>,
    /// The same handles in device memory (host memory on the host backend).
    pub table: GpuBuffer<PortChannelDeviceHandle>,
    _channels: Vec<PortChannel>,
    _proxy: ProxyService,
}

/// The lazily built port state of one communicator, shared by the port-channel algorithms
/// that one collection built (see the module doc).
#[derive(Default)]
pub struct PortChannels {
    state: Mutex<Option<Arc<PortState>>>,
}

impl std::fmt::Debug for PortChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let built = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        f.debug_struct("PortChannels")
            .field("built", &built)
            .finish()
    }
}

impl PortChannels {
    /// The port state on `res`, built on first use (collective); `None` during a graph
    /// capture before it was built (the caller reports that the call needs one run outside
    /// capture first). A failed build leaves it unbuilt.
    pub(crate) fn state(
        &self,
        res: &Resources,
        gpu: Option<(&GpuCtx, RawStream)>,
    ) -> Result<Option<Arc<PortState>>> {
        let mut slot = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slot.as_ref() {
            return Ok(Some(s.clone()));
        }
        if let Some((g, stream)) = gpu {
            if g.is_capturing(stream)? {
                return Ok(None);
            }
        }
        let s = Arc::new(build(res)?);
        *slot = Some(s.clone());
        Ok(Some(s))
    }
}

/// The error of a port-channel call captured before the channels exist.
pub(crate) fn not_built(what: &str) -> Error {
    Error::invalid(format!(
        "{what}: the proxy and port channels are built by the first call outside graph capture; \
         run one such call before capturing (or use another algorithm)"
    ))
}

fn build(res: &Resources) -> Result<PortState> {
    let (me, n, comm) = (res.rank(), res.nranks(), res.comm());
    let mut proxy = match res.device().kind {
        DeviceType::Cpu => ProxyService::new_host()?,
        DeviceType::Gpu => {
            let dev = crate::memory::gpu_device(res.device().id)?;
            ProxyService::with_fifo(Fifo::new_on::<mscclpp_hal::Gpu>(&dev, DEFAULT_FIFO_SIZE)?)?
        }
    };
    let local = comm.register_memory(
        res.shared().ptr(),
        res.layout().total,
        Transport::CudaIpc.into(),
    )?;
    let remote: Vec<_> = (0..n)
        .map(|p| (p != me).then(|| comm.recv_memory(p, TAG_MEMORY)))
        .collect();
    let mut sems = Vec::with_capacity(n);
    for p in 0..n {
        if p == me {
            sems.push(None);
            continue;
        }
        comm.send_memory(&local, p, TAG_MEMORY)?;
        let conn = res.connections()[p]
            .as_ref()
            .ok_or_else(|| Error::Internal(format!("collectives: no connection to rank {p}")))?;
        sems.push(Some(comm.build_semaphore(conn, p, TAG_SEMAPHORE)));
    }
    let src = proxy.add_memory(local)?;
    let mut channels = Vec::with_capacity(n);
    let mut handles = Vec::with_capacity(n);
    for (p, (m, s)) in remote.into_iter().zip(sems).enumerate() {
        let (Some(m), Some(s)) = (m, s) else {
            continue;
        };
        let m = m.get()?;
        let dst = proxy.add_memory(m)?;
        let sid = proxy.add_semaphore(Host2DeviceSemaphore::new(s.get()?)?)?;
        let ch = proxy.port_channel(sid, dst, src)?;
        handles.push((p, ch.device_handle()));
        channels.push(ch);
    }
    let filler = handles
        .first()
        .map(|(_, h)| *h)
        .ok_or_else(|| Error::invalid("collectives: port channels need at least two ranks"))?;
    let mut table_host = vec![filler; n];
    for (p, h) in handles {
        table_host[p] = h;
    }
    let table = GpuBuffer::new(res.device(), n)?;
    table.copy_from_host(0, &table_host)?;
    proxy.start_proxy()?;
    // Every rank's proxy runs before anyone pushes.
    comm.bootstrap().barrier()?;
    Ok(PortState {
        handles: table_host,
        table,
        _channels: channels,
        _proxy: proxy,
    })
}
