// Device copies and the local reduction kernel of the collectives.
//
// extern "C" __global__ void coll_copy(void* dst, const void* src, uint64_t bytes);
//   Grid-stride copy; 16-byte vectors with 4 loads in flight per thread when dst and src are
//   16-byte aligned (the bytes past the last vector go one by one), bytes otherwise.
// extern "C" __global__ void coll_reduce2_<dtype>_sum(void* c, const void* a, const void* b, uint64_t n);
//   c[i] = a[i] + b[i] for n elements, 16-byte vectors (buffers 16-byte aligned, n * size a
//   multiple of 16); the local reduction whose bandwidth the ReduceKernelPerf test reports.
#include <type_traits>

#include "common.hpp"

extern "C" __global__ void __launch_bounds__(1024) coll_copy(void* dst, const void* src, uint64_t bytes) {
  const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const uint64_t nthreads = (uint64_t)gridDim.x * blockDim.x;
  char* d = reinterpret_cast<char*>(dst);
  const char* s = reinterpret_cast<const char*>(src);
  uint64_t done = 0;
  if ((((uintptr_t)d | (uintptr_t)s) & 15) == 0) {
    const uint64_t n = bytes / 16;
    uint4* d4 = reinterpret_cast<uint4*>(d);
    const uint4* s4 = reinterpret_cast<const uint4*>(s);
    uint64_t i = tid;
    for (; i + 3 * nthreads < n; i += 4 * nthreads) {
      uint4 r0 = s4[i], r1 = s4[i + nthreads], r2 = s4[i + 2 * nthreads], r3 = s4[i + 3 * nthreads];
      d4[i] = r0;
      d4[i + nthreads] = r1;
      d4[i + 2 * nthreads] = r2;
      d4[i + 3 * nthreads] = r3;
    }
    for (; i < n; i += nthreads) d4[i] = s4[i];
    done = n * 16;
  }
  for (uint64_t i = done + tid; i < bytes; i += nthreads) d[i] = s[i];
}

namespace mscclpp {
namespace coll {
/// x + y of 16 bytes of T: f16 in packed half2 adds (two inputs: bitwise the same as an f32
/// sum rounded once), everything else through the f32/T accumulator.
template <typename T>
MSCCLPP_DEVICE_INLINE uint4 add2(uint4 x, uint4 y) {
  if constexpr (std::is_same<T, __half>::value) {
    union H {
      uint4 u;
      __half2 h[4];
    } p, q;
    p.u = x;
    q.u = y;
#pragma unroll
    for (int i = 0; i < 4; ++i) p.h[i] = __hadd2(p.h[i], q.h[i]);
    return p.u;
  } else {
    AccPack<T, uint4> acc;
    acc.load(x);
    acc.template add<OpSum>(y);
    return acc.template store<OpSum>(1);
  }
}

template <typename T>
MSCCLPP_DEVICE_INLINE void reduce2(void* c, const void* a, const void* b, uint64_t n) {
  const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const uint64_t nthreads = (uint64_t)gridDim.x * blockDim.x;
  const uint64_t nv = n * sizeof(T) / 16;
  const uint4* a4 = reinterpret_cast<const uint4*>(a);
  const uint4* b4 = reinterpret_cast<const uint4*>(b);
  uint4* c4 = reinterpret_cast<uint4*>(c);
  uint64_t i = tid;
  for (; i + nthreads < nv; i += 2 * nthreads) {
    const uint4 x0 = a4[i], y0 = b4[i], x1 = a4[i + nthreads], y1 = b4[i + nthreads];
    c4[i] = add2<T>(x0, y0);
    c4[i + nthreads] = add2<T>(x1, y1);
  }
  for (; i < nv; i += nthreads) c4[i] = add2<T>(a4[i], b4[i]);
}
}  // namespace coll
}  // namespace mscclpp

extern "C" __global__ void __launch_bounds__(1024) coll_reduce2_f16_sum(void* c, const void* a, const void* b, uint64_t n) {
  mscclpp::coll::reduce2<__half>(c, a, b, n);
}
extern "C" __global__ void __launch_bounds__(1024) coll_reduce2_f32_sum(void* c, const void* a, const void* b, uint64_t n) {
  mscclpp::coll::reduce2<float>(c, a, b, n);
}
extern "C" __global__ void __launch_bounds__(1024) coll_reduce2_bf16_sum(void* c, const void* a, const void* b, uint64_t n) {
  mscclpp::coll::reduce2<mscclpp::coll::bf16_t>(c, a, b, n);
}
