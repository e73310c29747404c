//! Lowering: the validated plan of one rank ([`RankPlan`]) becomes the device form
//! ([`device`]) for one message size ([`layout::Layout`]), pointing at the resources the
//! executor set up ([`Tables`]). The GPU kernel and the host interpreter both run the result.

pub mod device;
mod error;
pub(crate) mod layout;

use super::json::{BufferType, ChannelType, OpName, PlanReduceOp};
use super::model::{BufRef, Chunk, Op, RankPlan};
use crate::memory_channel::BaseMemoryChannelDeviceHandle;
use crate::port_channel::BasePortChannelDeviceHandle;
use device::{
    op, ExecBlock, ExecOp, ASYNC_ROUNDS, CHANNEL_MEMORY, CHANNEL_NONE, CHANNEL_PORT,
    CHANNEL_SWITCH, OP_LANE_ASYNC, OP_LANE_LOCAL, OP_LANE_SPLIT, OP_LANE_SPLIT_IO, REF_REMOTE,
    REF_SWITCH, SWITCH_VECTOR_BYTES,
};
pub(crate) use error::LowerError;
use layout::Layout;

/// The executor's resources a lowered plan points at (indexes are the rank's).
pub(crate) struct Tables<'a> {
    pub memory_channels: &'a [BaseMemoryChannelDeviceHandle],
    pub port_channels: &'a [BasePortChannelDeviceHandle],
    /// Per remote buffer of the rank: its address here (memory access) and proxy id (port).
    pub memory_buffers: &'a [u64],
    pub port_buffers: &'a [u32],
    /// Per remote buffer of the rank: the offset of its second scratch half (or 0).
    pub halves: &'a [u32],
}

type R<T> = std::result::Result<T, LowerError>;

fn code(n: OpName) -> R<u8> {
    use OpName::*;
    Ok(match n {
        Nop => op::NOP,
        Barrier => op::BARRIER,
        Put => op::PUT,
        Pws => op::PUT_WITH_SIGNAL,
        Pwsf => op::PUT_WITH_SIGNAL_AND_FLUSH,
        Get => op::GET,
        Copy => op::COPY,
        Signal => op::SIGNAL,
        Wait => op::WAIT,
        Flush => op::FLUSH,
        Re => op::REDUCE,
        Res => op::REDUCE_SEND,
        Rre => op::READ_REDUCE,
        Rres => op::READ_REDUCE_SEND,
        Ppkt => op::PUT_PACKETS,
        Rppkt => op::READ_PUT_PACKETS,
        Respkt => op::REDUCE_SEND_PACKETS,
        Cpkt => op::COPY_PACKETS,
        Upkt => op::UNPACK_PACKETS,
        Repkt => op::REDUCE_PACKETS,
        Recpkt => op::REDUCE_COPY_PACKETS,
        Recspkt => op::REDUCE_COPY_SEND_PACKETS,
        Rlxsignal => op::RELAXED_SIGNAL,
        Rlxwait => op::RELAXED_WAIT,
        Pipeline => op::PIPELINE,
        SemAcquire => op::SEM_ACQUIRE,
        SemRelease => op::SEM_RELEASE,
        Glre => op::GROUP_LOAD_REDUCE,
        Glres => op::GROUP_LOAD_REDUCE_STORE,
        Gstore => op::GROUP_STORE,
        Gstorepkt => return Err(LowerError::Unsupported(n)),
    })
}

/// The plan op that lowers to operation code `c` ([`code`] backwards), if any.
pub(crate) fn plan_op(c: u8) -> Option<OpName> {
    use OpName::*;
    Some(match c {
        op::NOP => Nop,
        op::BARRIER => Barrier,
        op::PUT => Put,
        op::PUT_WITH_SIGNAL => Pws,
        op::PUT_WITH_SIGNAL_AND_FLUSH => Pwsf,
        op::GET => Get,
        op::COPY => Copy,
        op::SIGNAL => Signal,
        op::WAIT => Wait,
        op::FLUSH => Flush,
        op::REDUCE => Re,
        op::REDUCE_SEND => Res,
        op::READ_REDUCE => Rre,
        op::READ_REDUCE_SEND => Rres,
        op::PUT_PACKETS => Ppkt,
        op::READ_PUT_PACKETS => Rppkt,
        op::REDUCE_SEND_PACKETS => Respkt,
        op::COPY_PACKETS => Cpkt,
        op::UNPACK_PACKETS => Upkt,
        op::REDUCE_PACKETS => Repkt,
        op::REDUCE_COPY_PACKETS => Recpkt,
        op::REDUCE_COPY_SEND_PACKETS => Recspkt,
        op::RELAXED_SIGNAL => Rlxsignal,
        op::RELAXED_WAIT => Rlxwait,
        op::PIPELINE => Pipeline,
        op::SEM_ACQUIRE => SemAcquire,
        op::SEM_RELEASE => SemRelease,
        op::GROUP_LOAD_REDUCE => Glre,
        op::GROUP_LOAD_REDUCE_STORE => Glres,
        op::GROUP_STORE => Gstore,
        _ => return None,
    })
}

fn u32_of(value: u64, what: &'static str) -> R<u32> {
    u32::try_from(value).map_err(|_| LowerError::Above32Bits { what, value })
}

fn lower_side(
    l: &Layout,
    side: &[Chunk],
    tbg: (u32, u32),
    refs: &mut [u8],
    types: &mut [u8],
    offs: &mut [u32],
    sizes: &mut [u32],
) -> R<()> {
    for (i, c) in side.iter().enumerate() {
        let (r, t) = match c.buf {
            BufRef::Local(t) => (t as u8, t),
            BufRef::Remote { slot, ty, .. } => (REF_REMOTE | slot as u8, ty),
            BufRef::Switch { slot, ty } => (REF_SWITCH | slot as u8, ty),
        };
        let (off, size) = l.chunk(c, tbg);
        if matches!(c.buf, BufRef::Switch { .. })
            && (!off.is_multiple_of(SWITCH_VECTOR_BYTES)
                || !size.is_multiple_of(SWITCH_VECTOR_BYTES))
        {
            return Err(LowerError::SwitchMisaligned { offset: off, size });
        }
        refs[i] = r;
        types[i] = t as u8;
        offs[i] = u32_of(off, "chunk offset")?;
        sizes[i] = u32_of(size, "chunk size")?;
        u32_of(off + size, "chunk end")?;
    }
    Ok(())
}

fn lower_op(l: &Layout, o: &Op, out: &mut Vec<ExecOp>) -> R<()> {
    let mut e = ExecOp::zeroed();
    e.op_type = code(o.name)?;
    e.channel_type = match o.channel_type {
        ChannelType::Memory => CHANNEL_MEMORY,
        ChannelType::Port => CHANNEL_PORT,
        ChannelType::Switch => CHANNEL_SWITCH,
        ChannelType::None => CHANNEL_NONE,
    };
    e.n_channels = o.channels.len() as u8;
    for (i, &c) in o.channels.iter().enumerate() {
        e.channels[i] = c as u8;
    }
    e.n_inputs = o.src.len() as u8;
    e.n_outputs = o.dst.len() as u8;
    e.reduce_op = o.reduce.code();
    lower_side(
        l,
        &o.src,
        o.tbg,
        &mut e.input_refs,
        &mut e.input_types,
        &mut e.input_offsets,
        &mut e.input_sizes,
    )?;
    lower_side(
        l,
        &o.dst,
        o.tbg,
        &mut e.output_refs,
        &mut e.output_types,
        &mut e.output_offsets,
        &mut e.output_sizes,
    )?;
    if let Some((id, n)) = o.barrier {
        e.barrier_id = id;
        e.n_blocks = n;
    }
    e.n_semaphores = o.semaphores.len() as u8;
    for (i, &s) in o.semaphores.iter().enumerate() {
        e.semaphore_ids[i] = s as u8;
    }
    if let Some(ic) = o.pipeline {
        let total = u64::from(ic.num_chunks) * l.upper_chunk();
        let (unit, n) = pipeline_steps(l, o, ic.unit_size, total);
        e.unit_size = unit;
        e.n_iterations = u32_of(n, "pipeline iterations")?;
        e.n_inner = o.inner.len() as u32;
    }
    out.push(e);
    for i in &o.inner {
        lower_op(l, i, out)?;
    }
    Ok(())
}

/// (bytes per step, steps) of a pipeline `o` over `total` bytes in steps of `unit`: the plan's
/// steps, or one step over all of them (the same bytes) when the steps cannot be told apart
/// ([`steps_independent`]). A body of plain data ops has no point where another thread block
/// or rank could observe one step before the next, so the steps only cost time: the GPU kernel
/// runs each inner op once per step (an `allgather_pipeline` plan at 16 MiB: 8192 steps of
/// 1 KiB, ~2 us each on an H200).
fn pipeline_steps(l: &Layout, o: &Op, unit: u32, total: u64) -> (u32, u64) {
    let n = if unit == 0 {
        0
    } else {
        total.div_ceil(u64::from(unit))
    };
    if n <= 1 || !steps_independent(l, o) {
        return (unit, n);
    }
    match u32::try_from(n * u64::from(unit)) {
        Ok(whole) => (whole, 1),
        Err(_) => (unit, n),
    }
}

/// Where an op reads or writes: `owner` (None: this rank) and buffer `ty`, range
/// `off..off + len` (bytes for a pipeline's inner ops, chunk indexes for the async marks).
#[derive(Clone, Copy)]
struct Access {
    owner: Option<usize>,
    ty: BufferType,
    off: u64,
    len: u64,
    write: bool,
    /// The async marks only: the chunk's size and the op's thread-block group, which with
    /// `owner`, `ty` and `off` fix the first byte the op's kernel code starts its range at
    /// ([`Access::same_start`]); `None` elsewhere.
    start: Option<(u32, (u32, u32))>,
}

impl Access {
    /// Whether the two accesses may touch the same bytes, one of them writing. Buffers of
    /// different ranks never do (a plan's remote buffers and channels are other ranks', the
    /// validation refuses this rank's own); the input and output buffers of one rank may be
    /// one allocation (in-place calls), so they may alias at any offset; scratch does not
    /// alias them.
    fn may_share(&self, b: &Access) -> bool {
        if !(self.write || b.write) || self.owner != b.owner {
            return false;
        }
        let io = |t: BufferType| t != BufferType::Scratch;
        if self.ty != b.ty {
            return io(self.ty) && io(b.ty);
        }
        !(self.off + self.len <= b.off || b.off + b.len <= self.off)
    }

    /// Whether running the steps of both accesses op by op over the whole range (rather than
    /// step by step) may change what is read or written: they may share bytes ([`may_share`],
    /// other ranks' buffers not aliasing this rank's) other than element for element at the
    /// same position (the same range of the same buffer is fine: step k of both touches the
    /// same bytes either way).
    ///
    /// [`may_share`]: Access::may_share
    fn conflicts(&self, b: &Access) -> bool {
        let same = self.ty == b.ty && self.off == b.off && self.len == b.len;
        self.may_share(b) && !same
    }

    /// Whether the two ops start their ranges of one buffer at the same byte (same rank,
    /// buffer, chunk index, chunk size and thread-block group). The kernel's 16-byte vector
    /// paths (copy, get, put through a memory channel, the reductions) give vector `k` of an
    /// op's range to thread `k % threads` of the lanes, so two such ops over ranges that start
    /// at the same byte touch each common byte from the same thread ([`OP_LANE_SPLIT`]).
    fn same_start(&self, b: &Access) -> bool {
        self.start.is_some()
            && self.start == b.start
            && self.owner == b.owner
            && self.ty == b.ty
            && self.off == b.off
    }

    /// How the lanes' access `self` (before a crossing) and `b` (after it) meet, for the async
    /// marks ([`mark_lane_async`]).
    fn meeting(&self, b: &Access) -> Meeting {
        if !self.may_share(b) {
            Meeting::Apart
        } else if self.same_start(b) {
            Meeting::SameStart
        } else if self.owner.is_none() && self.ty != b.ty {
            // may_share across buffer types: this rank's input and output, the only buffers of
            // one rank that alias.
            Meeting::InputOutput
        } else {
            Meeting::Unordered
        }
    }
}

/// [`Access::meeting`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Meeting {
    /// No byte in common, or neither writes.
    Apart,
    /// The same range start ([`Access::same_start`]): the same threads on the vector paths.
    SameStart,
    /// This rank's input against its output: apart when the call's are.
    InputOutput,
    /// Any other overlap: only a lane barrier orders it.
    Unordered,
}

/// Whether the steps of pipeline `o` are independent: every inner op moves data through
/// memory channels or locally (put, get, copy, reductions; no synchronisation, port channel
/// or packet op), no access wraps in reused scratch, and no two accesses conflict
/// ([`Access::conflicts`]).
fn steps_independent(l: &Layout, o: &Op) -> bool {
    use OpName::*;
    let mut acc = Vec::new();
    for i in &o.inner {
        let data = matches!(i.name, Put | Get | Copy | Re | Res | Rre | Rres);
        if !data || !matches!(i.channel_type, ChannelType::Memory | ChannelType::None) {
            return false;
        }
        for (side, write) in [(&i.src, false), (&i.dst, true)] {
            for c in side {
                let (owner, ty) = match c.buf {
                    BufRef::Local(t) => (None, t),
                    BufRef::Remote { ty, rank, .. } => (Some(rank), ty),
                    BufRef::Switch { .. } => return false,
                };
                if ty == BufferType::Scratch && l.reuse_scratch_chunk() > 0 {
                    return false;
                }
                let (off, len) = l.chunk(c, i.tbg);
                acc.push(Access {
                    owner,
                    ty,
                    off,
                    len,
                    write,
                    start: None,
                });
            }
        }
    }
    acc.iter()
        .enumerate()
        .all(|(k, a)| acc[k + 1..].iter().all(|b| !a.conflicts(b)))
}

/// Lowers every thread block of `rp` for the geometry `l`, pointing at `t`.
pub(crate) fn lower(rp: &RankPlan, l: &Layout, t: &Tables) -> R<Vec<Box<ExecBlock>>> {
    let mut blocks = Vec::with_capacity(rp.blocks.len());
    for (bi, b) in rp.blocks.iter().enumerate() {
        let mut eb = ExecBlock::zeroed();
        eb.n_memory_channels = b.memory_channels.len() as u32;
        eb.n_port_channels = b.port_channels.len() as u32;
        for (i, &c) in b.memory_channels.iter().enumerate() {
            eb.memory_channels[i] = t.memory_channels[c];
        }
        for (i, &c) in b.port_channels.iter().enumerate() {
            eb.port_channels[i] = t.port_channels[c];
        }
        for (i, &r) in b.memory_buffers.iter().enumerate() {
            eb.memory_buffers[i] = t.memory_buffers[r];
            eb.memory_buffer_halves[i] = t.halves[r];
        }
        for (i, &r) in b.port_buffers.iter().enumerate() {
            eb.port_buffers[i] = t.port_buffers[r];
            eb.port_buffer_halves[i] = t.halves[r];
        }
        let mut ops = Vec::new();
        let mut starts = Vec::with_capacity(b.ops.len());
        for o in &b.ops {
            starts.push(ops.len());
            lower_op(l, o, &mut ops).map_err(|e| LowerError::InBlock {
                thread_block: bi,
                source: Box::new(e),
            })?;
        }
        mark_lane_local_nops(&mut ops);
        mark_lane_async(l, &b.ops, &starts, &mut ops);
        eb.n_ops = ops.len() as u32;
        eb.ops[..ops.len()].copy_from_slice(&ops);
        blocks.push(eb);
    }
    Ok(blocks)
}

/// Flags the `nop`s a GPU launch of several lanes per plan block can keep to each lane's own
/// threads ([`OP_LANE_LOCAL`]): those between two synchronisation ops that lane 0 runs and
/// whose threads need no order among themselves: a signal, then a signal or a wait; a wait,
/// then a wait or the end of the block. Each such op runs on thread k of lane 0 for channel k,
/// so a thread keeps its own order without the nop, the other lanes have nothing to do between
/// them, and the next data op still waits for lane 0 behind the lane barrier of the nop before
/// it (kept: after a wait it is the release of the other lanes; a wait, nop, signal keeps its
/// nop too, since a chain of ranks may rely on every wait being done before any signal). At the
/// end of the block the launch's end keeps the order. A nop of a pipeline's body, or next to
/// one, stays as it is (the body repeats: its neighbours are not the list's). Upstream's
/// `reduce` plan has 3 such nops of 7, the shipped Simple plans one per block (the last).
fn mark_lane_local_nops(ops: &mut [ExecOp]) {
    let mut in_body = vec![false; ops.len()];
    for (i, o) in ops.iter().enumerate() {
        if o.op_type == op::PIPELINE {
            let end = (i + 1 + o.n_inner as usize).min(ops.len());
            in_body[i + 1..end].iter_mut().for_each(|b| *b = true);
        }
    }
    let signal = |t: u8| t == op::SIGNAL || t == op::RELAXED_SIGNAL;
    let wait = |t: u8| t == op::WAIT || t == op::RELAXED_WAIT;
    for i in 1..ops.len() {
        let near_body =
            in_body[i - 1] || in_body[i] || in_body.get(i + 1).copied().unwrap_or(false);
        if ops[i].op_type != op::NOP || near_body {
            continue;
        }
        let prev = ops[i - 1].op_type;
        let next = ops.get(i + 1).map(|o| o.op_type);
        let free = (signal(prev) && next.is_some_and(|n| signal(n) || wait(n)))
            || (wait(prev) && next.is_none_or(wait));
        if free {
            ops[i].flags |= OP_LANE_LOCAL;
        }
    }
}

/// What an op is to the async lane sync ([`mark_lane_async`]).
enum AsyncRole {
    /// A nop, or a signal or wait through memory channels: needs a lane barrier only when
    /// data of one lane before it meets data of another after it.
    Crossing,
    /// Moves data, split over the lanes; `None`: somewhere in the buffers it names (packets,
    /// switch channels, reused scratch: no exact ranges here).
    Data(Option<Vec<Access>>),
    /// Runs on lane 0 behind a lane barrier when data moved, and the next data op waits for
    /// it behind another (port-channel ops, flush, semaphores; a grid barrier, which the async
    /// sync makes one barrier of every lane): the lanes' data before it is ordered before
    /// everything after it.
    LaneZero,
    /// A pipeline: its body repeats over steps, so none of its crossings is marked and its
    /// data may be anywhere in the buffers it names.
    Pipeline,
}

fn async_role(l: &Layout, o: &Op) -> AsyncRole {
    use OpName::*;
    let memory = o.channel_type == ChannelType::Memory;
    match o.name {
        Nop => AsyncRole::Crossing,
        Signal | Wait | Rlxsignal | Rlxwait if memory => AsyncRole::Crossing,
        Pipeline => AsyncRole::Pipeline,
        _ if o.channel_type == ChannelType::Port => AsyncRole::LaneZero,
        Barrier | Signal | Wait | Rlxsignal | Rlxwait | Flush | SemAcquire | SemRelease => {
            AsyncRole::LaneZero
        }
        Put | Pws | Pwsf | Get | Copy | Re | Res | Rre | Rres => {
            // In chunk indexes, not bytes, so every message size of the plan gets the same
            // marks (one compiled kernel serves them all; jit.rs): chunks disjoint by index
            // are disjoint in bytes. A thread-block group's share counts as its whole chunks.
            // The kernel's reductions run every buffer over the first input's size: each
            // access spans the op's longest chunk.
            let sides = [(&o.src, false), (&o.dst, true)];
            let len = sides
                .iter()
                .flat_map(|(side, _)| side.iter())
                .map(|c| u64::from(c.size))
                .max()
                .unwrap_or(0);
            let mut acc = Vec::new();
            for (side, write) in sides {
                for c in side {
                    let ty = match c.buf {
                        BufRef::Local(t) | BufRef::Remote { ty: t, .. } => t,
                        BufRef::Switch { .. } => return AsyncRole::Data(None),
                    };
                    if ty == BufferType::Scratch && l.scratch_may_wrap() {
                        return AsyncRole::Data(None);
                    }
                    let owner = match c.buf {
                        BufRef::Remote { rank, .. } => Some(rank),
                        _ => None,
                    };
                    acc.push(Access {
                        owner,
                        ty,
                        off: u64::from(c.index),
                        len,
                        write,
                        start: Some((c.size, o.tbg)),
                    });
                }
            }
            AsyncRole::Data(Some(acc))
        }
        _ => AsyncRole::Data(None),
    }
}

/// Flags the crossings (nops, memory-channel signals and waits) that need no lane barrier
/// under the async lane sync ([`OP_LANE_ASYNC`]): no data op since the last lane barrier may
/// touch chunks that a data op after the crossing (up to the next crossing) touches from
/// another lane: any that may share a chunk ([`Access::may_share`], in chunk indexes here),
/// not only those [`Access::conflicts`] finds, since two ops over the same range may split it
/// over the lanes differently (vector or element paths, packets). Then a nop is only the GPU
/// block's `__syncthreads`, a memory-channel signal is sent by the last lane to arrive (so
/// every lane's data before it reaches the peer first), and a memory-channel wait is done by
/// every lane itself, so whatever the peer wrote before signalling is visible to each. A
/// crossing where lanes meet stays a lane barrier (the kernel's barrier path), which orders
/// everything before it. At most [`ASYNC_ROUNDS`] signals of a block are flagged. The
/// crossings of a pipeline's body are never flagged, and data without exact ranges here (a
/// pipeline's, packets, switch channels, reused scratch) meets any other data. A nop where data
/// meets only as two ranges starting at the same byte ([`Access::same_start`]) or as this
/// rank's input and output ([`Access::meeting`]) is flagged [`OP_LANE_SPLIT`] (and
/// [`OP_LANE_SPLIT_IO`] for the latter) instead: the kernel keeps the two ops of each meeting
/// on one thread when every op around it takes its 16-byte vector path (and the call's input
/// and output do not overlap), and is a lane barrier otherwise. `starts[i]`: the position of
/// `ops[i]` (a plan op) in the lowered list `out`.
fn mark_lane_async(l: &Layout, ops: &[Op], starts: &[usize], out: &mut [ExecOp]) {
    let roles: Vec<AsyncRole> = ops.iter().map(|o| async_role(l, o)).collect();
    // Data of the lanes since the last lane barrier; `anywhere`: some of it has no exact range.
    let mut pending: Vec<Access> = Vec::new();
    let mut anywhere = false;
    let mut rounds = 0usize;
    for (i, role) in roles.iter().enumerate() {
        match role {
            AsyncRole::Data(Some(acc)) => pending.extend_from_slice(acc),
            AsyncRole::Data(None) | AsyncRole::Pipeline => anywhere = true,
            AsyncRole::LaneZero => {
                pending.clear();
                anywhere = false;
            }
            AsyncRole::Crossing => {
                // The data after this crossing, up to the next crossing or lane-0 op.
                let mut after: Vec<&Access> = Vec::new();
                let mut after_anywhere = false;
                for r in &roles[i + 1..] {
                    match r {
                        AsyncRole::Data(Some(acc)) => after.extend(acc.iter()),
                        AsyncRole::Data(None) | AsyncRole::Pipeline => {
                            after_anywhere = true;
                            break;
                        }
                        AsyncRole::Crossing | AsyncRole::LaneZero => break,
                    }
                }
                // Which kinds of meeting the exact ranges have, pair by pair.
                let kinds: Vec<Meeting> = after
                    .iter()
                    .flat_map(|b| pending.iter().map(move |a| a.meeting(b)))
                    .filter(|&k| k != Meeting::Apart)
                    .collect();
                let before_data = anywhere || !pending.is_empty();
                let after_data = after_anywhere || !after.is_empty();
                let meet =
                    before_data && after_data && (anywhere || after_anywhere || !kinds.is_empty());
                let e = &mut out[starts[i]];
                let signal = e.op_type == op::SIGNAL || e.op_type == op::RELAXED_SIGNAL;
                // A nop where every meeting is of two ranges that start at the same byte, or
                // of this rank's input and output: a lane barrier only where the kernel finds
                // an op of the window off its 16-byte vector path or (the latter) the call's
                // input and output overlapping, and then maybe only before the first such op
                // after the nop, so the data before it stays pending here.
                let split = meet
                    && e.op_type == op::NOP
                    && !anywhere
                    && !after_anywhere
                    && !kinds.contains(&Meeting::Unordered);
                let io = kinds.contains(&Meeting::InputOutput);
                if split {
                    e.flags |= OP_LANE_SPLIT | if io { OP_LANE_SPLIT_IO } else { 0 };
                } else if meet || (signal && rounds >= ASYNC_ROUNDS) {
                    pending.clear();
                    anywhere = false;
                } else {
                    e.flags |= OP_LANE_ASYNC;
                    rounds += usize::from(signal);
                }
            }
        }
    }
}

impl PlanReduceOp {
    /// `ExecOp.reduce_op`: 0 sum, 1 min, 2 max.
    pub(crate) fn code(self) -> u8 {
        match self {
            PlanReduceOp::Sum => 0,
            PlanReduceOp::Min => 1,
            PlanReduceOp::Max => 2,
        }
    }

    /// From `ExecOp.reduce_op` (unknown codes: sum, as the kernel does).
    pub(crate) fn from_code(c: u8) -> PlanReduceOp {
        match c {
            1 => PlanReduceOp::Min,
            2 => PlanReduceOp::Max,
            _ => PlanReduceOp::Sum,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::plan::ExecutionPlan;

    const PIPELINE: &str = include_str!("../../../plans/allgather_pipeline_n2.json");

    /// The nops between lane 0's signals and waits (and after its last wait) are marked lane
    /// local; those before or after data, between a wait and a signal, or in or next to a
    /// pipeline's body are not.
    #[test]
    fn lane_local_nops_sit_between_signals_and_waits() {
        let list = |types: &[u8]| -> Vec<ExecOp> {
            types
                .iter()
                .map(|&t| {
                    let mut o = ExecOp::zeroed();
                    o.op_type = t;
                    o
                })
                .collect()
        };
        let marked = |ops: &[ExecOp]| -> Vec<usize> {
            ops.iter()
                .enumerate()
                .filter(|(_, o)| o.flags & OP_LANE_LOCAL != 0)
                .map(|(i, _)| i)
                .collect()
        };
        use op::*;
        // Upstream's `reduce`: copy nop signal nop wait nop rres get nop res nop signal nop
        // wait nop.
        let mut ops = list(&[
            COPY,
            NOP,
            SIGNAL,
            NOP,
            WAIT,
            NOP,
            READ_REDUCE_SEND,
            GET,
            NOP,
            REDUCE_SEND,
            NOP,
            SIGNAL,
            NOP,
            WAIT,
            NOP,
        ]);
        mark_lane_local_nops(&mut ops);
        assert_eq!(marked(&ops), vec![3, 12, 14]);
        let mut ops = list(&[
            RELAXED_SIGNAL,
            NOP,
            SIGNAL,
            NOP,
            RELAXED_WAIT,
            NOP,
            WAIT,
            NOP,
            SIGNAL,
            NOP,
            NOP,
        ]);
        mark_lane_local_nops(&mut ops);
        // wait, nop, signal keeps its barrier; so do a nop before a nop and one after a nop.
        assert_eq!(marked(&ops), vec![1, 3, 5]);
        // A pipeline of 3 ops: its body and the ops next to it stay as they are.
        let mut ops = list(&[SIGNAL, NOP, WAIT, PIPELINE, SIGNAL, NOP, WAIT, NOP, WAIT]);
        ops[3].n_inner = 3;
        mark_lane_local_nops(&mut ops);
        assert_eq!(marked(&ops), vec![1]);
        // Data ops are never neighbours of a lane-local nop; nothing else is flagged.
        let mut ops = list(&[PUT, NOP, SIGNAL, WAIT, NOP, COPY, NOP]);
        mark_lane_local_nops(&mut ops);
        assert!(marked(&ops).is_empty());
        assert!(ops.iter().all(|o| o.op_type == NOP || o.flags == 0));
    }

    /// A 2-rank plan (rank 0) of one thread block with `ops` (JSON op objects, the same on both
    /// ranks): one memory channel to the peer, the peer's scratch, input and output as remote
    /// buffers 0, 1 and 2, 4 chunks of each buffer.
    fn two_rank_plan(ops: &str) -> ExecutionPlan {
        let gpu = |r: usize| {
            format!(
                r#"{{"id": {r}, "input_chunks": 4, "output_chunks": 4, "scratch_chunks": 4,
                "channels": [{{"channel_type": "memory", "connected_to": [{p}]}}],
                "remote_buffers": [{{"rank": {p}, "type": "s", "access_channel_types": ["memory"]}},
                                   {{"rank": {p}, "type": "i", "access_channel_types": ["memory"]}},
                                   {{"rank": {p}, "type": "o", "access_channel_types": ["memory"]}}],
                "semaphores": [],
                "threadblocks": [{{"id": 0,
                  "channels": [{{"channel_type": "memory", "channel_ids": [0]}}],
                  "remote_buffer_refs": [{{"access_channel_type": "memory", "remote_buffer_ids": [0, 1, 2]}}],
                  "ops": [{ops}]}}]}}"#,
                p = 1 - r
            )
        };
        let json = format!(
            r#"{{"name": "lane_async", "collective": "allreduce", "protocol": "Simple",
            "inplace": true, "reuse_resources": false, "num_threads_per_block": 1024,
            "use_double_scratch_buffer": false, "buffer_alignment": 16, "min_message_size": 0,
            "max_message_size": 18446744073709551615, "gpus": [{}, {}]}}"#,
            gpu(0),
            gpu(1)
        );
        ExecutionPlan::from_json(&json, 0).expect("test plan")
    }

    /// The positions of rank 0's lowered ops of `plan` at 4 KiB per buffer with `flag` set
    /// (for the async lane sync: [`OP_LANE_ASYNC`] or [`OP_LANE_SPLIT`]).
    fn lane_marks(plan: &ExecutionPlan, flag: u8) -> Vec<usize> {
        let rp = plan.rank_plan();
        let l = Layout::new(plan.meta(), rp, 4096, 4096).expect("layout");
        let proto = ExecBlock::zeroed();
        let tables = Tables {
            memory_channels: &[proto.memory_channels[0]],
            port_channels: &[],
            memory_buffers: &[0, 0, 0],
            port_buffers: &[0, 0, 0],
            halves: &[0, 0, 0],
        };
        let blocks = lower(rp, &l, &tables).expect("lowered");
        let b = &blocks[0];
        (0..b.n_ops as usize)
            .filter(|&i| b.ops[i].flags & flag != 0)
            .collect()
    }

    const SIGNAL_OP: &str = r#"{"name": "signal", "channel_ids": [0], "channel_type": "memory"}"#;
    const WAIT_OP: &str = r#"{"name": "wait", "channel_ids": [0], "channel_type": "memory"}"#;
    const NOP_OP: &str = r#"{"name": "nop"}"#;

    /// Op `op` (JSON) with its `src_buff` and `dst_buff` lists replaced by `src` and `dst`.
    fn with_buffs(op: &str, src: &str, dst: &str) -> String {
        let list = |key: &str| {
            let at = op.find(key).expect("buffer list") + key.len();
            let end = at + op[at..].find(']').expect("list end") + 1;
            op[at..end].to_string()
        };
        op.replace(&list(r#""src_buff": "#), src)
            .replace(&list(r#""dst_buff": "#), dst)
    }

    /// An all-reduce in the shape of upstream's `reduce` test plan: the crossings around the
    /// signals and waits are marked (the data before them is not what the data after them
    /// touches), the nop between the get into scratch chunk 1 and the reduction reading it is
    /// not (the lanes may split the two ops' bytes differently) but, the two ranges starting
    /// at the same byte, it is a lane barrier only where the kernel finds an op off its vector
    /// path.
    #[test]
    fn lane_async_marks_crossings_the_data_does_not_meet() {
        let copy = r#"{"name": "copy", "src_buff": [{"type": "i", "index": 2, "size": 2}],
            "dst_buff": [{"type": "s", "index": 2, "size": 2}]}"#;
        let rres = r#"{"name": "rres", "channel_type": "memory", "reduce_op": "sum",
            "src_buff": [{"type": "i", "index": 0, "size": 1}, {"buffer_id": 0, "index": 0, "size": 1}],
            "dst_buff": [{"type": "i", "index": 0, "size": 1}, {"buffer_id": 1, "index": 0, "size": 1}]}"#;
        let get = r#"{"name": "get", "channel_ids": [0], "channel_type": "memory",
            "src_buff": [{"buffer_id": 0, "index": 1, "size": 1}],
            "dst_buff": [{"type": "s", "index": 1, "size": 1}]}"#;
        let res = r#"{"name": "res", "channel_type": "memory", "reduce_op": "sum",
            "src_buff": [{"type": "i", "index": 1, "size": 1}, {"type": "s", "index": 1, "size": 1}],
            "dst_buff": [{"type": "i", "index": 1, "size": 1}, {"buffer_id": 1, "index": 1, "size": 1}]}"#;
        let (s, w, n) = (SIGNAL_OP, WAIT_OP, NOP_OP);
        let ops = [copy, n, s, n, w, n, rres, get, n, res, n, s, n, w, n].join(",");
        let plan = two_rank_plan(&ops);
        // All crossings but 8, the nop between get and res.
        assert_eq!(
            lane_marks(&plan, OP_LANE_ASYNC),
            vec![1, 2, 3, 4, 5, 10, 11, 12, 13, 14]
        );
        assert_eq!(lane_marks(&plan, OP_LANE_SPLIT), vec![8]);
        assert_eq!(lane_marks(&plan, OP_LANE_SPLIT_IO), Vec::<usize>::new());
        // res reading scratch chunk 1 from the middle of what get wrote (chunks 0 and 1): the
        // ranges start at different bytes, a lane barrier.
        let get2 = with_buffs(
            get,
            r#"[{"buffer_id": 0, "index": 0, "size": 2}]"#,
            r#"[{"type": "s", "index": 0, "size": 2}]"#,
        );
        let ops = [copy, n, s, n, w, n, &get2, n, res, n, s, n, w, n].join(",");
        let plan = two_rank_plan(&ops);
        assert_eq!(lane_marks(&plan, OP_LANE_SPLIT), Vec::<usize>::new());
        assert!(!lane_marks(&plan, OP_LANE_ASYNC).contains(&7));
    }

    /// The shape of the shipped out-of-place all-gather: a copy into this rank's output chunk,
    /// then a put of the input into the peer's output chunk of the same index. The two write
    /// chunks of the same index, but of different ranks' buffers; the put reads the input the
    /// copy's output may alias (an in-place call): the nop before the put is a lane barrier
    /// only where the call's input and output overlap (or an op is off its vector path).
    #[test]
    fn lane_async_tells_ranks_buffers_apart() {
        let copy = r#"{"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}],
            "dst_buff": [{"type": "o", "index": 0, "size": 1}]}"#;
        let put = r#"{"name": "put", "channel_ids": [0], "channel_type": "memory",
            "src_buff": [{"type": "i", "index": 0, "size": 1}],
            "dst_buff": [{"buffer_id": 2, "index": 0, "size": 1}]}"#;
        let (s, w, n) = (SIGNAL_OP, WAIT_OP, NOP_OP);
        // copy nop signal wait nop put nop signal wait nop
        let ops = [copy, n, s, w, n, put, n, s, w, n].join(",");
        let plan = two_rank_plan(&ops);
        assert_eq!(lane_marks(&plan, OP_LANE_ASYNC), vec![1, 2, 3, 6, 7, 8, 9]);
        assert_eq!(lane_marks(&plan, OP_LANE_SPLIT), vec![4]);
        assert_eq!(lane_marks(&plan, OP_LANE_SPLIT_IO), vec![4]);
        // A put of the peer's scratch (not this rank's buffer): the meeting is of this rank's
        // output and the peer's, which never alias.
        let put_s = with_buffs(
            put,
            r#"[{"type": "s", "index": 0, "size": 1}]"#,
            r#"[{"buffer_id": 2, "index": 0, "size": 1}]"#,
        );
        let ops = [copy, n, s, w, n, &put_s, n, s, w, n].join(",");
        let plan = two_rank_plan(&ops);
        assert_eq!(
            lane_marks(&plan, OP_LANE_ASYNC),
            vec![1, 2, 3, 4, 6, 7, 8, 9]
        );
        assert_eq!(lane_marks(&plan, OP_LANE_SPLIT), Vec::<usize>::new());
    }

    /// Data the lanes write before a signal and read again after the peer's signal (a copy into
    /// scratch, then a copy out of the same chunk): the crossings between them are marked only
    /// until the reading op, whose crossing is a lane barrier.
    #[test]
    fn lane_async_keeps_barriers_where_lanes_meet() {
        let into = r#"{"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}],
            "dst_buff": [{"type": "s", "index": 0, "size": 1}]}"#;
        let out_of = r#"{"name": "copy", "src_buff": [{"type": "s", "index": 0, "size": 1}],
            "dst_buff": [{"type": "o", "index": 3, "size": 1}]}"#;
        let other = r#"{"name": "copy", "src_buff": [{"type": "s", "index": 2, "size": 1}],
            "dst_buff": [{"type": "s", "index": 3, "size": 1}]}"#;
        let (s, w, n) = (SIGNAL_OP, WAIT_OP, NOP_OP);
        // into nop signal wait nop other nop out_of nop signal wait
        let ops = [into, n, s, w, n, other, n, out_of, n, s, w].join(",");
        let plan = two_rank_plan(&ops);
        // The nop before out_of (6) meets into's write of scratch chunk 0, from the same byte,
        // and into's read of the input (out_of writes the output): a lane barrier only where an
        // op is off the kernel's vector path or the call's input and output overlap.
        assert_eq!(lane_marks(&plan, OP_LANE_ASYNC), vec![1, 2, 3, 4, 8, 9, 10]);
        assert_eq!(lane_marks(&plan, OP_LANE_SPLIT), vec![6]);
        assert_eq!(lane_marks(&plan, OP_LANE_SPLIT_IO), vec![6]);
        // out_of reading scratch chunks 0 and 1 (into wrote chunk 0 only): a chunk of another
        // size, so another start with thread-block groups; a lane barrier.
        let wide = with_buffs(
            out_of,
            r#"[{"type": "s", "index": 0, "size": 2}]"#,
            r#"[{"type": "o", "index": 2, "size": 2}]"#,
        );
        let ops = [into, n, s, w, n, other, n, &wide, n, s, w].join(",");
        let plan = two_rank_plan(&ops);
        assert_eq!(lane_marks(&plan, OP_LANE_SPLIT), Vec::<usize>::new());
        assert_eq!(lane_marks(&plan, OP_LANE_ASYNC), vec![1, 2, 3, 4, 8, 9, 10]);
    }

    #[test]
    fn plan_op_is_code_backwards() {
        for c in 0..=u8::MAX {
            match plan_op(c) {
                Some(n) => assert_eq!(code(n).ok(), Some(c), "{c} -> {}", n.name()),
                None => assert!(c > op::GROUP_STORE, "operation code {c} has no plan op"),
            }
        }
        assert_eq!(plan_op(op::READ_REDUCE).map(OpName::name), Some("rre"));
    }

    /// Rank 0's layout at `total` gathered bytes and its pipeline op (the shipped plan: a put
    /// of the own chunk to the peer in 1 KiB steps).
    fn pipeline_op(total: u64) -> (Layout, Op) {
        let plan = ExecutionPlan::from_json(PIPELINE, 0).expect("shipped plan");
        let l = Layout::new(plan.meta(), plan.rank_plan(), total / 2, total).expect("layout");
        let o = plan.rank_plan().blocks[0]
            .ops
            .iter()
            .find(|o| o.pipeline.is_some())
            .expect("a pipeline op")
            .clone();
        (l, o)
    }

    fn steps(l: &Layout, o: &Op) -> (u32, u64) {
        let ic = o.pipeline.expect("pipeline");
        pipeline_steps(
            l,
            o,
            ic.unit_size,
            u64::from(ic.num_chunks) * l.upper_chunk(),
        )
    }

    #[test]
    fn independent_pipeline_steps_become_one() {
        let (l, o) = pipeline_op(16 << 20);
        // 8 MiB per rank in 1 KiB steps, run as one step of the same bytes.
        assert_eq!(steps(&l, &o), (8 << 20, 1));
        // One step to begin with: unchanged.
        let (l, o) = pipeline_op(2048);
        assert_eq!(steps(&l, &o), (1024, 1));
    }

    #[test]
    fn dependent_pipeline_steps_stay() {
        let (l, o) = pipeline_op(16 << 20);
        let per_unit = (1024, 8192);
        // A signal in the body: the peer observes every step.
        let mut sig = o.clone();
        let mut s = o.inner[0].clone();
        s.name = OpName::Signal;
        s.src.clear();
        s.dst.clear();
        s.channels = vec![0];
        sig.inner.push(s);
        assert_eq!(steps(&l, &sig), per_unit);
        // A copy from output chunk 0 (2 chunks) to chunk 1: step k reads what step k - 1 wrote.
        let mut ov = o.clone();
        let c = &mut ov.inner[0];
        c.name = OpName::Copy;
        c.channel_type = ChannelType::None;
        c.src[0] = Chunk {
            buf: BufRef::Local(BufferType::Output),
            index: 0,
            size: 2,
        };
        c.dst[0] = Chunk {
            buf: BufRef::Local(BufferType::Output),
            index: 1,
            size: 1,
        };
        assert_eq!(steps(&l, &ov), per_unit);
        // Input and output may be one allocation: a copy between them keeps its steps.
        ov.inner[0].src[0].buf = BufRef::Local(BufferType::Input);
        ov.inner[0].src[0].size = 1;
        assert_eq!(steps(&l, &ov), per_unit);
        // Disjoint chunks of one buffer: independent again.
        ov.inner[0].src[0].buf = BufRef::Local(BufferType::Output);
        assert_eq!(steps(&l, &ov), (8 << 20, 1));
    }
}
