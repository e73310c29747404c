//! Chunk references of one thread block's operations: a local buffer (`type`), a remote buffer
//! of the block (`buffer_id`, through the operation's channel type) or a switch channel of the
//! block (`switch_channel_id`), each a chunk range inside its buffer.

use crate::executor::error::{OpLocation, PlanError};
use crate::executor::json::{ChannelType, ChunkJson, GpuJson, PlanJson};
use crate::executor::model::{Block, BufRef, Chunk, RemoteBuffer, SwitchSpec};

/// What a thread block's operations may name.
pub(super) struct BlockCtx<'a> {
    pub plan: &'a PlanJson,
    pub rank: usize,
    pub thread_block: usize,
    pub gpu: &'a GpuJson,
    pub block: &'a Block,
    pub remote: &'a [RemoteBuffer],
    pub switch: &'a [SwitchSpec],
}

impl BlockCtx<'_> {
    /// The location of the block's `index`-th operation, named `name`.
    pub(super) fn op_at(&self, index: usize, name: crate::executor::json::OpName) -> OpLocation {
        OpLocation {
            rank: self.rank,
            thread_block: self.thread_block,
            op: index,
            inner: None,
            name,
        }
    }
}

/// Resolves `c`, the chunk at `field` (`src_buff[2]`) of the operation `at` whose channel
/// type is `ct`.
pub(super) fn resolve_chunk(
    ctx: &BlockCtx,
    c: &ChunkJson,
    ct: Option<ChannelType>,
    at: OpLocation,
    field: &str,
) -> Result<Chunk, PlanError> {
    let given = [
        c.ty.is_some(),
        c.buffer_id.is_some(),
        c.switch_channel_id.is_some(),
    ]
    .iter()
    .filter(|&&x| x)
    .count();
    if given != 1 {
        return Err(at.err(
            field,
            format!("expected exactly one of type, buffer_id or switch_channel_id, got {given}"),
        ));
    }
    let (buf, chunks, owner) = match (c.ty, c.buffer_id, c.switch_channel_id) {
        (Some(t), _, _) => (BufRef::Local(t), ctx.gpu.chunks(t), ctx.rank),
        (_, Some(id), _) => remote(ctx, id, ct, at, field)?,
        (_, _, id) => switch(ctx, id.unwrap_or_default(), at, field)?,
    };
    if c.size == 0 {
        return Err(at.err(format!("{field}.size"), "expected at least 1 chunk, got 0"));
    }
    let end = u64::from(c.index) + u64::from(c.size);
    if end > u64::from(chunks) {
        let t = buf.buffer_type().map_or("?", |t| t.long_name());
        let via = if matches!(buf, BufRef::Switch { .. }) {
            " (bound to the switch channel)"
        } else {
            ""
        };
        return Err(at.err(
            field,
            format!(
                "chunks {}..{end} lie outside rank {owner}'s {t} buffer{via} of {chunks} chunks",
                c.index
            ),
        ));
    }
    Ok(Chunk {
        buf,
        index: c.index,
        size: c.size,
    })
}

/// A `buffer_id` reference: (reference, chunks of the buffer, its owner).
fn remote(
    ctx: &BlockCtx,
    id: usize,
    ct: Option<ChannelType>,
    at: OpLocation,
    field: &str,
) -> Result<(BufRef, u32, usize), PlanError> {
    let field = format!("{field}.buffer_id");
    let Some(list) = ct.and_then(|t| ctx.block.remote_buffers(t)) else {
        return Err(at.err(
            field,
            format!(
                "a remote chunk needs the operation's channel_type to be memory or port, got {}",
                ct.map_or("nothing", |t| t.name())
            ),
        ));
    };
    let rb = list.get(id).map(|&i| ctx.remote[i]).ok_or_else(|| {
        at.err(
            &field,
            format!(
                "expected an index below {} (the thread block's remote buffers through {} channels), got {id}",
                list.len(),
                ct.map_or("?", |t| t.name())
            ),
        )
    })?;
    let buf = BufRef::Remote {
        slot: id,
        ty: rb.ty,
        rank: rb.rank,
    };
    Ok((buf, ctx.plan.gpus[rb.rank].chunks(rb.ty), rb.rank))
}

/// A `switch_channel_id` reference: (reference, chunks of the bound buffer, this rank).
fn switch(
    ctx: &BlockCtx,
    id: usize,
    at: OpLocation,
    field: &str,
) -> Result<(BufRef, u32, usize), PlanError> {
    let spec = ctx
        .block
        .switch_channels
        .get(id)
        .map(|&i| &ctx.switch[i])
        .ok_or_else(|| {
            at.err(
                format!("{field}.switch_channel_id"),
                format!(
                    "expected an index below {} (the thread block's switch channels), got {id}",
                    ctx.block.switch_channels.len()
                ),
            )
        })?;
    let buf = BufRef::Switch {
        slot: id,
        ty: spec.ty,
    };
    Ok((buf, ctx.gpu.chunks(spec.ty), ctx.rank))
}
