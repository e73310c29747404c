//! The JSON shape of an execution plan (upstream MSCCL++'s current format, as its Python DSL
//! writes it), deserialized with serde. Unknown fields are ignored; fields upstream treats as
//! optional have its defaults. Meaning is checked later (`super::validate`).

use serde::Deserialize;

/// Top level of a plan file.
#[derive(Debug, Clone, Deserialize)]
pub struct PlanJson {
    /// `"name"`: the plan's name, used to pick it from the plan cache and in errors.
    pub name: String,
    /// `"collective"`: the collective the plan implements (e.g. `allreduce`, `allgather`).
    pub collective: String,
    /// `"protocol"`: `Simple` or `LL` (how data and flags travel).
    pub protocol: Protocol,
    /// `"inplace"`: whether the plan expects the input and output to be the same buffer.
    pub inplace: bool,
    /// `"reuse_resources"`: scratch is reused with a fixed chunk length rather than sized per
    /// message; default false.
    #[serde(default)]
    pub reuse_resources: bool,
    /// `"num_threads_per_block"`: threads per block of the kernel launch; default 1024.
    #[serde(default = "default_threads")]
    pub num_threads_per_block: u32,
    /// `"use_double_scratch_buffer"`: alternate between two scratch halves on successive
    /// launches; default false.
    #[serde(default)]
    pub use_double_scratch_buffer: bool,
    /// `"buffer_alignment"`: bytes chunks are split in; a message size must be a multiple of
    /// it times the chunk count; default 16.
    #[serde(default = "default_alignment")]
    pub buffer_alignment: u32,
    /// `"min_message_size"`: smallest message (bytes) the plan is meant for; default 0.
    #[serde(default)]
    pub min_message_size: u64,
    /// `"max_message_size"`: largest message (bytes) the plan is meant for; default unbounded.
    #[serde(default = "default_max_size")]
    pub max_message_size: u64,
    /// Not written by upstream's DSL; our plans may say it (used by the plan cache lookup).
    #[serde(default)]
    pub nranks_per_node: Option<usize>,
    /// `"gpus"`: one entry per rank, each rank's channels, buffers and thread blocks.
    pub gpus: Vec<GpuJson>,
}

fn default_threads() -> u32 {
    1024
}
fn default_alignment() -> u32 {
    16
}
fn default_max_size() -> u64 {
    u64::MAX
}

/// `"protocol"`: plain stores and semaphores, or LL packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum Protocol {
    /// Plain copies synchronized by semaphores.
    Simple,
    /// Low-latency packets (data with a flag in every 8-byte word).
    #[serde(rename = "LL")]
    Ll,
}

/// One rank's part of the plan.
#[derive(Debug, Clone, Deserialize)]
pub struct GpuJson {
    /// `"id"`: the rank this entry is for.
    pub id: usize,
    /// `"input_chunks"`: how many equal chunks the input buffer is split into.
    pub input_chunks: u32,
    /// `"output_chunks"`: how many equal chunks the output buffer is split into.
    pub output_chunks: u32,
    /// `"scratch_chunks"`: how many chunks (of the same size) the scratch buffer holds.
    pub scratch_chunks: u32,
    /// `"channels"`: the channels this rank sets up; ops refer to them by index per type.
    #[serde(default)]
    pub channels: Vec<ChannelJson>,
    /// `"remote_buffers"`: peers' buffers this rank accesses, with the channel types used.
    #[serde(default)]
    pub remote_buffers: Vec<RemoteBufferJson>,
    /// `"semaphores"`: device semaphores used by `sem_acquire`/`sem_release`.
    #[serde(default)]
    pub semaphores: Vec<SemaphoreJson>,
    /// `"threadblocks"`: the thread blocks this rank launches and their ops.
    pub threadblocks: Vec<ThreadBlockJson>,
}

/// `"channel_type"` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelType {
    /// No channel (local operations).
    None,
    /// A memory channel (peer memory mapped here).
    Memory,
    /// A port channel (requests served by the host proxy).
    Port,
    /// A switch (NVLS multicast) channel.
    Switch,
}

impl ChannelType {
    /// The JSON spelling.
    pub fn name(self) -> &'static str {
        match self {
            ChannelType::None => "none",
            ChannelType::Memory => "memory",
            ChannelType::Port => "port",
            ChannelType::Switch => "switch",
        }
    }
}

/// `"type"` / `"buffer_type"` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
pub enum BufferType {
    /// The send buffer.
    #[serde(rename = "i")]
    Input = 0,
    /// The receive buffer.
    #[serde(rename = "o")]
    Output = 1,
    /// The executor's scratch buffer.
    #[serde(rename = "s")]
    Scratch = 2,
}

impl BufferType {
    /// The JSON spelling.
    pub fn name(self) -> &'static str {
        match self {
            BufferType::Input => "i",
            BufferType::Output => "o",
            BufferType::Scratch => "s",
        }
    }

    /// The word for it in messages (`input`, `output`, `scratch`).
    pub fn long_name(self) -> &'static str {
        match self {
            BufferType::Input => "input",
            BufferType::Output => "output",
            BufferType::Scratch => "scratch",
        }
    }
}

impl GpuJson {
    /// How many chunks the rank's buffer `t` is split into.
    pub fn chunks(&self, t: BufferType) -> u32 {
        match t {
            BufferType::Input => self.input_chunks,
            BufferType::Output => self.output_chunks,
            BufferType::Scratch => self.scratch_chunks,
        }
    }
}

/// An entry of `gpus[].channels`: memory/port channels to `connected_to` (one channel per
/// listed peer), or a switch channel over `rank_groups`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChannelJson {
    /// `"channel_type"`: memory, port or switch.
    pub channel_type: ChannelType,
    /// `"connected_to"`: peer ranks, one channel each (memory and port channels).
    #[serde(default)]
    pub connected_to: Option<Vec<usize>>,
    /// `"buffer_type"`: the local buffer a switch channel binds (switch channels).
    #[serde(default)]
    pub buffer_type: Option<BufferType>,
    /// `"rank_groups"`: the multicast groups of a switch channel.
    #[serde(default)]
    pub rank_groups: Option<Vec<RankGroupJson>>,
}

/// A rank group of a switch channel.
#[derive(Debug, Clone, Deserialize)]
pub struct RankGroupJson {
    /// `"size"`: number of ranks in the group.
    pub size: u32,
    /// `"ranks"`: the ranks of the group.
    pub ranks: Vec<usize>,
}

/// An entry of `gpus[].remote_buffers`: a buffer of `rank` this rank accesses.
#[derive(Debug, Clone, Deserialize)]
pub struct RemoteBufferJson {
    /// `"rank"`: the peer that owns the buffer.
    pub rank: usize,
    /// `"type"`: which of the peer's buffers (input, output or scratch).
    #[serde(rename = "type")]
    pub ty: BufferType,
    /// `"access_channel_types"`: the channel types through which this rank reaches it.
    pub access_channel_types: Vec<ChannelType>,
}

/// An entry of `gpus[].semaphores` (device semaphores for sem_acquire/sem_release).
#[derive(Debug, Clone, Deserialize)]
pub struct SemaphoreJson {
    /// `"init_value"`: the semaphore's value at the start of each launch.
    pub init_value: i32,
}

/// A thread block: the channels and remote buffers its operations name, and the operations.
#[derive(Debug, Clone, Deserialize)]
pub struct ThreadBlockJson {
    /// `"id"`: the block's index in the launch grid.
    pub id: usize,
    /// `"channels"`: the rank's channels this block uses, per type; ops index this list.
    #[serde(default)]
    pub channels: Vec<TbChannelJson>,
    /// `"remote_buffer_refs"`: the rank's remote buffers this block uses, per channel type.
    #[serde(default)]
    pub remote_buffer_refs: Vec<RemoteBufferRefJson>,
    /// `"ops"`: the block's operations in execution order.
    pub ops: Vec<OpJson>,
}

/// `threadblocks[].channels[]`: indexes into the rank's channels of one type.
#[derive(Debug, Clone, Deserialize)]
pub struct TbChannelJson {
    /// `"channel_type"`: the type of the channels listed.
    pub channel_type: ChannelType,
    /// `"channel_ids"`: indexes into the rank's channels of that type.
    pub channel_ids: Vec<usize>,
}

/// `threadblocks[].remote_buffer_refs[]`: indexes into the rank's remote buffers, reached
/// through channels of one type.
#[derive(Debug, Clone, Deserialize)]
pub struct RemoteBufferRefJson {
    /// `"access_channel_type"`: the channel type the buffers are reached through.
    pub access_channel_type: ChannelType,
    /// `"remote_buffer_ids"`: indexes into the rank's `remote_buffers`.
    pub remote_buffer_ids: Vec<usize>,
}

/// Operation names of the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpName {
    /// `nop`: does nothing.
    Nop,
    /// `barrier`: waits until `num_threadblocks` blocks arrive at `barrier_id`.
    Barrier,
    /// `put`: copies local chunks to a peer's buffer.
    Put,
    /// `pws`: put, then signal the peer.
    Pws,
    /// `pwsf`: put, signal, and flush (port channels).
    Pwsf,
    /// `get`: copies a peer's chunks here.
    Get,
    /// `copy`: local copy between buffers.
    Copy,
    /// `signal`: increments the peer's semaphore.
    Signal,
    /// `wait`: waits for the peer's signal.
    Wait,
    /// `flush`: waits until the port channel's puts completed.
    Flush,
    /// `re`: reduces local (and remote) chunks into the destination.
    Re,
    /// `res`: reduce, then send the result to peers.
    Res,
    /// `rre`: reads peers' chunks and reduces them into the destination.
    Rre,
    /// `rres`: read-reduce, then send the result to peers.
    Rres,
    /// `ppkt`: puts chunks to a peer as LL packets.
    Ppkt,
    /// `rppkt`: reads packets and puts them on to a peer.
    Rppkt,
    /// `respkt`: reduces received packets and sends the result as packets.
    Respkt,
    /// `cpkt`: copies data into packet form locally.
    Cpkt,
    /// `upkt`: unpacks received packets into plain data.
    Upkt,
    /// `repkt`: reduces received packets into plain data.
    Repkt,
    /// `recpkt`: reduces received packets and also copies the result as packets.
    Recpkt,
    /// `recspkt`: reduce-copy of packets, then send them to peers.
    Recspkt,
    /// `glre`: switch channel: multicast load-reduce into a local chunk.
    Glre,
    /// `glres`: switch channel: multicast load-reduce, then multicast store.
    Glres,
    /// `gstore`: switch channel: multicast store of a local chunk.
    Gstore,
    /// `gstorepkt`: switch channel: multicast store as packets.
    Gstorepkt,
    /// `rlxsignal`: signal with relaxed memory ordering.
    Rlxsignal,
    /// `rlxwait`: wait with relaxed memory ordering.
    Rlxwait,
    /// `pipeline`: repeats its `ops` over `iter_context` units.
    Pipeline,
    /// `sem_acquire`: waits for and decrements device semaphores.
    #[serde(rename = "sem_acquire")]
    SemAcquire,
    /// `sem_release`: increments device semaphores.
    #[serde(rename = "sem_release")]
    SemRelease,
}

impl OpName {
    /// The JSON spelling.
    pub fn name(self) -> &'static str {
        use OpName::*;
        match self {
            Nop => "nop",
            Barrier => "barrier",
            Put => "put",
            Pws => "pws",
            Pwsf => "pwsf",
            Get => "get",
            Copy => "copy",
            Signal => "signal",
            Wait => "wait",
            Flush => "flush",
            Re => "re",
            Res => "res",
            Rre => "rre",
            Rres => "rres",
            Ppkt => "ppkt",
            Rppkt => "rppkt",
            Respkt => "respkt",
            Cpkt => "cpkt",
            Upkt => "upkt",
            Repkt => "repkt",
            Recpkt => "recpkt",
            Recspkt => "recspkt",
            Glre => "glre",
            Glres => "glres",
            Gstore => "gstore",
            Gstorepkt => "gstorepkt",
            Rlxsignal => "rlxsignal",
            Rlxwait => "rlxwait",
            Pipeline => "pipeline",
            SemAcquire => "sem_acquire",
            SemRelease => "sem_release",
        }
    }

    /// Switch-channel (NVLS multicast) operations.
    pub fn is_switch(self) -> bool {
        matches!(
            self,
            OpName::Glre | OpName::Glres | OpName::Gstore | OpName::Gstorepkt
        )
    }
}

/// `"reduce_op"` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlanReduceOp {
    /// Sum (also what upstream's executor does for every value).
    #[default]
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

impl PlanReduceOp {
    /// The JSON spelling.
    pub fn name(self) -> &'static str {
        match self {
            PlanReduceOp::Sum => "sum",
            PlanReduceOp::Min => "min",
            PlanReduceOp::Max => "max",
        }
    }
}

/// One operation.
#[derive(Debug, Clone, Deserialize)]
pub struct OpJson {
    /// `"name"`: the operation.
    pub name: OpName,
    /// `"src_buff"`: the chunks the operation reads.
    #[serde(default)]
    pub src_buff: Option<Vec<ChunkJson>>,
    /// `"dst_buff"`: the chunks the operation writes.
    #[serde(default)]
    pub dst_buff: Option<Vec<ChunkJson>>,
    /// `"channel_ids"`: indexes into the block's channels of `channel_type`.
    #[serde(default)]
    pub channel_ids: Option<Vec<usize>>,
    /// `"channel_type"`: the channel type the op communicates through; none for local ops.
    #[serde(default)]
    pub channel_type: Option<ChannelType>,
    /// `"reduce_op"`: the reduction of reduce ops; default sum.
    #[serde(default)]
    pub reduce_op: Option<PlanReduceOp>,
    /// `"barrier_id"`: barrier ops: which barrier the blocks meet at.
    #[serde(default)]
    pub barrier_id: Option<u32>,
    /// `"num_threadblocks"`: barrier ops: how many blocks take part.
    #[serde(default)]
    pub num_threadblocks: Option<u32>,
    /// `"tbg_info"`: the block group splitting this op's chunks, if any.
    #[serde(default)]
    pub tbg_info: Option<TbgInfoJson>,
    /// `"semaphore_ids"`: sem ops: indexes into the rank's `semaphores`.
    #[serde(default)]
    pub semaphore_ids: Option<Vec<usize>>,
    /// `"iter_context"`: pipeline ops: the unit size and chunk count iterated over.
    #[serde(default)]
    pub iter_context: Option<IterContextJson>,
    /// `"ops"`: pipeline ops: the body repeated each iteration.
    #[serde(default)]
    pub ops: Option<Vec<OpJson>>,
}

/// A chunk range of a local buffer (`type`), a remote buffer (`buffer_id`, an index into the
/// thread block's remote buffers of the operation's channel type) or a switch channel.
#[derive(Debug, Clone, Deserialize)]
pub struct ChunkJson {
    /// `"type"`: the local buffer the chunks are in (local operands).
    #[serde(default, rename = "type")]
    pub ty: Option<BufferType>,
    /// `"buffer_id"`: index into the block's remote buffers of the op's channel type.
    #[serde(default)]
    pub buffer_id: Option<usize>,
    /// `"switch_channel_id"`: the switch channel whose multicast memory is addressed.
    #[serde(default)]
    pub switch_channel_id: Option<usize>,
    /// `"index"`: first chunk of the range, in chunks of the buffer.
    pub index: u32,
    /// `"size"`: number of chunks in the range.
    pub size: u32,
}

/// `tbg_info`: this block is `tb_id` of a group of `tbg_size` blocks sharing the operation.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct TbgInfoJson {
    /// `"tb_id"`: this block's index within the group.
    pub tb_id: u32,
    /// `"tbg_size"`: number of blocks in the group.
    pub tbg_size: u32,
}

/// `iter_context` of a pipeline: `num_chunks` chunks processed `unit_size` bytes at a time.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct IterContextJson {
    /// `"unit_size"`: bytes processed per iteration.
    pub unit_size: u32,
    /// `"num_chunks"`: chunks the pipeline covers in total.
    pub num_chunks: u32,
}

/// Parses `text`; an error names the JSON path of the offending value (`at PATH: message`).
/// [`crate::executor::ExecutionPlan::parse`] also validates, with a typed error.
pub fn parse(text: &str) -> std::result::Result<PlanJson, String> {
    parse_located(text).map_err(|(path, message)| {
        if path.is_empty() {
            message
        } else {
            format!("at {path}: {message}")
        }
    })
}

/// Parses `text`; an error is (the JSON path of the offending value, empty for the whole
/// document; the parser's message).
pub(crate) fn parse_located(text: &str) -> std::result::Result<PlanJson, (String, String)> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize::<_, PlanJson>(de).map_err(|e| {
        let mut path = e.path().to_string();
        let mut message = e.into_inner().to_string();
        if path == "." || path == "?" {
            path.clear();
        }
        // serde names a missing field in the message, at the path of the object that
        // lacks it: move the field into the path (`ops[7].channel_ids: missing`).
        if let Some(rest) = message.strip_prefix("missing field `") {
            if let Some((field, tail)) = rest.split_once('`') {
                path = if path.is_empty() {
                    field.to_string()
                } else {
                    format!("{path}.{field}")
                };
                message = format!("missing required field{tail}");
            }
        }
        (path, message)
    })
}
