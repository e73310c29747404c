//! All-reduce `nvls_zero_copy` (upstream `AllreduceNvlsZeroCopy`): the user's input and output
//! are bound to multicast objects of their own (once per `(address, size)`, collectively; see
//! `nvls::user_channel`), and rank r reduces its share of the input straight in
//! the switch (`multimem.ld_reduce` over the input's multicast address) and stores the sums into
//! every rank's output at once (`multimem.st` to the output's multicast address). No scratch, no
//! copy.
//!
//! Per block b: 1. handshake with block b of every peer (their inputs are ready and their
//! outputs free); 2. load-reduce + store its vectors (`block_vectors`); 3. handshake (every
//! rank's part of this output has landed). In place, input and output are one channel. A byte
//! count that is not a multiple of 16 ends in 4-byte words (f32x1, f16x2, bf16x2), done by the
//! last rank's last block; an odd f16/bf16 count cannot be reduced by multimem and goes to the
//! fallback, as do types and ops multimem does not reduce, buffers not bindable on every rank
//! (not allocated by this library) and buffers first seen under graph capture.
//! Kernel: kernels/cuda/src/collectives/allreduce/nvls_zero_copy.cu.

use super::super::algorithm::{host_barrier, native_algorithm, Call};
use super::super::mesh::{self, Grid};
use super::super::nvls::{
    block_vectors, check_with_fallback, count_launch, fallback, multimem_reduces, with_vec16,
    NvlsShared, UserChannel,
};
use super::super::setup::Resources;
use super::super::types::DataType;
use crate::device_emu::switch_channel::{Bf16x2, F16x2, F32x1, MultimemVector};
use crate::error::Result;
use crate::kernels;
use crate::switch_channel::SwitchChannelDeviceHandle;
use std::sync::Arc;

/// The algorithm object: the NVLS state it shares with the other NVLS variants.
#[derive(Debug, Default)]
pub struct NvlsZeroCopy {
    /// The lazily built NVLS scratch (and bound user buffers) of this communicator.
    pub(crate) nvls: std::sync::Arc<super::super::nvls::NvlsShared>,
}

/// Vectors per block the grid is sized for.
const VECTORS_PER_BLOCK: u64 = 4096;

fn supported(call: &Call) -> bool {
    multimem_reduces(call) && call.bytes().is_multiple_of(4)
}

type Bound = (Arc<UserChannel>, Arc<UserChannel>);

fn bound(
    nvls: &NvlsShared,
    res: &Resources,
    call: &Call,
    capturing: bool,
) -> Result<Option<Bound>> {
    let b = call.bytes();
    let Some(i) = nvls.user_channel(res, call.send, b, capturing)? else {
        return Ok(None);
    };
    if call.recv == call.send {
        return Ok(Some((i.clone(), i)));
    }
    Ok(nvls
        .user_channel(res, call.recv, b, capturing)?
        .map(|o| (i, o)))
}

native_algorithm! {
    NvlsZeroCopy: "nvls_zero_copy", AllReduce;
    check(self, res, call) {
        check_with_fallback(self.name(), res, call)
    }

    launch_gpu(self, res, gpu, call, stream) {
        let chans = if supported(call) {
            bound(&self.nvls, res, call, gpu.is_capturing(stream)?)?
        } else {
            None
        };
        let Some((ins, outs)) = chans else {
            return fallback()?.launch_gpu(res, gpu, call, stream);
        };
        let nv = (call.bytes() / 16) as u64;
        let want = nv.div_ceil(res.nranks() as u64 * VECTORS_PER_BLOCK).max(1) as usize;
        let k = kernels::collectives::allreduce::NVLS_ZERO_COPY.instance(call.dtype, call.op)?;
        let extra = [ins.table.ptr(), outs.table.ptr()];
        count_launch();
        // SAFETY: the kernel takes one CollArgs; the handle tables live in the cache (kept by
        // `res`); the caller keeps the buffers alive.
        unsafe { mesh::launch(res, gpu, call, stream, k, Grid { want, limit: 64 }, &extra) }
    }

    run_host(self, res, call) {
        let chans = if supported(call) {
            bound(&self.nvls, res, call, false)?
        } else {
            None
        };
        let Some((ins, outs)) = chans else {
            return fallback()?.run_host(res, call);
        };
        let (i, o) = (ins.channel.device_handle(), outs.channel.device_handle());
        count_launch();
        with_vec16!(call.dtype, V => host::<V>(res, call, &i, &o))
    }
}

fn host<V: MultimemVector>(
    res: &Resources,
    call: &Call,
    ins: &SwitchChannelDeviceHandle,
    outs: &SwitchChannelDeviceHandle,
) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    let bytes = call.bytes() as u64;
    let nv = bytes / 16;
    for b in 0..nb {
        host_barrier(res, b)?;
        let (v0, v1) = block_vectors(nv, n, me, nb, b);
        // SAFETY: both handles come from live channels of every rank (bound above, kept by the
        // cache); the range lies inside the buffers.
        unsafe { ins.reduce_store_to::<V>(outs, v0, v1 - v0, 0, 1) }?;
        if me == n - 1 && b == nb - 1 && !bytes.is_multiple_of(16) {
            let (w0, wn) = (nv * 4, (bytes % 16) / 4);
            // SAFETY: as above; the tail words lie inside the buffers.
            unsafe {
                match call.dtype {
                    DataType::F32 => ins.reduce_store_to::<F32x1>(outs, w0, wn, 0, 1),
                    DataType::F16 => ins.reduce_store_to::<F16x2>(outs, w0, wn, 0, 1),
                    _ => ins.reduce_store_to::<Bf16x2>(outs, w0, wn, 0, 1),
                }
            }?;
        }
        host_barrier(res, b)?;
    }
    Ok(())
}
