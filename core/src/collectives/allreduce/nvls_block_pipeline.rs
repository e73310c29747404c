//! All-reduce `nvls_block_pipeline` (upstream `AllreduceNvlsBlockPipeline`, formerly
//! `AllreduceNvlsWithCopy2`): as `nvls_warp_pipeline` (chunks through the NVLS scratch, chunk j
//! done by block `j % blocks`), but each block's region has two stages used alternately, so one
//! handshake per chunk does for two: in its k-th chunk a block 1. copies chunk k into stage
//! `k % 2`, 2. handshakes with the same block of every peer (chunk k is in on every rank, and
//! every rank's sums of chunk k-1 have landed), 3. copies chunk k-1 out of stage `(k-1) % 2`,
//! 4. load-reduces its rank's share of chunk k over every rank's stage `k % 2` and stores the
//! sums into every rank's. After the last chunk one more handshake, then its copy-out. A stage
//! is written again two chunks later, after a handshake that follows every peer's use of it.
//! f32/f16/bf16 sum only (any count); other calls go to the copying fallback.
//! Kernel: kernels/cuda/src/collectives/allreduce/nvls_block_pipeline.cu.

use super::super::algorithm::{host_barrier, Call};
use super::super::mesh::host_copy;
use super::super::nvls::{split, NvlsState};
use super::super::setup::Resources;
use super::nvls_warp_pipeline::{copy_in, nvls_pipeline, region_bytes};
use crate::device_emu::switch_channel::MultimemVector;
use crate::error::{Error, Result};

/// The algorithm object: the NVLS state it shares with the other NVLS variants.
#[derive(Debug, Default)]
pub struct NvlsBlockPipeline {
    /// The lazily built NVLS scratch (and bound user buffers) of this communicator.
    pub(crate) nvls: std::sync::Arc<super::super::nvls::NvlsShared>,
}

nvls_pipeline!(NvlsBlockPipeline: "nvls_block_pipeline", 2, NVLS_BLOCK_PIPELINE, host);

fn host<V: MultimemVector>(res: &Resources, call: &Call, st: &NvlsState) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    let stage = region_bytes(st.bytes, nb, 2);
    if stage == 0 {
        return Err(Error::invalid(format!(
            "allreduce nvls_block_pipeline: {} scratch bytes for {nb} blocks of two stages",
            st.bytes
        )));
    }
    let total = call.bytes();
    let chunks = total.div_ceil(stage);
    let h = st.channel.device_handle();
    let local = st.channel.device_ptr();
    let at = |b: usize, k: usize| (2 * b + k % 2) * stage;
    let span = |j: usize| (j * stage, stage.min(total - j * stage));
    for b in 0..nb {
        let mine: Vec<usize> = (b..chunks).step_by(nb).collect();
        for (k, &j) in mine.iter().enumerate() {
            let (o, l) = span(j);
            let nv = l.div_ceil(16) as u64;
            let s = at(b, k) as u64;
            // SAFETY: the stage lies in this rank's scratch; the input holds `total` bytes.
            unsafe { copy_in(local + s, call.send + o as u64, l, nv as usize * 16) };
            host_barrier(res, b)?;
            if k > 0 {
                let (po, pl) = span(mine[k - 1]);
                // SAFETY: the previous stage holds the previous chunk's sums (handshake above).
                unsafe { host_copy(call.recv + po as u64, local + at(b, k - 1) as u64, pl) };
            }
            let (v0, v1) = split(nv, n as u64, me as u64);
            // SAFETY: the scratch channel is live (kept by `res.ext`) and bound on every rank.
            unsafe { h.all_reduce::<V>(s / 16 + v0, v1 - v0, 0, 1) }?;
        }
        if let Some(&last) = mine.last() {
            host_barrier(res, b)?;
            let (o, l) = span(last);
            // SAFETY: as above, after the final handshake.
            unsafe {
                host_copy(
                    call.recv + o as u64,
                    local + at(b, mine.len() - 1) as u64,
                    l,
                )
            };
        }
    }
    Ok(())
}
