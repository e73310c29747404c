// Prints the size, alignment and field offsets of the executor's device structs
// (mscclpp/executor_device.hpp) as the host C++ compiler lays them out, for
// core/tests/executor_layout.rs. Output lines: "Name size N", "Name align N", "Name.field offset N".
#include <cstddef>
#include <cstdio>
#include <mscclpp/executor_device.hpp>

using namespace mscclpp;

#define SIZE(T) std::printf("%s size %zu\n%s align %zu\n", #T, sizeof(T), #T, alignof(T))
#define FIELD(T, f) std::printf("%s.%s offset %zu\n", #T, #f, offsetof(T, f))

int main() {
  SIZE(ExecOp);
  FIELD(ExecOp, opType);
  FIELD(ExecOp, channelType);
  FIELD(ExecOp, nChannels);
  FIELD(ExecOp, nInputs);
  FIELD(ExecOp, nOutputs);
  FIELD(ExecOp, reduceOp);
  FIELD(ExecOp, nSemaphores);
  FIELD(ExecOp, flags);
  FIELD(ExecOp, channels);
  FIELD(ExecOp, inputRefs);
  FIELD(ExecOp, outputRefs);
  FIELD(ExecOp, inputTypes);
  FIELD(ExecOp, outputTypes);
  FIELD(ExecOp, semaphoreIds);
  FIELD(ExecOp, inputOffsets);
  FIELD(ExecOp, inputSizes);
  FIELD(ExecOp, outputOffsets);
  FIELD(ExecOp, outputSizes);
  FIELD(ExecOp, barrierId);
  FIELD(ExecOp, nBlocks);
  FIELD(ExecOp, unitSize);
  FIELD(ExecOp, nIterations);
  FIELD(ExecOp, nInner);

  SIZE(ExecBlock);
  FIELD(ExecBlock, nOps);
  FIELD(ExecBlock, nMemoryChannels);
  FIELD(ExecBlock, nPortChannels);
  FIELD(ExecBlock, memoryChannels);
  FIELD(ExecBlock, portChannels);
  FIELD(ExecBlock, memoryBuffers);
  FIELD(ExecBlock, portBuffers);
  FIELD(ExecBlock, memoryBufferHalves);
  FIELD(ExecBlock, portBufferHalves);
  FIELD(ExecBlock, ops);

  SIZE(ExecArgs);
  FIELD(ExecArgs, blocks);
  FIELD(ExecArgs, input);
  FIELD(ExecArgs, output);
  FIELD(ExecArgs, scratch);
  FIELD(ExecArgs, scratchHalf);
  FIELD(ExecArgs, reuseChunk);
  FIELD(ExecArgs, flags);
  FIELD(ExecArgs, barriers);
  FIELD(ExecArgs, semaphores);
  FIELD(ExecArgs, dtype);
  FIELD(ExecArgs, packet);
  FIELD(ExecArgs, nBlocks);
  FIELD(ExecArgs, lanes);
  FIELD(ExecArgs, trace);
  FIELD(ExecArgs, laneSync);
  std::printf("EXEC_LANE_WORDS value %d\n", EXEC_LANE_WORDS);
  std::printf("EXEC_TRACE_WORDS value %d\nEXEC_TRACE_HEADER_WORDS value %d\n", EXEC_TRACE_WORDS, EXEC_TRACE_HEADER_WORDS);
  std::printf("EXEC_BLOCK_HEADER_BYTES value %zu\n", EXEC_BLOCK_HEADER_BYTES);
  std::printf("EXEC_PIPELINE value %d\nEXEC_SEM_RELEASE value %d\nEXEC_REDUCE_COPY_SEND_PACKETS value %d\n",
              (int)EXEC_PIPELINE, (int)EXEC_SEM_RELEASE, (int)EXEC_REDUCE_COPY_SEND_PACKETS);
  std::printf("EXEC_GROUP_LOAD_REDUCE value %d\nEXEC_GROUP_LOAD_REDUCE_STORE value %d\nEXEC_GROUP_STORE value %d\n",
              (int)EXEC_GROUP_LOAD_REDUCE, (int)EXEC_GROUP_LOAD_REDUCE_STORE, (int)EXEC_GROUP_STORE);
  std::printf("EXEC_REF_SWITCH value %d\nEXEC_CHANNEL_SWITCH value %d\n", (int)EXEC_REF_SWITCH,
              (int)EXEC_CHANNEL_SWITCH);
  std::printf("EXEC_OP_LANE_LOCAL value %d\n", (int)EXEC_OP_LANE_LOCAL);
  std::printf("EXEC_OP_LANE_ASYNC value %d\nEXEC_ASYNC_ROUNDS value %d\n", (int)EXEC_OP_LANE_ASYNC, EXEC_ASYNC_ROUNDS);
  return 0;
}
