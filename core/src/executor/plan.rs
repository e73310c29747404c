//! [`ExecutionPlan`]: a plan file parsed and validated for every rank (`super::validate`),
//! held in its in-memory form (`super::model`) for the rank that loaded it.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::PlanError;
use super::json::Protocol;
use super::model::{Op, PlanMeta, RankPlan};
use super::validate;
use crate::error::{Error, Result};

pub(crate) struct PlanInner {
    pub meta: PlanMeta,
    pub ranks: Vec<RankPlan>,
    pub rank: usize,
    pub id: u64,
    /// [`ExecutionPlan::input_granularity`], computed (checked) when the plan is loaded.
    pub granularity: u64,
    pub source: String,
    pub path: Option<PathBuf>,
}

/// A parsed and validated execution plan, for one rank of it.
///
/// Cheap to clone (shared). Parsing checks everything that does not depend on the message
/// size for every rank, so a bad plan is refused the same way on every rank before anything
/// is set up.
#[derive(Clone)]
pub struct ExecutionPlan {
    pub(crate) inner: Arc<PlanInner>,
}

impl std::fmt::Debug for ExecutionPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ExecutionPlan({} {}, {} ranks, rank {})",
            self.inner.meta.collective,
            self.inner.meta.name,
            self.inner.ranks.len(),
            self.inner.rank
        )
    }
}

impl ExecutionPlan {
    /// Reads and validates the plan at `path` for `rank`.
    pub fn from_file(path: impl AsRef<Path>, rank: usize) -> Result<ExecutionPlan> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Executor(format!(
                "execution plan {}: cannot read it: {e}",
                path.display()
            ))
        })?;
        Self::build(&text, rank, path.display().to_string(), Some(path.into()))
    }

    /// Parses and validates a plan from JSON text for `rank`.
    pub fn from_json(text: &str, rank: usize) -> Result<ExecutionPlan> {
        Self::build(text, rank, "(from JSON text)".into(), None)
    }

    /// Parses and validates a plan from JSON text for `rank`, with the typed error
    /// ([`PlanError`]: the JSON path, and for an operation its rank, thread block, index and
    /// name) instead of the crate's [`Error`].
    pub fn parse(text: &str, rank: usize) -> std::result::Result<ExecutionPlan, PlanError> {
        Self::parse_from(text, rank, "(from JSON text)".into(), None)
    }

    fn build(text: &str, rank: usize, source: String, path: Option<PathBuf>) -> Result<Self> {
        Self::parse_from(text, rank, source.clone(), path)
            .map_err(|e| Error::Executor(format!("execution plan {source}: {e}")))
    }

    fn parse_from(
        text: &str,
        rank: usize,
        source: String,
        path: Option<PathBuf>,
    ) -> std::result::Result<Self, PlanError> {
        let plan = validate::parse(text)?;
        let ranks = validate::resolve(&plan)?;
        if rank >= ranks.len() {
            return Err(PlanError::NoSuchRank {
                rank,
                gpus: ranks.len(),
            });
        }
        let mut h = DefaultHasher::new();
        text.hash(&mut h);
        let meta = PlanMeta::of(plan);
        let granularity = granularity(&meta, &ranks)?;
        Ok(ExecutionPlan {
            inner: Arc::new(PlanInner {
                meta,
                ranks,
                rank,
                id: h.finish(),
                granularity,
                source,
                path,
            }),
        })
    }

    /// The plan's name.
    pub fn name(&self) -> &str {
        &self.inner.meta.name
    }
    /// The collective it implements (`allreduce`, `allgather`, ...).
    pub fn collective(&self) -> &str {
        &self.inner.meta.collective
    }
    /// Whether it uses LL packets.
    pub fn is_packet(&self) -> bool {
        self.inner.meta.protocol == Protocol::Ll
    }
    /// `"Simple"` or `"LL"`.
    pub fn protocol(&self) -> &'static str {
        match self.inner.meta.protocol {
            Protocol::Simple => "Simple",
            Protocol::Ll => "LL",
        }
    }
    /// Whether it runs in place (all-reduce: send == recv; all-gather: send inside recv).
    pub fn is_in_place(&self) -> bool {
        self.inner.meta.inplace
    }
    /// Smallest message size (bytes) it is meant for.
    pub fn min_message_size(&self) -> u64 {
        self.inner.meta.min_message_size
    }
    /// Largest message size (bytes) it is meant for.
    pub fn max_message_size(&self) -> u64 {
        self.inner.meta.max_message_size
    }
    /// Ranks the plan is written for.
    pub fn world_size(&self) -> usize {
        self.inner.ranks.len()
    }
    /// Ranks per node, when the plan says (our plans do; upstream's DSL does not write it).
    pub fn nranks_per_node(&self) -> Option<usize> {
        self.inner.meta.nranks_per_node
    }
    /// The rank this plan object was loaded for.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }
    /// Threads per block the plan asks for.
    pub fn num_threads_per_block(&self) -> u32 {
        self.inner.meta.num_threads_per_block
    }
    /// Thread blocks of this rank.
    pub fn num_threadblocks(&self) -> usize {
        self.inner.ranks[self.inner.rank].blocks.len()
    }
    /// Where the plan came from (file path, or a note for JSON text).
    pub fn source(&self) -> &str {
        &self.inner.source
    }
    /// The file it was read from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }
    /// Whether it needs switch channels (NVLS): run on the host backend's multicast emulation,
    /// refused on GPUs (with [`crate::nvls_usable`]'s reason while NVLS is off).
    pub fn uses_switch_channels(&self) -> bool {
        self.inner.ranks.iter().any(RankPlan::uses_switch)
    }
    /// Whether any rank has port channels (served by the host proxy, or on one node by
    /// default run as memory channels: `MSCCLPP_EXECUTOR_PORT_CHANNELS`, docs/executor.md).
    pub fn uses_port_channels(&self) -> bool {
        self.inner.ranks.iter().any(RankPlan::uses_port)
    }
    /// The plan with every port channel as a memory channel (`super::ports`), for ranks that
    /// all share one node; or why it keeps them. Its id differs from this one's.
    pub(crate) fn ports_over_memory(&self) -> std::result::Result<ExecutionPlan, String> {
        let ranks = super::ports::over_memory(&self.inner.ranks)?;
        let mut h = DefaultHasher::new();
        (self.inner.id, "ports over memory").hash(&mut h);
        Ok(ExecutionPlan {
            inner: Arc::new(PlanInner {
                meta: self.inner.meta.clone(),
                ranks,
                rank: self.inner.rank,
                id: h.finish(),
                granularity: self.inner.granularity,
                source: self.inner.source.clone(),
                path: self.inner.path.clone(),
            }),
        })
    }
    /// A hash of the plan text (two plans with one name but different contents differ).
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    /// Operations of this rank (pipelines count with their inner operations).
    pub fn num_operations(&self) -> usize {
        fn count(ops: &[Op]) -> usize {
            ops.iter().map(|o| 1 + count(&o.inner)).sum()
        }
        self.inner.ranks[self.inner.rank]
            .blocks
            .iter()
            .map(|b| count(&b.ops))
            .sum()
    }

    /// The smallest send size (bytes) every rank's chunking divides: valid sizes are its
    /// multiples (within the plan's size range). The receive size is the send size for
    /// all-reduce and `world_size` times it for all-gather.
    pub fn input_granularity(&self) -> u64 {
        self.inner.granularity
    }

    pub(crate) fn meta(&self) -> &PlanMeta {
        &self.inner.meta
    }
    pub(crate) fn rank_plan(&self) -> &RankPlan {
        &self.inner.ranks[self.inner.rank]
    }
    /// The resolved plan of every rank, in rank order.
    pub(crate) fn rank_plans(&self) -> &[RankPlan] {
        &self.inner.ranks
    }
}

fn gcd(mut p: u64, mut q: u64) -> u64 {
    while q != 0 {
        (p, q) = (q, p % q);
    }
    p
}

/// The input granularity of a plan (see [`ExecutionPlan::input_granularity`]): the least
/// multiple `u` of every rank's `alignment * input_chunks` whose receive size (`u`, or
/// `world_size * u` for all-gather) is a multiple of every rank's `alignment *
/// output_chunks`. In closed form (no search): `lcm(unit_in, unit_out / gcd(unit_out,
/// ratio))`. Every step is checked: a plan whose sizes overflow 64 bits is refused naming the
/// field that did.
fn granularity(meta: &PlanMeta, ranks: &[RankPlan]) -> std::result::Result<u64, PlanError> {
    let a = u64::from(meta.buffer_alignment).max(1);
    let ratio = if meta.collective == "allgather" {
        ranks.len() as u64
    } else {
        1
    };
    let overflow = |field: &str, r: usize| PlanError::Field {
        path: format!("gpus[{r}].{field}"),
        message: format!(
            "the chunk counts of the plan (with buffer_alignment {a}) make a size granularity \
             over 2^64 bytes: expected chunk counts whose least common multiple fits 64 bits"
        ),
    };
    let lcm = |x: u64, y: u64| (x / gcd(x, y)).checked_mul(y);
    let (mut unit_in, mut unit_out) = (a, a);
    for (i, r) in ranks.iter().enumerate() {
        unit_in = a
            .checked_mul(u64::from(r.input_chunks.max(1)))
            .and_then(|v| lcm(unit_in, v))
            .ok_or_else(|| overflow("input_chunks", i))?;
        unit_out = a
            .checked_mul(u64::from(r.output_chunks.max(1)))
            .and_then(|v| lcm(unit_out, v))
            .ok_or_else(|| overflow("output_chunks", i))?;
    }
    let step = unit_out / gcd(unit_out, ratio);
    lcm(unit_in, step).ok_or_else(|| overflow("output_chunks", ranks.len().saturating_sub(1)))
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::executor::json::OpName;

    const SHIPPED: &str = include_str!("../../plans/allgather_simple_n2.json");

    /// The shipped plan with `corrupt` applied, parsed for rank 0.
    fn parse_with(
        corrupt: impl FnOnce(&mut Value),
    ) -> std::result::Result<ExecutionPlan, PlanError> {
        let mut v: Value = serde_json::from_str(SHIPPED).expect("the shipped plan is JSON");
        corrupt(&mut v);
        ExecutionPlan::parse(&v.to_string(), 0)
    }

    fn ops(v: &mut Value) -> &mut Vec<Value> {
        v["gpus"][0]["threadblocks"][0]["ops"]
            .as_array_mut()
            .expect("the shipped plan has ops")
    }

    #[test]
    fn a_granularity_over_64_bits_is_refused_at_once_naming_the_field() {
        let t = std::time::Instant::now();
        let e = parse_with(|v| {
            v["gpus"][0]["output_chunks"] = json!(4_294_967_295u32);
            v["gpus"][1]["output_chunks"] = json!(4_294_967_291u32);
            v["gpus"][1]["input_chunks"] = json!(4_294_967_279u32);
        })
        .expect_err("the granularity overflows");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
        let m = e.to_string();
        assert!(
            m.starts_with("gpus[1].") && m.contains("_chunks") && m.contains("expected"),
            "{m}"
        );
        // Large but representable: the closed form gives the least valid size at once (the
        // search counted up to it: 2^32 steps here).
        let p = parse_with(|v| {
            v["gpus"][0]["output_chunks"] = json!(4_294_967_295u32);
            v["gpus"][1]["output_chunks"] = json!(4_294_967_295u32);
        })
        .expect("a representable granularity");
        let g = p.input_granularity();
        let a = u64::from(p.meta().buffer_alignment);
        assert_eq!(g % a, 0);
        assert_eq!((g * 2) % (a * 4_294_967_295), 0, "the receive size divides");
        // u = k * a with 2u a multiple of a * (2^32 - 1) (odd): the least is k = 2^32 - 1.
        assert_eq!(g, a * 4_294_967_295, "least");
    }

    #[test]
    fn connected_to_is_bounded_by_what_thread_blocks_can_name() {
        let e = parse_with(|v| {
            v["gpus"][0]["channels"][0]["connected_to"] = json!(vec![1; 100_000]);
        })
        .expect_err("100 000 channels");
        let m = e.to_string();
        assert!(
            m.starts_with("gpus[0].channels[0].connected_to: 100000 memory channels"),
            "{m}"
        );
        assert!(m.contains("expected at most 4096"), "{m}");
    }

    #[test]
    fn shipped_plan_parses() {
        let p = parse_with(|_| {}).expect("the shipped plan is valid");
        assert_eq!(p.world_size(), 2);
        assert_eq!(p.num_threadblocks(), 1);
    }

    #[test]
    fn json_errors_name_the_path() {
        let e = parse_with(|v| {
            v.as_object_mut().map(|o| o.remove("protocol"));
        })
        .expect_err("no protocol");
        assert!(
            matches!(&e, PlanError::Json { path, .. } if path == "protocol"),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("at protocol: missing required field"),
            "{e}"
        );
    }

    #[test]
    fn shape_errors_name_the_op_and_field() {
        let e = parse_with(|v| ops(v)[3]["name"] = json!("pws")).expect_err("pws on memory");
        let PlanError::Shape { op, field, .. } = &e else {
            panic!("expected a shape error, got {e:?}");
        };
        assert_eq!(
            (op.rank, op.thread_block, op.op, op.name),
            (0, 0, 3, OpName::Pws)
        );
        assert_eq!(field, "channel_type");
        assert_eq!(
            e.to_string(),
            "gpus[0].threadblocks[0].ops[3].channel_type: pws expects channel_type port, got memory"
        );
        let e = parse_with(|v| {
            ops(v).push(json!({"name": "glres", "src_buff": [], "dst_buff": []}));
        })
        .expect_err("glres without chunks");
        assert!(
            e.to_string()
                .ends_with("src_buff: glres expects 1 chunks, got 0"),
            "{e}"
        );
        let e = parse_with(|v| {
            ops(v)[5].as_object_mut().map(|o| o.remove("channel_ids"));
        })
        .expect_err("signal without channels");
        assert_eq!(
            e.to_string(),
            "gpus[0].threadblocks[0].ops[5].channel_ids: signal expects at least one channel, got none"
        );
        let e =
            parse_with(|v| ops(v)[3]["dst_buff"][0] = json!({"type": "o", "index": 0, "size": 1}))
                .expect_err("put to a local chunk");
        assert!(
            matches!(&e, PlanError::Shape { field, .. } if field == "dst_buff[0]"),
            "{e:?}"
        );
    }

    #[test]
    fn range_and_sync_errors() {
        let e = parse_with(|v| ops(v)[3]["src_buff"][0]["index"] = json!(1000))
            .expect_err("chunk out of range");
        assert!(
            matches!(&e, PlanError::Op { field, .. } if field == "src_buff[0]"),
            "{e:?}"
        );
        assert!(e
            .to_string()
            .contains("chunks 1000..1001 lie outside rank 0's output buffer"));
        let e = parse_with(|v| {
            ops(v).remove(5);
        })
        .expect_err("a wait without its signal");
        assert!(matches!(e, PlanError::Unbalanced { .. }), "{e:?}");
        assert!(e.to_string().contains("unmatched wait/signal"), "{e}");
        let e = ExecutionPlan::parse(SHIPPED, 7).expect_err("no rank 7");
        assert_eq!(e, PlanError::NoSuchRank { rank: 7, gpus: 2 });
        let e = ExecutionPlan::from_json("{", 0).expect_err("not JSON");
        assert!(e
            .to_string()
            .starts_with("executor error: execution plan (from JSON text): "));
    }
}
