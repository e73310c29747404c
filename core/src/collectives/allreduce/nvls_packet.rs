//! All-reduce `nvls_packet` (upstream `AllreduceNvlsPacket`): one hop for small calls. Every
//! rank stores its whole input as LL16 packets (8 data bytes and the call's LL flag per 16-byte
//! packet) into its own slot of the NVLS scratch through the multicast address, so one store
//! lands in every rank's scratch; then every rank reads all `n` slots from its own copy (each
//! packet valid once it carries the flag), reduces them in rank order and writes its output.
//! The switch only broadcasts here, the reduction is local, so every type and op works.
//!
//! Scratch: half `flag & 1` of the NVLS scratch (two halves at fixed offsets 0 and half the
//! scratch, each holding `n` slots of `W = ceil(bytes / 8)` packets); the flag sequence is the framework's LL flags (bumped at the end), so stale
//! packets of any earlier call never match, and a half is reused only two calls later, after
//! every peer read the call in between (it waits for every rank's packets). Block b owns packets
//! `split(W, blocks, b)` of every slot, so it waits only for the same block of its peers.
//! Kernel: kernels/cuda/src/collectives/allreduce/nvls_packet.cu.

use super::super::algorithm::{host_bump_flags, host_flag, native_algorithm, Call, CollArgs};
use super::super::host_ll::{get_packet, load_unit, reduce_units, store_unit, Unit};
use super::super::host_math::{with_elem, HostElem};
use super::super::nvls::{check_usable, count_launch, split, NvlsState, SCRATCH_BYTES};
use super::super::setup::Resources;
use crate::error::{Error, Result};
use crate::kernels;

/// The algorithm object: the NVLS state it shares with the other NVLS variants.
#[derive(Debug, Default)]
pub struct NvlsPacket {
    /// The lazily built NVLS scratch (and bound user buffers) of this communicator.
    pub(crate) nvls: std::sync::Arc<super::super::nvls::NvlsShared>,
}

const WORD: usize = 8;
const PKT: usize = 16;
const THREADS: u32 = 512;

/// Packets per slot.
fn words(call: &Call) -> usize {
    call.bytes().div_ceil(WORD)
}

/// Bytes of one half of the scratch the call uses.
fn half_bytes(call: &Call, n: usize) -> usize {
    n * words(call) * PKT
}

native_algorithm! {
    NvlsPacket: "nvls_packet", AllReduce;
    check(self, res, call) {
        check_usable(self.name(), res)?;
        let need = 2 * half_bytes(call, res.nranks());
        if need > SCRATCH_BYTES {
            return Err(Error::invalid(format!(
                "allreduce nvls_packet: {} bytes over {} ranks need {need} bytes of NVLS scratch, \
                 expected at most {SCRATCH_BYTES}; use nvls_warp_pipeline for this size",
                call.bytes(),
                res.nranks()
            )));
        }
        Ok(())
    }

    launch_gpu(self, res, gpu, call, stream) {
        let Some(st) = self.nvls.state(res, Some((gpu, stream)))? else {
            return Err(Error::invalid(
                "allreduce nvls_packet: the NVLS scratch is bound by the first NVLS call outside \
                 graph capture; run one such call before capturing (or use allpair_packet)",
            ));
        };
        let w = words(call);
        let blocks = w
            .div_ceil(THREADS as usize)
            .clamp(1, res.max_waiting_blocks().min(32)) as u32;
        let mut args = CollArgs::new(res, call);
        args.extra[0] = st.table.ptr();
        args.extra[1] = w as u64;
        args.extra[2] = (st.bytes / 2) as u64;
        let k = kernels::collectives::allreduce::NVLS_PACKET.instance(call.dtype, call.op)?;
        count_launch();
        // SAFETY: CollArgs mirrors the kernel's parameter; the scratch and its table live in
        // `res.ext`; the caller keeps the buffers alive.
        unsafe { gpu.launch(k, blocks, THREADS, &args, stream) }
    }

    run_host(self, res, call) {
        let Some(st) = self.nvls.state(res, None)? else {
            return Err(Error::Internal("NVLS state missing outside capture".into()));
        };
        count_launch();
        with_elem!(call.dtype, T => host::<T>(res, call, &st))
    }
}

fn host<T: HostElem>(res: &Resources, call: &Call, st: &NvlsState) -> Result<()> {
    let (me, n, nb) = (res.rank(), res.nranks(), res.config().host_blocks);
    let total = call.bytes();
    let w = words(call);
    let flag = host_flag(res, 0);
    // Halves at fixed offsets (not sized by the call: a later, smaller call must never write
    // into what a slower peer still reads of the one before).
    let half = u64::from(flag & 1) * (st.bytes / 2) as u64;
    let h = st.channel.device_handle();
    let local = st.channel.device_ptr();
    let slot = |r: usize, j: usize| half + ((r * w + j) * PKT) as u64;
    let t = res.config().host_timeout;
    let mut units: Vec<Unit> = vec![[0u8; 8]; n];
    for b in 0..nb {
        let (j0, j1) = split(w as u64, nb as u64, b as u64);
        let (j0, j1) = (j0 as usize, j1 as usize);
        if j0 == j1 {
            continue;
        }
        let mut pk = Vec::with_capacity(2 * (j1 - j0));
        for j in j0..j1 {
            // SAFETY: the input holds `total` bytes (zero padded past its end).
            let u = unsafe { load_unit(call.send, j, WORD, total) };
            for half_word in [&u[..4], &u[4..]] {
                let d =
                    u32::from_le_bytes([half_word[0], half_word[1], half_word[2], half_word[3]]);
                pk.push((u64::from(flag) << 32) | u64::from(d));
            }
        }
        // SAFETY: the scratch channel is live and bound on every rank; the slot lies inside the
        // scratch (check()).
        unsafe { h.broadcast_words(pk.as_ptr(), slot(me, j0), pk.len() as u64, 0, 1) }?;
        for j in j0..j1 {
            for (r, u) in units.iter_mut().enumerate() {
                // SAFETY: this rank's copy of the scratch holds every slot (check()).
                *u = unsafe { get_packet(local + slot(r, j), WORD, flag, t)? };
            }
            let out = reduce_units::<T>(call.op, n, &units);
            // SAFETY: the output holds `total` bytes.
            unsafe { store_unit(call.recv, j, WORD, total, &out) };
        }
    }
    host_bump_flags(res, flag);
    Ok(())
}
