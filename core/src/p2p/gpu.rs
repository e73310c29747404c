//! The GPU point-to-point within a node: one kernel launch per batch
//! (kernels/cuda/src/p2p/batch.cu, whose header describes the protocol) through one receive
//! ring per sending peer and channel in a buffer every peer of the node maps (CudaIpc).
//!
//! Setup (collective): each rank allocates its buffer (communication memory, the kind the
//! collectives' shared buffer uses: peers can map it), zeroes the counters, registers it for
//! CudaIpc and exchanges it with every peer of its node; a device table holds every rank's
//! buffer as mapped here. Per launch the host only packs the operations into the kernel's
//! argument block (by value): no allocation, no synchronisation, so a stream capturing a graph
//! records the launch and replays stay correct (all counters are on the device).
//!
//! Limits: at most [`MAX_OPS_PER_LAUNCH`] operations with other ranks per launch; a larger
//! batch is split into several launches in call order, which can deadlock when the peers'
//! matching operations fall into launches that wait on each other (e.g. a batch with more than
//! 64 sends and 64 receives per peer pattern); sends to self are driver copies on the stream
//! before the launch. Peers on other nodes are refused.

use std::time::Duration;

use mscclpp_hal::{prelude::*, Gpu, LaunchConfig, StreamInterop};

use super::{Dir, P2pOp};
use crate::collectives::RawStream;
use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::identity::host_hash;
use crate::kernels;
use crate::memory::{hal_err, LocalMemory};
use crate::registered_memory::RegisteredMemory;
use crate::transport::{Device, Transport};

/// Operations with other ranks per kernel launch (`P2P_MAX_OPS` of batch.cu).
pub const MAX_OPS_PER_LAUNCH: usize = 128;
/// Channels (rings) per (sender, receiver) pair (`P2P_CHANNELS`).
pub const CHANNELS: usize = 8;
/// Slots per ring (`P2P_SLOTS`).
pub const SLOTS: usize = 4;
/// Payload bytes per slot (`P2P_CHUNK`).
pub const CHUNK: usize = 128 * 1024;
/// Header bytes in front of a slot's payload (`P2P_HEADER`).
const HEADER: usize = 16;
/// Threads per block (`P2P_THREADS`).
const THREADS: u32 = 512;
/// Most blocks of one launch.
const MAX_BLOCKS: usize = 32;
/// Communicator tag of the buffer exchange.
const TAG_MEM: u64 = 0x5032_5001;

/// Offsets inside every rank's point-to-point buffer (the same on every rank; batch.cu's
/// `P2pLayout`).
#[derive(Clone, Copy, Debug)]
pub struct GpuLayout {
    /// World size.
    pub nranks: usize,
}

impl GpuLayout {
    /// `ready[sender][channel]` u64.
    pub fn ready(&self, sender: usize, c: usize) -> usize {
        (sender * CHANNELS + c) * 8
    }
    /// The error words (kind/peer word, detail word).
    pub fn error(&self) -> usize {
        4 * self.nranks * CHANNELS * 8
    }
    /// Start of the rings.
    pub fn rings(&self) -> usize {
        (self.error() + 64).div_ceil(4096) * 4096
    }
    /// Total bytes.
    pub fn total(&self) -> usize {
        self.rings() + self.nranks * CHANNELS * SLOTS * (CHUNK + HEADER)
    }
}

/// `P2pOpDev` of batch.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct OpDev {
    buf: u64,
    bytes: u64,
    peer: u16,
    recv: u8,
    pad: u8,
    pred: i16,
    pair: u16,
}

/// `P2pArgs` of batch.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    base: u64,
    peer_bases: u64,
    host_err: u64,
    timeout_ns: u64,
    nops: u32,
    rank: u32,
    nranks: u32,
    pad: u32,
    ops: [OpDev; MAX_OPS_PER_LAUNCH],
}

const _: () = assert!(std::mem::size_of::<OpDev>() == 24);
const _: () = assert!(std::mem::size_of::<Args>() == 48 + 24 * MAX_OPS_PER_LAUNCH);

pub(super) struct GpuP2p {
    rank: usize,
    nranks: usize,
    local: Vec<bool>,
    mem: LocalMemory,
    table: LocalMemory,
    /// Host-mapped copy of the kernel's error words (kind/peer, detail).
    host_err: LocalMemory,
    host_err_ptr: *const u64,
    max_blocks: usize,
    dev: <Gpu as Api>::Device,
    kernel: <Gpu as Api>::Kernel,
    _module: <Gpu as Api>::Module,
    _registered: RegisteredMemory,
    _peers: Vec<Option<RegisteredMemory>>,
}

// SAFETY: the HAL's device, module and kernel handles are plain driver handles usable from any
// thread (the collectives share them the same way); the rest is Send + Sync.
unsafe impl Send for GpuP2p {}
// SAFETY: as above; `run` only reads them.
unsafe impl Sync for GpuP2p {}

impl GpuP2p {
    pub(super) fn setup(comm: &Communicator, device: Device) -> Result<GpuP2p> {
        let b = comm.bootstrap();
        let (rank, nranks) = (b.rank(), b.nranks());
        if nranks > u16::MAX as usize {
            return Err(Error::invalid(format!(
                "point-to-point on GPUs: at most {} ranks, got {nranks}",
                u16::MAX
            )));
        }
        let hosts = b.all_gather(&host_hash().to_le_bytes())?;
        let local: Vec<bool> = (0..nranks).map(|p| hosts[p] == hosts[rank]).collect();
        let dev_key: Vec<u8> = device.id.to_le_bytes().to_vec();
        let keys = b.all_gather(&dev_key)?;
        let ranks_per_device = (0..nranks)
            .filter(|&p| local[p] && keys[p] == dev_key)
            .count()
            .max(1);
        let dev = crate::memory::gpu_device(device.id)?;
        let props = Gpu::properties(&dev).map_err(|e| hal_err("GPU properties", e))?;
        // Every rank's blocks spin on its peers': all of them must fit on the GPU together.
        let max_blocks = (props.sm_count as usize / ranks_per_device).clamp(1, MAX_BLOCKS);
        let k = kernels::p2p::BATCH;
        let code = k.object().code().ok_or_else(|| {
            Error::invalid(format!(
                "point-to-point: this build embeds no code object `{}` (built without a GPU \
                 feature, or with MSCCLPP_SKIP_DEVICE_CODE=1?)",
                k.object().stem()
            ))
        })?;
        let module = Gpu::load_module(&dev, code).map_err(|e| hal_err("load p2p kernels", e))?;
        let kernel =
            Gpu::get_kernel(&module, k.name()).map_err(|e| hal_err("look up p2p_batch", e))?;

        let layout = GpuLayout { nranks };
        let kind = crate::gpu_buffer::communication_memory_kind(device);
        let mem = LocalMemory::alloc_kind(device, layout.total(), kind)?;
        mem.write(0, &vec![0u8; layout.rings()])?;
        let registered = comm.register_memory(mem.ptr(), mem.size(), Transport::CudaIpc.into())?;
        let futures: Vec<_> = (0..nranks)
            .map(|p| (p != rank && local[p]).then(|| comm.recv_memory(p, TAG_MEM)))
            .collect();
        for p in (0..nranks).filter(|&p| p != rank && local[p]) {
            comm.send_memory(&registered, p, TAG_MEM)?;
        }
        let mut peers = Vec::with_capacity(nranks);
        for (p, f) in futures.into_iter().enumerate() {
            let m = f.map(|f| f.get()).transpose()?;
            if let Some(m) = &m {
                if m.data() == 0 || m.size() < layout.total() {
                    return Err(Error::remote(
                        p,
                        format!(
                            "point-to-point: expected the peer's buffer of {} bytes mapped here, \
                             got {} bytes at {:#x}",
                            layout.total(),
                            m.size(),
                            m.data()
                        ),
                    ));
                }
            }
            peers.push(m);
        }
        let bases: Vec<u8> = (0..nranks)
            .flat_map(|p| {
                let a = if p == rank {
                    mem.ptr()
                } else {
                    peers[p].as_ref().map_or(0, |m| m.data())
                };
                a.to_le_bytes()
            })
            .collect();
        let table = LocalMemory::alloc(device, bases.len())?;
        table.write(0, &bases)?;
        let host_err = LocalMemory::alloc_kind(device, 64, mscclpp_hal::MemoryKind::HostMapped)?;
        host_err.write(0, &[0u8; 64])?;
        let host_err_ptr = host_err
            .host_ptr()
            .ok_or_else(|| {
                Error::Internal("point-to-point: host-mapped memory without a host address".into())
            })?
            .cast::<u64>()
            .cast_const();
        // A peer's first launch writes into this rank's buffer: start when all are set up.
        b.barrier()?;
        Ok(GpuP2p {
            rank,
            nranks,
            local,
            mem,
            table,
            host_err,
            host_err_ptr,
            max_blocks,
            dev,
            kernel,
            _module: module,
            _registered: registered,
            _peers: peers,
        })
    }

    pub(super) fn reaches(&self, peer: usize) -> bool {
        self.local.get(peer).copied().unwrap_or(false)
    }

    /// # Safety
    /// As [`super::PointToPoint::run`].
    pub(super) unsafe fn run(
        &self,
        ops: &[P2pOp],
        self_pairs: &[(P2pOp, P2pOp)],
        stream: RawStream,
        timeout: Duration,
    ) -> Result<()> {
        self.device_error(timeout)?;
        if let Some(op) = ops.iter().find(|o| !self.reaches(o.peer)) {
            return Err(Error::invalid(format!(
                "point-to-point between nodes on GPU builds is not supported yet (a {:?} of \
                 rank {} with rank {}, on another node)",
                op.dir, self.rank, op.peer
            )));
        }
        // SAFETY: the caller's live stream of this device (or 0); ownership stays with it.
        let s = unsafe { Gpu::borrow_stream(&self.dev, stream) };
        for (snd, rcv) in self_pairs {
            if snd.bytes > 0 && snd.buf != rcv.buf {
                // SAFETY: the caller's buffers, valid until the stream ran the copy.
                unsafe { Gpu::memcpy_async(&s, rcv.buf, snd.buf, snd.bytes) }
                    .map_err(|e| hal_err("point-to-point copy to self", e))?;
            }
        }
        let remote: Vec<&P2pOp> = ops
            .iter()
            .filter(|o| o.peer != self.rank && o.bytes > 0)
            .collect();
        for part in remote.chunks(MAX_OPS_PER_LAUNCH) {
            let mut args = Args {
                base: self.mem.ptr(),
                peer_bases: self.table.ptr(),
                host_err: self.host_err.ptr(),
                timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
                nops: part.len() as u32,
                rank: self.rank as u32,
                nranks: self.nranks as u32,
                pad: 0,
                ops: [OpDev::default(); MAX_OPS_PER_LAUNCH],
            };
            // (peer, direction) pairs in order of first appearance, and the last op of each.
            let mut pairs: Vec<(usize, Dir, usize)> = Vec::new();
            let mut keys = 0usize;
            for (i, op) in part.iter().enumerate() {
                let (pair, pred) = match pairs
                    .iter_mut()
                    .enumerate()
                    .find(|(_, (p, d, _))| *p == op.peer && *d == op.dir)
                {
                    Some((j, entry)) => {
                        let pred = entry.2 as i16;
                        entry.2 = i;
                        (j, pred)
                    }
                    None => {
                        pairs.push((op.peer, op.dir, i));
                        (pairs.len() - 1, -1)
                    }
                };
                let nch = op.bytes.div_ceil(CHUNK).min(CHANNELS);
                keys = keys.max(pair * CHANNELS + nch);
                args.ops[i] = OpDev {
                    buf: op.buf,
                    bytes: op.bytes as u64,
                    peer: op.peer as u16,
                    recv: u8::from(op.dir == Dir::Recv),
                    pad: 0,
                    pred,
                    pair: pair as u16,
                };
            }
            let blocks = keys.clamp(1, self.max_blocks) as u32;
            // SAFETY: Args mirrors P2pArgs; the buffers are the caller's (valid until the
            // stream ran the batch) and this object's (alive while `self` is).
            unsafe {
                Gpu::launch(
                    &self.kernel,
                    &LaunchConfig::linear(blocks, THREADS),
                    &s,
                    &args,
                )
            }
            .map_err(|e| hal_err("launch p2p_batch", e))?;
        }
        Ok(())
    }

    pub(super) fn device_error(&self, timeout: Duration) -> Result<()> {
        // SAFETY: the two words of `host_err`, host-mapped and alive with `self`; the kernel
        // stores the detail before the word (release).
        let (word, detail) = unsafe {
            let word = std::ptr::read_volatile(self.host_err_ptr);
            if word == 0 {
                return Ok(());
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            (word, std::ptr::read_volatile(self.host_err_ptr.add(1)))
        };
        let kind = (word >> 48) & 0x7fff;
        let recv = (word >> 40) & 0xff != 0;
        let peer = (word & 0xffff_ffff) as usize;
        let what = if recv { "receive from" } else { "send to" };
        Err(match kind {
            1 => Error::timeout(
                format!(
                    "point-to-point on the GPU: a {what} rank {peer} (operation {detail} of its \
                     launch) made no progress: expected the peer to post the matching call"
                ),
                timeout,
            ),
            2 => Error::invalid(format!(
                "point-to-point on the GPU: a {what} rank {peer}: the matching send sends \
                 {detail} bytes, the receive expected another size: expected the same count and \
                 datatype on both sides"
            )),
            _ => Error::remote(
                peer,
                format!("point-to-point on the GPU: malformed chunk header {detail:#x}"),
            ),
        })
    }
}
