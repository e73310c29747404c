// The executor kernel's body, compiled twice (a header, so the kernel-name scan and the build
// see only the two entry points): executor.cu, `executor_kernel` for up to 1024 threads per
// block (64 registers a thread: the interpreter spills), and executor_narrow.cu,
// `executor_kernel_narrow` for up to 256 (no register bound below the hardware's: almost no
// spills), which the host launches whenever the launch's threads fit (core/src/executor/run/gpu.rs).
// One launch per execution, `lanes` GPU
// blocks per thread block of the plan (ExecArgs.lanes, chosen by the host from the message
// size and the SMs free per rank; 1 for small messages). Each GPU block copies its plan
// block's ExecBlock (header and used ops) into shared memory and interprets the ops with the
// semantics of core/src/executor/run/host (the host backend's interpreter of the same lists):
//   - flag = flags[plan block] + 1 for this launch (written back at the end by lane 0 once
//     every lane read it: after any lane barrier, so graph replays count); with double scratch,
//     launches with an even flag use the second half of every scratch;
//   - nop = a barrier of the plan block's threads (__syncthreads, or a lane barrier: none when
//     nothing ran since the last one);
//     barrier = that + a grid barrier of nBlocks plan blocks (their lane 0s) + that;
//   - data ops (copy, get, put and packet ops through memory channels, reductions) split their
//     bytes over the threads of all lanes (16-byte vectors where aligned; reductions and packet
//     loops keep 2 vectors or payloads per thread in flight); pipelines repeat their inner ops
//     over unitSize-byte steps;
//   - sync ops (signal, wait, flush, barrier, semaphores) and port-channel ops run on lane 0:
//     with several lanes, a lane barrier precedes them when data moved since the last one and
//     follows them before the next data op (with one lane the block's threads run every op in
//     order, as before); with ExecArgs.laneSync = 2 (async) the memory-channel signals and waits
//     and the nops the lowering marked cross without lane barriers (see "async lane sync");
//   - channel ops: thread k of the block handles channel k (k, k + blockDim, ...).
// Reductions accumulate 16-bit and fp8 floats in f32 (collectives/common.hpp's element rules).
// With ExecArgs.trace set, thread 0 of each GPU block adds its cycles per op to the trace
// words (executor_device.hpp); off, the cost is one test of a null pointer per op.
//
// executorRun(args), the body of both entry points:
//   args.dtype: the element type of reductions (fp8 only on CUDA); args.packet: 0 LL16, 1 LL8.
// hipcc inlines every device function into the kernel (no calls on AMD by default), and each
// spin bound's printf then costs so many registers that the AMDGPU backend gives up ("no
// registers from class available"): the spin bounds are compiled out on HIP. The host still
// bounds every execution by its stream-synchronize timeout.
#if defined(__HIP__) || defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define MSCCLPP_NO_DEVICE_CHECKS 1
#endif
#include <mscclpp/executor_device.hpp>

#include "../collectives/common.hpp"

using namespace mscclpp;
using mscclpp::coll::Elem;

// Plans compiled at load time (MSCCLPP_EXECUTOR_JIT; core/src/executor/run/jit.rs generates the
// source): every op is a constant of the generated kernel, so the op functions are inlined into
// it and the compiler keeps only the branches each op takes; the element type
// (MSCCLPP_EXECUTOR_JIT_TYPE) and the packet format (MSCCLPP_EXECUTOR_JIT_LL8) are constants too.
// The interpreter builds keep the op functions out of line (their registers and code size).
// EXEC_JIT_INLINE: inlined in generated kernels, the compiler's choice in the interpreter.
#if defined(MSCCLPP_EXECUTOR_JIT)
#define EXEC_OP_FN __forceinline__
#define EXEC_JIT_INLINE __forceinline__
#else
#define EXEC_OP_FN __noinline__
#define EXEC_JIT_INLINE
#endif

/// `for k in 0..n` over the items of an op one per thread (item k on thread k, k + blockDim, ...):
/// channels, port outputs, semaphores (N: the op array's size). In a generated kernel the loop
/// is unrolled to N with constant indexes, `n` (a literal there) and the thread as the guard
/// (bounded by `n` alone it was not unrolled in time), so the op's arrays stay constants.
/// Indexed by threadIdx.x, each such ExecOp went to local memory: with the case below, a
/// 1920-byte stack frame per thread in allreduce_simple_n2 (ptxas -v, sm_90).
#if defined(MSCCLPP_EXECUTOR_JIT)
#define EXEC_FOR_THREAD(k, n, N)                 \
  _Pragma("unroll") for (int k = 0; k < (N); ++k) \
    if (k < (int)(n) && (uint32_t)k % blockDim.x == threadIdx.x)
#else
#define EXEC_FOR_THREAD(k, n, N) for (int k = threadIdx.x; k < (int)(n); k += blockDim.x)
#endif

/// `for i in 0..n` over an op's inputs or outputs where the body fills a pointer array from the
/// op (N: the arrays' size): in a generated kernel unrolled to N with constant indexes and `n`
/// (a literal there) as the guard, so the op and the pointers stay in registers and constants
/// (bounded by `n` alone, the loop was not unrolled before the compiler placed the op, and the
/// op and the pointers went to local memory); the interpreter's plain loop otherwise.
#if defined(MSCCLPP_EXECUTOR_JIT)
#define EXEC_FOR_EACH(i, n, N) _Pragma("unroll") for (int i = 0; i < (N); ++i) if (i < (int)(n))
#else
#define EXEC_FOR_EACH(i, n, N) for (int i = 0; i < (int)(n); ++i)
#endif

/// Whether the lane sync of code `m` (ExecArgs.laneSync) is compiled in: in a generated kernel
/// only its own (MSCCLPP_EXECUTOR_JIT_LANE_SYNC, the code its launches carry), in the
/// interpreter every one.
#if defined(MSCCLPP_EXECUTOR_JIT_LANE_SYNC)
#define EXEC_SYNC_BUILT(m) (MSCCLPP_EXECUTOR_JIT_LANE_SYNC == (m))
#else
#define EXEC_SYNC_BUILT(m) 1
#endif

namespace {

struct Run {
  const ExecBlock* b;  // in shared memory
  ExecArgs a;
  uint32_t flag;
  bool even;
  // Lanes: this GPU block is lane `lane` of `lanes` running the plan block; data ops split
  // their work over tid (0..nthr) of all lanes.
  uint32_t lane, lanes, tid, nthr;
  uint32_t* laneWords;  // this plan block's lane words (see laneArrive and the split sync)
  // Split lane sync (ExecArgs.laneSync): joins and releases so far in this launch (the same
  // on every lane: every lane takes the same steps).
  bool split;
  uint32_t joins, releases;
  // Async lane sync (ExecArgs.laneSync = 2, several lanes): signals arrived at so far in this
  // launch (the same on every lane), and this GPU block's async state (shared memory).
  bool async;
  uint32_t signals;
  struct AsyncShared* as;

  __device__ char* local(uint8_t ty) const {
    if (ty == 0) return a.input;
    if (ty == 1) return a.output;
    return a.scratch + (even ? a.scratchHalf : 0);
  }
  /// Base of a chunk reference (local, or a remote buffer reached through a memory channel).
  __device__ char* loc(uint8_t ref) const {
    if ((ref & EXEC_REF_REMOTE) == 0) return local(ref);
    const int slot = ref & ~EXEC_REF_REMOTE;
    return reinterpret_cast<char*>(b->memoryBuffers[slot]) + (even ? b->memoryBufferHalves[slot] : 0);
  }
  __device__ uint64_t it(uint8_t ty, uint64_t off) const {
    return (ty == 2 && a.reuseChunk > 0) ? off % a.reuseChunk : off;
  }
};

/// Whether packets are LL8 (else LL16): the launch's, or the generated kernel's constant.
__device__ __forceinline__ bool packetLL8(const Run& r) {
#if defined(MSCCLPP_EXECUTOR_JIT)
  (void)r;
  return MSCCLPP_EXECUTOR_JIT_LL8 != 0;
#else
  return r.a.packet != 0;
#endif
}

__device__ uint64_t stepSize(uint32_t size, uint64_t off, uint64_t unit) {
  const uint64_t s = size > off ? size - off : 0;
  return s < unit ? s : unit;
}

/// Where a data op's buffer i starts at step `off`: its input (In) or output, through `loc`
/// (Remote: a memory channel's buffer allowed) or `local`. The data ops (copy, get, put through
/// a memory channel, the reductions) and vectorSplit take their addresses from here and their
/// sizes from the range functions below, so the split nops' check sees what the ops move.
template <bool In, bool Remote>
__device__ __forceinline__ char* opBuf(const Run& r, const ExecOp& o, int i, uint64_t off) {
  const uint8_t ref = In ? o.inputRefs[i] : o.outputRefs[i];
  return (Remote ? r.loc(ref) : r.local(ref)) + (In ? o.inputOffsets[i] : o.outputOffsets[i]) +
         r.it(In ? o.inputTypes[i] : o.outputTypes[i], off);
}

/// One contiguous move of a data op at step `off`: `size` bytes from `src` to `dst`.
struct OpRange {
  char* dst;
  const char* src;
  uint64_t size;
};

/// copy: input 0 to output 0, both this rank's.
__device__ __forceinline__ OpRange copyRange(const Run& r, const ExecOp& o, uint64_t off, uint64_t unit) {
  return {opBuf<false, false>(r, o, 0, off), opBuf<true, false>(r, o, 0, off), stepSize(o.inputSizes[0], off, unit)};
}

/// get, pair i: a peer's input i (through its memory channel) to output i.
__device__ __forceinline__ OpRange getRange(const Run& r, const ExecOp& o, int i, uint64_t off, uint64_t unit) {
  return {opBuf<false, true>(r, o, i, off), opBuf<true, true>(r, o, i, off), stepSize(o.inputSizes[i], off, unit)};
}

/// put through a memory channel, pair i: this rank's input i to the peer's output i.
__device__ __forceinline__ OpRange putRange(const Run& r, const ExecOp& o, int i, uint64_t off, uint64_t unit) {
  return {opBuf<false, true>(r, o, i, off), opBuf<true, false>(r, o, i, off), stepSize(o.outputSizes[i], off, unit)};
}

__device__ __noinline__ void gridBarrier(uint32_t* words, uint32_t n) {
  volatile uint32_t* gen = words + 1;
  const uint32_t g = *gen;
  __threadfence();
  if (atomicAdd(words, 1u) == n - 1) {
    atomicExch(words, 0u);
    __threadfence();
    atomicAdd(words + 1, 1u);
  } else {
    MSCCLPP_SPIN_UNTIL(*gen != g, -1, "executor barrier");
  }
  // The barrier orders the blocks of one GPU, so a device-scope fence is enough (as upstream's
  // DeviceSyncer). What a block then publishes to a peer or the proxy (signal, the FIFO push of a
  // port op) is a system-scope release, which also covers the writes of the other blocks it saw
  // through the barrier; a relaxed signal orders nothing, barrier or not. A system-scope fence
  // here cost about 3 us per call of a 4-rank plan with barriers (H200, docs/perf.md round 25).
  __threadfence();
}

/// The op type `OP` where a generated kernel knows it at compile time, else -1: passed down to
/// reduceOp and movePackets, which then instantiate only that op's code. The interpreter keeps
/// one instantiation for every op type (its code size and registers).
#if defined(MSCCLPP_EXECUTOR_JIT)
template <int OP>
constexpr int kJitOp = OP;
#else
template <int OP>
constexpr int kJitOp = -1;
#endif

// ---- reductions ----
// One function per element type (the reduce op and the packet format are run-time values), so
// the kernel stays small enough to compile quickly with nvcc and hipcc.

template <typename A>
__device__ A combineRt(uint8_t op, A a, A b) {
  if (op == 1) return coll::combine<coll::OpMin>(a, b);
  if (op == 2) return coll::combine<coll::OpMax>(a, b);
  return coll::combine<coll::OpSum>(a, b);
}

/// The prefetch build (executor_prefetch.cu: 256 threads, the default where a launch fits it;
/// measured on the H100 in round 13) loads a reduction's next input while it combines one
/// (twice the loads of a thread in flight); the other two builds (narrow: the A/B knob, wide)
/// keep the loop round 12 measured.
#if defined(MSCCLPP_EXECUTOR_PREFETCH)
constexpr bool kPrefetch = true;
#else
constexpr bool kPrefetch = false;
#endif

/// acc[u][k] = element k of vector v[u], widened (First), else acc[u][k] (op) that.
template <typename T, int U, bool First = false>
__device__ __forceinline__ void fold(uint8_t op, typename Elem<T>::Acc (&acc)[U][coll::Pack<T, uint4>::N],
                                     const uint4 (&v)[U]) {
  using P = coll::Pack<T, uint4>;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    P p;
    p.w = v[u];
#pragma unroll
    for (int k = 0; k < P::N; ++k) {
      acc[u][k] = First ? Elem<T>::up(p.v[k]) : combineRt(op, acc[u][k], Elem<T>::up(p.v[k]));
    }
  }
}

/// Stores vector u of acc (narrowed) at w0 + u * nthr of every output, those below n.
template <typename T, int U>
__device__ __forceinline__ void storeRound(const typename Elem<T>::Acc (&acc)[U][coll::Pack<T, uint4>::N],
                                           char* const* out, int nOut, uint64_t w0, uint64_t nthr, uint64_t n) {
  using P = coll::Pack<T, uint4>;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const uint64_t w = w0 + (uint64_t)u * nthr;
    if (w >= n) continue;
    P p;
#pragma unroll
    for (int k = 0; k < P::N; ++k) p.v[k] = Elem<T>::down(acc[u][k]);
    for (int i = 0; i < nOut; ++i) reinterpret_cast<uint4*>(out[i])[w] = p.w;
  }
}

/// Vector wc[u] of `in` into v[u], for each u (the prefetch build's rounds: indexes already
/// clamped into the message, so every load is defined and the vectors stay in registers).
template <int U>
__device__ __forceinline__ void loadRound(uint4 (&v)[U], const char* in, const uint64_t (&wc)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) v[u] = reinterpret_cast<const uint4*>(in)[wc[u]];
}

template <typename T>
__device__ EXEC_OP_FN void reduceElems(const Run& r, const ExecOp& o, uint64_t off, uint64_t unit) {
  using A = typename Elem<T>::Acc;
  const uint64_t size = stepSize(o.inputSizes[0], off, unit);
  if (size == 0) return;
  const char* in[EXEC_MAX_BUFFERS_PER_OP];
  char* out[EXEC_MAX_BUFFERS_PER_OP];
  bool aligned = (size % 16) == 0;
  EXEC_FOR_EACH(i, o.nInputs, EXEC_MAX_BUFFERS_PER_OP) {
    in[i] = opBuf<true, true>(r, o, i, off);
    aligned = aligned && ((uintptr_t)in[i] % 16) == 0;
  }
  EXEC_FOR_EACH(i, o.nOutputs, EXEC_MAX_BUFFERS_PER_OP) {
    out[i] = opBuf<false, true>(r, o, i, off);
    aligned = aligned && ((uintptr_t)out[i] % 16) == 0;
  }
  const uint8_t op = o.reduceOp;
  if (aligned) {
    // Vectors w, w + nthr, ... (U of them) per round: U loads of each input in flight at once
    // (one at a time left every thread a load latency per 16 bytes and input). The prefetch
    // build (kPrefetch) also loads the next input's vectors before this input's are combined
    // (two buffers taking turns), so 2U loads of a thread are in flight where one input at a
    // time costs a load latency per input (a 2-input reduction of 16 MiB at 2 ranks took
    // 45-53 us on the H200, the native rsag's whole all-reduce 51), and clamps the vectors of a
    // round into the message, so every load is defined (a conditional one kept the vectors in
    // local memory). The thread of each vector and the order of the inputs are as before, so
    // the results are the same.
    using P = coll::Pack<T, uint4>;
    constexpr int U = P::N <= 8 ? 2 : 1;
    const uint64_t n = size / 16;
    const int nIn = o.nInputs;
    if constexpr (kPrefetch) {
      for (uint64_t w0 = r.tid; w0 < n; w0 += (uint64_t)U * r.nthr) {
        A acc[U][P::N];
        // Vector u of this round, clamped into the message (those past the end are not stored).
        uint64_t wc[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const uint64_t w = w0 + (uint64_t)u * r.nthr;
          wc[u] = w < n ? w : n - 1;
        }
        uint4 x[U], y[U];
        loadRound<U>(x, in[0], wc);
        if (nIn > 1) loadRound<U>(y, in[1], wc);
        fold<T, U, true>(op, acc, x);
        // y holds input i: combine it while input i + 1 arrives in x, then x while input i + 2
        // arrives in y.
        // (Not unrolled in generated kernels: with more than 2 inputs `in` stays in local
        // memory there, 8 bytes per input, where unrolling cost 20-40% more compile time.)
        for (int i = 1; i < nIn; i += 2) {
          if (i + 1 < nIn) loadRound<U>(x, in[i + 1], wc);
          fold<T, U>(op, acc, y);
          if (i + 1 < nIn) {
            if (i + 2 < nIn) loadRound<U>(y, in[i + 2], wc);
            fold<T, U>(op, acc, x);
          }
        }
        storeRound<T, U>(acc, out, o.nOutputs, w0, r.nthr, n);
      }
      return;
    }
    for (uint64_t w0 = r.tid; w0 < n; w0 += (uint64_t)U * r.nthr) {
      uint4 raw[U];
      A acc[U][P::N];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const uint64_t w = w0 + (uint64_t)u * r.nthr;
        if (w < n) raw[u] = reinterpret_cast<const uint4*>(in[0])[w];
      }
      fold<T, U, true>(op, acc, raw);
      for (int i = 1; i < o.nInputs; ++i) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const uint64_t w = w0 + (uint64_t)u * r.nthr;
          if (w < n) raw[u] = reinterpret_cast<const uint4*>(in[i])[w];
        }
        fold<T, U>(op, acc, raw);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const uint64_t w = w0 + (uint64_t)u * r.nthr;
        if (w >= n) continue;
        P p;
#pragma unroll
        for (int k = 0; k < P::N; ++k) p.v[k] = Elem<T>::down(acc[u][k]);
        for (int i = 0; i < o.nOutputs; ++i) reinterpret_cast<uint4*>(out[i])[w] = p.w;
      }
    }
    return;
  }
  const uint64_t n = size / sizeof(T);
  for (uint64_t e = r.tid; e < n; e += r.nthr) {
    A acc = Elem<T>::up(reinterpret_cast<const T*>(in[0])[e]);
    for (int i = 1; i < o.nInputs; ++i) acc = combineRt(op, acc, Elem<T>::up(reinterpret_cast<const T*>(in[i])[e]));
    const T v = Elem<T>::down(acc);
    for (int i = 0; i < o.nOutputs; ++i) reinterpret_cast<T*>(out[i])[e] = v;
  }
}

/// A packet payload (8 bytes of LL16, the first 4 of them for LL8) as elements of T.
template <typename T>
union Payload {
  uint2 w;
  uint32_t u[2];
  T v[8 / sizeof(T)];
};

template <typename T>
__device__ void writePacket(char* base, uint32_t idx, bool ll8, const Payload<T>& p, uint32_t flag) {
  if (ll8) {
    reinterpret_cast<LL8Packet*>(base)[idx].write(p.u[0], flag);
  } else {
    reinterpret_cast<LL16Packet*>(base)[idx].write(p.w, flag);
  }
}

/// Packets i0, i0 + stride, ... (U of them, those below n) of `src`: one load of each first (U
/// in flight), then a spin on each that did not carry `flag` yet; their payloads into `v`.
template <typename P, int U>
__device__ void readPacketsOf(const P* src, uint64_t i0, uint64_t stride, uint64_t n, uint32_t flag,
                              typename P::Payload (&v)[U]) {
  bool ok[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const uint64_t i = i0 + u * stride;
    ok[u] = i >= n || src[i].readOnce(flag, v[u]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (!ok[u]) v[u] = src[i0 + u * stride].read(flag);
  }
}

/// readPacketsOf for a packet format chosen at run time (`ll8`), payloads as elements of T.
template <typename T, int U>
__device__ void readPackets(const char* base, uint32_t i0, uint32_t stride, uint32_t count, bool ll8, uint32_t flag,
                            Payload<T> (&q)[U]) {
  if (ll8) {
    uint32_t v[U];
    readPacketsOf<LL8Packet, U>(reinterpret_cast<const LL8Packet*>(base), i0, stride, count, flag, v);
#pragma unroll
    for (int u = 0; u < U; ++u) q[u].u[0] = v[u];
  } else {
    uint2 v[U];
    readPacketsOf<LL16Packet, U>(reinterpret_cast<const LL16Packet*>(base), i0, stride, count, flag, v);
#pragma unroll
    for (int u = 0; u < U; ++u) q[u].w = v[u];
  }
}

/// Payloads per thread in flight in the packet ops (copies and reductions). A generated kernel
/// defines it from MSCCLPP_EXECUTOR_PACKET_UNROLL (1, 2, 4 or 8); the interpreter keeps 2.
#ifndef MSCCLPP_EXECUTOR_PACKET_UNROLL
#define MSCCLPP_EXECUTOR_PACKET_UNROLL 2
#endif
constexpr int kPacketUnroll = MSCCLPP_EXECUTOR_PACKET_UNROLL;

/// copyToPackets with kPacketUnroll payloads per thread in flight (the same thread per payload).
template <typename P>
__device__ void toPackets(char* packets, const char* data, uint64_t bytes, uint32_t tid, uint32_t nthr,
                          uint32_t flag) {
  using W = typename P::Payload;
  constexpr int U = kPacketUnroll;
  P* dst = reinterpret_cast<P*>(packets);
  const W* src = reinterpret_cast<const W*>(data);
  const uint64_t n = bytes / sizeof(W);
  for (uint64_t i0 = tid; i0 < n; i0 += (uint64_t)U * nthr) {
    W v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i0 + u * nthr < n) v[u] = src[i0 + u * nthr];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i0 + u * nthr < n) dst[i0 + u * nthr].write(v[u], flag);
    }
  }
}

/// copyFromPackets with kPacketUnroll packets per thread read together.
template <typename P>
__device__ void fromPackets(char* data, const char* packets, uint64_t bytes, uint32_t tid, uint32_t nthr,
                            uint32_t flag) {
  using W = typename P::Payload;
  constexpr int U = kPacketUnroll;
  const P* src = reinterpret_cast<const P*>(packets);
  W* dst = reinterpret_cast<W*>(data);
  const uint64_t n = bytes / sizeof(W);
  for (uint64_t i0 = tid; i0 < n; i0 += (uint64_t)U * nthr) {
    W v[U];
    readPacketsOf<P, U>(src, i0, nthr, n, flag, v);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i0 + u * nthr < n) dst[i0 + u * nthr] = v[u];
    }
  }
}

/// repkt / respkt / recpkt / recspkt.
template <typename T>
__device__ EXEC_OP_FN void reducePackets(const Run& r, const ExecOp& o) {
  using A = typename Elem<T>::Acc;
  const bool ll8 = packetLL8(r);
  const uint32_t pay = ll8 ? 4 : 8;
  const int n = pay / sizeof(T);
  MSCCLPP_DEVICE_CHECK(n > 0, "executor: element larger than the packet payload");
  const bool copies = o.opType == EXEC_REDUCE_COPY_PACKETS || o.opType == EXEC_REDUCE_COPY_SEND_PACKETS;
  const bool sends = o.opType == EXEC_REDUCE_SEND_PACKETS || o.opType == EXEC_REDUCE_COPY_SEND_PACKETS;
  const uint32_t count = o.inputSizes[0] / pay;
  const char* src0 = r.local(o.inputRefs[0]) + o.inputOffsets[0];
  char* dst0 = r.local(o.outputRefs[0]) + o.outputOffsets[0];
  constexpr int M = 8 / sizeof(T);
  // Payloads idx, idx + nthr, ... (U of them) per round, every input's packets read together
  // (one at a time left every thread a load latency per payload and input). Same thread per
  // payload and same input order as one at a time.
  constexpr int U = kPacketUnroll;
  const uint32_t nthr = r.nthr;
  for (uint32_t i0 = r.tid; i0 < count; i0 += U * nthr) {
    Payload<T> p[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t idx = i0 + u * nthr;
      if (idx >= count) continue;
      if (ll8) {
        p[u].u[0] = reinterpret_cast<const uint32_t*>(src0)[idx];
      } else {
        p[u].w = reinterpret_cast<const uint2*>(src0)[idx];
      }
    }
    A acc[U][M];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int k = 0; k < M; ++k) acc[u][k] = Elem<T>::up(p[u].v[k]);
    }
    for (int j = 1; j < o.nInputs; ++j) {
      Payload<T> q[U];
      readPackets<T, U>(r.local(o.inputRefs[j]) + 2 * (uint64_t)o.inputOffsets[j], i0, nthr, count, ll8, r.flag, q);
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int k = 0; k < M; ++k) {
          if (k < n) acc[u][k] = combineRt(o.reduceOp, acc[u][k], Elem<T>::up(q[u].v[k]));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t idx = i0 + u * nthr;
      if (idx >= count) continue;
#pragma unroll
      for (int k = 0; k < M; ++k) {
        if (k < n) p[u].v[k] = Elem<T>::down(acc[u][k]);
      }
      if (ll8) {
        reinterpret_cast<uint32_t*>(dst0)[idx] = p[u].u[0];
      } else {
        reinterpret_cast<uint2*>(dst0)[idx] = p[u].w;
      }
      if (copies) writePacket<T>(r.local(o.outputRefs[1]) + 2 * (uint64_t)o.outputOffsets[1], idx, ll8, p[u], r.flag);
      if (sends) {
        for (int j = copies ? 2 : 1; j < o.nOutputs; ++j) {
          writePacket<T>(r.loc(o.outputRefs[j]) + 2 * (uint64_t)o.outputOffsets[j], idx, ll8, p[u], r.flag);
        }
      }
    }
  }
}

/// OP: the op type when the caller knows it (a generated kernel: kJitOp), else -1 (read from
/// the op). Known, only the function the op runs is instantiated before the caller inlines it
/// (the compiler had built both bodies for every reduction and dropped one only later: up to
/// 1.5x the compile time of a plan kernel).
template <typename T, int OP = -1>
__device__ void reduceOp(const Run& r, const ExecOp& o, uint64_t off, uint64_t unit) {
  if constexpr (OP >= 0) {
    if constexpr (OP >= EXEC_REDUCE_SEND_PACKETS) {
      reducePackets<T>(r, o);
    } else {
      reduceElems<T>(r, o, off, unit);
    }
  } else if (o.opType >= EXEC_REDUCE_SEND_PACKETS) {
    reducePackets<T>(r, o);
  } else {
    reduceElems<T>(r, o, off, unit);
  }
}

template <int OP = -1>
__device__ EXEC_OP_FN void reduceDispatch(const Run& r, const ExecOp& o, uint64_t off, uint64_t unit) {
#if defined(MSCCLPP_EXECUTOR_JIT)
  reduceOp<MSCCLPP_EXECUTOR_JIT_TYPE, OP>(r, o, off, unit);
#else
  switch (r.a.dtype) {
    case EXEC_I8: reduceOp<int8_t>(r, o, off, unit); break;
    case EXEC_U8: reduceOp<uint8_t>(r, o, off, unit); break;
    case EXEC_I32: reduceOp<int32_t>(r, o, off, unit); break;
    case EXEC_U32: reduceOp<uint32_t>(r, o, off, unit); break;
    case EXEC_I64: reduceOp<int64_t>(r, o, off, unit); break;
    case EXEC_U64: reduceOp<uint64_t>(r, o, off, unit); break;
    case EXEC_F16: reduceOp<__half>(r, o, off, unit); break;
    case EXEC_F32: reduceOp<float>(r, o, off, unit); break;
    case EXEC_F64: reduceOp<double>(r, o, off, unit); break;
    case EXEC_BF16: reduceOp<coll::bf16_t>(r, o, off, unit); break;
#if defined(MSCCLPP_COLL_HAS_FP8)
    case EXEC_FP8E4M3: reduceOp<__nv_fp8_e4m3>(r, o, off, unit); break;
    case EXEC_FP8E5M2: reduceOp<__nv_fp8_e5m2>(r, o, off, unit); break;
#endif
    default: MSCCLPP_DEVICE_CHECK(false, "executor: data type not built for this GPU"); break;
  }
#endif
}

// ---- data movement ----

/// (dst id, dst offset, src id, src offset) of output i of a port op; packets double offsets.
struct PortEnds {
  uint32_t dst, src;
  uint64_t dstOff, srcOff;
};
__device__ PortEnds portEnds(const Run& r, const ExecOp& o, int i, uint64_t off, int k) {
  const int slot = o.outputRefs[i] & ~EXEC_REF_REMOTE;
  const int j = i < o.nInputs ? i : 0;
  const uint8_t st = o.inputRefs[j];
  PortEnds e;
  e.dst = r.b->portBuffers[slot];
  e.dstOff = k * (uint64_t)o.outputOffsets[i] + (r.even ? r.b->portBufferHalves[slot] : 0) + r.it(o.outputTypes[i], off);
  e.src = st;
  e.srcOff = k * (uint64_t)o.inputOffsets[j] + ((st == 2 && r.even) ? r.a.scratchHalf : 0) + r.it(st, off);
  return e;
}

__device__ EXEC_OP_FN void put(const Run& r, const ExecOp& o, uint64_t off, uint64_t unit) {
  if (o.channelType == EXEC_CHANNEL_MEMORY) {
    for (int i = 0; i < o.nOutputs; ++i) {
      const OpRange m = putRange(r, o, i, off, unit);
      if (m.size > 0) copy(m.dst, m.src, m.size, r.tid, r.nthr);
    }
    return;
  }
  EXEC_FOR_THREAD(i, o.nOutputs, EXEC_MAX_BUFFERS_PER_OP) {
    const uint64_t size = stepSize(o.outputSizes[i], off, unit);
    if (size == 0) continue;
    const PortEnds e = portEnds(r, o, i, off, 1);
    BasePortChannelDeviceHandle ch = r.b->portChannels[o.channels[i]];
    if (o.opType == EXEC_PUT) {
      ch.put(e.dst, e.dstOff, e.src, e.srcOff, size);
    } else if (o.opType == EXEC_PUT_WITH_SIGNAL) {
      ch.putWithSignal(e.dst, e.dstOff, e.src, e.srcOff, size);
    } else {
      ch.putWithSignalAndFlush(e.dst, e.dstOff, e.src, e.srcOff, size);
    }
  }
}

template <typename P, int OP = -1>
__device__ EXEC_OP_FN void movePackets(const Run& r, const ExecOp& o) {
  using W = typename P::Payload;
  const uint64_t size = o.inputSizes[0];
  char* src = r.local(o.inputRefs[0]);
  // OP known (kJitOp): the switch folds before the cases' code is inlined (as reduceOp).
  switch (OP >= 0 ? OP : (int)o.opType) {
    case EXEC_PUT_PACKETS:
      if (o.channelType == EXEC_CHANNEL_PORT) {
        EXEC_FOR_THREAD(i, o.nOutputs, EXEC_MAX_BUFFERS_PER_OP) {
          const PortEnds e = portEnds(r, o, i, 0, 2);
          BasePortChannelDeviceHandle ch = r.b->portChannels[o.channels[i]];
          ch.put(e.dst, e.dstOff, e.src, e.srcOff, 2 * (uint64_t)o.inputSizes[i]);
        }
      } else {
        for (int i = 0; i < o.nOutputs; ++i) {
          toPackets<P>(r.loc(o.outputRefs[i]) + 2 * (uint64_t)o.outputOffsets[i],
                       r.local(o.inputRefs[i]) + o.inputOffsets[i], o.inputSizes[i], r.tid, r.nthr, r.flag);
        }
      }
      break;
    case EXEC_COPY_PACKETS:
      toPackets<P>(r.local(o.outputRefs[0]) + 2 * (uint64_t)o.outputOffsets[0], src + o.inputOffsets[0], size, r.tid,
                   r.nthr, r.flag);
      break;
    case EXEC_UNPACK_PACKETS:
      fromPackets<P>(r.local(o.outputRefs[0]) + o.outputOffsets[0], src + 2 * (uint64_t)o.inputOffsets[0], size,
                     r.tid, r.nthr, r.flag);
      break;
    default: {  // EXEC_READ_PUT_PACKETS
      const P* pk = reinterpret_cast<const P*>(src + 2 * (uint64_t)o.inputOffsets[0]);
      const uint64_t n = size / sizeof(W);
      constexpr int U = kPacketUnroll;
      for (uint64_t i0 = r.tid; i0 < n; i0 += (uint64_t)U * r.nthr) {
        W v[U];
        readPacketsOf<P, U>(pk, i0, r.nthr, n, r.flag, v);
        if (o.channelType == EXEC_CHANNEL_MEMORY) {
          for (int j = 0; j < o.nOutputs; ++j) {
            P* q = reinterpret_cast<P*>(r.loc(o.outputRefs[j]) + 2 * (uint64_t)o.outputOffsets[j]);
#pragma unroll
            for (int u = 0; u < U; ++u) {
              if (i0 + u * r.nthr < n) q[i0 + u * r.nthr].write(v[u], r.flag);
            }
          }
        }
      }
      if (o.channelType == EXEC_CHANNEL_PORT) {
        __syncthreads();
        EXEC_FOR_THREAD(i, o.nOutputs, EXEC_MAX_BUFFERS_PER_OP) {
          const PortEnds e = portEnds(r, o, i, 0, 2);
          BasePortChannelDeviceHandle ch = r.b->portChannels[o.channels[i]];
          ch.put(e.dst, e.dstOff, e.src, e.srcOff, 2 * size);
        }
      }
    }
  }
}

/// Op `OP` (an ExecOpType) of `o`: exec's cases one at a time, so a generated plan kernel
/// (MSCCLPP_EXECUTOR_JIT) instantiates only the code of the ops it has.
template <int OP>
__device__ __forceinline__ void execOp(const Run& r, const ExecOp& o, uint64_t off, uint64_t unit) {
  if constexpr (OP == EXEC_NOP) {
    __syncthreads();
  } else if constexpr (OP == EXEC_BARRIER) {
    __syncthreads();
    if (threadIdx.x == 0 && o.nBlocks > 1) gridBarrier(r.a.barriers + 2 * o.barrierId, o.nBlocks);
    __syncthreads();
  } else if constexpr (OP == EXEC_SIGNAL || OP == EXEC_RELAXED_SIGNAL) {
    EXEC_FOR_THREAD(k, o.nChannels, EXEC_MAX_CHANNELS_PER_OP) {
      if (o.channelType == EXEC_CHANNEL_MEMORY) {
        BaseMemoryChannelDeviceHandle h = r.b->memoryChannels[o.channels[k]];
        if (OP == EXEC_SIGNAL) {
          h.signal();
        } else {
          h.relaxedSignal();
        }
      } else {
        BasePortChannelDeviceHandle h = r.b->portChannels[o.channels[k]];
        h.signal();
      }
    }
  } else if constexpr (OP == EXEC_WAIT || OP == EXEC_RELAXED_WAIT) {
    EXEC_FOR_THREAD(k, o.nChannels, EXEC_MAX_CHANNELS_PER_OP) {
      if (o.channelType == EXEC_CHANNEL_MEMORY) {
        BaseMemoryChannelDeviceHandle h = r.b->memoryChannels[o.channels[k]];
        if (OP == EXEC_WAIT) {
          h.wait();
        } else {
          h.relaxedWait();
        }
      } else {
        BasePortChannelDeviceHandle h = r.b->portChannels[o.channels[k]];
        h.wait();
      }
    }
  } else if constexpr (OP == EXEC_FLUSH) {
    EXEC_FOR_THREAD(k, o.nChannels, EXEC_MAX_CHANNELS_PER_OP) {
      BasePortChannelDeviceHandle h = r.b->portChannels[o.channels[k]];
      h.flush();
    }
  } else if constexpr (OP == EXEC_PUT || OP == EXEC_PUT_WITH_SIGNAL || OP == EXEC_PUT_WITH_SIGNAL_AND_FLUSH) {
    put(r, o, off, unit);
  } else if constexpr (OP == EXEC_GET) {
    for (int i = 0; i < o.nInputs; ++i) {
      const OpRange m = getRange(r, o, i, off, unit);
      if (m.size > 0) copy(m.dst, m.src, m.size, r.tid, r.nthr);
    }
  } else if constexpr (OP == EXEC_COPY) {
    const OpRange m = copyRange(r, o, off, unit);
    if (m.size > 0) copy(m.dst, m.src, m.size, r.tid, r.nthr);
  } else if constexpr (OP == EXEC_REDUCE || OP == EXEC_REDUCE_SEND || OP == EXEC_READ_REDUCE ||
                       OP == EXEC_READ_REDUCE_SEND || OP == EXEC_REDUCE_PACKETS || OP == EXEC_REDUCE_SEND_PACKETS ||
                       OP == EXEC_REDUCE_COPY_PACKETS || OP == EXEC_REDUCE_COPY_SEND_PACKETS) {
    reduceDispatch<kJitOp<OP>>(r, o, off, unit);
  } else if constexpr (OP == EXEC_PUT_PACKETS || OP == EXEC_READ_PUT_PACKETS || OP == EXEC_COPY_PACKETS ||
                       OP == EXEC_UNPACK_PACKETS) {
    if (!packetLL8(r)) {
      movePackets<LL16Packet, kJitOp<OP>>(r, o);
    } else {
      movePackets<LL8Packet, kJitOp<OP>>(r, o);
    }
  } else if constexpr (OP == EXEC_SEM_ACQUIRE) {
    EXEC_FOR_THREAD(k, o.nSemaphores, EXEC_MAX_SEMAPHORES_PER_OP) {
      int32_t* s = r.a.semaphores + o.semaphoreIds[k];
      volatile int32_t* vs = s;
      bool done = false;
      for (int64_t polls = 0; !done && !mscclpp::pollAbort(polls); ++polls) {  // the abort word ends it
        const int32_t v = *vs;
        done = v > 0 && atomicCAS(s, v, v - 1) == v;
      }
      __threadfence();
    }
  } else if constexpr (OP == EXEC_SEM_RELEASE) {
    EXEC_FOR_THREAD(k, o.nSemaphores, EXEC_MAX_SEMAPHORES_PER_OP) {
      __threadfence();
      atomicAdd(r.a.semaphores + o.semaphoreIds[k], 1);
    }
  } else {
    MSCCLPP_DEVICE_CHECK(false, "executor: unknown operation code");
  }
}

__device__ EXEC_OP_FN void exec(const Run& r, const ExecOp& o, uint64_t off, uint64_t unit) {
  switch (o.opType) {
    case EXEC_NOP: execOp<EXEC_NOP>(r, o, off, unit); break;
    case EXEC_BARRIER: execOp<EXEC_BARRIER>(r, o, off, unit); break;
    case EXEC_SIGNAL: execOp<EXEC_SIGNAL>(r, o, off, unit); break;
    case EXEC_RELAXED_SIGNAL: execOp<EXEC_RELAXED_SIGNAL>(r, o, off, unit); break;
    case EXEC_WAIT: execOp<EXEC_WAIT>(r, o, off, unit); break;
    case EXEC_RELAXED_WAIT: execOp<EXEC_RELAXED_WAIT>(r, o, off, unit); break;
    case EXEC_FLUSH: execOp<EXEC_FLUSH>(r, o, off, unit); break;
    case EXEC_PUT: execOp<EXEC_PUT>(r, o, off, unit); break;
    case EXEC_PUT_WITH_SIGNAL: execOp<EXEC_PUT_WITH_SIGNAL>(r, o, off, unit); break;
    case EXEC_PUT_WITH_SIGNAL_AND_FLUSH: execOp<EXEC_PUT_WITH_SIGNAL_AND_FLUSH>(r, o, off, unit); break;
    case EXEC_GET: execOp<EXEC_GET>(r, o, off, unit); break;
    case EXEC_COPY: execOp<EXEC_COPY>(r, o, off, unit); break;
    case EXEC_REDUCE: execOp<EXEC_REDUCE>(r, o, off, unit); break;
    case EXEC_REDUCE_SEND: execOp<EXEC_REDUCE_SEND>(r, o, off, unit); break;
    case EXEC_READ_REDUCE: execOp<EXEC_READ_REDUCE>(r, o, off, unit); break;
    case EXEC_READ_REDUCE_SEND: execOp<EXEC_READ_REDUCE_SEND>(r, o, off, unit); break;
    case EXEC_REDUCE_PACKETS: execOp<EXEC_REDUCE_PACKETS>(r, o, off, unit); break;
    case EXEC_REDUCE_SEND_PACKETS: execOp<EXEC_REDUCE_SEND_PACKETS>(r, o, off, unit); break;
    case EXEC_REDUCE_COPY_PACKETS: execOp<EXEC_REDUCE_COPY_PACKETS>(r, o, off, unit); break;
    case EXEC_REDUCE_COPY_SEND_PACKETS: execOp<EXEC_REDUCE_COPY_SEND_PACKETS>(r, o, off, unit); break;
    case EXEC_PUT_PACKETS: execOp<EXEC_PUT_PACKETS>(r, o, off, unit); break;
    case EXEC_READ_PUT_PACKETS: execOp<EXEC_READ_PUT_PACKETS>(r, o, off, unit); break;
    case EXEC_COPY_PACKETS: execOp<EXEC_COPY_PACKETS>(r, o, off, unit); break;
    case EXEC_UNPACK_PACKETS: execOp<EXEC_UNPACK_PACKETS>(r, o, off, unit); break;
    case EXEC_SEM_ACQUIRE: execOp<EXEC_SEM_ACQUIRE>(r, o, off, unit); break;
    case EXEC_SEM_RELEASE: execOp<EXEC_SEM_RELEASE>(r, o, off, unit); break;
    default: MSCCLPP_DEVICE_CHECK(false, "executor: unknown operation code"); break;
  }
}

/// Op `o` through exec (OP < 0: the interpreter's run-time dispatch) or as op OP (generated
/// kernels).
template <int OP>
__device__ __forceinline__ void execAny(const Run& r, const ExecOp& o, uint64_t off, uint64_t unit) {
  if constexpr (OP < 0) {
    exec(r, o, off, unit);
  } else {
    execOp<OP>(r, o, off, unit);
  }
}

/// Whether `o` runs on the first lane only (then the other lanes wait at a lane barrier):
/// synchronisation (signal, wait, flush, barrier, semaphores) and everything through a port
/// channel (the proxy reads the data). Every other op moves data and splits over all lanes.
__device__ bool laneZeroOnly(const ExecOp& o) {
  switch (o.opType) {
    case EXEC_BARRIER:
    case EXEC_SIGNAL:
    case EXEC_RELAXED_SIGNAL:
    case EXEC_WAIT:
    case EXEC_RELAXED_WAIT:
    case EXEC_FLUSH:
    case EXEC_SEM_ACQUIRE:
    case EXEC_SEM_RELEASE:
      return true;
    default:
      return o.channelType == EXEC_CHANNEL_PORT;
  }
}

/// Whether this thread has a part in `o`. Ops of pure synchronisation (signal, wait, flush,
/// semaphores) run on thread k for channel or semaphore k, so the other threads skip them
/// without the call (exec's register saves and restores in every thread of a 1024-thread
/// block are the suspected cost of the ~1.5 us per op that the round-7 plan-speed table shows
/// at 1 KiB on the H200, LL plans of 2-3 ops against Simple plans of 8-14).
__device__ bool takesPart(const ExecOp& o) {
  switch (o.opType) {
    case EXEC_SIGNAL:
    case EXEC_RELAXED_SIGNAL:
    case EXEC_WAIT:
    case EXEC_RELAXED_WAIT:
    case EXEC_FLUSH:
      return threadIdx.x < o.nChannels;
    case EXEC_SEM_ACQUIRE:
    case EXEC_SEM_RELEASE:
      return threadIdx.x < o.nSemaphores;
    default:
      return true;
  }
}

/// Thread 0's part of a lane barrier: arrive at the plan block's (count, generation) words and
/// wait for the other lanes.
__device__ __noinline__ void laneArrive(uint32_t* words, uint32_t lanes) {
  volatile uint32_t* gen = words + 1;
  const uint32_t g = *gen;
  __threadfence();
  if (atomicAdd(words, 1u) == lanes - 1) {
    atomicExch(words, 0u);
    __threadfence();
    atomicAdd(words + 1, 1u);
  } else {
    // Lane 0 may be in a bounded wait for a peer meanwhile: a longer bound than that one.
    MSCCLPP_SPIN_UNTIL(*gen != g, 4 * (int64_t)MSCCLPP_DEFAULT_MAX_SPIN, "executor lane barrier");
  }
  __threadfence();
}

/// A barrier of the `lanes` GPU blocks of one plan block (their writes visible to each other).
/// Inline: only thread 0 calls out (a call in every thread costs each its register saves).
__device__ __forceinline__ void laneBarrier(const Run& r) {
  __syncthreads();
  if (threadIdx.x == 0) laneArrive(r.laneWords, r.lanes);
  __syncthreads();
}

// ---- split lane sync (ExecArgs.laneSync = 1) ----
// The lane barrier makes every lane wait for every other one. Split, each crossing is only the
// direction it needs:
//   join    (data moved, lane 0 then runs a synchronisation op): the other lanes arrive
//           (fence, add to the join count) and go on; lane 0 waits for their arrivals.
//   release (lane 0 ran synchronisation ops, data ops follow): lane 0 publishes a value, the
//           other lanes wait for it; nobody waits for them.
//   a nop after data: join, then release; a nop after nothing: the lane's own __syncthreads.
// Words (laneWords): [0] join count (arrivals this launch; lane 0 waits for joins x (lanes - 1)),
// [1] release value ((flag << 20) + releases this launch, compared as serial numbers, so no
// reset and no lane reads a start value another may have moved), [2] exit count (every other
// lane arrives once at the end; lane 0 waits for them, then zeroes [0] and [2] for the next
// launch and writes the launch flag back). Between two joins of a lane there is always a
// release lane 0 publishes after the first (a join needs data moved since the last crossing,
// and data after a synchronisation op waits for a release), so arrivals of two joins never mix.

__device__ __noinline__ void joinArrive(uint32_t* words) {
  __threadfence();
  atomicAdd(words, 1u);
}

__device__ __noinline__ void joinWait(uint32_t* words, uint32_t target) {
  volatile uint32_t* count = words;
  MSCCLPP_SPIN_UNTIL(*count >= target, 4 * (int64_t)MSCCLPP_DEFAULT_MAX_SPIN, "executor lane join");
  __threadfence();
}

__device__ __noinline__ void releasePublish(uint32_t* words, uint32_t value) {
  __threadfence();
  atomicExch(words + 1, value);
}

__device__ __noinline__ void releaseWait(uint32_t* words, uint32_t value) {
  volatile uint32_t* v = words + 1;
  // Lane 0 may be in a bounded wait for a peer meanwhile: a longer bound than that one.
  MSCCLPP_SPIN_UNTIL((int32_t)(*v - value) >= 0, 4 * (int64_t)MSCCLPP_DEFAULT_MAX_SPIN, "executor lane release");
  __threadfence();
}

/// The other lanes' data before lane 0 goes on.
__device__ __forceinline__ void laneJoin(Run& r) {
  __syncthreads();
  ++r.joins;
  if (threadIdx.x == 0) {
    if (r.lane == 0) {
      joinWait(r.laneWords, r.joins * (r.lanes - 1));
    } else {
      joinArrive(r.laneWords);
    }
  }
  __syncthreads();
}

/// Lane 0's synchronisation ops before the other lanes go on.
__device__ __forceinline__ void laneRelease(Run& r) {
  __syncthreads();
  ++r.releases;
  const uint32_t value = (r.flag << 20) + r.releases;
  if (threadIdx.x == 0) {
    if (r.lane == 0) {
      releasePublish(r.laneWords, value);
    } else {
      releaseWait(r.laneWords, value);
    }
  }
  __syncthreads();
}

/// End of a split launch: every other lane arrives; lane 0 waits for them (all joins done and
/// every lane read the launch flag), then zeroes the counts for the next launch.
__device__ __noinline__ void laneExitThread0(uint32_t* w, uint32_t lane, uint32_t lanes) {
  if (lane != 0) {
    __threadfence();
    atomicAdd(w + 2, 1u);
    return;
  }
  volatile uint32_t* exits = w + 2;
  MSCCLPP_SPIN_UNTIL(*exits >= lanes - 1, 4 * (int64_t)MSCCLPP_DEFAULT_MAX_SPIN, "executor lane exit");
  __threadfence();
  w[0] = 0;
  w[2] = 0;
}

/// Runs a laneZeroOnly op on lane 0's own threads (those with a part in it); the other lanes
/// skip it.
template <int OP>
__device__ __forceinline__ void execOnLaneZero(Run& r, const ExecOp& o, uint64_t off, uint64_t unit) {
  if (r.lane != 0 || !takesPart(o)) return;
  const uint32_t tid = r.tid, nthr = r.nthr;
  r.tid = threadIdx.x;
  r.nthr = blockDim.x;
  execAny<OP>(r, o, off, unit);
  r.tid = tid;
  r.nthr = nthr;
}

/// Where a lane stands relative to the lane barriers.
struct LaneState {
  bool dirty = false;   // data moved since the last lane barrier
  bool synced = false;  // a lane-0 op ran since the last lane barrier
  bool met = false;     // a lane barrier was passed (every lane read its launch flag before)
  // Async lane sync, EXEC_OP_LANE_SPLIT: every data op since the last lane barrier took its
  // 16-byte vector path (vectorSplit); a split nop left out its lane barrier and no crossing
  // came since (the next data op off the vector path takes that barrier first).
  bool vec = true;
  bool open = false;
};

/// step() with the split lane sync (several lanes): joins and releases instead of lane
/// barriers. Out of line, so the barrier path keeps its registers (inlined, this raised the
/// kernel's spills from 380 to 1236 bytes).
template <int OP>
__device__ EXEC_OP_FN void stepSplit(Run& r, const ExecOp& o, uint64_t off, uint64_t unit, LaneState& st) {
  bool& dirty = st.dirty;
  bool& synced = st.synced;
  if (o.opType == EXEC_NOP) {
    if (dirty) {
      laneJoin(r);
      laneRelease(r);
    } else if (synced) {
      laneRelease(r);
    } else {
      __syncthreads();
    }
    dirty = false;
    synced = false;
    return;
  }
  if (laneZeroOnly(o)) {
    if (dirty) laneJoin(r);
    dirty = false;
    execOnLaneZero<OP>(r, o, off, unit);
    synced = true;
    return;
  }
  if (synced) laneRelease(r);
  synced = false;
  execAny<OP>(r, o, off, unit);
  dirty = true;
}

// ---- async lane sync (ExecArgs.laneSync = 2) ----
// The lane barrier around each synchronisation op makes every lane wait for every other one
// twice. Async, the lanes cross memory-channel signals and waits on their own:
//   signal  after data moved since the last lane barrier, every lane arrives at the signal's
//           own lane word (one per such signal of the launch, EXEC_ASYNC_ROUNDS at most) and
//           the last to arrive sends it, so the peer still sees every lane's data; with no
//           data since, lane 0 sends it (as the barrier path does);
//   wait    lane 0 waits for the signal (thread k for channel k); every lane counts it against
//           its own expected count of the channel (shared memory, from the channel's count at
//           the start of the launch; lane 0 writes the counts it changed back at the end), and
//           the other lanes wait for the signals they counted only before their next data op
//           (a lane barrier, which lane 0 reaches after its waits, also settles them);
//   nop     the GPU block's __syncthreads;
//   barrier (any, marked or not) one grid barrier of every lane of the plan blocks in it;
//   end     every lane counted itself in once it read the launch flag and the expected counts;
//           lane 0 waits for that count (no lane barrier) before it writes them back.
// Only where the lowering marked the op (EXEC_OP_LANE_ASYNC: no data of one lane before it that
// another lane touches after it); an unmarked one keeps the barrier path (an unmarked wait still
// counts on every lane). The host takes it only when no memory channel that a plan block waits
// on shares its semaphore (core/src/executor/run/mod.rs own_semaphores).

/// A GPU block's async state in shared memory.
struct AsyncShared {
  uint64_t expect[EXEC_MAX_CHANNELS_PER_BLOCK];  // expected signal count of each memory channel
  uint64_t base[EXEC_MAX_CHANNELS_PER_BLOCK];    // the same at the start of the launch
  uint32_t pending;                              // channels counted, not waited for (lanes > 0)
  uint32_t pendingAcquire;                       // of those, plain waits (an acquire load after)
  uint32_t last;                                 // thread 0: this lane arrived last at a signal
};

__device__ __forceinline__ AsyncShared* asyncShared() {
  __shared__ AsyncShared s;
  return &s;
}

__device__ __forceinline__ uint32_t asyncChannels(const Run& r) {
  return r.b->nMemoryChannels < EXEC_MAX_CHANNELS_PER_BLOCK ? r.b->nMemoryChannels : EXEC_MAX_CHANNELS_PER_BLOCK;
}

/// The launch's start, once r.b is readable: each memory channel's expected count into shared
/// memory. The caller synchronizes the block, then calls asyncStarted.
__device__ __forceinline__ void asyncBegin(Run& r) {
  AsyncShared* s = asyncShared();
  r.as = s;
  for (uint32_t k = threadIdx.x; k < asyncChannels(r); k += blockDim.x) {
    const uint64_t v = *r.b->memoryChannels[k].semaphore.expectedInboundToken;
    s->expect[k] = v;
    s->base[k] = v;
  }
  if (threadIdx.x == 0) {
    s->pending = 0;
    s->pendingAcquire = 0;
  }
}

/// After the block read the launch flag and the counts: this lane counts itself in (lane word 3).
__device__ __forceinline__ void asyncStarted(const Run& r) {
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(r.laneWords + 3, 1u);
  }
}

/// The launch's end on lane 0 (every thread of the block calls it): once every lane counted
/// itself in, the counts this block changed go back into the channels for the next launch.
__device__ __forceinline__ void asyncEnd(const Run& r) {
  if (r.lane != 0) return;
  if (threadIdx.x == 0) {
    volatile uint32_t* started = r.laneWords + 3;
    MSCCLPP_SPIN_UNTIL(*started >= r.lanes, 4 * (int64_t)MSCCLPP_DEFAULT_MAX_SPIN, "executor lane start");
    *started = 0;
    __threadfence();
  }
  __syncthreads();
  const AsyncShared* s = r.as;
  for (uint32_t k = threadIdx.x; k < asyncChannels(r); k += blockDim.x) {
    if (s->expect[k] != s->base[k]) *r.b->memoryChannels[k].semaphore.expectedInboundToken = s->expect[k];
  }
}

/// Waits until the inbound count `in` reaches `expected` (with an acquire load after). Out of
/// line: the spin and its bound's report, inlined into every op of a generated kernel, more
/// than doubled its compile time.
__device__ __noinline__ void asyncPollToken(const uint64_t* in, uint64_t expected, bool acquire) {
  MSCCLPP_SPIN_UNTIL(loadRelaxedSys(in) >= expected, -1, "executor async wait");
  if (acquire) (void)loadAcquireSys(in);
}

/// Waits until memory channel `ch` has its expected count (with an acquire load after).
__device__ __forceinline__ void asyncPoll(const Run& r, int ch, uint64_t expected, bool acquire) {
  asyncPollToken(r.b->memoryChannels[ch].semaphore.inboundToken, expected, acquire);
}

/// A memory-channel wait (or relaxed wait) under the async sync: every lane counts it; lane 0
/// waits (thread k for channel k); the other lanes keep a `marked` one to wait for before
/// their next data op (an unmarked one is followed by a lane barrier).
template <int OP>
__device__ __forceinline__ void asyncWait(const Run& r, const ExecOp& o, bool marked) {
  const bool acquire = (OP >= 0 ? OP : (int)o.opType) == EXEC_WAIT;
  AsyncShared* s = r.as;
  EXEC_FOR_THREAD(k, o.nChannels, EXEC_MAX_CHANNELS_PER_OP) {
    const int ch = o.channels[k];
    const uint64_t expected = ++s->expect[ch];
    if (r.lane == 0) {
      asyncPoll(r, ch, expected, acquire);
    } else if (marked) {
      atomicOr(&s->pending, 1u << ch);
      if (acquire) atomicOr(&s->pendingAcquire, 1u << ch);
    }
  }
  __syncthreads();
}

/// asyncSettle's waits (out of line: it precedes every data op of a generated kernel).
__device__ __noinline__ void asyncSettleWaits(AsyncShared* s, const ExecBlock* b, uint32_t pending) {
  const uint32_t acquire = s->pendingAcquire;
  for (uint32_t ch = threadIdx.x; ch < EXEC_MAX_CHANNELS_PER_BLOCK; ch += blockDim.x) {
    if (pending & (1u << ch)) {
      asyncPollToken(b->memoryChannels[ch].semaphore.inboundToken, s->expect[ch], (acquire >> ch) & 1u);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    s->pending = 0;
    s->pendingAcquire = 0;
  }
  __syncthreads();
}

/// Before a data op on a lane other than 0: the signals its marked waits counted.
__device__ __forceinline__ void asyncSettle(const Run& r) {
  const uint32_t pending = r.as->pending;  // the same in every thread: written before a __syncthreads
  if (pending != 0) asyncSettleWaits(r.as, r.b, pending);
}

/// A lane barrier under the async sync: lane 0 reached it after its waits, so the other lanes'
/// counted waits are settled by it too.
__device__ __forceinline__ void asyncLaneBarrier(Run& r) {
  laneBarrier(r);
  if (threadIdx.x == 0) {
    r.as->pending = 0;
    r.as->pendingAcquire = 0;
  }
  __syncthreads();
}

/// Thread 0's arrival at an async signal's lane word: whether this lane is the last (then it
/// zeroes the word for the next launch).
__device__ __noinline__ bool asyncArrive(uint32_t* word, uint32_t lanes) {
  __threadfence();
  const bool last = atomicAdd(word, 1u) == lanes - 1;
  if (last) {
    atomicExch(word, 0u);
    __threadfence();
  }
  return last;
}

/// A memory-channel signal (or relaxed signal) under the async sync: after data (`dirty`), sent
/// by the last lane to arrive, after its own threads' data; else by lane 0.
template <int OP>
__device__ __forceinline__ void asyncSignal(Run& r, const ExecOp& o, bool dirty) {
  bool send = r.lane == 0;
  if (dirty) {
    __syncthreads();
    if (threadIdx.x == 0) r.as->last = asyncArrive(r.laneWords + 4 + r.signals, r.lanes);
    __syncthreads();
    send = r.as->last != 0;
    ++r.signals;
  }
  if (!send) return;
  const bool relaxed = (OP >= 0 ? OP : (int)o.opType) == EXEC_RELAXED_SIGNAL;
  EXEC_FOR_THREAD(k, o.nChannels, EXEC_MAX_CHANNELS_PER_OP) {
    BaseMemoryChannelDeviceHandle h = r.b->memoryChannels[o.channels[k]];
    if (relaxed) {
      h.relaxedSignal();
    } else {
      h.signal();
    }
  }
}

/// Whether data op `o` moves each of its ranges on the 16-byte vector path, vector k of a range
/// on thread k % nthr of the lanes (EXEC_OP_LANE_SPLIT): a copy, get or put through a memory
/// channel (copy_device.hpp's body with no head or tail), or a reduction (reduceElems' aligned
/// path), with every address and size in 16-byte units. The ranges and buffers are the ones the
/// ops move (copyRange, getRange, putRange, opBuf).
template <int OP>
__device__ __forceinline__ bool vectorSplit(const Run& r, const ExecOp& o, uint64_t off, uint64_t unit) {
  const int op = OP >= 0 ? OP : (int)o.opType;
  uint64_t bits = 0;
  const auto add = [&](const OpRange& m) { bits |= m.size | (uintptr_t)m.dst | (uintptr_t)m.src; };
  if (op == EXEC_COPY) {
    add(copyRange(r, o, off, unit));
  } else if (op == EXEC_GET) {
    for (int i = 0; i < o.nInputs; ++i) add(getRange(r, o, i, off, unit));
  } else if ((op == EXEC_PUT || op == EXEC_PUT_WITH_SIGNAL || op == EXEC_PUT_WITH_SIGNAL_AND_FLUSH) &&
             o.channelType == EXEC_CHANNEL_MEMORY) {
    for (int i = 0; i < o.nOutputs; ++i) add(putRange(r, o, i, off, unit));
  } else if (op == EXEC_REDUCE || op == EXEC_REDUCE_SEND || op == EXEC_READ_REDUCE || op == EXEC_READ_REDUCE_SEND) {
    bits = stepSize(o.inputSizes[0], off, unit);
    for (int i = 0; i < o.nInputs; ++i) bits |= (uintptr_t)opBuf<true, true>(r, o, i, off);
    for (int i = 0; i < o.nOutputs; ++i) bits |= (uintptr_t)opBuf<false, true>(r, o, i, off);
  } else {
    return false;
  }
  return (bits & 15) == 0;
}

/// The lane-barrier crossings of step() (several lanes), shared by the barrier mode and the
/// async sync's unmarked ops (`Async`: its lane barrier, which settles the other lanes'
/// counted waits, its count of a memory-channel wait, and the settle before data on lanes
/// other than 0). A `nop` is a lane barrier (none when nothing ran since the last one), ops of
/// laneZeroOnly run on lane 0 between lane barriers, data ops split over every lane.
template <int OP, bool Async>
__device__ __forceinline__ void stepBarriers(Run& r, const ExecOp& o, uint64_t off, uint64_t unit, LaneState& st) {
  bool& dirty = st.dirty;
  bool& synced = st.synced;
  const auto barrier = [&] {
    if constexpr (Async) {
      asyncLaneBarrier(r);
      st.vec = true;
      st.open = false;
    } else {
      laneBarrier(r);
    }
  };
  if (o.opType == EXEC_NOP) {
    if (dirty || synced || !st.met) barrier();
    dirty = false;
    synced = false;
    st.met = true;
    return;
  }
  if (laneZeroOnly(o)) {
    if (dirty) {
      barrier();
      st.met = true;
    }
    dirty = false;
    const bool memoryWait = o.channelType == EXEC_CHANNEL_MEMORY && (o.opType == EXEC_WAIT || o.opType == EXEC_RELAXED_WAIT);
    if (Async && memoryWait) {
      // Every lane counts the channel's signal; lane 0 waits for it.
      asyncWait<OP>(r, o, false);
    } else {
      execOnLaneZero<OP>(r, o, off, unit);
    }
    synced = true;
    return;
  }
  if constexpr (Async) {
    // After a split nop that left out its lane barrier (st.open): an op off the vector path
    // takes it now, before its data.
    const bool v = vectorSplit<OP>(r, o, off, unit);
    if (synced || (st.open && !v)) {
      barrier();
      st.met = true;
    }
    st.vec = st.vec && v;
  } else if (synced) {
    barrier();
    st.met = true;
  }
  synced = false;
  if (Async && r.lane != 0) asyncSettle(r);
  execAny<OP>(r, o, off, unit);
  dirty = true;
}

/// step() with the async lane sync (several lanes; see above): the marked crossings and grid
/// barriers here, the rest through stepBarriers. Out of line, as stepSplit.
template <int OP>
__device__ EXEC_OP_FN void stepAsync(Run& r, const ExecOp& o, uint64_t off, uint64_t unit, LaneState& st) {
  const bool marked = (o.flags & EXEC_OP_LANE_ASYNC) != 0;
  const bool memory = o.channelType == EXEC_CHANNEL_MEMORY;
  const bool isWait = memory && (o.opType == EXEC_WAIT || o.opType == EXEC_RELAXED_WAIT);
  const bool isSignal = memory && (o.opType == EXEC_SIGNAL || o.opType == EXEC_RELAXED_SIGNAL);
  if (o.opType == EXEC_NOP && (o.flags & EXEC_OP_LANE_SPLIT) && st.vec &&
      ((o.flags & EXEC_OP_LANE_SPLIT_IO) == 0 || r.a.ioApart != 0)) {
    // The data before it meets the data after it only on the same threads (so far): the lane
    // barrier waits for the first op after it off the vector path (stepBarriers).
    __syncthreads();
    st.open = true;
    return;
  }
  // Any crossing closes a split nop's window (the lowering's: its data up to the next one).
  if (o.opType == EXEC_NOP || laneZeroOnly(o)) st.open = false;
  if (marked && o.opType == EXEC_NOP) {
    __syncthreads();
    return;
  }
  if (o.opType == EXEC_BARRIER) {
    // Every lane of the plan blocks in it arrives (their data before it, lane 0 after its
    // waits), instead of a lane barrier, lane 0's grid barrier and another lane barrier.
    __syncthreads();
    const uint32_t n = o.nBlocks * r.lanes;
    if (threadIdx.x == 0) {
      if (n > 1) gridBarrier(r.a.barriers + 2 * o.barrierId, n);
      r.as->pending = 0;
      r.as->pendingAcquire = 0;
    }
    __syncthreads();
    st.dirty = false;
    st.synced = false;
    st.met = true;
    st.vec = true;
    return;
  }
  if (marked && isWait) {
    asyncWait<OP>(r, o, true);
    return;
  }
  if (marked && isSignal) {
    asyncSignal<OP>(r, o, st.dirty);
    return;
  }
  stepBarriers<OP, true>(r, o, off, unit, st);
}

/// Runs op `o` on this lane. With several lanes, data ops split over all of them, and ops of
/// laneZeroOnly run on lane 0 between lane barriers. A `nop` with nothing run since the last
/// lane barrier (nop after nop) needs none of its own.
template <int OP = -1>
__device__ EXEC_JIT_INLINE void step(Run& r, const ExecOp& o, uint64_t off, uint64_t unit, LaneState& st) {
  if (r.lanes == 1) {
    if (o.opType == EXEC_NOP) {
      __syncthreads();
    } else if (takesPart(o)) {
      execAny<OP>(r, o, off, unit);
    }
    return;
  }
  if (o.opType == EXEC_NOP && (o.flags & EXEC_OP_LANE_LOCAL)) {
    // Between synchronisation ops of lane 0 (the lowering's mark_lane_local_nops): this GPU
    // block's threads only; `synced` stays, so the next data op still waits behind a lane
    // barrier (or, split, a release) for what lane 0 ran. (Under the async sync the lowering
    // also marks every such nop EXEC_OP_LANE_ASYNC: nothing moves data between it and the
    // next synchronisation op.)
    __syncthreads();
    return;
  }
  // A generated kernel has only its lane sync's path (EXEC_SYNC_BUILT): the others are not
  // even parsed into it (their inlined bodies, folded away later, cost the compiler a third
  // more time).
#if EXEC_SYNC_BUILT(1)
  if (r.split) {
    stepSplit<OP>(r, o, off, unit, st);
    return;
  }
#endif
#if EXEC_SYNC_BUILT(2)
  if (r.async) {
    stepAsync<OP>(r, o, off, unit, st);
    return;
  }
#endif
#if EXEC_SYNC_BUILT(0)
  stepBarriers<OP, false>(r, o, off, unit, st);
#endif
}

/// The cycle counter of this SM (trace).
__device__ __forceinline__ uint64_t traceCycles() { return (uint64_t)clock64(); }

/// Nanoseconds of a wall clock (trace; 0 where none is read).
__device__ __forceinline__ uint64_t traceNs() {
#if defined(MSCCLPP_DEVICE_HIP)
  return 0;
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

/// This GPU block's trace words when the launch traces and this is its thread 0, else null.
/// Read from the kernel parameter (constant memory) at each use, and the marks below kept in
/// shared memory, so tracing holds no register across the ops (the kernel is at its register
/// bound and spills).
__device__ __forceinline__ uint64_t* traceWords(const ExecArgs& a) {
  return (a.trace != nullptr && threadIdx.x == 0) ? a.trace + (uint64_t)blockIdx.x * EXEC_TRACE_WORDS : nullptr;
}

/// Trace marks of thread 0: kernel start (cycles, ns), start of the current op, start of the
/// current pipeline.
struct TraceMarks {
  uint64_t c0, t0, op, pipe;
};

/// Adds the cycles since `since` and one run to op i's trace slot.
__device__ __forceinline__ void traceOp(uint64_t* tr, uint32_t i, uint64_t since) {
  tr[EXEC_TRACE_HEADER_WORDS + 2 * i] += traceCycles() - since;
  tr[EXEC_TRACE_HEADER_WORDS + 2 * i + 1] += 1;
}

/// The Run of this GPU block of a launch of `args`, its plan block's tables at `b`.
__device__ __forceinline__ void runSetup(Run& r, const ExecArgs& args, const ExecBlock* b) {
  const uint32_t lanes = args.lanes > 0 ? args.lanes : 1;
  const uint32_t pb = blockIdx.x / lanes;
  r.b = b;
  r.a = args;
  r.flag = args.flags[pb] + 1;
  r.even = (r.flag & 1u) == 0;
  r.lane = blockIdx.x % lanes;
  r.lanes = lanes;
  r.tid = r.lane * blockDim.x + threadIdx.x;
  r.nthr = lanes * blockDim.x;
  r.laneWords = args.flags + args.nBlocks + EXEC_LANE_WORDS * pb;
  // A generated kernel compiles one lane sync (besides one lane's path): the launch's, which the
  // host keys its kernels by, as a constant, so the other modes' code folds away.
#if defined(MSCCLPP_EXECUTOR_JIT_LANE_SYNC)
  const uint32_t sync = MSCCLPP_EXECUTOR_JIT_LANE_SYNC;
#else
  const uint32_t sync = args.laneSync;
#endif
  r.split = sync == 1 && lanes > 1;
  r.joins = 0;
  r.releases = 0;
  r.async = sync == 2 && lanes > 1;
  r.signals = 0;
  r.as = nullptr;
}

/// The end of a launch: lane 0 counts the launch once every lane read the flag (runSetup):
/// after any lane barrier (each lane read it before its first op), else after one here;
/// split, after every other lane's exit arrival.
__device__ __forceinline__ void runFinish(Run& r, LaneState& st) {
  if (r.split) {
    __syncthreads();
    if (threadIdx.x == 0) laneExitThread0(r.laneWords, r.lane, r.lanes);
  } else if (r.lanes > 1 && !st.met && !r.async) {
    laneBarrier(r);
  }
  __syncthreads();
  if (r.async) asyncEnd(r);  // every lane counted itself in after reading the flag
  if (threadIdx.x == 0 && r.lane == 0) r.a.flags[blockIdx.x / r.lanes] = r.flag;
}

#if defined(MSCCLPP_EXECUTOR_JIT)
/// The start of a generated plan kernel (core/src/executor/run/jit.rs): its ops are constants of
/// the kernel, so nothing is copied into shared memory; the plan block's channel and buffer
/// tables are read where an op uses them, from args.blocks.
__device__ __forceinline__ uint32_t jitBegin(Run& r, const ExecArgs& args) {
  const uint32_t lanes = args.lanes > 0 ? args.lanes : 1;
  const uint32_t pb = blockIdx.x / lanes;
  runSetup(r, args, args.blocks + pb);
  if (r.async) {
    asyncBegin(r);
    __syncthreads();  // the expected counts in shared memory before the first op
    asyncStarted(r);
  }
  return pb;
}
#endif

}  // namespace

// The body of both entry points (executor.cu, executor_narrow.cu), `args` their parameter.
// Grid: args.nBlocks plan blocks x args.lanes GPU blocks each (lanes of a plan block are
// consecutive). Flags: one launch counter per plan block, then (count, generation) lane
// barrier words per plan block.
__device__ __forceinline__ void executorRun(const ExecArgs& args) {
  __shared__ ExecBlock blk;
  // Trace: thread 0 of each GPU block counts into its own words (ExecArgs.trace).
  __shared__ TraceMarks mark;
  if (traceWords(args)) {
    mark.c0 = traceCycles();
    mark.t0 = traceNs();
  }
  const uint32_t lanes = args.lanes > 0 ? args.lanes : 1;
  const uint32_t pb = blockIdx.x / lanes;
  const ExecBlock* src = args.blocks + pb;
  const uint32_t nOps = src->nOps;
  const uint32_t words = (uint32_t)((EXEC_BLOCK_HEADER_BYTES + nOps * sizeof(ExecOp)) / sizeof(uint4));
  // Up to 4 loads of each thread in flight before its stores: a one-lane launch of 128 threads
  // copies the 1.7 KiB header and 256 bytes per op in one round of load latency for up to 25
  // ops (one round per 2 KiB before).
  for (uint32_t i0 = threadIdx.x; i0 < words; i0 += 4 * blockDim.x) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint32_t i = i0 + u * blockDim.x;
      if (i < words) v[u] = reinterpret_cast<const uint4*>(src)[i];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint32_t i = i0 + u * blockDim.x;
      if (i < words) reinterpret_cast<uint4*>(&blk)[i] = v[u];
    }
  }
  Run r;
  runSetup(r, args, &blk);
  LaneState st;
  __syncthreads();
  if (r.async) {
    asyncBegin(r);  // from the block's tables in shared memory, copied above
    __syncthreads();
    asyncStarted(r);
  }
  if (uint64_t* tr = traceWords(args)) tr[3] += traceCycles() - mark.c0;
  for (uint32_t i = 0; i < nOps;) {
    const ExecOp& o = blk.ops[i];
    if (o.opType == EXEC_PIPELINE) {
      if (traceWords(args)) mark.pipe = traceCycles();
      const uint32_t nInner = (i + 1 + o.nInner <= nOps) ? o.nInner : nOps - i - 1;
      for (uint32_t itr = 0; itr < o.nIterations; ++itr) {
        const uint64_t off = (uint64_t)itr * o.unitSize;
        for (uint32_t k = 0; k < nInner; ++k) {
          if (traceWords(args)) mark.op = traceCycles();
          step(r, blk.ops[i + 1 + k], off, o.unitSize, st);
          if (uint64_t* tr = traceWords(args)) traceOp(tr, i + 1 + k, mark.op);
        }
      }
      if (uint64_t* tr = traceWords(args)) traceOp(tr, i, mark.pipe);
      i += 1 + nInner;
    } else {
      if (traceWords(args)) mark.op = traceCycles();
      step(r, o, 0, ~0ull, st);
      if (uint64_t* tr = traceWords(args)) traceOp(tr, i, mark.op);
      ++i;
    }
  }
  runFinish(r, st);
  if (uint64_t* tr = traceWords(args)) {
    const uint64_t t1 = traceNs(), t0 = mark.t0;
    if (tr[0] > 0 && t0 >= tr[6]) {
      const uint64_t gap = t0 - tr[6];
      if (gap < 1000000) {
        tr[4] += gap;
        tr[5] += 1;
      }
      if (tr[7] == 0 || gap + 1 < tr[7]) tr[7] = gap + 1;
    }
    tr[0] += 1;
    tr[1] += traceCycles() - mark.c0;
    tr[2] += t1 - t0;
    tr[6] = t1;
  }
}
