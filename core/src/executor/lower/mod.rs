//! Lowering: the validated plan of one rank ([`RankPlan`]) becomes the device form
//! ([`device`]) for one message size ([`layout::Layout`]), pointing at the resources the
//! executor set up ([`Tables`]). The GPU kernel and the host interpreter both run the result.

pub mod device;
mod error;
pub(crate) mod layout;

use super::json::{ChannelType, OpName, PlanReduceOp};
use super::model::{BufRef, Chunk, Op, RankPlan};
use crate::memory_channel::BaseMemoryChannelDeviceHandle;
use crate::port_channel::BasePortChannelDeviceHandle;
use device::{
    op, ExecBlock, ExecOp, CHANNEL_MEMORY, CHANNEL_NONE, CHANNEL_PORT, CHANNEL_SWITCH, REF_REMOTE,
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
        e.unit_size = ic.unit_size;
        e.n_iterations = u32_of(
            total.div_ceil(u64::from(ic.unit_size)),
            "pipeline iterations",
        )?;
        e.n_inner = o.inner.len() as u32;
    }
    out.push(e);
    for i in &o.inner {
        lower_op(l, i, out)?;
    }
    Ok(())
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
        eb.n_ops = ops.len() as u32;
        eb.ops[..ops.len()].copy_from_slice(&ops);
        blocks.push(eb);
    }
    Ok(blocks)
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
