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
    op, ExecBlock, ExecOp, CHANNEL_MEMORY, CHANNEL_NONE, CHANNEL_PORT, CHANNEL_SWITCH,
    OP_LANE_LOCAL, REF_REMOTE, REF_SWITCH, SWITCH_VECTOR_BYTES,
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

/// Where an inner op of a pipeline reads or writes: `owner` (None: this rank) and buffer
/// `ty`, byte range `off..off + len`.
#[derive(Clone, Copy)]
struct Access {
    owner: Option<usize>,
    ty: BufferType,
    off: u64,
    len: u64,
    write: bool,
}

impl Access {
    /// Whether running the steps of both accesses op by op over the whole range (rather than
    /// step by step) may change what is read or written: one writes, and they may share
    /// bytes other than element for element at the same position (the same range of the same
    /// buffer is fine: step k of both touches the same bytes either way). The input and output
    /// buffers of one rank may be one allocation (in-place calls), so they may alias at any
    /// offset; scratch and other ranks' buffers do not alias this rank's.
    fn conflicts(&self, b: &Access) -> bool {
        if !(self.write || b.write) || self.owner != b.owner {
            return false;
        }
        let io = |t: BufferType| t != BufferType::Scratch;
        if self.ty != b.ty {
            return io(self.ty) && io(b.ty);
        }
        let disjoint = self.off + self.len <= b.off || b.off + b.len <= self.off;
        let same = self.off == b.off && self.len == b.len;
        !(disjoint || same)
    }
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
        for o in &b.ops {
            lower_op(l, o, &mut ops).map_err(|e| LowerError::InBlock {
                thread_block: bi,
                source: Box::new(e),
            })?;
        }
        mark_lane_local_nops(&mut ops);
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
