//! Turns the JSON of a plan into one [`RankPlan`] per rank and checks everything that does
//! not depend on the message size, for every rank: ids in range, chunk ranges inside their
//! buffers, operation shapes, limits of the device plan, every wait matched by a signal of the
//! peer, barriers met by the blocks that name them, device semaphores balanced. Errors name
//! the JSON path (`gpus[1].threadblocks[3].ops[7].channel_ids[0]`) and what was expected.

use super::json::{BufferType, ChannelType, ChunkJson, GpuJson, PlanJson, ThreadBlockJson};
use super::plan::{Block, BufRef, BufferSend, Chunk, RankPlan, RemoteBuffer, SwitchSpec};
use super::validate_ops::{check_block_sync, check_signals, resolve_op};
use super::{
    MAX_CHANNELS_PER_BLOCK, MAX_OPS_PER_BLOCK, MAX_REMOTE_BUFFERS_PER_BLOCK, MAX_THREADBLOCKS,
};

pub(super) type R<T> = std::result::Result<T, String>;

/// Resolves and validates every rank of `plan`.
pub(crate) fn resolve(plan: &PlanJson) -> R<Vec<RankPlan>> {
    check_top(plan)?;
    let n = plan.gpus.len();
    let mut ranks = Vec::with_capacity(n);
    for (g, gpu) in plan.gpus.iter().enumerate() {
        ranks.push(resolve_gpu(plan, g, gpu)?);
    }
    // Sends: every remote buffer some rank names is sent to it by its owner.
    for (g, gpu) in plan.gpus.iter().enumerate() {
        for (j, rb) in gpu.remote_buffers.iter().enumerate() {
            ranks[rb.rank].sends.push(BufferSend {
                to: g,
                ty: rb.ty,
                port: rb.access_channel_types.contains(&ChannelType::Port),
                tag: j,
            });
        }
    }
    for r in 0..n {
        for (ty, peers) in [
            (
                ChannelType::Memory,
                (|p: &RankPlan| &p.memory_peers) as fn(&RankPlan) -> &Vec<usize>,
            ),
            (ChannelType::Port, |p: &RankPlan| &p.port_peers),
        ] {
            let mut extra = Vec::new();
            for p in 0..n {
                let mine = peers(&ranks[r]).iter().filter(|&&x| x == p).count();
                let theirs = peers(&ranks[p]).iter().filter(|&&x| x == r).count();
                extra.extend(std::iter::repeat_n(p, theirs.saturating_sub(mine)));
            }
            match ty {
                ChannelType::Memory => ranks[r].unpaired_memory = extra,
                _ => ranks[r].unpaired_port = extra,
            }
        }
    }
    check_signals(&ranks)?;
    Ok(ranks)
}

fn check_top(plan: &PlanJson) -> R<()> {
    if plan.gpus.is_empty() {
        return Err("gpus: expected at least one gpu, got none".into());
    }
    if !(1..=1024).contains(&plan.num_threads_per_block) {
        return Err(format!(
            "num_threads_per_block: expected 1..=1024, got {}",
            plan.num_threads_per_block
        ));
    }
    if plan.buffer_alignment == 0 || !plan.buffer_alignment.is_multiple_of(4) {
        return Err(format!(
            "buffer_alignment: expected a positive multiple of 4 bytes, got {}",
            plan.buffer_alignment
        ));
    }
    if plan.min_message_size > plan.max_message_size {
        return Err(format!(
            "min_message_size {} is above max_message_size {}",
            plan.min_message_size, plan.max_message_size
        ));
    }
    if plan.collective.is_empty() {
        return Err("collective: expected a collective name, got an empty string".into());
    }
    if plan.nranks_per_node == Some(0) {
        return Err("nranks_per_node: expected at least 1, got 0".into());
    }
    for (g, gpu) in plan.gpus.iter().enumerate() {
        if gpu.id != g {
            return Err(format!(
                "gpus[{g}].id: expected {g} (gpus are listed in rank order), got {}",
                gpu.id
            ));
        }
        if gpu.input_chunks == 0 && gpu.output_chunks == 0 {
            return Err(format!(
                "gpus[{g}]: input_chunks and output_chunks are both 0: expected at least one above 0"
            ));
        }
    }
    Ok(())
}

/// What a thread block's operations may name.
pub(super) struct BlockCtx<'a> {
    pub plan: &'a PlanJson,
    pub rank: usize,
    pub gpu: &'a GpuJson,
    pub block: &'a Block,
    pub remote: &'a [RemoteBuffer],
    pub switch: &'a [SwitchSpec],
}

fn resolve_gpu(plan: &PlanJson, g: usize, gpu: &GpuJson) -> R<RankPlan> {
    let n = plan.gpus.len();
    let mut rp = RankPlan {
        input_chunks: gpu.input_chunks,
        output_chunks: gpu.output_chunks,
        scratch_chunks: gpu.scratch_chunks,
        ..Default::default()
    };
    for (c, ch) in gpu.channels.iter().enumerate() {
        let path = format!("gpus[{g}].channels[{c}]");
        match ch.channel_type {
            ChannelType::Memory | ChannelType::Port => {
                let peers = ch.connected_to.as_ref().ok_or_else(|| {
                    format!(
                        "{path}.connected_to: missing for a {} channel",
                        ch.channel_type.name()
                    )
                })?;
                for (i, &p) in peers.iter().enumerate() {
                    if p >= n || p == g {
                        return Err(format!(
                            "{path}.connected_to[{i}]: expected a peer rank below {n} other than {g}, got {p}"
                        ));
                    }
                    if ch.channel_type == ChannelType::Memory {
                        rp.memory_peers.push(p);
                    } else {
                        rp.port_peers.push(p);
                    }
                }
            }
            ChannelType::Switch => {
                let ty = ch
                    .buffer_type
                    .ok_or_else(|| format!("{path}.buffer_type: missing for a switch channel"))?;
                if gpu.chunks(ty) == 0 {
                    return Err(format!(
                        "{path}.buffer_type: rank {g} has no {} chunks to bind ({}_chunks is 0)",
                        ty.name(),
                        long_name(ty)
                    ));
                }
                let groups = ch
                    .rank_groups
                    .as_ref()
                    .ok_or_else(|| format!("{path}.rank_groups: missing for a switch channel"))?;
                for (i, grp) in groups.iter().enumerate() {
                    let gp = format!("{path}.rank_groups[{i}]");
                    if let Some((k, &r)) = grp.ranks.iter().enumerate().find(|(_, &r)| r >= n) {
                        return Err(format!(
                            "{gp}.ranks[{k}]: expected a rank below {n}, got {r}"
                        ));
                    }
                    let mut sorted = grp.ranks.clone();
                    sorted.sort_unstable();
                    sorted.dedup();
                    if sorted.len() != grp.ranks.len() || !grp.ranks.contains(&g) {
                        return Err(format!(
                            "{gp}.ranks: expected distinct ranks including this rank {g}, got {:?}",
                            grp.ranks
                        ));
                    }
                    // `size` (upstream: chunks of the group's share) is not needed: the whole
                    // buffer is bound.
                    rp.switch_channels.push(SwitchSpec {
                        ty,
                        ranks: grp.ranks.clone(),
                    });
                }
            }
            ChannelType::None => {
                return Err(format!(
                    "{path}.channel_type: expected memory, port or switch, got none"
                ))
            }
        }
    }
    for (j, rb) in gpu.remote_buffers.iter().enumerate() {
        let path = format!("gpus[{g}].remote_buffers[{j}]");
        if rb.rank >= n || rb.rank == g {
            return Err(format!(
                "{path}.rank: expected a peer rank below {n} other than {g}, got {}",
                rb.rank
            ));
        }
        if plan.gpus[rb.rank].chunks(rb.ty) == 0 {
            return Err(format!(
                "{path}.type: rank {} has no {} chunks ({}_chunks is 0)",
                rb.rank,
                rb.ty.name(),
                long_name(rb.ty)
            ));
        }
        let mut remote = RemoteBuffer {
            rank: rb.rank,
            ty: rb.ty,
            memory: false,
            port: false,
            tag: j,
        };
        for (i, t) in rb.access_channel_types.iter().enumerate() {
            match t {
                ChannelType::Memory => remote.memory = true,
                ChannelType::Port => remote.port = true,
                other => {
                    return Err(format!(
                        "{path}.access_channel_types[{i}]: expected memory or port, got {}",
                        other.name()
                    ))
                }
            }
        }
        if !remote.memory && !remote.port {
            return Err(format!(
                "{path}.access_channel_types: expected memory and/or port, got none"
            ));
        }
        rp.remote_buffers.push(remote);
    }
    rp.semaphores = gpu.semaphores.iter().map(|s| s.init_value).collect();
    if gpu.threadblocks.len() > MAX_THREADBLOCKS {
        return Err(format!(
            "gpus[{g}].threadblocks: expected at most {MAX_THREADBLOCKS} thread blocks, got {}",
            gpu.threadblocks.len()
        ));
    }
    for (t, tb) in gpu.threadblocks.iter().enumerate() {
        let path = format!("gpus[{g}].threadblocks[{t}]");
        if tb.id != t {
            return Err(format!(
                "{path}.id: expected {t} (thread blocks are listed in id order), got {}",
                tb.id
            ));
        }
        let mut block = resolve_block_tables(&rp, tb, &path)?;
        let ctx = BlockCtx {
            plan,
            rank: g,
            gpu,
            block: &block,
            remote: &rp.remote_buffers,
            switch: &rp.switch_channels,
        };
        let mut ops = Vec::with_capacity(tb.ops.len());
        for (o, op) in tb.ops.iter().enumerate() {
            ops.push(resolve_op(&ctx, op, &format!("{path}.ops[{o}]"), false)?);
        }
        let flat: usize = ops.iter().map(|o| 1 + o.inner.len()).sum();
        if flat > MAX_OPS_PER_BLOCK {
            return Err(format!(
                "{path}.ops: expected at most {MAX_OPS_PER_BLOCK} operations per thread block (pipelines count with their inner operations), got {flat}"
            ));
        }
        block.ops = ops;
        rp.blocks.push(block);
    }
    check_block_sync(g, &rp)?;
    Ok(rp)
}

fn long_name(t: BufferType) -> &'static str {
    match t {
        BufferType::Input => "input",
        BufferType::Output => "output",
        BufferType::Scratch => "scratch",
    }
}

impl GpuJson {
    fn chunks(&self, t: BufferType) -> u32 {
        match t {
            BufferType::Input => self.input_chunks,
            BufferType::Output => self.output_chunks,
            BufferType::Scratch => self.scratch_chunks,
        }
    }
}

fn resolve_block_tables(rp: &RankPlan, tb: &ThreadBlockJson, path: &str) -> R<Block> {
    let mut b = Block::default();
    for (c, ch) in tb.channels.iter().enumerate() {
        let (list, n) = match ch.channel_type {
            ChannelType::Memory => (&mut b.memory_channels, rp.memory_peers.len()),
            ChannelType::Port => (&mut b.port_channels, rp.port_peers.len()),
            ChannelType::Switch => (&mut b.switch_channels, rp.switch_channels.len()),
            ChannelType::None => {
                return Err(format!(
                    "{path}.channels[{c}].channel_type: expected memory, port or switch, got none"
                ))
            }
        };
        for (i, &id) in ch.channel_ids.iter().enumerate() {
            if id >= n {
                return Err(format!(
                    "{path}.channels[{c}].channel_ids[{i}]: expected a {} channel id below {n} (the rank's {} channels), got {id}",
                    ch.channel_type.name(),
                    ch.channel_type.name()
                ));
            }
            list.push(id);
        }
    }
    for (list, ty) in [
        (&b.memory_channels, "memory"),
        (&b.port_channels, "port"),
        (&b.switch_channels, "switch"),
    ] {
        if list.len() > MAX_CHANNELS_PER_BLOCK {
            return Err(format!(
                "{path}.channels: expected at most {MAX_CHANNELS_PER_BLOCK} {ty} channels per thread block, got {}",
                list.len()
            ));
        }
    }
    for (k, r) in tb.remote_buffer_refs.iter().enumerate() {
        let list = match r.access_channel_type {
            ChannelType::Memory => &mut b.memory_buffers,
            ChannelType::Port => &mut b.port_buffers,
            other => {
                return Err(format!(
                    "{path}.remote_buffer_refs[{k}].access_channel_type: expected memory or port, got {}",
                    other.name()
                ))
            }
        };
        for (i, &id) in r.remote_buffer_ids.iter().enumerate() {
            let rb = rp.remote_buffers.get(id).ok_or_else(|| {
                format!(
                    "{path}.remote_buffer_refs[{k}].remote_buffer_ids[{i}]: expected a remote buffer id below {}, got {id}",
                    rp.remote_buffers.len()
                )
            })?;
            let ok = match r.access_channel_type {
                ChannelType::Memory => rb.memory,
                _ => rb.port,
            };
            if !ok {
                return Err(format!(
                    "{path}.remote_buffer_refs[{k}].remote_buffer_ids[{i}]: remote buffer {id} does not list {} in its access_channel_types",
                    r.access_channel_type.name()
                ));
            }
            list.push(id);
        }
    }
    for (list, ty) in [(&b.memory_buffers, "memory"), (&b.port_buffers, "port")] {
        if list.len() > MAX_REMOTE_BUFFERS_PER_BLOCK {
            return Err(format!(
                "{path}.remote_buffer_refs: expected at most {MAX_REMOTE_BUFFERS_PER_BLOCK} remote buffers per thread block through {ty} channels, got {}",
                list.len()
            ));
        }
    }
    Ok(b)
}

pub(super) fn resolve_chunk(
    ctx: &BlockCtx,
    c: &ChunkJson,
    ct: Option<ChannelType>,
    path: &str,
) -> R<Chunk> {
    let given = [
        c.ty.is_some(),
        c.buffer_id.is_some(),
        c.switch_channel_id.is_some(),
    ]
    .iter()
    .filter(|&&x| x)
    .count();
    if given != 1 {
        return Err(format!(
            "{path}: expected exactly one of type, buffer_id or switch_channel_id, got {given}"
        ));
    }
    let (buf, chunks, owner) = if let Some(t) = c.ty {
        (BufRef::Local(t), ctx.gpu.chunks(t), ctx.rank)
    } else if let Some(id) = c.buffer_id {
        let (list, ty) = match ct {
            Some(ChannelType::Memory) => (&ctx.block.memory_buffers, "memory"),
            Some(ChannelType::Port) => (&ctx.block.port_buffers, "port"),
            _ => {
                return Err(format!(
                    "{path}.buffer_id: a remote chunk needs the operation's channel_type to be memory or port, got {}",
                    ct.map_or("nothing", |t| t.name())
                ))
            }
        };
        let rb = list.get(id).map(|&i| ctx.remote[i]).ok_or_else(|| {
            format!(
                "{path}.buffer_id: expected an index below {} (the thread block's remote buffers through {ty} channels), got {id}",
                list.len()
            )
        })?;
        (
            BufRef::Remote {
                slot: id,
                ty: rb.ty,
                rank: rb.rank,
            },
            ctx.plan.gpus[rb.rank].chunks(rb.ty),
            rb.rank,
        )
    } else {
        let id = c.switch_channel_id.unwrap_or_default();
        let spec = ctx
            .block
            .switch_channels
            .get(id)
            .map(|&i| &ctx.switch[i])
            .ok_or_else(|| {
                format!(
                    "{path}.switch_channel_id: expected an index below {} (the thread block's switch channels), got {id}",
                    ctx.block.switch_channels.len()
                )
            })?;
        (
            BufRef::Switch {
                slot: id,
                ty: spec.ty,
            },
            ctx.gpu.chunks(spec.ty),
            ctx.rank,
        )
    };
    if c.size == 0 {
        return Err(format!("{path}.size: expected at least 1 chunk, got 0"));
    }
    let end = u64::from(c.index) + u64::from(c.size);
    if end > u64::from(chunks) {
        let t = buf.buffer_type().map_or("?", long_name);
        let via = if matches!(buf, BufRef::Switch { .. }) {
            " (bound to the switch channel)"
        } else {
            ""
        };
        return Err(format!(
            "{path}: chunks {}..{end} lie outside rank {owner}'s {t} buffer{via} of {chunks} chunks",
            c.index
        ));
    }
    Ok(Chunk {
        buf,
        index: c.index,
        size: c.size,
    })
}
