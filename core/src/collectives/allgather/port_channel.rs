//! All-gather `port_channel`: the transfers go through port channels: the GPU pushes
//! `put_with_signal` requests into the proxy's FIFO, the proxy (a host thread) copies on the
//! CudaIpc connection (the copy engine) and signals the peer; `flush` closes the launch. Any
//! size (chunks).
//!
//! Scratch (plain): A `C` bytes (this rank's chunk), then G `n x C` (slot r: rank r's chunk),
//! `C = plain / (n + 1)` rounded down to 16. Per chunk, phases with grid barriers between:
//! 1. handshake with every peer (semaphore row 0: the peer finished reading its G slots of
//!    the previous chunk and received this rank's previous put, so A is free too);
//! 2. every block copies its part of the chunk into A (and into the own output slot when out
//!    of place);
//! 3. for every peer p: put A into slot `me` of p's G area with a signal, wait for p's signal;
//! 4. every block copies its part of every peer's G slot into the output.
//!
//! The final flush makes every copy of this rank complete before the launch ends.
//!
//! The proxy and channels are built at the first call outside graph capture
//! (`super::super::port`); a call captured before that fails with the reason.
//! Kernel: kernels/cuda/src/collectives/allgather/port_channel.cu (one kernel for every type).

use super::super::algorithm::{host_barrier, native_algorithm};
use super::super::allreduce::rsag_port_channel::put_or_signal;
use super::super::mesh::{self, host_copy, part, peers, Grid, VEC};
use super::super::port;
use super::super::setup::Resources;
use crate::kernels;

/// The algorithm object: the proxy and port channels it shares with `rsag_port_channel`.
#[derive(Debug, Default)]
pub struct PortChannel {
    /// The lazily built proxy and channels (shared with the other port-channel algorithms of
    /// the same collection).
    pub(crate) port: std::sync::Arc<port::PortChannels>,
}

/// Most blocks of a launch (they meet at grid barriers, so they must all be resident).
const MAX_BLOCKS: usize = 16;
/// Bytes of a chunk per block the grid is sized for.
const BYTES_PER_BLOCK: usize = 128 << 10;

fn chunk_bytes(res: &Resources) -> usize {
    (res.layout().plain_bytes / (res.nranks() + 1)) / VEC * VEC
}

native_algorithm! {
    PortChannel: "port_channel", AllGather;
    check(self, res, _call) {
        mesh::check_piece(res, chunk_bytes(res), "allgather port_channel", (res.nranks() + 1) * VEC)
    }

    launch_gpu(self, res, gpu, call, stream) {
        let st = self.port.built(res, Some((gpu, stream)), "allgather port_channel")?;
        let c = chunk_bytes(res);
        let want = call.bytes().min(c).div_ceil(BYTES_PER_BLOCK);
        let k = kernels::collectives::allgather::PORT_CHANNEL;
        let extra = [st.table.data(), c as u64, call.bytes() as u64];
        let g = Grid {
            want,
            limit: MAX_BLOCKS,
        };
        // SAFETY: the kernel takes one CollArgs; the channel table lives in `res.ext`; the
        // caller keeps the buffers alive.
        unsafe { mesh::launch(res, gpu, call, stream, k, g, &extra) }
    }

    run_host(self, res, call) {
        let st = self.port.built(res, None, "allgather port_channel")?;
        let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
        let (c_max, total, t) = (chunk_bytes(res), call.bytes(), res.config().host_timeout);
        let plain = res.layout().plain_offset;
        let mine = res.peer_bases()[me] + plain as u64;
        let own = call.recv + (me * total) as u64;
        let mut start = 0;
        while start < total {
            let c = c_max.min(total - start);
            host_barrier(res, 0)?;
            for b in 0..nb {
                let (x0, x1) = part(c, nb, b);
                let src = call.send + (start + x0) as u64;
                // SAFETY: area A of the own scratch, the chunk part of the input and of the own
                // output slot (memmove when in place).
                unsafe {
                    host_copy(mine + x0 as u64, src, x1 - x0);
                    host_copy(own + (start + x0) as u64, src, x1 - x0);
                }
            }
            for p in peers(me, n) {
                let dst = (plain + c_max + me * c_max) as u64;
                // SAFETY: the handle is a live channel of this rank's proxy; offsets lie in the
                // shared buffers (check()).
                unsafe { put_or_signal(&st.handles[p], dst, plain as u64, c, t)? };
            }
            for p in peers(me, n) {
                // SAFETY: as above.
                unsafe { st.handles[p].wait(t)? };
            }
            for b in 0..nb {
                let (x0, x1) = part(c, nb, b);
                for p in peers(me, n) {
                    let src = mine + (c_max + p * c_max + x0) as u64;
                    let dst = call.recv + (p * total + start + x0) as u64;
                    // SAFETY: peer p's chunk has landed in G slot p (waited above).
                    unsafe { host_copy(dst, src, x1 - x0) };
                }
            }
            start += c;
        }
        for p in peers(me, n) {
            // SAFETY: as above.
            unsafe { st.handles[p].flush(t)? };
        }
        Ok(())
    }
}
