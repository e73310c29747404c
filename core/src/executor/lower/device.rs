//! The device form of a plan: `#[repr(C)]` per-thread-block op lists with byte offsets for
//! one message size, equal to `kernels/cuda/include/mscclpp/executor_device.hpp` (checked by
//! core/tests/executor_layout.rs). The GPU kernel and the host interpreter both read these.

use crate::executor::limits::{
    MAX_BUFFERS_PER_OP, MAX_CHANNELS_PER_BLOCK, MAX_CHANNELS_PER_OP, MAX_OPS_PER_BLOCK,
    MAX_REMOTE_BUFFERS_PER_BLOCK, MAX_SEMAPHORES_PER_OP,
};
use crate::memory_channel::BaseMemoryChannelDeviceHandle;
use crate::port_channel::BasePortChannelDeviceHandle;

/// `ExecOp.flags` of a `nop` that is a barrier of a GPU block's threads only, not of the lanes
/// of its plan block (`EXEC_OP_LANE_LOCAL`; set by the lowering, see `mark_lane_local_nops`).
pub const OP_LANE_LOCAL: u8 = 1;

/// `ExecOp.flags` of a `nop`, memory-channel signal or memory-channel wait that needs no lane
/// barrier under the async lane sync (`EXEC_OP_LANE_ASYNC`; `MSCCLPP_EXECUTOR_LANE_SYNC=async`):
/// no data op of one lane before it may touch bytes another lane touches after it (set by the
/// lowering, see `mark_lane_async`). Such a signal is sent by the last lane to arrive, such a
/// wait is done by every lane.
pub const OP_LANE_ASYNC: u8 = 2;

/// `ExecOp.flags` of a `nop` under the async lane sync (`EXEC_OP_LANE_SPLIT`) where the data
/// of the lanes before it meets data after it (up to the next crossing) only as two ops'
/// ranges of one buffer that start at the same byte (or, see [`OP_LANE_SPLIT_IO`], as this
/// rank's input against its output): when every data op since the last lane
/// barrier and after the nop takes the kernel's 16-byte vector path (aligned ranges, sizes in
/// 16-byte units), each common byte is the same thread's in both ops and the nop is the GPU
/// block's `__syncthreads`; the first op off that path has the nop's lane barrier before it
/// (set by the lowering, see `mark_lane_async`).
pub const OP_LANE_SPLIT: u8 = 4;

/// With [`OP_LANE_SPLIT`] (`EXEC_OP_LANE_SPLIT_IO`): some data meeting at the nop is this rank's
/// input against its output (of other chunks, or at other offsets): those share no byte when the
/// call's input and output do not overlap (`ExecArgs::io_apart`), else the nop is a lane barrier.
pub const OP_LANE_SPLIT_IO: u8 = 8;

/// The most signals of one plan block the async lane sync sends per launch (each has a lane
/// word counting the lanes that arrived); the lowering leaves later ones unmarked.
pub const ASYNC_ROUNDS: usize = 32;

/// Operation codes (`ExecOpType` of the C header); each names the plan's JSON op it encodes
/// (docs/executor.md lists what this executor accepts).
pub mod op {
    /// `nop`: no data; a barrier of the thread block's threads.
    pub const NOP: u8 = 0;
    /// `barrier`: a barrier of the plan's number of this rank's thread blocks (`n_blocks`).
    pub const BARRIER: u8 = 1;
    /// `put`: copies local chunks into peers' buffers through memory or port channels.
    pub const PUT: u8 = 2;
    /// `pws`: `put` through port channels, then signals each destination.
    pub const PUT_WITH_SIGNAL: u8 = 3;
    /// `pwsf`: `pws`, then flushes the port channels (the data has left).
    pub const PUT_WITH_SIGNAL_AND_FLUSH: u8 = 4;
    /// `get`: copies peers' chunks into local buffers through memory channels.
    pub const GET: u8 = 5;
    /// `copy`: copies a local chunk into another local chunk.
    pub const COPY: u8 = 6;
    /// `signal`: signals the semaphore of each listed channel (release ordering).
    pub const SIGNAL: u8 = 7;
    /// `wait`: waits on the semaphore of each listed channel (acquire ordering).
    pub const WAIT: u8 = 8;
    /// `flush`: waits until the listed port channels' requests have completed.
    pub const FLUSH: u8 = 9;
    /// `re`: reduces local chunks into a local output chunk.
    pub const REDUCE: u8 = 10;
    /// `res`: `re`, then writes the result to peers' buffers too.
    pub const REDUCE_SEND: u8 = 11;
    /// `rre`: reduces peers' chunks (read through memory channels) with a local one.
    pub const READ_REDUCE: u8 = 12;
    /// `rres`: `rre`, then writes the result to peers' buffers too.
    pub const READ_REDUCE_SEND: u8 = 13;
    /// `ppkt`: writes local chunks to peers' scratch as LL packets (data + flag).
    pub const PUT_PACKETS: u8 = 14;
    /// `rppkt`: forwards packets already in local scratch to peers' scratch.
    pub const READ_PUT_PACKETS: u8 = 15;
    /// `respkt`: reduces packets in local scratch with a local chunk and writes the result to peers as packets.
    pub const REDUCE_SEND_PACKETS: u8 = 16;
    /// `cpkt`: copies a local chunk into local scratch as packets.
    pub const COPY_PACKETS: u8 = 17;
    /// `upkt`: waits for packets in local scratch and unpacks their data into a local chunk.
    pub const UNPACK_PACKETS: u8 = 18;
    /// `repkt`: waits for packets in local scratch and reduces their data into a local chunk.
    pub const REDUCE_PACKETS: u8 = 19;
    /// `recpkt`: `repkt`, and also copies the result into local scratch as packets.
    pub const REDUCE_COPY_PACKETS: u8 = 20;
    /// `recspkt`: `recpkt`, and also writes the result to peers as packets.
    pub const REDUCE_COPY_SEND_PACKETS: u8 = 21;
    /// `rlxsignal`: `signal` without release ordering (only the count is published).
    pub const RELAXED_SIGNAL: u8 = 22;
    /// `rlxwait`: `wait` without acquire ordering.
    pub const RELAXED_WAIT: u8 = 23;
    /// `pipeline`: runs the following ops of its body once per chunk of the message.
    pub const PIPELINE: u8 = 24;
    /// `sem_acquire`: acquires a device semaphore shared by this rank's thread blocks.
    pub const SEM_ACQUIRE: u8 = 25;
    /// `sem_release`: releases a device semaphore acquired by `sem_acquire`.
    pub const SEM_RELEASE: u8 = 26;
    /// glre: load-reduce a switch chunk (every rank's copy) into a local chunk.
    pub const GROUP_LOAD_REDUCE: u8 = 27;
    /// glres: load-reduce a switch chunk and store the sum through a switch chunk.
    pub const GROUP_LOAD_REDUCE_STORE: u8 = 28;
    /// gstore: store a local chunk through a switch chunk (into every rank's copy).
    pub const GROUP_STORE: u8 = 29;
}

/// `ExecOp.inputRefs[i]` / `outputRefs[i]`: a local buffer type (0..=2), or this bit plus the
/// slot of a remote buffer in the block's table of the op's channel type.
pub const REF_REMOTE: u8 = 0x80;
/// `ExecOp.inputRefs[i]` / `outputRefs[i]` of a switch operation: this bit plus the slot of a
/// switch channel in the block's (host-side) switch table; offsets are in its bound buffer.
pub const REF_SWITCH: u8 = 0x40;
/// Channel types of `ExecOp.channelType`.
pub const CHANNEL_NONE: u8 = 0;
/// Memory channel.
pub const CHANNEL_MEMORY: u8 = 1;
/// Port channel.
pub const CHANNEL_PORT: u8 = 2;
/// Switch (NVLS) channel.
pub const CHANNEL_SWITCH: u8 = 3;
/// Bytes of one multimem vector: switch operations move whole 16-byte vectors.
pub const SWITCH_VECTOR_BYTES: u64 = 16;

/// `struct ExecOp` (256 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecOp {
    /// Operation code, one of the [`op`] constants (`ExecOp.type`).
    pub op_type: u8,
    /// Channel type the op uses: [`CHANNEL_NONE`], [`CHANNEL_MEMORY`] or [`CHANNEL_PORT`].
    pub channel_type: u8,
    /// Number of used entries in `channels`.
    pub n_channels: u8,
    /// Number of used entries in the `input_*` arrays (the plan op's `src` chunks).
    pub n_inputs: u8,
    /// Number of used entries in the `output_*` arrays (the plan op's `dst` chunks).
    pub n_outputs: u8,
    /// 0 sum, 1 min, 2 max.
    pub reduce_op: u8,
    /// Number of used entries in `semaphore_ids`.
    pub n_semaphores: u8,
    /// [`OP_LANE_LOCAL`], [`OP_LANE_ASYNC`] and [`OP_LANE_SPLIT`] bits.
    pub flags: u8,
    /// Indexes into the block's channels of `channel_type`.
    pub channels: [u8; MAX_CHANNELS_PER_OP],
    /// Per input: a local buffer type, or [`REF_REMOTE`] plus a remote-buffer slot.
    pub input_refs: [u8; MAX_BUFFERS_PER_OP],
    /// Per output: a local buffer type, or [`REF_REMOTE`] plus a remote-buffer slot.
    pub output_refs: [u8; MAX_BUFFERS_PER_OP],
    /// Buffer type (0 input, 1 output, 2 scratch) behind each reference, remote ones too.
    pub input_types: [u8; MAX_BUFFERS_PER_OP],
    /// Buffer type (0 input, 1 output, 2 scratch) behind each output reference.
    pub output_types: [u8; MAX_BUFFERS_PER_OP],
    /// Indexes into the launch's device semaphores (`ExecArgs::semaphores`) for sem ops.
    pub semaphore_ids: [u8; MAX_SEMAPHORES_PER_OP],
    /// Per input: byte offset of the chunk in its buffer, for this message size.
    pub input_offsets: [u32; MAX_BUFFERS_PER_OP],
    /// Per input: length of the chunk in bytes.
    pub input_sizes: [u32; MAX_BUFFERS_PER_OP],
    /// Per output: byte offset of the chunk in its buffer, for this message size.
    pub output_offsets: [u32; MAX_BUFFERS_PER_OP],
    /// Per output: length of the chunk in bytes.
    pub output_sizes: [u32; MAX_BUFFERS_PER_OP],
    /// Barrier ops: which barrier (index into `ExecArgs::barriers`) the blocks meet at.
    pub barrier_id: u32,
    /// Barrier ops: how many thread blocks take part in that barrier.
    pub n_blocks: u32,
    /// Pipeline: bytes per iteration, iterations, and how many following ops it repeats.
    pub unit_size: u32,
    /// Pipeline: how many iterations of `unit_size` bytes cover the chunks.
    pub n_iterations: u32,
    /// Pipeline: how many of the ops after this one form its body.
    pub n_inner: u32,
    /// Padding to the C layout; always 0.
    pub pad1: u32,
}

/// `struct ExecBlock`: one thread block's channels, remote buffers and operations.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug)]
pub struct ExecBlock {
    /// Number of used entries in `ops`.
    pub n_ops: u32,
    /// Number of used entries in `memory_channels`.
    pub n_memory_channels: u32,
    /// Number of used entries in `port_channels`.
    pub n_port_channels: u32,
    /// Padding to the C layout; always 0.
    pub pad: u32,
    /// Device handles of the block's memory channels, indexed by `ExecOp::channels`.
    pub memory_channels: [BaseMemoryChannelDeviceHandle; MAX_CHANNELS_PER_BLOCK],
    /// Device handles of the block's port channels, indexed by `ExecOp::channels`.
    pub port_channels: [BasePortChannelDeviceHandle; MAX_CHANNELS_PER_BLOCK],
    /// Addresses (mapped here) of remote buffers reached through memory channels.
    pub memory_buffers: [u64; MAX_REMOTE_BUFFERS_PER_BLOCK],
    /// Proxy memory ids of remote buffers reached through port channels.
    pub port_buffers: [u32; MAX_REMOTE_BUFFERS_PER_BLOCK],
    /// Double scratch: the second half's offset in each remote buffer (0 unless it is the
    /// peer's scratch), used on launches with an even flag.
    pub memory_buffer_halves: [u32; MAX_REMOTE_BUFFERS_PER_BLOCK],
    /// Like `memory_buffer_halves`, for the remote buffers of `port_buffers`.
    pub port_buffer_halves: [u32; MAX_REMOTE_BUFFERS_PER_BLOCK],
    /// The block's operations in execution order; the first `n_ops` are used.
    pub ops: [ExecOp; MAX_OPS_PER_BLOCK],
}

/// The kernel's one parameter, `struct ExecArgs` of executor_device.hpp.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecArgs {
    /// Device array of `ExecBlock`, one per block.
    pub blocks: u64,
    /// Device address of the user's input buffer.
    pub input: u64,
    /// Device address of the user's output buffer.
    pub output: u64,
    /// Device address of the executor's scratch buffer.
    pub scratch: u64,
    /// Offset of the second scratch half (0: single scratch); used when the flag is even.
    pub scratch_half: u64,
    /// Reused scratch: chunk length offsets wrap at (0: not reused).
    pub reuse_chunk: u64,
    /// One u32 launch counter per block.
    pub flags: u64,
    /// Barrier words (count, generation) per barrier id.
    pub barriers: u64,
    /// Device semaphores (i32).
    pub semaphores: u64,
    /// `dtype_code`.
    pub dtype: u32,
    /// 0 LL16, 1 LL8.
    pub packet: u32,
    /// Number of plan thread blocks (entries of `blocks`).
    pub nblocks: u32,
    /// GPU blocks per plan thread block (0 or 1: one); the host interpreter ignores it.
    pub lanes: u32,
    /// Trace counters ([`TRACE_WORDS`] u64 per GPU block, or per block on the host), 0 when
    /// off: see `ExecArgs.trace` of the C header.
    pub trace: u64,
    /// How the lanes of a plan block meet: 0 lane barriers, 1 split joins and releases, 2
    /// async (`MSCCLPP_EXECUTOR_LANE_SYNC`, [`crate::env::LaneSync`]); the host interpreter
    /// ignores it.
    pub lane_sync: u32,
    /// 1 when the call's input and output bytes do not overlap (then a nop flagged
    /// [`OP_LANE_SPLIT_IO`] may leave out its lane barrier), else 0.
    pub io_apart: u32,
}

/// Lane words per plan block after the launch counters of `ExecArgs::flags`: 4 of the lane
/// barrier or split sync, then one per async signal ([`ASYNC_ROUNDS`]).
pub const LANE_WORDS: usize = 4 + ASYNC_ROUNDS;

/// Trace words before the per-op pairs: launches, cycles, nanoseconds, prologue cycles,
/// idle nanoseconds between launches back to back and how many such gaps, the wall clock at
/// the last launch's end, the shortest gap + 1.
pub const TRACE_HEADER_WORDS: usize = 8;
/// Trace words per GPU block (per block on the host): the header, then (cycles, runs) per op.
pub const TRACE_WORDS: usize = TRACE_HEADER_WORDS + 2 * MAX_OPS_PER_BLOCK;

/// Bytes of an `ExecBlock` before its ops (what the kernel copies besides the used ops).
pub const EXEC_BLOCK_HEADER_BYTES: usize = std::mem::offset_of!(ExecBlock, ops);

/// Barrier words per barrier id (count, generation).
pub const BARRIER_WORDS: usize = 2;

impl ExecOp {
    pub(crate) fn zeroed() -> ExecOp {
        // SAFETY: ExecOp is integers and integer arrays only; all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }
}

impl ExecBlock {
    /// An empty block (no channels, no ops).
    pub fn zeroed() -> Box<ExecBlock> {
        // SAFETY: ExecBlock is integers, integer arrays and device handles made of raw
        // pointers and integers; all-zero (null pointers) is a valid value of each.
        Box::new(unsafe { std::mem::zeroed() })
    }
}
