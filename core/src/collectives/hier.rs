//! Pieces shared by the hierarchical (multi-node) collectives: `allreduce/hier_rsag_port.rs`,
//! `allgather/hier_port.rs` and `reduce_scatter/hier_port.rs` (their module docs say what each
//! does). Host side: the rail handshake, the network waits and flushes and the two-stage chunk
//! pipeline (their reductions are in host_math.rs); GPU side: the argument block and grid of
//! the kernels in kernels/cuda/src/collectives (hier.hpp) and their launch.

use super::algorithm::{Call, CollArgs};
use super::gpu::GpuCtx;
use super::mesh::{self, THREADS};
use super::setup::Resources;
use super::types::{DataType, RawStream};
use crate::error::{Error, Result};
use crate::kernels;
use crate::port_channel::PortChannelDeviceHandle;

/// Pipeline slots of the network areas (see `allreduce/hier_rsag_port.rs` for why 4 suffice).
pub(crate) const DEPTH: usize = 4;
/// Most blocks of a hierarchical kernel's launch (they meet at grid barriers, so they must all
/// be resident).
const MAX_BLOCKS: usize = 8;
/// Bytes of a shard (chunk) per block the grid is sized for.
const BYTES_PER_BLOCK: usize = 8 << 10;

/// How many times wider than an element its accumulator is (the partials' width).
pub(crate) fn widen(dtype: DataType) -> usize {
    match dtype {
        DataType::F16 | DataType::Bf16 => 2,
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => 4,
        _ => 1,
    }
}

/// The net port channels' device handles, index = rank (empty on one node).
pub(crate) fn net_handles(res: &Resources) -> &[PortChannelDeviceHandle] {
    res.net().as_ref().map_or(&[], |n| n.handles.as_slice())
}

/// The argument block and grid of a hierarchical kernel (kernels/cuda/src/collectives/hier.hpp)
/// whose pieces (shards, chunks) are `piece` bytes: extra[0] = the net channel table (device
/// memory; 0 on one node), extra[1] = the node-major rank table, extra[2] = `piece`, extra[3] =
/// `L | N << 16 | local << 32 | node << 48`, extra[4] = the network buffer's device address
/// (`NetState::base`; 0 on one node). Refuses topologies the kernels cannot address
/// (a block has one thread per local rank and per rail peer) and shared buffers whose offsets
/// do not fit the port channels' 32-bit trigger fields.
pub(crate) fn gpu_args(
    res: &Resources,
    gpu: &GpuCtx,
    call: &Call,
    stream: RawStream,
    piece: usize,
    what: &str,
) -> Result<(CollArgs, u32)> {
    let topo = &res.topo();
    let threads = THREADS as usize;
    if topo.per_node() > threads || topo.nnodes > threads + 1 {
        return Err(Error::invalid(format!(
            "{what}: expected at most {threads} ranks per node and {} nodes on GPUs, got {} \
             ranks per node on {} nodes",
            threads + 1,
            topo.per_node(),
            topo.nnodes
        )));
    }
    if res.layout().total > u32::MAX as usize {
        return Err(Error::invalid(format!(
            "{what}: expected a shared buffer below 4 GiB (port channel offsets are 32-bit), got \
             {} bytes (reduce the scratch sizes)",
            res.layout().total
        )));
    }
    let census = mesh::census(res, gpu, stream)?;
    let blocks = mesh::grid(&census, piece.div_ceil(BYTES_PER_BLOCK), MAX_BLOCKS);
    let mut args = CollArgs::new(res, call);
    args.extra[0] = res.net().as_ref().map_or(0, |n| n.table.data());
    args.extra[1] = res.node_ranks_ptr();
    args.extra[2] = piece as u64;
    args.extra[3] = topo.per_node() as u64
        | (topo.nnodes as u64) << 16
        | (topo.local as u64) << 32
        | (topo.node as u64) << 48;
    args.extra[4] = res.net().as_ref().map_or(0, |n| n.base);
    Ok((args, blocks))
}

/// Which hierarchical kernel a launch runs.
pub(crate) struct Kernel<'a> {
    /// The kernel (one of kernels/cuda/src/collectives/*/hier_*.cu).
    pub kernel: kernels::Kernel,
    /// The algorithm, for errors ("allreduce hier_rsag_port").
    pub what: &'a str,
    /// The kernel counts bytes per rank instead of elements (all-gather).
    pub count_bytes: bool,
}

/// Launches kernel `k` on `stream` for `call`, with pieces of `piece` bytes ([`gpu_args`]).
pub(crate) fn launch(
    res: &Resources,
    gpu: &GpuCtx,
    call: &Call,
    stream: RawStream,
    piece: usize,
    k: &Kernel<'_>,
) -> Result<()> {
    let (mut args, blocks) = gpu_args(res, gpu, call, stream, piece, k.what)?;
    if k.count_bytes {
        args.count = call.bytes() as u64;
    }
    // SAFETY: CollArgs mirrors the kernels' parameter (common.hpp); the net channel table and
    // the rank table live in `res`; the caller keeps the buffers alive.
    unsafe { gpu.launch(k.kernel, blocks, THREADS, &args, stream) }
}

/// Handshake with every rail peer (a signal each way on the port channels).
pub(crate) fn rail_handshake(res: &Resources) -> Result<()> {
    let t = res.config().host_timeout;
    let handles = net_handles(res);
    for p in res.topo().rail_peers() {
        // SAFETY: the handle is a live channel of this rank's net proxy.
        unsafe { handles[p].signal(t)? };
    }
    rail_wait(res)
}

/// Waits for one signal from every rail peer.
pub(crate) fn rail_wait(res: &Resources) -> Result<()> {
    let (t, handles) = (res.config().host_timeout, net_handles(res));
    for p in res.topo().rail_peers() {
        // SAFETY: the handle is a live channel of this rank's net proxy.
        unsafe { handles[p].wait(t)? };
    }
    Ok(())
}

/// The host pipeline of `chunks` chunks: `stage_a(k + 1)` (local work and the network puts of
/// the next chunk) is issued before `stage_b(k)` (the network wait and what follows), then the
/// proxies are flushed, so no put of this call is in flight when it returns.
pub(crate) fn host_pipeline(
    res: &Resources,
    chunks: usize,
    stage_a: impl Fn(usize) -> Result<()>,
    stage_b: impl Fn(usize) -> Result<()>,
) -> Result<()> {
    if chunks > 0 {
        stage_a(0)?;
    }
    for k in 0..chunks {
        if k + 1 < chunks {
            stage_a(k + 1)?;
        }
        stage_b(k)?;
    }
    let (t, handles) = (res.config().host_timeout, net_handles(res));
    for q in res.topo().rail_peers() {
        // SAFETY: the handle is a live channel of this rank's net proxy.
        unsafe { handles[q].flush(t)? };
    }
    Ok(())
}
