//! The NCCL 2.28 ABI: the Rust types' layouts, the shipped include/nccl.h's sizes, offsets,
//! initializers, enum values and macros (compiled by a C compiler: tests/c/abi_dump.c), and
//! the function list, checked against NCCL 2.28.3.
//!
//! The expected numbers are those of NVIDIA's header, NVIDIA/nccl tag v2.28.3-1,
//! `src/nccl.h.in` (x86-64 Linux, LP64): `ncclConfig_v22800` is 80 bytes, `ncclSimInfo_v22200`
//! 24, the enums are `int`-sized, and the header declares 40 functions, each with a `pnccl`
//! twin (37 returning `ncclResult_t`, plus `ncclGetErrorString`, `ncclGetLastError` and the
//! deprecated `ncclResetDebugInit`).

mod common;

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

use mscclpp_nccl::abi::{self, NcclConfig, NcclSimInfo, NcclUniqueId};

/// The 40 function names of NCCL 2.28.3's nccl.h (each also exists as `p` + name).
const NCCL_2_28_3_FUNCTIONS: [&str; 40] = [
    "ncclAllGather",
    "ncclAllReduce",
    "ncclAlltoAll",
    "ncclBcast",
    "ncclBroadcast",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommCuDevice",
    "ncclCommDeregister",
    "ncclCommDestroy",
    "ncclCommFinalize",
    "ncclCommGetAsyncError",
    "ncclCommInitAll",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommInitRankScalable",
    "ncclCommRegister",
    "ncclCommShrink",
    "ncclCommSplit",
    "ncclCommUserRank",
    "ncclCommWindowDeregister",
    "ncclCommWindowRegister",
    "ncclGather",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclGetUniqueId",
    "ncclGetVersion",
    "ncclGroupEnd",
    "ncclGroupSimulateEnd",
    "ncclGroupStart",
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclRecv",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclReduce",
    "ncclReduceScatter",
    "ncclResetDebugInit",
    "ncclScatter",
    "ncclSend",
];

/// What abi_dump prints for NCCL 2.28.3's header.
const EXPECTED: &[(&str, i64)] = &[
    ("sizeof_ncclUniqueId", 128),
    ("sizeof_ncclConfig_t", 80),
    ("sizeof_ncclSimInfo_t", 24),
    ("sizeof_ncclResult_t", 4),
    ("sizeof_ncclDataType_t", 4),
    ("sizeof_ncclRedOp_t", 4),
    ("sizeof_ncclScalarResidence_t", 4),
    ("sizeof_ncclComm_t", 8),
    ("sizeof_ncclWindow_t", 8),
    ("offsetof_ncclConfig_t_size", 0),
    ("offsetof_ncclConfig_t_magic", 8),
    ("offsetof_ncclConfig_t_version", 12),
    ("offsetof_ncclConfig_t_blocking", 16),
    ("offsetof_ncclConfig_t_cgaClusterSize", 20),
    ("offsetof_ncclConfig_t_minCTAs", 24),
    ("offsetof_ncclConfig_t_maxCTAs", 28),
    ("offsetof_ncclConfig_t_netName", 32),
    ("offsetof_ncclConfig_t_splitShare", 40),
    ("offsetof_ncclConfig_t_trafficClass", 44),
    ("offsetof_ncclConfig_t_commName", 48),
    ("offsetof_ncclConfig_t_collnetEnable", 56),
    ("offsetof_ncclConfig_t_CTAPolicy", 60),
    ("offsetof_ncclConfig_t_shrinkShare", 64),
    ("offsetof_ncclConfig_t_nvlsCTAs", 68),
    ("offsetof_ncclConfig_t_nChannelsPerNetPeer", 72),
    ("offsetof_ncclConfig_t_nvlinkCentricSched", 76),
    ("offsetof_ncclSimInfo_t_size", 0),
    ("offsetof_ncclSimInfo_t_magic", 8),
    ("offsetof_ncclSimInfo_t_version", 12),
    ("offsetof_ncclSimInfo_t_estimatedTime", 16),
    ("init_config_size", 80),
    ("init_config_magic", 0xcafebeef),
    ("init_config_version", 22803),
    ("init_config_rest_undef", 1),
    ("init_siminfo_size", 24),
    ("init_siminfo_magic", 0x74685283),
    ("init_siminfo_version", 22803),
    ("init_siminfo_estimatedTime_x1000", -1000),
    ("ncclSuccess", 0),
    ("ncclUnhandledCudaError", 1),
    ("ncclSystemError", 2),
    ("ncclInternalError", 3),
    ("ncclInvalidArgument", 4),
    ("ncclInvalidUsage", 5),
    ("ncclRemoteError", 6),
    ("ncclInProgress", 7),
    ("ncclNumResults", 8),
    ("ncclInt8", 0),
    ("ncclChar", 0),
    ("ncclUint8", 1),
    ("ncclInt32", 2),
    ("ncclInt", 2),
    ("ncclUint32", 3),
    ("ncclInt64", 4),
    ("ncclUint64", 5),
    ("ncclFloat16", 6),
    ("ncclHalf", 6),
    ("ncclFloat32", 7),
    ("ncclFloat", 7),
    ("ncclFloat64", 8),
    ("ncclDouble", 8),
    ("ncclBfloat16", 9),
    ("ncclFloat8e4m3", 10),
    ("ncclFloat8e5m2", 11),
    ("ncclNumTypes", 12),
    ("ncclSum", 0),
    ("ncclProd", 1),
    ("ncclMax", 2),
    ("ncclMin", 3),
    ("ncclAvg", 4),
    ("ncclNumOps", 5),
    ("ncclMaxRedOp", 0x7fffffff),
    ("ncclScalarDevice", 0),
    ("ncclScalarHostImmediate", 1),
    ("NCCL_MAJOR", 2),
    ("NCCL_MINOR", 28),
    ("NCCL_PATCH", 3),
    ("NCCL_VERSION_CODE", 22803),
    ("NCCL_VERSION_2_28_3", 22803),
    ("NCCL_VERSION_2_8_4", 2804),
    ("NCCL_SUFFIX_len", 0),
    ("NCCL_UNIQUE_ID_BYTES", 128),
    ("NCCL_CONFIG_UNDEF_INT", i32::MIN as i64),
    ("NCCL_SPLIT_NOCOLOR", -1),
    ("NCCL_CONFIG_UNDEF_PTR_is_null", 1),
    ("NCCL_COMM_NULL_is_null", 1),
    ("NCCL_UNDEF_FLOAT_x1000", -1000),
    ("NCCL_WIN_DEFAULT", 0),
    ("NCCL_WIN_COLL_SYMMETRIC", 1),
    ("NCCL_WIN_REQUIRED_ALIGNMENT", 4096),
    ("NCCL_CTA_POLICY_DEFAULT", 0),
    ("NCCL_CTA_POLICY_EFFICIENCY", 1),
    ("NCCL_CTA_POLICY_ZERO", 2),
    ("NCCL_SHRINK_DEFAULT", 0),
    ("NCCL_SHRINK_ABORT", 1),
];

#[test]
fn rust_types_have_the_nccl_2_28_3_layout() {
    let want = |k: &str| {
        EXPECTED
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| *v as usize)
    };
    assert_eq!(Some(size_of::<NcclUniqueId>()), want("sizeof_ncclUniqueId"));
    assert_eq!(Some(size_of::<NcclConfig>()), want("sizeof_ncclConfig_t"));
    assert_eq!(Some(size_of::<NcclSimInfo>()), want("sizeof_ncclSimInfo_t"));
    let fields = [
        ("size", offset_of!(NcclConfig, size)),
        ("magic", offset_of!(NcclConfig, magic)),
        ("version", offset_of!(NcclConfig, version)),
        ("blocking", offset_of!(NcclConfig, blocking)),
        ("cgaClusterSize", offset_of!(NcclConfig, cga_cluster_size)),
        ("minCTAs", offset_of!(NcclConfig, min_ctas)),
        ("maxCTAs", offset_of!(NcclConfig, max_ctas)),
        ("netName", offset_of!(NcclConfig, net_name)),
        ("splitShare", offset_of!(NcclConfig, split_share)),
        ("trafficClass", offset_of!(NcclConfig, traffic_class)),
        ("commName", offset_of!(NcclConfig, comm_name)),
        ("collnetEnable", offset_of!(NcclConfig, collnet_enable)),
        ("CTAPolicy", offset_of!(NcclConfig, cta_policy)),
        ("shrinkShare", offset_of!(NcclConfig, shrink_share)),
        ("nvlsCTAs", offset_of!(NcclConfig, nvls_ctas)),
        (
            "nChannelsPerNetPeer",
            offset_of!(NcclConfig, n_channels_per_net_peer),
        ),
        (
            "nvlinkCentricSched",
            offset_of!(NcclConfig, nvlink_centric_sched),
        ),
    ];
    for (f, off) in fields {
        assert_eq!(
            Some(off),
            want(&format!("offsetof_ncclConfig_t_{f}")),
            "ncclConfig_t.{f}"
        );
    }
    assert_eq!(
        Some(offset_of!(NcclSimInfo, estimated_time)),
        want("offsetof_ncclSimInfo_t_estimatedTime")
    );
    let init = NcclConfig::initializer();
    assert_eq!(
        (init.size, init.magic, init.version),
        (80, 0xcafe_beef, 22803)
    );
    assert_eq!(init.blocking, i32::MIN);
    assert_eq!(
        (
            abi::VERSION_CODE,
            abi::NUM_OPS,
            abi::MAX_RED_OP,
            abi::NUM_TYPES,
            abi::NUM_RESULTS
        ),
        (22803, 5, 0x7fff_ffff, 12, 8)
    );
    assert_eq!(
        (
            abi::INVALID_ARGUMENT,
            abi::INVALID_USAGE,
            abi::REMOTE_ERROR,
            abi::IN_PROGRESS
        ),
        (4, 5, 6, 7)
    );
}

#[test]
fn shipped_header_matches_nccl_2_28_3() {
    let exe = common::out_dir().join("abi_dump");
    common::compile_c(&["abi_dump.c"], &exe, false);
    let out = Command::new(&exe).output().expect("run abi_dump");
    assert!(out.status.success(), "abi_dump failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let got: BTreeMap<&str, i64> = text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect();
    let mut wrong = Vec::new();
    for (k, v) in EXPECTED {
        match got.get(k) {
            Some(g) if g == v => {}
            other => wrong.push(format!("{k}: header gives {other:?}, NCCL 2.28.3 has {v}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "include/nccl.h differs from NCCL 2.28.3:\n{}",
        wrong.join("\n")
    );
    assert_eq!(
        got.len(),
        EXPECTED.len(),
        "abi_dump printed facts this test does not check:\n{text}"
    );
}

/// The names of the functions include/nccl.h declares (a declaration is a line holding
/// `nccl<Name>(` or `pnccl<Name>(` after a return type).
fn declared_functions() -> Vec<String> {
    let header =
        std::fs::read_to_string(common::crate_dir().join("include/nccl.h")).expect("read nccl.h");
    let mut names = Vec::new();
    for line in header.lines() {
        let l = line.trim_start();
        let decl = ["ncclResult_t ", "const char* ", "void "]
            .iter()
            .find_map(|p| l.strip_prefix(p));
        if let Some(rest) = decl {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if (name.starts_with("nccl") || name.starts_with("pnccl"))
                && rest[name.len()..].starts_with('(')
            {
                names.push(name);
            }
        }
    }
    names.sort();
    names
}

#[test]
fn header_declares_every_2_28_3_function_and_the_library_exports_each() {
    let mut want: Vec<String> = NCCL_2_28_3_FUNCTIONS
        .iter()
        .flat_map(|n| [n.to_string(), format!("p{n}")])
        .collect();
    want.sort();
    assert_eq!(declared_functions(), want, "include/nccl.h's declarations");
    let so = common::lib_dir().join("libmscclpp_nccl.so");
    // SAFETY: loading our own library runs no initializers with preconditions.
    let lib = unsafe { libloading::Library::new(&so) }.expect("load libmscclpp_nccl.so");
    let missing: Vec<&String> = want
        .iter()
        .filter(|n| {
            // SAFETY: only the symbol's presence is checked; it is never called.
            unsafe { lib.get::<*const ()>(n.as_bytes()) }.is_err()
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} does not export {missing:?}",
        so.display()
    );
}
