/* A stand-in "real NCCL" for the fallback test: a shared library with the few nccl.h
 * functions libmscclpp_nccl's fallback loads. It communicates nothing: its all-reduce writes a
 * signature telling the test which id its communicator was made from and whether the call
 * came inside one of its groups. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

struct ncclComm {
  char magic[8];
  int nranks, rank;
  unsigned char nonce;
};

static int g_depth = 0, g_next_op = ncclNumOps;

ncclResult_t ncclGetVersion(int* v) { *v = 22803; return ncclSuccess; }
const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "fake: ok" : "fake: error"; }
const char* ncclGetLastError(ncclComm_t c) { (void)c; return "fake NCCL"; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof *id);
  memcpy(id->internal, "FAKENCCL", 8);
  id->internal[8] = (char)(((unsigned)getpid() ^ (unsigned)time(NULL)) % 97 + 1);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (memcmp(id.internal, "FAKENCCL", 8) != 0) return ncclInvalidArgument;
  struct ncclComm* c = calloc(1, sizeof *c);
  memcpy(c->magic, "FAKECOMM", 8);
  c->nranks = nranks;
  c->rank = rank;
  c->nonce = (unsigned char)id.internal[8];
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* cfg) {
  if (cfg && (cfg->magic != 0xcafebeef || cfg->blocking != 1)) return ncclInvalidArgument;
  return ncclCommInitRank(comm, nranks, id, rank);
}

static int is_fake(ncclComm_t c) { return c && memcmp(c->magic, "FAKECOMM", 8) == 0; }

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!is_fake(c)) return ncclInvalidArgument;
  memset(c->magic, 0, 8);
  free(c);
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) { return ncclCommDestroy(c); }
ncclResult_t ncclCommFinalize(ncclComm_t c) { return is_fake(c) ? ncclSuccess : ncclInvalidArgument; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) {
  *e = ncclSuccess;
  return is_fake(c) ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t ncclGroupStart(void) { g_depth++; return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) {
  if (g_depth == 0) return ncclInvalidUsage;
  g_depth--;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
  (void)s;
  (void)st;
  if (!is_fake(c) || t != ncclFloat) return ncclInvalidArgument;
  float sig = g_depth > 0 ? 1000.0f + (float)c->nonce + ((int)op >= ncclNumOps ? 100.0f : 0.0f) : -1.0f;
  for (size_t i = 0; i < n; i++) ((float*)r)[i] = sig;
  return ncclSuccess;
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t t, ncclScalarResidence_t res,
                                      ncclComm_t c) {
  (void)scalar;
  (void)t;
  (void)res;
  if (!is_fake(c)) return ncclInvalidArgument;
  *op = (ncclRedOp_t)g_next_op++;
  return ncclSuccess;
}
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t c) {
  return is_fake(c) && (int)op >= ncclNumOps ? ncclSuccess : ncclInvalidArgument;
}
