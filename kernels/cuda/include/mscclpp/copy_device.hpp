// Cooperative memory copy used by MemoryChannel put/get (and usable on its own).
//
// copy(dst, src, bytes, threadId, numThreads): all numThreads threads call it with the same
// arguments, threadId in [0, numThreads). Requirements: dst, src 4-byte aligned, bytes a multiple
// of 4. When dst and src are congruent modulo 16, the unaligned head and tail go as 4-byte words and
// the body as 16-byte vectors (4 in flight per thread); congruent modulo 8: 8-byte words; otherwise
// 4-byte words. No ordering with later signals is implied: synchronize the threads (e.g.
// __syncthreads()) before one of them signals.
#ifndef MSCCLPP_COPY_DEVICE_HPP_
#define MSCCLPP_COPY_DEVICE_HPP_

#include "device.hpp"

namespace mscclpp {

#if defined(MSCCLPP_DEVICE_COMPILE)

namespace detail {

/// Strided copy of n elements of T.
template <typename T>
MSCCLPP_DEVICE_INLINE void copyElements(T* dst, const T* src, uint64_t n, uint32_t threadId, uint32_t numThreads) {
  for (uint64_t i = threadId; i < n; i += numThreads) {
    dst[i] = src[i];
  }
}

/// Strided copy of n 16-byte vectors, Unroll loads in flight per thread before the stores.
template <int Unroll>
MSCCLPP_DEVICE_INLINE void copyVectors(uint4* dst, const uint4* src, uint64_t n, uint32_t threadId,
                                       uint32_t numThreads) {
  const uint64_t stride = (uint64_t)numThreads * Unroll;
  uint64_t i = threadId;
  for (; i + (uint64_t)(Unroll - 1) * numThreads < n; i += stride) {
    uint4 r[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) r[u] = src[i + (uint64_t)u * numThreads];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) dst[i + (uint64_t)u * numThreads] = r[u];
  }
  for (; i < n; i += numThreads) dst[i] = src[i];
}

/// Copy with an aligned body of T (8 or 16 bytes) and 4-byte head/tail; dst and src congruent mod sizeof(T).
template <typename T>
MSCCLPP_DEVICE_INLINE void copyAligned(char* dst, const char* src, uint64_t bytes, uint32_t threadId,
                                       uint32_t numThreads) {
  const uint64_t misalign = (uintptr_t)dst & (sizeof(T) - 1);
  uint64_t head = misalign ? (sizeof(T) - misalign) : 0;
  if (head > bytes) head = bytes;
  const uint64_t body = (bytes - head) / sizeof(T);
  const uint64_t tailStart = head + body * sizeof(T);
  // Head and tail words go to the threads counted from the end, so they overlap least with the body's first lanes.
  const uint32_t rev = numThreads - 1 - threadId;
  copyElements<uint32_t>(reinterpret_cast<uint32_t*>(dst), reinterpret_cast<const uint32_t*>(src), head / 4, rev,
                         numThreads);
  if (sizeof(T) == 16) {
    copyVectors<4>(reinterpret_cast<uint4*>(dst + head), reinterpret_cast<const uint4*>(src + head), body, threadId,
                   numThreads);
  } else {
    copyElements<T>(reinterpret_cast<T*>(dst + head), reinterpret_cast<const T*>(src + head), body, threadId,
                    numThreads);
  }
  copyElements<uint32_t>(reinterpret_cast<uint32_t*>(dst + tailStart), reinterpret_cast<const uint32_t*>(src + tailStart),
                         (bytes - tailStart) / 4, rev, numThreads);
}

}  // namespace detail

/// Cooperative copy of `bytes` bytes (see the file comment for the requirements).
MSCCLPP_DEVICE_INLINE void copy(void* dst, const void* src, uint64_t bytes, uint32_t threadId, uint32_t numThreads) {
  MSCCLPP_DEVICE_CHECK((((uintptr_t)dst | (uintptr_t)src | bytes) & 3) == 0,
                       "copy: dst, src and bytes must be multiples of 4");
  char* d = reinterpret_cast<char*>(dst);
  const char* s = reinterpret_cast<const char*>(src);
  const uintptr_t rel = (uintptr_t)d ^ (uintptr_t)s;
  if ((rel & 15) == 0) {
    detail::copyAligned<uint4>(d, s, bytes, threadId, numThreads);
  } else if ((rel & 7) == 0) {
    detail::copyAligned<uint64_t>(d, s, bytes, threadId, numThreads);
  } else {
    detail::copyElements<uint32_t>(reinterpret_cast<uint32_t*>(d), reinterpret_cast<const uint32_t*>(s), bytes / 4,
                                   threadId, numThreads);
  }
}

#endif  // defined(MSCCLPP_DEVICE_COMPILE)

}  // namespace mscclpp

#endif  // MSCCLPP_COPY_DEVICE_HPP_
