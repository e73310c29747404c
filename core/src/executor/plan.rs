//! [`ExecutionPlan`]: a parsed, validated plan, resolved for every rank (channels flattened to
//! per-type lists, remote buffers and the memories each rank must send, operations with their
//! buffers and channels as indexes the executor can use directly).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::json::{self, BufferType, ChannelType, IterContextJson, OpName, PlanReduceOp, Protocol};
use super::validate;
use crate::error::{Error, Result};

/// Where a chunk lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BufRef {
    /// This rank's input, output or scratch buffer.
    Local(BufferType),
    /// Slot `slot` of the thread block's remote buffers of the operation's channel type; the
    /// buffer is `ty` of rank `rank`.
    Remote {
        slot: usize,
        ty: BufferType,
        rank: usize,
    },
    /// Slot `slot` of the thread block's switch channels, bound to this rank's buffer `ty`.
    Switch { slot: usize, ty: BufferType },
}

impl BufRef {
    /// The buffer type behind the reference (switch channels: the buffer they bind).
    pub(crate) fn buffer_type(self) -> Option<BufferType> {
        match self {
            BufRef::Local(t) | BufRef::Remote { ty: t, .. } | BufRef::Switch { ty: t, .. } => {
                Some(t)
            }
        }
    }
}

/// A chunk range: `size` chunks from chunk `index` of a buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chunk {
    pub buf: BufRef,
    pub index: u32,
    pub size: u32,
}

/// One resolved operation.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    pub name: OpName,
    pub channel_type: ChannelType,
    /// Indexes into the thread block's channels of `channel_type`.
    pub channels: Vec<usize>,
    pub src: Vec<Chunk>,
    pub dst: Vec<Chunk>,
    pub reduce: PlanReduceOp,
    /// (barrier id, thread blocks that meet there).
    pub barrier: Option<(u32, u32)>,
    /// (this block's index in its group, group size).
    pub tbg: (u32, u32),
    pub semaphores: Vec<usize>,
    pub pipeline: Option<IterContextJson>,
    /// The operations a pipeline repeats.
    pub inner: Vec<Op>,
}

/// One thread block of one rank.
#[derive(Debug, Clone, Default)]
pub(crate) struct Block {
    /// Indexes into the rank's memory channels.
    pub memory_channels: Vec<usize>,
    /// Indexes into the rank's port channels.
    pub port_channels: Vec<usize>,
    /// Indexes into the rank's switch channels.
    pub switch_channels: Vec<usize>,
    /// Indexes into the rank's remote buffers, reached through memory channels.
    pub memory_buffers: Vec<usize>,
    /// Indexes into the rank's remote buffers, reached through port channels.
    pub port_buffers: Vec<usize>,
    pub ops: Vec<Op>,
}

/// A buffer of another rank this rank accesses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RemoteBuffer {
    pub rank: usize,
    pub ty: BufferType,
    pub memory: bool,
    pub port: bool,
    /// Communicator tag of the exchange (its index in the rank's `remote_buffers`).
    pub tag: usize,
}

/// A local buffer another rank accesses: sent to `to` under `tag`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BufferSend {
    pub to: usize,
    pub ty: BufferType,
    pub port: bool,
    pub tag: usize,
}

/// A switch (NVLS multicast) channel of a rank: its buffer `ty` bound to one multicast object
/// shared by `ranks` (this rank among them).
#[derive(Debug, Clone)]
pub(crate) struct SwitchSpec {
    pub ty: BufferType,
    pub ranks: Vec<usize>,
}

/// Everything one rank needs.
#[derive(Debug, Clone, Default)]
pub(crate) struct RankPlan {
    pub input_chunks: u32,
    pub output_chunks: u32,
    pub scratch_chunks: u32,
    /// Peer of each memory channel, in channel order.
    pub memory_peers: Vec<usize>,
    /// Peer of each port channel.
    pub port_peers: Vec<usize>,
    /// Extra connections (no channel) so peers with more channels to us can pair theirs.
    pub unpaired_memory: Vec<usize>,
    pub unpaired_port: Vec<usize>,
    /// Switch channels in plan order (every rank of a group sets them up in this order).
    pub switch_channels: Vec<SwitchSpec>,
    pub remote_buffers: Vec<RemoteBuffer>,
    pub sends: Vec<BufferSend>,
    pub semaphores: Vec<i32>,
    pub blocks: Vec<Block>,
}

impl RankPlan {
    /// Whether any operation or channel needs NVLS.
    pub(crate) fn uses_switch(&self) -> bool {
        fn any(ops: &[Op]) -> bool {
            ops.iter().any(|o| o.name.is_switch() || any(&o.inner))
        }
        !self.switch_channels.is_empty() || self.blocks.iter().any(|b| any(&b.ops))
    }

    /// Whether any port channel (and so the proxy) is used.
    pub(crate) fn uses_port(&self) -> bool {
        !self.port_peers.is_empty()
            || !self.unpaired_port.is_empty()
            || self.sends.iter().any(|s| s.port)
    }
}

/// The plan-wide settings.
#[derive(Debug, Clone)]
pub(crate) struct PlanMeta {
    pub name: String,
    pub collective: String,
    pub protocol: Protocol,
    pub inplace: bool,
    pub reuse_resources: bool,
    pub num_threads_per_block: u32,
    pub double_scratch: bool,
    pub buffer_alignment: u32,
    pub min_message_size: u64,
    pub max_message_size: u64,
    pub nranks_per_node: Option<usize>,
}

pub(crate) struct PlanInner {
    pub meta: PlanMeta,
    pub ranks: Vec<RankPlan>,
    pub rank: usize,
    pub id: u64,
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

    fn build(text: &str, rank: usize, source: String, path: Option<PathBuf>) -> Result<Self> {
        let err = |m: String| Error::Executor(format!("execution plan {source}: {m}"));
        let plan = json::parse(text).map_err(err)?;
        let ranks = validate::resolve(&plan).map_err(err)?;
        if rank >= ranks.len() {
            return Err(err(format!(
                "rank {rank}: expected a rank below the plan's {} gpus",
                ranks.len()
            )));
        }
        let mut h = DefaultHasher::new();
        text.hash(&mut h);
        let meta = PlanMeta {
            name: plan.name,
            collective: plan.collective,
            protocol: plan.protocol,
            inplace: plan.inplace,
            reuse_resources: plan.reuse_resources,
            num_threads_per_block: plan.num_threads_per_block,
            double_scratch: plan.use_double_scratch_buffer,
            buffer_alignment: plan.buffer_alignment,
            min_message_size: plan.min_message_size,
            max_message_size: plan.max_message_size,
            nranks_per_node: plan.nranks_per_node,
        };
        Ok(ExecutionPlan {
            inner: Arc::new(PlanInner {
                meta,
                ranks,
                rank,
                id: h.finish(),
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
        let a = u64::from(self.inner.meta.buffer_alignment);
        let ratio = if self.inner.meta.collective == "allgather" {
            self.world_size() as u64
        } else {
            1
        };
        let lcm = |x: u64, y: u64| {
            let (mut p, mut q) = (x, y);
            while q != 0 {
                (p, q) = (q, p % q);
            }
            x / p * y
        };
        let mut unit_in = a;
        let mut unit_out = a;
        for r in &self.inner.ranks {
            unit_in = lcm(unit_in, a * u64::from(r.input_chunks.max(1)));
            unit_out = lcm(unit_out, a * u64::from(r.output_chunks.max(1)));
        }
        (1..)
            .map(|k| k * unit_in)
            .find(|u| (u * ratio) % unit_out == 0)
            .unwrap_or(unit_in)
    }

    pub(crate) fn meta(&self) -> &PlanMeta {
        &self.inner.meta
    }
    pub(crate) fn rank_plan(&self) -> &RankPlan {
        &self.inner.ranks[self.inner.rank]
    }
}
