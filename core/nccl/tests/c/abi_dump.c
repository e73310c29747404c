/* Prints the ABI facts of the nccl.h it is compiled against, one "name value" per line:
 * sizes, field offsets, initializer values, enum values and macros. Compiled against our
 * include/nccl.h by tests/abi.rs (which compares with NCCL 2.28.3's numbers), and against
 * NVIDIA's /usr/include/nccl.h on the GPU machine (gpu_run.sh diffs the two outputs). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "nccl.h"

#define P(name, v) printf("%s %lld\n", name, (long long)(v))
#define OFF(f) P("offsetof_ncclConfig_t_" #f, offsetof(ncclConfig_t, f))
#define E(x) P(#x, x)

int main(void) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
  P("sizeof_ncclUniqueId", sizeof(ncclUniqueId));
  P("sizeof_ncclConfig_t", sizeof(ncclConfig_t));
  P("sizeof_ncclSimInfo_t", sizeof(ncclSimInfo_t));
  P("sizeof_ncclResult_t", sizeof(ncclResult_t));
  P("sizeof_ncclDataType_t", sizeof(ncclDataType_t));
  P("sizeof_ncclRedOp_t", sizeof(ncclRedOp_t));
  P("sizeof_ncclScalarResidence_t", sizeof(ncclScalarResidence_t));
  P("sizeof_ncclComm_t", sizeof(ncclComm_t));
  P("sizeof_ncclWindow_t", sizeof(ncclWindow_t));
  OFF(size); OFF(magic); OFF(version); OFF(blocking); OFF(cgaClusterSize); OFF(minCTAs);
  OFF(maxCTAs); OFF(netName); OFF(splitShare); OFF(trafficClass); OFF(commName);
  OFF(collnetEnable); OFF(CTAPolicy); OFF(shrinkShare); OFF(nvlsCTAs);
  OFF(nChannelsPerNetPeer); OFF(nvlinkCentricSched);
  P("offsetof_ncclSimInfo_t_size", offsetof(ncclSimInfo_t, size));
  P("offsetof_ncclSimInfo_t_magic", offsetof(ncclSimInfo_t, magic));
  P("offsetof_ncclSimInfo_t_version", offsetof(ncclSimInfo_t, version));
  P("offsetof_ncclSimInfo_t_estimatedTime", offsetof(ncclSimInfo_t, estimatedTime));
  P("init_config_size", c.size);
  P("init_config_magic", c.magic);
  P("init_config_version", c.version);
  int undef = c.blocking == NCCL_CONFIG_UNDEF_INT && c.cgaClusterSize == NCCL_CONFIG_UNDEF_INT &&
              c.minCTAs == NCCL_CONFIG_UNDEF_INT && c.maxCTAs == NCCL_CONFIG_UNDEF_INT &&
              c.netName == NULL && c.splitShare == NCCL_CONFIG_UNDEF_INT &&
              c.trafficClass == NCCL_CONFIG_UNDEF_INT && c.commName == NULL &&
              c.collnetEnable == NCCL_CONFIG_UNDEF_INT && c.CTAPolicy == NCCL_CONFIG_UNDEF_INT &&
              c.shrinkShare == NCCL_CONFIG_UNDEF_INT && c.nvlsCTAs == NCCL_CONFIG_UNDEF_INT &&
              c.nChannelsPerNetPeer == NCCL_CONFIG_UNDEF_INT &&
              c.nvlinkCentricSched == NCCL_CONFIG_UNDEF_INT;
  P("init_config_rest_undef", undef);
  P("init_siminfo_size", s.size);
  P("init_siminfo_magic", s.magic);
  P("init_siminfo_version", s.version);
  P("init_siminfo_estimatedTime_x1000", (long long)(s.estimatedTime * 1000.0f));
  E(ncclSuccess); E(ncclUnhandledCudaError); E(ncclSystemError); E(ncclInternalError);
  E(ncclInvalidArgument); E(ncclInvalidUsage); E(ncclRemoteError); E(ncclInProgress);
  E(ncclNumResults);
  E(ncclInt8); E(ncclChar); E(ncclUint8); E(ncclInt32); E(ncclInt); E(ncclUint32); E(ncclInt64);
  E(ncclUint64); E(ncclFloat16); E(ncclHalf); E(ncclFloat32); E(ncclFloat); E(ncclFloat64);
  E(ncclDouble); E(ncclBfloat16); E(ncclFloat8e4m3); E(ncclFloat8e5m2); E(ncclNumTypes);
  E(ncclSum); E(ncclProd); E(ncclMax); E(ncclMin); E(ncclAvg); E(ncclNumOps); E(ncclMaxRedOp);
  E(ncclScalarDevice); E(ncclScalarHostImmediate);
  E(NCCL_MAJOR); E(NCCL_MINOR); E(NCCL_PATCH); E(NCCL_VERSION_CODE);
  P("NCCL_VERSION_2_28_3", NCCL_VERSION(2, 28, 3));
  P("NCCL_VERSION_2_8_4", NCCL_VERSION(2, 8, 4));
  P("NCCL_SUFFIX_len", strlen(NCCL_SUFFIX));
  E(NCCL_UNIQUE_ID_BYTES); E(NCCL_CONFIG_UNDEF_INT); E(NCCL_SPLIT_NOCOLOR);
  P("NCCL_CONFIG_UNDEF_PTR_is_null", NCCL_CONFIG_UNDEF_PTR == NULL);
  P("NCCL_COMM_NULL_is_null", NCCL_COMM_NULL == NULL);
  P("NCCL_UNDEF_FLOAT_x1000", (long long)(NCCL_UNDEF_FLOAT * 1000.0f));
  E(NCCL_WIN_DEFAULT); E(NCCL_WIN_COLL_SYMMETRIC); E(NCCL_WIN_REQUIRED_ALIGNMENT);
  E(NCCL_CTA_POLICY_DEFAULT); E(NCCL_CTA_POLICY_EFFICIENCY); E(NCCL_CTA_POLICY_ZERO);
  E(NCCL_SHRINK_DEFAULT); E(NCCL_SHRINK_ABORT);
  return 0;
}
