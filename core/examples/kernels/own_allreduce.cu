// The kernel of example 10 (core/examples/10-own-algorithm.rs): an all-reduce of one's own,
// registered in `mscclpp::collectives` and reached through `Collectives` and `ncclAllReduce`.
// It uses the scratch every `Collectives` shares (each rank's plain scratch, mapped by every
// peer at peerBases[r] + plainOffset) and the semaphores of block 0 (sems[p]: with peer p).
//
// extern "C" __global__ void own_allreduce_f32(const float* in, float* out, uint64_t count,
//     const uint64_t* peerBases, MemoryDevice2DeviceSemaphoreDeviceHandle* sems,
//     uint64_t plainOffset, int rank, int nranks);
//   One block. Barrier with every peer (they finished reading this rank's scratch); copy the
//   input into the own scratch; barrier (every rank's input is in place); sum every rank's
//   scratch into the output; barrier (nobody reads this rank's scratch any more).
#include <mscclpp/device_api.hpp>

namespace {
__device__ void barrier(mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle* sems, int rank, int nranks) {
  __syncthreads();
  int p = threadIdx.x;
  if (p < nranks && p != rank) {
    sems[p].signal();
    sems[p].wait();
  }
  __syncthreads();
}
}  // namespace

extern "C" __global__ void own_allreduce_f32(const float* in, float* out, uint64_t count,
                                             const uint64_t* peerBases,
                                             mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle* sems,
                                             uint64_t plainOffset, int rank, int nranks) {
  barrier(sems, rank, nranks);
  float* mine = reinterpret_cast<float*>(peerBases[rank] + plainOffset);
  for (uint64_t i = threadIdx.x; i < count; i += blockDim.x) mine[i] = in[i];
  __threadfence_system();
  barrier(sems, rank, nranks);
  for (uint64_t i = threadIdx.x; i < count; i += blockDim.x) {
    float s = 0.f;
    for (int r = 0; r < nranks; ++r) s += reinterpret_cast<const float*>(peerBases[r] + plainOffset)[i];
    out[i] = s;
  }
  barrier(sems, rank, nranks);
}
