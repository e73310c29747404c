// libmscclpp_nccl across 2 emulated nodes on one GPU, without PyTorch: the same calls PyTorch
// makes, from a plain CUDA program, to tell the library's multi-node path apart from what
// PyTorch adds. Built and run on the GPU machine by `bash .ci/gpu-check nccl-multinode`:
//   nvcc -o nccl_multinode nccl_multinode.cu -lnccl   (LD_PRELOAD of our .so at run time)
// Run as 4 processes, RANK=0..3, NCCL_TEST_ID_FILE=<path>; ranks 0-1 and 2-3 get different
// MSCCLPP_HOSTIDs before the communicator exists. Per mode and size: an all-reduce (sum of
// rank-dependent float32) on a non-blocking stream, waited for by polling (30 s at most), then
// checked; mode "legacy" then makes the legacy default stream wait for the call and reads the
// result with a synchronous cudaMemcpy on it, as PyTorch's default stream does.
// NCCL_MN_MODES (default "stream,legacy") and NCCL_MN_COUNTS (default "1,1000,4099,1048576")
// choose the modes and sizes, in order; NCCL_MN_STREAM=legacy launches on the legacy default
// stream itself (as PyTorch 2.11 does for synchronous collectives) instead of a non-blocking one.
// NCCL_MN_WORLD / NCCL_MN_NODES change the world (default 4 ranks on 2 emulated nodes; 2 and 1:
// two ranks on one node, as `gpu-check plans` runs it) and NCCL_MN_ALLOC=memalloc takes the
// buffer from ncclMemAlloc instead of cudaMalloc.
// Prints "NCCL_MN rank=<r> mode=<m> n=<count> ok=<0|1> ms=<t>" per call, "NCCL_MN rank=<r>
// done ok=<0|1>" last; exits 1 on any failure or timeout.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank_ = 0;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

#define CK(call)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      printf("NCCL_MN rank=%d FAIL %s: %s\n", rank_, #call, cudaGetErrorString(e_));             \
      fflush(stdout);                                                                            \
      _exit(1);                                                                                  \
    }                                                                                            \
  } while (0)
#define NK(call)                                                                                 \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    if (r_ != ncclSuccess) {                                                                     \
      printf("NCCL_MN rank=%d FAIL %s: %s: %s\n", rank_, #call, ncclGetErrorString(r_),          \
             ncclGetLastError(NULL));                                                            \
      fflush(stdout);                                                                            \
      _exit(1);                                                                                  \
    }                                                                                            \
  } while (0)

// Rank 0 writes the id to `path` (through a rename); the others wait up to 60 s for it.
static void exchange_id(ncclUniqueId* id, const char* path) {
  if (rank_ == 0) {
    NK(ncclGetUniqueId(id));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      printf("NCCL_MN rank=0 FAIL writing the id to %s\n", path);
      _exit(1);
    }
    return;
  }
  for (double t0 = now_ms(); now_ms() - t0 < 60e3; usleep(10000)) {
    FILE* f = fopen(path, "rb");
    if (!f) continue;
    size_t got = fread(id, sizeof *id, 1, f);
    fclose(f);
    if (got == 1) return;
  }
  printf("NCCL_MN rank=%d FAIL no id at %s after 60 s\n", rank_, path);
  _exit(1);
}

// Polls `s` for 30 s at most; 0 when done.
static int wait_stream(cudaStream_t s) {
  for (double t0 = now_ms(); now_ms() - t0 < 30e3;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady) {
      printf("NCCL_MN rank=%d FAIL stream: %s\n", rank_, cudaGetErrorString(e));
      return 1;
    }
    usleep(100);
  }
  printf("NCCL_MN rank=%d FAIL the all-reduce did not finish in 30 s\n", rank_);
  return 1;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* r = getenv("RANK");
  const char* idf = getenv("NCCL_TEST_ID_FILE");
  if (!r || !idf) {
    printf("NCCL_MN FAIL: expected RANK and NCCL_TEST_ID_FILE\n");
    return 1;
  }
  rank_ = atoi(r);
  // NCCL_MN_WORLD ranks (default 4) on NCCL_MN_NODES emulated nodes (default 2; 1: one node,
  // MSCCLPP_HOSTID left alone).
  const char* ws = getenv("NCCL_MN_WORLD");
  const char* ns = getenv("NCCL_MN_NODES");
  const int world = ws ? atoi(ws) : 4;
  const int nodes = ns ? atoi(ns) : 2;
  if (world < 1 || nodes < 1 || world % nodes != 0) {
    printf("NCCL_MN rank=%d FAIL NCCL_MN_WORLD=%d NCCL_MN_NODES=%d: expected nodes dividing world\n", rank_, world,
           nodes);
    return 1;
  }
  if (nodes > 1) {
    char host[64];
    snprintf(host, sizeof host, "nccl-mn-node-%d", rank_ / (world / nodes));
    setenv("MSCCLPP_HOSTID", host, 1);
  }
  CK(cudaSetDevice(0));
  ncclUniqueId id;
  exchange_id(&id, idf);
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, world, id, rank_));
  cudaStream_t s = 0;
  const char* which = getenv("NCCL_MN_STREAM");
  if (!which || strcmp(which, "legacy") != 0) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  size_t counts[16];
  int ncounts = 0;
  const char* cs = getenv("NCCL_MN_COUNTS");
  char cbuf[256];
  snprintf(cbuf, sizeof cbuf, "%s", cs ? cs : "1,1000,4099,1048576");
  for (char* t = strtok(cbuf, ","); t && ncounts < 16; t = strtok(NULL, ",")) counts[ncounts++] = strtoull(t, NULL, 10);
  size_t max = 1;
  for (int c = 0; c < ncounts; c++) max = counts[c] > max ? counts[c] : max;
  float *buf, *host_in = (float*)malloc(max * 4), *host_out = (float*)malloc(max * 4);
  // NCCL_MN_ALLOC=memalloc: the buffer comes from ncclMemAlloc (memory the library allocated,
  // which execution plans need); default cudaMalloc.
  const char* alloc = getenv("NCCL_MN_ALLOC");
  const int memalloc = alloc && strcmp(alloc, "memalloc") == 0;
  if (memalloc) {
    NK(ncclMemAlloc((void**)&buf, max * 4));
  } else {
    CK(cudaMalloc(&buf, max * 4));
  }
  int all_ok = 1;
  int modes[8], nmodes = 0;  // 0 stream, 1 legacy
  const char* names[] = {"stream", "legacy"};
  const char* ms_env = getenv("NCCL_MN_MODES");
  char mbuf[128];
  snprintf(mbuf, sizeof mbuf, "%s", ms_env ? ms_env : "stream,legacy");
  for (char* t = strtok(mbuf, ","); t && nmodes < 8; t = strtok(NULL, ",")) modes[nmodes++] = strcmp(t, "legacy") == 0;
  for (int mi = 0; mi < nmodes; mi++) {
    const int m = modes[mi];
    for (int c = 0; c < ncounts; c++) {
      const size_t n = counts[c];
      for (size_t i = 0; i < n; i++) host_in[i] = (float)(i % 17 + rank_);
      CK(cudaMemcpy(buf, host_in, n * 4, cudaMemcpyHostToDevice));
      double t0 = now_ms();
      NK(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, s));
      if (m == 0) {
        if (wait_stream(s)) _exit(1);
        CK(cudaMemcpy(host_out, buf, n * 4, cudaMemcpyDeviceToHost));
      } else {
        cudaEvent_t e;
        CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        CK(cudaEventRecord(e, s));
        CK(cudaStreamWaitEvent(0, e, 0));
        CK(cudaMemcpy(host_out, buf, n * 4, cudaMemcpyDeviceToHost));
        CK(cudaEventDestroy(e));
      }
      double ms = now_ms() - t0;
      int ok = 1;
      for (size_t i = 0; i < n && ok; i++) {
        float want = (float)((i % 17) * world + world * (world - 1) / 2);
        if (host_out[i] != want) {
          printf("NCCL_MN rank=%d mode=%s n=%zu: element %zu is %g, expected %g\n", rank_, names[m], n, i,
                 host_out[i], want);
          ok = 0;
        }
      }
      printf("NCCL_MN rank=%d mode=%s n=%zu ok=%d ms=%.3f\n", rank_, names[m], n, ok, ms);
      all_ok &= ok;
    }
  }
  if (memalloc) NK(ncclMemFree(buf));
  NK(ncclCommDestroy(comm));
  printf("NCCL_MN rank=%d done ok=%d\n", rank_, all_ok);
  return all_ok ? 0 : 1;
}
