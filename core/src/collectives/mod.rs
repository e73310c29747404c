//! Collectives (all-reduce, all-gather, reduce-scatter, broadcast) over memory channels and
//! LL packets, chosen by size, safe under CUDA-graph capture, on GPUs and on the host backend.
//!
//! [`Collectives::new`] connects every peer of a communicator once (CudaIpc inside a node; in a
//! world spanning nodes also port channels to the same local rank of every other node, over IB
//! or Ethernet: [`net`]), allocates and exchanges the scratch buffers and semaphores, and
//! then runs calls like `all_reduce(send, recv, count, dtype, op, stream)`. GPU builds launch
//! kernels (kernels/cuda/src/collectives/) on the caller's stream; the host backend runs the
//! same algorithms (same scratch layout, flags and protocol) on the calling CPU thread and
//! returns when the call is complete.
//!
//! # Choosing the algorithm
//! The selector ([`selector`]) picks by collective, message size, world size, ranks per node
//! and GPU architecture ([`Collectives::algorithm_for`] tells what it picks). It can be forced:
//!
//! | variable | collective | values |
//! |---|---|---|
//! | `MSCCLPP_ALLREDUCE_ALGO` | all-reduce | `allpair_packet`, `hier_rsag_port`, `packet`, `rsag`, `rsag_pipeline`, `rsag_port_channel`, `rsag_zero_copy`, `nvls_packet`, `nvls_zero_copy`, `nvls_warp_pipeline`, `nvls_block_pipeline` |
//! | `MSCCLPP_ALLGATHER_ALGO` | all-gather | `fullmesh`, `hier_port`, `port_channel` |
//! | `MSCCLPP_COLL_NET_TRANSPORT` | between nodes | `ib`, `ethernet` (default: IB when a device is usable) |
//! | `MSCCLPP_REDUCESCATTER_ALGO` | reduce-scatter | `fullmesh`, `hier_port` |
//! | `MSCCLPP_BROADCAST_ALGO` | broadcast | `fullmesh` |
//! | `MSCCLPP_ALGORITHM` | any | `kind=name[,kind=name...]` (e.g. `allreduce=rsag`), or a bare name for all-reduce |
//! | `MSCCLPP_COPY_DRIVER_MAX_BYTES` | world size 1 | GPU copies up to this many bytes (default 256M; K/M/G suffixes; `0`: none) use the driver's copy, larger ones the copy kernel |
//! | `MSCCLPP_NVLS_EMULATION` | all-reduce | `1`: the selector may pick the NVLS variants on the host backend (multicast emulation); `0`/unset: only when forced |
//!
//! The NVLS all-reduces ([`nvls`]) are picked by the selector only where NVLS is usable for the
//! communicator's device (`nvls_usable`; never while `MSCCLPP_FORCE_DISABLE_NVLS=1` or
//! `NCCL_NVLS_ENABLE=0`) and every rank is on one node.
//!
//! An unknown name is an error listing the valid ones ([`Collectives::new`] fails). A forced
//! algorithm that cannot run a call (e.g. too large for its scratch) makes that call fail with
//! the reason. `copy` is what every collective does at world size 1. When the ranks span nodes
//! (host hashes differ; `MSCCLPP_HOSTID` splits one machine into emulated nodes) the selector
//! takes the hierarchical algorithms (all-reduce `hier_rsag_port`, all-gather and
//! reduce-scatter `hier_port`; GPU kernels and host backend)
//! and any other algorithm is refused with the reason.
//!
//! See README.md in this folder for the Algorithm trait, the scratch layout and flags, and how
//! to add an algorithm.

pub mod algorithm;
pub mod allgather;
pub mod allreduce;
pub mod broadcast;
pub mod copy;
pub mod ext;
pub mod gpu;
pub(crate) mod hier;
pub(crate) mod host_ll;
pub(crate) mod host_math;
pub(crate) mod mesh;
pub mod net;
pub mod nvls;
pub(crate) mod port;
pub mod reduce_scatter;
pub mod selector;
pub mod setup;
pub mod topology;
pub mod types;
pub mod user_buffers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use algorithm::{Algorithm, Call, CollArgs};
pub use setup::{CollectivesConfig, Resources};
pub use types::{CollectiveKind, DataType, RawStream, ReduceOp};

use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::transport::DeviceType;
use gpu::GpuCtx;

static COPY_ALLREDUCE: copy::Copy = copy::Copy(CollectiveKind::AllReduce);
static COPY_ALLGATHER: copy::Copy = copy::Copy(CollectiveKind::AllGather);
static COPY_REDUCESCATTER: copy::Copy = copy::Copy(CollectiveKind::ReduceScatter);
static COPY_BROADCAST: copy::Copy = copy::Copy(CollectiveKind::Broadcast);

/// Every algorithm, all collectives. Adding an algorithm = its file + its kernel + one line here.
pub fn registry() -> &'static [&'static dyn Algorithm] {
    static ALGOS: &[&dyn Algorithm] = &[
        &COPY_ALLREDUCE,
        &COPY_ALLGATHER,
        &COPY_REDUCESCATTER,
        &COPY_BROADCAST,
        &allreduce::allpair_packet::AllpairPacket,
        &allreduce::hier_rsag_port::HierRsagPort,
        &allreduce::packet::Packet,
        &allreduce::rsag::Rsag,
        &allreduce::rsag_pipeline::RsagPipeline,
        &allreduce::rsag_port_channel::RsagPortChannel,
        &allreduce::rsag_zero_copy::RsagZeroCopy,
        &allreduce::nvls_packet::NvlsPacket,
        &allreduce::nvls_zero_copy::NvlsZeroCopy,
        &allreduce::nvls_warp_pipeline::NvlsWarpPipeline,
        &allreduce::nvls_block_pipeline::NvlsBlockPipeline,
        &allgather::fullmesh::Fullmesh,
        &allgather::hier_port::HierPort,
        &allgather::port_channel::PortChannel,
        &reduce_scatter::fullmesh::Fullmesh,
        &reduce_scatter::hier_port::HierPort,
        &broadcast::fullmesh::Fullmesh,
        &broadcast::hier_allreduce::HierAllreduce,
    ];
    ALGOS
}

/// The algorithm `name` of `kind`.
pub fn find_algorithm(kind: CollectiveKind, name: &str) -> Result<&'static dyn Algorithm> {
    registry()
        .iter()
        .copied()
        .find(|a| a.kind() == kind && a.name() == name)
        .ok_or_else(|| {
            Error::invalid(format!(
                "{kind} algorithm `{name}`: expected one of {}",
                algorithm_names(kind).join(", ")
            ))
        })
}

/// Names of the registered algorithms of `kind`.
pub fn algorithm_names(kind: CollectiveKind) -> Vec<&'static str> {
    registry()
        .iter()
        .filter(|a| a.kind() == kind)
        .map(|a| a.name())
        .collect()
}

/// Forced algorithms from the environment (see the module doc).
fn forced_from_env(
    get: impl Fn(&str) -> Option<String>,
) -> Result<HashMap<CollectiveKind, &'static str>> {
    let mut forced = HashMap::new();
    if let Some(v) = get("MSCCLPP_ALGORITHM").filter(|v| !v.trim().is_empty()) {
        for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (kind, name) = match item.split_once('=') {
                Some((k, n)) => (k.trim().parse::<CollectiveKind>()?, n.trim()),
                None => (CollectiveKind::AllReduce, item),
            };
            let a = find_algorithm(kind, name)
                .map_err(|e| Error::invalid(format!("MSCCLPP_ALGORITHM={v}: {e}")))?;
            forced.insert(kind, a.name());
        }
    }
    for kind in CollectiveKind::ALL {
        if let Some(v) = get(kind.env_var()).filter(|v| !v.trim().is_empty()) {
            let a = find_algorithm(kind, v.trim())
                .map_err(|e| Error::invalid(format!("{}={v}: {e}", kind.env_var())))?;
            forced.insert(kind, a.name());
        }
    }
    Ok(forced)
}

/// Collectives over one communicator. `Send + Sync`; calls are serialised internally (they
/// share LL flags and scratch), and every rank must issue the same calls in the same order.
pub struct Collectives {
    res: Resources,
    gpu: Option<GpuCtx>,
    forced: Mutex<HashMap<CollectiveKind, &'static str>>,
    launch: Mutex<()>,
    /// Whether the selector may pick the NVLS variants (`nvls::selectable`).
    nvls: bool,
}

impl std::fmt::Debug for Collectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collectives")
            .field("rank", &self.res.rank)
            .field("nranks", &self.res.nranks)
            .field("device", &self.res.device)
            .finish_non_exhaustive()
    }
}

impl Collectives {
    /// Sets up the collectives of `comm` with the default configuration (collective: every
    /// rank calls it).
    pub fn new(comm: Arc<Communicator>) -> Result<Collectives> {
        Self::with_config(comm, CollectivesConfig::default())
    }

    /// Sets up with `cfg` (collective: every rank calls it with the same sizes).
    pub fn with_config(comm: Arc<Communicator>, cfg: CollectivesConfig) -> Result<Collectives> {
        let forced = forced_from_env(|k| std::env::var(k).ok())?;
        let nvls_opt_in = nvls::emulation_opt_in(std::env::var(nvls::EMULATION_ENV).ok())?;
        copy::driver_copy_max()?;
        let res = Resources::new(&comm, cfg)?;
        let nvls = nvls::selectable(res.device, nvls_opt_in);
        let gpu = match res.device.kind {
            DeviceType::Gpu => Some(GpuCtx::new(res.device.id)?),
            DeviceType::Cpu => None,
        };
        Ok(Collectives {
            res,
            gpu,
            forced: Mutex::new(forced),
            launch: Mutex::new(()),
            nvls,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.res.rank
    }
    /// World size.
    pub fn nranks(&self) -> usize {
        self.res.nranks
    }
    /// The resources (device, layout, peers).
    pub fn resources(&self) -> &Resources {
        &self.res
    }

    /// Forces (`Some(name)`) or un-forces (`None`) the algorithm of `kind` for later calls on
    /// this rank (every rank must do the same). Overrides the environment.
    pub fn force_algorithm(&self, kind: CollectiveKind, name: Option<&str>) -> Result<()> {
        let mut f = self.forced.lock().unwrap_or_else(|p| p.into_inner());
        match name {
            Some(n) => {
                f.insert(kind, find_algorithm(kind, n)?.name());
            }
            None => {
                f.remove(&kind);
            }
        }
        Ok(())
    }

    /// The algorithm the selector (or a forced choice) takes for `bytes` of `coll`.
    pub fn algorithm_for(&self, coll: CollectiveKind, bytes: usize) -> Result<&'static str> {
        if self.res.nranks == 1 {
            return Ok("copy");
        }
        if let Some(n) = self
            .forced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&coll)
        {
            return Ok(n);
        }
        selector::select(&selector::Query {
            kind: coll,
            bytes,
            nranks: self.res.nranks,
            nranks_per_node: self.res.nranks_per_node,
            nnodes: self.res.topo.nnodes,
            arch: self.res.arch,
            host: self.gpu.is_none(),
            nvls: self.nvls,
        })
    }

    /// The algorithm that runs `call` (forced or selected), after its own check and, in a
    /// world spanning nodes, the check that it is a multi-node algorithm.
    pub fn checked_algorithm(&self, call: &Call) -> Result<&'static dyn Algorithm> {
        let name = self.algorithm_for(call.kind, call.bytes())?;
        let algo = find_algorithm(call.kind, name)?;
        if self.res.topo.nnodes > 1 && !algo.multi_node() {
            let multi: Vec<&str> = registry()
                .iter()
                .filter(|a| a.kind() == call.kind && a.multi_node())
                .map(|a| a.name())
                .collect();
            return Err(Error::invalid(format!(
                "{} {name}: this world spans {} nodes; expected a multi-node algorithm (one of: {})",
                call.kind,
                self.res.topo.nnodes,
                if multi.is_empty() { "none yet".to_string() } else { multi.join(", ") }
            )));
        }
        algo.check(&self.res, call)?;
        Ok(algo)
    }

    /// Runs `call` with the chosen algorithm (validated arguments).
    ///
    /// # Safety
    /// As the public collectives.
    unsafe fn run(&self, call: Call, stream: RawStream) -> Result<()> {
        if call.count == 0 {
            return Ok(());
        }
        call.count
            .checked_mul(call.dtype.size_in_bytes())
            .and_then(|b| b.checked_mul(self.res.nranks))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{}: count {} of {} overflows the address space",
                    call.kind, call.count, call.dtype
                ))
            })?;
        if call.send == 0 || call.recv == 0 {
            return Err(Error::invalid(format!(
                "{}: expected non-null buffers, got send {:#x}, recv {:#x}",
                call.kind, call.send, call.recv
            )));
        }
        let algo = self.checked_algorithm(&call)?;
        let _guard = self.launch.lock().unwrap_or_else(|p| p.into_inner());
        crate::log_trace!(
            "COLL",
            "rank {}: {} {} of {} {} ({} {}) on stream {stream:#x}: {}",
            self.res.rank,
            call.kind,
            call.count,
            call.dtype,
            call.op,
            if call.send == call.recv {
                "in place"
            } else {
                "out of place"
            },
            if self.gpu.is_some() { "GPU" } else { "host" },
            algo.name()
        );
        match &self.gpu {
            Some(gpu) => algo.launch_gpu(&self.res, gpu, &call, stream),
            None => algo.run_host(&self.res, &call),
        }
    }

    /// All-reduce of `count` elements from `send` into `recv` (in place when equal).
    ///
    /// # Safety
    /// `send` and `recv` are device addresses (host addresses on the host backend) of
    /// `count` elements that stay valid until the call completed on `stream`; `stream` is 0 or
    /// a live stream of this rank's device. Asynchronous on GPUs; graph-capturable once the
    /// buffers were seen once outside capture.
    pub unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: RawStream,
    ) -> Result<()> {
        let call = Call {
            kind: CollectiveKind::AllReduce,
            send,
            recv,
            count,
            dtype,
            op,
            root: 0,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.run(call, stream) }
    }

    /// All-gather: `send_count` elements of every rank into `recv` (`nranks * send_count`);
    /// in place when `send == recv + rank * send_count * size`.
    ///
    /// # Safety
    /// As [`Collectives::all_reduce`] (`recv` holds `nranks * send_count` elements).
    pub unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        dtype: DataType,
        stream: RawStream,
    ) -> Result<()> {
        let call = Call {
            kind: CollectiveKind::AllGather,
            send,
            recv,
            count: send_count,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.run(call, stream) }
    }

    /// Reduce-scatter: `send` holds `nranks * recv_count` elements; `recv` gets this rank's
    /// reduced block. In place when `recv == send + rank * recv_count * size`.
    ///
    /// # Safety
    /// As [`Collectives::all_reduce`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: RawStream,
    ) -> Result<()> {
        let call = Call {
            kind: CollectiveKind::ReduceScatter,
            send,
            recv,
            count: recv_count,
            dtype,
            op,
            root: 0,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.run(call, stream) }
    }

    /// Broadcast of `count` elements of `root`'s `send` into every rank's `recv`.
    ///
    /// # Safety
    /// As [`Collectives::all_reduce`] (`send` is only read on the root).
    pub unsafe fn broadcast(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: RawStream,
    ) -> Result<()> {
        if root >= self.res.nranks {
            return Err(Error::invalid(format!(
                "broadcast: root {root}: expected a rank below {}",
                self.res.nranks
            )));
        }
        let call = Call {
            kind: CollectiveKind::Broadcast,
            send,
            recv,
            count,
            dtype,
            op: ReduceOp::Sum,
            root,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.run(call, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<Collectives>();
    }

    #[test]
    fn env_forcing() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(a, _)| *a == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let f = forced_from_env(env(&[("MSCCLPP_ALLREDUCE_ALGO", "allpair_packet")])).unwrap();
        assert_eq!(f.get(&CollectiveKind::AllReduce), Some(&"allpair_packet"));
        let e = forced_from_env(env(&[("MSCCLPP_ALLREDUCE_ALGO", "bogus")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("allpair_packet") && e.contains("bogus"), "{e}");
        let f = forced_from_env(env(&[("MSCCLPP_ALGORITHM", "allreduce=allpair_packet")])).unwrap();
        assert_eq!(f.len(), 1);
        assert!(forced_from_env(env(&[("MSCCLPP_ALGORITHM", "gather=x")])).is_err());
    }
}
