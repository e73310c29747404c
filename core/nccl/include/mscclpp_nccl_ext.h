/*
 * mscclpp_nccl_ext.h: what libmscclpp_nccl.so (mscclpp-rs) offers beyond NCCL's ABI.
 *
 * Algorithms of one's own: mscclppNcclRegisterAlgorithm adds a collective algorithm (a
 * selector callback that takes calls and a launch callback that runs them, typically by
 * launching one's own kernel) to every communicator the library creates afterwards. It joins
 * the communicator's algorithm collection next to the library's native algorithms (Rust:
 * `mscclpp::collectives::register_global`), so ncclAllReduce & co. run it for the calls its
 * selector takes. core/examples/10-own-algorithm.rs uses it through dlopen.
 *
 * Written for mscclpp-rs (MIT license). Include it after (or instead of) the library's nccl.h;
 * it includes nccl.h itself. core/nccl/tests/ext_algorithm.rs checks this header's layouts.
 */
#ifndef MSCCLPP_NCCL_EXT_H_
#define MSCCLPP_NCCL_EXT_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of mscclppNcclAlgorithm (and of the structs its callbacks get) this header
 * describes; the library refuses any other. */
#define MSCCLPP_NCCL_ALGORITHM_VERSION 1

/* The collective an algorithm implements. All four are accepted. ncclReduce runs as an
 * all-reduce (its non-root ranks write a scratch buffer), ncclBcast as an in-place broadcast. */
typedef enum {
  mscclppNcclAllReduce = 0,     /* ncclAllReduce, ncclReduce */
  mscclppNcclAllGather = 1,     /* ncclAllGather */
  mscclppNcclReduceScatter = 2, /* ncclReduceScatter */
  mscclppNcclBroadcast = 3      /* ncclBroadcast, ncclBcast */
} mscclppNcclCollective_t;

/* One call, as the callbacks see it (valid during the callback only). */
typedef struct {
  mscclppNcclCollective_t collective;
  ncclDataType_t datatype;
  /* A built-in operator (ncclSum..ncclAvg); ncclSum for all-gather and broadcast. */
  ncclRedOp_t op;
  /* Broadcast's root (0 otherwise). */
  int root;
  /* World size of the communicator. */
  int nranks;
  /* Elements: all-reduce and broadcast: of the whole buffer; all-gather: sent per rank;
   * reduce-scatter: received per rank. Never 0 (a count of 0 runs nothing). */
  size_t count;
  /* count * the size of datatype. */
  size_t bytes;
  /* Device addresses (host addresses on the host backend). */
  const void* sendbuff;
  void* recvbuff;
} mscclppNcclCallInfo;

struct mscclppNcclContext;

/* The host backend's synchronisation on the communicator's semaphores (what
 * `mscclpp::collectives::algorithm::host_barrier/host_signal/host_wait` do): `block` in
 * [0, maxSemBlocks), `peer` a rank other than this one. They return ncclSuccess, or an error
 * (a peer that did not signal in time) whose message ncclGetLastError gives; return it from
 * launch. */
typedef ncclResult_t (*mscclppNcclHostBarrierFn)(const struct mscclppNcclContext* ctx, int block);
typedef ncclResult_t (*mscclppNcclHostSyncFn)(const struct mscclppNcclContext* ctx, int block,
                                              int peer);

/* What launch gets to run a call on this communicator: the resources every algorithm of the
 * communicator shares (the native algorithms' kernels get the same in their arguments). Valid
 * during the callback only; the addresses stay valid as long as the communicator. */
typedef struct mscclppNcclContext {
  int rank;
  int nranks;
  /* The communicator's GPU (CUDA device ordinal); -1 on the host backend. */
  int device;
  /* 1 on the host backend (no GPU: stream is NULL, the addresses are host addresses, and
   * launch must run the whole call on the calling thread before it returns), else 0. */
  int hostBackend;
  /* uint64_t[nranks]: every rank's shared buffer as mapped in this process (device memory;
   * the shared buffer's layout is the same on every rank). */
  const uint64_t* peerBases;
  /* mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle[maxSemBlocks][nranks] (device
   * memory): entry (b, p) is block b's semaphore with peer p (signal() then wait() with every
   * peer is a barrier of block b; entry (b, rank) is unused). */
  void* semaphores;
  /* uint32_t[nflags]: the LL packet flags the native LL algorithms share (see
   * core/src/collectives/README.md before touching them). */
  uint32_t* flags;
  uint32_t nflags;
  /* The first dimension of the semaphore table (64). */
  uint32_t maxSemBlocks;
  /* The most blocks a kernel whose blocks wait for their peers' may launch (all resident). */
  uint32_t maxWaitingBlocks;
  uint32_t reserved;
  /* Offsets (from peerBases[r]) and sizes in bytes of the LL packet scratch (two halves of
   * llHalfBytes) and of the plain scratch, in every rank's shared buffer. */
  uint64_t llOffset;
  uint64_t llHalfBytes;
  uint64_t plainOffset;
  uint64_t plainBytes;
  /* Host backend only (NULL on GPU builds): synchronise block `block` with the same block of
   * every peer / signal peer `peer` / wait for the next signal of peer `peer`. */
  mscclppNcclHostBarrierFn hostBarrier;
  mscclppNcclHostSyncFn hostSignal;
  mscclppNcclHostSyncFn hostWait;
  /* The library's own; do not touch. */
  const void* internal;
} mscclppNcclContext;

/* An algorithm to register. Start from MSCCLPP_NCCL_ALGORITHM_INITIALIZER. */
typedef struct {
  /* sizeof(mscclppNcclAlgorithm) and MSCCLPP_NCCL_ALGORITHM_VERSION. */
  size_t size;
  int version;
  mscclppNcclCollective_t collective;
  /* Unique per collective, not the name of a native algorithm; non-empty UTF-8, at most 255
   * bytes. Copied. It names the algorithm in INFO lines (MSCCLPP_LOG_LEVEL=INFO
   * MSCCLPP_LOG_SUBSYS=COLL) and in MSCCLPP_<KIND>_ALGO. */
  const char* name;
  /* Passed to both callbacks unchanged. */
  void* user;
  /* The selector: non-zero to take `call`, 0 to leave it to the next registered algorithm
   * and then to the library's own choice. Must decide alike on every rank (from the
   * collective, sizes, datatype, op, world size; never from the rank or the addresses), must
   * be quick and may be called more than once per call (also as the check of a forced
   * choice). Required. */
  int (*select)(const mscclppNcclCallInfo* call, void* user);
  /* Runs `call`: on GPUs enqueue the work on `stream` (do not synchronise or allocate: the
   * call may be captured into a CUDA graph); on the host backend (ctx->hostBackend) do all of
   * it before returning. ncclSuccess, or an error the collective returns (ncclInvalidArgument
   * and ncclInvalidUsage as ncclInvalidUsage, any other as ncclInternalError). Every rank must
   * take part in every call its selector took. Required. */
  ncclResult_t (*launch)(const mscclppNcclCallInfo* call, const mscclppNcclContext* ctx,
                         cudaStream_t stream, void* user);
} mscclppNcclAlgorithm;

#define MSCCLPP_NCCL_ALGORITHM_INITIALIZER \
  { sizeof(mscclppNcclAlgorithm), MSCCLPP_NCCL_ALGORITHM_VERSION, mscclppNcclAllReduce, NULL, NULL, NULL, NULL }

/* Registers `desc` for every communicator created afterwards in this process (communicators
 * created after registration get it; earlier ones do not). Call it on every rank with the
 * same algorithms in the same order, before ncclCommInitRank & co. Registered algorithms are
 * asked in registration order; the first whose select takes a call runs it (unless
 * MSCCLPP_<KIND>_ALGO forces another). The callbacks may run on several threads at once (one
 * per communicator) and must stay callable, with `user`, for the life of the process.
 * Returns ncclInvalidArgument (message in ncclGetLastError) for a NULL desc, a wrong size or
 * version, an unknown collective, a NULL, empty, too long, non-UTF-8, native or already
 * registered name, or a NULL callback. */
ncclResult_t mscclppNcclRegisterAlgorithm(const mscclppNcclAlgorithm* desc);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MSCCLPP_NCCL_EXT_H_ */
