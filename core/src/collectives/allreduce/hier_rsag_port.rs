//! All-reduce `hier_rsag_port`: the hierarchical all-reduce of worlds spanning nodes.
//! With L ranks per node and N nodes, per chunk of `L x S` bytes:
//! 1. reduce-scatter inside the node over memory (every local rank reduces its shard `l` of
//!    the chunk from the local ranks' copies of their input, local-rank order);
//! 2. all-reduce of the shards across nodes over port channels (the proxy: IB or Ethernet,
//!    see net.rs): every rank puts its reduced shard to the rank of the same local index on
//!    every other node ("rail peers"), waits for theirs, and reduces the N shards in node
//!    order (so every rail rank computes the same bits); Avg divides by the world size here;
//! 3. all-gather inside the node over memory (every rank reads its local peers' final shards).
//!
//! Pipelined: the network put of chunk k+1 is issued before chunk k's network wait and
//! intra-node all-gather, so the proxy moves chunk k+1 while the CPU (or GPU) works on chunk k.
//!
//! Partial sums travel in the accumulation type (f32 for f16, bf16 and fp8; the type itself
//! otherwise), so every element is rounded once, at the end, as in the single-node algorithms
//! (this doubles the network bytes of f16/bf16 and quadruples those of fp8).
//!
//! Scratch (plain): A `L x S` (this rank's copy of the chunk's input), R `D x W` (reduced
//! partial shards, the put sources), NET `D x N x W` (slot (k mod D, j): node j's partial from
//! the rail peer there), F `S` (the final shard), D = 4, W = S x (accumulator / element size). Slot reuse: the rail peer puts chunk k only
//! after it received this rank's chunk k-2, which this rank sent after finishing chunk k-4, so
//! D = 4 slots suffice (and R's slot of chunk k-4 has left: its put landed before the peer's
//! put of chunk k-2, which this rank waited for). A handshake with the rail peers and a
//! node-local barrier open every call, so nothing of the previous call is still in use.
//!
//! GPU builds run kernels/cuda/src/collectives/allreduce/hier_rsag_port.cu (the same steps;
//! shared device pieces in kernels/cuda/src/collectives/hier.hpp, arguments from `hier::gpu_args`): every block of the grid
//! owns a part of every shard (node-local barriers per block, over the memory semaphores of
//! the same block of every local peer), and the rail threads of block 0 drive the net port
//! channels between grid barriers. At N = 1 it is a plain RS + AG on one node. R and NET live
//! in the network buffer (`CollArgs.extra[4]`: host-mapped for GPU ranks over Ethernet, see
//! collectives/net.rs; the shared buffer otherwise), A and F (read by local peers) in the
//! shared one.

use super::super::algorithm::{host_local_barrier, native_algorithm, Call};
use super::super::hier::{self, net_handles, rail_handshake, rail_wait, widen, Kernel, DEPTH};
use super::super::host_math::{reduce_from_acc, reduce_to_acc, with_elem, HostElem};
use super::super::mesh::{self, host_copy, VEC};
use super::super::setup::Resources;
use super::super::types::DataType;
use super::rsag_port_channel::put_or_signal;
use crate::error::Result;
use crate::kernels;

/// The algorithm object.
pub struct HierRsagPort;

/// Largest shard of one chunk (smaller chunks pipeline deeper).
const MAX_SHARD: usize = 64 << 10;

/// Scratch units of `S` bytes the layout needs.
fn slots(res: &Resources, dtype: DataType) -> usize {
    res.topo().per_node() + (DEPTH + DEPTH * res.topo().nnodes) * widen(dtype) + 1
}

/// Shard bytes per chunk: the buffer split over the local ranks, capped by the scratch and
/// [`MAX_SHARD`].
fn shard_bytes(res: &Resources, call: &Call) -> usize {
    let l = res.topo().per_node();
    let cap = (res.layout().plain_bytes / slots(res, call.dtype)) / VEC * VEC;
    call.bytes()
        .div_ceil(l)
        .next_multiple_of(VEC)
        .min(cap)
        .min(MAX_SHARD)
}

native_algorithm! {
    HierRsagPort: "hier_rsag_port", AllReduce, multi_node = true;
    check(self, res, call) {
        mesh::check_piece(res, shard_bytes(res, call), "allreduce hier_rsag_port", slots(res, call.dtype) * VEC)
    }
    launch_gpu(self, res, gpu, call, stream) {
        let k = Kernel {
            kernel: kernels::collectives::allreduce::HIER_RSAG_PORT
                .instance(call.dtype, call.op)?,
            what: "allreduce hier_rsag_port",
            count_bytes: false,
        };
        hier::launch(res, gpu, call, stream, shard_bytes(res, call), &k)
    }
    run_host(self, res, call) {
        with_elem!(call.dtype, T => host::<T>(res, call))
    }
}

/// Where things are for one call.
struct Plan {
    s: usize,
    total: usize,
    base: u64,
    a: usize,
    r: usize,
    net: usize,
    f: usize,
}

impl Plan {
    /// Bytes of shard `l` of chunk `k`.
    fn len(&self, k: usize, l: usize, per_node: usize) -> usize {
        self.total
            .saturating_sub(k * per_node * self.s + l * self.s)
            .min(self.s)
    }
    /// Offset in the buffers of shard `l` of chunk `k`.
    fn at(&self, k: usize, l: usize, per_node: usize) -> usize {
        k * per_node * self.s + l * self.s
    }
}

fn host<T: HostElem>(res: &Resources, call: &Call) -> Result<()> {
    let topo = &res.topo();
    let (l, nn, me_l, me_node) = (topo.per_node(), topo.nnodes, topo.local, topo.node);
    let s = shard_bytes(res, call);
    let plain = res.layout().plain_offset;
    let w = s * widen(call.dtype);
    debug_assert_eq!(
        std::mem::size_of::<T::Acc>(),
        std::mem::size_of::<T>() * widen(call.dtype)
    );
    let p = Plan {
        s,
        total: call.bytes(),
        base: plain as u64,
        a: 0,
        r: l * s,
        net: l * s + DEPTH * w,
        f: l * s + (DEPTH + DEPTH * nn) * w,
    };
    let handles = net_handles(res);
    let t = res.config().host_timeout;
    let size = std::mem::size_of::<T>();
    let chunks = p.total.div_ceil(l * s);
    let scratch = |r: usize, off: usize| res.peer_bases()[r] + p.base + off as u64;
    let mine = |off: usize| scratch(res.rank(), off);

    host_local_barrier(res, 0)?;
    rail_handshake(res)?;

    // Stage 1 of chunk k: intra-node reduce-scatter into R[k % D], then the network puts.
    let stage_a = |k: usize| -> Result<()> {
        let span = p.total.saturating_sub(k * l * s).min(l * s);
        // SAFETY: area A of the own scratch holds l * s bytes; the input holds the chunk.
        unsafe { host_copy(mine(p.a), call.send + (k * l * s) as u64, span) };
        host_local_barrier(res, 0)?;
        let len = p.len(k, me_l, l);
        let srcs: Vec<*const T> = topo
            .local_ranks
            .iter()
            .map(|&r| scratch(r, p.a + me_l * s) as usize as *const T)
            .collect();
        let rslot = mine(p.r + (k % DEPTH) * w) as usize as *mut T::Acc;
        // SAFETY: every local rank's A holds this chunk (barrier above); R's slot of w bytes
        // is free (module doc); the peers' shared buffers are mapped here.
        unsafe { reduce_to_acc::<T>(call.op, &srcs, rslot, len / size) };
        host_local_barrier(res, 0)?;
        let wlen = len / size * std::mem::size_of::<T::Acc>();
        for q in topo.rail_peers() {
            let dst = p.base as usize + p.net + ((k % DEPTH) * nn + me_node) * w;
            let src = p.base as usize + p.r + (k % DEPTH) * w;
            // SAFETY: a live channel of the net proxy; both ranges lie in the shared buffers.
            unsafe { put_or_signal(&handles[q], dst as u64, src as u64, wlen, t)? };
        }
        Ok(())
    };
    // Stage 2 of chunk k: the network reduction into F and the output, then the intra-node
    // all-gather.
    let stage_b = |k: usize| -> Result<()> {
        rail_wait(res)?;
        let len = p.len(k, me_l, l);
        let srcs: Vec<*const T::Acc> = (0..nn)
            .map(|j| {
                let off = if j == me_node {
                    p.r + (k % DEPTH) * w
                } else {
                    p.net + ((k % DEPTH) * nn + j) * w
                };
                mine(off) as usize as *const T::Acc
            })
            .collect();
        let f = mine(p.f) as usize as *mut T;
        // SAFETY: the rail peers' partials have landed (waited above); F holds s bytes.
        unsafe { reduce_from_acc::<T>(call.op, res.nranks(), &srcs, f, len / size) };
        let out = call.recv + p.at(k, me_l, l) as u64;
        // SAFETY: the output holds the chunk.
        unsafe { host_copy(out, mine(p.f), len) };
        host_local_barrier(res, 0)?;
        for q in topo.local_peers() {
            let ql = topo.local_of[q];
            let dst = call.recv + p.at(k, ql, l) as u64;
            // SAFETY: q's F holds its final shard (barrier above); q's buffer is mapped here.
            unsafe { host_copy(dst, scratch(q, p.f), p.len(k, ql, l)) };
        }
        host_local_barrier(res, 0)
    };

    hier::host_pipeline(res, chunks, stage_a, stage_b)
}
