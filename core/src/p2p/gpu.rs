//! The GPU point-to-point within a node: one kernel launch per batch
//! (kernels/cuda/src/p2p/batch.cu, whose header describes the protocol): messages up to
//! [`LL_MAX`] bytes as LL packets straight into the receiver's buffer (one one-way trip, no
//! fence), larger ones through one receive ring per sending peer and channel, in a buffer every
//! peer of the node maps (CudaIpc). A receive into the buffer a send of the same launch to the
//! same peer reads (in-place all-to-all) waits, chunk by chunk, for the send to have read it.
//!
//! Setup (collective): each rank allocates its buffer (communication memory, the kind the
//! collectives' shared buffer uses: peers can map it), zeroes the counters, registers it for
//! CudaIpc and exchanges it with every peer of its node; a device table holds every rank's
//! buffer as mapped here. Per launch the host only packs the operations into the kernel's
//! argument block (by value): no allocation, no synchronisation, so a stream capturing a graph
//! records the launch and replays stay correct (all counters are on the device).
//!
//! Kernels: `p2p_ll` / `p2p_ll_big` when every op of a launch is an LL message (one block per
//! (peer, direction) pair, per-thread packet waits), else `p2p_batch_small` /
//! `p2p_batch` (chunks of [`chunk_of`] over up to [`CHANNELS`] channels; a copy to self
//! spreads over twice the channels; `MSCCLPP_P2P_TUNE` ([`P2pTune`]) changes these for speed
//! runs, the same on every rank: setup checks). A batch of more than
//! [`MAX_OPS_PER_LAUNCH`] ops is split into launches by matching index ([`launches`]), so
//! matched messages always share a launch number on both ends. Peers on other nodes are
//! refused.
//!
//! The direct all-to-all (`all_to_all_direct`, kernel `p2p_a2a_direct`): an all-to-all
//! captured into a graph, with blocks of at least the tune's `direct` KiB, registers its
//! receive buffer at capture, the ranks agree in one bootstrap all-gather, and each rank writes
//! its blocks straight into the peers' receive buffers (one copy instead of two); otherwise it
//! runs as the sends and receives above.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mscclpp_hal::{prelude::*, Gpu, LaunchConfig, StreamInterop};

use super::{Dir, P2pOp};
use crate::collectives::RawStream;
use crate::communicator::Communicator;
use crate::env::P2pTune;
use crate::error::{Error, Result};
use crate::identity::host_hash;
use crate::kernels;
use crate::memory::{hal_err, LocalMemory};
use crate::registered_memory::RegisteredMemory;
use crate::transport::{Device, Transport};

/// Operations with other ranks per kernel launch (`P2P_MAX_OPS` of batch.cu).
pub const MAX_OPS_PER_LAUNCH: usize = 128;
/// Channels (rings) per (sender, receiver) pair by default ([`P2pTune::channels`]).
pub const CHANNELS: usize = 16;
/// Channel counters per (sender, receiver) pair (`P2P_MAX_CHANNELS`): the most channels.
pub const MAX_CHANNELS: usize = 32;
/// Ring slots of [`CHUNK`] per sender by default (`P2pArgs::ringSlots`, [`P2pTune::ring`]):
/// channels x slots per channel.
pub const RING_SLOTS: usize = 64;
/// Slots per ring by default (`RING_SLOTS / CHANNELS`).
pub const SLOTS: usize = RING_SLOTS / CHANNELS;
/// Payload bytes per slot (`P2P_CHUNK`): the largest chunk by default (`MSCCLPP_P2P_TUNE`'s
/// `chunk` joins 2, 4 or 8 slots into one).
pub const CHUNK: usize = 128 * 1024;
/// The smallest chunk (`P2P_MIN_CHUNK`): a chunked message is cut into chunks of a quarter of
/// a channel's share (a multiple of 4 KiB) clamped to `[MIN_CHUNK, max chunk]` ([`chunk_of`],
/// the max 128 KiB = [`CHUNK`] unless `MSCCLPP_P2P_TUNE` sets `chunk`). Equal to
/// [`CHUNK`] for now: on the H200 (2 ranks sharing it, nccl-tests sendrecv, 2026-12-04) chunks
/// of a sixteenth took 47 us at 512 KiB and 56 us at 4 MiB where fixed 128 KiB chunks had
/// taken 17 and 32 (same at 32 MiB); the sizing stays for a tuning run.
pub const MIN_CHUNK: usize = CHUNK;
/// Header bytes in front of a slot's payload (`P2P_HEADER`).
const HEADER: usize = 16;
/// Messages of at most this many bytes travel as LL packets (`P2P_LL_MAX`; measured on one
/// H200, 2 ranks: LL took 6.2 us at 1 KiB, 7.6 at 16 KiB, 13.4 at 64 KiB, where one chunk
/// took 10.4).
pub const LL_MAX: usize = 16 * 1024;
/// Launches of at most this many operations use `p2p_batch_small` or `p2p_ll`
/// (`P2P_SMALL_OPS`): a 240-byte argument block instead of 3 KiB (on one H200 under MPS a 1 KiB
/// exchange took the same 6.2 us either way through `p2p_batch`: the argument copy is not its
/// fixed cost).
const SMALL_OPS: usize = 8;
/// Bytes of one LL buffer: a header packet and 16-byte packets of 8 data bytes each
/// (`P2P_LL_BUF_BYTES`).
const LL_BUF: usize = (1 + LL_MAX / 8) * 16;
/// Threads per block (`P2P_THREADS`).
const THREADS: u32 = 512;
/// Most blocks of one launch.
const MAX_BLOCKS: usize = 64;
/// Communicator tag of the buffer exchange.
const TAG_MEM: u64 = 0x5032_5001;
/// The direct all-to-all's most ranks (`P2P_A2A_MAX_RANKS`: receive buffers by value).
pub const A2A_MAX_RANKS: usize = 16;
/// The direct all-to-all's most blocks (`P2P_A2A_MAX_BLOCKS`).
pub const A2A_MAX_BLOCKS: usize = 64;
/// Bytes of each send block per block of a direct all-to-all launch (the grid: at most
/// [`A2A_MAX_BLOCKS`] and the point-to-point block limit, the same on every rank).
const A2A_BYTES_PER_BLOCK: usize = 32 << 10;

/// Offsets inside every rank's point-to-point buffer (the same on every rank; batch.cu's
/// `P2pLayout`).
#[derive(Clone, Copy, Debug)]
pub struct GpuLayout {
    /// World size.
    pub nranks: usize,
    /// Ring slots of [`CHUNK`] per sender ([`P2pTune::ring`]).
    pub ring_slots: usize,
}

impl GpuLayout {
    /// `ready[sender][channel]` u64.
    pub fn ready(&self, sender: usize, c: usize) -> usize {
        (sender * MAX_CHANNELS + c) * 8
    }
    /// The error words (kind/peer word, detail word), after the chunk counters (4 per sender
    /// and channel) and the LL counters (3 per peer).
    pub fn error(&self) -> usize {
        4 * self.nranks * MAX_CHANNELS * 8 + 3 * self.nranks * 8
    }
    /// The direct all-to-all's word of block `b` of `sender` (batch.cu's `P2pLayout::a2a`).
    pub fn a2a(&self, sender: usize, b: usize) -> usize {
        self.error() + 64 + (sender * A2A_MAX_BLOCKS + b) * 8
    }
    /// The direct all-to-all's launch count of block `b` of this rank.
    pub fn a2a_seq(&self, b: usize) -> usize {
        self.a2a(self.nranks, 0) + b * 8
    }
    /// LL buffer `k` (0 or 1) of messages from `sender`.
    pub fn ll(&self, sender: usize, k: usize) -> usize {
        self.a2a_seq(A2A_MAX_BLOCKS).div_ceil(4096) * 4096 + (sender * 2 + k) * LL_BUF
    }
    /// Start of the rings; everything before it starts zeroed (counters, LL flags).
    pub fn rings(&self) -> usize {
        self.ll(self.nranks, 0).div_ceil(4096) * 4096
    }
    /// Total bytes.
    pub fn total(&self) -> usize {
        self.rings() + self.nranks * self.ring_slots * (CHUNK + HEADER)
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

/// `P2pArgsN<N>` of batch.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct Args<const N: usize> {
    base: u64,
    peer_bases: u64,
    host_err: u64,
    timeout_ns: u64,
    nops: u32,
    rank: u32,
    nranks: u32,
    npairs: u32,
    /// `P2P_TUNE_*` bits.
    flags: u32,
    channels: u32,
    slots: u32,
    abort_poll: u32,
    max_chunk: u32,
    slot_bytes: u32,
    ring_slots: u32,
    pad: u32,
    ops: [OpDev; N],
}

/// `P2pA2aArgs` of batch.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct A2aArgs {
    base: u64,
    peer_bases: u64,
    host_err: u64,
    timeout_ns: u64,
    send: u64,
    per: u64,
    rank: u32,
    nranks: u32,
    recv: [u64; A2A_MAX_RANKS],
}

const _: () = assert!(std::mem::size_of::<A2aArgs>() == 56 + 8 * A2A_MAX_RANKS);

/// `P2P_TUNE_FENCE`, `P2P_TUNE_UNROLL4`, `P2P_TUNE_NO_SELF_SPREAD` of batch.cu.
const TUNE_FENCE: u32 = 1;
const TUNE_UNROLL4: u32 = 2;
const TUNE_NO_SELF_SPREAD: u32 = 4;
/// `P2P_TUNE_PACKED`.
const TUNE_PACKED: u32 = 8;

const _: () = assert!(std::mem::size_of::<OpDev>() == 24);
const _: () =
    assert!(std::mem::size_of::<Args<MAX_OPS_PER_LAUNCH>>() == 80 + 24 * MAX_OPS_PER_LAUNCH);
const _: () = assert!(std::mem::size_of::<Args<SMALL_OPS>>() == 80 + 24 * SMALL_OPS);

/// The largest chunk under `tune` (`P2pArgs::maxChunk`): [`P2pTune::chunk_kib`].
fn max_chunk(tune: &P2pTune) -> usize {
    (tune.chunk_kib as usize) << 10
}

/// Slots per channel's ring under `tune` (`P2pArgs::slots`): the sender's [`P2pTune::ring`]
/// slots of [`CHUNK`] over the channels, joined `max chunk / CHUNK` at a time.
fn ring_slots(tune: &P2pTune) -> usize {
    tune.ring as usize / (tune.channels as usize * (max_chunk(tune) / CHUNK))
}

/// Chunk bytes of a chunked message (batch.cu's `chunkOf`): a quarter of the share of each of
/// `tune.channels` channels, rounded down to 4 KiB, clamped to `[MIN_CHUNK, max chunk]`.
pub fn chunk_of(bytes: usize, tune: &P2pTune) -> usize {
    ((bytes / (4 * tune.channels as usize)) & !4095).clamp(MIN_CHUNK, max_chunk(tune))
}

/// Chunks of a message (batch.cu's `chunksOf`): one LL message up to [`LL_MAX`].
fn chunks_of(bytes: usize, tune: &P2pTune) -> usize {
    if bytes <= LL_MAX {
        1
    } else {
        bytes.div_ceil(chunk_of(bytes, tune))
    }
}

/// Channels of a message of `bytes` (batch.cu's `channelsOf`): one per chunk up to
/// [`P2pTune::channels`].
fn channels_of(bytes: usize, tune: &P2pTune) -> usize {
    chunks_of(bytes, tune).min(tune.channels as usize)
}

/// One launch's operations as the kernel takes them.
struct Plan {
    ops: Vec<OpDev>,
    /// (peer, direction) pairs.
    npairs: usize,
    /// Blocks that own a task: task (op, channel) is block `pair + channel * npairs` (a copy
    /// to self: virtual channel `v` of `2 * channels` on the pair of op `k + (v & 1)`, channel
    /// `v >> 1`; without the self spread, channel `v` of its own pair).
    tasks: usize,
    /// Whether `p2p_ll` may run the launch (one block per pair): every op at most [`LL_MAX`]
    /// bytes, and a pair that both sends and receives (in place) sends at most twice (more
    /// could wait on the peer's block in a circle).
    ll: bool,
}

/// Packs `part` (at most [`MAX_OPS_PER_LAUNCH`] ops with other ranks): each op's (peer,
/// direction) pair in order of first appearance and the pair's op before it (`pred`, per-pair
/// order); when a receive reads into the very buffer of a send of this launch to the same peer
/// (in place: same address and size), every receive from that peer takes the sends' pair for
/// its blocks, so the same blocks own both and the kernel can hold the receive behind the send
/// (batch.cu finds the send alike).
fn plan(part: &[&P2pOp], rank: usize, tune: &P2pTune) -> Plan {
    // (peer, direction, last op of the pair so far)
    let mut pairs: Vec<(usize, Dir, usize)> = Vec::new();
    let mut ops = Vec::with_capacity(part.len());
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
        ops.push(OpDev {
            buf: op.buf,
            bytes: op.bytes as u64,
            peer: op.peer as u16,
            recv: u8::from(op.dir == Dir::Recv),
            pad: 0,
            pred,
            pair: pair as u16,
        });
    }
    // In place: every op of the (peer, receive) pair moves to the blocks of the (peer, send)
    // pair (the pair's order and the in-place hold live in one block's memory).
    for (i, r) in part.iter().enumerate() {
        let send = part.iter().position(|s| {
            r.dir == Dir::Recv
                && s.dir == Dir::Send
                && s.peer == r.peer
                && s.buf == r.buf
                && s.bytes == r.bytes
        });
        if let Some(j) = send {
            let (from, to) = (ops[i].pair, ops[j].pair);
            for (o, d) in part.iter().zip(ops.iter_mut()) {
                if o.dir == Dir::Recv && o.peer == r.peer && d.pair == from {
                    d.pair = to;
                }
            }
        }
    }
    let mut npairs = pairs.len();
    if tune.ll_merge && part.iter().all(|o| o.bytes <= LL_MAX) {
        let mut merged = ops.clone();
        let n = merge_peer_pairs(&mut merged, &pairs, rank);
        if ll_fits(part, &merged, n) {
            (ops, npairs) = (merged, n);
        }
    }
    let most = tune.channels as usize;
    let spread = if tune.self_spread { 2 } else { 1 };
    // Channels of each pair (a copy to self: virtual channel v on the pair of op k + v % spread,
    // channel v / spread; its receive is op k + 1, `run` puts it there).
    let mut width = vec![0usize; npairs];
    for (k, (op, d)) in part.iter().zip(&ops).enumerate() {
        if op.peer != rank {
            let w = &mut width[d.pair as usize];
            *w = (*w).max(channels_of(op.bytes, tune));
        } else if op.dir == Dir::Send {
            let nv = chunks_of(op.bytes, tune).min(spread * most);
            for side in 0..spread.min(nv) {
                let p = ops.get(k + side).map_or(d.pair, |o| o.pair) as usize;
                width[p] = width[p].max((nv - side).div_ceil(spread));
            }
        }
    }
    // Task (pair p, channel c) is block p + c * npairs, or (packed) the sum of the widths of
    // the pairs before p, + c (batch.cu alike).
    let mut tasks = if tune.packed {
        width.iter().sum()
    } else {
        (0..npairs)
            .filter(|&p| width[p] > 0)
            .map(|p| p + (width[p] - 1) * npairs + 1)
            .max()
            .unwrap_or(0)
    };
    tasks = tasks.max(npairs.min(1));
    let ll = ll_fits(part, &ops, npairs);
    Plan {
        ops,
        npairs,
        tasks,
        ll,
    }
}

/// Whether `p2p_ll` may run `part` packed as `ops` on `npairs` blocks: every op at most
/// [`LL_MAX`] bytes, and a pair that receives sends at most twice (more could wait on the
/// peer's block in a circle: a send waits for the message two before it to be read).
fn ll_fits(part: &[&P2pOp], ops: &[OpDev], npairs: usize) -> bool {
    let mut sends = vec![0usize; npairs];
    let mut recvs = vec![0usize; npairs];
    for (op, d) in part.iter().zip(ops) {
        match op.dir {
            Dir::Send => sends[d.pair as usize] += 1,
            Dir::Recv => recvs[d.pair as usize] += 1,
        }
    }
    part.iter().all(|o| o.bytes <= LL_MAX) && (0..npairs).all(|p| recvs[p] == 0 || sends[p] <= 2)
}

/// `ll_merge` ([`P2pTune::ll_merge`]): the receives from a peer join the blocks of the sends
/// to it (`p2p_ll` runs a block's sends before its receives), pairs renumbered in order of
/// first use; copies to self keep theirs. Returns the pairs left.
fn merge_peer_pairs(ops: &mut [OpDev], pairs: &[(usize, Dir, usize)], rank: usize) -> usize {
    let to: Vec<usize> = pairs
        .iter()
        .enumerate()
        .map(|(j, &(peer, dir, _))| {
            let send = pairs
                .iter()
                .position(|&(p, d, _)| p == peer && d == Dir::Send);
            match send {
                Some(k) if dir == Dir::Recv && peer != rank => k,
                _ => j,
            }
        })
        .collect();
    let mut index = vec![usize::MAX; pairs.len()];
    let mut next = 0;
    for d in ops.iter_mut() {
        let t = to[d.pair as usize];
        if index[t] == usize::MAX {
            index[t] = next;
            next += 1;
        }
        d.pair = index[t] as u16;
    }
    next
}

/// Splits a batch of more than [`MAX_OPS_PER_LAUNCH`] operations into launches by matching
/// index: op `m` of its (peer, direction) pair (in call order) goes to launch
/// `m / (MAX_OPS_PER_LAUNCH / (2 * nranks))`, and its peer puts the matching op (also number
/// `m` of its pair) into the launch of the same number, so every launch's messages are matched
/// within the launches of the same number on both ends (no launch waits on a later one of a
/// peer) and per-pair order is kept. A level above [`MAX_OPS_PER_LAUNCH`] ops (only past 64
/// ranks) is cut further in order. Order within a launch is `list`'s, so a copy to self (a send
/// followed by its receive, both number `m`) stays adjacent.
fn launches<'a>(list: &[&'a P2pOp], nranks: usize) -> Vec<Vec<&'a P2pOp>> {
    if list.len() <= MAX_OPS_PER_LAUNCH {
        return vec![list.to_vec()];
    }
    let per = (MAX_OPS_PER_LAUNCH / (2 * nranks.max(1))).max(1);
    let mut seen: std::collections::HashMap<(usize, Dir), usize> = Default::default();
    let mut levels: Vec<Vec<&P2pOp>> = Vec::new();
    for &op in list {
        let m = seen.entry((op.peer, op.dir)).or_insert(0);
        let l = *m / per;
        *m += 1;
        if levels.len() <= l {
            levels.resize_with(l + 1, Vec::new);
        }
        levels[l].push(op);
    }
    levels
        .into_iter()
        .flat_map(|l| {
            l.chunks(MAX_OPS_PER_LAUNCH)
                .map(<[&P2pOp]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Threads per block of a `p2p_ll` launch of `part`: one per packet of its largest message
/// (header included) in whole warps, at most [`THREADS`] ([`P2pTune::ll_fit`]; else always
/// [`THREADS`]). The kernel's loops stride by its block size, so any count works.
fn ll_threads(part: &[&P2pOp], tune: &P2pTune) -> u32 {
    if !tune.ll_fit {
        return THREADS;
    }
    let packets = part
        .iter()
        .map(|o| 1 + o.bytes.div_ceil(8))
        .max()
        .unwrap_or(1);
    (packets.next_multiple_of(32) as u32).min(THREADS)
}

/// The kernel's `flags` word of `tune`.
fn tune_flags(tune: &P2pTune) -> u32 {
    let mut f = 0;
    if tune.fence {
        f |= TUNE_FENCE;
    }
    if tune.unroll == 4 {
        f |= TUNE_UNROLL4;
    }
    if !tune.self_spread {
        f |= TUNE_NO_SELF_SPREAD;
    }
    if tune.packed {
        f |= TUNE_PACKED;
    }
    f
}

/// `MSCCLPP_P2P_TUNE` of this rank, checked against every rank's (`all` in rank order: the
/// channel count decides where each chunk travels, so both ends must agree).
fn agreed_tune(mine: P2pTune, all: &[Vec<u8>]) -> Result<P2pTune> {
    let enc = tune_bytes(&mine);
    match all.iter().position(|t| *t != enc) {
        None => Ok(mine),
        Some(r) => Err(Error::invalid(format!(
            "point-to-point: MSCCLPP_P2P_TUNE differs between the ranks (this rank: {mine:?}; \
             rank {r}: another value): expected the same on every rank"
        ))),
    }
}

/// The bytes of `tune` exchanged at setup.
fn tune_bytes(t: &P2pTune) -> Vec<u8> {
    [
        t.channels,
        tune_flags(t),
        t.unroll,
        t.abort_poll,
        t.chunk_kib,
        t.ring,
        u32::from(t.ll_fit),
    ]
    .iter()
    .flat_map(|v| v.to_le_bytes())
    .collect()
}

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
    /// `MSCCLPP_P2P_TUNE`, the same on every rank (checked at setup).
    tune: P2pTune,
    dev: <Gpu as Api>::Device,
    kernel: <Gpu as Api>::Kernel,
    /// `p2p_batch_small`.
    kernel_small: <Gpu as Api>::Kernel,
    /// `p2p_ll` (launches of LL messages only) and `p2p_ll_big` (more than [`SMALL_OPS`]).
    kernel_ll: <Gpu as Api>::Kernel,
    kernel_ll_big: <Gpu as Api>::Kernel,
    /// `p2p_a2a_direct`.
    kernel_a2a: <Gpu as Api>::Kernel,
    /// For the direct all-to-all's registrations (bootstrap, memory exchange).
    comm: Arc<Communicator>,
    /// The direct all-to-all's registrations, kept while this object lives (a captured graph
    /// may replay them at any time).
    direct: Mutex<DirectCache>,
    _module: <Gpu as Api>::Module,
    _registered: RegisteredMemory,
    _peers: Vec<Option<RegisteredMemory>>,
}

// SAFETY: the HAL's device, module and kernel handles are plain driver handles usable from any
// thread (the collectives share them the same way); the rest is Send + Sync.
unsafe impl Send for GpuP2p {}
// SAFETY: as above; `run` only reads them.
unsafe impl Sync for GpuP2p {}

/// The direct all-to-all's registrations: this rank's receive buffers by `(address, size)`,
/// and the peers' as mapped here by their serialized registration (a registration the peer
/// keeps sends the same bytes again, so it maps once).
#[derive(Default)]
struct DirectCache {
    mine: HashMap<(u64, usize), RegisteredMemory>,
    theirs: HashMap<Vec<u8>, RegisteredMemory>,
}

/// Sets the thread's capture mode to relaxed while it lives ([`StreamInterop::relax_capture_mode`]):
/// registering and mapping memory under a global-mode capture.
struct RelaxedCapture(u32);

impl RelaxedCapture {
    fn new() -> Result<RelaxedCapture> {
        Gpu::relax_capture_mode()
            .map(RelaxedCapture)
            .map_err(|e| hal_err("relax the stream capture mode", e))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Err(e) = Gpu::restore_capture_mode(self.0) {
            crate::log_warn!("P2P", "restoring the stream capture mode failed: {e}");
        }
    }
}

impl GpuP2p {
    pub(super) fn setup(comm: &Arc<Communicator>, device: Device) -> Result<GpuP2p> {
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
        // Every rank takes part in the exchange, a malformed MSCCLPP_P2P_TUNE too (its bytes
        // differ from every valid value's, so every rank fails).
        let tune = crate::env::env().p2p_tune_for(nranks);
        let enc = tune.as_ref().map_or_else(|_| b"bad".to_vec(), tune_bytes);
        let tunes = b.all_gather(&enc)?;
        let tune = agreed_tune(tune?, &tunes)?;
        let ranks_per_device = (0..nranks)
            .filter(|&p| local[p] && keys[p] == dev_key)
            .count()
            .max(1);
        let dev = crate::memory::gpu_device(device.id)?;
        let props = Gpu::properties(&dev).map_err(|e| hal_err("GPU properties", e))?;
        // Every rank's blocks spin on its peers': all of them must fit on the GPU together.
        let max_blocks = (props.sm_count as usize / ranks_per_device).clamp(1, MAX_BLOCKS);
        let k = kernels::p2p::batch::P2P_BATCH;
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
        let kernel_small = Gpu::get_kernel(&module, kernels::p2p::batch::P2P_BATCH_SMALL.name())
            .map_err(|e| hal_err("look up p2p_batch_small", e))?;
        let kernel_ll = Gpu::get_kernel(&module, kernels::p2p::batch::P2P_LL.name())
            .map_err(|e| hal_err("look up p2p_ll", e))?;
        let kernel_ll_big = Gpu::get_kernel(&module, kernels::p2p::batch::P2P_LL_BIG.name())
            .map_err(|e| hal_err("look up p2p_ll_big", e))?;
        let kernel_a2a = Gpu::get_kernel(&module, kernels::p2p::batch::P2P_A2A_DIRECT.name())
            .map_err(|e| hal_err("look up p2p_a2a_direct", e))?;

        let layout = GpuLayout {
            nranks,
            ring_slots: tune.ring as usize,
        };
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
            tune,
            dev,
            kernel,
            kernel_small,
            kernel_ll,
            kernel_ll_big,
            kernel_a2a,
            comm: comm.clone(),
            direct: Mutex::new(DirectCache::default()),
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
        let remote: Vec<&P2pOp> = ops
            .iter()
            .filter(|o| o.peer != self.rank && o.bytes > 0)
            .collect();
        let copies = self_pairs
            .iter()
            .filter(|(snd, rcv)| snd.bytes > 0 && snd.buf != rcv.buf);
        if remote.is_empty() {
            for (snd, rcv) in copies {
                // SAFETY: the caller's buffers, valid until the stream ran the copy.
                unsafe { Gpu::memcpy_async(&s, rcv.buf, snd.buf, snd.bytes) }
                    .map_err(|e| hal_err("point-to-point copy to self", e))?;
            }
            return Ok(());
        }
        // Copies to self run in the kernel beside the transfers, each as its send followed by
        // its receive (both the same matching index, so `launches` keeps them together).
        let mut list: Vec<&P2pOp> = copies.flat_map(|(snd, rcv)| [snd, rcv]).collect();
        list.extend(remote);
        for part in launches(&list, self.nranks) {
            let plan = plan(&part, self.rank, &self.tune);
            // p2p_ll: every block of the launch resident at once (its blocks wait only on
            // peers, never on each other, but every rank's must fit together).
            if plan.ll && plan.npairs <= self.max_blocks {
                let blocks = (plan.npairs as u32, ll_threads(&part, &self.tune));
                if part.len() <= SMALL_OPS {
                    let args = self.args::<SMALL_OPS>(&plan, timeout);
                    // SAFETY: as below (p2p_ll takes the small argument block).
                    unsafe { self.launch(&self.kernel_ll, blocks, &s, &args) }?;
                } else {
                    let args = self.args::<MAX_OPS_PER_LAUNCH>(&plan, timeout);
                    // SAFETY: as below.
                    unsafe { self.launch(&self.kernel_ll_big, blocks, &s, &args) }?;
                }
                continue;
            }
            let blocks = (plan.tasks.clamp(1, self.max_blocks) as u32, THREADS);
            if part.len() <= SMALL_OPS {
                let args = self.args::<SMALL_OPS>(&plan, timeout);
                // SAFETY: as below.
                unsafe { self.launch(&self.kernel_small, blocks, &s, &args) }?;
            } else {
                let args = self.args::<MAX_OPS_PER_LAUNCH>(&plan, timeout);
                // SAFETY: Args mirrors P2pArgsN; the buffers are the caller's (valid until the
                // stream ran the batch) and this object's (alive while `self` is).
                unsafe { self.launch(&self.kernel, blocks, &s, &args) }?;
            }
        }
        Ok(())
    }

    /// The direct all-to-all: block `p` of `per` bytes at `send` straight into block `rank`
    /// of rank `p`'s receive buffer (`recv`), one launch on `stream`, when the stream captures
    /// a graph, `per` is at least the tune's `direct` KiB, every rank is on this node (at most
    /// [`A2A_MAX_RANKS`]) and every rank could register its receive buffer and map every
    /// peer's (agreed in one bootstrap all-gather, so all ranks take the same path; the
    /// registrations stay while this object lives, for the graph's replays). `Ok(false)`: not
    /// taken, run the all-to-all as sends and receives. Graph capture decides locally: every
    /// rank must capture its all-to-alls alike (as with NCCL's graph registration), or the
    /// all-gather fails at the bootstrap's timeout. In place (overlapping buffers) a rank
    /// declines (a peer would overwrite a block this rank still sends).
    ///
    /// # Safety
    /// As [`super::PointToPoint::run`], for `nranks * per` bytes of each buffer.
    pub(super) unsafe fn all_to_all_direct(
        &self,
        (send, recv): (u64, u64),
        per: usize,
        stream: RawStream,
        timeout: Duration,
    ) -> Result<bool> {
        let min = self.tune.direct_kib as usize * 1024;
        let n = self.nranks;
        if min == 0 || per < min || n > A2A_MAX_RANKS || !self.local.iter().all(|&l| l) {
            return Ok(false);
        }
        // SAFETY: the caller's live stream of this device (or 0); ownership stays with it.
        let s = unsafe { Gpu::borrow_stream(&self.dev, stream) };
        if !Gpu::is_capturing(&s).map_err(|e| hal_err("query stream capture", e))? {
            return Ok(false);
        }
        self.device_error(timeout)?;
        let total = per
            .checked_mul(n)
            .ok_or_else(|| Error::invalid("all-to-all: nranks x bytes overflows"))?;
        let overlap = send < recv + total as u64 && recv < send + total as u64;
        let b = self.comm.bootstrap();
        let mut cache = self.direct.lock().unwrap_or_else(|p| p.into_inner());
        let relaxed = RelaxedCapture::new()?;
        let mine = if overlap {
            None
        } else {
            match cache.mine.get(&(recv, total)).filter(|m| m.is_current()) {
                Some(m) => Some(m.clone()),
                None => match self
                    .comm
                    .register_memory(recv, total, Transport::CudaIpc.into())
                {
                    Ok(m) => {
                        crate::log_info!(
                            "P2P",
                            "all-to-all receive buffer {recv:#x} (+{total} bytes) registered at \
                             graph capture: the peers write straight into it"
                        );
                        cache.mine.insert((recv, total), m.clone());
                        Some(m)
                    }
                    Err(e) => {
                        crate::log_info!(
                            "P2P",
                            "all-to-all receive buffer {recv:#x} (+{total} bytes) cannot be \
                             registered, the ranks copy through the rings instead: {e}"
                        );
                        None
                    }
                },
            }
        };
        // [registered, blocks this rank can run at once, its registration]: every rank runs
        // the smallest grid (block b waits for block b of every peer: all must be resident).
        let grid = per
            .div_ceil(A2A_BYTES_PER_BLOCK)
            .clamp(1, A2A_MAX_BLOCKS.min(self.max_blocks)) as u8;
        let mut blob = vec![u8::from(mine.is_some()), grid];
        if let Some(m) = &mine {
            blob.extend_from_slice(&m.serialize());
        }
        let all = b.all_gather(&blob)?;
        if !all.iter().all(|x| x.len() > 2 && x[0] == 1) {
            return Ok(false);
        }
        let blocks = all.iter().map(|x| x[1]).min().unwrap_or(1).max(1) as u32;
        let mut bases = [0u64; A2A_MAX_RANKS];
        let mut mapped = Ok(());
        for (p, x) in all.iter().enumerate() {
            if p == self.rank {
                bases[p] = recv;
                continue;
            }
            let m = match cache.theirs.get(&x[2..]) {
                Some(m) => Ok(m.clone()),
                None => RegisteredMemory::deserialize(&x[2..]),
            };
            match m {
                Ok(m) if m.data() != 0 && m.size() >= total => {
                    bases[p] = m.data();
                    cache.theirs.entry(x[2..].to_vec()).or_insert(m);
                }
                Ok(m) => {
                    mapped = Err(Error::remote(
                        p,
                        format!(
                            "all-to-all: expected the peer's receive buffer of {total} bytes \
                             mapped here, got {} bytes at {:#x}",
                            m.size(),
                            m.data()
                        ),
                    ));
                }
                Err(e) => mapped = Err(e),
            }
        }
        drop(relaxed);
        if let Err(e) = &mapped {
            crate::log_info!(
                "P2P",
                "all-to-all: mapping a peer's receive buffer failed here, the ranks copy \
                 through the rings instead: {e}"
            );
        }
        let oks = b.all_gather(&[u8::from(mapped.is_ok())])?;
        if !oks.iter().all(|x| x.first() == Some(&1)) {
            return Ok(false);
        }
        drop(cache);
        let args = A2aArgs {
            base: self.mem.ptr(),
            peer_bases: self.table.ptr(),
            host_err: self.host_err.ptr(),
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            send,
            per: per as u64,
            rank: self.rank as u32,
            nranks: n as u32,
            recv: bases,
        };
        // SAFETY: A2aArgs mirrors P2pA2aArgs; the buffers are the caller's (valid until the
        // stream ran the launch) and the peers' receive buffers, registered and mapped above
        // and kept in the cache while `self` lives.
        unsafe {
            Gpu::launch(
                &self.kernel_a2a,
                &LaunchConfig::linear(blocks, THREADS),
                &s,
                &args,
            )
        }
        .map_err(|e| hal_err("launch p2p_a2a_direct", e))?;
        Ok(true)
    }

    /// The kernel's argument block for `plan` (at most `N` operations).
    fn args<const N: usize>(&self, plan: &Plan, timeout: Duration) -> Args<N> {
        let mut args = Args {
            base: self.mem.ptr(),
            peer_bases: self.table.ptr(),
            host_err: self.host_err.ptr(),
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            nops: plan.ops.len() as u32,
            rank: self.rank as u32,
            nranks: self.nranks as u32,
            npairs: plan.npairs as u32,
            flags: tune_flags(&self.tune),
            channels: self.tune.channels,
            slots: ring_slots(&self.tune) as u32,
            max_chunk: max_chunk(&self.tune) as u32,
            slot_bytes: (max_chunk(&self.tune) + HEADER) as u32,
            ring_slots: self.tune.ring,
            pad: 0,
            abort_poll: self.tune.abort_poll,
            ops: [OpDev::default(); N],
        };
        args.ops[..plan.ops.len()].copy_from_slice(&plan.ops);
        args
    }

    /// # Safety
    /// `args` is the argument block of `kernel` (`Args<N>` for its N), its buffers valid until
    /// the stream ran the launch.
    unsafe fn launch<const N: usize>(
        &self,
        kernel: &<Gpu as Api>::Kernel,
        (blocks, threads): (u32, u32),
        s: &<Gpu as Api>::Stream,
        args: &Args<N>,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { Gpu::launch(kernel, &LaunchConfig::linear(blocks, threads), s, args) }
            .map_err(|e| hal_err("launch p2p_batch", e))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(list: &[(Dir, usize, u64, usize)]) -> Vec<P2pOp> {
        list.iter()
            .map(|&(d, p, b, n)| P2pOp::new(d, p, b, n))
            .collect()
    }

    /// Rank 0's operations of an all-to-all of 2 ranks, `bytes` per block: the copy to itself
    /// (a send and its receive), then the exchange with rank 1.
    fn all_to_all_of_rank0(bytes: usize) -> Vec<P2pOp> {
        ops(&[
            (Dir::Send, 0, 0x1000_0000, bytes),
            (Dir::Recv, 0, 0x2000_0000, bytes),
            (Dir::Send, 1, 0x3000_0000, bytes),
            (Dir::Recv, 1, 0x4000_0000, bytes),
        ])
    }

    /// The plan of `o` on rank 0 with the default tune.
    fn plan0(o: &[P2pOp]) -> Plan {
        plan(&o.iter().collect::<Vec<_>>(), 0, &P2pTune::default())
    }

    #[test]
    fn small_exchange_runs_on_one_block_per_pair() {
        let o = ops(&[(Dir::Send, 1, 0x1000, 1024), (Dir::Recv, 1, 0x2000, 1024)]);
        let p = plan0(&o);
        assert_eq!((p.npairs, p.tasks), (2, 2));
        assert_eq!((p.ops[0].pair, p.ops[1].pair), (0, 1));
    }

    #[test]
    fn large_exchange_uses_every_channel() {
        let big = 64 << 20;
        let o = ops(&[
            (Dir::Send, 1, 0x1000, big),
            (Dir::Recv, 1, 0x9000_0000, big),
        ]);
        let p = plan0(&o);
        assert_eq!(p.tasks, 2 * CHANNELS);
        // Just above the LL limit: one chunk, on channel 0.
        let o = ops(&[(Dir::Send, 1, 0x1000, LL_MAX + 1)]);
        assert_eq!(plan0(&o).tasks, 1);
    }

    #[test]
    fn in_place_receive_shares_the_send_s_blocks_and_order_stays_per_pair() {
        // An in-place all-to-all of rank 0 of 3 (self blocks are not in a launch).
        let o = ops(&[
            (Dir::Send, 1, 0x100, 64),
            (Dir::Recv, 1, 0x100, 64),
            (Dir::Send, 2, 0x140, 64),
            (Dir::Recv, 2, 0x140, 64),
            (Dir::Recv, 1, 0x500, 64),
        ]);
        let p = plan0(&o);
        assert_eq!(p.npairs, 4);
        assert_eq!(p.ops[1].pair, p.ops[0].pair);
        assert_eq!(p.ops[3].pair, p.ops[2].pair);
        // The later receive from rank 1 is not in place but follows op 1: the same blocks.
        assert_eq!((p.ops[4].pair, p.ops[4].pred), (0, 1));
        // A receive of another size from the same address is not in place.
        let o = ops(&[(Dir::Send, 1, 0x100, 64), (Dir::Recv, 1, 0x100, 32)]);
        assert_eq!(plan0(&o).ops[1].pair, 1);
    }

    #[test]
    fn chunks_are_a_quarter_of_a_channel_share_clamped() {
        // Round 7's sizes (128 KiB chunks, 8 MiB rings); the default's 256 KiB below.
        let t = P2pTune {
            chunk_kib: 128,
            ring: 64,
            ..P2pTune::default()
        };
        assert_eq!(chunk_of(LL_MAX + 1, &t), MIN_CHUNK);
        assert_eq!(chunk_of(1 << 20, &t), (16 << 10).clamp(MIN_CHUNK, CHUNK));
        assert_eq!(chunk_of(64 << 20, &t), CHUNK);
        assert_eq!(chunk_of((1 << 20) + 3, &t) % 4096, 0);
        // 1 MiB: chunks of chunk_of(1 MiB), one channel each up to CHANNELS.
        let c = (1usize << 20).div_ceil(chunk_of(1 << 20, &t));
        assert_eq!(
            (chunks_of(1 << 20, &t), channels_of(1 << 20, &t)),
            (c, c.min(CHANNELS))
        );
        assert_eq!(chunks_of(LL_MAX, &t), 1);
        assert_eq!(chunks_of(LL_MAX + 1, &t), (LL_MAX + 1).div_ceil(MIN_CHUNK));
        // Larger chunks (tune chunk=512): a quarter of a channel's share from 128 KiB up.
        let big = P2pTune {
            chunk_kib: 512,
            ..t
        };
        assert_eq!(chunk_of(4 << 20, &big), CHUNK);
        assert_eq!(chunk_of(16 << 20, &big), 256 << 10);
        assert_eq!(chunk_of(64 << 20, &big), 512 << 10);
        assert_eq!(chunk_of(1 << 30, &big), 512 << 10);
    }

    #[test]
    fn ll_launch_only_for_small_messages() {
        let o = ops(&[(Dir::Send, 1, 0x1000, 1024), (Dir::Recv, 1, 0x2000, 1024)]);
        assert!(plan0(&o).ll);
        let o = ops(&[
            (Dir::Send, 1, 0x1000, LL_MAX + 1),
            (Dir::Recv, 1, 0x2000, 1024),
        ]);
        assert!(!plan0(&o).ll);
        // Many ops (p2p_ll_big), one block per pair.
        let many: Vec<P2pOp> = (0..SMALL_OPS + 1)
            .map(|i| P2pOp::new(Dir::Send, 1 + i % 3, 0x1000 * i as u64, 8))
            .collect();
        let p = plan0(&many);
        assert!(p.ll && p.npairs == 3);
        // In place: a pair that sends and receives may send at most twice.
        let o = ops(&[(Dir::Send, 1, 0x100, 64), (Dir::Recv, 1, 0x100, 64)]);
        assert!(plan0(&o).ll);
        let o = ops(&[
            (Dir::Send, 1, 0x100, 64),
            (Dir::Send, 1, 0x200, 64),
            (Dir::Send, 1, 0x300, 64),
            (Dir::Recv, 1, 0x100, 64),
        ]);
        assert!(!plan0(&o).ll);
    }

    #[test]
    fn copy_to_self_uses_its_receive_s_blocks_too() {
        // Rank 0: a 4 MiB copy to itself (32 chunks of 128 KiB) and an exchange with rank 1.
        let p = plan0(&all_to_all_of_rank0(4 << 20));
        assert_eq!(p.npairs, 4);
        // Every pair's 16 channels have a block: 64, the copy's half on the receive's pair.
        assert_eq!(p.tasks, 4 * CHANNELS);
        assert!(!p.ll);
    }

    #[test]
    fn tune_changes_channels_and_the_self_spread() {
        let o = all_to_all_of_rank0(64 << 20);
        let refs = o.iter().collect::<Vec<_>>();
        let wide = P2pTune {
            channels: 32,
            ..P2pTune::default()
        };
        assert_eq!(plan(&refs, 0, &wide).tasks, 4 * 32);
        // Without the spread the copy to self keeps to its own pair's blocks (pair 0): the
        // last task is still the receive from rank 1 (pair 3) on channel 15.
        let narrow = P2pTune {
            self_spread: false,
            ..P2pTune::default()
        };
        assert_eq!(plan(&refs[..2], 0, &narrow).tasks, 1 + 15 * 2);
        assert_eq!(plan(&refs[..2], 0, &P2pTune::default()).tasks, 2 + 15 * 2);
        assert_eq!(plan(&refs, 0, &narrow).tasks, 4 + 15 * 4);
        assert_eq!(
            tune_flags(&P2pTune {
                fence: true,
                unroll: 4,
                self_spread: false,
                packed: true,
                ..P2pTune::default()
            }),
            TUNE_FENCE | TUNE_UNROLL4 | TUNE_NO_SELF_SPREAD | TUNE_PACKED
        );
        // Packed: pair after pair, as many blocks as tasks (one chunk to rank 1 on pair 0, 16
        // channels to rank 2 on pair 1), where the interleaved layout spans 1 + 15 * 2 + 1.
        let o = ops(&[
            (Dir::Send, 1, 0x1000, LL_MAX + 1),
            (Dir::Send, 2, 0x10_0000, 4 << 20),
        ]);
        let refs = o.iter().collect::<Vec<_>>();
        let packed = P2pTune {
            packed: true,
            ..P2pTune::default()
        };
        assert_eq!(plan(&refs, 0, &P2pTune::default()).tasks, 32);
        assert_eq!(plan(&refs, 0, &packed).tasks, 1 + 16);
        // The copy to self's halves count on both of its pairs.
        let o = all_to_all_of_rank0(64 << 20);
        let refs = o.iter().collect::<Vec<_>>();
        assert_eq!(plan(&refs, 0, &packed).tasks, 4 * 16);
    }

    #[test]
    fn every_tuned_ring_fits_the_sender_s_space() {
        for ring in [64, 128, 256] {
            for channels in [1, 2, 4, 8, 16, 32] {
                for chunk_kib in [128, 256, 512, 1024] {
                    let t = P2pTune {
                        channels,
                        chunk_kib,
                        ring,
                        ..P2pTune::default()
                    };
                    if channels * chunk_kib / 128 > ring / 2 {
                        continue; // refused by the parser (env.rs)
                    }
                    let slots = ring_slots(&t);
                    assert!(slots >= 2, "{t:?}");
                    let end = channels as usize * slots * (max_chunk(&t) + HEADER);
                    let l = GpuLayout {
                        nranks: 2,
                        ring_slots: ring as usize,
                    };
                    assert!(end * 2 <= l.total() - l.rings(), "{t:?}");
                }
            }
        }
        assert_eq!(ring_slots(&P2pTune::default()), SLOTS);
    }

    #[test]
    fn ll_blocks_fit_the_largest_message() {
        let o = ops(&[(Dir::Send, 1, 0x1000, 1024), (Dir::Recv, 1, 0x2000, 8)]);
        let refs = o.iter().collect::<Vec<_>>();
        // 1 KiB: a header and 128 data packets, in 5 warps.
        assert_eq!(ll_threads(&refs, &P2pTune::default()), 160);
        let off = P2pTune {
            ll_fit: false,
            ..P2pTune::default()
        };
        assert_eq!(ll_threads(&refs, &off), THREADS);
        let o = ops(&[(Dir::Send, 1, 0x1000, LL_MAX)]);
        assert_eq!(
            ll_threads(&o.iter().collect::<Vec<_>>(), &P2pTune::default()),
            THREADS
        );
        let o = ops(&[(Dir::Send, 1, 0x1000, 1)]);
        assert_eq!(
            ll_threads(&o.iter().collect::<Vec<_>>(), &P2pTune::default()),
            32
        );
    }

    #[test]
    fn every_rank_must_set_the_same_tune() {
        let t = P2pTune::default();
        let same = vec![tune_bytes(&t); 3];
        assert_eq!(agreed_tune(t, &same).unwrap(), t);
        let mut other = same.clone();
        other[2] = tune_bytes(&P2pTune { channels: 8, ..t });
        let e = agreed_tune(t, &other).unwrap_err().to_string();
        assert!(
            e.contains("MSCCLPP_P2P_TUNE") && e.contains("rank 2") && !e.contains("  "),
            "{e}"
        );
        other[2] = b"bad".to_vec();
        assert!(agreed_tune(t, &other).is_err());
    }

    #[test]
    fn long_batches_split_by_matching_index() {
        // 100 sends to and 100 receives from each of 2 peers (rank 0 of 3).
        let mut o = Vec::new();
        for i in 0..100u64 {
            for peer in [1, 2] {
                o.push(P2pOp::new(Dir::Send, peer, 0x1000 + i, 8));
                o.push(P2pOp::new(Dir::Recv, peer, 0x9000 + i, 8));
            }
        }
        let refs: Vec<&P2pOp> = o.iter().collect();
        let l = launches(&refs, 3);
        // 128 / (2 * 3) = 21 messages per pair and launch.
        assert_eq!(l.len(), 100usize.div_ceil(21));
        assert!(l.iter().all(|p| p.len() <= MAX_OPS_PER_LAUNCH));
        for (n, part) in l.iter().enumerate() {
            for peer in [1, 2] {
                for dir in [Dir::Send, Dir::Recv] {
                    let bufs: Vec<u64> = part
                        .iter()
                        .filter(|x| x.peer == peer && x.dir == dir)
                        .map(|x| x.buf)
                        .collect();
                    let base = if dir == Dir::Send { 0x1000 } else { 0x9000 };
                    let want: Vec<u64> = (n * 21..((n + 1) * 21).min(100))
                        .map(|i| base + i as u64)
                        .collect();
                    assert_eq!(bufs, want, "launch {n}, peer {peer}, {dir:?}");
                }
            }
        }
        // Copies to self (send, receive) stay adjacent in their launch.
        let mut o = Vec::new();
        for i in 0..70u64 {
            o.push(P2pOp::new(Dir::Send, 0, 0x1000 + i, 8));
            o.push(P2pOp::new(Dir::Recv, 0, 0x9000 + i, 8));
        }
        let refs: Vec<&P2pOp> = o.iter().collect();
        for part in launches(&refs, 2) {
            for w in part.chunks(2) {
                assert_eq!(
                    (w[0].dir, w[1].dir, w[1].buf - w[0].buf),
                    (Dir::Send, Dir::Recv, 0x8000)
                );
            }
        }
        // Short batches are one launch, as given.
        assert_eq!(launches(&refs[..10], 2).len(), 1);
    }

    #[test]
    fn ll_merge_runs_a_peer_s_sends_and_receives_on_one_block() {
        let merge = P2pTune {
            ll_merge: true,
            ..P2pTune::default()
        };
        // A ring exchange of 3 ranks on rank 0 (send to 1, receive from 2) stays two blocks;
        // an exchange with rank 1 becomes one.
        let ring = ops(&[(Dir::Send, 1, 0x1000, 1024), (Dir::Recv, 2, 0x2000, 1024)]);
        let refs: Vec<&P2pOp> = ring.iter().collect();
        assert_eq!(plan(&refs, 0, &merge).npairs, 2);
        let both = ops(&[(Dir::Send, 1, 0x1000, 1024), (Dir::Recv, 1, 0x2000, 1024)]);
        let refs: Vec<&P2pOp> = both.iter().collect();
        let p = plan(&refs, 0, &merge);
        assert!(p.ll);
        assert_eq!(
            (p.npairs, p.tasks, p.ops[0].pair, p.ops[1].pair),
            (1, 1, 0, 0)
        );
        // An all-to-all of 2 ranks: the copy to self keeps its two pairs, rank 1's two merge.
        let a2a = all_to_all_of_rank0(1024);
        let refs: Vec<&P2pOp> = a2a.iter().collect();
        let p = plan(&refs, 0, &merge);
        assert_eq!(p.npairs, 3);
        let pairs: Vec<u16> = p.ops.iter().map(|o| o.pair).collect();
        assert_eq!(pairs, [0, 1, 2, 2]);
        // Three sends to a peer it also receives from would wait in a circle: not merged.
        let many = ops(&[
            (Dir::Send, 1, 0x100, 64),
            (Dir::Send, 1, 0x200, 64),
            (Dir::Send, 1, 0x300, 64),
            (Dir::Recv, 1, 0x400, 64),
        ]);
        let refs: Vec<&P2pOp> = many.iter().collect();
        let p = plan(&refs, 0, &merge);
        assert!(p.ll);
        assert_eq!(p.npairs, 2);
        // Chunked messages are never merged.
        let big = ops(&[
            (Dir::Send, 1, 0x1000, 1 << 20),
            (Dir::Recv, 1, 0x9000_0000, 1 << 20),
        ]);
        let refs: Vec<&P2pOp> = big.iter().collect();
        assert_eq!(plan(&refs, 0, &merge).npairs, 2);
    }

    #[test]
    fn layout_keeps_counters_ll_buffers_and_rings_apart() {
        let l = GpuLayout {
            nranks: 4,
            ring_slots: RING_SLOTS,
        };
        assert!(l.error() + 16 <= l.a2a(0, 0));
        assert_eq!(l.a2a(3, A2A_MAX_BLOCKS - 1) + 8, l.a2a_seq(0));
        assert!(l.a2a_seq(A2A_MAX_BLOCKS) <= l.ll(0, 0));
        assert_eq!(l.ll(3, 1) + LL_BUF, l.ll(4, 0));
        assert!(l.ll(4, 0) <= l.rings());
        assert_eq!(l.rings() % 4096, 0);
        assert_eq!(l.total(), l.rings() + 4 * RING_SLOTS * (CHUNK + HEADER));
    }
}
