//! Validation of operations: each operation's shape (which buffers and channels it takes),
//! barriers and device semaphores inside a rank, and waits matched by signals across ranks.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::json::{ChannelType, OpJson, OpName};
use super::plan::{BufRef, Chunk, Op, RankPlan};
use super::validate::{resolve_chunk, BlockCtx, R};
use super::{MAX_BARRIERS, MAX_BUFFERS_PER_OP, MAX_CHANNELS_PER_OP, MAX_SEMAPHORES_PER_OP};

use BufRef::{Local, Remote};

/// Resolves one operation (and a pipeline's inner operations) and checks its shape.
pub(super) fn resolve_op(ctx: &BlockCtx, op: &OpJson, path: &str, in_pipeline: bool) -> R<Op> {
    let name = op.name;
    let ct = op.channel_type;
    let mut channels = Vec::new();
    if let Some(ids) = &op.channel_ids {
        let (n, what) = match ct {
            Some(ChannelType::Memory) => (ctx.block.memory_channels.len(), "memory"),
            Some(ChannelType::Port) => (ctx.block.port_channels.len(), "port"),
            Some(ChannelType::Switch) => (ctx.block.switch_channels.len(), "switch"),
            _ if ids.is_empty() => (0, "none"),
            _ => {
                return Err(format!(
                    "{path}.channel_type: channel_ids are given, so expected memory, port or switch, got {}",
                    ct.map_or("nothing", |t| t.name())
                ))
            }
        };
        if ids.len() > MAX_CHANNELS_PER_OP {
            return Err(format!(
                "{path}.channel_ids: expected at most {MAX_CHANNELS_PER_OP} channels per operation, got {}",
                ids.len()
            ));
        }
        for (i, &id) in ids.iter().enumerate() {
            if id >= n {
                return Err(format!(
                    "{path}.channel_ids[{i}]: expected an index below {n} (the thread block's {what} channels), got {id}"
                ));
            }
            channels.push(id);
        }
    }
    let side = |list: &Option<Vec<super::json::ChunkJson>>, field: &str| -> R<Vec<Chunk>> {
        let list = list.as_deref().unwrap_or_default();
        if list.len() > MAX_BUFFERS_PER_OP {
            return Err(format!(
                "{path}.{field}: expected at most {MAX_BUFFERS_PER_OP} chunks per operation, got {}",
                list.len()
            ));
        }
        list.iter()
            .enumerate()
            .map(|(i, c)| resolve_chunk(ctx, c, ct, &format!("{path}.{field}[{i}]")))
            .collect()
    };
    let src = side(&op.src_buff, "src_buff")?;
    let dst = side(&op.dst_buff, "dst_buff")?;
    let tbg = match op.tbg_info {
        None => (0, 1),
        Some(t) if t.tbg_size >= 1 && t.tb_id < t.tbg_size => (t.tb_id, t.tbg_size),
        Some(t) => {
            return Err(format!(
            "{path}.tbg_info: expected tb_id below tbg_size (>= 1), got tb_id {} of tbg_size {}",
            t.tb_id, t.tbg_size
        ))
        }
    };
    let mut out = Op {
        name,
        channel_type: ct.unwrap_or(ChannelType::None),
        channels,
        src,
        dst,
        reduce: op.reduce_op.unwrap_or_default(),
        barrier: None,
        tbg,
        semaphores: Vec::new(),
        pipeline: None,
        inner: Vec::new(),
    };
    check_shape(ctx, op, &mut out, path)?;
    if name == OpName::Pipeline {
        if in_pipeline {
            return Err(format!(
                "{path}: a pipeline inside a pipeline is not supported"
            ));
        }
        let ic = op
            .iter_context
            .ok_or_else(|| format!("{path}.iter_context: missing for a pipeline"))?;
        if ic.unit_size == 0 || !ic.unit_size.is_multiple_of(4) || ic.num_chunks == 0 {
            return Err(format!(
                "{path}.iter_context: expected unit_size a positive multiple of 4 bytes and num_chunks above 0, got unit_size {} and num_chunks {}",
                ic.unit_size, ic.num_chunks
            ));
        }
        let inner = op
            .ops
            .as_deref()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("{path}.ops: a pipeline needs at least one operation"))?;
        for (i, o) in inner.iter().enumerate() {
            let p = format!("{path}.ops[{i}]");
            if is_packet(o.name) {
                return Err(format!(
                    "{p}.name: {} inside a pipeline: packet operations do not take pipeline offsets",
                    o.name.name()
                ));
            }
            out.inner.push(resolve_op(ctx, o, &p, true)?);
        }
        out.pipeline = Some(ic);
    }
    Ok(out)
}

fn is_packet(n: OpName) -> bool {
    use OpName::*;
    matches!(
        n,
        Ppkt | Rppkt | Respkt | Repkt | Recpkt | Recspkt | Upkt | Cpkt | Gstorepkt
    )
}

fn check_shape(ctx: &BlockCtx, op: &OpJson, o: &mut Op, path: &str) -> R<()> {
    use OpName::*;
    let ct = o.channel_type;
    let name = o.name.name();
    let fail = |what: String| Err(format!("{path}: {name}: {what}"));
    let need_ct = |allowed: &[ChannelType]| -> R<()> {
        if allowed.contains(&ct) {
            return Ok(());
        }
        let list: Vec<&str> = allowed.iter().map(|t| t.name()).collect();
        Err(format!(
            "{path}.channel_type: {name} expects channel_type {}, got {}",
            list.join(" or "),
            ct.name()
        ))
    };
    let is_local = |c: &Chunk| matches!(c.buf, Local(_));
    let is_remote = |c: &Chunk| matches!(c.buf, Remote { .. });
    let is_scratch = |c: &Chunk| c.buf == Local(super::json::BufferType::Scratch);
    let count = |field: &str, got: usize, lo: usize, hi: usize| -> R<()> {
        if got < lo || got > hi {
            let want = if lo == hi {
                format!("{lo}")
            } else if hi == usize::MAX {
                format!("at least {lo}")
            } else {
                format!("{lo}..={hi}")
            };
            return Err(format!(
                "{path}.{field}: {name} expects {want} chunks, got {got}"
            ));
        }
        Ok(())
    };
    let kinds = |field: &str, side: &[Chunk], from: usize, want_local: bool| -> R<()> {
        for (i, c) in side.iter().enumerate().skip(from) {
            let ok = if want_local {
                is_local(c)
            } else {
                is_remote(c)
            };
            if !ok {
                let want = if want_local {
                    "a local chunk (type)"
                } else {
                    "a remote chunk (buffer_id)"
                };
                return Err(format!("{path}.{field}[{i}]: {name} expects {want} here"));
            }
        }
        Ok(())
    };
    let same_sizes = |o: &Op| -> R<()> {
        let first = o.src.first().or(o.dst.first()).map(|c| c.size);
        for (field, side) in [("src_buff", &o.src), ("dst_buff", &o.dst)] {
            for (i, c) in side.iter().enumerate() {
                if Some(c.size) != first {
                    return Err(format!(
                        "{path}.{field}[{i}].size: {name} expects every chunk range of one size ({}), got {}",
                        first.unwrap_or_default(),
                        c.size
                    ));
                }
            }
        }
        Ok(())
    };
    let port_channels_per_dst = |o: &Op| -> R<()> {
        if o.channel_type == ChannelType::Port && o.channels.len() != o.dst.len() {
            return Err(format!(
                "{path}.channel_ids: {name} through port channels expects one channel per destination chunk ({}), got {}",
                o.dst.len(),
                o.channels.len()
            ));
        }
        Ok(())
    };
    let (ns, nd) = (o.src.len(), o.dst.len());
    match o.name {
        Nop => {}
        Barrier => {
            let id = op
                .barrier_id
                .ok_or_else(|| format!("{path}.barrier_id: missing for a barrier"))?;
            let n = op
                .num_threadblocks
                .ok_or_else(|| format!("{path}.num_threadblocks: missing for a barrier"))?;
            if id as usize >= MAX_BARRIERS {
                return Err(format!(
                    "{path}.barrier_id: expected a barrier id below {MAX_BARRIERS}, got {id}"
                ));
            }
            let tbs = ctx.gpu.threadblocks.len() as u32;
            if n == 0 || n > tbs {
                return Err(format!(
                    "{path}.num_threadblocks: expected 1..={tbs} (the rank's thread blocks), got {n}"
                ));
            }
            o.barrier = Some((id, n));
        }
        Signal | Wait | Rlxsignal | Rlxwait | Flush => {
            if o.name == Flush {
                need_ct(&[ChannelType::Port])?;
            } else {
                need_ct(&[ChannelType::Memory, ChannelType::Port])?;
            }
            if o.channels.is_empty() {
                return Err(format!(
                    "{path}.channel_ids: {name} expects at least one channel, got none"
                ));
            }
        }
        Put | Pws | Pwsf | Ppkt => {
            if matches!(o.name, Pws | Pwsf) {
                need_ct(&[ChannelType::Port])?;
            } else {
                need_ct(&[ChannelType::Memory, ChannelType::Port])?;
            }
            count("src_buff", ns, 1, usize::MAX)?;
            count("dst_buff", nd, ns, ns)?;
            kinds("src_buff", &o.src, 0, true)?;
            kinds("dst_buff", &o.dst, 0, false)?;
            for i in 0..ns {
                if o.src[i].size != o.dst[i].size {
                    return fail(format!(
                        "src_buff[{i}] has {} chunks but dst_buff[{i}] has {}",
                        o.src[i].size, o.dst[i].size
                    ));
                }
            }
            port_channels_per_dst(o)?;
        }
        Get => {
            need_ct(&[ChannelType::Memory])?;
            count("src_buff", ns, 1, usize::MAX)?;
            count("dst_buff", nd, ns, ns)?;
            kinds("src_buff", &o.src, 0, false)?;
            kinds("dst_buff", &o.dst, 0, true)?;
            same_pairs(o, path)?;
        }
        Copy | Cpkt => {
            count("src_buff", ns, 1, 1)?;
            count("dst_buff", nd, 1, 1)?;
            kinds("src_buff", &o.src, 0, true)?;
            kinds("dst_buff", &o.dst, 0, true)?;
            same_sizes(o)?;
        }
        Upkt => {
            count("src_buff", ns, 1, 1)?;
            count("dst_buff", nd, 1, 1)?;
            kinds("dst_buff", &o.dst, 0, true)?;
            if !is_scratch(&o.src[0]) {
                return Err(format!(
                    "{path}.src_buff[0]: upkt reads packets from the scratch buffer: expected type s"
                ));
            }
            same_sizes(o)?;
        }
        Re | Res => {
            count("src_buff", ns, 1, usize::MAX)?;
            kinds("src_buff", &o.src, 0, true)?;
            if o.name == Re {
                count("dst_buff", nd, 1, 1)?;
            } else {
                need_ct(&[ChannelType::Memory])?;
                count("dst_buff", nd, 2, usize::MAX)?;
                kinds("dst_buff", &o.dst, 1, false)?;
            }
            kinds("dst_buff", &o.dst[..1], 0, true)?;
            same_sizes(o)?;
        }
        Rre | Rres => {
            need_ct(&[ChannelType::Memory])?;
            count("src_buff", ns, 2, usize::MAX)?;
            kinds("src_buff", &o.src[..1], 0, true)?;
            kinds("src_buff", &o.src, 1, false)?;
            if o.name == Rre {
                count("dst_buff", nd, 1, 1)?;
            } else {
                count("dst_buff", nd, 2, usize::MAX)?;
                kinds("dst_buff", &o.dst, 1, false)?;
            }
            kinds("dst_buff", &o.dst[..1], 0, true)?;
            same_sizes(o)?;
        }
        Rppkt => {
            need_ct(&[ChannelType::Memory, ChannelType::Port])?;
            count("src_buff", ns, 1, 1)?;
            count("dst_buff", nd, 1, usize::MAX)?;
            if !is_scratch(&o.src[0]) {
                return Err(format!(
                    "{path}.src_buff[0]: rppkt forwards packets from the scratch buffer: expected type s"
                ));
            }
            kinds("dst_buff", &o.dst, 0, false)?;
            same_sizes(o)?;
            port_channels_per_dst(o)?;
        }
        Repkt | Respkt | Recpkt | Recspkt => {
            count("src_buff", ns, 1, usize::MAX)?;
            kinds("src_buff", &o.src[..1], 0, true)?;
            for (i, c) in o.src.iter().enumerate().skip(1) {
                if !is_scratch(c) {
                    return Err(format!(
                        "{path}.src_buff[{i}]: {name} reads packets from the scratch buffer: expected type s"
                    ));
                }
            }
            let locals = if matches!(o.name, Recpkt | Recspkt) {
                2
            } else {
                1
            };
            let sends = matches!(o.name, Respkt | Recspkt);
            if sends {
                need_ct(&[ChannelType::Memory])?;
                count("dst_buff", nd, locals + 1, usize::MAX)?;
            } else {
                count("dst_buff", nd, locals, locals)?;
            }
            kinds("dst_buff", &o.dst[..locals], 0, true)?;
            kinds("dst_buff", &o.dst, locals, false)?;
            same_sizes(o)?;
        }
        SemAcquire | SemRelease => {
            let ids = op
                .semaphore_ids
                .as_deref()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("{path}.semaphore_ids: {name} expects at least one id"))?;
            if ids.len() > MAX_SEMAPHORES_PER_OP {
                return Err(format!(
                    "{path}.semaphore_ids: expected at most {MAX_SEMAPHORES_PER_OP} ids, got {}",
                    ids.len()
                ));
            }
            let n = ctx.gpu.semaphores.len();
            if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id >= n) {
                return Err(format!(
                    "{path}.semaphore_ids[{i}]: expected a semaphore id below {n} (the rank's semaphores), got {id}"
                ));
            }
            o.semaphores = ids.to_vec();
        }
        Pipeline => {
            if ns + nd > 0 || !o.channels.is_empty() {
                return fail("a pipeline takes no buffers or channels of its own".into());
            }
        }
        // Switch-channel operations: one chunk each side; glre reads the switch and writes a
        // local chunk, gstore the reverse, glres both through switch channels (NVLS sums).
        Glre | Glres | Gstore | Gstorepkt => {
            need_ct(&[ChannelType::Switch, ChannelType::None])?;
            count("src_buff", ns, 1, 1)?;
            count("dst_buff", nd, 1, 1)?;
            let sw = |c: &Chunk| matches!(c.buf, BufRef::Switch { .. });
            let (src_sw, dst_sw) = match o.name {
                Glre => (true, false),
                Glres => (true, true),
                _ => (false, true),
            };
            for (field, c, want) in [
                ("src_buff", &o.src[0], src_sw),
                ("dst_buff", &o.dst[0], dst_sw),
            ] {
                if sw(c) != want || (!want && !matches!(c.buf, Local(_))) {
                    return Err(format!(
                        "{path}.{field}[0]: {name} expects {}, got {}",
                        if want {
                            "a switch_channel_id chunk"
                        } else {
                            "a local chunk (type i, o or s)"
                        },
                        if sw(c) {
                            "a switch channel chunk"
                        } else if matches!(c.buf, Local(_)) {
                            "a local chunk"
                        } else {
                            "a remote chunk"
                        }
                    ));
                }
            }
            if o.reduce != super::json::PlanReduceOp::Sum {
                return fail("NVLS reduces with sum only: expected reduce_op sum".into());
            }
            same_pairs(o, path)?;
        }
    }
    Ok(())
}

fn same_pairs(o: &Op, path: &str) -> R<()> {
    for (i, (s, d)) in o.src.iter().zip(&o.dst).enumerate() {
        if s.size != d.size {
            return Err(format!(
                "{path}: {}: src_buff[{i}] has {} chunks but dst_buff[{i}] has {}",
                o.name.name(),
                s.size,
                d.size
            ));
        }
    }
    Ok(())
}

/// Where counts are taken: top level (None) or inside pipelines of one iteration context
/// (both sides of a pipeline repeat the same number of times).
type Key = Option<(u32, u32)>;

/// Calls `f(op, key, path)` for every operation of every block of `rp`, inner ones included.
fn walk(rank: usize, rp: &RankPlan, mut f: impl FnMut(usize, &Op, Key, String)) {
    for (t, b) in rp.blocks.iter().enumerate() {
        for (o, op) in b.ops.iter().enumerate() {
            let path = format!("gpus[{rank}].threadblocks[{t}].ops[{o}]");
            if let Some(ic) = op.pipeline {
                for (i, inner) in op.inner.iter().enumerate() {
                    f(
                        t,
                        inner,
                        Some((ic.unit_size, ic.num_chunks)),
                        format!("{path}.ops[{i}]"),
                    );
                }
            }
            f(t, op, None, path);
        }
    }
}

/// Barriers: every block naming a barrier id meets it as often as the others, and
/// num_threadblocks is the number of those blocks. Device semaphores: acquired as often as
/// released, so each execution leaves them at their initial values.
pub(super) fn check_block_sync(rank: usize, rp: &RankPlan) -> R<()> {
    // barrier id -> (key -> block -> count), and the declared sizes with a path.
    let mut uses: BTreeMap<u32, HashMap<Key, BTreeMap<usize, usize>>> = BTreeMap::new();
    let mut sizes: BTreeMap<u32, Vec<(u32, String)>> = BTreeMap::new();
    let mut sems: BTreeMap<(usize, Key), (i64, String)> = BTreeMap::new();
    walk(rank, rp, |t, op, key, path| {
        if let Some((id, n)) = op.barrier {
            *uses
                .entry(id)
                .or_default()
                .entry(key)
                .or_default()
                .entry(t)
                .or_default() += 1;
            sizes.entry(id).or_default().push((n, path.clone()));
        }
        let d = match op.name {
            OpName::SemAcquire => -1,
            OpName::SemRelease => 1,
            _ => 0,
        };
        for &s in &op.semaphores {
            let e = sems.entry((s, key)).or_insert((0, path.clone()));
            e.0 += d;
        }
    });
    for (id, per_key) in &uses {
        let blocks: BTreeSet<usize> = per_key.values().flat_map(|m| m.keys().copied()).collect();
        for (n, path) in &sizes[id] {
            if *n as usize != blocks.len() {
                return Err(format!(
                    "{path}.num_threadblocks: barrier {id} is used by {} thread blocks ({blocks:?}), got num_threadblocks {n}",
                    blocks.len()
                ));
            }
        }
        for m in per_key.values() {
            let counts: BTreeSet<usize> = blocks
                .iter()
                .map(|b| m.get(b).copied().unwrap_or(0))
                .collect();
            if counts.len() > 1 {
                return Err(format!(
                    "gpus[{rank}]: barrier {id}: thread blocks {blocks:?} meet it different numbers of times ({m:?}): they would never all arrive"
                ));
            }
        }
    }
    for ((s, _), (bal, path)) in &sems {
        if *bal != 0 {
            return Err(format!(
                "{path}: device semaphore {s} of rank {rank} is acquired and released unequally ({} more {}): each execution must leave it at its initial value",
                bal.abs(),
                if *bal < 0 { "acquires" } else { "releases" }
            ));
        }
    }
    Ok(())
}

#[derive(Default, Clone)]
struct Tally {
    signals: HashMap<Key, (usize, String)>,
    waits: HashMap<Key, (usize, String)>,
}

/// Every wait on a channel is matched by one signal of the peer on the paired channel (the
/// peer's k-th channel of the same type back to this rank pairs with this rank's k-th).
pub(super) fn check_signals(ranks: &[RankPlan]) -> R<()> {
    for (ty, peers_of) in [
        (
            ChannelType::Memory,
            (|p: &RankPlan| &p.memory_peers) as fn(&RankPlan) -> &Vec<usize>,
        ),
        (ChannelType::Port, |p: &RankPlan| &p.port_peers),
    ] {
        let tallies: Vec<Vec<Tally>> = ranks
            .iter()
            .enumerate()
            .map(|(r, rp)| {
                let mut t = vec![Tally::default(); peers_of(rp).len()];
                walk(r, rp, |b, op, key, path| {
                    if op.channel_type != ty {
                        return;
                    }
                    let signal = matches!(
                        op.name,
                        OpName::Signal | OpName::Rlxsignal | OpName::Pws | OpName::Pwsf
                    );
                    let wait = matches!(op.name, OpName::Wait | OpName::Rlxwait);
                    let list = match ty {
                        ChannelType::Memory => &rp.blocks[b].memory_channels,
                        _ => &rp.blocks[b].port_channels,
                    };
                    for &c in &op.channels {
                        let g = list[c];
                        let m = if signal {
                            &mut t[g].signals
                        } else if wait {
                            &mut t[g].waits
                        } else {
                            continue;
                        };
                        m.entry(key).or_insert((0, path.clone())).0 += 1;
                    }
                });
                t
            })
            .collect();
        for (r, rp) in ranks.iter().enumerate() {
            let peers = peers_of(rp);
            for (k, &p) in peers.iter().enumerate() {
                let j = peers[..k].iter().filter(|&&x| x == p).count();
                let back = peers_of(&ranks[p])
                    .iter()
                    .enumerate()
                    .filter(|(_, &x)| x == r)
                    .nth(j)
                    .map(|(i, _)| i);
                let mine = &tallies[r][k];
                let empty = Tally::default();
                let theirs = back.map_or(&empty, |b| &tallies[p][b]);
                let keys: BTreeSet<Key> = mine
                    .waits
                    .keys()
                    .chain(theirs.signals.keys())
                    .copied()
                    .collect();
                for key in keys {
                    let (w, wpath) = mine.waits.get(&key).cloned().unwrap_or_default();
                    let (s, spath) = theirs.signals.get(&key).cloned().unwrap_or_default();
                    if w != s {
                        let at = if w > 0 { wpath } else { spath };
                        let matching = match back {
                            Some(b) => format!("its {} channel {b} back to rank {r}", ty.name()),
                            None => format!("no {} channel back to rank {r}", ty.name()),
                        };
                        let inside = key.map_or(String::new(), |(u, c)| {
                            format!(
                                " (per iteration of pipelines with unit_size {u}, num_chunks {c})"
                            )
                        });
                        return Err(format!(
                            "{at}: unmatched wait/signal: rank {r} waits {w} times on {} channel {k} (to rank {p}), and rank {p} signals {s} times through {matching}{inside}: every wait needs exactly one signal",
                            ty.name()
                        ));
                    }
                }
                if back.is_none() {
                    if let Some((key, (n, path))) = mine.signals.iter().next() {
                        let inside = key.map_or("", |_| " inside a pipeline");
                        return Err(format!(
                            "{path}: rank {r} signals {n} times{inside} through {} channel {k} to rank {p}, which has no {} channel back to rank {r} to wait on",
                            ty.name(),
                            ty.name()
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}
