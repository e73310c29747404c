/* The dead-peer and fallback modes of nccl_api_test (see nccl_api_test.c). */
#include "coll_checks.h"

/* The counters and rank of test_util.h are per file: this file discovers its own. */
static ncclComm_t init_comm_mode(void) {
  discover_rank();
  ncclUniqueId id;
  ncclComm_t c = NULL;
  if (exchange_id(&id, "") != 0) return NULL;
  NCCLOK(ncclCommInitRank(&c, g_nranks, id, g_rank));
  return c;
}

static int finish(void) {
  printf("rank %d: %d passed, %d failed, %d skipped\n", g_rank, g_checks - g_failures, g_failures, g_skips);
  return g_failures ? 1 : 0;
}

/* The last rank leaves without destroying its communicator. */
int run_deadpeer(void) {
  ncclComm_t c = init_comm_mode();
  CHECK(c != NULL, "init failed");
  if (!c || g_nranks < 2) return finish();
  int victim = g_nranks - 1;
  float v[64], w[64];
  for (int i = 0; i < 64; i++) v[i] = (float)g_rank;
  NCCLOK(ncclAlltoAll(v, w, 1, ncclFloat, c, NULL)); /* every pair is connected and alive */
  for (int r = 0; r < g_nranks; r++) CHECK(w[r] == (float)r, "alltoall block %d is %f", r, w[r]);
  if (g_rank == victim) {
    finish();
    fflush(stdout);
    _exit(0);
  }
  ncclResult_t ae = ncclSuccess;
  double t0 = now_s();
  while (now_s() - t0 < 30 && ae == ncclSuccess) {
    NCCLOK(ncclCommGetAsyncError(c, &ae));
    if (ae == ncclSuccess) usleep(10000);
  }
  CHECK(ae == ncclRemoteError, "ncclCommGetAsyncError reported %d, expected ncclRemoteError", (int)ae);
  CHECK(strstr(ncclGetLastError(c), "rank") != NULL, "last error \"%s\" does not name the rank", ncclGetLastError(c));
  double t1 = now_s();
  float buf[1000];
  ncclResult_t r = ncclRecv(buf, 1000, ncclFloat, victim, c, NULL);
  CHECK(r == ncclRemoteError, "recv from the dead rank -> %d, expected ncclRemoteError: %s", (int)r, ncclGetLastError(c));
  CHECK(now_s() - t1 < 5.0, "recv from the dead rank took %.2f s", now_s() - t1);
  /* A collective that needs the dead rank (across nodes: over its rail's network channels)
   * fails fast with ncclRemoteError instead of waiting for it. */
  double t3 = now_s();
  r = ncclAllReduce(v, w, 64, ncclFloat, ncclSum, c, NULL);
  CHECK(r == ncclRemoteError, "all-reduce with a dead rank -> %d, expected ncclRemoteError: %s", (int)r,
        ncclGetLastError(c));
  CHECK(now_s() - t3 < 5.0, "all-reduce with a dead rank took %.2f s", now_s() - t3);
  double t2 = now_s();
  NCCLOK(ncclCommAbort(c));
  CHECK(now_s() - t2 < 1.0, "ncclCommAbort took %.3f s, expected under 1 s", now_s() - t2);
  return finish();
}

/* MSCCLPP_NCCL_LIB_PATH = the fake NCCL, MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION=allreduce. The
 * fake's all-reduce writes 1000 + (the first nonce byte of the id its rank 0 made), +100 for
 * a custom operator, when called inside its own group; -1 otherwise. */
int run_fallback(void) {
  ncclComm_t c = init_comm_mode();
  CHECK(c != NULL, "init failed");
  if (!c) return finish();
  float x[16];
  for (int i = 0; i < 16; i++) x[i] = (float)g_rank;
  NCCLOK(ncclAllReduce(x, x, 16, ncclFloat, ncclSum, c, NULL));
  CHECK(x[0] >= 1000.0f && x[0] < 1100.0f && x[15] == x[0], "forced all-reduce did not reach the fake NCCL in a group: %f", x[0]);
  float sig = x[0];
  float sigs[64];
  NCCLOK(ncclGather(&sig, sigs, 1, ncclFloat, 0, c, NULL)); /* native: the fake has no gather */
  if (g_rank == 0)
    for (int r = 0; r < g_nranks; r++) CHECK(sigs[r] == sig, "rank %d's fake comm has id signature %f, rank 0 %f", r, sigs[r], sig);
  float scalar = 3.0f;
  ncclRedOp_t op = ncclSum;
  NCCLOK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, c));
  CHECK((int)op >= ncclNumOps, "custom op id %d", (int)op);
  NCCLOK(ncclAllReduce(x, x, 16, ncclFloat, op, c, NULL));
  CHECK(x[0] == sig + 100.0f, "custom-op all-reduce gave %f, expected %f", x[0], sig + 100.0f);
  NCCLOK(ncclRedOpDestroy(op, c));
  EXPECT_ERR(ncclInvalidArgument, "not destroyed", ncclRedOpDestroy(op, c));
  /* Grouped: the fallback's group brackets it; the native part still runs. */
  float a[4] = {1, 1, 1, 1}, b[4 * 64];
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclAllReduce(a, a, 4, ncclFloat, ncclSum, c, NULL));
  NCCLOK(ncclAlltoAll(b, b + 2 * 64, 0, ncclFloat, c, NULL));
  NCCLOK(ncclGroupEnd());
  CHECK(a[0] == sig, "grouped forced all-reduce gave %f", a[0]);
  NCCLOK(ncclCommDestroy(c));
  return finish();
}
