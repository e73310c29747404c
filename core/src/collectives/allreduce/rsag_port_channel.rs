//! All-reduce `rsag_port_channel`: reduce-scatter + all-gather whose transfers go through port
//! channels: the GPU pushes `put_with_signal` requests into the proxy's FIFO, the proxy (a host
//! thread) copies on the CudaIpc connection (the copy engine) and signals the peer; `flush`
//! closes the launch. The proxy path used by a collective; any size (chunks).
//!
//! Scratch (plain): A `n x S` (the peers' slices of the input), RS `n x S` (slot r: rank r's
//! contribution to the own slice), AG `n x S` (slot r: rank r's reduced slice), RD `S` (the
//! own reduced slice), `S = min(slice, plain / (3n + 1))` rounded down to 16. Chunk k covers
//! input bytes `[k n S, (k + 1) n S)`, slice r at `k n S + r S`. Phases (grid barriers between):
//! 1. every block copies its part of every peer's slice into A;
//! 2. for every peer p: put slice p of A into slot `me` of p's RS area with a signal, wait for
//!    p's signal;
//! 3. reduce the own slice (input + RS slots, rank order) into the output and RD;
//! 4. put RD into slot `me` of every peer's AG area with a signal, wait;
//! 5. copy the peers' AG slots into the output.
//!
//! A handshake (semaphore row 0) opens the launch, so peers are inside it before the proxy
//! writes into their scratch. Scratch reuse between chunks is ordered by the signals (a peer
//! sends its AG put only after it received the RS put of the same chunk, so A and RD are free
//! again when the next chunk's waits return), and the final flush makes every copy of this
//! rank complete before the launch ends.
//!
//! The proxy and channels are built at the first call outside graph capture
//! (`super::super::port`); a call captured before that fails with the reason.
//! Kernel: kernels/cuda/src/collectives/allreduce/rsag_port_channel.cu.

use super::super::algorithm::{host_barrier, native_algorithm, Call};
use super::super::host_math::{reduce_into, with_elem, HostElem};
use super::super::mesh::{self, host_copy, part, peers, Grid, VEC};
use super::super::port::{self, PortState};
use super::super::setup::Resources;
use crate::error::Result;
use crate::kernels;

/// The algorithm object: the proxy and port channels it shares with all-gather
/// `port_channel`.
#[derive(Debug, Default)]
pub struct RsagPortChannel {
    /// The lazily built proxy and channels (shared with the other port-channel algorithms of
    /// the same collection).
    pub(crate) port: std::sync::Arc<port::PortChannels>,
}

/// Most blocks of a launch (they meet at grid barriers, so they must all be resident).
const MAX_BLOCKS: usize = 16;
/// Bytes of a slice per block the grid is sized for.
const BYTES_PER_BLOCK: usize = 128 << 10;

/// Slice bytes per chunk.
fn slice_bytes(res: &Resources, call: &Call) -> usize {
    let n = res.nranks();
    let cap = (res.layout().plain_bytes / (3 * n + 1)) / VEC * VEC;
    call.bytes().div_ceil(n).next_multiple_of(VEC).min(cap)
}

native_algorithm! {
    RsagPortChannel: "rsag_port_channel", AllReduce;
    check(self, res, call) {
        mesh::check_piece(res, slice_bytes(res, call), "allreduce rsag_port_channel", (3 * res.nranks() + 1) * VEC)
    }

    launch_gpu(self, res, gpu, call, stream) {
        let st = self.port.built(res, Some((gpu, stream)), "allreduce rsag_port_channel")?;
        let s = slice_bytes(res, call);
        let k = kernels::collectives::allreduce::RSAG_PORT_CHANNEL.instance(call.dtype, call.op)?;
        let g = Grid {
            want: s.div_ceil(BYTES_PER_BLOCK),
            limit: MAX_BLOCKS,
        };
        // SAFETY: the kernel takes one CollArgs; the channel table lives in `res.ext`; the
        // caller keeps the buffers alive.
        unsafe { mesh::launch(res, gpu, call, stream, k, g, &[st.table.data(), s as u64]) }
    }

    run_host(self, res, call) {
        let st = self.port.built(res, None, "allreduce rsag_port_channel")?;
        with_elem!(call.dtype, T => host::<T>(res, call, &st))
    }
}

fn host<T: HostElem>(res: &Resources, call: &Call, st: &PortState) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    let (size, total, s) = (
        std::mem::size_of::<T>(),
        call.bytes(),
        slice_bytes(res, call),
    );
    let t = res.config().host_timeout;
    let (off_a, off_rs, off_ag, off_rd) = (0, n * s, 2 * n * s, 3 * n * s);
    let plain = res.layout().plain_offset;
    let mine = res.peer_bases()[me] + plain as u64;
    let mut srcs: Vec<*const T> = vec![std::ptr::null(); n];
    host_barrier(res, 0)?;
    let mut at0 = 0;
    while at0 < total {
        let len = |r: usize| total.saturating_sub(at0 + r * s).min(s);
        for b in 0..nb {
            for p in peers(me, n) {
                let (x0, x1) = part(len(p), nb, b);
                let dst = mine + (off_a + p * s + x0) as u64;
                // SAFETY: area A of the own scratch and the slice part of the input.
                unsafe { host_copy(dst, call.send + (at0 + p * s + x0) as u64, x1 - x0) };
            }
        }
        // The proxy copies A slot p to peer p's RS slot `me`; then p's copy has landed here.
        for p in peers(me, n) {
            let h = &st.handles[p];
            let (dst, src) = (
                (plain + off_rs + me * s) as u64,
                (plain + off_a + p * s) as u64,
            );
            // SAFETY: the handle is a live channel of this rank's proxy; offsets lie in the
            // shared buffers (check()).
            unsafe { put_or_signal(h, dst, src, len(p), t)? };
        }
        for p in peers(me, n) {
            // SAFETY: as above.
            unsafe { st.handles[p].wait(t)? };
        }
        for b in 0..nb {
            let (x0, x1) = part(len(me), nb, b);
            for (r, src) in srcs.iter_mut().enumerate() {
                *src = if r == me {
                    (call.send + (at0 + me * s + x0) as u64) as usize as *const T
                } else {
                    (mine + (off_rs + r * s + x0) as u64) as usize as *const T
                };
            }
            let out = call.recv + (at0 + me * s + x0) as u64;
            // SAFETY: the sources hold the part (the peers' puts were waited for); in place,
            // each element is read before it is written.
            unsafe {
                reduce_into::<T>(call.op, n, out as usize as *mut T, &srcs, (x1 - x0) / size)
            };
            // SAFETY: area RD of the own scratch.
            unsafe { host_copy(mine + (off_rd + x0) as u64, out, x1 - x0) };
        }
        for p in peers(me, n) {
            let (dst, src) = ((plain + off_ag + me * s) as u64, (plain + off_rd) as u64);
            // SAFETY: as above.
            unsafe { put_or_signal(&st.handles[p], dst, src, len(me), t)? };
        }
        for p in peers(me, n) {
            // SAFETY: as above.
            unsafe { st.handles[p].wait(t)? };
        }
        for b in 0..nb {
            for p in peers(me, n) {
                let (x0, x1) = part(len(p), nb, b);
                let src = mine + (off_ag + p * s + x0) as u64;
                // SAFETY: peer p's reduced slice has landed in AG slot p (waited above).
                unsafe { host_copy(call.recv + (at0 + p * s + x0) as u64, src, x1 - x0) };
            }
        }
        at0 += n * s;
    }
    for p in peers(me, n) {
        // SAFETY: as above.
        unsafe { st.handles[p].flush(t)? };
    }
    Ok(())
}

/// `put_with_signal` of `len` bytes, or only a signal when there is nothing to put.
///
/// # Safety
/// `h` is a live channel of this rank's proxy; the ranges lie inside the channel's memories.
pub(crate) unsafe fn put_or_signal(
    h: &crate::port_channel::PortChannelDeviceHandle,
    dst: u64,
    src: u64,
    len: usize,
    t: std::time::Duration,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe {
        if len > 0 {
            h.put_with_signal(dst, src, len as u64, t)
        } else {
            h.signal(t)
        }
    }
}
