//! Reduce-scatter `hier_port`: the hierarchical reduce-scatter of worlds spanning nodes. With L
//! ranks per node and N nodes, per chunk of `C` bytes of every block:
//! 1. inside the node over memory: local rank l reduces, over the node's ranks (local order),
//!    the blocks of its rail (the ranks of local index l on every node), one partial per node;
//! 2. across nodes over port channels (the proxy: IB or Ethernet, see net.rs): it puts the
//!    partial of node j to its rail peer on node j, waits for the rail peers' partials of its
//!    own block, and reduces the N partials in node order into the output (Avg divides by the
//!    world size here).
//!
//! Partials travel in the accumulation type (as in `allreduce/hier_rsag_port.rs`), so every
//! element is rounded once. Pipelined: chunk k+1's reduction and puts are issued before chunk
//! k's network wait and final reduction.
//!
//! Scratch (plain): A `n x C` (this rank's copy of the chunk of every block), R `D x N x W`
//! (the partials, put sources), NET `D x N x W` (slot (k mod D, j): node j's partial of this
//! rank's block), D = 4, W = C x (accumulator / element size). Slot reuse as in the all-reduce.
//! A handshake with the rail peers and a node barrier open every call.
//!
//! GPU builds run kernels/cuda/src/collectives/reduce_scatter/hier_port.cu (the same steps;
//! every block owns a part of every chunk, node-local barriers per block, the rail threads of
//! block 0 drive the net port channels between grid barriers; see
//! `allreduce/hier_rsag_port.rs`). R and NET live in the network buffer (host-mapped over
//! Ethernet, collectives/net.rs), A in the shared one.

use super::super::algorithm::{host_local_barrier, native_algorithm, Call};
use super::super::allreduce::rsag_port_channel::put_or_signal;
use super::super::hier::{self, net_handles, rail_handshake, rail_wait, widen, Kernel, DEPTH};
use super::super::host_math::{reduce_from_acc, reduce_to_acc, with_elem, HostElem};
use super::super::mesh::{self, host_copy, VEC};
use super::super::setup::Resources;
use crate::error::Result;
use crate::kernels;

/// The algorithm object.
pub struct HierPort;

/// Largest chunk of a block (smaller chunks pipeline deeper).
const MAX_CHUNK: usize = 64 << 10;

fn units(res: &Resources, call: &Call) -> usize {
    res.nranks() + 2 * DEPTH * res.topo().nnodes * widen(call.dtype)
}

fn chunk_bytes(res: &Resources, call: &Call) -> usize {
    let cap = (res.layout().plain_bytes / units(res, call)) / VEC * VEC;
    call.bytes().next_multiple_of(VEC).min(cap).min(MAX_CHUNK)
}

native_algorithm! {
    HierPort: "hier_port", ReduceScatter, multi_node = true;
    check(self, res, call) {
        mesh::check_piece(res, chunk_bytes(res, call), "reducescatter hier_port", units(res, call) * VEC)
    }
    launch_gpu(self, res, gpu, call, stream) {
        let k = Kernel {
            kernel: kernels::collectives::reduce_scatter::HIER_PORT
                .instance(call.dtype, call.op)?,
            what: "reducescatter hier_port",
            count_bytes: false,
        };
        hier::launch(res, gpu, call, stream, chunk_bytes(res, call), &k)
    }
    run_host(self, res, call) {
        with_elem!(call.dtype, T => host::<T>(res, call))
    }
}

fn host<T: HostElem>(res: &Resources, call: &Call) -> Result<()> {
    let topo = &res.topo();
    let (n, nn, me_l, me_node) = (res.nranks(), topo.nnodes, topo.local, topo.node);
    let (c, total, t) = (
        chunk_bytes(res, call),
        call.bytes(),
        res.config().host_timeout,
    );
    let w = c * widen(call.dtype);
    let size = std::mem::size_of::<T>();
    let plain = res.layout().plain_offset;
    let (off_r, off_net) = (n * c, n * c + DEPTH * nn * w);
    let handles = net_handles(res);
    let at = |r: usize, off: usize| res.peer_bases()[r] + (plain + off) as u64;
    let len = |k: usize| total.saturating_sub(k * c).min(c);
    let chunks = total.div_ceil(c);

    host_local_barrier(res, 0)?;
    rail_handshake(res)?;
    let stage_a = |k: usize| -> Result<()> {
        for b in 0..n {
            let src = call.send + (b * total + k * c) as u64;
            // SAFETY: A holds n * c bytes; the input holds n blocks of `total` bytes.
            unsafe { host_copy(at(res.rank(), b * c), src, len(k)) };
        }
        host_local_barrier(res, 0)?;
        for j in 0..nn {
            let block = topo.rank_at(j, me_l);
            let srcs: Vec<*const T> = topo
                .local_ranks
                .iter()
                .map(|&q| at(q, block * c) as usize as *const T)
                .collect();
            let dst = at(res.rank(), off_r + ((k % DEPTH) * nn + j) * w) as usize as *mut T::Acc;
            // SAFETY: every local rank's A holds this chunk (barrier above); R's slot of w
            // bytes is free (module doc); the peers' shared buffers are mapped here.
            unsafe { reduce_to_acc::<T>(call.op, &srcs, dst, len(k) / size) };
        }
        host_local_barrier(res, 0)?;
        let wlen = len(k) / size * std::mem::size_of::<T::Acc>();
        for q in topo.rail_peers() {
            let j = topo.node_of[q];
            let src = plain + off_r + ((k % DEPTH) * nn + j) * w;
            let dst = plain + off_net + ((k % DEPTH) * nn + me_node) * w;
            // SAFETY: a live channel of the net proxy; both ranges lie in the shared buffers.
            unsafe { put_or_signal(&handles[q], dst as u64, src as u64, wlen, t)? };
        }
        Ok(())
    };
    let stage_b = |k: usize| -> Result<()> {
        rail_wait(res)?;
        let srcs: Vec<*const T::Acc> = (0..nn)
            .map(|j| {
                let off = if j == me_node {
                    off_r + ((k % DEPTH) * nn + j) * w
                } else {
                    off_net + ((k % DEPTH) * nn + j) * w
                };
                at(res.rank(), off) as usize as *const T::Acc
            })
            .collect();
        let out = (call.recv + (k * c) as u64) as usize as *mut T;
        // SAFETY: the rail peers' partials have landed (waited above); the output holds the
        // block (in place, the input's chunk was copied into A before).
        unsafe { reduce_from_acc::<T>(call.op, n, &srcs, out, len(k) / size) };
        Ok(())
    };
    hier::host_pipeline(res, chunks, stage_a, stage_b)
}
