//! All-gather `hier_port`: the hierarchical all-gather of worlds spanning nodes. With L ranks
//! per node and N nodes, per chunk of `C` bytes of every rank's input:
//! 1. across nodes over port channels (the proxy: IB or Ethernet, see net.rs): every rank puts
//!    its chunk to the rank of the same local index on every other node ("rail peers"), so it
//!    then holds its rail's N chunks in its scratch;
//! 2. inside the node over memory: every rank copies its local peers' N chunks (their rails)
//!    into its output.
//!
//! Pipelined: chunk k+1's copy and network puts are issued before chunk k's network wait and
//! intra-node copies, so the proxy moves chunk k+1 while the CPU (or GPU) copies chunk k.
//!
//! Scratch (plain): X `D x N x C` (slot (k mod D, j): node j's chunk of this rail), D = 4.
//! Slot reuse as in `allreduce/hier_rsag_port.rs`: a rail peer puts chunk k only after it
//! received this rank's chunk k-2, sent after this rank (and, by the closing node barrier of
//! chunk k-4, its local peers) finished reading chunk k-4. A handshake with the rail peers and
//! a node barrier open every call.
//!
//! GPU builds run kernels/cuda/src/collectives/allgather/hier_port.cu (the same steps; every
//! block owns a part of every chunk, node-local barriers per block, the rail threads of block 0
//! drive the net port channels between grid barriers; see `allreduce/hier_rsag_port.rs`).
//! Over Ethernet the channels move X slots of the host-mapped network buffer (collectives/
//! net.rs): the own chunk is written to both buffers and the received slots are copied into
//! the shared buffer before the local barrier that lets the local peers read them.

use super::super::algorithm::{host_local_barrier, native_algorithm, Call};
use super::super::allreduce::rsag_port_channel::put_or_signal;
use super::super::hier::{self, net_handles, rail_handshake, rail_wait, Kernel, DEPTH};
use super::super::mesh::{self, host_copy, VEC};
use super::super::setup::Resources;
use crate::error::Result;
use crate::kernels;

/// The algorithm object.
pub struct HierPort;

/// Largest chunk (smaller chunks pipeline deeper).
const MAX_CHUNK: usize = 64 << 10;

fn chunk_bytes(res: &Resources, call: &Call) -> usize {
    let cap = (res.layout().plain_bytes / (DEPTH * res.topo().nnodes)) / VEC * VEC;
    call.bytes().next_multiple_of(VEC).min(cap).min(MAX_CHUNK)
}

native_algorithm! {
    HierPort: "hier_port", AllGather, multi_node = true;
    check(self, res, call) {
        mesh::check_piece(res, chunk_bytes(res, call), "allgather hier_port", DEPTH * res.topo().nnodes * VEC)
    }
    launch_gpu(self, res, gpu, call, stream) {
        // The kernel moves bytes: its count is the bytes per rank.
        let k = Kernel {
            kernel: kernels::collectives::allgather::HIER_PORT,
            what: "allgather hier_port",
            count_bytes: true,
        };
        hier::launch(res, gpu, call, stream, chunk_bytes(res, call), &k)
    }
    run_host(self, res, call) {
        let topo = &res.topo();
        let (nn, me_node) = (topo.nnodes, topo.node);
        let (c, total, t) = (
            chunk_bytes(res, call),
            call.bytes(),
            res.config().host_timeout,
        );
        let plain = res.layout().plain_offset;
        let handles = net_handles(res);
        let slot = |k: usize, j: usize| plain + ((k % DEPTH) * nn + j) * c;
        let at = |r: usize, off: usize| res.peer_bases()[r] + off as u64;
        let len = |k: usize| total.saturating_sub(k * c).min(c);
        let chunks = total.div_ceil(c);

        host_local_barrier(res, 0)?;
        rail_handshake(res)?;
        let stage_a = |k: usize| -> Result<()> {
            let src = call.send + (k * c) as u64;
            // SAFETY: the own X slot holds c bytes; the input holds the chunk.
            unsafe { host_copy(at(res.rank(), slot(k, me_node)), src, len(k)) };
            for q in topo.rail_peers() {
                let off = slot(k, me_node) as u64;
                // SAFETY: a live channel of the net proxy; the range lies in both shared
                // buffers (same offsets).
                unsafe { put_or_signal(&handles[q], off, off, len(k), t)? };
            }
            Ok(())
        };
        let stage_b = |k: usize| -> Result<()> {
            rail_wait(res)?;
            host_local_barrier(res, 0)?;
            for &r in &topo.local_ranks {
                let l = topo.local_of[r];
                for j in 0..nn {
                    let owner = topo.rank_at(j, l);
                    let dst = call.recv + (owner * total + k * c) as u64;
                    // SAFETY: r's X slot (k, j) holds owner's chunk (r waited for it before
                    // the barrier above); the output holds nranks * total bytes. memmove:
                    // in place, the own input slot is copied onto itself.
                    unsafe { host_copy(dst, at(r, slot(k, j)), len(k)) };
                }
            }
            host_local_barrier(res, 0)
        };
        hier::host_pipeline(res, chunks, stage_a, stage_b)
    }
}
