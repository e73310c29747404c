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
//! # The algorithm collection
//! Every `Collectives` has its own collection of algorithm objects ([`Collection`]): the native
//! ones ([`native_algorithms`]; their lazily built state, e.g. the proxy of the port-channel
//! algorithms, lives in the objects), those of the process-wide builders ([`register_global`]),
//! those of its own builders ([`Collectives::builder`] + [`CollectivesBuilder::add_algorithm`];
//! an [`AlgorithmBuilder`] gets a [`BuildContext`]: communicator, [`Resources`], device, rank,
//! world), and the execution plans of the plan directory ([`PlanAlgorithm`], [`plan`]:
//! `MSCCLPP_CACHE_DIR`, default `~/.cache/mscclpp`, read when the `Collectives` is built).
//!
//! # Choosing the algorithm
//! [`Collectives::choose`] takes, in order: a forced algorithm (table below,
//! [`Collectives::force_algorithm`]; it may name a plan or an added algorithm), the
//! [`Selector`] of this `Collectives` or the process ([`set_global_selector`]), else the default
//! choice: a plan that matches the call, else the native rules ([`selector`]: by collective,
//! message size, world size, ranks per node and GPU architecture). It returns a [`Choice`]
//! whose check is done; [`Collectives::run_choice`] runs it (the collectives below do both).
//! [`Collectives::algorithm_for`] tells what is taken for a size. An INFO line (subsystem
//! `COLL`) names the algorithm (plans: name and file) whenever a collective's choice changes.
//!
//! | variable | collective | values |
//! |---|---|---|
//! | `MSCCLPP_ALLREDUCE_ALGO` | all-reduce | `allpair_packet`, `hier_rsag_port`, `packet`, `rsag`, `rsag_pipeline`, `rsag_port_channel`, `rsag_zero_copy`, `nvls_packet`, `nvls_zero_copy`, `nvls_warp_pipeline`, `nvls_block_pipeline` |
//! | `MSCCLPP_ALLGATHER_ALGO` | all-gather | `fullmesh`, `hier_port`, `packet`, `port_channel`, `zero_copy` |
//! | `MSCCLPP_COLL_NET_TRANSPORT` | between nodes | `ib`, `ethernet` (default: IB when a device is usable) |
//! | `MSCCLPP_REDUCESCATTER_ALGO` | reduce-scatter | `fullmesh`, `hier_port`, `packet`, `zero_copy` |
//! | `MSCCLPP_BROADCAST_ALGO` | broadcast | `fullmesh`, `packet`, `zero_copy` |
//! | `MSCCLPP_ALGORITHM` | any | `kind=name[,kind=name...]` (e.g. `allreduce=rsag`), or a bare name for all-reduce |
//! | `MSCCLPP_COPY_KERNEL_MAX_BYTES` | world size 1 | GPU copies up to this many bytes (default 4M; K/M/G suffixes; `0`: none) use the copy kernel (an eager launch costs the host less than the driver's copy) |
//! | `MSCCLPP_COPY_DRIVER_MAX_BYTES` | world size 1 | larger GPU copies up to this many bytes (default 256M; `0`: none) use the driver's copy, larger ones the copy kernel |
//! | `MSCCLPP_NVLS_EMULATION` | all-reduce | `1`: the selector may pick the NVLS variants on the host backend (multicast emulation); `0`/unset: only when forced |
//! | `MSCCLPP_CHECK_CALLS` | any, and point-to-point | `1`: every call is compared across the ranks before it runs; a mismatch fails it on every rank naming the ranks and calls ([`check`]) |
//! | `MSCCLPP_DETERMINISTIC` | all-reduce, reduce-scatter | `1`: only algorithms that fold the ranks in rank order, bitwise reproducible ([`deterministic`]) |
//!
//! The NVLS all-reduces ([`nvls`]) are picked by the selector only where NVLS is usable for the
//! communicator's device (`nvls_usable`; never while `MSCCLPP_FORCE_DISABLE_NVLS=1` or
//! `NCCL_NVLS_ENABLE=0`) and every rank is on one node.
//!
//! Each variable may also name a plan of the plan directory or an added algorithm of that
//! collective. An unknown name is an error listing the valid ones ([`Collectives::new`]
//! fails). A forced algorithm that cannot run a call (e.g. too large for its scratch) makes
//! that call fail with the reason. `copy` is what every collective does at world size 1. When
//! the ranks span nodes (host hashes differ; `MSCCLPP_HOSTID` splits one machine into emulated
//! nodes) the selector takes the hierarchical algorithms (all-reduce `hier_rsag_port`,
//! all-gather and reduce-scatter `hier_port`; GPU kernels and host backend) and any other
//! algorithm is refused with the reason.
//!
//! See README.md in this folder for the collection, builders and selectors, the Algorithm
//! trait, the scratch layout and flags, and how to add an algorithm
//! (core/examples/10-own-algorithm.rs adds one with its own kernel and selector, also to the
//! NCCL library through its C extension `mscclppNcclRegisterAlgorithm`).

pub mod algorithm;
pub mod allgather;
pub(crate) mod allpair;
pub mod allreduce;
pub mod broadcast;
pub mod check;
pub mod collection;
pub mod copy;
pub mod deterministic;
pub mod gpu;
pub(crate) mod hier;
pub(crate) mod host_ll;
pub(crate) mod host_math;
pub(crate) mod mesh;
pub mod net;
pub mod nvls;
pub mod plan;
pub(crate) mod port;
pub mod recorder;
pub mod reduce_scatter;
pub mod selector;
pub mod setup;
pub mod topology;
pub mod types;
pub mod user_buffers;
pub mod zero_copy;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use algorithm::{Algorithm, Call, CollArgs};
pub use collection::{
    native_algorithms, register_global, AlgorithmBuilder, BuildContext, Collection,
    NativeAlgorithms,
};
pub use plan::PlanAlgorithm;
pub use selector::{set_global_selector, SelectContext, Selector};
pub use setup::{CollectivesConfig, Resources};
pub use types::{CollectiveKind, DataType, RawStream, ReduceOp};

use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::transport::DeviceType;
use gpu::GpuCtx;

/// The native algorithm `name` of `kind` (names, kinds and checks; a communicator runs the
/// objects of its own collection, [`Collectives::algorithm`]).
pub fn find_algorithm(kind: CollectiveKind, name: &str) -> Result<&'static dyn Algorithm> {
    collection::native_catalogue()
        .get(kind, name)
        .map(|a| a.as_ref())
}

/// Names of the native algorithms of `kind` ([`Collectives::algorithm_names`] adds a
/// communicator's own algorithms and plans).
pub fn algorithm_names(kind: CollectiveKind) -> Vec<&'static str> {
    collection::native_catalogue().names(kind)
}

/// Forced algorithms from the environment (see the module doc; parsed by
/// [`crate::env::Env::forced_algorithms`]), checked against `algos`.
fn forced_from_env(
    env: &crate::env::Env,
    algos: &Collection,
) -> Result<HashMap<CollectiveKind, &'static str>> {
    let mut forced = HashMap::new();
    for f in env.forced_algorithms()? {
        let a = algos
            .get(f.kind, &f.name)
            .map_err(|e| e.context(format!("{}={}", f.var, f.value)))?;
        forced.insert(f.kind, a.name());
    }
    Ok(forced)
}

/// The algorithm chosen for one call, its own check passed: what [`Collectives::run_choice`]
/// runs. Route on it (e.g. native or not) and run it, so a call is chosen and checked once.
#[derive(Clone)]
pub struct Choice {
    algorithm: Arc<dyn Algorithm>,
    call: Call,
}

impl std::fmt::Debug for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Choice")
            .field("algorithm", &self.algorithm.description())
            .field("call", &self.call)
            .finish()
    }
}

impl Choice {
    /// The algorithm that runs the call.
    pub fn algorithm(&self) -> &Arc<dyn Algorithm> {
        &self.algorithm
    }
    /// Its name.
    pub fn name(&self) -> &'static str {
        self.algorithm.name()
    }
    /// The call.
    pub fn call(&self) -> &Call {
        &self.call
    }
}

/// Builds a [`Collectives`] with algorithms and a selector of one's own (see the module doc):
/// `Collectives::builder(comm).add(my_builder).selector(my_selector).build()`.
pub struct CollectivesBuilder {
    comm: Arc<Communicator>,
    config: CollectivesConfig,
    builders: Vec<Arc<dyn AlgorithmBuilder>>,
    selector: Option<Arc<dyn Selector>>,
    plan_dir: Option<PathBuf>,
    plans: bool,
}

impl std::fmt::Debug for CollectivesBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectivesBuilder")
            .field("config", &self.config)
            .field("builders", &self.builders.len())
            .field("selector", &self.selector.is_some())
            .field("plan_dir", &self.plan_dir)
            .finish()
    }
}

impl CollectivesBuilder {
    /// The scratch sizes and device ([`CollectivesConfig`]; default: its `Default`).
    pub fn config(mut self, config: CollectivesConfig) -> Self {
        self.config = config;
        self
    }
    /// Adds the algorithms `builder` makes (after the natives and the process-wide ones).
    pub fn add_algorithm(mut self, builder: impl AlgorithmBuilder + 'static) -> Self {
        self.builders.push(Arc::new(builder));
        self
    }
    /// Replaces the default selector (forcing still comes first).
    pub fn selector(mut self, selector: impl Selector + 'static) -> Self {
        self.selector = Some(Arc::new(selector));
        self
    }
    /// Reads the plans of `dir` instead of the plan directory of the environment
    /// (`MSCCLPP_CACHE_DIR`, default `~/.cache/mscclpp`).
    pub fn plan_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plan_dir = Some(dir.into());
        self.plans = true;
        self
    }
    /// Reads no plan directory.
    pub fn without_plans(mut self) -> Self {
        self.plans = false;
        self
    }

    /// Sets up the collectives (collective: every rank calls it with the same sizes,
    /// builders and plan directory contents).
    pub fn build(self) -> Result<Collectives> {
        // Read again per communicator: an application may change them between communicators.
        let env = crate::env::Env::current();
        let nvls_opt_in = env.nvls_emulation()?;
        copy::driver_copy_max()?;
        copy::kernel_copy_max()?;
        let comm = self.comm;
        let res = Resources::new(&comm, self.config)?;
        let nvls = nvls::selectable(res.device(), nvls_opt_in);
        let gpu = match res.device().kind {
            DeviceType::Gpu => Some(GpuCtx::new(res.device().id)?),
            DeviceType::Cpu => None,
        };
        let mut algos = Collection::default();
        let ctx = BuildContext {
            comm: &comm,
            res: &res,
        };
        let builders = [Arc::new(NativeAlgorithms) as Arc<dyn AlgorithmBuilder>]
            .into_iter()
            .chain(collection::global())
            .chain(self.builders);
        for b in builders {
            for a in b.build(&ctx)? {
                algos.add(a)?;
            }
        }
        let mut plans = Vec::new();
        let dir = match self.plan_dir {
            Some(d) => Some(d),
            None if self.plans => crate::env::env().cache_dir().ok(),
            None => None,
        };
        if let Some(dir) = dir.filter(|_| self.plans) {
            for p in plan::load_dir(&dir, &comm, gpu.is_some())? {
                if algos.find(p.kind(), p.name()).is_some() {
                    crate::log_warn!(
                        "COLL",
                        "skipping {}: the collection has a {} algorithm of that name",
                        p.description(),
                        p.kind()
                    );
                    continue;
                }
                algos.add(p.clone())?;
                plans.push(p);
            }
            if !plans.is_empty() {
                crate::log_info!(
                    "COLL",
                    "rank {}: {} plan(s) from {}: {}",
                    res.rank(),
                    plans.len(),
                    dir.display(),
                    plans
                        .iter()
                        .map(|p| p.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        let forced = forced_from_env(&env, &algos)?;
        // The call check, flight recorder and deterministic mode (check.rs, recorder.rs,
        // deterministic.rs).
        let check = check::CallCheck::new(env.check_calls()?);
        let det = deterministic::Deterministic::new(env.deterministic()?, comm.bootstrap());
        Ok(Collectives {
            check,
            recorder: recorder::Recorder::default(),
            det,
            res,
            gpu,
            algos,
            plans,
            selector: self.selector.or_else(selector::global_selector),
            forced: Mutex::new(forced),
            last: Mutex::new([None; CollectiveKind::ALL.len()]),
            launch: Mutex::new(()),
            nvls,
            liveness: peer_liveness(comm.bootstrap()),
        })
    }
}

/// Collectives over one communicator. `Send + Sync`; calls are serialised internally (they
/// share LL flags and scratch), and every rank must issue the same calls in the same order.
pub struct Collectives {
    res: Resources,
    gpu: Option<GpuCtx>,
    algos: Collection,
    plans: Vec<Arc<PlanAlgorithm>>,
    selector: Option<Arc<dyn Selector>>,
    forced: Mutex<HashMap<CollectiveKind, &'static str>>,
    /// The algorithm that ran the last call of each collective, by `CollectiveKind as usize`
    /// (an INFO line when it changes; an array: a map's insert may allocate on every call).
    last: Mutex<[Option<&'static str>; CollectiveKind::ALL.len()]>,
    launch: Mutex<()>,
    /// [`peer_liveness`] of the communicator, made once (a host call allocates nothing).
    liveness: crate::backoff::Watch,
    /// Whether the selector may pick the NVLS variants (`nvls::selectable`).
    nvls: bool,
    /// `MSCCLPP_CHECK_CALLS` (check.rs).
    check: check::CallCheck,
    /// The last calls (recorder.rs).
    recorder: recorder::Recorder,
    /// `MSCCLPP_DETERMINISTIC` (deterministic.rs).
    det: deterministic::Deterministic,
}

impl std::fmt::Debug for Collectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collectives")
            .field("rank", &self.res.rank())
            .field("nranks", &self.res.nranks())
            .field("device", &self.res.device())
            .finish_non_exhaustive()
    }
}

impl Collectives {
    /// Sets up the collectives of `comm` with the default configuration (collective: every
    /// rank calls it).
    pub fn new(comm: Arc<Communicator>) -> Result<Collectives> {
        Self::builder(comm).build()
    }

    /// Sets up with `cfg` (collective: every rank calls it with the same sizes).
    pub fn with_config(comm: Arc<Communicator>, cfg: CollectivesConfig) -> Result<Collectives> {
        Self::builder(comm).config(cfg).build()
    }

    /// A builder: add algorithms, a selector, a plan directory, then `build()`.
    pub fn builder(comm: Arc<Communicator>) -> CollectivesBuilder {
        CollectivesBuilder {
            comm,
            config: CollectivesConfig::default(),
            builders: Vec::new(),
            selector: None,
            plan_dir: None,
            plans: true,
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.res.rank()
    }
    /// World size.
    pub fn nranks(&self) -> usize {
        self.res.nranks()
    }
    /// The resources (device, layout, peers).
    pub fn resources(&self) -> &Resources {
        &self.res
    }
    /// The collection: natives, added algorithms, plans.
    pub fn algorithms(&self) -> &Collection {
        &self.algos
    }
    /// This communicator's algorithm `name` of `kind` (an error lists the valid names).
    pub fn algorithm(&self, kind: CollectiveKind, name: &str) -> Result<Arc<dyn Algorithm>> {
        self.algos.get(kind, name).cloned()
    }
    /// Names of this communicator's algorithms of `kind` (plans included).
    pub fn algorithm_names(&self, kind: CollectiveKind) -> Vec<&'static str> {
        self.algos.names(kind)
    }
    /// The plans of the plan directory in the collection.
    pub fn plans(&self) -> &[Arc<PlanAlgorithm>] {
        &self.plans
    }

    /// Forces (`Some(name)`) or un-forces (`None`) the algorithm of `kind` for later calls on
    /// this rank (every rank must do the same). Overrides the environment. `name` may be a
    /// plan's or an added algorithm's.
    pub fn force_algorithm(&self, kind: CollectiveKind, name: Option<&str>) -> Result<()> {
        let mut f = self.forced.lock().unwrap_or_else(|p| p.into_inner());
        match name {
            Some(n) => {
                f.insert(kind, self.algos.get(kind, n)?.name());
            }
            None => {
                f.remove(&kind);
            }
        }
        Ok(())
    }

    /// The algorithm the selector (or a forced choice) takes for `bytes` of `coll`, asked with
    /// an out-of-place call of `bytes` bytes (`u8`, sum) on addresses this library did not
    /// allocate (so no plan matches it); without its own check. [`Collectives::choose`] tells
    /// for a real call.
    pub fn algorithm_for(&self, coll: CollectiveKind, bytes: usize) -> Result<&'static str> {
        let probe = Call {
            kind: coll,
            send: 1 << 44,
            recv: 2 << 44,
            count: bytes,
            dtype: DataType::U8,
            op: ReduceOp::Sum,
            root: 0,
        };
        Ok(self.select(&probe, false)?.name())
    }

    /// [`Collectives::select_any`], restricted in the deterministic mode (deterministic.rs):
    /// a forced algorithm that does not fold in rank order is an error, any other choice is
    /// replaced by the native rules' without NVLS, and across nodes `gather_fold` runs.
    fn select(&self, call: &Call, registered: bool) -> Result<Arc<dyn Algorithm>> {
        if !self.det.on() || !deterministic::restricts(call.kind) || self.res.nranks() == 1 {
            return self.select_any(call, registered, self.nvls);
        }
        if self.res.topo().nnodes > 1 {
            if let Some(a) = self.det.gather_fold(call.kind) {
                return Ok(a);
            }
        }
        let algo = self.select_any(call, registered, false)?;
        if deterministic::folds_in_rank_order(algo.as_ref()) {
            return Ok(algo);
        }
        let forced = self
            .forced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&call.kind);
        if forced {
            return Err(deterministic::refused(algo.as_ref()));
        }
        let name = selector::select(&self.query(call, registered, false), &self.algos)?;
        self.algos.get(call.kind, name).cloned()
    }

    /// What the selectors learn of `call`.
    fn query(&self, call: &Call, registered: bool, nvls: bool) -> selector::Query {
        selector::Query {
            kind: call.kind,
            bytes: call.bytes(),
            nranks: self.res.nranks(),
            nranks_per_node: self.res.nranks_per_node(),
            nnodes: self.res.topo().nnodes,
            arch: self.res.arch(),
            host: self.gpu.is_none(),
            nvls,
            registered,
        }
    }

    /// Forced, else the user's selector, else the default one (a matching plan, else the
    /// native rules); `registered`: the caller says the buffers are registered on every rank;
    /// `nvls`: the NVLS variants may be picked.
    fn select_any(&self, call: &Call, registered: bool, nvls: bool) -> Result<Arc<dyn Algorithm>> {
        if self.res.nranks() == 1 {
            return self.algos.get(call.kind, "copy").cloned();
        }
        let forced = self
            .forced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&call.kind)
            .copied();
        if let Some(n) = forced {
            return self.algos.get(call.kind, n).cloned();
        }
        let ctx = SelectContext {
            call,
            query: self.query(call, registered, nvls),
            rank: self.res.rank(),
            algos: &self.algos,
            plans: &self.plans,
            res: &self.res,
        };
        if let Some(sel) = &self.selector {
            if let Some(a) = sel.select(&ctx)? {
                return Ok(a);
            }
        }
        ctx.default_choice()
    }

    /// Plans on the application's memory ([`plan::agree_on_buffers`]): `algo` when the ranks
    /// agree that plans run on `call`'s buffers (or it is no plan), else the native choice.
    fn plan_or_native(
        &self,
        call: &Call,
        algo: &Arc<dyn Algorithm>,
        stream: RawStream,
    ) -> Result<Arc<dyn Algorithm>> {
        if self.plans.is_empty() || self.res.nranks() == 1 {
            return Ok(algo.clone());
        }
        let capturing = match &self.gpu {
            Some(g) => g.is_capturing(stream)?,
            None => false,
        };
        let is_plan = self
            .plans
            .iter()
            .any(|p| p.name() == algo.name() && p.kind() == algo.kind());
        if plan::agree_on_buffers(&self.plans, &self.res, call, capturing, is_plan)? {
            return Ok(algo.clone());
        }
        let name = selector::select(&self.query(call, false, self.nvls), &self.algos)?;
        let native = self.algos.get(call.kind, name)?.clone();
        self.check_algorithm(native, call)
    }

    /// The algorithm that runs `call` (forced or selected), after its own check and, in a
    /// world spanning nodes, the check that it is a multi-node algorithm.
    pub fn checked_algorithm(&self, call: &Call) -> Result<Arc<dyn Algorithm>> {
        let algo = self.select(call, false)?;
        self.check_algorithm(algo, call)
    }

    /// `algo` for `call` after its own check and, in a world spanning nodes, the check that it
    /// is a multi-node algorithm.
    fn check_algorithm(&self, algo: Arc<dyn Algorithm>, call: &Call) -> Result<Arc<dyn Algorithm>> {
        if self.res.topo().nnodes > 1 && !algo.multi_node() {
            let multi: Vec<&str> = self
                .algos
                .all()
                .iter()
                .filter(|a| a.kind() == call.kind && a.multi_node())
                .map(|a| a.name())
                .collect();
            return Err(Error::invalid(format!(
                "{} {}: this world spans {} nodes; expected a multi-node algorithm (one of: {})",
                call.kind,
                algo.name(),
                self.res.topo().nnodes,
                if multi.is_empty() {
                    "none yet".to_string()
                } else {
                    multi.join(", ")
                }
            )));
        }
        algo.check(&self.res, call)?;
        Ok(algo)
    }

    /// Checks `call`'s arguments and chooses its algorithm (forced, the user's selector, or
    /// the default one), its own check done. [`Collectives::run_choice`] runs it.
    pub fn choose(&self, call: &Call) -> Result<Choice> {
        if call.count != 0 {
            self.check_args(call)?;
        }
        Ok(Choice {
            algorithm: self.checked_algorithm(call)?,
            call: *call,
        })
    }

    /// [`Collectives::choose`] for a call whose buffers the caller registered on every rank
    /// (with [`crate::Communicator::register_memory`], `ncclCommRegister`, or memory of this
    /// library): the default choice then prefers an algorithm that works straight between the
    /// user buffers (zero-copy: all-reduce's `rsag_zero_copy` above 1 MiB, the `zero_copy` of
    /// all-gather, reduce-scatter and broadcast above [`selector::ZERO_COPY_MIN_BYTES`] per
    /// rank, [`zero_copy`]) and maps every
    /// rank's buffer at its first use (collectively; a buffer some rank cannot export makes
    /// every rank take a copying algorithm). A forced algorithm or a selector still decides
    /// first. Every rank must call it alike for the same call.
    pub fn choose_registered(&self, call: &Call) -> Result<Choice> {
        if call.count != 0 {
            self.check_args(call)?;
        }
        let algo = self.select(call, true)?;
        Ok(Choice {
            algorithm: self.check_algorithm(algo, call)?,
            call: *call,
        })
    }

    /// Declares `ptr..ptr+size` a buffer the caller will pass to [`Collectives::choose_registered`]
    /// calls (local: no peer, no driver; like `ncclCommRegister`): at the next such call outside
    /// graph capture that needs a registration, every rank registers its declared buffers whole
    /// (collectively, in declaration order), and every later call anywhere inside them is
    /// zero-copy without a registration of its own, under graph capture too. Every rank
    /// declares its corresponding buffers alike. See [`user_buffers`].
    pub fn register_buffer(&self, ptr: u64, size: usize) {
        self.res.user_buffers().declare(ptr, size);
    }

    /// Whether `ptr..ptr+size` lies inside one buffer of [`Collectives::register_buffer`] (the
    /// Python package's calls then take [`Collectives::choose_registered`]).
    pub fn is_registered_buffer(&self, ptr: u64, size: usize) -> bool {
        self.res.user_buffers().is_declared(ptr, size)
    }

    /// Takes back [`Collectives::register_buffer`] of `ptr..ptr+size` and forgets every
    /// registration and peer mapping inside it (before the memory is freed; every rank alike).
    pub fn deregister_buffer(&self, ptr: u64, size: usize) {
        let cache = self.res.user_buffers();
        cache.undeclare(ptr, size);
        cache.forget(ptr, size);
    }

    /// [`Collectives::choose`] with the algorithm named `name` (of this communicator's
    /// collection, plans included) for this one call, whatever is forced or selected: the
    /// same argument and algorithm checks. An unknown name is an error listing the valid ones.
    /// Every rank must name the same algorithm.
    pub fn choose_named(&self, call: &Call, name: &str) -> Result<Choice> {
        let algo = self.algos.get(call.kind, name)?.clone();
        if call.count != 0 {
            self.check_args(call)?;
        }
        Ok(Choice {
            algorithm: self.check_algorithm(algo, call)?,
            call: *call,
        })
    }

    fn check_args(&self, call: &Call) -> Result<()> {
        call.count
            .checked_mul(call.dtype.size_in_bytes())
            .and_then(|b| b.checked_mul(self.res.nranks()))
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
        if call.kind == CollectiveKind::Broadcast && call.root >= self.res.nranks() {
            return Err(Error::invalid(format!(
                "broadcast: root {}: expected a rank below {}",
                call.root,
                self.res.nranks()
            )));
        }
        Ok(())
    }

    /// Runs a choice of [`Collectives::choose`] (of this `Collectives`) on `stream`.
    ///
    /// # Safety
    /// As the public collectives, for the buffers of the choice's call.
    pub unsafe fn run_choice(&self, choice: &Choice, stream: RawStream) -> Result<()> {
        let (call, algo) = (&choice.call, &choice.algorithm);
        if call.count == 0 {
            return self.empty_call(call);
        }
        let _guard = self.launch.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.recorder.start(call, algo.name());
        // SAFETY: forwarded from the caller.
        let r = self
            .checked(call, seq)
            .and_then(|()| unsafe { self.launch_choice(call, algo, stream) });
        let r = match r {
            // A host-side wait reached its bound: say which call every peer last reached (this
            // call still recorded as running).
            Err(Error::Timeout { what, after }) if self.gpu.is_none() => Err(Error::Timeout {
                what: format!("{what}; last calls: {}", self.hang_report()),
                after,
            }),
            r => r,
        };
        self.recorder.finish(seq, r.is_ok());
        r
    }

    /// The call check of the `seq`-th call (check.rs); one relaxed load when it is off.
    fn checked(&self, call: &Call, seq: u64) -> Result<()> {
        if self.check.enabled() {
            self.check
                .check(self.res.comm().bootstrap().as_ref(), call, seq, false)
        } else {
            Ok(())
        }
    }

    /// A call of no elements: nothing runs, but it is recorded and, with the call check on,
    /// compared like any other (a rank passing 0 where the others pass a count fails at once).
    /// The NCCL library calls it for the calls it answers without choosing an algorithm.
    pub fn empty_call(&self, call: &Call) -> Result<()> {
        let _guard = self.launch.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.recorder.start(call, "none");
        let r = self.checked(call, seq);
        self.recorder.finish(seq, r.is_ok());
        r
    }

    /// With the call check on: tells the other ranks this rank refused `call` (its arguments
    /// or its algorithm's check failed here), so that they fail it too instead of waiting.
    fn refused_call(&self, call: &Call) {
        if !self.check.enabled() {
            return;
        }
        let _guard = self.launch.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.recorder.start(call, "none");
        // This rank fails with its own error; a mismatch here only repeats it.
        let _ = self
            .check
            .check(self.res.comm().bootstrap().as_ref(), call, seq, true);
        self.recorder.finish(seq, false);
    }

    /// The last calls of this communicator, oldest first (recorder.rs).
    pub fn recent_calls(&self) -> Vec<recorder::CallRecord> {
        self.recorder.recent()
    }

    /// Whether calls are compared across the ranks before they run (`MSCCLPP_CHECK_CALLS`).
    pub fn check_calls(&self) -> bool {
        self.check.enabled()
    }

    /// Turns the call check on or off (every rank alike, between calls).
    pub fn set_check_calls(&self, on: bool) {
        self.check.set(on)
    }

    /// Whether the deterministic mode is on (`MSCCLPP_DETERMINISTIC`).
    pub fn deterministic(&self) -> bool {
        self.det.on()
    }

    /// Turns the deterministic mode on or off (every rank alike, between calls).
    pub fn set_deterministic(&self, on: bool) {
        self.det.set(on)
    }

    /// Sends this rank's last call to every peer and collects theirs for up to
    /// [`recorder::REPORT_WAIT`] (what a timed-out host wait appends to its error; a watchdog
    /// may call it when it thinks the job hangs, while the other ranks' calls time out or
    /// they call it too): "rank 0 (this rank) reached call #7 allreduce ...; rank 1 reached
    /// ...".
    pub fn hang_report(&self) -> String {
        recorder::peer_report(self.res.comm().bootstrap(), &self.recorder)
    }

    /// Runs `algo` for `call` (the launch lock held).
    ///
    /// # Safety
    /// As [`Collectives::run_choice`].
    unsafe fn launch_choice(
        &self,
        call: &Call,
        algo: &Arc<dyn Algorithm>,
        stream: RawStream,
    ) -> Result<()> {
        let algo = &self.plan_or_native(call, algo, stream)?;
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            let slot = &mut last[call.kind as usize];
            if slot.replace(algo.name()) != Some(algo.name()) {
                crate::log_info!(
                    "COLL",
                    "rank {}: {} of {} bytes runs {}",
                    self.res.rank(),
                    call.kind,
                    call.bytes(),
                    algo.description()
                );
            }
        }
        crate::log_trace!(
            "COLL",
            "rank {}: {} {} of {} {} ({} {}) on stream {stream:#x}: {}",
            self.res.rank(),
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
            Some(gpu) => algo.launch_gpu(&self.res, gpu, call, stream),
            // The host "kernels" wait on peers' memory: a peer the bootstrap lost ends those
            // waits at once, naming it, instead of at their timeout.
            None => {
                crate::backoff::watching(self.liveness.clone(), || algo.run_host(&self.res, call))
            }
        }
    }

    /// Runs `call` with the chosen algorithm.
    ///
    /// # Safety
    /// As the public collectives.
    unsafe fn run(&self, call: Call, stream: RawStream) -> Result<()> {
        if call.count == 0 {
            return self.empty_call(&call);
        }
        let choice = self
            .choose(&call)
            .inspect_err(|_| self.refused_call(&call))?;
        // SAFETY: forwarded from the caller.
        unsafe { self.run_choice(&choice, stream) }
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
        let call = Call::all_reduce(send, recv, count, dtype, op);
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
        if root >= self.res.nranks() {
            return Err(Error::invalid(format!(
                "broadcast: root {root}: expected a rank below {}",
                self.res.nranks()
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

/// A [`crate::backoff::Watch`] that fails once `bootstrap` lost a peer (it died without
/// closing its bootstrap), naming the rank.
pub fn peer_liveness(bootstrap: &Arc<dyn crate::bootstrap::Bootstrap>) -> crate::backoff::Watch {
    let b = Arc::downgrade(bootstrap);
    Arc::new(
        move || match b.upgrade().and_then(|b| b.first_peer_failure()) {
            None => Ok(()),
            Some((peer, why)) => Err(Error::remote(
                peer,
                format!("rank {peer} failed in the middle of a collective: {why}"),
            )),
        },
    )
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
    fn choose_named_checks_like_choose() {
        use std::time::Duration;
        let id = crate::TcpBootstrap::create_unique_id().unwrap();
        let mut b = crate::TcpBootstrap::new(0, 1).unwrap();
        b.initialize_with_id(&id, Duration::from_secs(10)).unwrap();
        let comm = Arc::new(Communicator::new(
            Arc::new(b),
            crate::Context::new().unwrap(),
        ));
        let cfg = CollectivesConfig {
            ll_half_bytes: 4096,
            plain_bytes: 4096,
            ..CollectivesConfig::default()
        };
        let coll = Collectives::builder(comm)
            .config(cfg)
            .without_plans()
            .build()
            .unwrap();
        let send: Vec<u32> = (0..16).collect();
        let mut recv = vec![0u32; 16];
        let call = Call {
            kind: CollectiveKind::AllReduce,
            send: send.as_ptr() as u64,
            recv: recv.as_mut_ptr() as u64,
            count: 16,
            dtype: DataType::U32,
            op: ReduceOp::Sum,
            root: 0,
        };
        let e = coll.choose_named(&call, "bogus").unwrap_err().to_string();
        assert!(e.contains("bogus") && e.contains("copy"), "{e}");
        let null = Call { send: 0, ..call };
        assert!(coll.choose_named(&null, "copy").is_err());
        let c = coll.choose_named(&call, "copy").unwrap();
        assert_eq!(c.name(), "copy");
        // SAFETY: both vectors hold 16 u32 and outlive the (synchronous, host) call.
        unsafe { coll.run_choice(&c, 0) }.unwrap();
        assert_eq!(recv, send);
    }

    #[test]
    fn env_forcing() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            crate::env::Env::from_lookup(move |k: &str| {
                pairs
                    .iter()
                    .find(|(a, _)| *a == k)
                    .map(|(_, v)| v.to_string())
            })
        };
        let natives = collection::native_catalogue();
        let forced_from_env = |env: &crate::env::Env| forced_from_env(env, natives);
        let f = forced_from_env(&env(&[("MSCCLPP_ALLREDUCE_ALGO", "allpair_packet")])).unwrap();
        assert_eq!(f.get(&CollectiveKind::AllReduce), Some(&"allpair_packet"));
        let e = forced_from_env(&env(&[("MSCCLPP_ALLREDUCE_ALGO", "bogus")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("allpair_packet") && e.contains("bogus"), "{e}");
        assert_eq!(e.matches("invalid usage").count(), 1, "one prefix: {e}");
        let f =
            forced_from_env(&env(&[("MSCCLPP_ALGORITHM", "allreduce=allpair_packet")])).unwrap();
        assert_eq!(f.len(), 1);
        assert!(forced_from_env(&env(&[("MSCCLPP_ALGORITHM", "gather=x")])).is_err());
    }
}
