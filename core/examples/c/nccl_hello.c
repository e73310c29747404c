/* A C program against libmscclpp_nccl through NCCL's API: one rank, an all-reduce of 1024
 * floats on the host backend (its buffers are host memory), checked, then the communicator
 * destroyed. Build it against an installed library (scripts/install.sh):
 *   cc core/examples/c/nccl_hello.c $(pkg-config --cflags --libs mscclpp_nccl) -o nccl_hello
 *   ./nccl_hello
 * (with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig when PREFIX is not a system one). */
#include <nccl.h>
#include <stdio.h>

#define N 1024

int main(void) {
  int version = 0;
  ncclUniqueId id;
  ncclComm_t comm;
  float *buf = NULL;
  ncclResult_t r;
  if ((r = ncclGetVersion(&version)) != ncclSuccess || (r = ncclGetUniqueId(&id)) != ncclSuccess ||
      (r = ncclCommInitRank(&comm, 1, id, 0)) != ncclSuccess) {
    fprintf(stderr, "nccl_hello: init failed: %s (%s)\n", ncclGetErrorString(r), ncclGetLastError(NULL));
    return 1;
  }
  if ((r = ncclMemAlloc((void **)&buf, N * sizeof(float))) != ncclSuccess) {
    fprintf(stderr, "nccl_hello: ncclMemAlloc: %s (%s)\n", ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  for (int i = 0; i < N; i++) buf[i] = (float)i;
  /* World size 1: the sum is the input itself. */
  if ((r = ncclAllReduce(buf, buf, N, ncclFloat, ncclSum, comm, NULL)) != ncclSuccess) {
    fprintf(stderr, "nccl_hello: ncclAllReduce: %s (%s)\n", ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  for (int i = 0; i < N; i++) {
    if (buf[i] != (float)i) {
      fprintf(stderr, "nccl_hello: element %d is %g, expected %d\n", i, buf[i], i);
      return 1;
    }
  }
  ncclMemFree(buf);
  ncclCommDestroy(comm);
  printf("nccl_hello: NCCL API version %d, all-reduce of %d floats on 1 rank: ok\n", version, N);
  return 0;
}
