/* Helpers of the C tests of libmscclpp_nccl: rank discovery without MPI headers, the unique
 * id exchange through a file, checks that count, and 16-bit float conversions. */
#ifndef MSCCLPP_NCCL_TEST_UTIL_H
#define MSCCLPP_NCCL_TEST_UTIL_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

static int g_rank = 0, g_nranks = 1;
static int g_checks = 0, g_failures = 0, g_skips = 0;

#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    g_checks++;                                                               \
    if (!(cond)) {                                                            \
      g_failures++;                                                           \
      fprintf(stderr, "[rank %d] FAIL %s:%d: ", g_rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, "\n");                                                  \
    }                                                                         \
  } while (0)

#define NCCLOK(call)                                                                  \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    CHECK(r_ == ncclSuccess, "%s -> %d (%s): %s", #call, (int)r_, ncclGetErrorString(r_), \
          ncclGetLastError(NULL));                                                    \
  } while (0)

/* Expects `call` to fail with `code` and the last error to mention `needle`. */
#define EXPECT_ERR(code, needle, call)                                                  \
  do {                                                                                  \
    ncclResult_t r_ = (call);                                                           \
    const char* m_ = ncclGetLastError(NULL);                                            \
    CHECK(r_ == (code), "%s -> %d, expected %d (%s); last error: %s", #call, (int)r_,   \
          (int)(code), #code, m_);                                                      \
    CHECK(m_ && strstr(m_, (needle)), "%s: last error \"%s\" lacks \"%s\"", #call, m_, \
          (needle));                                                                    \
  } while (0)

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int env_int(const char* a, const char* b, const char* c, int dflt) {
  const char* names[3] = {a, b, c};
  for (int i = 0; i < 3; i++) {
    const char* v = names[i] ? getenv(names[i]) : NULL;
    if (v && *v) return atoi(v);
  }
  return dflt;
}

/* Rank and size from mpirun (Open MPI or PMI) or NCCL_TEST_RANK/NCCL_TEST_NRANKS. */
static void discover_rank(void) {
  g_rank = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "NCCL_TEST_RANK", 0);
  g_nranks = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "NCCL_TEST_NRANKS", 1);
}

/* Rank 0 makes the id and publishes it at $NCCL_TEST_ID_FILE (written then renamed); the
 * others wait for the file (60 s at most). Returns 0 on success. */
static int exchange_id(ncclUniqueId* id, const char* suffix) {
  const char* base = getenv("NCCL_TEST_ID_FILE");
  if (!base) {
    fprintf(stderr, "NCCL_TEST_ID_FILE is unset: expected a path for the unique id\n");
    return -1;
  }
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s%s", base, suffix);
  if (g_rank == 0) {
    if (ncclGetUniqueId(id) != ncclSuccess) return -1;
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0) return -1;
    return rename(tmp, path) == 0 ? 0 : -1;
  }
  double deadline = now_s() + 60.0;
  while (now_s() < deadline) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return 0;
    }
    usleep(10000);
  }
  fprintf(stderr, "[rank %d] no unique id at %s after 60 s\n", g_rank, path);
  return -1;
}

/* IEEE half and bfloat16 for the small integers the tests use (exact there). */
static uint16_t f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
  if (e == 0) return (uint16_t)sign;
  int ne = (int)e - 127 + 15;
  if (ne >= 31) return (uint16_t)(sign | 0x7c00);
  if (ne <= 0) return (uint16_t)sign;
  return (uint16_t)(sign | ((uint32_t)ne << 10) | (m >> 13));
}
static float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  uint32_t x = e == 0 ? sign : (sign | ((e - 15 + 127) << 23) | (m << 13));
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t f2bf(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16);
}
static float bf2f(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

/* Stores `v` (an integer-valued double) as element i of buf of type t. */
static void put(void* buf, ncclDataType_t t, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = f2h((float)v); break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    case ncclFloat64: ((double*)buf)[i] = v; break;
    case ncclBfloat16: ((uint16_t*)buf)[i] = f2bf((float)v); break;
    default: break;
  }
}
static double get(const void* buf, ncclDataType_t t, size_t i) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat16: return h2f(((const uint16_t*)buf)[i]);
    case ncclFloat32: return ((const float*)buf)[i];
    case ncclFloat64: return ((const double*)buf)[i];
    case ncclBfloat16: return bf2f(((const uint16_t*)buf)[i]);
    default: return NAN;
  }
}

static const char* type_str(ncclDataType_t t) {
  static const char* n[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                            "half", "float", "double", "bfloat16"};
  return (int)t >= 0 && (int)t < 10 ? n[t] : "?";
}
static const char* op_str(ncclRedOp_t o) {
  static const char* n[] = {"sum", "prod", "max", "min", "avg"};
  return (int)o >= 0 && (int)o < 5 ? n[o] : "custom";
}

#endif
