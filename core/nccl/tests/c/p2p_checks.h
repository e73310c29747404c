/* Point-to-point and group checks of the C test, every result compared element by element:
 * grouped exchanges of any pattern (ring, pairwise, every rank with every rank, unequal counts
 * per peer as PyTorch's alltoallv issues them), 1 byte and 1 MiB + 3 bytes, zero counts and
 * sends to self; a group mixing sends, receives and collectives; nested groups; a group over
 * two communicators whose rank orders differ; and the open-group warning (stderr captured). */
#ifndef MSCCLPP_NCCL_P2P_CHECKS_H
#define MSCCLPP_NCCL_P2P_CHECKS_H

#include <strings.h>

#include "coll_checks.h"

/* 1 MiB + 3 bytes: several chunks of the host transport, the last one partial and odd. */
#define MIB_PLUS_3 ((size_t)(1 << 20) + 3)

/* Element i of what rank `src` sends to rank `dst` (small integers: exact in every type). */
static double p2p_val(int src, int dst, size_t i) { return (double)(((size_t)src * 7 + (size_t)dst * 3 + i) % 100); }

/* How many elements rank `src` sends to rank `dst` in a pattern of size n. */
typedef size_t (*count_fn)(int src, int dst, size_t n);
static size_t ring_count(int src, int dst, size_t n) { return dst == (src + 1) % g_nranks ? n : 0; }
static size_t pair_count(int src, int dst, size_t n) { return dst == (src ^ 1) ? n : 0; }
static size_t all_count(int src, int dst, size_t n) {
  (void)src;
  (void)dst;
  return n;
}
/* 0 to 3 blocks of n, differing per pair (zero for some, this rank itself among them). */
static size_t uneven_count(int src, int dst, size_t n) { return (size_t)((src * 3 + dst * 5) % 4) * n; }

/* Every rank sends cnt(me, p) elements of type t to each rank p and receives cnt(p, me) from
 * it, all in one group, the blocks packed back to back in rank order (PyTorch's alltoallv
 * layout), issued starting with this rank's next neighbour. A zero count is issued too when
 * `zeros` (a no-op), else skipped as PyTorch does; `recv_first` posts each receive first. */
static void check_exchange(ncclComm_t c, const char* name, count_fn cnt, size_t n, ncclDataType_t t, int zeros,
                           int recv_first) {
  int P = g_nranks, me = g_rank;
  size_t sz = type_size(t), sdisp[64], rdisp[64], stot = 0, rtot = 0;
  for (int p = 0; p < P && p < 64; p++) {
    sdisp[p] = stot;
    rdisp[p] = rtot;
    stot += cnt(me, p, n);
    rtot += cnt(p, me, n);
  }
  char* send = fill_garbage(stot * sz);
  char* recv = fill_garbage(rtot * sz);
  for (int p = 0; p < P; p++)
    for (size_t i = 0; i < cnt(me, p, n); i++) put(send, t, sdisp[p] + i, p2p_val(me, p, i));
  char what[160];
  snprintf(what, sizeof what, "grouped %s exchange %s n=%zu%s%s", name, type_str(t), n, zeros ? " (zero counts issued)" : "",
           recv_first ? " recv first" : "");
  NCCLOK(ncclGroupStart());
  for (int k = 1; k <= P; k++) {
    int p = (me + k) % P;
    size_t sc = cnt(me, p, n), rc = cnt(p, me, n);
    if (recv_first && (rc || zeros)) NCCLOK(ncclRecv(recv + rdisp[p] * sz, rc, t, p, c, NULL));
    if (sc || zeros) NCCLOK(ncclSend(send + sdisp[p] * sz, sc, t, p, c, NULL));
    if (!recv_first && (rc || zeros)) NCCLOK(ncclRecv(recv + rdisp[p] * sz, rc, t, p, c, NULL));
  }
  if (ran(ncclGroupEnd(), "sendrecv", what)) {
    int ok = 1;
    for (int p = 0; p < P && ok; p++)
      for (size_t i = 0; i < cnt(p, me, n) && ok; i++)
        if (get(recv, t, rdisp[p] + i) != p2p_val(p, me, i)) {
          CHECK(0, "%s: element %zu from rank %d is %g, expected %g", what, i, p, get(recv, t, rdisp[p] + i), p2p_val(p, me, i));
          ok = 0;
        }
    CHECK(ok, "%s", what);
  }
  free(send);
  free(recv);
}

/* Sends, receives and collectives in one group, issued receive, all-reduce, send, all-to-all:
 * each must run (the ring and the collectives checked). */
static void check_mixed_group(ncclComm_t c) {
  int P = g_nranks, next = (g_rank + 1) % P, prev = (g_rank + P - 1) % P;
  float s[100], r[100], a[100], d[8 * 64], e[8 * 64];
  for (int i = 0; i < 100; i++) {
    s[i] = (float)p2p_val(g_rank, next, (size_t)i);
    r[i] = -1.0f;
    a[i] = (float)in_val(g_rank, (size_t)i);
  }
  for (int i = 0; i < 8 * P; i++) d[i] = (float)(g_rank * 100 + i);
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclRecv(r, 100, ncclFloat, prev, c, NULL));
  NCCLOK(ncclAllReduce(a, a, 100, ncclFloat, ncclSum, c, NULL));
  NCCLOK(ncclSend(s, 100, ncclFloat, next, c, NULL));
  NCCLOK(ncclAlltoAll(d, e, 8, ncclFloat, c, NULL));
  NCCLOK(ncclGroupEnd());
  int ok = 1;
  for (int i = 0; i < 100 && ok; i++)
    ok = r[i] == (float)p2p_val(prev, g_rank, (size_t)i) && a[i] == (float)expect_reduced(ncclSum, (size_t)i);
  for (int q = 0; q < P && ok; q++)
    for (int i = 0; i < 8 && ok; i++) ok = e[q * 8 + i] == (float)(q * 100 + g_rank * 8 + i);
  CHECK(ok, "group of recv + allreduce + send + alltoall: wrong data");
}

/* ncclGroupStart twice, End twice: the inner End issues nothing (on the host backend the
 * buffers are untouched after it), the outer End runs everything. */
static void check_nested_groups(ncclComm_t c) {
  int P = g_nranks, next = (g_rank + 1) % P, prev = (g_rank + P - 1) % P;
  int32_t s[50], r[50], a[50];
  for (int i = 0; i < 50; i++) {
    s[i] = (int32_t)p2p_val(g_rank, next, (size_t)i);
    r[i] = -1;
    a[i] = (int32_t)in_val(g_rank, (size_t)i);
  }
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclSend(s, 50, ncclInt32, next, c, NULL));
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclRecv(r, 50, ncclInt32, prev, c, NULL));
  NCCLOK(ncclAllReduce(a, a, 50, ncclInt32, ncclMax, c, NULL));
  NCCLOK(ncclGroupEnd());
  CHECK(r[0] == -1 && r[49] == -1 && a[0] == (int32_t)in_val(g_rank, 0), "the inner ncclGroupEnd issued calls");
  NCCLOK(ncclGroupEnd());
  int ok = 1;
  for (int i = 0; i < 50 && ok; i++)
    ok = r[i] == (int32_t)p2p_val(prev, g_rank, (size_t)i) && a[i] == (int32_t)expect_reduced(ncclMax, (size_t)i);
  CHECK(ok, "nested groups: wrong data after the outer ncclGroupEnd");
}

/* One group over two communicators: `c` and a split of it with the rank order reversed. On
 * each, a ring exchange (the ring of its own ranks) and on the split an all-reduce; even ranks
 * queue the split's calls first, odd ranks c's, so the ranks' orders differ. */
static void check_two_comm_group(ncclComm_t c) {
  ncclComm_t b = NULL;
  NCCLOK(ncclCommSplit(c, 0, g_nranks - 1 - g_rank, &b, NULL));
  if (!b) return;
  int P = g_nranks, brank = -1;
  NCCLOK(ncclCommUserRank(b, &brank));
  CHECK(brank == P - 1 - g_rank, "reversed split: rank %d, expected %d", brank, P - 1 - g_rank);
  int next = (g_rank + 1) % P, prev = (g_rank + P - 1) % P;
  int bnext = (brank + 1) % P, bprev = (brank + P - 1) % P;
  double s[300], r[300], bs[300], br[300], a[300];
  for (int i = 0; i < 300; i++) {
    s[i] = p2p_val(g_rank, next, (size_t)i);
    bs[i] = 1000 + p2p_val(brank, bnext, (size_t)i);
    r[i] = br[i] = -1;
    a[i] = in_val(g_rank, (size_t)i);
  }
  NCCLOK(ncclGroupStart());
  for (int pass = 0; pass < 2; pass++) {
    if ((pass == 0) == (g_rank % 2 == 0)) {
      NCCLOK(ncclSend(bs, 300, ncclFloat64, bnext, b, NULL));
      NCCLOK(ncclAllReduce(a, a, 300, ncclFloat64, ncclSum, b, NULL));
      NCCLOK(ncclRecv(br, 300, ncclFloat64, bprev, b, NULL));
    } else {
      NCCLOK(ncclRecv(r, 300, ncclFloat64, prev, c, NULL));
      NCCLOK(ncclSend(s, 300, ncclFloat64, next, c, NULL));
    }
  }
  NCCLOK(ncclGroupEnd());
  int ok = 1;
  for (int i = 0; i < 300 && ok; i++)
    ok = r[i] == p2p_val(prev, g_rank, (size_t)i) && br[i] == 1000 + p2p_val(bprev, brank, (size_t)i) &&
         a[i] == expect_reduced(ncclSum, (size_t)i);
  CHECK(ok, "group over two communicators (reversed rank order): wrong data");
  NCCLOK(ncclCommDestroy(b));
}

/* The open-group trap as PyTorch meets it: ncclSend fails inside a group and the caller
 * raises before ncclGroupEnd, so later calls are only queued. Querying the async error and
 * destroying a communicator then must log a WARN naming the queued calls (once per
 * communicator and call); stderr is captured to check it. */
static int nccl_warnings_on_stderr(void) {
  const char* level = getenv("MSCCLPP_LOG_LEVEL");
  if (!level || !*level) level = getenv("MSCCLPP_DEBUG");
  const char* subsys = getenv("MSCCLPP_LOG_SUBSYS");
  const char* file = getenv("MSCCLPP_LOG_FILE");
  if (level && (strcasecmp(level, "NONE") == 0 || strcasecmp(level, "VERSION") == 0)) return 0;
  if (subsys && *subsys && !strcasestr(subsys, "NCCL") && !strcasestr(subsys, "ALL")) return 0;
  return !(file && *file);
}

static void check_open_group_warning(ncclComm_t c) {
  if (!nccl_warnings_on_stderr()) {
    if (g_rank == 0) printf("SKIP the open-group warning check: MSCCLPP_LOG_* keep NCCL warnings off stderr\n");
    g_skips++;
    return;
  }
  ncclComm_t d = NULL;
  NCCLOK(ncclCommSplit(c, 0, g_rank, &d, NULL));
  if (!d) return;
  float x[4] = {1, 2, 3, 4}, y[4] = {0}, z[4] = {0};
  FILE* cap = tmpfile();
  if (!cap) {
    CHECK(0, "tmpfile: %s", strerror(errno));
    return;
  }
  fflush(stderr);
  int saved = dup(2);
  dup2(fileno(cap), 2);
  NCCLOK(ncclGroupStart());
  ncclResult_t bad = ncclSend(x, 4, ncclFloat, g_nranks, c, NULL); /* PyTorch would raise here */
  ncclResult_t q1 = ncclAllReduce(x, y, 4, ncclFloat, ncclSum, c, NULL);
  ncclResult_t q2 = ncclSend(x, 4, ncclFloat, 0, d, NULL);
  ncclResult_t q3 = ncclRecv(z, 4, ncclFloat, 0, d, NULL);
  ncclResult_t ae = ncclInternalError, a1 = ncclCommGetAsyncError(c, &ae), a2 = ncclCommGetAsyncError(c, &ae);
  float y0 = y[0];
  ncclResult_t dd = ncclCommDestroy(d);
  ncclResult_t end = ncclGroupEnd();
  char endmsg[512];
  snprintf(endmsg, sizeof endmsg, "%s", ncclGetLastError(NULL));
  ncclCommDestroy(NULL); /* outside a group: no warning */
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char text[16384];
  rewind(cap);
  size_t len = fread(text, 1, sizeof text - 1, cap);
  text[len] = '\0';
  fclose(cap);
  CHECK(bad == ncclInvalidArgument, "ncclSend to rank %d -> %d, expected ncclInvalidArgument", g_nranks, (int)bad);
  CHECK(q1 == ncclSuccess && q2 == ncclSuccess && q3 == ncclSuccess && a1 == ncclSuccess && a2 == ncclSuccess && dd == ncclSuccess,
        "calls in the open group -> %d %d %d %d %d %d", (int)q1, (int)q2, (int)q3, (int)a1, (int)a2, (int)dd);
  CHECK(y0 == 0.0f && y[0] == 0.0f && z[0] == 0.0f, "a call of the failed group ran (y %f z %f)", y[0], z[0]);
  CHECK(end == ncclInvalidArgument && strstr(endmsg, "earlier call in this group failed"),
        "ncclGroupEnd after a failed call -> %d: %s", (int)end, endmsg);
  const char* want_q =
      "ncclCommGetAsyncError while a group is open on this thread (ncclGroupStart without ncclGroupEnd); 3 calls are "
      "queued and have not run: ncclAllReduce, ncclSend, ncclRecv (1 of them on this communicator)";
  const char* want_d =
      "ncclCommDestroy while a group is open on this thread (ncclGroupStart without ncclGroupEnd); 3 calls are queued "
      "and have not run: ncclAllReduce, ncclSend, ncclRecv (2 of them on this communicator)";
  const char* first = strstr(text, want_q);
  int n_warn = 0;
  for (const char* p = text; (p = strstr(p, "while a group is open")) != NULL; p++) n_warn++;
  CHECK(first != NULL, "no open-group WARN for ncclCommGetAsyncError; stderr was:\n%s", text);
  if (first) { /* the log line's prefix ("host:pid MSCCLPP WARN [NCCL] ") names the level */
    const char* line = first;
    while (line > text && line[-1] != '\n') line--;
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%.*s", (int)(first - line), line);
    CHECK(strstr(prefix, " WARN ") != NULL, "the open-group message is not a WARN: \"%s\"", prefix);
  }
  CHECK(strstr(text, want_d) != NULL, "no open-group WARN for ncclCommDestroy; stderr was:\n%s", text);
  CHECK(first && strstr(first, "an earlier call in this group failed (ncclSend: peer") != NULL,
        "the open-group WARN does not name the failed ncclSend:\n%s", text);
  CHECK(n_warn == 2, "%d open-group warnings, expected 2 (once per communicator and call):\n%s", n_warn, text);
  /* The group is closed again: calls run at once. */
  NCCLOK(ncclAllReduce(x, y, 4, ncclFloat, ncclSum, c, NULL));
  CHECK(y[3] == 4.0f * (float)g_nranks, "all-reduce after the failed group gave %f", y[3]);
}

/* In-place ncclAlltoAll (one buffer): block p goes to rank p and block p from rank p lands on
 * it, natively (each receive waits for the send out of its block); n bytes per block, several
 * chunks of the host protocol at MIB_PLUS_3. */
static void check_alltoall_in_place(ncclComm_t c, size_t n) {
  int P = g_nranks, me = g_rank;
  unsigned char* b = (unsigned char*)malloc((size_t)P * n);
  if (b == NULL) {
    CHECK(0, "in-place alltoall: out of memory for %d blocks of %zu bytes", P, n);
    return;
  }
  for (int p = 0; p < P; p++)
    for (size_t i = 0; i < n; i++) b[(size_t)p * n + i] = (unsigned char)p2p_val(me, p, i);
  NCCLOK(ncclAlltoAll(b, b, n, ncclUint8, c, NULL));
  size_t bad = 0, first = 0;
  for (int p = 0; p < P; p++)
    for (size_t i = 0; i < n; i++)
      if (b[(size_t)p * n + i] != (unsigned char)p2p_val(p, me, i) && bad++ == 0) first = (size_t)p * n + i;
  CHECK(bad == 0, "in-place alltoall of %zu bytes per block: %zu wrong bytes, first at %zu", n, bad, first);
  free(b);
}

/* The point-to-point checks of this file, at every size and pattern. */
static void check_p2p_patterns(ncclComm_t c) {
  check_exchange(c, "ring", ring_count, 1, ncclInt8, 0, 0);
  check_exchange(c, "ring", ring_count, MIB_PLUS_3, ncclInt8, 0, 0);
  check_exchange(c, "ring", ring_count, 1000, ncclFloat32, 1, 1);
  check_exchange(c, "pairwise", pair_count, 1, ncclInt8, 0, 1);
  check_exchange(c, "pairwise", pair_count, MIB_PLUS_3, ncclUint8, 0, 0);
  check_exchange(c, "all-peers", all_count, 1, ncclInt8, 0, 0);
  check_exchange(c, "all-peers", all_count, MIB_PLUS_3, ncclInt8, 0, 1);
  check_exchange(c, "all-peers", all_count, 777, ncclBfloat16, 0, 0);
  check_exchange(c, "alltoallv", uneven_count, 1000, ncclFloat16, 0, 0);
  check_exchange(c, "alltoallv", uneven_count, 65537, ncclInt8, 1, 1);
  check_alltoall_in_place(c, 1);
  check_alltoall_in_place(c, MIB_PLUS_3);
  /* A lone zero-count send to this rank itself is a no-op (no matching receive needed). */
  float x = 1.0f;
  NCCLOK(ncclSend(&x, 0, ncclFloat, g_rank, c, NULL));
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclRecv(NULL, 0, ncclFloat, g_rank, c, NULL));
  NCCLOK(ncclGroupEnd());
  check_mixed_group(c);
  check_nested_groups(c);
  check_two_comm_group(c);
  check_open_group_warning(c);
}

#endif
