/* C test of libmscclpp_nccl through the shipped nccl.h, one process per rank (mpirun; no MPI
 * headers: ranks from the launcher's environment, the unique id through a file).
 *
 * NCCL_TEST_MODE selects what runs:
 *   api       (default) init, every collective with checked results, group send/recv, bad
 *             arguments, split/shrink/non-blocking init, memory and registration, destroy;
 *   deadpeer  the last rank exits without destroying its communicator; the others must see
 *             ncclRemoteError from ncclCommGetAsyncError, a recv from it and an all-reduce
 *             (fast, not at a timeout), and abort fast;
 *   p2p       init and the point-to-point and group checks only (check_p2p, p2p_checks.h);
 *   fallback  with MSCCLPP_NCCL_LIB_PATH naming the fake NCCL (fake_nccl.c) and
 *             MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION=allreduce: all-reduce and custom operators
 *             reach it (inside its group, with the id rank 0 made), the rest stays native.
 * Emulated nodes: the launcher gives the ranks of each node their own MSCCLPP_HOSTID (c_api.rs
 * runs every rank through `sh -c 'MSCCLPP_HOSTID=multinode-$((rank / k)) exec prog'`).
 * Each rank prints "rank R: N passed, N failed, N skipped" and exits 1 on a failure. */
/* memfd_create: the build defines _GNU_SOURCE (tests/common). */
#include <sys/mman.h>

#include "p2p_checks.h"

static ncclComm_t init_comm(const char* suffix) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  if (exchange_id(&id, suffix) != 0) {
    CHECK(0, "unique id exchange failed");
    return NULL;
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  NCCLOK(ncclCommInitRankConfig(&c, g_nranks, id, g_rank, &cfg));
  return c;
}

static void check_bad_arguments(ncclComm_t c) {
  float buf[8] = {0};
  int v = 0;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclComm_t out = NULL;
  long not_a_comm[64] = {0};
  ncclComm_t foreign = (ncclComm_t)(void*)not_a_comm;
  EXPECT_ERR(ncclInvalidArgument, "comm is NULL", ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, NULL, NULL));
  EXPECT_ERR(ncclInvalidArgument, "not a communicator of libmscclpp_nccl",
             ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, foreign, NULL));
  EXPECT_ERR(ncclInvalidArgument, "ncclAllReduce", ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, foreign, NULL));
  EXPECT_ERR(ncclInvalidArgument, "datatype 99", ncclAllReduce(buf, buf, 8, (ncclDataType_t)99, ncclSum, c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "reduction operator 77", ncclAllReduce(buf, buf, 8, ncclFloat, (ncclRedOp_t)77, c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "overflows", ncclAllReduce(buf, buf, (size_t)-1 / 2, ncclFloat, ncclSum, c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "overflows", ncclAllGather(buf, buf, (size_t)-1 / 16, ncclDouble, c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "sendbuff is NULL", ncclAllReduce(NULL, buf, 8, ncclFloat, ncclSum, c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "recvbuff is NULL", ncclAllGather(buf, NULL, 1, ncclFloat, c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "root", ncclBroadcast(buf, buf, 8, ncclFloat, g_nranks, c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "root", ncclReduce(buf, buf, 8, ncclFloat, ncclSum, -1, c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "peer", ncclSend(buf, 8, ncclFloat, g_nranks, c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "peer", ncclRecv(buf, 8, ncclFloat, -3, c, NULL));
  EXPECT_ERR(ncclInvalidUsage, "without a matching ncclGroupStart", ncclGroupEnd());
  EXPECT_ERR(ncclInvalidArgument, "built in", ncclRedOpDestroy(ncclSum, c));
  EXPECT_ERR(ncclInvalidArgument, "count", ncclCommCount(c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "comm is NULL", ncclCommUserRank(NULL, &v));
  EXPECT_ERR(ncclInvalidArgument, "uniqueId", ncclGetUniqueId(NULL));
  EXPECT_ERR(ncclInvalidArgument, "comm (the output pointer) is NULL", ncclCommInitRank(NULL, 2, id, 0));
  EXPECT_ERR(ncclInvalidArgument, "nranks 0", ncclCommInitRank(&out, 0, id, 0));
  EXPECT_ERR(ncclInvalidArgument, "rank 5", ncclCommInitRank(&out, 2, id, 5));
  EXPECT_ERR(ncclInvalidArgument, "commId", ncclCommInitRank(&out, 2, id, 0));
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0x1234;
  EXPECT_ERR(ncclInvalidArgument, "magic", ncclCommInitRankConfig(&out, 2, id, 0, &bad));
  EXPECT_ERR(ncclInvalidArgument, "ncclMemAlloc", ncclMemFree(buf));
  /* An error inside a group fails the group's end too (and nothing of it is issued). */
  NCCLOK(ncclGroupStart());
  EXPECT_ERR(ncclInvalidArgument, "datatype", ncclAllReduce(buf, buf, 8, (ncclDataType_t)-1, ncclSum, c, NULL));
  EXPECT_ERR(ncclInvalidArgument, "earlier call in this group failed", ncclGroupEnd());
  CHECK(out == NULL, "a failed init wrote a communicator");
  /* Custom operators need the fallback NCCL (none is loaded in this mode). */
  float scalar = 2.0f;
  ncclRedOp_t op;
  EXPECT_ERR(ncclInvalidUsage, "no fallback NCCL", ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, c));
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclGroupSimulateEnd(&sim));
  CHECK(sim.estimatedTime >= 0.0f, "simulated time %f", sim.estimatedTime);
}

static void check_queries(ncclComm_t c) {
  int v = -1, count = -1, rank = -1, dev = -1;
  NCCLOK(ncclGetVersion(&v));
  CHECK(v == NCCL_VERSION_CODE && v == 22803, "ncclGetVersion %d", v);
  NCCLOK(ncclCommCount(c, &count));
  NCCLOK(ncclCommUserRank(c, &rank));
  NCCLOK(ncclCommCuDevice(c, &dev));
  CHECK(count == g_nranks && rank == g_rank && dev == 0, "count %d rank %d device %d", count, rank, dev);
  ncclResult_t ae = ncclInternalError;
  NCCLOK(ncclCommGetAsyncError(c, &ae));
  CHECK(ae == ncclSuccess, "async error %d on a healthy communicator", (int)ae);
  CHECK(strlen(ncclGetErrorString(ncclRemoteError)) > 0, "empty error string");
}

static void check_collectives(ncclComm_t c) {
  const ncclDataType_t types[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64,
                                  ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
  const size_t sizes[] = {1, 7, 1000, 5000};
  int last = g_nranks - 1;
  for (unsigned t = 0; t < sizeof types / sizeof *types; t++)
    for (unsigned s = 0; s < sizeof sizes / sizeof *sizes; s++)
      for (int ip = 0; ip < 2; ip++) {
        check_allreduce(c, types[t], ncclSum, sizes[s], ip);
        check_allgather(c, types[t], sizes[s], ip);
        check_reducescatter(c, types[t], ncclSum, sizes[s], ip);
        check_broadcast(c, types[t], sizes[s], ip ? last : 0, ip, 0);
      }
  const ncclRedOp_t ops[] = {ncclProd, ncclMax, ncclMin, ncclAvg};
  const ncclDataType_t op_types[] = {ncclInt32, ncclFloat32, ncclFloat16, ncclFloat64};
  for (unsigned o = 0; o < 4; o++)
    for (unsigned t = 0; t < 4; t++) {
      if (ops[o] == ncclAvg && op_types[t] != ncclFloat32 && op_types[t] != ncclFloat64) continue;
      check_allreduce(c, op_types[t], ops[o], 1000, 0);
      check_reducescatter(c, op_types[t], ops[o], 300, 1);
    }
  check_allreduce(c, ncclFloat32, ncclSum, 300000, 0); /* 1.2 MB: needs a large-message algorithm */
  check_allgather(c, ncclFloat32, 100000, 0);
  for (int root = 0; root < g_nranks; root += (last > 0 ? last : 1)) {
    check_reduce(c, ncclFloat32, ncclSum, 1000, root, 0, 0);
    check_reduce(c, ncclInt32, ncclMax, 333, root, 1, 0);
    check_reduce(c, ncclFloat32, ncclSum, 77, root, 0, 1);
    check_broadcast(c, ncclFloat32, 1000, root, 1, 1);
    check_alltoall_gather_scatter(c, ncclFloat32, 513, root);
    check_alltoall_gather_scatter(c, ncclInt8, 1, root);
    check_alltoall_gather_scatter(c, ncclUint8, MIB_PLUS_3, root);
  }
  check_allreduce(c, ncclFloat32, ncclSum, 0, 0);
  /* Collectives and point-to-point inside one group. */
  float a[64], b[64], d[64 * 8], e[64 * 8];
  for (int i = 0; i < 64; i++) a[i] = b[i] = (float)in_val(g_rank, (size_t)i);
  for (int i = 0; i < 8 * g_nranks; i++) d[i] = (float)(g_rank * 100 + i);
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclAllReduce(a, a, 64, ncclFloat, ncclSum, c, NULL));
  NCCLOK(ncclAlltoAll(d, e, 8, ncclFloat, c, NULL));
  NCCLOK(ncclAllReduce(b, b, 64, ncclFloat, ncclMax, c, NULL));
  NCCLOK(ncclGroupEnd());
  int ok = 1;
  for (int i = 0; i < 64 && ok; i++)
    ok = a[i] == (float)expect_reduced(ncclSum, (size_t)i) && b[i] == (float)expect_reduced(ncclMax, (size_t)i);
  for (int r = 0; r < g_nranks && ok; r++)
    for (int i = 0; i < 8 && ok; i++) ok = e[r * 8 + i] == (float)(r * 100 + g_rank * 8 + i);
  CHECK(ok, "grouped allreduce + alltoall + allreduce: wrong data");
}

static void check_p2p(ncclComm_t c) {
  check_group_sendrecv(c, 13, 0);
  check_group_sendrecv(c, 13, 1);
  check_group_sendrecv(c, 700000, 1); /* 2.8 MB per pair: several chunks */
  check_blocking_pairs(c, 5);
  check_blocking_pairs(c, 400000); /* 3.2 MB: more than the slots in flight */
  float x = 1.0f, y = 0.0f;       /* zero-count operations are no-ops */
  NCCLOK(ncclSend(&x, 0, ncclFloat, (g_rank + 1) % g_nranks, c, NULL));
  NCCLOK(ncclRecv(&y, 0, ncclFloat, (g_rank + 1) % g_nranks, c, NULL));
  check_p2p_patterns(c);
}

static void check_memory(ncclComm_t c) {
  void* p = NULL;
  NCCLOK(ncclMemAlloc(&p, 4096));
  CHECK(p != NULL, "ncclMemAlloc returned NULL");
  if (p) {
    float* f = p;
    for (int i = 0; i < 1024; i++) f[i] = (float)in_val(g_rank, (size_t)i);
    void* h = NULL;
    NCCLOK(ncclCommRegister(c, p, 4096, &h));
    if (ran(ncclAllReduce(f, f, 1024, ncclFloat, ncclSum, c, NULL), "allreduce", "allreduce on ncclMemAlloc memory")) {
      int ok = 1;
      for (int i = 0; i < 1024 && ok; i++) ok = f[i] == (float)expect_reduced(ncclSum, (size_t)i);
      CHECK(ok, "allreduce on ncclMemAlloc memory: wrong data");
    }
    NCCLOK(ncclCommDeregister(c, h));
    EXPECT_ERR(ncclInvalidArgument, "not deregistered", ncclCommDeregister(c, h));
    ncclWindow_t w = NULL;
    NCCLOK(ncclCommWindowRegister(c, p, 4096, &w, NCCL_WIN_COLL_SYMMETRIC));
    NCCLOK(ncclCommWindowDeregister(c, w));
    NCCLOK(ncclMemFree(p));
    EXPECT_ERR(ncclInvalidArgument, "not freed", ncclMemFree(p));
  }
}

/* A memfd of `bytes` mapped shared (at `at` when not NULL: MAP_FIXED over the caller's
 * mapping), as an application maps memory a peer can reach; *fd keeps the file open. */
static float* map_app_memory(size_t bytes, void* at, int* fd) {
  *fd = memfd_create("nccl-api-test", MFD_CLOEXEC);
  if (*fd < 0 || ftruncate(*fd, (off_t)bytes) != 0) return NULL;
  void* p = mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0), *fd, 0);
  return p == MAP_FAILED ? NULL : (float*)p;
}

/* An in-place sum all-reduce of n floats at f registered with ncclCommRegister (large enough
 * for the zero-copy algorithm); 1 when every element is right. */
static int registered_allreduce(ncclComm_t c, float* f, size_t n, const char* what) {
  for (size_t i = 0; i < n; i++) f[i] = (float)in_val(g_rank, i);
  void* h = NULL;
  NCCLOK(ncclCommRegister(c, f, n * sizeof(float), &h));
  int ok = 0;
  if (ran(ncclAllReduce(f, f, n, ncclFloat, ncclSum, c, NULL), "allreduce", what)) {
    ok = 1;
    for (size_t i = 0; i < n && ok; i++) ok = f[i] == (float)expect_reduced(ncclSum, i);
    CHECK(ok, "%s: wrong data", what);
  }
  NCCLOK(ncclCommDeregister(c, h));
  return ok;
}

/* Registered buffers (issue 28): ncclMemAlloc memory out of place, the application's own
 * shared mapping, and new memory the application maps at the same address after freeing it. */
static void check_registered(ncclComm_t c) {
  size_t n = (size_t)1 << 19; /* 2 MiB: above the zero-copy threshold */
  float *s = NULL, *r = NULL;
  NCCLOK(ncclMemAlloc((void**)&s, n * sizeof(float)));
  NCCLOK(ncclMemAlloc((void**)&r, n * sizeof(float)));
  if (s && r) {
    for (size_t i = 0; i < n; i++) s[i] = (float)in_val(g_rank, i);
    void *hs = NULL, *hr = NULL;
    NCCLOK(ncclCommRegister(c, s, n * sizeof(float), &hs));
    NCCLOK(ncclCommRegister(c, r, n * sizeof(float), &hr));
    for (int round = 0; round < 2; round++) {
      if (ran(ncclAllReduce(s, r, n, ncclFloat, ncclSum, c, NULL), "allreduce", "registered ncclMemAlloc buffers")) {
        int ok = 1;
        for (size_t i = 0; i < n && ok; i++) ok = r[i] == (float)expect_reduced(ncclSum, i);
        CHECK(ok, "registered ncclMemAlloc buffers, round %d: wrong data", round);
      }
    }
    NCCLOK(ncclCommDeregister(c, hs));
    NCCLOK(ncclCommDeregister(c, hr));
  }
  NCCLOK(ncclMemFree(s));
  NCCLOK(ncclMemFree(r));
  int fd = -1, fd2 = -1;
  size_t bytes = n * sizeof(float);
  float* f = map_app_memory(bytes, NULL, &fd);
  CHECK(f != NULL, "mapping a memfd: %s", strerror(errno));
  if (!f) return;
  registered_allreduce(c, f, n, "registered application memory");
  /* Free and map new memory at the same address: the registration must name the new file. */
  munmap(f, bytes);
  close(fd);
  float* g = map_app_memory(bytes, f, &fd2);
  CHECK(g == f, "mapping again at %p", (void*)f);
  if (g == f) registered_allreduce(c, g, n, "registered memory mapped again at the same address");
  if (g) munmap(g, bytes);
  if (fd2 >= 0) close(fd2);
}

/* Split by parity (reversed key order), shrink without the last rank, a non-blocking split,
 * an init-all of one device, and an operation forced to a fallback that is not loaded. */
static void check_derived(ncclComm_t c) {
  ncclComm_t s = NULL;
  NCCLOK(ncclCommSplit(c, g_rank % 2, -g_rank, &s, NULL));
  if (s) {
    int n = 0, r = -1, want = (g_nranks - g_rank % 2 + 1) / 2;
    NCCLOK(ncclCommCount(s, &n));
    NCCLOK(ncclCommUserRank(s, &r));
    CHECK(n == want && r == want - 1 - g_rank / 2, "split: count %d rank %d, expected %d and %d", n, r, want, want - 1 - g_rank / 2);
    float v = (float)g_rank;
    if (ran(ncclAllReduce(&v, &v, 1, ncclFloat, ncclMax, s, NULL), "allreduce", "allreduce on a split comm"))
      CHECK(v == (float)(g_rank % 2 + 2 * (want - 1)), "split max %f", v);
    NCCLOK(ncclCommDestroy(s));
    EXPECT_ERR(ncclInvalidArgument, "destroyed", ncclCommCount(s, &n));
  }
  ncclComm_t none = (ncclComm_t)1;
  NCCLOK(ncclCommSplit(c, g_rank == 0 ? NCCL_SPLIT_NOCOLOR : 0, 0, &none, NULL));
  if (g_rank == 0) CHECK(none == NULL, "NCCL_SPLIT_NOCOLOR gave a communicator");
  else if (none) NCCLOK(ncclCommDestroy(none));
  if (g_nranks > 1 && g_rank != g_nranks - 1) {
    int ex = g_nranks - 1, n = 0;
    ncclComm_t k = NULL;
    NCCLOK(ncclCommShrink(c, &ex, 1, &k, NULL, NCCL_SHRINK_DEFAULT));
    if (k) {
      NCCLOK(ncclCommCount(k, &n));
      CHECK(n == g_nranks - 1, "shrink: count %d", n);
      NCCLOK(ncclCommDestroy(k));
    }
  }
  ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
  nb.blocking = 0;
  ncclComm_t a = NULL;
  ncclResult_t r = ncclCommSplit(c, 0, g_rank, &a, &nb);
  CHECK(r == ncclSuccess || r == ncclInProgress, "non-blocking split -> %d: %s", (int)r, ncclGetLastError(NULL));
  ncclResult_t st = ncclInProgress;
  double deadline = now_s() + 60;
  while (a && st == ncclInProgress && now_s() < deadline) ncclCommGetAsyncError(a, &st);
  CHECK(st == ncclSuccess, "non-blocking init ended in %d: %s", (int)st, ncclGetLastError(NULL));
  if (a) {
    check_allreduce(a, ncclInt32, ncclSum, 100, 0);
    NCCLOK(ncclCommFinalize(a));
    NCCLOK(ncclCommDestroy(a));
  }
  ncclComm_t one = NULL;
  NCCLOK(ncclCommInitAll(&one, 1, NULL));
  if (one) {
    int saved = g_nranks, saved_rank = g_rank;
    g_nranks = 1;
    g_rank = 0;
    /* At world size 1 every collective is a copy: none may be skipped. */
    const char* req = getenv("NCCL_TEST_REQUIRE");
    char* saved_req = req ? strdup(req) : NULL;
    setenv("NCCL_TEST_REQUIRE", "all", 1);
    check_allreduce(one, ncclFloat32, ncclSum, 1000, 0);
    check_allgather(one, ncclInt8, 100, 0);
    check_reducescatter(one, ncclFloat64, ncclMax, 100, 0);
    check_broadcast(one, ncclFloat16, 100, 0, 0, 0);
    check_reduce(one, ncclFloat32, ncclMin, 100, 0, 0, 0);
    check_broadcast(one, ncclInt32, 10, 0, 1, 1);
    check_alltoall_gather_scatter(one, ncclFloat32, 10, 0);
    check_group_sendrecv(one, 100, 0);
    if (saved_req) {
      setenv("NCCL_TEST_REQUIRE", saved_req, 1);
      free(saved_req);
    } else {
      unsetenv("NCCL_TEST_REQUIRE");
    }
    g_nranks = saved;
    g_rank = saved_rank;
    NCCLOK(ncclCommDestroy(one));
  }
  setenv("MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION", "allgather", 1);
  ncclComm_t f = NULL;
  NCCLOK(ncclCommSplit(c, 0, g_rank, &f, NULL));
  unsetenv("MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION");
  if (f) {
    float x[4], y[64];
    EXPECT_ERR(ncclInvalidUsage, "MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION names allgather", ncclAllGather(x, y, 4, ncclFloat, f, NULL));
    EXPECT_ERR(ncclInvalidUsage, "MSCCLPP_NCCL_LIB_PATH", ncclAllGather(x, y, 4, ncclFloat, f, NULL));
    NCCLOK(ncclCommDestroy(f));
  }
}

int run_deadpeer(void);
int run_fallback(void);

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  discover_rank();
  const char* mode = getenv("NCCL_TEST_MODE");
  if (mode && strcmp(mode, "deadpeer") == 0) return run_deadpeer();
  if (mode && strcmp(mode, "fallback") == 0) return run_fallback();
  int p2p_only = mode && strcmp(mode, "p2p") == 0;
  ncclComm_t c = init_comm("");
  if (c && p2p_only) {
    check_p2p(c);
    NCCLOK(ncclCommDestroy(c));
  } else if (c) {
    check_queries(c);
    check_bad_arguments(c);
    check_collectives(c);
    check_p2p(c);
    check_memory(c);
    check_registered(c);
    check_derived(c);
    NCCLOK(ncclCommFinalize(c));
    NCCLOK(ncclCommDestroy(c));
    EXPECT_ERR(ncclInvalidArgument, "destroyed", ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, c, NULL));
  }
  printf("rank %d: %d passed, %d failed, %d skipped\n", g_rank, g_checks - g_failures, g_failures, g_skips);
  return g_failures ? 1 : 0;
}
