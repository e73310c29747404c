//! Execution plans as algorithms of the collection: [`PlanAlgorithm`] runs the executor
//! ([`crate::executor::Executor`]) for the calls its plan matches: its collective, world size,
//! ranks per node, in or out of place, and a message size inside the plan's range that its
//! chunking divides (`ExecutionPlan::input_granularity`; every rank decides alike). Plans
//! reduce with their own operator (the shipped ones with sum), so reducing calls match only
//! with `sum`. The executor sets its channels up over the buffers of a call, so plans run on
//! buffers this library allocated (`GpuBuffer`, `LocalMemory`, `ncclMemAlloc`) and on the
//! application's own memory where the backend can adopt it (`cudaMalloc`, PyTorch's caching
//! allocator, cuMem with a shareable handle, a host memfd mapping). Whether every rank can is
//! agreed once per (send, recv) address pair, collectively, when a plan could run a call on
//! them, at its launch (`agree_on_buffers`, from `Collectives::run_choice`): if any rank
//! cannot adopt its buffers, every rank that chose the plan logs (INFO) that it was declined
//! and runs the native choice instead. A first call under graph capture declines without any
//! traffic (and without caching: the next call outside capture agrees). Before an agreement
//! the selection takes a plan where this rank holds or can adopt the buffers.
//!
//! [`load_dir`] reads the plan directory (`MSCCLPP_CACHE_DIR`, upstream's layout: bundled plans
//! in `<dir>/default/`, compiled ones in `<dir>/`) once, when a `Collectives` is built; plans of
//! another world size, NVLS plans on GPUs (as `executor::find_plan`) and files that do not parse
//! (a warning names them) are left out. The default selector takes a matching plan before the
//! native choice; among several, the one with the narrowest size range (then the file name).
//! Broadcast plans are left out (with a warning): the executor takes no root.

use std::path::Path;
use std::sync::Arc;

use super::algorithm::{Algorithm, Call};
use super::collection::intern;
use super::gpu::GpuCtx;
use super::setup::Resources;
use super::types::{CollectiveKind, RawStream, ReduceOp};
use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::executor::cache::plan_files;
use crate::executor::{ExecutionPlan, Executor, PacketType};

/// One execution plan as an algorithm (see the module doc).
pub struct PlanAlgorithm {
    name: &'static str,
    kind: CollectiveKind,
    plan: ExecutionPlan,
    nranks_per_node: usize,
    executor: Arc<Executor>,
}

impl std::fmt::Debug for PlanAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanAlgorithm")
            .field("name", &self.name)
            .field("source", &self.plan.source())
            .finish_non_exhaustive()
    }
}

/// Why a plan cannot run a call ([`PlanAlgorithm::mismatch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// Another world size or ranks per node.
    World,
    /// In place where the plan is out of place, or the other way round.
    Placement,
    /// A reduction other than sum.
    Op,
    /// The message size (`size` bytes, what the plan's range is compared with) is outside
    /// the plan's range, or the send size is not a multiple of its granularity.
    Size {
        /// The size compared with the plan's range.
        size: u64,
    },
    /// A buffer the library did not allocate and the ranks did not agree to adopt.
    Foreign,
}

/// The collective of upstream's plan name (`allreduce`, `allgather`, ...).
fn kind_of(collective: &str) -> Option<CollectiveKind> {
    collective.parse::<CollectiveKind>().ok()
}

impl PlanAlgorithm {
    /// `plan` (loaded for this rank) run by `executor` (of the same communicator). Its ranks
    /// per node are the plan's own field, else its world size (a single-node plan).
    pub fn new(plan: ExecutionPlan, executor: Arc<Executor>) -> Result<PlanAlgorithm> {
        let kind = kind_of(plan.collective()).ok_or_else(|| {
            Error::invalid(format!(
                "plan `{}` ({}): collective `{}`: expected allreduce, allgather, reducescatter or broadcast",
                plan.name(),
                plan.source(),
                plan.collective()
            ))
        })?;
        if kind == CollectiveKind::Broadcast {
            // The executor takes no root: a broadcast plan would run every call from its own.
            return Err(Error::invalid(format!(
                "plan `{}` ({}): broadcast plans are not taken by the collectives (the executor has no root argument)",
                plan.name(),
                plan.source()
            )));
        }
        Ok(PlanAlgorithm {
            name: intern(plan.name()),
            kind,
            nranks_per_node: plan.nranks_per_node().unwrap_or(plan.world_size()),
            plan,
            executor,
        })
    }

    /// The plan.
    pub fn plan(&self) -> &ExecutionPlan {
        &self.plan
    }

    /// Width of the plan's size range (the default selector prefers narrower ones).
    pub fn range_width(&self) -> u64 {
        self.plan.max_message_size() - self.plan.min_message_size()
    }

    /// Runs the plan for `call` on `stream` (0 on the host backend) with this rank's buffer
    /// sizes and the default packet type.
    ///
    /// # Safety
    /// The call's buffers hold those sizes and live until the stream ran the call; `stream`
    /// is 0 or a live stream of this device.
    unsafe fn execute(&self, res: &Resources, call: &Call, stream: RawStream) -> Result<()> {
        let (send, recv) = self.sizes(call, res.nranks());
        // SAFETY: forwarded from the caller.
        unsafe {
            self.executor.execute(
                res.rank(),
                call.send,
                call.recv,
                send,
                recv,
                call.dtype,
                &self.plan,
                stream,
                PacketType::default(),
            )
        }
    }

    /// Why the plan cannot run `call`, or `None` when it can: the comparisons of
    /// [`Algorithm::check`] without its message, so the default selector can test every plan
    /// on every call without formatting an error for each plan that does not match.
    pub(crate) fn mismatch(&self, res: &Resources, call: &Call) -> Option<Mismatch> {
        if let Some(m) = self.call_mismatch(res, call) {
            return Some(m);
        }
        let (send, recv) = self.sizes(call, res.nranks());
        if !self.memory_usable(call, send, recv) {
            return Some(Mismatch::Foreign);
        }
        None
    }

    /// [`PlanAlgorithm::mismatch`] without the buffers' memory: the same on every rank.
    fn call_mismatch(&self, res: &Resources, call: &Call) -> Option<Mismatch> {
        let n = res.nranks();
        if self.plan.world_size() != n || self.nranks_per_node != res.nranks_per_node() {
            return Some(Mismatch::World);
        }
        if call.in_place(res.rank()) != self.plan.is_in_place() {
            return Some(Mismatch::Placement);
        }
        let reduces = matches!(
            call.kind,
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
        );
        if reduces && call.op != ReduceOp::Sum {
            return Some(Mismatch::Op);
        }
        let (send, recv) = self.sizes(call, n);
        let size = if call.kind == CollectiveKind::AllGather {
            recv
        } else {
            send
        } as u64;
        let (lo, hi) = (self.plan.min_message_size(), self.plan.max_message_size());
        let g = self.plan.input_granularity().max(1);
        if size < lo || size > hi || !(send as u64).is_multiple_of(g) {
            return Some(Mismatch::Size { size });
        }
        None
    }

    /// Whether the plan may run on `call`'s buffers: as the ranks agreed for them
    /// (`agree_on_buffers`), else when this rank holds or can adopt both (the agreement at
    /// launch then makes every rank's choice alike).
    fn memory_usable(&self, call: &Call, send: usize, recv: usize) -> bool {
        if let Some(agreed) = self.executor.buffers_agreed(call.send, call.recv) {
            return agreed;
        }
        self.executor
            .adopt_buffers(call.send, send, call.recv, recv)
            .is_ok()
    }

    /// Bytes of the send and receive buffers of `call` on a world of `n`.
    fn sizes(&self, call: &Call, n: usize) -> (usize, usize) {
        let b = call.bytes();
        match call.kind {
            CollectiveKind::AllGather => (b, b * n),
            CollectiveKind::ReduceScatter => (b * n, b),
            _ => (b, b),
        }
    }
}

impl Algorithm for PlanAlgorithm {
    fn name(&self) -> &'static str {
        self.name
    }
    fn kind(&self) -> CollectiveKind {
        self.kind
    }
    fn description(&self) -> String {
        format!("plan `{}` ({})", self.name, self.plan.source())
    }
    fn multi_node(&self) -> bool {
        self.nranks_per_node < self.plan.world_size()
    }

    fn check(&self, res: &Resources, call: &Call) -> Result<()> {
        let Some(why) = self.mismatch(res, call) else {
            return Ok(());
        };
        let (n, per_node) = (res.nranks(), res.nranks_per_node());
        let what = self.description();
        Err(Error::invalid(match why {
            Mismatch::World => format!(
                "{what}: written for {} ranks ({} per node), the communicator has {n} ({per_node} per node)",
                self.plan.world_size(),
                self.nranks_per_node
            ),
            Mismatch::Placement => format!(
                "{what}: expected an {} call",
                if self.plan.is_in_place() {
                    "in-place"
                } else {
                    "out-of-place"
                }
            ),
            Mismatch::Op => format!(
                "{what}: expected op sum (the plan's own reduction), got {}",
                call.op
            ),
            Mismatch::Size { size } => {
                let (lo, hi) = (self.plan.min_message_size(), self.plan.max_message_size());
                let g = self.plan.input_granularity().max(1);
                format!(
                    "{what}: message of {size} bytes: expected {lo}..={hi} bytes with a send size that is a multiple of {g}"
                )
            }
            Mismatch::Foreign => format!(
                "{what}: expected buffers this library allocated (GpuBuffer, LocalMemory, \
                 ncclMemAlloc) or that every rank agreed to adopt (see the collectives' \
                 choice), got send {:#x}, recv {:#x}",
                call.send, call.recv
            ),
        }))
    }

    fn launch_gpu(
        &self,
        res: &Resources,
        _gpu: &GpuCtx,
        call: &Call,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: the collective's contract: the caller's buffers hold the plan's sizes and live
        // until the stream ran the call; `stream` is 0 or a live stream of this device.
        unsafe { self.execute(res, call, stream) }
    }

    fn run_host(&self, res: &Resources, call: &Call) -> Result<()> {
        // SAFETY: as in launch_gpu (host memory; complete on return).
        unsafe { self.execute(res, call, 0) }
    }
}

/// Whether `chosen` (a plan when `is_plan`) may run on `call`'s buffers: the ranks agree on
/// that once per (send, recv) pair, collectively, when some plan of `plans` matches the call
/// but for its memory (the same on every rank) and no agreement was made yet: every rank
/// tries to hold or adopt its buffers (see the module doc), then one bootstrap all-gather
/// decides, and a declined plan is logged (INFO, "declined") on every rank that chose it.
/// `capturing`: the call is being captured into a graph (no traffic: an unagreed pair
/// declines this call only). Called at launch by every rank alike (the collectives'
/// `run_choice`), where every rank's communicators run concurrently.
pub(crate) fn agree_on_buffers(
    plans: &[Arc<PlanAlgorithm>],
    res: &Resources,
    call: &Call,
    capturing: bool,
    is_plan: bool,
) -> Result<bool> {
    let Some(p) = plans
        .iter()
        .find(|p| p.kind == call.kind && p.call_mismatch(res, call).is_none())
    else {
        return Ok(true);
    };
    let ex = &p.executor;
    if let Some(agreed) = ex.buffers_agreed(call.send, call.recv) {
        if !agreed && is_plan {
            return Ok(false);
        }
        return Ok(true);
    }
    if capturing {
        if is_plan {
            crate::log_info!(
                "COLL",
                "rank {}: plan `{}` declined for {} on send {:#x} recv {:#x}: first call on \
                 these buffers under graph capture (run one outside capture to agree on them)",
                res.rank(),
                p.name,
                call.kind,
                call.send,
                call.recv
            );
        }
        return Ok(!is_plan);
    }
    let (send, recv) = p.sizes(call, res.nranks());
    let mine = ex.adopt_buffers(call.send, send, call.recv, recv);
    if let Err(e) = &mine {
        crate::log_info!(
            "COLL",
            "rank {}: plans cannot run on send {:#x} recv {:#x} here: {e}",
            res.rank(),
            call.send,
            call.recv
        );
    }
    let all = res
        .comm()
        .bootstrap()
        .all_gather(&[u8::from(mine.is_ok())])?;
    let refused: Vec<usize> = (0..all.len())
        .filter(|&r| all[r].first() != Some(&1))
        .collect();
    let ok = refused.is_empty();
    ex.set_buffers_agreed(call.send, call.recv, ok, mine.ok());
    if !ok && is_plan {
        crate::log_info!(
            "COLL",
            "rank {}: plan `{}` declined for {} on send {:#x} recv {:#x}: rank(s) {refused:?} \
             cannot adopt their buffers; the native algorithm runs on them",
            res.rank(),
            p.name,
            call.kind,
            call.send,
            call.recv
        );
    }
    Ok(ok || !is_plan)
}

/// The plans of `dir` for this rank of `comm` as algorithms run by one executor on `comm`
/// (see the module doc). `gpu`: whether the collectives run on a GPU (NVLS plans are left out
/// there).
pub fn load_dir(
    dir: &Path,
    comm: &Arc<Communicator>,
    gpu: bool,
) -> Result<Vec<Arc<PlanAlgorithm>>> {
    let (rank, nranks) = (comm.bootstrap().rank(), comm.bootstrap().nranks());
    let mut executor: Option<Arc<Executor>> = None;
    let mut out = Vec::new();
    for f in plan_files(dir) {
        let plan = match ExecutionPlan::from_file(&f, rank) {
            Ok(p) => p,
            Err(e) => {
                // A plan for fewer ranks has no part for this rank: not worth a warning.
                let smaller =
                    ExecutionPlan::from_file(&f, 0).is_ok_and(|p| p.world_size() != nranks);
                if !smaller {
                    crate::log_warn!("COLL", "skipping plan {}: {e}", f.display());
                }
                continue;
            }
        };
        if plan.world_size() != nranks || (gpu && plan.uses_switch_channels()) {
            continue;
        }
        let executor = match &executor {
            Some(e) => e.clone(),
            None => executor
                .insert(Arc::new(Executor::new(comm.clone())?))
                .clone(),
        };
        match PlanAlgorithm::new(plan, executor) {
            Ok(a) => out.push(Arc::new(a)),
            Err(e) => crate::log_warn!("COLL", "skipping plan {}: {e}", f.display()),
        }
    }
    Ok(out)
}
