//! Per-communicator resources of the collectives: a CudaIpc connection to every peer, one
//! registered "shared" buffer per rank (semaphore tokens + LL packet scratch + plain scratch)
//! mapped by every peer, and a local "meta" buffer (LL flags, expected tokens, the tables the
//! kernels index). See README.md beside this file for the layout.

use std::mem::size_of;
use std::time::Duration;

use crate::communicator::Communicator;
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::identity::host_hash;
use crate::memory::LocalMemory;
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::MemoryDevice2DeviceSemaphoreDeviceHandle;
use crate::transport::{Device, EndpointConfig, Transport};

use super::net::NetState;
use super::topology::{Census, Topology};
use super::user_buffers::UserBufferCache;
use std::sync::OnceLock;

/// Blocks (per peer) that own a semaphore: the most blocks a semaphore-synchronised kernel
/// may launch.
pub const MAX_SEM_BLOCKS: usize = 64;
/// Entries of the LL flag array (one u32 per block; every launch bumps all of them).
pub const MAX_FLAGS: usize = 1024;

/// Communicator tags of the setup exchanges (connections, shared buffers).
const TAG_CONNECT: u64 = 0xC011_0000;
const TAG_SHARED: u64 = 0xC011_0001;

/// Sizes of the scratch regions.
#[derive(Clone, Debug)]
pub struct CollectivesConfig {
    /// The device to run on; `None`: the CPU on the host backend, else GPU
    /// `(rank % nranks_per_node) % device_count`.
    pub device: Option<Device>,
    /// Bytes of each of the two halves of the LL packet scratch (default 8 MiB).
    pub ll_half_bytes: usize,
    /// Bytes of the plain (non-packet) scratch (default 32 MiB).
    pub plain_bytes: usize,
    /// Host backend: how long a CPU "device" thread waits for a peer before failing
    /// (default 60 s).
    pub host_timeout: Duration,
    /// Host backend: blocks of a host launch (run one after another by the calling thread;
    /// default 2, at most [`MAX_SEM_BLOCKS`]).
    pub host_blocks: usize,
}

impl Default for CollectivesConfig {
    fn default() -> Self {
        CollectivesConfig {
            device: None,
            ll_half_bytes: 8 << 20,
            plain_bytes: 32 << 20,
            host_timeout: Duration::from_secs(60),
            host_blocks: 2,
        }
    }
}

/// Where things are inside the shared buffer (identical on every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Tokens: `[MAX_SEM_BLOCKS][nranks]` u64 at offset 0; entry (b, p) is signalled by rank p.
    pub tokens_bytes: usize,
    /// Offset of the LL region (two halves of `ll_half_bytes`).
    pub ll_offset: usize,
    /// Bytes of one LL half.
    pub ll_half_bytes: usize,
    /// Offset of the plain scratch.
    pub plain_offset: usize,
    /// Bytes of the plain scratch.
    pub plain_bytes: usize,
    /// Total bytes.
    pub total: usize,
}

impl Layout {
    fn new(nranks: usize, ll_half: usize, plain: usize) -> Result<Layout> {
        let align = |x: usize| x.div_ceil(4096) * 4096;
        let tokens_bytes = align(MAX_SEM_BLOCKS * nranks * 8);
        let ll_half_bytes = align(ll_half.max(4096));
        let plain_bytes = align(plain.max(4096));
        let ll_offset = tokens_bytes;
        let plain_offset = ll_offset
            .checked_add(2 * ll_half_bytes)
            .ok_or_else(|| Error::invalid("collectives: LL scratch size overflows"))?;
        let total = plain_offset
            .checked_add(plain_bytes)
            .ok_or_else(|| Error::invalid("collectives: scratch size overflows"))?;
        Ok(Layout {
            tokens_bytes,
            ll_offset,
            ll_half_bytes,
            plain_offset,
            plain_bytes,
            total,
        })
    }
}

/// Offsets inside the local meta buffer.
#[derive(Clone, Copy, Debug)]
pub struct MetaLayout {
    /// `[MAX_FLAGS]` u32, all starting at 1.
    pub flags: usize,
    /// `[MAX_SEM_BLOCKS][nranks]` u64: the expected-token counters of the local waits.
    pub expected: usize,
    /// `[nranks]` u64: the base address of every rank's shared buffer, mapped here (own too).
    pub peer_bases: usize,
    /// `[MAX_SEM_BLOCKS][nranks]` semaphore device handles (entry (b, p): with peer p).
    pub sems: usize,
    /// `[nnodes][ranks per node]` u32: the ranks of every node, node-major
    /// ([`super::topology::Topology::nodes`]; the hierarchical kernels index it).
    pub node_ranks: usize,
    /// Total bytes.
    pub total: usize,
}

impl MetaLayout {
    fn new(nranks: usize) -> MetaLayout {
        let flags = 0;
        let expected = MAX_FLAGS * 4;
        let peer_bases = expected + MAX_SEM_BLOCKS * nranks * 8;
        let sems = peer_bases + nranks * 8;
        let node_ranks =
            sems + MAX_SEM_BLOCKS * nranks * size_of::<MemoryDevice2DeviceSemaphoreDeviceHandle>();
        let total = node_ranks + nranks * 4;
        MetaLayout {
            flags,
            expected,
            peer_bases,
            sems,
            node_ranks,
            total,
        }
    }
}

/// Everything the algorithms of one communicator share, set up once (collective): the
/// topology, the device, the scratch buffers every peer maps, the meta buffer the kernels
/// index, the CudaIpc connections, the network state of a world spanning nodes, the cache of
/// registered user buffers and the GPU census. Read through its accessors; what only some
/// algorithms use (the proxy and port channels, the NVLS scratch) is those algorithms' own
/// state (see `port.rs`, `nvls.rs`).
pub struct Resources {
    rank: usize,
    nranks: usize,
    nranks_per_node: usize,
    topo: Topology,
    net: Option<NetState>,
    device: Device,
    arch: (u32, u32),
    sm_count: u32,
    ranks_per_device: usize,
    config: CollectivesConfig,
    layout: Layout,
    meta_layout: MetaLayout,
    shared: LocalMemory,
    meta: LocalMemory,
    connections: Vec<Option<Connection>>,
    peer_bases: Vec<u64>,
    comm: Communicator,
    user_buffers: UserBufferCache,
    census: OnceLock<Census>,
    _registered: RegisteredMemory,
    _peer_shared: Vec<Option<RegisteredMemory>>,
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resources")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("device", &self.device)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl Resources {
    /// Connects every peer and exchanges the shared buffers (collective: every rank calls it).
    pub fn new(comm: &Communicator, config: CollectivesConfig) -> Result<Resources> {
        let b = comm.bootstrap();
        let (rank, nranks) = (b.rank(), b.nranks());
        if config.host_blocks == 0 || config.host_blocks > MAX_SEM_BLOCKS {
            return Err(Error::invalid(format!(
                "collectives: host_blocks: expected 1..={MAX_SEM_BLOCKS}, got {}",
                config.host_blocks
            )));
        }
        let hosts = b.all_gather(&host_hash().to_le_bytes())?;
        let topo = Topology::new(rank, &hosts)?;
        let device = match config.device {
            Some(d) => d,
            None => default_device(rank, b.nranks_per_node())?,
        };
        let (arch, sm_count) = device_info(device)?;
        let dev_key = [u8::from(device.kind == crate::transport::DeviceType::Gpu)]
            .into_iter()
            .chain(device.id.to_le_bytes())
            .collect::<Vec<u8>>();
        let ranks_per_device = b
            .all_gather(&dev_key)?
            .iter()
            .filter(|k| **k == dev_key)
            .count();
        let layout = Layout::new(nranks, config.ll_half_bytes, config.plain_bytes)?;
        let meta_layout = MetaLayout::new(nranks);
        let kind = crate::gpu_buffer::communication_memory_kind(device);
        let shared = LocalMemory::alloc_kind(device, layout.total, kind)?;
        let meta = LocalMemory::alloc(device, meta_layout.total)?;

        // Connections (CudaIpc to every peer of this node), then the shared buffers; peers on
        // other nodes are reached by the port channels of `net` (built below).
        let local = |p: usize| p != rank && topo.node_of[p] == topo.node;
        let futures: Vec<_> = (0..nranks)
            .map(|p| {
                local(p).then(|| {
                    comm.connect(
                        EndpointConfig::new(Transport::CudaIpc, device),
                        p,
                        TAG_CONNECT,
                    )
                })
            })
            .collect();
        let registered =
            comm.register_memory(shared.ptr(), layout.total, Transport::CudaIpc.into())?;
        let recvs: Vec<_> = (0..nranks)
            .map(|p| local(p).then(|| comm.recv_memory(p, TAG_SHARED)))
            .collect();
        for p in (0..nranks).filter(|&p| local(p)) {
            comm.send_memory(&registered, p, TAG_SHARED)?;
        }
        let mut connections = Vec::with_capacity(nranks);
        for f in futures {
            connections.push(f.map(|f| f.get()).transpose()?);
        }
        let mut peer_shared = Vec::with_capacity(nranks);
        for (p, f) in recvs.into_iter().enumerate() {
            let m = f.map(|f| f.get()).transpose()?;
            if let Some(m) = &m {
                if m.data() == 0 || m.size() < layout.total {
                    return Err(Error::remote(
                        p,
                        format!(
                            "collectives: expected the peer's shared buffer of {} bytes mapped here, got {} bytes at {:#x}",
                            layout.total,
                            m.size(),
                            m.data()
                        ),
                    ));
                }
            }
            peer_shared.push(m);
        }
        let peer_bases: Vec<u64> = (0..nranks)
            .map(|p| match &peer_shared[p] {
                Some(m) => m.data(),
                None => shared.ptr(),
            })
            .collect();
        let net = if topo.nnodes > 1 {
            Some(NetState::build(
                comm,
                &topo,
                device,
                shared.ptr(),
                layout.total,
            )?)
        } else {
            None
        };
        let res = Resources {
            rank,
            nranks,
            nranks_per_node: topo.local_ranks.len(),
            topo,
            device,
            arch,
            sm_count,
            ranks_per_device,
            config,
            layout,
            meta_layout,
            shared,
            meta,
            connections,
            peer_bases,
            comm: comm.clone(),
            user_buffers: Default::default(),
            census: OnceLock::new(),
            net,
            _registered: registered,
            _peer_shared: peer_shared,
        };
        res.write_meta()?;
        // The first launch of any rank writes into its peers' shared buffers: start only when
        // every rank has finished its setup.
        b.barrier()?;
        Ok(res)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// World size.
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    /// Ranks on this node (host hash; `MSCCLPP_HOSTID` tells emulated nodes apart).
    pub fn nranks_per_node(&self) -> usize {
        self.nranks_per_node
    }
    /// Which rank runs on which node (peers on other nodes are not mapped: their
    /// [`Resources::peer_bases`] entry is this rank's own buffer and their connection `None`).
    pub fn topo(&self) -> &Topology {
        &self.topo
    }
    /// Port channels to the peers of the same local index on the other nodes (`None` on one
    /// node); see net.rs.
    pub fn net(&self) -> Option<&NetState> {
        self.net.as_ref()
    }
    /// The device kernels (or CPU threads) run on.
    pub fn device(&self) -> Device {
        self.device
    }
    /// GPU compute capability (major, minor); (0, 0) on the host backend.
    pub fn arch(&self) -> (u32, u32) {
        self.arch
    }
    /// Multiprocessors of the GPU (logical CPUs on the host backend).
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }
    /// Ranks of this world running on the same device as this rank (itself included).
    pub fn ranks_per_device(&self) -> usize {
        self.ranks_per_device
    }
    /// The configuration.
    pub fn config(&self) -> &CollectivesConfig {
        &self.config
    }
    /// Shared buffer layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// Meta buffer layout.
    pub fn meta_layout(&self) -> &MetaLayout {
        &self.meta_layout
    }
    /// The local shared buffer.
    pub fn shared(&self) -> &LocalMemory {
        &self.shared
    }
    /// The local meta buffer.
    pub fn meta(&self) -> &LocalMemory {
        &self.meta
    }
    /// CudaIpc connections, index = rank (`None` for this rank and ranks on other nodes).
    pub fn connections(&self) -> &[Option<Connection>] {
        &self.connections
    }
    /// Base address of every rank's shared buffer mapped here (own at index `rank`).
    pub fn peer_bases(&self) -> &[u64] {
        &self.peer_bases
    }
    /// The communicator (for registrations and collective setup inside a call).
    pub fn comm(&self) -> &Communicator {
        &self.comm
    }
    /// Registered user buffers of the zero-copy algorithms (any algorithm may use it).
    pub fn user_buffers(&self) -> &UserBufferCache {
        &self.user_buffers
    }
    /// The GPU census once taken (see `mesh::census`): set at most once per communicator.
    pub(crate) fn census_cell(&self) -> &OnceLock<Census> {
        &self.census
    }

    fn write_meta(&self) -> Result<()> {
        let m = &self.meta_layout;
        let mut bytes = vec![0u8; m.total];
        for f in 0..MAX_FLAGS {
            bytes[m.flags + 4 * f..m.flags + 4 * f + 4].copy_from_slice(&1u32.to_le_bytes());
        }
        for (p, base) in self.peer_bases.iter().enumerate() {
            bytes[m.peer_bases + 8 * p..m.peer_bases + 8 * p + 8]
                .copy_from_slice(&base.to_le_bytes());
        }
        let hsize = size_of::<MemoryDevice2DeviceSemaphoreDeviceHandle>();
        for blk in 0..MAX_SEM_BLOCKS {
            for p in 0..self.nranks {
                let h = self.sem_handle(blk, p);
                let off = m.sems + (blk * self.nranks + p) * hsize;
                for (i, v) in [
                    h.inbound_token,
                    h.remote_inbound_token,
                    h.expected_inbound_token,
                ]
                .into_iter()
                .enumerate()
                {
                    bytes[off + 8 * i..off + 8 * i + 8].copy_from_slice(&(v as u64).to_le_bytes());
                }
            }
        }
        for (i, r) in self.topo.nodes.iter().flatten().enumerate() {
            let off = m.node_ranks + 4 * i;
            bytes[off..off + 4].copy_from_slice(&(*r as u32).to_le_bytes());
        }
        self.meta.write(0, &bytes)
    }

    /// The semaphore of block `blk` with peer `p`: inbound = my token (blk, p), remote = peer
    /// p's token (blk, me), expected = my counter (blk, p). For `p == rank` it points at the
    /// own tokens (never used).
    pub fn sem_handle(&self, blk: usize, p: usize) -> MemoryDevice2DeviceSemaphoreDeviceHandle {
        let n = self.nranks;
        let own = self.shared.ptr() + ((blk * n + p) * 8) as u64;
        let remote = self.peer_bases[p] + ((blk * n + self.rank) * 8) as u64;
        let expected = self.meta.ptr() + (self.meta_layout.expected + (blk * n + p) * 8) as u64;
        MemoryDevice2DeviceSemaphoreDeviceHandle {
            inbound_token: own as usize as *mut u64,
            remote_inbound_token: remote as usize as *mut u64,
            expected_inbound_token: expected as usize as *mut u64,
        }
    }

    /// The most blocks a kernel whose blocks wait for peers' blocks may launch: every rank
    /// sharing this GPU (e.g. under MPS) must find all its blocks resident at once, so the
    /// multiprocessors are divided among them (one block per SM each).
    pub fn max_waiting_blocks(&self) -> usize {
        (self.sm_count as usize / self.ranks_per_device.max(1)).max(1)
    }

    /// Device address of the flag array.
    pub fn flags_ptr(&self) -> u64 {
        self.meta.ptr() + self.meta_layout.flags as u64
    }
    /// Device address of the peer-base table.
    pub fn peer_bases_ptr(&self) -> u64 {
        self.meta.ptr() + self.meta_layout.peer_bases as u64
    }
    /// Device address of the semaphore table.
    pub fn sems_ptr(&self) -> u64 {
        self.meta.ptr() + self.meta_layout.sems as u64
    }
    /// Device address of the node-major rank table ([`MetaLayout::node_ranks`]).
    pub fn node_ranks_ptr(&self) -> u64 {
        self.meta.ptr() + self.meta_layout.node_ranks as u64
    }
}

/// GPU `(rank % nranks_per_node) % device_count`, or the CPU on the host backend.
fn default_device(rank: usize, per_node: usize) -> Result<Device> {
    use mscclpp_hal::{prelude::*, Gpu};
    if Gpu::HOST_ADDRESSABLE {
        return Ok(Device::CPU);
    }
    let n = Gpu::device_count().map_err(|e| crate::memory::hal_err("count GPUs", e))?;
    if n == 0 {
        return Err(Error::invalid("collectives: expected a GPU, found none"));
    }
    Ok(Device::gpu(((rank % per_node.max(1)) % n) as i32))
}

fn device_info(device: Device) -> Result<((u32, u32), u32)> {
    use mscclpp_hal::{prelude::*, Gpu};
    match device.kind {
        crate::transport::DeviceType::Cpu => Ok((
            (0, 0),
            std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        )),
        crate::transport::DeviceType::Gpu => {
            let dev = crate::memory::gpu_device(device.id)?;
            let p =
                Gpu::properties(&dev).map_err(|e| crate::memory::hal_err("GPU properties", e))?;
            Ok((p.compute_capability, p.sm_count))
        }
    }
}
