// GPU fault checks of libmscclpp_nccl (ranks started by core/nccl/tests/gpu/faults_gpu.sh, all
// on GPU 0). Environment: RANK, NRANKS, FAULTS_ID_FILE (rank 0 writes the unique id there),
// FAULTS_MODE:
//   kill   rank NRANKS-1 enqueues an all-reduce its peers wait in, then SIGKILLs itself; every
//          survivor polls its stream and ncclCommGetAsyncError (PyTorch's watchdog pattern) and
//          prints "SURVIVOR rank=R error_at_us=T code=C" when the error shows, then aborts. Its
//          kernels leave their waits on the death (the abort word), so a completed stream
//          without an error is the failure.
//   abort  rank 0 enqueues an all-reduce the other ranks never join; another thread calls
//          ncclCommAbort after 1 s; prints "ABORT rank=0 abort_at_us=A done_at_us=D" when the
//          stream finished (D=0: not within 10 s).
// The victim prints "VICTIM rank=R dies_at_us=T" just before its death. Times are wall-clock
// microseconds (CLOCK_REALTIME), comparable across the ranks of one machine.
#include <cuda_runtime.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

static long long now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (long long)t.tv_sec * 1000000LL + t.tv_nsec / 1000;
}

#define CHECK(call)                                                                          \
  do {                                                                                       \
    int rc_ = (int)(call);                                                                   \
    if (rc_ != 0) {                                                                          \
      fprintf(stderr, "rank %d: %s failed: %d (%s)\n", rank, #call, rc_, ncclGetLastError(NULL)); \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

static int rank;
static ncclComm_t comm;
static long long abort_at;

static void get_id(const char* file, ncclUniqueId* id) {
  if (rank == 0) {
    CHECK(ncclGetUniqueId(id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1) exit(3);
    fclose(f);
    if (rename(tmp, file) != 0) exit(3);
    return;
  }
  for (int i = 0; i < 3000; i++) {
    FILE* f = fopen(file, "rb");
    if (f) {
      size_t n = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (n == 1) return;
    }
    usleep(10000);
  }
  fprintf(stderr, "rank %d: no id in %s after 30 s\n", rank, file);
  exit(3);
}

static void* abort_later(void* arg) {
  (void)arg;
  sleep(1);
  abort_at = now_us();
  ncclResult_t r = ncclCommAbort(comm);
  fprintf(stderr, "rank %d: ncclCommAbort -> %d after %lld us\n", rank, (int)r, now_us() - abort_at);
  return NULL;
}

int main(void) {
  const char* mode = getenv("FAULTS_MODE");
  const char* file = getenv("FAULTS_ID_FILE");
  if (!mode || !file || !getenv("RANK") || !getenv("NRANKS")) {
    fprintf(stderr, "faults_gpu: set RANK, NRANKS, FAULTS_ID_FILE and FAULTS_MODE (kill|abort)\n");
    return 2;
  }
  rank = atoi(getenv("RANK"));
  int n = atoi(getenv("NRANKS"));
  CHECK(cudaSetDevice(0));
  ncclUniqueId id;
  get_id(file, &id);
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  size_t count = 1 << 24;  // 64 MiB of float: long enough to be in flight
  float* buf;
  CHECK(cudaMalloc((void**)&buf, count * sizeof(float)));
  CHECK(cudaMemset(buf, 0, count * sizeof(float)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (strcmp(mode, "kill") == 0) {
    for (int i = 0; i < 3; i++) CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s));
    CHECK(cudaStreamSynchronize(s));
    if (rank == n - 1) {
      CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s));
      usleep(2000);  // the kernel is running, its peers' too
      printf("VICTIM rank=%d dies_at_us=%lld\n", rank, now_us());
      fflush(stdout);
      kill(getpid(), SIGKILL);
    }
    // A few calls only: a spinning kernel fills the launch queue, and a full queue blocks the
    // launching call (this loop must get to its polling).
    for (int i = 0; i < 8; i++) {
      ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s);
      if (r != ncclSuccess) {  // the library already knows a peer failed
        printf("SURVIVOR rank=%d error_at_us=%lld code=%d %s\n", rank, now_us(), (int)r, ncclGetLastError(comm));
        fflush(stdout);
        ncclCommAbort(comm);
        _exit(0);
      }
    }
    // The kernels waiting for the dead rank end their waits (the abort word), so the stream
    // completes too: the error is what ncclCommGetAsyncError reports, checked also after the
    // stream completed (as PyTorch's work completion checks it).
    long long start = now_us();
    while (now_us() - start < 30000000LL) {
      int completed = cudaStreamQuery(s) == cudaSuccess;
      ncclResult_t async;
      if (completed && !(ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess)) {
        printf("SURVIVOR rank=%d error_at_us=0 code=0 (all-reduces completed, no error reported)\n", rank);
        return 1;
      }
      if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess) {
        printf("SURVIVOR rank=%d error_at_us=%lld code=%d %s\n", rank, now_us(), (int)async, ncclGetLastError(comm));
        fflush(stdout);
        ncclCommAbort(comm);
        _exit(0);  // the stream may still hold a kernel spinning on the dead peer
      }
      usleep(1000);
    }
    printf("SURVIVOR rank=%d error_at_us=0 code=0 (no error within 30 s)\n", rank);
    return 1;
  }
  if (strcmp(mode, "abort") == 0) {
    if (rank != 0) {
      sleep(6);  // never joins; stays alive so rank 0 sees no dead peer
      _exit(0);
    }
    CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s));
    pthread_t t;
    pthread_create(&t, NULL, abort_later, NULL);
    long long done = 0, start = now_us();
    while (now_us() - start < 10000000LL) {
      cudaError_t q = cudaStreamQuery(s);
      if (q != cudaErrorNotReady) {
        done = now_us();
        break;
      }
      usleep(1000);
    }
    pthread_join(t, NULL);
    printf("ABORT rank=0 abort_at_us=%lld done_at_us=%lld\n", abort_at, done);
    fflush(stdout);
    _exit(0);
  }
  fprintf(stderr, "FAULTS_MODE=%s: expected kill or abort\n", mode);
  return 2;
}
