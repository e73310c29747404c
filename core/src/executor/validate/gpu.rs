//! One rank of a plan: its channels (memory and port channels to peers, switch channels over
//! rank groups), the remote buffers it reaches, and its thread blocks (their channel and
//! remote-buffer tables, then their operations).

use super::chunk::BlockCtx;
use super::op::resolve_op;
use super::sync::check_block_sync;
use crate::executor::error::PlanError;
use crate::executor::json::{ChannelJson, ChannelType, GpuJson, PlanJson, ThreadBlockJson};
use crate::executor::limits::{
    MAX_CHANNELS_PER_BLOCK, MAX_OPS_PER_BLOCK, MAX_REMOTE_BUFFERS_PER_BLOCK, MAX_THREADBLOCKS,
};
use crate::executor::model::{Block, RankPlan, RemoteBuffer, SwitchSpec};

type R<T> = Result<T, PlanError>;

/// Resolves and checks rank `g` of `plan`.
pub(super) fn resolve_gpu(plan: &PlanJson, g: usize, gpu: &GpuJson) -> R<RankPlan> {
    let mut rp = RankPlan {
        input_chunks: gpu.input_chunks,
        output_chunks: gpu.output_chunks,
        scratch_chunks: gpu.scratch_chunks,
        ..Default::default()
    };
    for (c, ch) in gpu.channels.iter().enumerate() {
        add_channel(
            &mut rp,
            plan,
            g,
            gpu,
            ch,
            &format!("gpus[{g}].channels[{c}]"),
        )?;
    }
    for j in 0..gpu.remote_buffers.len() {
        rp.remote_buffers.push(remote_buffer(plan, g, j)?);
    }
    rp.semaphores = gpu.semaphores.iter().map(|s| s.init_value).collect();
    if gpu.threadblocks.len() > MAX_THREADBLOCKS {
        return Err(PlanError::field(
            format!("gpus[{g}].threadblocks"),
            format!(
                "expected at most {MAX_THREADBLOCKS} thread blocks, got {}",
                gpu.threadblocks.len()
            ),
        ));
    }
    for (t, tb) in gpu.threadblocks.iter().enumerate() {
        let block = thread_block(plan, g, gpu, &rp, t, tb)?;
        rp.blocks.push(block);
    }
    check_block_sync(g, &rp)?;
    Ok(rp)
}

/// The most memory (or port) channels one rank may declare: what its thread blocks can
/// name at most.
const MAX_CHANNELS_PER_TYPE: usize =
    crate::executor::limits::MAX_THREADBLOCKS * crate::executor::limits::MAX_CHANNELS_PER_BLOCK;

/// Adds the channels of `gpus[g].channels[c]` (at `path`) to `rp`.
fn add_channel(
    rp: &mut RankPlan,
    plan: &PlanJson,
    g: usize,
    gpu: &GpuJson,
    ch: &ChannelJson,
    path: &str,
) -> R<()> {
    let n = plan.gpus.len();
    let missing = |field: &str| {
        PlanError::field(
            format!("{path}.{field}"),
            format!("missing for a {} channel", ch.channel_type.name()),
        )
    };
    match ch.channel_type {
        ChannelType::Memory | ChannelType::Port => {
            let peers = ch
                .connected_to
                .as_ref()
                .ok_or_else(|| missing("connected_to"))?;
            let peers_of_type = if ch.channel_type == ChannelType::Memory {
                rp.memory_peers.len()
            } else {
                rp.port_peers.len()
            };
            if peers_of_type + peers.len() > MAX_CHANNELS_PER_TYPE {
                return Err(PlanError::field(
                    format!("{path}.connected_to"),
                    format!(
                        "{} {} channels on rank {g}: expected at most {MAX_CHANNELS_PER_TYPE} \
                         (thread blocks x channels per block: more could never be used)",
                        peers_of_type + peers.len(),
                        ch.channel_type.name()
                    ),
                ));
            }
            for (i, &p) in peers.iter().enumerate() {
                if p >= n || p == g {
                    return Err(PlanError::field(
                        format!("{path}.connected_to[{i}]"),
                        format!("expected a peer rank below {n} other than {g}, got {p}"),
                    ));
                }
                if ch.channel_type == ChannelType::Memory {
                    rp.memory_peers.push(p);
                } else {
                    rp.port_peers.push(p);
                }
            }
            Ok(())
        }
        ChannelType::Switch => {
            let ty = ch.buffer_type.ok_or_else(|| missing("buffer_type"))?;
            if gpu.chunks(ty) == 0 {
                return Err(PlanError::field(
                    format!("{path}.buffer_type"),
                    format!(
                        "rank {g} has no {} chunks to bind ({}_chunks is 0)",
                        ty.name(),
                        ty.long_name()
                    ),
                ));
            }
            let groups = ch
                .rank_groups
                .as_ref()
                .ok_or_else(|| missing("rank_groups"))?;
            for (i, grp) in groups.iter().enumerate() {
                let ranks = rank_group(n, g, &grp.ranks, &format!("{path}.rank_groups[{i}]"))?;
                // `size` (upstream: chunks of the group's share) is not needed: the whole
                // buffer is bound.
                rp.switch_channels.push(SwitchSpec { ty, ranks });
            }
            Ok(())
        }
        ChannelType::None => Err(PlanError::field(
            format!("{path}.channel_type"),
            "expected memory, port or switch, got none",
        )),
    }
}

/// The ranks of a switch channel's group at `path` (of rank `g`, in a plan of `n` ranks):
/// distinct, below `n`, `g` among them.
fn rank_group(n: usize, g: usize, ranks: &[usize], path: &str) -> R<Vec<usize>> {
    if let Some((k, &r)) = ranks.iter().enumerate().find(|(_, &r)| r >= n) {
        return Err(PlanError::field(
            format!("{path}.ranks[{k}]"),
            format!("expected a rank below {n}, got {r}"),
        ));
    }
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != ranks.len() || !ranks.contains(&g) {
        return Err(PlanError::field(
            format!("{path}.ranks"),
            format!("expected distinct ranks including this rank {g}, got {ranks:?}"),
        ));
    }
    Ok(ranks.to_vec())
}

/// `gpus[g].remote_buffers[j]`.
fn remote_buffer(plan: &PlanJson, g: usize, j: usize) -> R<RemoteBuffer> {
    let n = plan.gpus.len();
    let rb = &plan.gpus[g].remote_buffers[j];
    let path = format!("gpus[{g}].remote_buffers[{j}]");
    if rb.rank >= n || rb.rank == g {
        return Err(PlanError::field(
            format!("{path}.rank"),
            format!(
                "expected a peer rank below {n} other than {g}, got {}",
                rb.rank
            ),
        ));
    }
    if plan.gpus[rb.rank].chunks(rb.ty) == 0 {
        return Err(PlanError::field(
            format!("{path}.type"),
            format!(
                "rank {} has no {} chunks ({}_chunks is 0)",
                rb.rank,
                rb.ty.name(),
                rb.ty.long_name()
            ),
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
                return Err(PlanError::field(
                    format!("{path}.access_channel_types[{i}]"),
                    format!("expected memory or port, got {}", other.name()),
                ))
            }
        }
    }
    if !remote.memory && !remote.port {
        return Err(PlanError::field(
            format!("{path}.access_channel_types"),
            "expected memory and/or port, got none",
        ));
    }
    Ok(remote)
}

/// Thread block `t` of rank `g`: its tables, then its operations.
fn thread_block(
    plan: &PlanJson,
    g: usize,
    gpu: &GpuJson,
    rp: &RankPlan,
    t: usize,
    tb: &ThreadBlockJson,
) -> R<Block> {
    let path = format!("gpus[{g}].threadblocks[{t}]");
    if tb.id != t {
        return Err(PlanError::field(
            format!("{path}.id"),
            format!(
                "expected {t} (thread blocks are listed in id order), got {}",
                tb.id
            ),
        ));
    }
    let mut block = Block::default();
    block_channels(&mut block, rp, tb, &path)?;
    block_remote_buffers(&mut block, rp, tb, &path)?;
    let ctx = BlockCtx {
        plan,
        rank: g,
        thread_block: t,
        gpu,
        block: &block,
        remote: &rp.remote_buffers,
        switch: &rp.switch_channels,
    };
    let ops = tb
        .ops
        .iter()
        .enumerate()
        .map(|(o, op)| resolve_op(&ctx, op, ctx.op_at(o, op.name)))
        .collect::<R<Vec<_>>>()?;
    let flat: usize = ops.iter().map(|o| 1 + o.inner.len()).sum();
    if flat > MAX_OPS_PER_BLOCK {
        return Err(PlanError::field(
            format!("{path}.ops"),
            format!(
                "expected at most {MAX_OPS_PER_BLOCK} operations per thread block (pipelines count with their inner operations), got {flat}"
            ),
        ));
    }
    block.ops = ops;
    Ok(block)
}

/// `threadblocks[t].channels`: indexes into the rank's channels of each type.
fn block_channels(b: &mut Block, rp: &RankPlan, tb: &ThreadBlockJson, path: &str) -> R<()> {
    for (c, ch) in tb.channels.iter().enumerate() {
        let (list, n) = match ch.channel_type {
            ChannelType::Memory => (&mut b.memory_channels, rp.memory_peers.len()),
            ChannelType::Port => (&mut b.port_channels, rp.port_peers.len()),
            ChannelType::Switch => (&mut b.switch_channels, rp.switch_channels.len()),
            ChannelType::None => {
                return Err(PlanError::field(
                    format!("{path}.channels[{c}].channel_type"),
                    "expected memory, port or switch, got none",
                ))
            }
        };
        let ty = ch.channel_type.name();
        for (i, &id) in ch.channel_ids.iter().enumerate() {
            if id >= n {
                return Err(PlanError::field(
                    format!("{path}.channels[{c}].channel_ids[{i}]"),
                    format!(
                        "expected a {ty} channel id below {n} (the rank's {ty} channels), got {id}"
                    ),
                ));
            }
            list.push(id);
        }
    }
    for ty in [ChannelType::Memory, ChannelType::Port, ChannelType::Switch] {
        let got = b.channels(ty).len();
        if got > MAX_CHANNELS_PER_BLOCK {
            return Err(PlanError::field(
                format!("{path}.channels"),
                format!(
                    "expected at most {MAX_CHANNELS_PER_BLOCK} {} channels per thread block, got {got}",
                    ty.name()
                ),
            ));
        }
    }
    Ok(())
}

/// `threadblocks[t].remote_buffer_refs`: indexes into the rank's remote buffers, per channel
/// type they are reached through.
fn block_remote_buffers(b: &mut Block, rp: &RankPlan, tb: &ThreadBlockJson, path: &str) -> R<()> {
    for (k, r) in tb.remote_buffer_refs.iter().enumerate() {
        let here = format!("{path}.remote_buffer_refs[{k}]");
        let ty = r.access_channel_type;
        let list = match ty {
            ChannelType::Memory => &mut b.memory_buffers,
            ChannelType::Port => &mut b.port_buffers,
            other => {
                return Err(PlanError::field(
                    format!("{here}.access_channel_type"),
                    format!("expected memory or port, got {}", other.name()),
                ))
            }
        };
        for (i, &id) in r.remote_buffer_ids.iter().enumerate() {
            let at = format!("{here}.remote_buffer_ids[{i}]");
            let rb = rp.remote_buffers.get(id).ok_or_else(|| {
                PlanError::field(
                    &at,
                    format!(
                        "expected a remote buffer id below {}, got {id}",
                        rp.remote_buffers.len()
                    ),
                )
            })?;
            let reachable = if ty == ChannelType::Memory {
                rb.memory
            } else {
                rb.port
            };
            if !reachable {
                return Err(PlanError::field(
                    at,
                    format!(
                        "remote buffer {id} does not list {} in its access_channel_types",
                        ty.name()
                    ),
                ));
            }
            list.push(id);
        }
    }
    for ty in [ChannelType::Memory, ChannelType::Port] {
        let got = b.remote_buffers(ty).map_or(0, <[usize]>::len);
        if got > MAX_REMOTE_BUFFERS_PER_BLOCK {
            return Err(PlanError::field(
                format!("{path}.remote_buffer_refs"),
                format!(
                    "expected at most {MAX_REMOTE_BUFFERS_PER_BLOCK} remote buffers per thread block through {} channels, got {got}",
                    ty.name()
                ),
            ));
        }
    }
    Ok(())
}
