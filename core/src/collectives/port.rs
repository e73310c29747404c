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

use std::sync::Arc;

use super::gpu::{GpuCtx, LazyState};
use super::net::{finish_build, new_proxy};
use super::setup::Resources;
use super::types::RawStream;
use crate::error::{Error, Result};
use crate::gpu_buffer::GpuBuffer;
use crate::port_channel::{PortChannel, PortChannelDeviceHandle};
use crate::proxy::ProxyService;
use crate::semaphore::Host2DeviceSemaphore;
use crate::transport::Transport;

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
    state: LazyState<PortState>,
}

impl std::fmt::Debug for PortChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let built = self.state.is_built();
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
        self.state.get_or_build(gpu, || build(res))
    }

    /// [`PortChannels::state`], an error naming `what` ([`not_built`]) when it is not built.
    pub(crate) fn built(
        &self,
        res: &Resources,
        gpu: Option<(&GpuCtx, RawStream)>,
        what: &str,
    ) -> Result<Arc<PortState>> {
        self.state(res, gpu)?.ok_or_else(|| not_built(what))
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
    let mut proxy = new_proxy(res.device())?;
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
    let empty = "collectives: port channels need at least two ranks";
    let (table_host, table) = finish_build(comm, &mut proxy, res.device(), n, handles, empty)?;
    Ok(PortState {
        handles: table_host,
        table,
        _channels: channels,
        _proxy: proxy,
    })
}
