//! The `MSCCLPP_*` environment, read once per process into one typed [`Env`] (the logging
//! variables are applied by [`crate::logger`]).
//!
//! Reading never fails: a malformed value is kept as its parse error and returned, naming the
//! variable, what came and what was expected, by the typed accessor (`env().ibv_mode()?`).
//! Tests build an `Env` from any lookup function with [`Env::from_lookup`].
//!
//! Every variable has one parser, here, and is listed in [`VARS`] with its default and what it
//! does (the HAL's own variables are in [`mscclpp_hal::env::VARS`]; where core reports one of
//! them, it calls the HAL's parser). Most are read once per process ([`env()`]); those that
//! are read again per communicator (the algorithm forcing, the NVLS emulation opt-in, the
//! network transport of the collectives) are read fresh with [`Env::current`].

use crate::collectives::types::CollectiveKind;
use crate::error::{Error, Result};
use mscclpp_hal::env::{parse_bool, parse_hostid, parse_library_path, Var};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Log verbosity (`MSCCLPP_LOG_LEVEL`, or `MSCCLPP_DEBUG`), in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Nothing.
    None,
    /// The version banner only.
    Version,
    /// Warnings (the default).
    Warn,
    /// Informational messages.
    Info,
    /// Messages printed before aborting.
    Abort,
    /// Everything.
    Trace,
}

impl LogLevel {
    fn parse(s: &str) -> Option<LogLevel> {
        Some(match s.trim().to_ascii_uppercase().as_str() {
            "NONE" => LogLevel::None,
            "VERSION" => LogLevel::Version,
            "WARN" => LogLevel::Warn,
            "INFO" => LogLevel::Info,
            "ABORT" => LogLevel::Abort,
            "TRACE" => LogLevel::Trace,
            _ => return None,
        })
    }

    /// The variable's spelling of the level (`WARN`, ...).
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::None => "NONE",
            LogLevel::Version => "VERSION",
            LogLevel::Warn => "WARN",
            LogLevel::Info => "INFO",
            LogLevel::Abort => "ABORT",
            LogLevel::Trace => "TRACE",
        }
    }
}

/// How IB connections signal semaphores (`MSCCLPP_IBV_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IbvMode {
    /// `host`: RDMA atomics (the default).
    Host,
    /// `host-no-atomic`: RDMA write-with-immediate and a receive thread.
    HostNoAtomic,
}

/// Which IB memory registration paths may be used (`MSCCLPP_IB_MR_PATH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IbMrPath {
    /// `auto` (the default): mlx5 Data Direct, then `ibv_reg_dmabuf_mr`, then `ibv_reg_mr`,
    /// each falling back to the next.
    Auto,
    /// `data-direct`: only `mlx5dv_reg_dmabuf_mr` with Data Direct (an error otherwise).
    DataDirect,
    /// `dmabuf`: only `ibv_reg_dmabuf_mr` (an error otherwise).
    DmaBuf,
    /// `plain`: only `ibv_reg_mr` (with the peermem check for GPU memory).
    Plain,
}

/// Address family for bootstrap sockets (`MSCCLPP_SOCKET_FAMILY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SocketFamily {
    /// `AF_INET`: IPv4.
    Inet,
    /// `AF_INET6`: IPv6.
    Inet6,
}

/// The network transport the collectives use between nodes (`MSCCLPP_COLL_NET_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetTransport {
    /// `ib`: InfiniBand (the first IB device).
    Ib,
    /// `ethernet`: TCP.
    Ethernet,
}

/// One algorithm an environment variable forces (`MSCCLPP_ALGORITHM`, `MSCCLPP_<KIND>_ALGO`),
/// not yet checked against the algorithms that exist (the collectives do that, and name
/// [`var`](ForcedAlgorithm::var) and [`value`](ForcedAlgorithm::value) in their error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForcedAlgorithm {
    /// The collective.
    pub kind: CollectiveKind,
    /// The algorithm's name as written (trimmed).
    pub name: String,
    /// The variable that forces it.
    pub var: &'static str,
    /// That variable's whole value.
    pub value: String,
}

/// The launcher variables that identify a job, in the order the bootstrap's job key takes them
/// (`MSCCLPP_BOOTSTRAP_KEY` comes first: [`Env::bootstrap_key`]).
pub const LAUNCHER_JOB_VARS: [&str; 5] = [
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "TORCHELASTIC_RUN_ID",
];

/// `MSCCLPP_ALGORITHM`: `kind=name` items for any collective.
pub const ALGORITHM: &str = "MSCCLPP_ALGORITHM";
/// `MSCCLPP_NVLS_EMULATION`: lets the selector pick NVLS on the host backend.
pub const NVLS_EMULATION: &str = "MSCCLPP_NVLS_EMULATION";
/// `MSCCLPP_COLL_NET_TRANSPORT`: the collectives' network transport between nodes.
pub const COLL_NET_TRANSPORT: &str = "MSCCLPP_COLL_NET_TRANSPORT";
/// `MSCCLPP_CHECK_CALLS`: every collective and point-to-point call is compared across the
/// ranks before it runs (collectives/check.rs).
pub const CHECK_CALLS: &str = "MSCCLPP_CHECK_CALLS";
/// `MSCCLPP_DETERMINISTIC`: only algorithms that fold the ranks' values in rank order
/// (collectives/deterministic.rs).
pub const DETERMINISTIC: &str = "MSCCLPP_DETERMINISTIC";
/// `MSCCLPP_COPY_DRIVER_MAX_BYTES`: the largest world-size-1 copy done by the driver.
pub const COPY_DRIVER_MAX_BYTES: &str = "MSCCLPP_COPY_DRIVER_MAX_BYTES";
/// The default of [`COPY_DRIVER_MAX_BYTES`]: 256 MiB.
pub const COPY_DRIVER_MAX_BYTES_DEFAULT: usize = 256 << 20;
/// `MSCCLPP_COPY_KERNEL_MAX_BYTES`: world-size-1 GPU copies up to this many bytes use the copy
/// kernel, whatever [`COPY_DRIVER_MAX_BYTES`] says.
pub const COPY_KERNEL_MAX_BYTES: &str = "MSCCLPP_COPY_KERNEL_MAX_BYTES";
/// The default of [`COPY_KERNEL_MAX_BYTES`]: 4 MiB.
pub const COPY_KERNEL_MAX_BYTES_DEFAULT: usize = 4 << 20;
/// `MSCCLPP_P2P_TIMEOUT`: how long a point-to-point batch may make no progress (a receive
/// whose send never comes) before it fails.
pub const P2P_TIMEOUT: &str = "MSCCLPP_P2P_TIMEOUT";
/// The default of [`P2P_TIMEOUT`].
pub const P2P_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// `MSCCLPP_BOOTSTRAP_REFUSED_TIMEOUT`: how long a joining rank keeps retrying a bootstrap
/// root that refuses connections (nothing listens there) before it fails.
pub const BOOTSTRAP_REFUSED_TIMEOUT: &str = "MSCCLPP_BOOTSTRAP_REFUSED_TIMEOUT";
/// The default of [`BOOTSTRAP_REFUSED_TIMEOUT`] for a `UniqueId`, whose root listens from the
/// moment the id is made (an `ip:port` root may start later than its ranks: there the default
/// is the bootstrap's whole timeout).
pub const BOOTSTRAP_REFUSED_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// `MSCCLPP_EXECUTOR_MAX_LANES`: the most GPU blocks ("lanes") the executor's GPU kernel gives
/// one plan thread block (core/src/executor/run/gpu.rs; fewer when the SMs or the message are
/// smaller).
pub const EXECUTOR_MAX_LANES: &str = "MSCCLPP_EXECUTOR_MAX_LANES";
/// The default of [`EXECUTOR_MAX_LANES`].
pub const EXECUTOR_MAX_LANES_DEFAULT: usize = 64;
/// The largest value [`EXECUTOR_MAX_LANES`] takes.
pub const EXECUTOR_MAX_LANES_LIMIT: usize = 64;
/// `MSCCLPP_EXECUTOR_BYTES_PER_LANE`: the executor's GPU kernel gives a plan thread block one
/// more lane per this many bytes of its share of the message (a speed knob: results do not
/// depend on it).
pub const EXECUTOR_BYTES_PER_LANE: &str = "MSCCLPP_EXECUTOR_BYTES_PER_LANE";
/// The default of [`EXECUTOR_BYTES_PER_LANE`] (Simple plans).
pub const EXECUTOR_BYTES_PER_LANE_DEFAULT: usize = 32 << 10;
/// The default of [`EXECUTOR_BYTES_PER_LANE`] for LL (packet) plans.
pub const EXECUTOR_BYTES_PER_LANE_LL: usize = 8 << 10;
/// `MSCCLPP_EXECUTOR_THREADS`: threads per GPU block of the executor's kernel instead of the
/// plan's `num_threads_per_block` (a speed knob: no op depends on the thread count).
pub const EXECUTOR_THREADS: &str = "MSCCLPP_EXECUTOR_THREADS";
/// `MSCCLPP_EXECUTOR_LANE_SYNC`: how the lanes of a plan block meet in the executor's GPU
/// kernel: `async` (default: memory-channel signals and waits and `nop`s cross without a lane
/// barrier where the plan's data needs none; see [`LaneSync`]), `barrier` (every crossing a
/// barrier of all lanes) or `split` (joins where lane 0 needs the others' data, releases
/// where the others need lane 0's synchronisation).
pub const EXECUTOR_LANE_SYNC: &str = "MSCCLPP_EXECUTOR_LANE_SYNC";
/// `MSCCLPP_EXECUTOR_PORT_CHANNELS`: how a plan's port channels run when every rank of the plan
/// is on one node: `auto` (the default) as memory channels over the same connections (copies by
/// the kernel's threads, device semaphores; core/src/executor/ports.rs says which plans keep
/// the proxy), `proxy` through the host proxy as written. Plans across nodes always use the
/// proxy.
pub const EXECUTOR_PORT_CHANNELS: &str = "MSCCLPP_EXECUTOR_PORT_CHANNELS";
/// `MSCCLPP_EXECUTOR_KERNEL`: which build of the executor's GPU kernel a launch takes: `auto`
/// (default; also `prefetch`: whenever the launch has at most 256 threads per block, the
/// 256-thread build, compiled without the 1024-thread build's register bound, whose reductions
/// load the next input while they combine one), `narrow` (there the 256-thread build without
/// that prefetch, round 12's default) or `wide` (the 1024-thread build always). The last two
/// are for A/B runs.
pub const EXECUTOR_KERNEL: &str = "MSCCLPP_EXECUTOR_KERNEL";
/// `MSCCLPP_EXECUTOR_JIT`: whether GPU executions of plans run kernels compiled from the plan at
/// load time (core/src/executor/run/jit.rs; CUDA, with libnvrtc) instead of the interpreter.
/// On by default since its GPU run (docs/executor.md: on an H100 on 2026-12-06 ExecutorTest
/// passed with it at 2 and 4 ranks and 0 wrong values in every timed plan); `0`/`false` turns
/// it off. Without a run-time compiler, or for a plan that does not compile, the interpreter
/// runs.
pub const EXECUTOR_JIT: &str = "MSCCLPP_EXECUTOR_JIT";
/// `MSCCLPP_EXECUTOR_SPLIT_NOPS`: under the async lane sync, which `nop`s whose meeting data
/// the lanes touch from the same threads leave out their lane barrier (`EXEC_OP_LANE_SPLIT`,
/// docs/executor.md): `1`/`all` every such nop (two ops' ranges starting at the same byte on
/// their 16-byte vector paths, or a rank's input against its output in a call where they are
/// apart), `io` only those of the second kind (`EXEC_OP_LANE_SPLIT_IO`), `0` none. Default
/// [`EXECUTOR_SPLIT_NOPS_DEFAULT`].
pub const EXECUTOR_SPLIT_NOPS: &str = "MSCCLPP_EXECUTOR_SPLIT_NOPS";
/// The input/output kind only. ExecutorTest passed with every split nop on an H100 on
/// 2026-12-06 (round 20: 2 and 4 ranks, interpreted and compiled, upstream's plans included), and
/// in the same call's A/B `io` kept `allgather_oop_n2`'s 7-11 % while `1` made upstream's
/// `reduce` and `reduce_tbg` 7-13 % slower at 4 and 16 MiB (docs/perf.md, round 20).
pub const EXECUTOR_SPLIT_NOPS_DEFAULT: SplitNops = SplitNops::Io;
/// `MSCCLPP_EXECUTOR_PACKET_UNROLL`: in compiled plans (`MSCCLPP_EXECUTOR_JIT`), how many
/// packets each thread of a packet op (put, copy, unpack, read-put and the packet reductions)
/// loads before it waits on the first: 1, 2, 4 or 8 (default
/// [`EXECUTOR_PACKET_UNROLL_DEFAULT`]). Which thread handles a packet does not change with it.
/// The interpreter keeps its build's 2.
pub const EXECUTOR_PACKET_UNROLL: &str = "MSCCLPP_EXECUTOR_PACKET_UNROLL";
/// The default of [`EXECUTOR_PACKET_UNROLL`] (the interpreter's).
pub const EXECUTOR_PACKET_UNROLL_DEFAULT: u32 = 2;
/// `MSCCLPP_EXECUTOR_JIT_THREADS`: with [`EXECUTOR_JIT`] on, launches of up to this many threads
/// per GPU block run compiled plans, wider ones the interpreter (default
/// [`EXECUTOR_JIT_THREADS_DEFAULT`]; 1024: every launch; a multiple of 32 from 32 to 1024).
pub const EXECUTOR_JIT_THREADS: &str = "MSCCLPP_EXECUTOR_JIT_THREADS";
/// The default of [`EXECUTOR_JIT_THREADS`]: every launch. Round 15 (H200) found one-lane
/// launches of 1024 threads slower compiled than interpreted, while the generated kernels kept
/// their ops in local memory; without it (round 16, H100, docs/perf.md) they were the fastest
/// (`allreduce_simple_n2` at 16 KiB: 10.53 us against 28.69 interpreted and 29.05 with launches
/// of up to 256 compiled).
pub const EXECUTOR_JIT_THREADS_DEFAULT: u32 = 1024;
/// `MSCCLPP_P2P_TUNE`: knobs of the GPU point-to-point kernels ([`P2pTune`]).
pub const P2P_TUNE: &str = "MSCCLPP_P2P_TUNE";

/// The knobs of the GPU point-to-point kernels (core/src/p2p/gpu.rs, kernels/cuda/src/p2p/
/// batch.cu), from `MSCCLPP_P2P_TUNE`, a comma list of `key=value` (for A/B speed runs; the
/// defaults are the measured choice). Every rank of a communicator must set the same: the
/// point-to-point setup compares them and fails naming both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct P2pTune {
    /// `channels=N`: most channels (rings, and blocks per (peer, direction)) of a chunked
    /// message: 1, 2, 4, 8, 16 (default) or 32; each channel's ring has 64 / N slots.
    pub channels: u32,
    /// `fence=1`: a system-scope fence before each chunk's release store (default 0).
    pub fence: bool,
    /// `unroll=4|8`: 16-byte loads in flight per thread in chunk copies (default 8).
    pub unroll: u32,
    /// `self_spread=0|1`: a copy to self runs over twice the channels, on the blocks of its
    /// receive's pair too (default 1).
    pub self_spread: bool,
    /// `abort_poll=N`: idle rounds of a chunked batch per read of the host's abort word
    /// (host memory; 1 = every round; default 256).
    pub abort_poll: u32,
    /// `packed=0|1`: the chunked kernel's tasks (pair, channel) on consecutive blocks, pair
    /// after pair (1), instead of channel `c` of pair `p` on block `p + c * pairs` (0, the
    /// default); both wrap at the grid size.
    pub packed: bool,
    /// `chunk=128|256|512|1024`: the largest chunk of a message in KiB (default 256, measured
    /// best with `ring=128` on the H200: docs/perf.md); chunks
    /// are a quarter of a channel's share of the message, from 128 KiB up to this. Each
    /// channel's ring then has 64 / (channels x chunk / 128) slots: at most 32 for channels x
    /// chunk / 128 (2 slots a ring at least).
    pub chunk_kib: u32,
    /// `ring=64|128|256`: the ring space per sending peer, in slots of 128 KiB (default 128:
    /// 16 MiB per peer); channels x chunk / 128 may then be up to ring / 2.
    pub ring: u32,
    /// `ll_fit=0|1`: a launch of LL messages only runs one thread per packet of its largest
    /// message (whole warps, up to 512; default 1) instead of 512 always (0).
    pub ll_fit: bool,
    /// `ll_merge=0|1`: a launch of LL messages runs a peer's sends and receives on one block
    /// (1) instead of one block per (peer, direction) (0, the default).
    pub ll_merge: bool,
    /// `direct=N`: an all-to-all captured into a CUDA graph with at least N KiB per rank
    /// registers its receive buffer and every rank writes its blocks straight into the
    /// peers' (one copy instead of two through the rings); 0 = never (default 32: on the H200
    /// shared by 2 ranks, nccl-tests alltoall of 32 KiB per rank took 5.9 us instead of 15.3
    /// on the rings, but at 4 ranks 16 KiB per rank took 7.9 us where LL packets take 6.4;
    /// docs/perf.md).
    pub direct_kib: u32,
}

/// Above this many ranks the unset `MSCCLPP_P2P_TUNE` keeps round 7's smaller chunks and rings
/// ([`P2pTune::default_for`]).
pub const P2P_TUNE_WIDE_RANKS: usize = 8;

impl P2pTune {
    /// The default for a communicator of `nranks`: [`P2pTune::default`] up to
    /// [`P2P_TUNE_WIDE_RANKS`] ranks; above, 128 KiB chunks and 8 MiB of ring per sending peer,
    /// because the GPU buffer holds a ring for every rank (`nranks` x the ring: 128 MiB at 8
    /// ranks with the default, 512 MiB instead of 1 GiB at 64).
    pub fn default_for(nranks: usize) -> P2pTune {
        let t = P2pTune::default();
        if nranks <= P2P_TUNE_WIDE_RANKS {
            return t;
        }
        P2pTune {
            chunk_kib: 128,
            ring: 64,
            ..t
        }
    }
}

impl Default for P2pTune {
    fn default() -> P2pTune {
        P2pTune {
            channels: 16,
            fence: false,
            unroll: 8,
            self_spread: true,
            abort_poll: 256,
            packed: false,
            chunk_kib: 256,
            ring: 128,
            ll_fit: true,
            ll_merge: false,
            direct_kib: 32,
        }
    }
}

/// `MSCCLPP_P2P_TUNE`: unset or blank = the defaults.
fn parse_p2p_tune(value: Option<String>) -> Parsed<P2pTune> {
    let mut t = P2pTune::default();
    let Some(v) = non_empty(value) else {
        return Ok(t);
    };
    let bad = |item: &str, want: &str| format!("{P2P_TUNE}={v}: `{item}`: expected {want}");
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, val) = item
            .split_once('=')
            .map(|(k, x)| (k.trim(), x.trim()))
            .ok_or_else(|| bad(item, "key=value"))?;
        let num = val.parse::<u32>().ok();
        let flag = match val {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        match key {
            "channels" => {
                t.channels = num
                    .filter(|n| n.is_power_of_two() && *n <= 32)
                    .ok_or_else(|| bad(item, "channels=1, 2, 4, 8, 16 or 32"))?
            }
            "fence" => t.fence = flag.ok_or_else(|| bad(item, "fence=0 or 1"))?,
            "unroll" => {
                t.unroll = num
                    .filter(|n| *n == 4 || *n == 8)
                    .ok_or_else(|| bad(item, "unroll=4 or 8"))?
            }
            "self_spread" => t.self_spread = flag.ok_or_else(|| bad(item, "self_spread=0 or 1"))?,
            "packed" => t.packed = flag.ok_or_else(|| bad(item, "packed=0 or 1"))?,
            "ll_fit" => t.ll_fit = flag.ok_or_else(|| bad(item, "ll_fit=0 or 1"))?,
            "ll_merge" => t.ll_merge = flag.ok_or_else(|| bad(item, "ll_merge=0 or 1"))?,
            "direct" => {
                t.direct_kib = num
                    .filter(|n| *n <= 1 << 22)
                    .ok_or_else(|| bad(item, "direct=0 to 4194304 (KiB)"))?
            }
            "ring" => {
                t.ring = num
                    .filter(|n| [64, 128, 256].contains(n))
                    .ok_or_else(|| bad(item, "ring=64, 128 or 256 (slots of 128 KiB per peer)"))?
            }
            "chunk" => {
                t.chunk_kib = num
                    .filter(|n| [128, 256, 512, 1024].contains(n))
                    .ok_or_else(|| bad(item, "chunk=128, 256, 512 or 1024 (KiB)"))?
            }
            "abort_poll" => {
                t.abort_poll = num
                    .filter(|n| (1..=1 << 20).contains(n))
                    .ok_or_else(|| bad(item, "abort_poll=1 to 1048576"))?
            }
            _ => return Err(bad(
                item,
                "one of channels, fence, unroll, self_spread, abort_poll, packed, chunk, ring, \
                     ll_fit, ll_merge, direct",
            )),
        }
    }
    if t.channels * (t.chunk_kib / 128) > t.ring / 2 {
        return Err(format!(
            "{P2P_TUNE}={v}: channels={} with chunk={} and ring={}: expected channels x chunk \
             / 128 <= ring / 2 (each channel's ring keeps 2 slots at least)",
            t.channels, t.chunk_kib, t.ring
        ));
    }
    Ok(t)
}

const fn var(name: &'static str, default: &'static str, doc: &'static str) -> Var {
    Var { name, default, doc }
}

/// Every variable this crate reads, with its default and what it does (the HAL's are in
/// [`mscclpp_hal::env::VARS`]).
pub const VARS: &[Var] = &[
    var(
        "MSCCLPP_LOG_LEVEL",
        "WARN",
        "NONE, VERSION, WARN, INFO, ABORT or TRACE (any case)",
    ),
    var(
        "MSCCLPP_DEBUG",
        "WARN",
        "the log level when MSCCLPP_LOG_LEVEL is unset",
    ),
    var(
        "MSCCLPP_LOG_SUBSYS",
        "ALL",
        "comma list of subsystems to log",
    ),
    var(
        "MSCCLPP_LOG_FILE",
        "stderr",
        "log to this file (%h = host, %p = pid)",
    ),
    var(
        "MSCCLPP_HCA_DEVICES",
        "every IB device",
        "comma list of IB device names",
    ),
    var(
        "MSCCLPP_IBV_SO",
        "the system libibverbs",
        "the libibverbs to load (HAL parser)",
    ),
    var(
        "MSCCLPP_IBV_MODE",
        "host",
        "host or host-no-atomic: how IB connections signal",
    ),
    var(
        "MSCCLPP_IB_GID_INDEX",
        "0",
        "integer >= 0: the GID table index",
    ),
    var(
        "MSCCLPP_IB_MR_PATH",
        "auto",
        "auto, data-direct, dmabuf or plain",
    ),
    var(
        "MSCCLPP_HOSTID",
        "unset",
        "mixed into the host hash (HAL parser)",
    ),
    var(
        "MSCCLPP_SOCKET_IFNAME",
        "any interface",
        "bootstrap interfaces (NCCL syntax)",
    ),
    var(
        "MSCCLPP_BOOTSTRAP_KEY",
        "the launcher's job id",
        "the job key of ip:port bootstraps",
    ),
    var(
        "MSCCLPP_SOCKET_FAMILY",
        "either (IPv4 first)",
        "AF_INET or AF_INET6",
    ),
    var(
        "MSCCLPP_FORCE_DISABLE_NVLS",
        "0",
        "boolean; also NCCL_NVLS_ENABLE=0 (HAL parser)",
    ),
    var(
        "MSCCLPP_FORCE_DISABLE_GDR",
        "0",
        "boolean: turns GDRCopy off (HAL parser)",
    ),
    var(
        "MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM",
        "0",
        "boolean: CudaIpc copies on stream 0",
    ),
    var(
        "MSCCLPP_NCCL_LIB_PATH",
        "unset",
        "the NCCL library to fall back to",
    ),
    var(
        "MSCCLPP_CACHE_DIR",
        "$HOME/.cache/mscclpp",
        "the cache directory",
    ),
    var(
        ALGORITHM,
        "unset",
        "kind=name[,kind=name...] or a bare all-reduce name",
    ),
    var(
        "MSCCLPP_ALLREDUCE_ALGO",
        "the selector's choice",
        "the all-reduce algorithm",
    ),
    var(
        "MSCCLPP_ALLGATHER_ALGO",
        "the selector's choice",
        "the all-gather algorithm",
    ),
    var(
        "MSCCLPP_REDUCESCATTER_ALGO",
        "the selector's choice",
        "the reduce-scatter algorithm",
    ),
    var(
        "MSCCLPP_BROADCAST_ALGO",
        "the selector's choice",
        "the broadcast algorithm",
    ),
    var(
        NVLS_EMULATION,
        "0",
        "0 or 1: the selector may pick NVLS on the host backend",
    ),
    var(
        COLL_NET_TRANSPORT,
        "ib when available, else ethernet",
        "ib or ethernet",
    ),
    var(
        COPY_DRIVER_MAX_BYTES,
        "256M",
        "byte count (K, M, G suffixes)",
    ),
    var(
        COPY_KERNEL_MAX_BYTES,
        "4M",
        "byte count (K, M, G suffixes)",
    ),
    var(
        CHECK_CALLS,
        "0",
        "boolean: compare every call's fingerprint across the ranks before it runs",
    ),
    var(
        DETERMINISTIC,
        "0",
        "boolean: reductions fold the ranks in rank order (bitwise reproducible)",
    ),
    var(
        P2P_TIMEOUT,
        "60",
        "seconds (or 500ms, 2m): a point-to-point batch without progress fails after it",
    ),
    var(
        BOOTSTRAP_REFUSED_TIMEOUT,
        "5 (UniqueId), the bootstrap timeout (ip:port)",
        "seconds (or 500ms, 2m): a root refusing connections this long is an error",
    ),
    var(
        EXECUTOR_MAX_LANES,
        "64",
        "integer 1-64: GPU blocks per plan thread block, at most",
    ),
    var(
        EXECUTOR_BYTES_PER_LANE,
        "32K (LL plans 8K)",
        "byte count 1K-1G: one more executor lane per this many bytes of a block's share",
    ),
    var(
        EXECUTOR_THREADS,
        "the plan's",
        "32-1024, a multiple of 32: executor threads per GPU block",
    ),
    var(
        EXECUTOR_LANE_SYNC,
        "async",
        "barrier, split or async: how the executor's lanes of a plan block meet",
    ),
    var(
        EXECUTOR_PORT_CHANNELS,
        "auto",
        "auto or proxy: port channels of a plan on one node run as memory channels (auto) or through the host proxy",
    ),
    var(
        EXECUTOR_SPLIT_NOPS,
        "io",
        "0, io or 1: under the async lane sync, nops whose data meets on the same threads skip their lane barrier (io: only input against output)",
    ),
    var(
        EXECUTOR_JIT,
        "1",
        "boolean: GPU plans run kernels compiled from the plan at load time (NVRTC), else the interpreter",
    ),
    var(
        EXECUTOR_PACKET_UNROLL,
        "2",
        "1, 2, 4 or 8: packets each thread of a compiled plan's packet op loads before it waits on the first",
    ),
    var(
        EXECUTOR_JIT_THREADS,
        "1024",
        "32-1024, a multiple of 32: the widest launch (threads per GPU block) that runs a compiled plan",
    ),
    var(
        EXECUTOR_KERNEL,
        "auto",
        "auto (or prefetch), narrow or wide: which build of the executor kernel a launch takes",
    ),
    var(
        P2P_TUNE,
        "channels=16,fence=0,unroll=8,self_spread=1,abort_poll=256,packed=0,chunk=256,ring=128,ll_fit=1,ll_merge=0,direct=32 (chunk=128,ring=64 above 8 ranks)",
        "GPU point-to-point knobs (key=value list, the same on every rank)",
    ),
    var("PMIX_NAMESPACE", "unset", "launcher job id (job key)"),
    var(
        "OMPI_MCA_ess_base_jobid",
        "unset",
        "launcher job id (job key)",
    ),
    var(
        "SLURM_JOB_ID",
        "unset",
        "launcher job id (job key, with SLURM_STEP_ID)",
    ),
    var("SLURM_STEP_ID", "unset", "launcher job step (job key)"),
    var("TORCHELASTIC_RUN_ID", "unset", "launcher job id (job key)"),
];

type Parsed<T> = std::result::Result<T, String>;

/// The subsystems `MSCCLPP_LOG_SUBSYS` may name (besides `ALL`): the logger's.
pub const LOG_SUBSYSTEMS: &[&str] = &[
    "BOOTSTRAP",
    "INIT",
    "NET",
    "PROXY",
    "ENV",
    "P2P",
    "COLL",
    "NVLS",
    "EXECUTOR",
    "NCCL",
    "ALLOC",
];

/// `MSCCLPP_LOG_SUBSYS`: `Ok(None)` when unset, blank or naming `ALL`; `Err` naming the
/// unknown names (the filter is then not applied: every subsystem logs).
fn parse_log_subsys(value: Option<String>) -> Parsed<Option<String>> {
    let Some(v) = non_empty(value) else {
        return Ok(None);
    };
    let names: Vec<&str> = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let unknown: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| {
            !n.eq_ignore_ascii_case("ALL")
                && !LOG_SUBSYSTEMS.iter().any(|k| k.eq_ignore_ascii_case(n))
        })
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "MSCCLPP_LOG_SUBSYS={v}: unknown subsystem(s) {}: expected a comma list of ALL, {} \
             (the filter is ignored: every subsystem logs)",
            unknown.join(", "),
            LOG_SUBSYSTEMS.join(", ")
        ));
    }
    Ok((!names.iter().any(|n| n.eq_ignore_ascii_case("ALL"))).then_some(v))
}

/// Every `MSCCLPP_*` variable this crate reads, parsed once.
#[derive(Debug, Clone)]
pub struct Env {
    log_level: Parsed<LogLevel>,
    log_subsys: Parsed<Option<String>>,
    log_file: Option<PathBuf>,
    hca_devices: Vec<String>,
    ibv_so: Option<PathBuf>,
    ibv_mode: Parsed<IbvMode>,
    ib_gid_index: Parsed<u32>,
    ib_mr_path: Parsed<IbMrPath>,
    hostid: Option<String>,
    socket_ifname: Option<String>,
    bootstrap_key: Option<String>,
    socket_family: Parsed<Option<SocketFamily>>,
    force_disable_nvls: Parsed<bool>,
    force_disable_gdr: Parsed<bool>,
    cudaipc_use_default_stream: Parsed<bool>,
    nccl_lib_path: Option<PathBuf>,
    cache_dir: Parsed<PathBuf>,
    forced_algorithms: Parsed<Vec<ForcedAlgorithm>>,
    nvls_emulation: Parsed<bool>,
    coll_net_transport: Parsed<Option<NetTransport>>,
    copy_driver_max_bytes: Parsed<usize>,
    copy_kernel_max_bytes: Parsed<usize>,
    check_calls: Parsed<bool>,
    deterministic: Parsed<bool>,
    p2p_timeout: Parsed<Option<Duration>>,
    bootstrap_refused_timeout: Parsed<Option<Duration>>,
    p2p_tune: Parsed<P2pTune>,
    p2p_tune_given: bool,
    executor_max_lanes: Parsed<usize>,
    executor_bytes_per_lane: Parsed<Option<usize>>,
    executor_threads: Parsed<Option<u32>>,
    executor_lane_sync: Parsed<LaneSync>,
    executor_port_channels: Parsed<PortChannels>,
    executor_jit: Parsed<Option<bool>>,
    executor_split_nops: Parsed<Option<SplitNops>>,
    executor_jit_threads: Parsed<Option<u32>>,
    executor_packet_unroll: Parsed<Option<u32>>,
    executor_kernel: Parsed<ExecutorKernel>,
    launcher_job: Vec<(&'static str, String)>,
}

/// The process environment, read on first use and never again.
pub fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(Env::current)
}

/// The message of an [`Error`] as [`Env`] keeps it (the accessors wrap it in
/// [`Error::InvalidUsage`] again).
fn message(e: Error) -> String {
    match e {
        Error::InvalidUsage(m) => m,
        other => other.to_string(),
    }
}

/// `MSCCLPP_ALGORITHM` then each `MSCCLPP_<KIND>_ALGO`, in that order (a later one wins).
fn parse_forced(lookup: &impl Fn(&str) -> Option<String>) -> Parsed<Vec<ForcedAlgorithm>> {
    let mut forced = Vec::new();
    if let Some(v) = lookup(ALGORITHM).filter(|v| !v.trim().is_empty()) {
        for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (kind, name) = match item.split_once('=') {
                Some((k, n)) => (
                    k.trim().parse::<CollectiveKind>().map_err(message)?,
                    n.trim(),
                ),
                None => (CollectiveKind::AllReduce, item),
            };
            forced.push(ForcedAlgorithm {
                kind,
                name: name.to_string(),
                var: ALGORITHM,
                value: v.clone(),
            });
        }
    }
    for kind in CollectiveKind::ALL {
        if let Some(v) = lookup(kind.env_var()).filter(|v| !v.trim().is_empty()) {
            forced.push(ForcedAlgorithm {
                kind,
                name: v.trim().to_string(),
                var: kind.env_var(),
                value: v,
            });
        }
    }
    Ok(forced)
}

/// `MSCCLPP_NVLS_EMULATION`: `0`, empty or unset = false, `1` = true.
fn parse_nvls_emulation(value: Option<String>) -> Parsed<bool> {
    match value.as_deref().map(str::trim) {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(format!(
            "{NVLS_EMULATION}={v}: expected 0 or 1 (1 lets the selector pick the NVLS \
             all-reduces on the host backend's multicast emulation)"
        )),
    }
}

/// `MSCCLPP_COLL_NET_TRANSPORT`: `ib` or `ethernet` (any case); unset or blank = `None`.
fn parse_net_transport(value: Option<String>) -> Parsed<Option<NetTransport>> {
    match value.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) if v.eq_ignore_ascii_case("ib") => Ok(Some(NetTransport::Ib)),
        Some(v) if v.eq_ignore_ascii_case("ethernet") => Ok(Some(NetTransport::Ethernet)),
        Some(v) => Err(format!(
            "{COLL_NET_TRANSPORT}={v}: expected one of ib, ethernet"
        )),
    }
}

/// `name` (`MSCCLPP_COPY_DRIVER_MAX_BYTES`, `MSCCLPP_COPY_KERNEL_MAX_BYTES`): a byte count
/// with an optional K, M or G suffix; `default` when unset or empty.
fn parse_bytes(name: &str, value: Option<String>, default: usize) -> Parsed<usize> {
    let Some(v) = value.as_deref().map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(default);
    };
    let (digits, shift) = match v.as_bytes()[v.len() - 1].to_ascii_uppercase() {
        b'K' => (&v[..v.len() - 1], 10),
        b'M' => (&v[..v.len() - 1], 20),
        b'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1usize << shift))
        .ok_or_else(|| {
            format!("{name}={v}: expected a byte count such as 0, 65536, 64K, 256M or 1G")
        })
}

/// `MSCCLPP_EXECUTOR_MAX_LANES`: an integer from 1 to [`EXECUTOR_MAX_LANES_LIMIT`].
fn parse_max_lanes(value: Option<String>) -> Parsed<usize> {
    let Some(v) = non_empty(value) else {
        return Ok(EXECUTOR_MAX_LANES_DEFAULT);
    };
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=EXECUTOR_MAX_LANES_LIMIT).contains(n))
        .ok_or_else(|| {
            format!(
                "{EXECUTOR_MAX_LANES}={v}: expected an integer from 1 to \
                 {EXECUTOR_MAX_LANES_LIMIT}"
            )
        })
}

/// `MSCCLPP_EXECUTOR_BYTES_PER_LANE`: a byte count from 1K to 1G; unset or blank = `None`.
fn parse_bytes_per_lane(value: Option<String>) -> Parsed<Option<usize>> {
    let Some(v) = non_empty(value) else {
        return Ok(None);
    };
    parse_bytes(
        EXECUTOR_BYTES_PER_LANE,
        Some(v.clone()),
        EXECUTOR_BYTES_PER_LANE_DEFAULT,
    )
    .ok()
    .filter(|n| (1 << 10..=1 << 30).contains(n))
    .map(Some)
    .ok_or_else(|| {
        format!(
            "{EXECUTOR_BYTES_PER_LANE}={}: expected a byte count from 1K to 1G such as 8K or 32768",
            v.trim()
        )
    })
}

/// `MSCCLPP_EXECUTOR_PACKET_UNROLL`: 1, 2, 4 or 8; unset or blank = `None`.
fn parse_packet_unroll(value: Option<String>) -> Parsed<Option<u32>> {
    let Some(v) = non_empty(value) else {
        return Ok(None);
    };
    v.parse::<u32>()
        .ok()
        .filter(|n| matches!(n, 1 | 2 | 4 | 8))
        .map(Some)
        .ok_or_else(|| format!("{EXECUTOR_PACKET_UNROLL}={v}: expected 1, 2, 4 or 8"))
}

/// `MSCCLPP_EXECUTOR_THREADS` and `MSCCLPP_EXECUTOR_JIT_THREADS` (`name`): 32 to 1024 in steps
/// of 32; unset or blank = `None`.
fn parse_threads(name: &str, value: Option<String>) -> Parsed<Option<u32>> {
    let Some(v) = non_empty(value) else {
        return Ok(None);
    };
    v.parse::<u32>()
        .ok()
        .filter(|n| (32..=1024).contains(n) && n % 32 == 0)
        .map(Some)
        .ok_or_else(|| format!("{name}={v}: expected a multiple of 32 from 32 to 1024"))
}

/// How the lanes (GPU blocks) of one plan block meet in the executor's GPU kernel
/// (`MSCCLPP_EXECUTOR_LANE_SYNC`; `ExecArgs.laneSync` is its code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LaneSync {
    /// Every crossing is a barrier of all lanes (code 0).
    Barrier,
    /// Joins and releases, each in the one direction it needs (code 1).
    Split,
    /// The default (code 2; `EXEC_OP_LANE_ASYNC`): a memory-channel signal after data is sent
    /// by the last lane to arrive, every lane counts a memory-channel wait and waits for it
    /// before its next data op, a grid barrier is one barrier of every lane, and a `nop` is a
    /// lane barrier only where the lowering found data of one lane that another reads or
    /// writes after it. Plans where two waited-on channels share a semaphore take `Barrier`.
    #[default]
    Async,
}

impl LaneSync {
    /// `ExecArgs.laneSync`.
    pub fn code(self) -> u32 {
        match self {
            LaneSync::Barrier => 0,
            LaneSync::Split => 1,
            LaneSync::Async => 2,
        }
    }
}

/// `MSCCLPP_EXECUTOR_LANE_SYNC`: `async` (also unset or blank), `barrier` or `split`, any case.
fn parse_lane_sync(value: Option<String>) -> Parsed<LaneSync> {
    match non_empty(value) {
        None => Ok(LaneSync::Async),
        Some(v) if v.eq_ignore_ascii_case("barrier") => Ok(LaneSync::Barrier),
        Some(v) if v.eq_ignore_ascii_case("split") => Ok(LaneSync::Split),
        Some(v) if v.eq_ignore_ascii_case("async") => Ok(LaneSync::Async),
        Some(v) => Err(format!(
            "{EXECUTOR_LANE_SYNC}={v}: expected barrier, split or async"
        )),
    }
}

/// How a plan's port channels run when all its ranks share a node
/// (`MSCCLPP_EXECUTOR_PORT_CHANNELS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PortChannels {
    /// As memory channels over the same connections (`auto`, the default).
    #[default]
    Auto,
    /// Through the host proxy, as the plan says (`proxy`).
    Proxy,
}

impl PortChannels {
    /// The setting spelled `name` (`auto` or `proxy`, lower case), or `None`.
    pub fn from_name(name: &str) -> Option<PortChannels> {
        match name {
            "auto" => Some(PortChannels::Auto),
            "proxy" => Some(PortChannels::Proxy),
            _ => None,
        }
    }
}

/// `MSCCLPP_EXECUTOR_PORT_CHANNELS`: `auto` (also unset or blank) or `proxy`, any case.
fn parse_port_channels(value: Option<String>) -> Parsed<PortChannels> {
    match non_empty(value) {
        None => Ok(PortChannels::Auto),
        Some(v) => PortChannels::from_name(&v.to_ascii_lowercase())
            .ok_or_else(|| format!("{EXECUTOR_PORT_CHANNELS}={v}: expected auto or proxy")),
    }
}

/// Which of the lowering's split nops leave out their lane barrier
/// (`MSCCLPP_EXECUTOR_SPLIT_NOPS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitNops {
    /// None: every marked nop keeps its lane barrier (`0`, `false`, `off`).
    Off,
    /// Only those whose meeting data is this rank's input against its output
    /// (`EXEC_OP_LANE_SPLIT_IO`; `io`).
    Io,
    /// Every marked nop (`1`, `true`, `on`, `all`).
    All,
}

/// `MSCCLPP_EXECUTOR_SPLIT_NOPS`: `io`, `all`, or a boolean of [`parse_bool`] (on: all, off:
/// none), any case; unset or blank: `None` (the default).
fn parse_split_nops(value: Option<String>) -> Parsed<Option<SplitNops>> {
    let Some(v) = non_empty(value) else {
        return Ok(None);
    };
    if v.eq_ignore_ascii_case("io") {
        return Ok(Some(SplitNops::Io));
    }
    if v.eq_ignore_ascii_case("all") {
        return Ok(Some(SplitNops::All));
    }
    parse_bool(EXECUTOR_SPLIT_NOPS, Some(&v))
        .map(|on| Some(if on { SplitNops::All } else { SplitNops::Off }))
        .map_err(|_| {
            format!(
                "{EXECUTOR_SPLIT_NOPS}={v}: expected 0, io or 1 (off, input/output nops only, all)"
            )
        })
}

/// Which build of the executor's GPU kernel launches take (`MSCCLPP_EXECUTOR_KERNEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutorKernel {
    /// The 256-thread prefetch build when the launch fits it, else the 1024-thread one
    /// (`auto`, `prefetch`).
    #[default]
    Auto,
    /// The 1024-thread build always.
    Wide,
    /// The 256-thread build without the reductions' prefetch when the launch fits it, else the
    /// 1024-thread one.
    Narrow,
}

/// `MSCCLPP_EXECUTOR_KERNEL`: `auto` or `prefetch` (also unset or blank), `narrow` or `wide`,
/// any case.
fn parse_executor_kernel(value: Option<String>) -> Parsed<ExecutorKernel> {
    match non_empty(value) {
        None => Ok(ExecutorKernel::Auto),
        Some(v) if v.eq_ignore_ascii_case("auto") || v.eq_ignore_ascii_case("prefetch") => {
            Ok(ExecutorKernel::Auto)
        }
        Some(v) if v.eq_ignore_ascii_case("wide") => Ok(ExecutorKernel::Wide),
        Some(v) if v.eq_ignore_ascii_case("narrow") => Ok(ExecutorKernel::Narrow),
        Some(v) => Err(format!(
            "{EXECUTOR_KERNEL}={v}: expected auto, prefetch, narrow or wide"
        )),
    }
}

/// A duration variable: seconds (`30`, `2.5`, `30s`), milliseconds (`500ms`) or minutes
/// (`2m`), above zero and at most a year; unset or blank = `None` (the caller's default).
fn parse_duration(name: &str, value: Option<String>) -> Parsed<Option<Duration>> {
    let Some(v) = non_empty(value) else {
        return Ok(None);
    };
    let lower = v.to_ascii_lowercase();
    let (digits, unit) = if let Some(d) = lower.strip_suffix("ms") {
        (d, 1e-3)
    } else if let Some(d) = lower.strip_suffix('s') {
        (d, 1.0)
    } else if let Some(d) = lower.strip_suffix('m') {
        (d, 60.0)
    } else {
        (lower.as_str(), 1.0)
    };
    digits
        .trim()
        .parse::<f64>()
        .ok()
        .map(|x| x * unit)
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 365.0 * 86400.0)
        .map(|s| Some(Duration::from_secs_f64(s)))
        .ok_or_else(|| {
            format!(
                "{name}={v}: expected a duration above 0 such as 30 (seconds), 2.5, 500ms or 2m"
            )
        })
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.and_then(|v| {
        let t = v.trim();
        (!t.is_empty()).then(|| t.to_string())
    })
}

impl Env {
    /// The process environment as it is now (read again at every call, unlike [`env()`]):
    /// for the variables read per communicator.
    pub fn current() -> Env {
        Env::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds an `Env` from `lookup(name)`, which returns the value of variable `name` if set.
    /// [`env()`] uses `std::env::var`; tests pass a map.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Env {
        let log_level = match (
            non_empty(lookup("MSCCLPP_LOG_LEVEL")).map(|v| ("MSCCLPP_LOG_LEVEL", v)),
            non_empty(lookup("MSCCLPP_DEBUG")).map(|v| ("MSCCLPP_DEBUG", v)),
        ) {
            (Some((name, v)), _) | (None, Some((name, v))) => {
                LogLevel::parse(&v).ok_or_else(|| {
                    format!("{name}={v}: expected one of NONE, VERSION, WARN, INFO, ABORT, TRACE")
                })
            }
            (None, None) => Ok(LogLevel::Warn),
        };

        let ibv_mode = match non_empty(lookup("MSCCLPP_IBV_MODE")) {
            None => Ok(IbvMode::Host),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "host" => Ok(IbvMode::Host),
                "host-no-atomic" => Ok(IbvMode::HostNoAtomic),
                _ => Err(format!(
                    "MSCCLPP_IBV_MODE={v}: expected one of host, host-no-atomic"
                )),
            },
        };

        let ib_gid_index = match non_empty(lookup("MSCCLPP_IB_GID_INDEX")) {
            None => Ok(0),
            Some(v) => v.parse::<u32>().map_err(|_| {
                format!("MSCCLPP_IB_GID_INDEX={v}: expected an integer >= 0 (a GID table index)")
            }),
        };

        let ib_mr_path = match non_empty(lookup("MSCCLPP_IB_MR_PATH")) {
            None => Ok(IbMrPath::Auto),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "auto" => Ok(IbMrPath::Auto),
                "data-direct" => Ok(IbMrPath::DataDirect),
                "dmabuf" => Ok(IbMrPath::DmaBuf),
                "plain" => Ok(IbMrPath::Plain),
                _ => Err(format!(
                    "MSCCLPP_IB_MR_PATH={v}: expected one of auto, data-direct, dmabuf, plain"
                )),
            },
        };

        let socket_family = match non_empty(lookup("MSCCLPP_SOCKET_FAMILY")) {
            None => Ok(None),
            Some(v) => match v.to_ascii_uppercase().as_str() {
                "AF_INET" => Ok(Some(SocketFamily::Inet)),
                "AF_INET6" => Ok(Some(SocketFamily::Inet6)),
                _ => Err(format!(
                    "MSCCLPP_SOCKET_FAMILY={v}: expected one of AF_INET, AF_INET6"
                )),
            },
        };

        // One parser for the NVLS switches: the HAL's, which also guards multicast creation.
        let force_disable_nvls = mscclpp_hal::parse_nvls_switches(&lookup);

        let cache_dir = match non_empty(lookup("MSCCLPP_CACHE_DIR")) {
            Some(v) => Ok(PathBuf::from(v)),
            None => match non_empty(lookup("HOME")) {
                Some(home) => Ok(Path::new(&home).join(".cache").join("mscclpp")),
                None => Err(
                    "MSCCLPP_CACHE_DIR and HOME are both unset: expected one of them to name \
                     a directory for the cache (default ~/.cache/mscclpp)"
                        .to_string(),
                ),
            },
        };

        Env {
            log_level,
            log_subsys: parse_log_subsys(lookup("MSCCLPP_LOG_SUBSYS")),
            log_file: non_empty(lookup("MSCCLPP_LOG_FILE")).map(PathBuf::from),
            hca_devices: lookup("MSCCLPP_HCA_DEVICES")
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            ibv_so: parse_library_path(lookup("MSCCLPP_IBV_SO").map(Into::into)),
            ibv_mode,
            ib_gid_index,
            ib_mr_path,
            hostid: parse_hostid(lookup("MSCCLPP_HOSTID")),
            socket_ifname: non_empty(lookup("MSCCLPP_SOCKET_IFNAME")),
            bootstrap_key: non_empty(lookup("MSCCLPP_BOOTSTRAP_KEY")),
            socket_family,
            force_disable_nvls,
            force_disable_gdr: parse_bool(
                "MSCCLPP_FORCE_DISABLE_GDR",
                lookup("MSCCLPP_FORCE_DISABLE_GDR").as_deref(),
            ),
            cudaipc_use_default_stream: parse_bool(
                "MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM",
                lookup("MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM").as_deref(),
            ),
            nccl_lib_path: non_empty(lookup("MSCCLPP_NCCL_LIB_PATH")).map(PathBuf::from),
            cache_dir,
            forced_algorithms: parse_forced(&lookup),
            nvls_emulation: parse_nvls_emulation(lookup(NVLS_EMULATION)),
            coll_net_transport: parse_net_transport(lookup(COLL_NET_TRANSPORT)),
            copy_driver_max_bytes: parse_bytes(
                COPY_DRIVER_MAX_BYTES,
                lookup(COPY_DRIVER_MAX_BYTES),
                COPY_DRIVER_MAX_BYTES_DEFAULT,
            ),
            copy_kernel_max_bytes: parse_bytes(
                COPY_KERNEL_MAX_BYTES,
                lookup(COPY_KERNEL_MAX_BYTES),
                COPY_KERNEL_MAX_BYTES_DEFAULT,
            ),
            check_calls: parse_bool(CHECK_CALLS, lookup(CHECK_CALLS).as_deref()),
            deterministic: parse_bool(DETERMINISTIC, lookup(DETERMINISTIC).as_deref()),
            p2p_timeout: parse_duration(P2P_TIMEOUT, lookup(P2P_TIMEOUT)),
            bootstrap_refused_timeout: parse_duration(
                BOOTSTRAP_REFUSED_TIMEOUT,
                lookup(BOOTSTRAP_REFUSED_TIMEOUT),
            ),
            p2p_tune: parse_p2p_tune(lookup(P2P_TUNE)),
            p2p_tune_given: non_empty(lookup(P2P_TUNE)).is_some(),
            executor_max_lanes: parse_max_lanes(lookup(EXECUTOR_MAX_LANES)),
            executor_bytes_per_lane: parse_bytes_per_lane(lookup(EXECUTOR_BYTES_PER_LANE)),
            executor_threads: parse_threads(EXECUTOR_THREADS, lookup(EXECUTOR_THREADS)),
            executor_jit_threads: parse_threads(EXECUTOR_JIT_THREADS, lookup(EXECUTOR_JIT_THREADS)),
            executor_packet_unroll: parse_packet_unroll(lookup(EXECUTOR_PACKET_UNROLL)),
            executor_lane_sync: parse_lane_sync(lookup(EXECUTOR_LANE_SYNC)),
            executor_port_channels: parse_port_channels(lookup(EXECUTOR_PORT_CHANNELS)),
            // Unset or blank: the default (on), not parse_bool's false.
            executor_jit: non_empty(lookup(EXECUTOR_JIT))
                .map(|v| parse_bool(EXECUTOR_JIT, Some(&v)))
                .transpose(),
            executor_split_nops: parse_split_nops(lookup(EXECUTOR_SPLIT_NOPS)),
            executor_kernel: parse_executor_kernel(lookup(EXECUTOR_KERNEL)),
            launcher_job: LAUNCHER_JOB_VARS
                .iter()
                .filter_map(|&name| lookup(name).map(|v| (name, v)))
                .collect(),
        }
    }

    fn typed<T: Clone>(p: &Parsed<T>) -> Result<T> {
        p.clone().map_err(Error::InvalidUsage)
    }

    /// `MSCCLPP_LOG_LEVEL`, else `MSCCLPP_DEBUG` (NONE|VERSION|WARN|INFO|ABORT|TRACE, any
    /// case); WARN when both are unset.
    pub fn log_level(&self) -> Result<LogLevel> {
        Self::typed(&self.log_level)
    }
    /// `MSCCLPP_LOG_SUBSYS`: comma list of subsystems to log (unset or `ALL` = all).
    pub fn log_subsys(&self) -> Option<&str> {
        self.log_subsys.as_ref().ok().and_then(Option::as_deref)
    }

    /// Every variable whose value is malformed, one message each naming the variable, the
    /// value and what was expected (the logger warns them on its first use). Such a variable
    /// falls back as its accessor says (the NVLS switches: disabled); the accessors that
    /// return `Result` refuse it where it is used.
    pub fn problems(&self) -> Vec<String> {
        fn err<T>(p: &Parsed<T>) -> Option<&String> {
            p.as_ref().err()
        }
        let level = err(&self.log_level).map(|e| format!("{e}; using WARN"));
        #[rustfmt::skip] // one line per group of fields, not one per field
        let others = [
            err(&self.log_subsys), err(&self.ibv_mode), err(&self.ib_gid_index),
            err(&self.ib_mr_path), err(&self.socket_family), err(&self.force_disable_nvls),
            err(&self.force_disable_gdr), err(&self.cudaipc_use_default_stream),
            err(&self.forced_algorithms), err(&self.nvls_emulation),
            err(&self.coll_net_transport), err(&self.copy_driver_max_bytes),
            err(&self.copy_kernel_max_bytes),
            err(&self.check_calls), err(&self.deterministic), err(&self.p2p_timeout),
            err(&self.bootstrap_refused_timeout), err(&self.p2p_tune),
            err(&self.executor_max_lanes), err(&self.executor_bytes_per_lane),
            err(&self.executor_threads), err(&self.executor_lane_sync),
            err(&self.executor_port_channels),
            err(&self.executor_kernel), err(&self.executor_jit),
            err(&self.executor_jit_threads), err(&self.executor_split_nops),
            err(&self.executor_packet_unroll),
        ];
        level
            .into_iter()
            .chain(others.into_iter().flatten().cloned())
            .collect()
    }
    /// `MSCCLPP_LOG_FILE`: log to this file instead of stderr (`%h` = host, `%p` = pid).
    pub fn log_file(&self) -> Option<&Path> {
        self.log_file.as_deref()
    }
    /// `MSCCLPP_HCA_DEVICES`: comma list of IB device names (empty when unset).
    pub fn hca_devices(&self) -> &[String] {
        &self.hca_devices
    }
    /// `MSCCLPP_IBV_SO`: the libibverbs to load instead of the system one.
    pub fn ibv_so(&self) -> Option<&Path> {
        self.ibv_so.as_deref()
    }
    /// `MSCCLPP_IBV_MODE`: `host` or `host-no-atomic`; unset = `host`.
    pub fn ibv_mode(&self) -> Result<IbvMode> {
        Self::typed(&self.ibv_mode)
    }
    /// `MSCCLPP_IB_GID_INDEX`: integer >= 0, default 0.
    pub fn ib_gid_index(&self) -> Result<u32> {
        Self::typed(&self.ib_gid_index)
    }
    /// `MSCCLPP_HOSTID`: mixed into the host hash, to tell apart hosts with one hostname.
    pub fn hostid(&self) -> Option<&str> {
        self.hostid.as_deref()
    }
    /// `MSCCLPP_SOCKET_IFNAME`: interface selection for bootstrap sockets (NCCL syntax:
    /// comma list of prefixes, `^` excludes, `=` matches exactly).
    pub fn socket_ifname(&self) -> Option<&str> {
        self.socket_ifname.as_deref()
    }
    /// `MSCCLPP_BOOTSTRAP_KEY`: the job key of `ip:port` bootstraps (any string; every rank of
    /// a job sets the same one, so ranks of another job at the same address are refused).
    pub fn bootstrap_key(&self) -> Option<&str> {
        self.bootstrap_key.as_deref()
    }
    /// `MSCCLPP_SOCKET_FAMILY`: `AF_INET` or `AF_INET6`; unset = either (IPv4 preferred).
    pub fn socket_family(&self) -> Result<Option<SocketFamily>> {
        Self::typed(&self.socket_family)
    }
    /// `MSCCLPP_FORCE_DISABLE_NVLS`, also true when `NCCL_NVLS_ENABLE=0`
    /// ([`mscclpp_hal::parse_nvls_switches`]). A malformed value is an error here, and the
    /// library keeps NVLS disabled meanwhile (fail closed).
    pub fn force_disable_nvls(&self) -> Result<bool> {
        Self::typed(&self.force_disable_nvls)
    }
    /// `MSCCLPP_IB_MR_PATH`: auto | data-direct | dmabuf | plain (default auto).
    pub fn ib_mr_path(&self) -> Result<IbMrPath> {
        Self::typed(&self.ib_mr_path)
    }
    /// `MSCCLPP_FORCE_DISABLE_GDR`.
    pub fn force_disable_gdr(&self) -> Result<bool> {
        Self::typed(&self.force_disable_gdr)
    }
    /// `MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM`.
    pub fn cudaipc_use_default_stream(&self) -> Result<bool> {
        Self::typed(&self.cudaipc_use_default_stream)
    }
    /// `MSCCLPP_NCCL_LIB_PATH`: the NCCL library to fall back to.
    pub fn nccl_lib_path(&self) -> Option<&Path> {
        self.nccl_lib_path.as_deref()
    }
    /// `MSCCLPP_CACHE_DIR`, default `$HOME/.cache/mscclpp`.
    pub fn cache_dir(&self) -> Result<PathBuf> {
        Self::typed(&self.cache_dir)
    }

    /// The algorithms `MSCCLPP_ALGORITHM` (`kind=name[,kind=name...]`, a bare name meaning
    /// all-reduce) and then `MSCCLPP_ALLREDUCE_ALGO`, `MSCCLPP_ALLGATHER_ALGO`,
    /// `MSCCLPP_REDUCESCATTER_ALGO`, `MSCCLPP_BROADCAST_ALGO` force, in that order (a later one
    /// for the same collective wins); empty when none is set. An unknown collective kind is an
    /// error here; an unknown algorithm name is one when the collectives look it up.
    pub fn forced_algorithms(&self) -> Result<Vec<ForcedAlgorithm>> {
        Self::typed(&self.forced_algorithms)
    }
    /// `MSCCLPP_NVLS_EMULATION`: `1` lets the selector pick the NVLS all-reduces on the host
    /// backend's multicast emulation; `0`, empty or unset (the default) only when forced.
    pub fn nvls_emulation(&self) -> Result<bool> {
        Self::typed(&self.nvls_emulation)
    }
    /// `MSCCLPP_CHECK_CALLS`: every call is compared across the ranks before it runs (default
    /// off).
    pub fn check_calls(&self) -> Result<bool> {
        Self::typed(&self.check_calls)
    }
    /// `MSCCLPP_DETERMINISTIC`: reductions only by algorithms that fold the ranks in rank order
    /// (default off).
    pub fn deterministic(&self) -> Result<bool> {
        Self::typed(&self.deterministic)
    }
    /// `MSCCLPP_P2P_TUNE`: the GPU point-to-point knobs ([`P2pTune`]; the defaults when unset).
    pub fn p2p_tune(&self) -> Result<P2pTune> {
        Self::typed(&self.p2p_tune)
    }
    /// The point-to-point knobs for a communicator of `nranks`: `MSCCLPP_P2P_TUNE`'s when set,
    /// else [`P2pTune::default_for`]`(nranks)`.
    pub fn p2p_tune_for(&self, nranks: usize) -> Result<P2pTune> {
        if self.p2p_tune_given {
            self.p2p_tune()
        } else {
            Ok(P2pTune::default_for(nranks))
        }
    }
    /// `MSCCLPP_COLL_NET_TRANSPORT`: `ib` or `ethernet` (any case); `None` when unset, and the
    /// collectives then take IB when a device is available, else Ethernet.
    pub fn coll_net_transport(&self) -> Result<Option<NetTransport>> {
        Self::typed(&self.coll_net_transport)
    }
    /// `MSCCLPP_COPY_DRIVER_MAX_BYTES`: the largest world-size-1 GPU copy done by the driver's
    /// memcpy rather than the copy kernel (a byte count, `K`/`M`/`G` suffixes; default 256M).
    pub fn copy_driver_max_bytes(&self) -> Result<usize> {
        Self::typed(&self.copy_driver_max_bytes)
    }
    /// `MSCCLPP_COPY_KERNEL_MAX_BYTES`: world-size-1 GPU copies up to this many bytes use the
    /// copy kernel before [`Env::copy_driver_max_bytes`] is asked (a byte count, `K`/`M`/`G`
    /// suffixes; default 4M; `0`: none).
    pub fn copy_kernel_max_bytes(&self) -> Result<usize> {
        Self::typed(&self.copy_kernel_max_bytes)
    }
    /// `MSCCLPP_EXECUTOR_MAX_LANES`: the most GPU blocks the executor gives one plan thread
    /// block (default [`EXECUTOR_MAX_LANES_DEFAULT`]); a malformed value is warned about at
    /// startup and the default used.
    pub fn executor_max_lanes(&self) -> usize {
        self.executor_max_lanes
            .clone()
            .unwrap_or(EXECUTOR_MAX_LANES_DEFAULT)
    }
    /// `MSCCLPP_EXECUTOR_BYTES_PER_LANE`: one more lane of the executor's GPU kernel per this
    /// many bytes of a plan block's share, for every plan (`None`, unset: the executor's
    /// defaults, [`EXECUTOR_BYTES_PER_LANE_DEFAULT`] and [`EXECUTOR_BYTES_PER_LANE_LL`]); a
    /// malformed value is warned about at startup and ignored.
    pub fn executor_bytes_per_lane(&self) -> Option<usize> {
        self.executor_bytes_per_lane.clone().ok().flatten()
    }
    /// `MSCCLPP_EXECUTOR_THREADS`: threads per GPU block of the executor's kernel in place of
    /// the plan's (`None`: the plan's); a malformed value is warned about at startup and
    /// ignored.
    pub fn executor_threads(&self) -> Option<u32> {
        self.executor_threads.clone().ok().flatten()
    }
    /// `MSCCLPP_EXECUTOR_LANE_SYNC`: how the executor's lanes meet (default
    /// [`LaneSync::Async`]); a malformed value is warned about at startup and the default
    /// used.
    pub fn executor_lane_sync(&self) -> LaneSync {
        self.executor_lane_sync.clone().unwrap_or_default()
    }
    /// `MSCCLPP_EXECUTOR_PORT_CHANNELS`: how port channels of plans on one node run (default
    /// [`PortChannels::Auto`]); a malformed value is warned about at startup and the default
    /// used.
    pub fn executor_port_channels(&self) -> PortChannels {
        self.executor_port_channels.clone().unwrap_or_default()
    }
    /// `MSCCLPP_EXECUTOR_JIT`: whether GPU plans run kernels compiled from the plan (default
    /// on); a malformed value is warned about at startup and the default used.
    pub fn executor_jit(&self) -> bool {
        self.executor_jit.clone().ok().flatten().unwrap_or(true)
    }
    /// `MSCCLPP_EXECUTOR_SPLIT_NOPS`: which of the lowering's split nops leave out their lane
    /// barrier where the kernel finds the data on the same threads (default
    /// [`EXECUTOR_SPLIT_NOPS_DEFAULT`]); a malformed value is warned about at startup and the
    /// default used.
    pub fn executor_split_nops(&self) -> SplitNops {
        self.executor_split_nops
            .clone()
            .ok()
            .flatten()
            .unwrap_or(EXECUTOR_SPLIT_NOPS_DEFAULT)
    }
    /// `MSCCLPP_EXECUTOR_PACKET_UNROLL`: packets per thread in flight in a compiled plan's packet
    /// ops (default [`EXECUTOR_PACKET_UNROLL_DEFAULT`]); a malformed value is warned about at
    /// startup and the default used.
    pub fn executor_packet_unroll(&self) -> u32 {
        self.executor_packet_unroll
            .clone()
            .ok()
            .flatten()
            .unwrap_or(EXECUTOR_PACKET_UNROLL_DEFAULT)
    }
    /// `MSCCLPP_EXECUTOR_JIT_THREADS`: the widest launch (threads per GPU block) that runs a
    /// compiled plan (default [`EXECUTOR_JIT_THREADS_DEFAULT`]); a malformed value is warned
    /// about at startup and the default used.
    pub fn executor_jit_threads(&self) -> u32 {
        self.executor_jit_threads
            .clone()
            .ok()
            .flatten()
            .unwrap_or(EXECUTOR_JIT_THREADS_DEFAULT)
    }
    /// `MSCCLPP_EXECUTOR_KERNEL`: which build of the executor's kernel launches take
    /// ([`ExecutorKernel`], default `auto`); a malformed value is warned about at startup and
    /// the default used.
    pub fn executor_kernel(&self) -> ExecutorKernel {
        self.executor_kernel.clone().unwrap_or_default()
    }
    /// `MSCCLPP_P2P_TIMEOUT`: how long a point-to-point batch may make no progress before it
    /// fails (default [`P2P_TIMEOUT_DEFAULT`]). A malformed value is warned about at startup
    /// and the default used.
    pub fn p2p_timeout(&self) -> Duration {
        self.p2p_timeout
            .clone()
            .ok()
            .flatten()
            .unwrap_or(P2P_TIMEOUT_DEFAULT)
    }
    /// `MSCCLPP_BOOTSTRAP_REFUSED_TIMEOUT`: how long a joining rank retries a root that refuses
    /// its connections; `None` when unset (or malformed, which is warned about at startup):
    /// the bootstrap then uses [`BOOTSTRAP_REFUSED_TIMEOUT_DEFAULT`] for a `UniqueId` and its
    /// whole timeout for `ip:port`.
    pub fn bootstrap_refused_timeout(&self) -> Option<Duration> {
        self.bootstrap_refused_timeout.clone().ok().flatten()
    }
    /// The value of launcher variable `name` (one of [`LAUNCHER_JOB_VARS`]; `None` for any
    /// other name or when unset), as the bootstrap's job key reads it.
    pub fn launcher_var(&self, name: &str) -> Option<&str> {
        self.launcher_job
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether a message of `level` in subsystem `subsys` is logged under this environment.
    /// A malformed log level logs warnings (and the first warning says why).
    pub fn log_enabled(&self, level: LogLevel, subsys: &str) -> bool {
        let max = self.log_level.clone().unwrap_or(LogLevel::Warn);
        if level == LogLevel::None || level > max {
            return false;
        }
        match self.log_subsys() {
            None => true,
            Some(list) => list
                .split(',')
                .map(str::trim)
                .any(|s| s.eq_ignore_ascii_case("ALL") || s.eq_ignore_ascii_case(subsys)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_malformed_switch_is_a_problem_naming_it() {
        let bad = [
            ("MSCCLPP_FORCE_DISABLE_NVLS", "maybe"),
            ("NCCL_NVLS_ENABLE", "sometimes"),
            ("MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM", "perhaps"),
            ("MSCCLPP_COLL_NET_TRANSPORT", "bogus"),
            ("MSCCLPP_FORCE_DISABLE_GDR", "maybe"),
            ("MSCCLPP_LOG_SUBSYS", "bogus"),
        ];
        for (name, value) in bad {
            let p = env_of(&[(name, value)]).problems();
            assert!(
                p.iter()
                    .any(|m| m.contains(&format!("{name}={value}")) && m.contains("expected")),
                "{name}={value}: {p:?}"
            );
        }
        assert!(env_of(&[]).problems().is_empty());
        // A filter naming only unknown subsystems is not applied (it would silence everything).
        let e = env_of(&[("MSCCLPP_LOG_SUBSYS", "bogus")]);
        assert!(e.log_enabled(LogLevel::Warn, "ENV"));
        let e = env_of(&[("MSCCLPP_LOG_SUBSYS", "net,Coll")]);
        assert!(e.problems().is_empty());
        assert!(e.log_enabled(LogLevel::Warn, "COLL") && !e.log_enabled(LogLevel::Warn, "ENV"));
        assert_eq!(env_of(&[("MSCCLPP_LOG_SUBSYS", "ALL")]).log_subsys(), None);
    }

    fn env_of(vars: &[(&str, &str)]) -> Env {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_lookup(move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    fn err<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.expect_err("a malformed value").to_string()
    }

    #[test]
    fn forced_algorithms_in_order() {
        assert!(env_of(&[]).forced_algorithms().unwrap().is_empty());
        let f = env_of(&[
            (ALGORITHM, " allgather = fullmesh, rsag "),
            ("MSCCLPP_ALLREDUCE_ALGO", " packet "),
        ])
        .forced_algorithms()
        .unwrap();
        let got: Vec<_> = f.iter().map(|a| (a.kind, a.name.as_str(), a.var)).collect();
        assert_eq!(
            got,
            [
                (CollectiveKind::AllGather, "fullmesh", ALGORITHM),
                (CollectiveKind::AllReduce, "rsag", ALGORITHM),
                (
                    CollectiveKind::AllReduce,
                    "packet",
                    "MSCCLPP_ALLREDUCE_ALGO"
                ),
            ]
        );
        assert_eq!(f[0].value, " allgather = fullmesh, rsag ");
        let e = err(env_of(&[(ALGORITHM, "gather=x")]).forced_algorithms());
        assert!(e.contains("collective `gather`: expected one of"), "{e}");
    }

    #[test]
    fn nvls_emulation() {
        assert!(!env_of(&[]).nvls_emulation().unwrap());
        assert!(!env_of(&[(NVLS_EMULATION, "0")]).nvls_emulation().unwrap());
        assert!(env_of(&[(NVLS_EMULATION, " 1")]).nvls_emulation().unwrap());
        let e = err(env_of(&[(NVLS_EMULATION, "yes")]).nvls_emulation());
        assert!(
            e.contains("MSCCLPP_NVLS_EMULATION=yes: expected 0 or 1"),
            "{e}"
        );
    }

    #[test]
    fn coll_net_transport() {
        assert_eq!(env_of(&[]).coll_net_transport().unwrap(), None);
        assert_eq!(
            env_of(&[(COLL_NET_TRANSPORT, "IB")])
                .coll_net_transport()
                .unwrap(),
            Some(NetTransport::Ib)
        );
        assert_eq!(
            env_of(&[(COLL_NET_TRANSPORT, " Ethernet ")])
                .coll_net_transport()
                .unwrap(),
            Some(NetTransport::Ethernet)
        );
        let e = err(env_of(&[(COLL_NET_TRANSPORT, "rdma")]).coll_net_transport());
        assert!(e.contains("MSCCLPP_COLL_NET_TRANSPORT=rdma: expected one of ib, ethernet"));
    }

    #[test]
    fn copy_driver_max_bytes() {
        let max = |v: &str| env_of(&[(COPY_DRIVER_MAX_BYTES, v)]).copy_driver_max_bytes();
        assert_eq!(env_of(&[]).copy_driver_max_bytes().unwrap(), 256 << 20);
        assert_eq!(max("").unwrap(), 256 << 20);
        assert_eq!(max("0").unwrap(), 0);
        assert_eq!(max("65536").unwrap(), 65536);
        assert_eq!(max("64K").unwrap(), 64 << 10);
        assert_eq!(max("256m").unwrap(), 256 << 20);
        assert_eq!(max("1G").unwrap(), 1 << 30);
        for bad in ["K", "-1", "1T", "99999999999999999999G", "lots"] {
            let e = err(max(bad));
            assert!(
                e.contains(&format!("{COPY_DRIVER_MAX_BYTES}={bad}: expected")),
                "{e}"
            );
        }
    }

    #[test]
    fn copy_kernel_max_bytes() {
        let max = |v: &str| env_of(&[(COPY_KERNEL_MAX_BYTES, v)]).copy_kernel_max_bytes();
        assert_eq!(env_of(&[]).copy_kernel_max_bytes().unwrap(), 4 << 20);
        assert_eq!(max("0").unwrap(), 0);
        assert_eq!(max("1M").unwrap(), 1 << 20);
        let e = err(max("4 MiB"));
        assert!(
            e.contains(&format!(
                "{COPY_KERNEL_MAX_BYTES}=4 MiB: expected a byte count"
            )),
            "{e}"
        );
    }

    #[test]
    fn durations() {
        let p2p = |v: &str| env_of(&[(P2P_TIMEOUT, v)]);
        assert_eq!(env_of(&[]).p2p_timeout(), P2P_TIMEOUT_DEFAULT);
        assert_eq!(p2p("7").p2p_timeout(), Duration::from_secs(7));
        assert_eq!(p2p(" 2.5s ").p2p_timeout(), Duration::from_millis(2500));
        assert_eq!(p2p("500ms").p2p_timeout(), Duration::from_millis(500));
        assert_eq!(p2p("2m").p2p_timeout(), Duration::from_secs(120));
        for bad in ["0", "-1", "soon", "1h", "nan", "1e30"] {
            let e = p2p(bad);
            assert_eq!(e.p2p_timeout(), P2P_TIMEOUT_DEFAULT, "{bad}");
            let p = e.problems();
            assert!(
                p.iter()
                    .any(|m| m.contains(&format!("{P2P_TIMEOUT}={bad}: expected a duration"))),
                "{bad}: {p:?}"
            );
        }
        assert_eq!(env_of(&[]).bootstrap_refused_timeout(), None);
        let e = env_of(&[(BOOTSTRAP_REFUSED_TIMEOUT, "1")]);
        assert_eq!(e.bootstrap_refused_timeout(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn executor_max_lanes() {
        assert_eq!(env_of(&[]).executor_max_lanes(), EXECUTOR_MAX_LANES_DEFAULT);
        let e = env_of(&[(EXECUTOR_MAX_LANES, " 16 ")]);
        assert_eq!(e.executor_max_lanes(), 16);
        for bad in ["0", "65", "-1", "many"] {
            let e = env_of(&[(EXECUTOR_MAX_LANES, bad)]);
            assert_eq!(e.executor_max_lanes(), EXECUTOR_MAX_LANES_DEFAULT, "{bad}");
            assert!(
                e.problems().iter().any(
                    |m| m.contains(&format!("{EXECUTOR_MAX_LANES}={bad}: expected an integer"))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn executor_launch_knobs() {
        let e = env_of(&[]);
        assert_eq!(e.executor_bytes_per_lane(), None);
        assert_eq!(e.executor_threads(), None);
        let e = env_of(&[(EXECUTOR_BYTES_PER_LANE, " 8K "), (EXECUTOR_THREADS, "512")]);
        assert_eq!(e.executor_bytes_per_lane(), Some(8 << 10));
        assert_eq!(e.executor_threads(), Some(512));
        assert!(e.problems().is_empty(), "{:?}", e.problems());
        for bad in ["0", "512", "2G", "lots"] {
            let e = env_of(&[(EXECUTOR_BYTES_PER_LANE, bad)]);
            assert_eq!(e.executor_bytes_per_lane(), None);
            assert!(
                e.problems().iter().any(|m| m.contains(&format!(
                    "{EXECUTOR_BYTES_PER_LANE}={bad}: expected a byte count from 1K to 1G"
                ))),
                "{bad}: {:?}",
                e.problems()
            );
        }
        assert_eq!(e.executor_lane_sync(), LaneSync::Async);
        let sync = |v| env_of(&[(EXECUTOR_LANE_SYNC, v)]).executor_lane_sync();
        assert_eq!(sync("Split"), LaneSync::Split);
        assert_eq!(sync("barrier"), LaneSync::Barrier);
        assert_eq!(sync("ASYNC"), LaneSync::Async);
        let ports = |v| env_of(&[(EXECUTOR_PORT_CHANNELS, v)]).executor_port_channels();
        assert_eq!(env_of(&[]).executor_port_channels(), PortChannels::Auto);
        assert_eq!(ports(" Proxy "), PortChannels::Proxy);
        assert_eq!(ports("auto"), PortChannels::Auto);
        let e = env_of(&[(EXECUTOR_PORT_CHANNELS, "dma")]);
        assert_eq!(e.executor_port_channels(), PortChannels::Auto);
        assert!(
            e.problems()
                .iter()
                .any(|m| m.contains("MSCCLPP_EXECUTOR_PORT_CHANNELS=dma: expected auto or proxy")),
            "{:?}",
            e.problems()
        );
        let e = env_of(&[(EXECUTOR_LANE_SYNC, "fast")]);
        assert_eq!(e.executor_lane_sync(), LaneSync::Async);
        assert!(
            e.problems()
                .iter()
                .any(|m| m
                    .contains("MSCCLPP_EXECUTOR_LANE_SYNC=fast: expected barrier, split or async")),
            "{:?}",
            e.problems()
        );
        // Split nops: the default unless set; a malformed value is a problem.
        assert_eq!(
            env_of(&[]).executor_split_nops(),
            EXECUTOR_SPLIT_NOPS_DEFAULT
        );
        let split = |v| env_of(&[(EXECUTOR_SPLIT_NOPS, v)]).executor_split_nops();
        assert_eq!(split("0"), SplitNops::Off);
        assert_eq!(split("off"), SplitNops::Off);
        assert_eq!(split(" IO "), SplitNops::Io);
        assert_eq!(split("1"), SplitNops::All);
        assert_eq!(split("all"), SplitNops::All);
        // The booleans are parse_bool's words.
        assert_eq!(split("no"), SplitNops::Off);
        assert_eq!(split("YES"), SplitNops::All);
        assert_eq!(split(" "), EXECUTOR_SPLIT_NOPS_DEFAULT);
        let e = env_of(&[(EXECUTOR_SPLIT_NOPS, "often")]);
        assert_eq!(e.executor_split_nops(), EXECUTOR_SPLIT_NOPS_DEFAULT);
        assert!(
            e.problems()
                .iter()
                .any(|p| p.contains("MSCCLPP_EXECUTOR_SPLIT_NOPS=often: expected 0, io or 1")),
            "{:?}",
            e.problems()
        );
        // Plans compiled at load time: on unless turned off; a malformed value is a problem.
        assert!(env_of(&[]).executor_jit());
        assert!(env_of(&[(EXECUTOR_JIT, " ")]).executor_jit());
        assert!(env_of(&[(EXECUTOR_JIT, "1")]).executor_jit());
        assert!(env_of(&[(EXECUTOR_JIT, " On ")]).executor_jit());
        assert!(!env_of(&[(EXECUTOR_JIT, "0")]).executor_jit());
        assert!(!env_of(&[(EXECUTOR_JIT, "false")]).executor_jit());
        let e = env_of(&[(EXECUTOR_JIT, "sometimes")]);
        assert!(e.executor_jit());
        assert!(
            e.problems()
                .iter()
                .any(|m| m.contains("MSCCLPP_EXECUTOR_JIT=sometimes: expected a boolean")),
            "{:?}",
            e.problems()
        );
        // Packets in flight per thread: 2 unless asked; 1, 2, 4 or 8.
        assert_eq!(
            env_of(&[]).executor_packet_unroll(),
            EXECUTOR_PACKET_UNROLL_DEFAULT
        );
        assert_eq!(
            env_of(&[(EXECUTOR_PACKET_UNROLL, " 8 ")]).executor_packet_unroll(),
            8
        );
        for bad in ["0", "3", "16", "many"] {
            let e = env_of(&[(EXECUTOR_PACKET_UNROLL, bad)]);
            assert_eq!(
                e.executor_packet_unroll(),
                EXECUTOR_PACKET_UNROLL_DEFAULT,
                "{bad}"
            );
            assert!(
                e.problems().iter().any(|m| m.contains(&format!(
                    "MSCCLPP_EXECUTOR_PACKET_UNROLL={bad}: expected 1, 2, 4 or 8"
                ))),
                "{bad}: {:?}",
                e.problems()
            );
        }
        // The widest compiled launch: 1024 (every launch) unless asked; a multiple of 32.
        assert_eq!(env_of(&[]).executor_jit_threads(), 1024);
        assert_eq!(
            env_of(&[(EXECUTOR_JIT_THREADS, "256")]).executor_jit_threads(),
            256
        );
        for bad in ["0", "100", "2048", "all"] {
            let e = env_of(&[(EXECUTOR_JIT_THREADS, bad)]);
            assert_eq!(e.executor_jit_threads(), 1024, "{bad}");
            assert!(
                e.problems().iter().any(|m| m.contains(&format!(
                    "MSCCLPP_EXECUTOR_JIT_THREADS={bad}: expected a multiple of 32 from 32 to 1024"
                ))),
                "{bad}: {:?}",
                e.problems()
            );
        }
        assert_eq!(env_of(&[]).executor_kernel(), ExecutorKernel::Auto);
        let kernel = |v| env_of(&[(EXECUTOR_KERNEL, v)]).executor_kernel();
        assert_eq!(kernel("WIDE"), ExecutorKernel::Wide);
        assert_eq!(kernel("auto"), ExecutorKernel::Auto);
        assert_eq!(kernel("Prefetch"), ExecutorKernel::Auto);
        assert_eq!(kernel("NARROW"), ExecutorKernel::Narrow);
        let e = env_of(&[(EXECUTOR_KERNEL, "thin")]);
        assert_eq!(e.executor_kernel(), ExecutorKernel::Auto);
        assert!(
            e.problems().iter().any(|m| m
                .contains("MSCCLPP_EXECUTOR_KERNEL=thin: expected auto, prefetch, narrow or wide")),
            "{:?}",
            e.problems()
        );
        for bad in ["0", "16", "100", "2048", "all"] {
            let e = env_of(&[(EXECUTOR_THREADS, bad)]);
            assert_eq!(e.executor_threads(), None);
            assert!(
                e.problems().iter().any(|m| m.contains(&format!(
                    "{EXECUTOR_THREADS}={bad}: expected a multiple of 32"
                ))),
                "{bad}: {:?}",
                e.problems()
            );
        }
    }

    #[test]
    fn p2p_tune() {
        assert_eq!(env_of(&[]).p2p_tune().unwrap(), P2pTune::default());
        assert_eq!(env_of(&[]).p2p_tune_for(8).unwrap(), P2pTune::default());
        let wide = env_of(&[]).p2p_tune_for(9).unwrap();
        assert_eq!((wide.chunk_kib, wide.ring), (128, 64));
        let given = env_of(&[(P2P_TUNE, "chunk=256,ring=128")]);
        assert_eq!(given.p2p_tune_for(64).unwrap(), P2pTune::default());
        let t = env_of(&[(
            P2P_TUNE,
            " channels=16, fence=1,unroll=4 ,self_spread=0,abort_poll=1,packed=1,chunk=512,ring=256,ll_fit=0,ll_merge=1,direct=0",
        )])
        .p2p_tune()
        .unwrap();
        assert_eq!(
            t,
            P2pTune {
                channels: 16,
                fence: true,
                unroll: 4,
                self_spread: false,
                abort_poll: 1,
                packed: true,
                chunk_kib: 512,
                ring: 256,
                ll_fit: false,
                ll_merge: true,
                direct_kib: 0,
            }
        );
        for bad in [
            "channels=3",
            "channels=64",
            "fence=yes",
            "unroll=2",
            "abort_poll=0",
            "packed=2",
            "ll_merge=2",
            "direct=-1",
            "chunk=64",
            "channels=32,chunk=256,ring=64",
            "ring=96",
            "channels=32,chunk=512,ring=128",
            "bogus=1",
            "channels",
        ] {
            let e = err(env_of(&[(P2P_TUNE, bad)]).p2p_tune());
            assert!(
                e.contains(&format!("{P2P_TUNE}={bad}")) && e.contains("expected"),
                "{e}"
            );
        }
    }

    #[test]
    fn launcher_vars() {
        let e = env_of(&[("SLURM_JOB_ID", "7"), ("HOME", "/h")]);
        assert_eq!(e.launcher_var("SLURM_JOB_ID"), Some("7"));
        assert_eq!(e.launcher_var("SLURM_STEP_ID"), None);
        assert_eq!(e.launcher_var("HOME"), None);
    }

    #[test]
    fn every_variable_is_listed_once_with_its_default() {
        let names: std::collections::HashSet<&str> = VARS.iter().map(|v| v.name).collect();
        assert_eq!(names.len(), VARS.len(), "a variable is listed twice");
        let forced = CollectiveKind::ALL.map(CollectiveKind::env_var);
        for name in forced.iter().chain(&LAUNCHER_JOB_VARS) {
            assert!(names.contains(name), "{name} is not listed");
        }
        assert!(VARS
            .iter()
            .all(|v| !v.default.is_empty() && !v.doc.is_empty()));
    }
}
