//! The plan's in-memory form, resolved for one rank: channels flattened to per-type lists,
//! remote buffers and the memories each rank must send, operations with their buffers and
//! channels as indexes. Validation (`super::validate`) builds it from the JSON; lowering
//! (`super::lower`) and setup (`super::run`) read it.

use super::json::{
    BufferType, ChannelType, IterContextJson, OpName, PlanJson, PlanReduceOp, Protocol,
};

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

/// What a connection of [`RankPlan::connection_groups`] is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnKind {
    /// A memory channel's.
    MemoryChannel,
    /// No channel of this rank (a peer has more memory channels to it than it has back).
    UnpairedMemory,
    /// A port channel's.
    PortChannel,
    /// No channel of this rank (a peer has more port channels to it than it has back).
    UnpairedPort,
}

impl ConnKind {
    /// Whether the connection goes over the port channels' transport (and its semaphore to the
    /// proxy).
    pub(crate) fn is_port(self) -> bool {
        matches!(self, ConnKind::PortChannel | ConnKind::UnpairedPort)
    }
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
    /// The last this many memory channels were port channels (`super::ports`): they connect
    /// after `unpaired_memory` but those of it that were unpaired port connections, as port
    /// channels do, so each pairs with the same connection of its peer as before.
    pub memory_from_port: usize,
    /// The last this many of `unpaired_memory` were unpaired port connections.
    pub unpaired_memory_from_port: usize,
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

    /// The groups of this rank's connections in the order the executor makes them (the k-th
    /// connection to a peer pairs with the peer's k-th back), each with what it is for: memory
    /// channels, unpaired memory, then the memory channels and unpaired memory connections that
    /// were port ones ([`RankPlan::memory_from_port`]: where port connections come), port
    /// channels, unpaired port. Each group's memory channels follow the previous group's in
    /// `memory_peers` (and port channels in `port_peers`).
    pub(crate) fn connection_groups(&self) -> [(&[usize], ConnKind); 6] {
        let (nm, num) = (self.memory_peers.len(), self.unpaired_memory.len());
        let (mfp, ufp) = (self.memory_from_port, self.unpaired_memory_from_port);
        [
            (&self.memory_peers[..nm - mfp], ConnKind::MemoryChannel),
            (&self.unpaired_memory[..num - ufp], ConnKind::UnpairedMemory),
            (&self.memory_peers[nm - mfp..], ConnKind::MemoryChannel),
            (&self.unpaired_memory[num - ufp..], ConnKind::UnpairedMemory),
            (&self.port_peers, ConnKind::PortChannel),
            (&self.unpaired_port, ConnKind::UnpairedPort),
        ]
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

impl PlanMeta {
    /// The plan-wide settings of `plan`.
    pub(crate) fn of(plan: PlanJson) -> PlanMeta {
        PlanMeta {
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
        }
    }
}

impl RankPlan {
    /// The peer of each channel of type `ty` (memory or port; others have no peers here).
    pub(crate) fn peers(&self, ty: ChannelType) -> &[usize] {
        match ty {
            ChannelType::Memory => &self.memory_peers,
            ChannelType::Port => &self.port_peers,
            _ => &[],
        }
    }
}

impl Block {
    /// Indexes into the rank's channels of type `ty` that this block names.
    pub(crate) fn channels(&self, ty: ChannelType) -> &[usize] {
        match ty {
            ChannelType::Memory => &self.memory_channels,
            ChannelType::Port => &self.port_channels,
            ChannelType::Switch => &self.switch_channels,
            ChannelType::None => &[],
        }
    }

    /// Indexes into the rank's remote buffers this block reaches through channels of `ty`
    /// (memory or port; `None` for the others).
    pub(crate) fn remote_buffers(&self, ty: ChannelType) -> Option<&[usize]> {
        match ty {
            ChannelType::Memory => Some(&self.memory_buffers),
            ChannelType::Port => Some(&self.port_buffers),
            _ => None,
        }
    }
}
