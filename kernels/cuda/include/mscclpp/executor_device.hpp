// The device form of an execution plan (core/src/executor/device.rs mirrors these structs; the
// layouts are checked by core/tests/executor_layout.rs). Plain C++17 on the host, so the layout
// test can compile it without a GPU compiler.
//
// ExecOp (256 bytes): one operation with byte offsets/sizes for one message size.
//   inputRefs/outputRefs[i]: a local buffer type (0 input, 1 output, 2 scratch) or
//   EXEC_REF_REMOTE | slot of a remote buffer in the block's table of the op's channel type;
//   inputTypes/outputTypes[i]: the buffer type behind the reference (remote ones too).
//   Packet operations address packet buffers at twice the chunk offset.
// ExecBlock (18128 bytes, align 16): one thread block's channels, remote buffers and ops. The
//   kernel copies the header and the used ops into shared memory.
// ExecArgs (104 bytes): the kernel's one parameter. ExecArgs.flags: a launch counter per plan
//   block, then EXEC_LANE_WORDS lane words per plan block.
// Trace (ExecArgs.trace, null when off): EXEC_TRACE_WORDS counters per GPU block (block
//   blockIdx.x at trace + blockIdx.x * EXEC_TRACE_WORDS), added to by its thread 0 on every
//   launch: [0] launches, [1] cycles from kernel start to end, [2] nanoseconds of the same
//   (0 where the GPU has no wall clock to read), [3] cycles of the prologue (the block's ops
//   copied to shared memory), [4] nanoseconds from the end of the block's previous launch to
//   the start of this one, summed over the gaps shorter than 1 ms (launches issued back to
//   back, not across a synchronisation), [5] how many such gaps, [6] the wall clock at the
//   end of the last launch, [7] the shortest gap + 1 (0: none yet), then per op i of the
//   block (its index in ExecBlock.ops) cycles [8 + 2i] and runs [9 + 2i]. A pipeline's own slot counts its whole loop, its body ops
//   theirs. Thread 0's view: an op's time ends when thread 0 leaves it; waiting for the
//   block's other threads shows in the next barrier (nop).
#ifndef MSCCLPP_EXECUTOR_DEVICE_HPP_
#define MSCCLPP_EXECUTOR_DEVICE_HPP_

#if !defined(__CUDACC_RTC__)
#include <stddef.h>
#endif

#include "memory_channel_device.hpp"
#include "port_channel_device.hpp"

namespace mscclpp {

constexpr int EXEC_MAX_CHANNELS_PER_OP = 8;
constexpr int EXEC_MAX_BUFFERS_PER_OP = 10;
constexpr int EXEC_MAX_SEMAPHORES_PER_OP = 16;
constexpr int EXEC_MAX_CHANNELS_PER_BLOCK = 16;
constexpr int EXEC_MAX_REMOTE_BUFFERS_PER_BLOCK = 16;
constexpr int EXEC_MAX_OPS_PER_BLOCK = 64;
constexpr int EXEC_TRACE_HEADER_WORDS = 8;
// Async signals of one plan block per launch (ExecArgs.laneSync = 2), each with a lane word.
constexpr int EXEC_ASYNC_ROUNDS = 32;
// Lane words per plan block after the launch counters of ExecArgs.flags: 4 of the lane barrier
// or the split sync, then one per async signal.
constexpr int EXEC_LANE_WORDS = 4 + EXEC_ASYNC_ROUNDS;
constexpr int EXEC_TRACE_WORDS = EXEC_TRACE_HEADER_WORDS + 2 * EXEC_MAX_OPS_PER_BLOCK;
constexpr uint8_t EXEC_REF_REMOTE = 0x80;
// Switch-op chunk references: this bit | slot of the block's (host-side) switch channel table.
constexpr uint8_t EXEC_REF_SWITCH = 0x40;

// ExecOp.flags: a nop between synchronisation ops of lane 0 that need no order among its
// threads (a signal, then a signal or a wait; a wait, then a wait or the block's end): a barrier
// of the GPU block's threads only, not of the plan block's lanes (core/src/executor/lower).
constexpr uint8_t EXEC_OP_LANE_LOCAL = 1;
// ExecOp.flags: under the async lane sync (ExecArgs.laneSync = 2), a nop, memory-channel signal
// or memory-channel wait with no data of one lane before it that another lane reads or writes
// after it: no lane barrier (the nop: __syncthreads; the signal: sent by the last lane to
// arrive; the wait: done by every lane). core/src/executor/lower's mark_lane_async sets it.
constexpr uint8_t EXEC_OP_LANE_ASYNC = 2;
// ExecOp.flags: under the async lane sync, a nop where data of the lanes before it meets data
// after it (up to the next crossing) only as ranges of one buffer that two ops start at the same
// byte, or (with EXEC_OP_LANE_SPLIT_IO too) as this rank's input against its output: while every
// data op since the last lane barrier and after the nop takes its 16-byte vector path (vector k
// of a range on thread k % threads of the lanes) and, for the latter, the call's input and
// output do not overlap (ExecArgs.ioApart), the nop is the GPU block's __syncthreads; the first
// op after it off that path has the nop's lane barrier before it.
constexpr uint8_t EXEC_OP_LANE_SPLIT = 4;
constexpr uint8_t EXEC_OP_LANE_SPLIT_IO = 8;

enum ExecOpType : uint8_t {
  EXEC_NOP = 0,
  EXEC_BARRIER = 1,
  EXEC_PUT = 2,
  EXEC_PUT_WITH_SIGNAL = 3,
  EXEC_PUT_WITH_SIGNAL_AND_FLUSH = 4,
  EXEC_GET = 5,
  EXEC_COPY = 6,
  EXEC_SIGNAL = 7,
  EXEC_WAIT = 8,
  EXEC_FLUSH = 9,
  EXEC_REDUCE = 10,
  EXEC_REDUCE_SEND = 11,
  EXEC_READ_REDUCE = 12,
  EXEC_READ_REDUCE_SEND = 13,
  EXEC_PUT_PACKETS = 14,
  EXEC_READ_PUT_PACKETS = 15,
  EXEC_REDUCE_SEND_PACKETS = 16,
  EXEC_COPY_PACKETS = 17,
  EXEC_UNPACK_PACKETS = 18,
  EXEC_REDUCE_PACKETS = 19,
  EXEC_REDUCE_COPY_PACKETS = 20,
  EXEC_REDUCE_COPY_SEND_PACKETS = 21,
  EXEC_RELAXED_SIGNAL = 22,
  EXEC_RELAXED_WAIT = 23,
  EXEC_PIPELINE = 24,
  EXEC_SEM_ACQUIRE = 25,
  EXEC_SEM_RELEASE = 26,
  // Switch-channel (NVLS) ops: run by the host interpreter only; the host refuses plans with
  // them on GPUs, so this kernel never sees them (its default case fails loudly if it did).
  EXEC_GROUP_LOAD_REDUCE = 27,
  EXEC_GROUP_LOAD_REDUCE_STORE = 28,
  EXEC_GROUP_STORE = 29,
};

enum ExecChannelType : uint8_t {
  EXEC_CHANNEL_NONE = 0,
  EXEC_CHANNEL_MEMORY = 1,
  EXEC_CHANNEL_PORT = 2,
  EXEC_CHANNEL_SWITCH = 3,
};

/// Data types (core/src/executor/gpu.rs `dtype_code`).
enum ExecDataType : uint32_t {
  EXEC_I8 = 0,
  EXEC_U8 = 1,
  EXEC_I32 = 2,
  EXEC_U32 = 3,
  EXEC_I64 = 4,
  EXEC_U64 = 5,
  EXEC_F16 = 6,
  EXEC_F32 = 7,
  EXEC_F64 = 8,
  EXEC_BF16 = 9,
  EXEC_FP8E4M3 = 10,
  EXEC_FP8E5M2 = 11,
};

struct ExecOp {
  uint8_t opType;
  uint8_t channelType;
  uint8_t nChannels;
  uint8_t nInputs;
  uint8_t nOutputs;
  uint8_t reduceOp;  // 0 sum, 1 min, 2 max
  uint8_t nSemaphores;
  uint8_t flags;  // EXEC_OP_* bits
  uint8_t channels[EXEC_MAX_CHANNELS_PER_OP];
  uint8_t inputRefs[EXEC_MAX_BUFFERS_PER_OP];
  uint8_t outputRefs[EXEC_MAX_BUFFERS_PER_OP];
  uint8_t inputTypes[EXEC_MAX_BUFFERS_PER_OP];
  uint8_t outputTypes[EXEC_MAX_BUFFERS_PER_OP];
  uint8_t semaphoreIds[EXEC_MAX_SEMAPHORES_PER_OP];
  uint32_t inputOffsets[EXEC_MAX_BUFFERS_PER_OP];
  uint32_t inputSizes[EXEC_MAX_BUFFERS_PER_OP];
  uint32_t outputOffsets[EXEC_MAX_BUFFERS_PER_OP];
  uint32_t outputSizes[EXEC_MAX_BUFFERS_PER_OP];
  uint32_t barrierId;
  uint32_t nBlocks;
  uint32_t unitSize;  // pipeline: bytes per iteration
  uint32_t nIterations;
  uint32_t nInner;  // pipeline: how many following ops it repeats
  uint32_t pad1;
};

struct alignas(16) ExecBlock {
  uint32_t nOps;
  uint32_t nMemoryChannels;
  uint32_t nPortChannels;
  uint32_t pad;
  BaseMemoryChannelDeviceHandle memoryChannels[EXEC_MAX_CHANNELS_PER_BLOCK];
  BasePortChannelDeviceHandle portChannels[EXEC_MAX_CHANNELS_PER_BLOCK];
  uint64_t memoryBuffers[EXEC_MAX_REMOTE_BUFFERS_PER_BLOCK];  // remote addresses, mapped here
  uint32_t portBuffers[EXEC_MAX_REMOTE_BUFFERS_PER_BLOCK];    // proxy memory ids
  uint32_t memoryBufferHalves[EXEC_MAX_REMOTE_BUFFERS_PER_BLOCK];  // second scratch half (or 0)
  uint32_t portBufferHalves[EXEC_MAX_REMOTE_BUFFERS_PER_BLOCK];
  ExecOp ops[EXEC_MAX_OPS_PER_BLOCK];
};

// The ops come last and fill whole 16-byte units, so the header is what is before them (written
// without offsetof, which NVRTC cannot evaluate as a constant; checked against it elsewhere).
constexpr size_t EXEC_BLOCK_HEADER_BYTES = sizeof(ExecBlock) - sizeof(ExecOp) * EXEC_MAX_OPS_PER_BLOCK;
#if !defined(__CUDACC_RTC__)
static_assert(EXEC_BLOCK_HEADER_BYTES == offsetof(ExecBlock, ops), "ExecBlock: ops are its last member");
#endif

struct ExecArgs {
  const ExecBlock* blocks;
  char* input;
  char* output;
  char* scratch;
  uint64_t scratchHalf;  // offset of the second scratch half, used when the flag is even (0: single)
  uint64_t reuseChunk;   // reused scratch: offsets wrap at this length (0: not reused)
  uint32_t* flags;       // one launch counter per block
  uint32_t* barriers;    // (count, generation) per barrier id
  int32_t* semaphores;   // device semaphores
  uint32_t dtype;        // ExecDataType
  uint32_t packet;       // 0 LL16, 1 LL8
  uint32_t nBlocks;  // plan blocks
  uint32_t lanes;    // GPU blocks per plan block (0 or 1: one)
  uint64_t* trace;   // per-op counters (see the file comment), or null
  uint32_t laneSync;  // 0: lanes meet at lane barriers; 1: split joins and releases; 2: async
  uint32_t ioApart;   // 1: the call's input and output bytes do not overlap (EXEC_OP_LANE_SPLIT_IO)
};

}  // namespace mscclpp

#endif  // MSCCLPP_EXECUTOR_DEVICE_HPP_
