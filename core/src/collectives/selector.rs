//! The default choice of algorithm by collective, message size, world size, ranks per node
//! and GPU architecture (NVLS variants first where NVLS is usable and every rank is on one
//! node, see `nvls::selector_prefs`; else upstream's single-node rules without NVLS, with our
//! measured limits, smaller with more ranks: all-reduce `allpair_packet` up to 2 MiB with 2
//! ranks (128 KiB with 3-4, 64 KiB with 5-8), `packet` up to 1 MiB (512 KiB with 5-8 ranks,
//! [`allreduce_packet_max_bytes`]), larger `rsag`; all-gather,
//! reduce-scatter and broadcast `packet` up to [`packet_max_bytes`], then `zero_copy` on
//! registered buffers or `fullmesh`). The large-size choice is measured: two ranks sharing one
//! H200 (2026-12-01, `coll_perf -np 2` with each algorithm forced, docs/perf.md),
//! `rsag` took 12.3 / 103.0 / 786.4 us at 4 / 32 / 256 MiB where `rsag_pipeline` took 25.5 /
//! 129.5 / 921.1.

use std::sync::Arc;

use super::algorithm::{Algorithm, Call};
use super::collection::Collection;
use super::plan::PlanAlgorithm;
use super::types::CollectiveKind;
use crate::error::{Error, Result};

/// What the selector looks at.
#[derive(Clone, Copy, Debug)]
pub struct Query {
    /// The collective.
    pub kind: CollectiveKind,
    /// Bytes per rank of the call (all-reduce: the buffer; all-gather: what one rank sends).
    pub bytes: usize,
    /// World size.
    pub nranks: usize,
    /// Ranks on this node.
    pub nranks_per_node: usize,
    /// Nodes of the world (the ranks span nodes when > 1).
    pub nnodes: usize,
    /// GPU compute capability ((0, 0) on the host backend).
    pub arch: (u32, u32),
    /// Whether the host backend runs the call.
    pub host: bool,
    /// Whether the NVLS variants may be picked (NVLS usable on the communicator's device; on
    /// the host backend also opted in by `MSCCLPP_NVLS_EMULATION=1`); they are picked only
    /// when every rank is on this node too.
    pub nvls: bool,
    /// Whether the caller says the call's buffers are registered on every rank
    /// ([`super::Collectives::choose_registered`]): then an algorithm working straight between
    /// the user buffers (zero-copy) is preferred where one exists and wins at this size.
    pub registered: bool,
}

/// The first algorithm of `preferences` (in order) that `algos` holds, or an error naming them.
fn first_registered(
    algos: &Collection,
    kind: CollectiveKind,
    preferences: &[&'static str],
) -> Result<&'static str> {
    preferences
        .iter()
        .copied()
        .find(|n| algos.find(kind, n).is_some())
        .ok_or_else(|| {
            Error::invalid(format!(
                "{kind}: no algorithm for this call yet (wanted one of {}; registered: {})",
                preferences.join(", "),
                algos.names(kind).join(", ")
            ))
        })
}

/// The native algorithm for `q` among `algos` (today's rules, see the module doc): the first
/// of [`preferences`] the collection holds.
pub fn select(q: &Query, algos: &Collection) -> Result<&'static str> {
    select_where(q, algos, |_| true)
}

/// [`select`] taking the first preferred algorithm that `algos` holds and for which `fits`
/// holds (the default choice passes the algorithm's own check of the call, so a call one
/// preference refuses, e.g. a size its scratch cannot hold, takes the next); when none fits,
/// the first one held (its check then reports why).
pub fn select_where(
    q: &Query,
    algos: &Collection,
    fits: impl Fn(&Arc<dyn Algorithm>) -> bool,
) -> Result<&'static str> {
    let prefs = preferences(q);
    let held = || {
        prefs
            .iter()
            .filter_map(move |n| algos.find(q.kind, n).map(|a| (*n, a)))
    };
    if let Some((n, _)) = held().find(|(_, a)| fits(a)) {
        return Ok(n);
    }
    first_registered(algos, q.kind, prefs)
}

/// Bytes per rank (all-gather: sent, reduce-scatter: received, broadcast: the buffer) above
/// which registered buffers take the `zero_copy` all-gather, reduce-scatter and broadcast.
/// Below, the scratch copy of `fullmesh` costs little next to the handshakes both make, while
/// a buffer's first use in `zero_copy` costs a registration (a bootstrap exchange): PyTorch's
/// allocator hook registers every segment, and many small tensors would each pay it. A guess to
/// be measured (nccl-tests `-R` on the H200, `bash .ci/gpu-check reg`); every size the
/// issue-28 target covers (4 MiB and up in total at 2 to 4 ranks) is above it.
pub const ZERO_COPY_MIN_BYTES: usize = 256 << 10;

// The one-hop limits below come from `coll_perf` runs of each algorithm forced, on an H100
// shared by 2, 4 and 8 ranks under MPS (half, graph mode, checked; docs/perf.md round 28, call
// 3). Above 8 ranks nothing was measured: the limits there are smaller than 8 ranks' (half;
// the all-reduce keeps its 16 KiB of before), since each rank sends or receives n - 1 copies of
// its part. A call whose packets do not fit one LL half (8 MiB by default) is refused by the
// algorithm's own check, and the next preference runs.

/// `limits[i]` for world sizes up to 2, 4, 8 and above (the tiers of the one-hop limits).
fn by_world_size(nranks: usize, limits: [usize; 4]) -> usize {
    match nranks {
        0..=2 => limits[0],
        3..=4 => limits[1],
        5..=8 => limits[2],
        _ => limits[3],
    }
}

/// Bytes up to which the all-reduce takes `allpair_packet` (every rank sends its whole buffer to
/// every peer in one LL hop) before `packet` (two LL hops) or `rsag`: 2 MiB with 2 ranks, 128
/// KiB with 3-4, 64 KiB with 5-8, 16 KiB with more. Measured: with 2 ranks 5.1 / 8.7 us at 1 /
/// 2 MiB where `packet` took 5.7 / 9.2 and `rsag` 10.1 at 2 MiB; with 4 ranks 4.9 at 128 KiB
/// against 6.9, even at 256 KiB (6.9 / 6.8); with 8 ranks 7.8 at 64 KiB against 11.6, but 12.9-15.1
/// at 128 KiB against 11.8-12.0.
pub fn allpair_packet_max_bytes(nranks: usize) -> usize {
    by_world_size(nranks, [2 << 20, 128 << 10, 64 << 10, 16 << 10])
}

/// Bytes per rank up to which the all-gather takes `packet` (one LL hop) before `fullmesh` (two
/// handshakes around its copies) or `zero_copy`: 1 MiB with 2 ranks, 512 KiB with 3-4, 128 KiB
/// with 5-8, 64 KiB with more. Measured (sizes in all, as nccl-tests): with 2 ranks 5.8 us at
/// 2 MiB against 10.4 for `fullmesh` (and 8.7 for `zero_copy` on registered buffers), 9.3 at 4
/// MiB against 10.8 (`zero_copy` 9.0); with 4 ranks 12.6 at 2 MiB against 18.4, 29.4 at 4 MiB
/// against 20.7; with 8 ranks 18.7 at 1 MiB against 29.4, 42.9 at 2 MiB against 31.3.
pub fn allgather_packet_max_bytes(nranks: usize) -> usize {
    by_world_size(nranks, [1 << 20, 512 << 10, 128 << 10, 64 << 10])
}

/// Bytes per rank (what a rank receives) up to which the reduce-scatter takes `packet` (one LL
/// hop) before `fullmesh` or `zero_copy`: 1 MiB with 2 ranks, 512 KiB with 3-4, 128 KiB with
/// 5-8, 64 KiB with more. Measured as [`allgather_packet_max_bytes`]: with 2 ranks 5.4 us at 2
/// MiB in all against 9.5 for `fullmesh`, 9.2 at 4 MiB against 10.0 (but `zero_copy` 8.1 on
/// registered buffers, hence 1 MiB per rank); with 4 ranks 12.6-15.3 at 2 MiB against 16.6, 29.8
/// at 4 MiB against 20.3; with 8 ranks 18.6 at 1 MiB against 25.6, 45.4 at 2 MiB against 30.0.
pub fn reducescatter_packet_max_bytes(nranks: usize) -> usize {
    by_world_size(nranks, [1 << 20, 512 << 10, 128 << 10, 64 << 10])
}

/// Bytes up to which the broadcast takes `packet` (one LL hop from the root) before `fullmesh`
/// (a handshake before its copies) or `zero_copy`: 2 MiB with 2 ranks (its packets then fill one
/// LL half of the default 8 MiB), 1 MiB with 3-4, 512 KiB with 5-8, 256 KiB with more.
/// Measured: 4.3 / 8.7 us at 1 MiB with 2 / 4 ranks where `fullmesh` took 9.4 / 14.5 (round
/// 27); with 2 ranks 5.8 at 2 MiB against 9.8 (round 29); with 8 ranks 15.8 at 512 KiB against
/// 19.6 (at 1 MiB the 8 regions do not fit one LL half).
pub fn broadcast_packet_max_bytes(nranks: usize) -> usize {
    by_world_size(nranks, [2 << 20, 1 << 20, 512 << 10, 256 << 10])
}

/// The one-hop packet algorithm's limit of `kind` for `nranks` ranks (the `*_packet_max_bytes`
/// above; all-reduce: `allpair_packet`'s), in the bytes of [`Query::bytes`].
pub fn packet_max_bytes(kind: CollectiveKind, nranks: usize) -> usize {
    match kind {
        CollectiveKind::AllReduce => allpair_packet_max_bytes(nranks),
        CollectiveKind::AllGather => allgather_packet_max_bytes(nranks),
        CollectiveKind::ReduceScatter => reducescatter_packet_max_bytes(nranks),
        CollectiveKind::Broadcast => broadcast_packet_max_bytes(nranks),
    }
}

/// Bytes up to which an all-reduce above `allpair_packet`'s limit takes `packet` (two LL hops)
/// before `rsag` or, on registered buffers, `rsag_zero_copy`: 1 MiB with up to 4 ranks, 512 KiB
/// with 5-8, 256 KiB with more (not measured; halved as the one-hop limits are). Measured on an
/// H100 shared by the ranks (round 30, graph mode): with 4 ranks `packet` 14.5 us at 1 MiB
/// against 14.8 for `rsag`; with 8 ranks 18.1 at 512 KiB against 21.2, but 35.1 at 1 MiB against
/// 22.6.
pub fn allreduce_packet_max_bytes(nranks: usize) -> usize {
    by_world_size(nranks, [1 << 20, 1 << 20, 512 << 10, 256 << 10])
}

/// Bytes (as [`Query::bytes`]) above which a call of `kind` on `nranks` ranks of one node (NVLS
/// off) whose buffers are registered on every rank takes the zero-copy algorithm by default:
/// above the one-hop packet limit ([`packet_max_bytes`]) and above [`ZERO_COPY_MIN_BYTES`]
/// (`zero_copy`) or [`allreduce_packet_max_bytes`] (the all-reduce's `rsag_zero_copy`, after
/// `packet`). The default rules below decide by it; tests size their calls by it to reach the
/// zero-copy path.
pub fn zero_copy_from_bytes(kind: CollectiveKind, nranks: usize) -> usize {
    let min = match kind {
        CollectiveKind::AllReduce => allreduce_packet_max_bytes(nranks),
        _ => ZERO_COPY_MIN_BYTES,
    };
    min.max(packet_max_bytes(kind, nranks))
}

/// Whether `q` (registered on every rank) takes its collective's zero-copy algorithm.
fn zero_copy(q: &Query) -> bool {
    q.registered && q.bytes > zero_copy_from_bytes(q.kind, q.nranks)
}

/// The default rules' algorithms for `q`, best first (see the module doc).
pub fn preferences(q: &Query) -> &'static [&'static str] {
    if q.nranks == 1 {
        return &["copy"];
    }
    if q.nnodes > 1 {
        // Across nodes only the hierarchical algorithms (memory inside the node, port
        // channels between nodes) can run.
        return match q.kind {
            CollectiveKind::AllReduce => &["hier_rsag_port"],
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter => &["hier_port"],
            CollectiveKind::Broadcast => &["hier_allreduce"],
        };
    }
    match q.kind {
        CollectiveKind::AllReduce => {
            if let Some(prefs) =
                super::nvls::selector_prefs(q.nvls, q.nranks, q.nranks_per_node, q.bytes)
            {
                return prefs;
            }
            if q.bytes <= allpair_packet_max_bytes(q.nranks) {
                &["allpair_packet", "packet", "rsag"]
            } else if q.bytes <= allreduce_packet_max_bytes(q.nranks) {
                &["packet", "rsag", "allpair_packet"]
            } else if zero_copy(q) {
                // Registered on every rank (the caller says so, alike on every rank): straight
                // between the user buffers. Measured on one H200, 2 ranks (issue 28): 42.3 us
                // at 32 MiB and 296 us at 256 MiB where rsag took 104.5 and 797. Buffers the
                // cache cannot map on every rank fall back inside the algorithm, alike.
                &["rsag_zero_copy", "rsag", "rsag_pipeline", "packet"]
            } else {
                // Not rsag_zero_copy: its registration on a cache miss is collective, so it
                // is only safe where every rank meets the same buffers (registered buffers,
                // or forced by the user).
                &["rsag", "rsag_pipeline", "packet"]
            }
        }
        // The one-hop packet algorithms first, registered or not: on an H100 shared by 2 ranks
        // (nccl-tests `-R 0` / `-R 1`, round 28) they took 4.5 / 4.9 / 4.6 us at 512 KiB per
        // rank where `zero_copy` took 8.5 / 7.3 / 8.5 (all-gather / reduce-scatter / broadcast
        // of 1 MiB). Above their limits, registered on every rank and above
        // ZERO_COPY_MIN_BYTES: straight between the user buffers (zero_copy.rs; buffers the
        // cache cannot map on every rank fall back to fullmesh inside it, alike).
        CollectiveKind::AllGather if q.bytes <= allgather_packet_max_bytes(q.nranks) => {
            &["packet", "fullmesh", "port_channel"]
        }
        CollectiveKind::AllGather if zero_copy(q) => &["zero_copy", "fullmesh", "port_channel"],
        CollectiveKind::AllGather => &["fullmesh", "port_channel"],
        CollectiveKind::ReduceScatter if q.bytes <= reducescatter_packet_max_bytes(q.nranks) => {
            &["packet", "fullmesh"]
        }
        CollectiveKind::ReduceScatter if zero_copy(q) => &["zero_copy", "fullmesh"],
        CollectiveKind::ReduceScatter => &["fullmesh"],
        CollectiveKind::Broadcast if q.bytes <= broadcast_packet_max_bytes(q.nranks) => {
            &["packet", "fullmesh"]
        }
        CollectiveKind::Broadcast if zero_copy(q) => &["zero_copy", "fullmesh"],
        CollectiveKind::Broadcast => &["fullmesh"],
    }
}

/// What a selector sees for one call: the call, the facts the default rules use, the
/// collection, and the default choice.
pub struct SelectContext<'a> {
    /// The call (arguments validated).
    pub call: &'a Call,
    /// The facts of the call and world the default rules look at.
    pub query: Query,
    /// This rank.
    pub rank: usize,
    pub(crate) algos: &'a Collection,
    pub(crate) plans: &'a [Arc<PlanAlgorithm>],
    pub(crate) res: &'a super::setup::Resources,
}

impl SelectContext<'_> {
    /// Every algorithm of the collection.
    pub fn algorithms(&self) -> &[Arc<dyn Algorithm>] {
        self.algos.all()
    }
    /// The algorithm `name` of `kind`, if the collection has one.
    pub fn find(&self, kind: CollectiveKind, name: &str) -> Option<Arc<dyn Algorithm>> {
        self.algos.find(kind, name).cloned()
    }
    /// The plan of the plan directory that runs this call, if any (the narrowest size range
    /// among the matching ones, then the first file).
    pub fn plan(&self) -> Option<Arc<dyn Algorithm>> {
        let mut best: Option<&Arc<PlanAlgorithm>> = None;
        for p in self.plans {
            if p.kind() != self.call.kind || p.mismatch(self.res, self.call).is_some() {
                continue;
            }
            if best.is_none_or(|b| p.range_width() < b.range_width()) {
                best = Some(p);
            }
        }
        best.map(|p| p.clone() as Arc<dyn Algorithm>)
    }
    /// The native choice of today's rules: the first preferred algorithm whose own check
    /// takes the call ([`select_where`]).
    pub fn native(&self) -> Result<Arc<dyn Algorithm>> {
        let name = select_where(&self.query, self.algos, |a| {
            a.check(self.res, self.call).is_ok()
        })?;
        self.algos.get(self.call.kind, name).cloned()
    }
    /// The default selector's choice: a matching plan first, else [`SelectContext::native`].
    pub fn default_choice(&self) -> Result<Arc<dyn Algorithm>> {
        match self.plan() {
            Some(p) => Ok(p),
            None => self.native(),
        }
    }
}

/// Chooses the algorithm of a call (replaces the default selector of a `Collectives`).
/// `Ok(None)` leaves the call to the default choice ([`SelectContext::default_choice`]).
/// Must decide alike on every rank (from the call's collective, sizes and types and the world,
/// never from the rank or buffer addresses). A forced algorithm (`MSCCLPP_<KIND>_ALGO`,
/// `force_algorithm`) is taken before any selector is asked. Closures
/// `Fn(&SelectContext) -> Result<Option<Arc<dyn Algorithm>>>` are selectors.
pub trait Selector: Send + Sync {
    /// The algorithm for `ctx.call`, or `None` for the default choice.
    fn select(&self, ctx: &SelectContext<'_>) -> Result<Option<Arc<dyn Algorithm>>>;
}

impl<F> Selector for F
where
    F: Fn(&SelectContext<'_>) -> Result<Option<Arc<dyn Algorithm>>> + Send + Sync,
{
    fn select(&self, ctx: &SelectContext<'_>) -> Result<Option<Arc<dyn Algorithm>>> {
        self(ctx)
    }
}

/// The process-wide selector ([`set_global_selector`]).
fn global_slot() -> &'static std::sync::Mutex<Option<Arc<dyn Selector>>> {
    static G: std::sync::OnceLock<std::sync::Mutex<Option<Arc<dyn Selector>>>> =
        std::sync::OnceLock::new();
    G.get_or_init(|| std::sync::Mutex::new(None))
}

/// Makes `selector` the selector of every `Collectives` created afterwards in this process
/// without one of its own (e.g. the communicators of the NCCL library); `None` restores the
/// default. Every rank must set the same.
pub fn set_global_selector(selector: Option<Arc<dyn Selector>>) {
    *global_slot().lock().unwrap_or_else(|p| p.into_inner()) = selector;
}

/// The process-wide selector, if one was set.
pub(crate) fn global_selector() -> Option<Arc<dyn Selector>> {
    global_slot()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call of `bytes` on `nranks` ranks of one node (an H100/H200, NVLS off).
    fn one_node(kind: CollectiveKind, bytes: usize, nranks: usize, registered: bool) -> Query {
        Query {
            kind,
            bytes,
            nranks,
            nranks_per_node: nranks,
            nnodes: 1,
            arch: (9, 0),
            host: false,
            nvls: false,
            registered,
        }
    }

    fn pick(kind: CollectiveKind, bytes: usize, nranks: usize) -> &'static str {
        let q = one_node(kind, bytes, nranks, false);
        let algos = super::super::collection::native_catalogue();
        let name = select(&q, algos).unwrap();
        assert!(
            nranks == 1 || algos.find(kind, name).is_some(),
            "{kind} picks the unregistered {name}"
        );
        name
    }

    #[test]
    fn defaults_by_size() {
        use CollectiveKind::*;
        assert_eq!(pick(AllReduce, 1 << 10, 8), "allpair_packet");
        // allpair_packet: 2 MiB with 2 ranks, 128 KiB with 3-4, 64 KiB with 5-8, 16 KiB above.
        assert_eq!(pick(AllReduce, 2 << 20, 2), "allpair_packet");
        assert_eq!(pick(AllReduce, (2 << 20) + 1, 2), "rsag");
        assert_eq!(pick(AllReduce, 128 << 10, 4), "allpair_packet");
        assert_eq!(pick(AllReduce, (128 << 10) + 1, 4), "packet");
        assert_eq!(pick(AllReduce, 1 << 20, 4), "packet");
        assert_eq!(pick(AllReduce, (1 << 20) + 1, 4), "rsag");
        assert_eq!(pick(AllReduce, 64 << 10, 8), "allpair_packet");
        assert_eq!(pick(AllReduce, (64 << 10) + 1, 8), "packet");
        // packet: 1 MiB with up to 4 ranks, 512 KiB with 5-8, 256 KiB with more.
        assert_eq!(pick(AllReduce, 512 << 10, 8), "packet");
        assert_eq!(pick(AllReduce, (512 << 10) + 1, 8), "rsag");
        assert_eq!(pick(AllReduce, 256 << 10, 16), "packet");
        assert_eq!(pick(AllReduce, (256 << 10) + 1, 16), "rsag");
        assert_eq!(pick(AllReduce, 16 << 10, 16), "allpair_packet");
        assert_eq!(pick(AllReduce, (16 << 10) + 1, 16), "packet");
        assert_eq!(pick(AllReduce, 1 << 30, 8), "rsag");
        // All-gather, reduce-scatter, broadcast: one LL hop up to their limits, then fullmesh.
        for kind in [AllGather, ReduceScatter, Broadcast] {
            for n in [2, 3, 4, 8, 16] {
                let max = packet_max_bytes(kind, n);
                assert_eq!(pick(kind, 1, n), "packet", "{kind} {n}");
                assert_eq!(pick(kind, max, n), "packet", "{kind} {n}");
                assert_eq!(pick(kind, max + 1, n), "fullmesh", "{kind} {n}");
                assert_eq!(pick(kind, 1 << 30, n), "fullmesh", "{kind} {n}");
            }
        }
        // The limits shrink with the world size (each rank sends or receives n - 1 copies).
        for kind in [AllReduce, AllGather, ReduceScatter, Broadcast] {
            for (a, b) in [(2, 4), (4, 8), (8, 16)] {
                assert!(
                    packet_max_bytes(kind, b) <= packet_max_bytes(kind, a),
                    "{kind} {a} {b}"
                );
            }
        }
        assert_eq!(allgather_packet_max_bytes(2), 1 << 20);
        assert_eq!(allgather_packet_max_bytes(8), 128 << 10);
        assert_eq!(reducescatter_packet_max_bytes(4), 512 << 10);
        assert_eq!(reducescatter_packet_max_bytes(8), 128 << 10);
        assert_eq!(broadcast_packet_max_bytes(2), 2 << 20);
        assert_eq!(broadcast_packet_max_bytes(8), 512 << 10);
        assert_eq!(pick(Broadcast, 1 << 20, 1), "copy");
    }

    #[test]
    fn registered_buffers_take_zero_copy_above_one_mib() {
        let q = |bytes, registered| one_node(CollectiveKind::AllReduce, bytes, 4, registered);
        assert_eq!(select_n(&q(4 << 20, true)).unwrap(), "rsag_zero_copy");
        assert_eq!(select_n(&q(4 << 20, false)).unwrap(), "rsag");
        // Small calls keep the packet algorithms, registered or not.
        assert_eq!(select_n(&q(1 << 20, true)).unwrap(), "packet");
        assert_eq!(select_n(&q(1 << 10, true)).unwrap(), "allpair_packet");
    }

    #[test]
    fn registered_buffers_take_zero_copy_gathers_scatters_and_broadcasts() {
        for kind in [
            CollectiveKind::AllGather,
            CollectiveKind::ReduceScatter,
            CollectiveKind::Broadcast,
        ] {
            for (n, bytes) in [2, 4, 8].into_iter().flat_map(|n| {
                let max = packet_max_bytes(kind, n);
                [
                    1,
                    ZERO_COPY_MIN_BYTES,
                    ZERO_COPY_MIN_BYTES + 1,
                    max,
                    max + 1,
                    1 << 30,
                ]
                .map(|b| (n, b))
            }) {
                let q = |registered| one_node(kind, bytes, n, registered);
                // Up to their limits the one-hop packet algorithms, registered or not; above,
                // zero_copy on registered buffers above ZERO_COPY_MIN_BYTES, else fullmesh.
                let small = bytes <= packet_max_bytes(kind, n);
                let plain = if small { "packet" } else { "fullmesh" };
                let want = if !small && bytes > ZERO_COPY_MIN_BYTES {
                    "zero_copy"
                } else {
                    plain
                };
                assert_eq!(select_n(&q(true)).unwrap(), want, "{kind} {bytes} {n}");
                assert_eq!(select_n(&q(false)).unwrap(), plain, "{kind} {bytes} {n}");
            }
        }
    }

    #[test]
    fn zero_copy_from_bytes_is_where_registered_calls_turn_zero_copy() {
        for kind in [
            CollectiveKind::AllReduce,
            CollectiveKind::AllGather,
            CollectiveKind::ReduceScatter,
            CollectiveKind::Broadcast,
        ] {
            let want = match kind {
                CollectiveKind::AllReduce => "rsag_zero_copy",
                _ => "zero_copy",
            };
            for n in [2, 3, 4, 8, 16] {
                let from = zero_copy_from_bytes(kind, n);
                let q = |bytes| one_node(kind, bytes, n, true);
                assert_ne!(select_n(&q(from)).unwrap(), want, "{kind} {from} {n}");
                assert_eq!(select_n(&q(from + 1)).unwrap(), want, "{kind} {from} {n}");
            }
        }
    }

    #[test]
    fn the_first_preference_that_fits_is_taken() {
        let q = one_node(CollectiveKind::AllReduce, 1 << 10, 4, false);
        let algos = super::super::collection::native_catalogue();
        let not = |name: &'static str| move |a: &Arc<dyn Algorithm>| a.name() != name;
        assert_eq!(select_where(&q, algos, |_| true).unwrap(), "allpair_packet");
        assert_eq!(
            select_where(&q, algos, not("allpair_packet")).unwrap(),
            "packet"
        );
        // None fits: the first one held (its check then names the limit).
        assert_eq!(
            select_where(&q, algos, |_| false).unwrap(),
            "allpair_packet"
        );
    }

    fn select_n(q: &Query) -> Result<&'static str> {
        select(q, super::super::collection::native_catalogue())
    }

    #[test]
    fn across_nodes() {
        let q = |kind, bytes| Query {
            kind,
            bytes,
            nranks: 16,
            nranks_per_node: 8,
            nnodes: 2,
            arch: (9, 0),
            host: false,
            // Even with NVLS usable, a world spanning nodes takes the hierarchical ones.
            nvls: true,
            registered: true,
        };
        for bytes in [1, 1 << 20, 1 << 30] {
            assert_eq!(
                select_n(&q(CollectiveKind::AllReduce, bytes)).unwrap(),
                "hier_rsag_port"
            );
            for kind in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
                assert_eq!(select_n(&q(kind, bytes)).unwrap(), "hier_port");
            }
            assert_eq!(
                select_n(&q(CollectiveKind::Broadcast, bytes)).unwrap(),
                "hier_allreduce"
            );
        }
    }
}
