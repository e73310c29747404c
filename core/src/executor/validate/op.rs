//! One operation of a thread block: its channels, chunks and thread-block group resolved, its
//! shape checked against the operation table (`super::shape`), and a pipeline's body resolved
//! the same way.

use super::chunk::{resolve_chunk, BlockCtx};
use super::shape;
use crate::executor::error::{OpLocation, PlanError};
use crate::executor::json::{ChannelType, ChunkJson, OpJson, OpName};
use crate::executor::limits::{MAX_BUFFERS_PER_OP, MAX_CHANNELS_PER_OP};
use crate::executor::model::{Chunk, Op};

type R<T> = Result<T, PlanError>;

/// Resolves the operation `op` at `at` (and a pipeline's inner operations) and checks its
/// shape.
pub(super) fn resolve_op(ctx: &BlockCtx, op: &OpJson, at: OpLocation) -> R<Op> {
    let ct = op.channel_type;
    let mut out = Op {
        name: op.name,
        channel_type: ct.unwrap_or(ChannelType::None),
        channels: channels(ctx, op, at)?,
        src: side(ctx, op, at, &op.src_buff, "src_buff")?,
        dst: side(ctx, op, at, &op.dst_buff, "dst_buff")?,
        reduce: op.reduce_op.unwrap_or_default(),
        barrier: None,
        tbg: thread_block_group(op, at)?,
        semaphores: Vec::new(),
        pipeline: None,
        inner: Vec::new(),
    };
    shape::check(ctx.gpu, op, &mut out, at)?;
    if op.name == OpName::Pipeline {
        pipeline(ctx, op, &mut out, at)?;
    }
    Ok(out)
}

/// `channel_ids`: indexes into the block's channels of the operation's type.
fn channels(ctx: &BlockCtx, op: &OpJson, at: OpLocation) -> R<Vec<usize>> {
    let Some(ids) = &op.channel_ids else {
        return Ok(Vec::new());
    };
    let ct = op.channel_type;
    let n = match ct {
        Some(t @ (ChannelType::Memory | ChannelType::Port | ChannelType::Switch)) => {
            ctx.block.channels(t).len()
        }
        _ if ids.is_empty() => 0,
        _ => {
            return Err(at.err(
                "channel_type",
                format!(
                    "channel_ids are given, so expected memory, port or switch, got {}",
                    ct.map_or("nothing", |t| t.name())
                ),
            ))
        }
    };
    if ids.len() > MAX_CHANNELS_PER_OP {
        return Err(at.err(
            "channel_ids",
            format!(
                "expected at most {MAX_CHANNELS_PER_OP} channels per operation, got {}",
                ids.len()
            ),
        ));
    }
    if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id >= n) {
        let what = ct.map_or("none", |t| t.name());
        return Err(at.err(
            format!("channel_ids[{i}]"),
            format!("expected an index below {n} (the thread block's {what} channels), got {id}"),
        ));
    }
    Ok(ids.clone())
}

/// `src_buff` or `dst_buff` (`field`): the chunks of one side.
fn side(
    ctx: &BlockCtx,
    op: &OpJson,
    at: OpLocation,
    list: &Option<Vec<ChunkJson>>,
    field: &str,
) -> R<Vec<Chunk>> {
    let list = list.as_deref().unwrap_or_default();
    if list.len() > MAX_BUFFERS_PER_OP {
        return Err(at.err(
            field,
            format!(
                "expected at most {MAX_BUFFERS_PER_OP} chunks per operation, got {}",
                list.len()
            ),
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, c)| resolve_chunk(ctx, c, op.channel_type, at, &format!("{field}[{i}]")))
        .collect()
}

/// `tbg_info`: (this block's index in its group, group size); (0, 1) without a group.
fn thread_block_group(op: &OpJson, at: OpLocation) -> R<(u32, u32)> {
    match op.tbg_info {
        None => Ok((0, 1)),
        Some(t) if t.tbg_size >= 1 && t.tb_id < t.tbg_size => Ok((t.tb_id, t.tbg_size)),
        Some(t) => Err(at.err(
            "tbg_info",
            format!(
                "expected tb_id below tbg_size (>= 1), got tb_id {} of tbg_size {}",
                t.tb_id, t.tbg_size
            ),
        )),
    }
}

/// A pipeline's `iter_context` and body (no nested pipelines, no packet operations).
fn pipeline(ctx: &BlockCtx, op: &OpJson, out: &mut Op, at: OpLocation) -> R<()> {
    if at.inner.is_some() {
        return Err(at.err("", "a pipeline inside a pipeline is not supported"));
    }
    let ic = op
        .iter_context
        .ok_or_else(|| at.err("iter_context", "missing for a pipeline"))?;
    if ic.unit_size == 0 || !ic.unit_size.is_multiple_of(4) || ic.num_chunks == 0 {
        return Err(at.err(
            "iter_context",
            format!(
                "expected unit_size a positive multiple of 4 bytes and num_chunks above 0, got unit_size {} and num_chunks {}",
                ic.unit_size, ic.num_chunks
            ),
        ));
    }
    let body = op
        .ops
        .as_deref()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| at.err("ops", "a pipeline needs at least one operation"))?;
    for (i, o) in body.iter().enumerate() {
        let inner = at.inner(i, o.name);
        if shape::is_packet(o.name) {
            return Err(inner.err(
                "name",
                format!(
                    "{} inside a pipeline: packet operations do not take pipeline offsets",
                    o.name.name()
                ),
            ));
        }
        out.inner.push(resolve_op(ctx, o, inner)?);
    }
    out.pipeline = Some(ic);
    Ok(())
}
