//! The deterministic mode (`MSCCLPP_DETERMINISTIC=1`, off by default): every all-reduce and
//! reduce-scatter folds the ranks' values in rank order, `((x0 op x1) op x2) ...`, in the same
//! accumulator type (f32 for f16/bf16/fp8, the type itself otherwise), narrowing once at the
//! end (Avg divides the folded sum once), so a result's bits do not depend on the algorithm,
//! the message size, registration or the node layout, nor on the run.
//!
//! What folds in rank order already (checked in the code): every native single-node all-reduce
//! and reduce-scatter that reduces through the memory of the ranks, on the host backend
//! (`host_math::reduce_into` over the sources indexed by rank, accumulating in `HostElem::Acc`)
//! and in the kernels (`mesh.hpp`'s reduction of n sources in rank order, `Elem<T>::Acc`: f32
//! for the narrow types): `allpair_packet`, `packet`, `rsag`, `rsag_pipeline`,
//! `rsag_port_channel`, `rsag_zero_copy` and reduce-scatter `fullmesh` and `packet`
//! ([`RANK_ORDER`]). The
//! mode restricts the choice to those: a forced algorithm outside the list is an error; an
//! NVLS variant (the switch adds in its own order), an execution plan or an added algorithm
//! the selector picks is replaced by the native rules' choice without NVLS.
//!
//! Across nodes the hierarchical algorithms add each node's partial sum, a different order,
//! so the mode runs [`GatherFold`] instead: every rank receives the inputs it needs from
//! every rank over the bootstrap and folds them in rank order itself. Host backend only: on
//! GPUs a world spanning nodes is refused with an error saying so.
//!
//! All-gather and broadcast move data without arithmetic and are left alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::algorithm::{Algorithm, Call};
use super::gpu::GpuCtx;
use super::host_math::{reduce_into, with_elem, HostElem};
use super::setup::Resources;
use super::types::{CollectiveKind, RawStream};
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::transport::DeviceType;

/// The native algorithms that fold in rank order, per reducing collective.
pub const RANK_ORDER: &[(CollectiveKind, &[&str])] = &[
    (
        CollectiveKind::AllReduce,
        &[
            "allpair_packet",
            "packet",
            "rsag",
            "rsag_pipeline",
            "rsag_port_channel",
            "rsag_zero_copy",
            "copy",
        ],
    ),
    (
        CollectiveKind::ReduceScatter,
        &["fullmesh", "packet", "copy"],
    ),
];

/// The name of the algorithm the mode runs across nodes.
pub const GATHER_FOLD: &str = "gather_fold";

/// Bootstrap tag of [`GatherFold`]'s data.
const TAG_GATHER: u64 = 0xC4EC_0020;
/// The largest bootstrap message [`GatherFold`] sends (larger calls go in pieces).
const PIECE_BYTES: usize = 64 << 20;

/// Whether the mode restricts `kind` (the reducing collectives).
pub fn restricts(kind: CollectiveKind) -> bool {
    matches!(
        kind,
        CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
    )
}

/// The rank-order algorithms of `kind` (all of them for the collectives without arithmetic:
/// `None`).
pub fn rank_order_names(kind: CollectiveKind) -> Option<&'static [&'static str]> {
    RANK_ORDER.iter().find(|(k, _)| *k == kind).map(|(_, n)| *n)
}

/// Whether `algo` folds in rank order.
pub fn folds_in_rank_order(algo: &dyn Algorithm) -> bool {
    algo.name() == GATHER_FOLD
        || rank_order_names(algo.kind()).is_none_or(|names| names.contains(&algo.name()))
}

/// The error of a forced algorithm the mode refuses.
pub fn refused(algo: &dyn Algorithm) -> Error {
    Error::invalid(format!(
        "{} {}: {}=1 runs only algorithms that fold the ranks in rank order: expected one of {}",
        algo.kind(),
        algo.name(),
        crate::env::DETERMINISTIC,
        rank_order_names(algo.kind())
            .unwrap_or(&[])
            .iter()
            .chain(std::iter::once(&GATHER_FOLD))
            .copied()
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// All-reduce or reduce-scatter across nodes in rank order: every rank receives the inputs it
/// needs from every rank over the bootstrap and folds them itself (host backend).
pub struct GatherFold {
    kind: CollectiveKind,
    bootstrap: Arc<dyn Bootstrap>,
}

impl std::fmt::Debug for GatherFold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GatherFold({})", self.kind)
    }
}

impl GatherFold {
    /// The all-reduce (`kind` AllReduce) or reduce-scatter of a communicator.
    pub fn new(kind: CollectiveKind, bootstrap: Arc<dyn Bootstrap>) -> GatherFold {
        GatherFold { kind, bootstrap }
    }

    fn run<T: HostElem>(&self, call: &Call) -> Result<()> {
        let b = &*self.bootstrap;
        let (me, n) = (b.rank(), b.nranks());
        let size = std::mem::size_of::<T>();
        let bytes = call.count * size;
        let piece = (PIECE_BYTES / size).max(1) * size;
        let mut lo = 0;
        while lo < bytes {
            let hi = (lo + piece).min(bytes);
            // The byte range [lo, hi) of block `p` (reduce-scatter) or of the buffer.
            let src = |p: usize| -> u64 {
                let block = if self.kind == CollectiveKind::ReduceScatter {
                    p * bytes
                } else {
                    0
                };
                call.send + (block + lo) as u64
            };
            for p in (0..n).filter(|&p| p != me) {
                // SAFETY: the caller's send buffer holds the block (the call's contract).
                let data =
                    unsafe { std::slice::from_raw_parts(src(p) as usize as *const u8, hi - lo) };
                b.send(data, p, TAG_GATHER)?;
            }
            let mut got: Vec<Vec<u8>> = Vec::with_capacity(n);
            for p in 0..n {
                got.push(if p == me {
                    Vec::new()
                } else {
                    let m = b.recv(p, TAG_GATHER)?;
                    if m.len() != hi - lo {
                        return Err(Error::invalid(format!(
                            "{} {GATHER_FOLD}: rank {p} sent {} bytes, expected {} (did every \
                             rank pass the same count and datatype?)",
                            self.kind,
                            m.len(),
                            hi - lo
                        )));
                    }
                    m
                });
            }
            let ptrs: Vec<*const T> = (0..n)
                .map(|p| {
                    if p == me {
                        src(me) as usize as *const T
                    } else {
                        got[p].as_ptr().cast::<T>()
                    }
                })
                .collect();
            let out = (call.recv + lo as u64) as usize as *mut T;
            // SAFETY: every source holds (hi - lo) bytes (own: the caller's send buffer; it may
            // alias `out`, which reduce_into allows); recv holds the call's bytes.
            unsafe { reduce_into::<T>(call.op, n, out, &ptrs, (hi - lo) / size) };
            lo = hi;
        }
        Ok(())
    }
}

impl Algorithm for GatherFold {
    fn name(&self) -> &'static str {
        GATHER_FOLD
    }
    fn kind(&self) -> CollectiveKind {
        self.kind
    }
    fn check(&self, res: &Resources, _call: &Call) -> Result<()> {
        match res.device().kind {
            DeviceType::Cpu => Ok(()),
            DeviceType::Gpu => Err(Error::invalid(format!(
                "{} across nodes with {}=1: the rank-order fold between nodes ({GATHER_FOLD}) \
                 runs on the host backend only; it is not implemented on GPUs yet (unset {} \
                 or run within one node)",
                self.kind,
                crate::env::DETERMINISTIC,
                crate::env::DETERMINISTIC
            ))),
        }
    }
    fn launch_gpu(
        &self,
        res: &Resources,
        _gpu: &GpuCtx,
        call: &Call,
        _stream: RawStream,
    ) -> Result<()> {
        self.check(res, call)
    }
    fn run_host(&self, _res: &Resources, call: &Call) -> Result<()> {
        with_elem!(call.dtype, T => self.run::<T>(call))
    }
    fn multi_node(&self) -> bool {
        true
    }
}

/// The deterministic state of one `Collectives`: on or off, and its [`GatherFold`]s.
pub struct Deterministic {
    on: AtomicBool,
    gather_fold: Vec<Arc<dyn Algorithm>>,
}

impl std::fmt::Debug for Deterministic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deterministic")
            .field("on", &self.on())
            .finish()
    }
}

impl Deterministic {
    /// On or off, for the communicator of `bootstrap`.
    pub fn new(on: bool, bootstrap: &Arc<dyn Bootstrap>) -> Deterministic {
        Deterministic {
            on: AtomicBool::new(on),
            gather_fold: [CollectiveKind::AllReduce, CollectiveKind::ReduceScatter]
                .into_iter()
                .map(|k| Arc::new(GatherFold::new(k, bootstrap.clone())) as Arc<dyn Algorithm>)
                .collect(),
        }
    }
    /// Whether the mode is on.
    #[inline]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }
    /// Turns the mode on or off (every rank alike, between calls).
    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed)
    }
    /// The [`GatherFold`] of `kind`.
    pub fn gather_fold(&self, kind: CollectiveKind) -> Option<Arc<dyn Algorithm>> {
        self.gather_fold.iter().find(|a| a.kind() == kind).cloned()
    }
}
