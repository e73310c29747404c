//! The JSON shape of an execution plan (upstream MSCCL++'s current format, as its Python DSL
//! writes it), deserialized with serde. Unknown fields are ignored; fields upstream treats as
//! optional have its defaults. Meaning is checked later (`super::validate`).

use serde::Deserialize;

/// Top level of a plan file.
#[derive(Debug, Clone, Deserialize)]
pub struct PlanJson {
    pub name: String,
    pub collective: String,
    pub protocol: Protocol,
    pub inplace: bool,
    #[serde(default)]
    pub reuse_resources: bool,
    #[serde(default = "default_threads")]
    pub num_threads_per_block: u32,
    #[serde(default)]
    pub use_double_scratch_buffer: bool,
    #[serde(default = "default_alignment")]
    pub buffer_alignment: u32,
    #[serde(default)]
    pub min_message_size: u64,
    #[serde(default = "default_max_size")]
    pub max_message_size: u64,
    /// Not written by upstream's DSL; our plans may say it (used by the plan cache lookup).
    #[serde(default)]
    pub nranks_per_node: Option<usize>,
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
    pub id: usize,
    pub input_chunks: u32,
    pub output_chunks: u32,
    pub scratch_chunks: u32,
    #[serde(default)]
    pub channels: Vec<ChannelJson>,
    #[serde(default)]
    pub remote_buffers: Vec<RemoteBufferJson>,
    #[serde(default)]
    pub semaphores: Vec<SemaphoreJson>,
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
}

/// An entry of `gpus[].channels`: memory/port channels to `connected_to` (one channel per
/// listed peer), or a switch channel over `rank_groups`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChannelJson {
    pub channel_type: ChannelType,
    #[serde(default)]
    pub connected_to: Option<Vec<usize>>,
    #[serde(default)]
    pub buffer_type: Option<BufferType>,
    #[serde(default)]
    pub rank_groups: Option<Vec<RankGroupJson>>,
}

/// A rank group of a switch channel.
#[derive(Debug, Clone, Deserialize)]
pub struct RankGroupJson {
    pub size: u32,
    pub ranks: Vec<usize>,
}

/// An entry of `gpus[].remote_buffers`: a buffer of `rank` this rank accesses.
#[derive(Debug, Clone, Deserialize)]
pub struct RemoteBufferJson {
    pub rank: usize,
    #[serde(rename = "type")]
    pub ty: BufferType,
    pub access_channel_types: Vec<ChannelType>,
}

/// An entry of `gpus[].semaphores` (device semaphores for sem_acquire/sem_release).
#[derive(Debug, Clone, Deserialize)]
pub struct SemaphoreJson {
    pub init_value: i32,
}

/// A thread block: the channels and remote buffers its operations name, and the operations.
#[derive(Debug, Clone, Deserialize)]
pub struct ThreadBlockJson {
    pub id: usize,
    #[serde(default)]
    pub channels: Vec<TbChannelJson>,
    #[serde(default)]
    pub remote_buffer_refs: Vec<RemoteBufferRefJson>,
    pub ops: Vec<OpJson>,
}

/// `threadblocks[].channels[]`: indexes into the rank's channels of one type.
#[derive(Debug, Clone, Deserialize)]
pub struct TbChannelJson {
    pub channel_type: ChannelType,
    pub channel_ids: Vec<usize>,
}

/// `threadblocks[].remote_buffer_refs[]`: indexes into the rank's remote buffers, reached
/// through channels of one type.
#[derive(Debug, Clone, Deserialize)]
pub struct RemoteBufferRefJson {
    pub access_channel_type: ChannelType,
    pub remote_buffer_ids: Vec<usize>,
}

/// Operation names of the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpName {
    Nop,
    Barrier,
    Put,
    Pws,
    Pwsf,
    Get,
    Copy,
    Signal,
    Wait,
    Flush,
    Re,
    Res,
    Rre,
    Rres,
    Ppkt,
    Rppkt,
    Respkt,
    Cpkt,
    Upkt,
    Repkt,
    Recpkt,
    Recspkt,
    Glre,
    Glres,
    Gstore,
    Gstorepkt,
    Rlxsignal,
    Rlxwait,
    Pipeline,
    #[serde(rename = "sem_acquire")]
    SemAcquire,
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

/// One operation.
#[derive(Debug, Clone, Deserialize)]
pub struct OpJson {
    pub name: OpName,
    #[serde(default)]
    pub src_buff: Option<Vec<ChunkJson>>,
    #[serde(default)]
    pub dst_buff: Option<Vec<ChunkJson>>,
    #[serde(default)]
    pub channel_ids: Option<Vec<usize>>,
    #[serde(default)]
    pub channel_type: Option<ChannelType>,
    #[serde(default)]
    pub reduce_op: Option<PlanReduceOp>,
    #[serde(default)]
    pub barrier_id: Option<u32>,
    #[serde(default)]
    pub num_threadblocks: Option<u32>,
    #[serde(default)]
    pub tbg_info: Option<TbgInfoJson>,
    #[serde(default)]
    pub semaphore_ids: Option<Vec<usize>>,
    #[serde(default)]
    pub iter_context: Option<IterContextJson>,
    #[serde(default)]
    pub ops: Option<Vec<OpJson>>,
}

/// A chunk range of a local buffer (`type`), a remote buffer (`buffer_id`, an index into the
/// thread block's remote buffers of the operation's channel type) or a switch channel.
#[derive(Debug, Clone, Deserialize)]
pub struct ChunkJson {
    #[serde(default, rename = "type")]
    pub ty: Option<BufferType>,
    #[serde(default)]
    pub buffer_id: Option<usize>,
    #[serde(default)]
    pub switch_channel_id: Option<usize>,
    pub index: u32,
    pub size: u32,
}

/// `tbg_info`: this block is `tb_id` of a group of `tbg_size` blocks sharing the operation.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct TbgInfoJson {
    pub tb_id: u32,
    pub tbg_size: u32,
}

/// `iter_context` of a pipeline: `num_chunks` chunks processed `unit_size` bytes at a time.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct IterContextJson {
    pub unit_size: u32,
    pub num_chunks: u32,
}

/// Parses `text`; an error names the JSON path of the offending value.
pub fn parse(text: &str) -> std::result::Result<PlanJson, String> {
    let de = &mut serde_json::Deserializer::from_str(text);
    match serde_path_to_error::deserialize::<_, PlanJson>(de) {
        Ok(p) => Ok(p),
        Err(e) => {
            let mut path = e.path().to_string();
            let mut msg = e.into_inner().to_string();
            // serde names a missing field in the message, at the path of the object that
            // lacks it: move the field into the path (`ops[7].channel_ids: missing`).
            if let Some(rest) = msg.strip_prefix("missing field `") {
                if let Some((field, tail)) = rest.split_once('`') {
                    path = if path.is_empty() || path == "." || path == "?" {
                        field.to_string()
                    } else {
                        format!("{path}.{field}")
                    };
                    msg = format!("missing required field{tail}");
                }
            }
            if path.is_empty() || path == "." || path == "?" {
                Err(msg)
            } else {
                Err(format!("at {path}: {msg}"))
            }
        }
    }
}
