//! Execution plans as algorithms of the collection: [`PlanAlgorithm`] runs the executor
//! ([`crate::executor::Executor`]) for the calls its plan matches: its collective, world size,
//! ranks per node, in or out of place, and a message size inside the plan's range that its
//! chunking divides (`ExecutionPlan::input_granularity`; every rank decides alike). Plans
//! reduce with their own operator (the shipped ones with sum), so reducing calls match only
//! with `sum`. The executor sets its channels up over the buffers of a call, so plans run
//! only on buffers this library allocated (`GpuBuffer`, `LocalMemory`, `ncclMemAlloc`); other
//! calls go to the native algorithms (every rank must allocate alike).
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
    /// A buffer the library did not allocate.
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
        let foreign = |ptr: u64, len: usize| crate::memory::find_allocation(ptr, len).is_none();
        if foreign(call.send, send) || foreign(call.recv, recv) {
            return Some(Mismatch::Foreign);
        }
        None
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
                 ncclMemAlloc), got send {:#x}, recv {:#x}",
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
