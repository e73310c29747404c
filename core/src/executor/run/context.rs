//! The resources of one (plan, send, recv), set up collectively on first use: connections
//! (one per channel, plus unpaired ones so a peer with more channels to us can pair all of
//! its own), memory and port channels, the remote buffers the plan names, scratch, device
//! semaphores, barrier words and per-block launch counters.
//!
//! Pairing follows upstream: the k-th channel of a type from rank A to rank B and the k-th
//! from B to A share a connection tag, hence a semaphore. Memory is exchanged under the index
//! of the remote buffer in the receiver's `remote_buffers`.

use std::sync::Arc;

use crate::communicator::Communicator;
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::executor::json::BufferType;
use crate::executor::limits::MAX_BARRIERS;
use crate::executor::lower::device::{BARRIER_WORDS, LANE_WORDS};
use crate::executor::lower::{layout, Tables};
use crate::executor::model::{ConnKind, RankPlan};
use crate::executor::plan::ExecutionPlan;
use crate::gpu_buffer::GpuBuffer;
use crate::memory::Allocation;
use crate::memory_channel::{BaseMemoryChannel, BaseMemoryChannelDeviceHandle};
use crate::nvls::NvlsConnection;
use crate::port_channel::{BasePortChannel, BasePortChannelDeviceHandle};
use crate::proxy::ProxyService;
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::{Host2DeviceSemaphore, MemoryDevice2DeviceSemaphore, Semaphore};
use crate::switch_channel::{SwitchChannel, SwitchChannelDeviceHandle};
use crate::transport::{Device, DeviceType, EndpointConfig, Transport, TransportFlags};

/// Communicator tags of the executor's connections (plus a per-peer counter) and memories
/// (plus the remote buffer index).
const TAG_CONNECT: u64 = 0xE8EC_0000;
const TAG_MEMORY: u64 = 0xE8ED_0000;

/// The user buffers of one execution (or, for registration, to their allocations' ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Buffers {
    pub send: u64,
    pub recv: u64,
    pub send_size: usize,
    pub recv_size: usize,
}

impl Buffers {
    fn of(&self, ty: BufferType, scratch: &GpuBuffer<u8>) -> (u64, usize) {
        match ty {
            BufferType::Input => (self.send, self.send_size),
            BufferType::Output => (self.recv, self.recv_size),
            BufferType::Scratch => (scratch.data(), scratch.bytes()),
        }
    }
}

/// Everything set up for one (plan, send, recv).
pub(crate) struct ExecContext {
    pub device: Device,
    /// GPU blocks one launch may use at most (the SMs per rank sharing the GPU; 0 on the host).
    pub max_grid: u32,
    /// The GPU's SM count (0 on the host).
    pub sms: u32,
    /// The allocations of the send and receive buffers (adopted ones may be replaced by the
    /// application: [`ExecContext::holds`]).
    allocs: Vec<Arc<Allocation>>,
    pub scratch: GpuBuffer<u8>,
    /// Bytes of scratch actually used by one execution (the half, with double scratch).
    pub scratch_half: u64,
    pub memory_handles: Vec<BaseMemoryChannelDeviceHandle>,
    pub port_handles: Vec<BasePortChannelDeviceHandle>,
    /// Per remote buffer of the rank: its address here (0 without memory access).
    pub memory_buffers: Vec<u64>,
    /// Per remote buffer of the rank: its proxy memory id (0 without port access).
    pub port_buffers: Vec<u32>,
    /// Per remote buffer of the rank: the offset of the owner's second scratch half (0 when
    /// the buffer is not scratch or the plan has no double scratch).
    pub halves: Vec<u32>,
    /// Device semaphores (i32 each), barrier words, launch counters (one per block).
    pub semaphores: GpuBuffer<i32>,
    pub barriers: GpuBuffer<u32>,
    pub flags: GpuBuffer<u32>,
    /// Per switch channel of the rank (plan order): its handle (host-side table; the lowered
    /// blocks name switch channels by slot).
    pub switch_handles: Vec<SwitchChannelDeviceHandle>,
    // Owners of what the handles point at (switch channels before their connections).
    _switch: Vec<SwitchChannel>,
    _nvls: Vec<NvlsConnection>,
    _memory_channels: Vec<BaseMemoryChannel>,
    _unpaired: Vec<Semaphore>,
    _port_channels: Vec<BasePortChannel>,
    _connections: Vec<Connection>,
    _local: Vec<RegisteredMemory>,
    _remote: Vec<RegisteredMemory>,
    // Dropped last: stops the proxy after the channels are gone.
    _proxy: Option<ProxyService>,
}

fn exec_err(plan: &ExecutionPlan, what: impl std::fmt::Display) -> Error {
    Error::Executor(format!("plan `{}`: {what}", plan.name()))
}

/// Where this rank sits among its peers: which are on its node, which transport reaches them.
struct Placement<'a> {
    plan: &'a ExecutionPlan,
    me: usize,
    ranks_per_node: usize,
}

impl Placement<'_> {
    fn same_node(&self, p: usize) -> bool {
        p / self.ranks_per_node == self.me / self.ranks_per_node
    }

    /// Port channels to other nodes go over the IB device of this local rank.
    fn ib(&self) -> Result<Transport> {
        let local = self.me % self.ranks_per_node;
        crate::transport::ALL_IB_TRANSPORTS
            .get(local)
            .copied()
            .ok_or_else(|| exec_err(self.plan, format!("no IB transport for local rank {local}")))
    }

    fn port_transport(&self, p: usize) -> Result<Transport> {
        if self.same_node(p) {
            Ok(Transport::CudaIpc)
        } else {
            self.ib()
        }
    }

    /// CudaIpc, plus IB when a peer off this node reaches the memory.
    fn memory_transports(&self, off_node: bool) -> Result<TransportFlags> {
        let mut f = TransportFlags::from(Transport::CudaIpc);
        if off_node {
            f = f | self.ib()?;
        }
        Ok(f)
    }
}

/// The channels of a rank and what they own.
struct Channels {
    connections: Vec<Connection>,
    memory: Vec<BaseMemoryChannel>,
    port: Vec<BasePortChannel>,
    unpaired: Vec<Semaphore>,
    proxy: Option<ProxyService>,
}

/// The remote buffers of a rank (plan order) and the local memories registered for it.
struct Memories {
    local: Vec<RegisteredMemory>,
    remote: Vec<RegisteredMemory>,
    memory_buffers: Vec<u64>,
    port_buffers: Vec<u32>,
}

impl ExecContext {
    /// Sets up the resources of `plan` for the buffers `ext` (registered to their ends) on
    /// `device` with `scratch_bytes` of scratch (collective: every rank of the plan calls it in
    /// the same order, with the same `scratch_bytes`); `call`: the message sizes (switch
    /// channels bind those); `sms`: the GPU's SM count (GPU devices); `allocs`: the
    /// allocations the buffers lie in (kept alive; [`ExecContext::holds`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        comm: &Arc<Communicator>,
        plan: &ExecutionPlan,
        device: Device,
        ext: Buffers,
        call: Buffers,
        scratch_bytes: u64,
        sms: Option<u32>,
        allocs: Vec<Arc<Allocation>>,
    ) -> Result<ExecContext> {
        let bufs = ext;
        let rp = plan.rank_plan();
        let meta = plan.meta();
        let scratch: GpuBuffer<u8> = GpuBuffer::new(device, scratch_bytes as usize)?;
        let scratch_half = if meta.double_scratch {
            scratch_bytes / 2
        } else {
            0
        };
        let max_grid = match sms {
            Some(n) => n / gpu_share(comm, device)?.max(1),
            None => 0,
        };
        let at = Placement {
            plan,
            me: plan.rank(),
            ranks_per_node: comm.bootstrap().nranks_per_node().max(1),
        };
        let mut channels = connect(comm, &at, device)?;
        let memories = exchange_memories(comm, &at, bufs, &scratch, channels.proxy.as_ref())?;
        let halves = scratch_halves(plan, scratch_half)?;
        let (switch, nvls) = switch_channels(comm, plan, device, call, &scratch)?;
        let (semaphores, barriers, flags) = sync_words(rp, device)?;
        if let Some(px) = channels.proxy.as_mut() {
            px.start_proxy()?;
        }
        Ok(ExecContext {
            device,
            max_grid,
            sms: sms.unwrap_or(0),
            allocs,
            scratch,
            scratch_half,
            memory_handles: channels.memory.iter().map(|c| c.device_handle()).collect(),
            port_handles: channels.port.iter().map(|c| c.device_handle()).collect(),
            memory_buffers: memories.memory_buffers,
            port_buffers: memories.port_buffers,
            halves,
            semaphores,
            barriers,
            flags,
            switch_handles: switch.iter().map(|c| c.device_handle()).collect(),
            _switch: switch,
            _nvls: nvls,
            _memory_channels: channels.memory,
            _unpaired: channels.unpaired,
            _port_channels: channels.port,
            _connections: channels.connections,
            _local: memories.local,
            _remote: memories.remote,
            _proxy: channels.proxy,
        })
    }

    /// Whether `allocs`, the allocations a call's send and receive buffers lie in now, are the
    /// ones this context was set up for. The application may free adopted memory and allocate
    /// other memory at its address: adopting it then makes another `Allocation` (an adoption
    /// is reused only while its identity is the same), so comparing the objects is the
    /// identity check, with no query of the driver.
    pub(crate) fn holds(&self, allocs: &[Arc<Allocation>]) -> bool {
        self.allocs.len() == allocs.len()
            && self
                .allocs
                .iter()
                .zip(allocs)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// The lowering tables pointing at this context's resources.
    pub(crate) fn tables(&self) -> Tables<'_> {
        Tables {
            memory_channels: &self.memory_handles,
            port_channels: &self.port_handles,
            memory_buffers: &self.memory_buffers,
            port_buffers: &self.port_buffers,
            halves: &self.halves,
        }
    }
}

/// Connections and semaphores in the order memory channels, unpaired memory, port channels,
/// unpaired port (the k-th of a type to a peer shares its tag with the peer's k-th back), then
/// the channels over them; the proxy when any port channel or port memory is used. Memory
/// channels that were port channels (`RankPlan::memory_from_port`) connect where port channels
/// do, so each pairs with the connection its peer's counterpart has.
fn connect(comm: &Arc<Communicator>, at: &Placement, device: Device) -> Result<Channels> {
    let rp = at.plan.rank_plan();
    let (connections, sems) = connections(comm, at, device)?;
    let np = rp.port_peers.len();
    let mut sems = sems.into_iter();
    let mut memory = Vec::with_capacity(rp.memory_peers.len());
    let mut unpaired: Vec<Semaphore> = Vec::with_capacity(rp.unpaired_memory.len());
    // The memory-channel groups come first (connection_groups); the port ones are the rest.
    for (peers, kind) in rp.connection_groups() {
        let group = sems.by_ref().take(peers.len());
        match kind {
            ConnKind::MemoryChannel => {
                for s in group {
                    memory.push(BaseMemoryChannel::new(MemoryDevice2DeviceSemaphore::new(
                        s,
                    )?));
                }
            }
            ConnKind::UnpairedMemory => unpaired.extend(group),
            ConnKind::PortChannel | ConnKind::UnpairedPort => break,
        }
    }
    let proxy = if rp.uses_port() {
        Some(if device.kind == DeviceType::Gpu {
            ProxyService::new()?
        } else {
            ProxyService::new_host()?
        })
    } else {
        None
    };
    let mut port = Vec::with_capacity(np);
    if let Some(px) = proxy.as_ref() {
        for (i, s) in sems.enumerate() {
            let id = px.add_semaphore(Host2DeviceSemaphore::new(s)?)?;
            if i < np {
                port.push(px.base_port_channel(id)?);
            }
        }
    } else {
        unpaired.extend(sems);
    }
    Ok(Channels {
        connections,
        memory,
        port,
        unpaired,
        proxy,
    })
}

/// The connections of [`connect`]'s order, each with its semaphore.
fn connections(
    comm: &Arc<Communicator>,
    at: &Placement,
    device: Device,
) -> Result<(Vec<Connection>, Vec<Semaphore>)> {
    let (plan, rp) = (at.plan, at.plan.rank_plan());
    let mut counters = vec![0u64; plan.world_size()];
    let mut pending = Vec::new();
    for (peers, kind) in rp.connection_groups() {
        for &p in peers {
            let t = if kind.is_port() {
                at.port_transport(p)?
            } else {
                Transport::CudaIpc
            };
            let tag = TAG_CONNECT + counters[p];
            counters[p] += 1;
            let fut = comm.connect(EndpointConfig::new(t, device), p, tag);
            pending.push((p, tag, fut));
        }
    }
    let mut conns = Vec::with_capacity(pending.len());
    for (p, tag, fut) in pending {
        let c = fut
            .get()
            .map_err(|e| exec_err(plan, format!("connecting to rank {p}: {e}")))?;
        conns.push((p, tag, c));
    }
    let sem_futs: Vec<_> = conns
        .iter()
        .map(|(p, tag, c)| (*p, comm.build_semaphore(c, *p, *tag)))
        .collect();
    let mut sems = Vec::with_capacity(sem_futs.len());
    for (p, f) in sem_futs {
        sems.push(
            f.get()
                .map_err(|e| exec_err(plan, format!("semaphore with rank {p}: {e}")))?,
        );
    }
    Ok((conns.into_iter().map(|(_, _, c)| c).collect(), sems))
}

/// Memories: locals for the proxy (ids 0, 1, 2 = input, output, scratch), then the buffers
/// peers access (sent), then the peers' buffers this rank accesses (received, mapped or
/// added to the proxy).
fn exchange_memories(
    comm: &Arc<Communicator>,
    at: &Placement,
    bufs: Buffers,
    scratch: &GpuBuffer<u8>,
    proxy: Option<&ProxyService>,
) -> Result<Memories> {
    let (plan, rp) = (at.plan, at.plan.rank_plan());
    let any_off_node = (0..plan.world_size()).any(|p| !at.same_node(p));
    let mut local = Vec::new();
    if let Some(px) = proxy {
        for ty in [BufferType::Input, BufferType::Output, BufferType::Scratch] {
            let (ptr, size) = bufs.of(ty, scratch);
            let reg =
                comm.register_memory(ptr, size.max(1), at.memory_transports(any_off_node)?)?;
            px.add_memory(reg.clone())?;
            local.push(reg);
        }
    }
    for s in &rp.sends {
        let (ptr, size) = bufs.of(s.ty, scratch);
        let flags = at.memory_transports(s.port && !at.same_node(s.to))?;
        let reg = comm.register_memory(ptr, size, flags)?;
        comm.send_memory(&reg, s.to, TAG_MEMORY + s.tag as u64)
            .map_err(|e| exec_err(plan, format!("sending a buffer to rank {}: {e}", s.to)))?;
        local.push(reg);
    }
    let futs: Vec<_> = rp
        .remote_buffers
        .iter()
        .map(|rb| comm.recv_memory(rb.rank, TAG_MEMORY + rb.tag as u64))
        .collect();
    let mut m = Memories {
        local,
        remote: Vec::with_capacity(futs.len()),
        memory_buffers: Vec::with_capacity(futs.len()),
        port_buffers: Vec::with_capacity(futs.len()),
    };
    for (rb, f) in rp.remote_buffers.iter().zip(futs) {
        let reg = f
            .get()
            .map_err(|e| exec_err(plan, format!("receiving a buffer of rank {}: {e}", rb.rank)))?;
        let addr = if rb.memory {
            if reg.data() == 0 {
                return Err(exec_err(
                    plan,
                    format!(
                        "the {} buffer of rank {} is not mapped here: memory channels need peers on this host",
                        rb.ty.name(),
                        rb.rank
                    ),
                ));
            }
            reg.data()
        } else {
            0
        };
        let id = match (rb.port, proxy) {
            (true, Some(px)) => px.add_memory(reg.clone())?,
            _ => 0,
        };
        m.memory_buffers.push(addr);
        m.port_buffers.push(id);
        m.remote.push(reg);
    }
    Ok(m)
}

/// Per remote buffer: the offset of its owner's second scratch half (`half`: every rank's
/// scratch has the same size; 0 when the buffer is not scratch or the plan has no double
/// scratch).
fn scratch_halves(plan: &ExecutionPlan, half: u64) -> Result<Vec<u32>> {
    let h = u32::try_from(half).map_err(|_| {
        exec_err(
            plan,
            format!("scratch half of {half} bytes: above the executor's 32-bit offsets"),
        )
    })?;
    Ok(plan
        .rank_plan()
        .remote_buffers
        .iter()
        .map(|rb| if rb.ty == BufferType::Scratch { h } else { 0 })
        .collect())
}

/// Scratch bytes every rank allocates for a call of `input`/`output` bytes: the largest need
/// of any rank's part of `plan` (so every rank decides alike when to grow), in powers of two of
/// at least 1 MiB.
pub(crate) fn scratch_capacity(plan: &ExecutionPlan, input: u64, output: u64) -> u64 {
    let meta = plan.meta();
    let need = plan
        .rank_plans()
        .iter()
        .map(|rp| layout::scratch_bytes(meta, rp, input, output))
        .max()
        .unwrap_or(16);
    need.next_power_of_two().max(MIN_SCRATCH)
}

/// The smallest scratch a context allocates.
const MIN_SCRATCH: u64 = 1 << 20;

/// How many ranks share this rank's GPU (the most of any GPU; collective: one bootstrap
/// all-gather of every rank's GPU PCI bus id).
fn gpu_share(comm: &Arc<Communicator>, device: Device) -> Result<u32> {
    use mscclpp_hal::prelude::*;
    use mscclpp_hal::Gpu;
    let dev = crate::memory::gpu_device(device.id)?;
    let p = Gpu::properties(&dev).map_err(|e| crate::memory::hal_err("GPU properties", e))?;
    let all = comm.bootstrap().all_gather(p.pci_bus_id.as_bytes())?;
    Ok(all
        .iter()
        .map(|id| all.iter().filter(|o| *o == id).count())
        .max()
        .unwrap_or(1) as u32)
}

/// Switch channels: one multicast object per channel and group, in plan order (every rank of
/// a group binds the same buffer type, so the same sizes, in the same order).
fn switch_channels(
    comm: &Arc<Communicator>,
    plan: &ExecutionPlan,
    device: Device,
    bufs: Buffers,
    scratch: &GpuBuffer<u8>,
) -> Result<(Vec<SwitchChannel>, Vec<NvlsConnection>)> {
    let specs = &plan.rank_plan().switch_channels;
    let mut switch = Vec::with_capacity(specs.len());
    let mut nvls = Vec::with_capacity(specs.len());
    for (i, sc) in specs.iter().enumerate() {
        let (ptr, size) = bufs.of(sc.ty, scratch);
        let what = |e: Error| {
            exec_err(
                plan,
                format!(
                    "switch channel {i} ({} buffer, ranks {:?}): {e}",
                    sc.ty.name(),
                    sc.ranks
                ),
            )
        };
        let conn =
            NvlsConnection::connect_collective(comm, &sc.ranks, device, size).map_err(what)?;
        switch.push(conn.bind_allocated_memory(ptr, size).map_err(what)?);
        nvls.push(conn);
    }
    Ok((switch, nvls))
}

/// Device semaphores (their initial values), barrier words and launch counters (one per
/// block, followed by the blocks' lane barrier words).
fn sync_words(
    rp: &RankPlan,
    device: Device,
) -> Result<(GpuBuffer<i32>, GpuBuffer<u32>, GpuBuffer<u32>)> {
    let init: Vec<i32> = if rp.semaphores.is_empty() {
        vec![0]
    } else {
        rp.semaphores.clone()
    };
    let semaphores: GpuBuffer<i32> = GpuBuffer::new(device, init.len())?;
    semaphores.copy_from_host(0, &init)?;
    let barriers: GpuBuffer<u32> = GpuBuffer::new(device, MAX_BARRIERS * BARRIER_WORDS)?;
    // A launch counter per block, then LANE_WORDS lane words of each block (the lane
    // barrier's count and generation, or the split sync's join, release and exit words; the
    // async sync's start count and one arrival count per signal after data).
    let flags: GpuBuffer<u32> = GpuBuffer::new(device, (1 + LANE_WORDS) * rp.blocks.len().max(1))?;
    Ok((semaphores, barriers, flags))
}
