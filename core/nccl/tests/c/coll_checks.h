/* Collective and point-to-point checks of the C test: every call's result is compared
 * element by element with the value computed here. Inputs are small integers, so sums,
 * products and extrema are exact in every type. */
#ifndef MSCCLPP_NCCL_COLL_CHECKS_H
#define MSCCLPP_NCCL_COLL_CHECKS_H

#include "test_util.h"

/* Input of rank r at element i (sum/min/max/avg), and of products (1 or 2). */
static double in_val(int r, size_t i) { return (double)(r + 1) + (double)(i % 5); }
static double prod_val(int r, size_t i) { return 1.0 + (double)((r + (int)i) & 1); }
static double input(ncclRedOp_t op, int r, size_t i) {
  return op == ncclProd ? prod_val(r, i) : in_val(r, i);
}

static double expect_reduced(ncclRedOp_t op, size_t i) {
  double acc = input(op, 0, i);
  for (int r = 1; r < g_nranks; r++) {
    double v = input(op, r, i);
    switch (op) {
      case ncclSum: case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      case ncclMin: acc = v < acc ? v : acc; break;
      default: break;
    }
  }
  return op == ncclAvg ? acc / g_nranks : acc;
}

/* Whether $NCCL_TEST_REQUIRE (comma list, or "all") names collective `name`. */
static int required(const char* name) {
  const char* req = getenv("NCCL_TEST_REQUIRE");
  if (!req) return 0;
  if (strcmp(req, "all") == 0) return 1;
  size_t n = strlen(name);
  for (const char* p = req; (p = strstr(p, name)) != NULL; p += n) {
    int start = p == req || p[-1] == ',';
    int end = p[n] == '\0' || p[n] == ',';
    if (start && end) return 1;
  }
  return 0;
}

/* 1 when `r` is success; 0 after counting a skip (no native path and no fallback: allowed
 * unless `name` is required) or a failure. */
static int ran(ncclResult_t r, const char* name, const char* what) {
  if (r == ncclSuccess) return 1;
  const char* m = ncclGetLastError(NULL);
  if (r == ncclInvalidUsage && m && strstr(m, "is not supported here") && !required(name)) {
    /* The reason once per collective (every skip is counted). */
    static char seen[1024];
    char key[64];
    snprintf(key, sizeof key, "|%s|", name);
    if (g_rank == 0 && !strstr(seen, key) && strlen(seen) + strlen(key) < sizeof seen) {
      strcat(seen, key);
      printf("SKIP %s (and every later %s without a native path): %s\n", what, name, m);
    }
    g_skips++;
    return 0;
  }
  CHECK(0, "%s -> %d (%s): %s", what, (int)r, ncclGetErrorString(r), m);
  return 0;
}

static int close_enough(double got, double want, ncclDataType_t t, ncclRedOp_t op) {
  if (op == ncclAvg && (t == ncclFloat32 || t == ncclFloat64)) return fabs(got - want) <= 1e-5 * fabs(want) + 1e-6;
  return got == want;
}

static void* fill_garbage(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  memset(p, 0x5a, bytes);
  return p;
}

static void check_allreduce(ncclComm_t c, ncclDataType_t t, ncclRedOp_t op, size_t n, int inplace) {
  size_t sz = type_size(t);
  char what[128];
  snprintf(what, sizeof what, "allreduce %s %s n=%zu %s", type_str(t), op_str(op), n, inplace ? "in-place" : "out-of-place");
  char* send = fill_garbage(n * sz);
  for (size_t i = 0; i < n; i++) put(send, t, i, input(op, g_rank, i));
  char* recv = inplace ? send : fill_garbage(n * sz);
  /* Large messages need the collectives' large-message algorithms (not required yet). */
  const char* name = n * sz > (1 << 20) ? "allreduce_large" : "allreduce";
  if (ran(ncclAllReduce(send, recv, n, t, op, c, NULL), name, what)) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
      if (!close_enough(get(recv, t, i), expect_reduced(op, i), t, op)) bad = i;
    CHECK(bad == n, "%s: element %zu is %g, expected %g", what, bad, bad < n ? get(recv, t, bad) : 0.0,
          bad < n ? expect_reduced(op, bad) : 0.0);
  }
  if (!inplace) free(recv);
  free(send);
}

static void check_allgather(ncclComm_t c, ncclDataType_t t, size_t n, int inplace) {
  size_t sz = type_size(t);
  char what[128];
  snprintf(what, sizeof what, "allgather %s n=%zu %s", type_str(t), n, inplace ? "in-place" : "out-of-place");
  char* recv = fill_garbage(n * sz * g_nranks);
  char* send = inplace ? recv + (size_t)g_rank * n * sz : fill_garbage(n * sz);
  for (size_t i = 0; i < n; i++) put(send, t, i, in_val(g_rank, i));
  if (ran(ncclAllGather(send, recv, n, t, c, NULL), "allgather", what)) {
    int ok = 1;
    for (int r = 0; r < g_nranks && ok; r++)
      for (size_t i = 0; i < n && ok; i++)
        if (get(recv, t, (size_t)r * n + i) != in_val(r, i)) {
          CHECK(0, "%s: block %d element %zu is %g, expected %g", what, r, i, get(recv, t, (size_t)r * n + i), in_val(r, i));
          ok = 0;
        }
    CHECK(ok, "%s", what);
  }
  if (!inplace) free(send);
  free(recv);
}

static void check_reducescatter(ncclComm_t c, ncclDataType_t t, ncclRedOp_t op, size_t n, int inplace) {
  size_t sz = type_size(t);
  char what[128];
  snprintf(what, sizeof what, "reducescatter %s %s n=%zu %s", type_str(t), op_str(op), n, inplace ? "in-place" : "out-of-place");
  char* send = fill_garbage(n * sz * g_nranks);
  for (size_t j = 0; j < n * g_nranks; j++) put(send, t, j, input(op, g_rank, j));
  char* recv = inplace ? send + (size_t)g_rank * n * sz : fill_garbage(n * sz);
  if (ran(ncclReduceScatter(send, recv, n, t, op, c, NULL), "reducescatter", what)) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
      if (!close_enough(get(recv, t, i), expect_reduced(op, (size_t)g_rank * n + i), t, op)) bad = i;
    CHECK(bad == n, "%s: element %zu is %g, expected %g", what, bad, bad < n ? get(recv, t, bad) : 0.0,
          bad < n ? expect_reduced(op, (size_t)g_rank * n + bad) : 0.0);
  }
  if (!inplace) free(recv);
  free(send);
}

/* ncclBroadcast (legacy: ncclBcast, always in place). */
static void check_broadcast(ncclComm_t c, ncclDataType_t t, size_t n, int root, int inplace, int legacy) {
  size_t sz = type_size(t);
  char what[128];
  snprintf(what, sizeof what, "%s %s n=%zu root=%d %s", legacy ? "bcast" : "broadcast", type_str(t), n, root,
           inplace ? "in-place" : "out-of-place");
  char* send = fill_garbage(n * sz);
  if (g_rank == root)
    for (size_t i = 0; i < n; i++) put(send, t, i, in_val(root, i));
  char* recv = inplace ? send : fill_garbage(n * sz);
  ncclResult_t r = legacy ? ncclBcast(send, n, t, root, c, NULL) : ncclBroadcast(send, recv, n, t, root, c, NULL);
  if (ran(r, "broadcast", what)) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
      if (get(recv, t, i) != in_val(root, i)) bad = i;
    CHECK(bad == n, "%s: element %zu is %g, expected %g", what, bad, bad < n ? get(recv, t, bad) : 0.0,
          bad < n ? in_val(root, bad) : 0.0);
  }
  if (!inplace) free(recv);
  free(send);
}

/* ncclReduce; non-root ranks pass a NULL receive buffer when `null_recv`. */
static void check_reduce(ncclComm_t c, ncclDataType_t t, ncclRedOp_t op, size_t n, int root, int inplace, int null_recv) {
  size_t sz = type_size(t);
  char what[128];
  snprintf(what, sizeof what, "reduce %s %s n=%zu root=%d %s%s", type_str(t), op_str(op), n, root,
           inplace ? "in-place" : "out-of-place", null_recv ? " (NULL recv off root)" : "");
  char* send = fill_garbage(n * sz);
  for (size_t i = 0; i < n; i++) put(send, t, i, input(op, g_rank, i));
  char* recv = inplace ? send : (null_recv && g_rank != root ? NULL : fill_garbage(n * sz));
  if (ran(ncclReduce(send, recv, n, t, op, root, c, NULL), "reduce", what) && g_rank == root) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
      if (!close_enough(get(recv, t, i), expect_reduced(op, i), t, op)) bad = i;
    CHECK(bad == n, "%s: element %zu is %g, expected %g", what, bad, bad < n ? get(recv, t, bad) : 0.0,
          bad < n ? expect_reduced(op, bad) : 0.0);
  }
  if (!inplace && recv) free(recv);
  free(send);
}

/* Element j of rank r's buffer in the all-to-all, gather and scatter checks (exact in every
 * type). */
static double ags_val(int r, size_t j) { return (double)(((size_t)r * 13 + j) % 100); }

/* Whether blocks of `n` elements of type t in `buf` hold ags_val(src(b), first(b) + i) for
 * every block b < nblocks; reports the first wrong element under `what`. */
static int check_blocks(const char* what, const char* buf, ncclDataType_t t, size_t n, int nblocks, int (*src)(int),
                        size_t (*first)(int, size_t)) {
  for (int b = 0; b < nblocks; b++)
    for (size_t i = 0; i < n; i++) {
      double got = get(buf, t, (size_t)b * n + i), want = ags_val(src(b), first(b, n) + i);
      if (got != want) {
        CHECK(0, "%s: block %d element %zu is %g, expected %g", what, b, i, got, want);
        return 0;
      }
    }
  return 1;
}
static int g_ags_root;
static int block_rank(int b) { return b; }
static int root_rank(int b) { (void)b; return g_ags_root; }
static size_t my_block(int b, size_t n) { (void)b; return (size_t)g_rank * n; }
static size_t block_zero(int b, size_t n) { (void)b; (void)n; return 0; }

/* ncclAlltoAll, ncclGather (root), ncclScatter (root): type t, `n` per block. */
static void check_alltoall_gather_scatter(ncclComm_t c, ncclDataType_t t, size_t n, int root) {
  size_t total = n * g_nranks, sz = type_size(t);
  char* send = fill_garbage(total * sz);
  char* recv = fill_garbage(total * sz);
  char what[128];
  g_ags_root = root;
  for (size_t j = 0; j < total; j++) put(send, t, j, ags_val(g_rank, j));
  snprintf(what, sizeof what, "alltoall %s n=%zu", type_str(t), n);
  if (ran(ncclAlltoAll(send, recv, n, t, c, NULL), "alltoall", what))
    CHECK(check_blocks(what, recv, t, n, g_nranks, block_rank, my_block), "%s", what);
  memset(recv, 0x5a, total * sz);
  snprintf(what, sizeof what, "gather %s n=%zu root=%d", type_str(t), n, root);
  if (ran(ncclGather(send, recv, n, t, root, c, NULL), "gather", what) && g_rank == root)
    CHECK(check_blocks(what, recv, t, n, g_nranks, block_rank, block_zero), "%s", what);
  memset(recv, 0x5a, total * sz);
  snprintf(what, sizeof what, "scatter %s n=%zu root=%d", type_str(t), n, root);
  if (ran(ncclScatter(send, recv, n, t, root, c, NULL), "scatter", what))
    CHECK(check_blocks(what, recv, t, n, 1, root_rank, my_block), "%s", what);
  free(send);
  free(recv);
}

/* Every rank sends a distinct block to every rank (itself included) and receives one from
 * each, all in one group; `recv_first` posts the receives before the sends. */
static void check_group_sendrecv(ncclComm_t c, size_t n, int recv_first) {
  int P = g_nranks;
  float* sends = malloc(sizeof(float) * n * P);
  float* recvs = fill_garbage(sizeof(float) * n * P);
  for (int d = 0; d < P; d++)
    for (size_t i = 0; i < n; i++) sends[d * n + i] = (float)(g_rank * 100000 + d * 1000 + (i % 1000));
  char what[128];
  snprintf(what, sizeof what, "group send/recv with every rank n=%zu %s", n, recv_first ? "recv first" : "send first");
  NCCLOK(ncclGroupStart());
  for (int k = 0; k < P; k++) {
    int peer = (g_rank + k) % P;
    if (recv_first) NCCLOK(ncclRecv(recvs + peer * n, n, ncclFloat, peer, c, NULL));
    NCCLOK(ncclSend(sends + peer * n, n, ncclFloat, peer, c, NULL));
    if (!recv_first) NCCLOK(ncclRecv(recvs + peer * n, n, ncclFloat, peer, c, NULL));
  }
  if (ran(ncclGroupEnd(), "sendrecv", what)) {
    int ok = 1;
    for (int s = 0; s < P && ok; s++)
      for (size_t i = 0; i < n && ok; i++)
        ok = recvs[s * n + i] == (float)(s * 100000 + g_rank * 1000 + (i % 1000));
    CHECK(ok, "%s: wrong data", what);
  }
  free(sends);
  free(recvs);
}

/* Pairs (0,1), (2,3), ...: the even rank sends then receives, the odd one receives then
 * sends, without groups (each call completes on its own). */
static void check_blocking_pairs(ncclComm_t c, size_t n) {
  int peer = g_rank ^ 1;
  if (peer >= g_nranks) return;
  int64_t* a = malloc(8 * n);
  int64_t* b = fill_garbage(8 * n);
  for (size_t i = 0; i < n; i++) a[i] = (int64_t)g_rank * 1000000007LL + (int64_t)i;
  if (g_rank % 2 == 0) {
    NCCLOK(ncclSend(a, n, ncclInt64, peer, c, NULL));
    NCCLOK(ncclRecv(b, n, ncclInt64, peer, c, NULL));
  } else {
    NCCLOK(ncclRecv(b, n, ncclInt64, peer, c, NULL));
    NCCLOK(ncclSend(a, n, ncclInt64, peer, c, NULL));
  }
  int ok = 1;
  for (size_t i = 0; i < n && ok; i++) ok = b[i] == (int64_t)peer * 1000000007LL + (int64_t)i;
  CHECK(ok, "blocking send/recv pair with rank %d n=%zu: wrong data", peer, n);
  free(a);
  free(b);
}

#endif
