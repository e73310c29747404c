//! The C types of NCCL 2.28's `nccl.h` as Rust `#[repr(C)]` types, and facts about its enums.
//!
//! Layouts and values equal NCCL 2.28.3's header; `tests/abi.rs` checks them against the
//! numbers of NVIDIA's header and against `include/nccl.h` compiled by a C compiler.

use std::ffi::{c_char, c_float, c_int, c_uint};

/// `ncclResult_t`: an `int`-sized enum, passed as `c_int`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclUnhandledCudaError`.
pub const UNHANDLED_CUDA_ERROR: NcclResult = 1;
/// `ncclSystemError`.
pub const SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`.
pub const INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`.
pub const REMOTE_ERROR: NcclResult = 6;
/// `ncclInProgress`.
pub const IN_PROGRESS: NcclResult = 7;
/// `ncclNumResults`.
pub const NUM_RESULTS: NcclResult = 8;

/// `NCCL_VERSION_CODE` this library reports (2.28.3).
pub const VERSION_CODE: c_int = 22803;
/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;
/// `ncclConfig_t.magic` set by `NCCL_CONFIG_INITIALIZER`.
pub const CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// `ncclSimInfo_t.magic` set by `NCCL_SIM_INFO_INITIALIZER`.
pub const SIM_INFO_MAGIC: c_uint = 0x7468_5283;
/// `NCCL_CONFIG_UNDEF_INT`.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;
/// `ncclNumOps`: the first id of operators made by `ncclRedOpCreatePreMulSum`.
pub const NUM_OPS: c_int = 5;
/// `ncclMaxRedOp`.
pub const MAX_RED_OP: c_int = 0x7fff_ffff;
/// `ncclNumTypes`.
pub const NUM_TYPES: c_int = 12;

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    /// The bytes.
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

impl NcclUniqueId {
    /// The id as bytes.
    pub fn bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        self.internal.map(|c| c as u8)
    }
    /// An id holding `bytes`.
    pub fn from_bytes(bytes: &[u8; UNIQUE_ID_BYTES]) -> NcclUniqueId {
        NcclUniqueId {
            internal: bytes.map(|b| b as c_char),
        }
    }
}

/// `ncclConfig_t` of NCCL 2.28 (`struct ncclConfig_v22800`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclConfig {
    /// `sizeof(ncclConfig_t)` in the caller's header.
    pub size: usize,
    /// [`CONFIG_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// 0: non-blocking init (returns `ncclInProgress`).
    pub blocking: c_int,
    /// `cgaClusterSize`.
    pub cga_cluster_size: c_int,
    /// `minCTAs`.
    pub min_ctas: c_int,
    /// `maxCTAs`.
    pub max_ctas: c_int,
    /// `netName`.
    pub net_name: *const c_char,
    /// `splitShare`.
    pub split_share: c_int,
    /// `trafficClass`.
    pub traffic_class: c_int,
    /// `commName`.
    pub comm_name: *const c_char,
    /// `collnetEnable`.
    pub collnet_enable: c_int,
    /// `CTAPolicy`.
    pub cta_policy: c_int,
    /// `shrinkShare`.
    pub shrink_share: c_int,
    /// `nvlsCTAs`.
    pub nvls_ctas: c_int,
    /// `nChannelsPerNetPeer`.
    pub n_channels_per_net_peer: c_int,
    /// `nvlinkCentricSched`.
    pub nvlink_centric_sched: c_int,
}

// SAFETY: the two string pointers are only copied (to the fallback's init), never read by
// this library; NCCL too requires the caller's strings to live until init completes.
unsafe impl Send for NcclConfig {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for NcclConfig {}

impl NcclConfig {
    /// What `NCCL_CONFIG_INITIALIZER` produces.
    pub fn initializer() -> NcclConfig {
        let u = CONFIG_UNDEF_INT;
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: CONFIG_MAGIC,
            version: VERSION_CODE as c_uint,
            blocking: u,
            cga_cluster_size: u,
            min_ctas: u,
            max_ctas: u,
            net_name: std::ptr::null(),
            split_share: u,
            traffic_class: u,
            comm_name: std::ptr::null(),
            collnet_enable: u,
            cta_policy: u,
            shrink_share: u,
            nvls_ctas: u,
            n_channels_per_net_peer: u,
            nvlink_centric_sched: u,
        }
    }
}

/// `ncclSimInfo_t` (`struct ncclSimInfo_v22200`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclSimInfo {
    /// `sizeof(ncclSimInfo_t)`.
    pub size: usize,
    /// [`SIM_INFO_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// Estimated time of the group, in microseconds.
    pub estimated_time: c_float,
}

/// The size in bytes of an element of `ncclDataType_t` value `v`; `None` for values outside
/// `0..ncclNumTypes`.
pub fn type_size(v: c_int) -> Option<usize> {
    Some(match v {
        0 | 1 | 10 | 11 => 1,
        6 | 9 => 2,
        2 | 3 | 7 => 4,
        4 | 5 | 8 => 8,
        _ => return None,
    })
}

/// Whether `v` is a built-in `ncclRedOp_t` (sum, prod, max, min, avg).
pub fn is_builtin_op(v: c_int) -> bool {
    (0..NUM_OPS).contains(&v)
}

/// The built-in `ncclRedOp_t` name, for messages.
pub fn op_name(v: c_int) -> &'static str {
    match v {
        0 => "ncclSum",
        1 => "ncclProd",
        2 => "ncclMax",
        3 => "ncclMin",
        4 => "ncclAvg",
        _ => "a custom ncclRedOp_t",
    }
}

/// The `ncclDataType_t` name (`ncclFloat16`, ...), for messages.
pub fn type_name(v: c_int) -> &'static str {
    match v {
        0 => "ncclInt8",
        1 => "ncclUint8",
        2 => "ncclInt32",
        3 => "ncclUint32",
        4 => "ncclInt64",
        5 => "ncclUint64",
        6 => "ncclFloat16",
        7 => "ncclFloat32",
        8 => "ncclFloat64",
        9 => "ncclBfloat16",
        10 => "ncclFloat8e4m3",
        11 => "ncclFloat8e5m2",
        _ => "an unknown ncclDataType_t",
    }
}
