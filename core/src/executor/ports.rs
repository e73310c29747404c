//! Port channels between ranks of one node run as memory channels (`MSCCLPP_EXECUTOR_PORT_CHANNELS`,
//! `auto` by default): a plan whose every rank is on one node gets, at its first execution, a
//! form in which each port channel is a memory channel over the same connection, so its puts
//! are copies by the block's threads into the peer's mapped buffer and its signals and waits
//! are device semaphores, instead of requests the host proxy serves with the driver's copies
//! (about 25 us a round trip with two ranks sharing an H200, 120 with four: docs/perf.md).
//!
//! Operation by operation (each keeps what the plan could rely on):
//! - `put` through a port channel: a memory-channel `put`, with a `nop` before it unless the
//!   op before is one (a port op runs on one thread, so a plan may `wait` and `put` on the same
//!   channel without a `nop`; all threads copy now);
//! - `pws` / `pwsf`: `put`, `nop`, `signal` (the proxy signals after the copy landed; the `nop`
//!   orders every thread's copy before the signal's release);
//! - `signal` / `rlxsignal`: `signal` (release: the proxy's relaxed signal still came after
//!   the copies it served before it); `wait` / `rlxwait`: `wait` (acquire);
//! - `flush`: a `nop` (the copies are done when the block's threads pass it; what comes after
//!   may touch the source).
//!
//! Plans it leaves on the proxy (every rank decides alike: from the whole plan): packet
//! operations through port channels (the proxy copies packets already made; a memory channel
//! makes them), an operation naming one channel twice (two threads would signal one semaphore),
//! and blocks that would pass the executor's limits.

use super::json::{ChannelType, OpName};
use super::limits::{MAX_CHANNELS_PER_BLOCK, MAX_OPS_PER_BLOCK, MAX_REMOTE_BUFFERS_PER_BLOCK};
use super::model::{BufRef, Chunk, Op, RankPlan};

/// Every rank of `ranks` with its port channels as memory channels, or why the plan keeps
/// them (also when it has none).
pub(crate) fn over_memory(ranks: &[RankPlan]) -> Result<Vec<RankPlan>, String> {
    if !ranks.iter().any(|r| r.uses_port()) {
        return Err("the plan has no port channels".into());
    }
    ranks
        .iter()
        .enumerate()
        .map(|(g, r)| rank_over_memory(r).map_err(|why| format!("rank {g}: {why}")))
        .collect()
}

fn rank_over_memory(rp: &RankPlan) -> Result<RankPlan, String> {
    let mut out = rp.clone();
    let nm = rp.memory_peers.len();
    out.memory_peers.extend_from_slice(&rp.port_peers);
    out.memory_from_port += rp.port_peers.len();
    out.port_peers.clear();
    out.unpaired_memory.extend_from_slice(&rp.unpaired_port);
    out.unpaired_memory_from_port += rp.unpaired_port.len();
    out.unpaired_port.clear();
    for rb in &mut out.remote_buffers {
        if rb.port {
            rb.memory = true;
            rb.port = false;
        }
    }
    for s in &mut out.sends {
        s.port = false;
    }
    for (t, b) in out.blocks.iter_mut().enumerate() {
        let (bm, bb) = (b.memory_channels.len(), b.memory_buffers.len());
        let ports = std::mem::take(&mut b.port_channels);
        b.memory_channels.extend(ports.iter().map(|&c| nm + c));
        let bufs = std::mem::take(&mut b.port_buffers);
        b.memory_buffers.extend(bufs);
        if b.memory_channels.len() > MAX_CHANNELS_PER_BLOCK {
            return Err(format!(
                "thread block {t} would name {} memory channels (at most {MAX_CHANNELS_PER_BLOCK})",
                b.memory_channels.len()
            ));
        }
        if b.memory_buffers.len() > MAX_REMOTE_BUFFERS_PER_BLOCK {
            return Err(format!(
                "thread block {t} would name {} remote buffers through memory channels (at most \
                 {MAX_REMOTE_BUFFERS_PER_BLOCK})",
                b.memory_buffers.len()
            ));
        }
        let ops = std::mem::take(&mut b.ops);
        b.ops = rewrite_ops(&ops, bm, bb).map_err(|why| format!("thread block {t}: {why}"))?;
        let count: usize = b.ops.iter().map(|o| 1 + o.inner.len()).sum();
        if count > MAX_OPS_PER_BLOCK {
            return Err(format!(
                "thread block {t} would have {count} operations (at most {MAX_OPS_PER_BLOCK})"
            ));
        }
    }
    Ok(out)
}

/// A `nop`.
fn nop() -> Op {
    Op {
        name: OpName::Nop,
        channel_type: ChannelType::None,
        channels: Vec::new(),
        src: Vec::new(),
        dst: Vec::new(),
        reduce: Default::default(),
        barrier: None,
        tbg: (0, 1),
        semaphores: Vec::new(),
        pipeline: None,
        inner: Vec::new(),
    }
}

fn is_nop_or_barrier(o: Option<&Op>) -> bool {
    o.is_some_and(|o| matches!(o.name, OpName::Nop | OpName::Barrier))
}

/// `ops` of a block with `bm` memory channels and `bb` memory-channel remote buffers before
/// its port channels and buffers were appended to those tables.
fn rewrite_ops(ops: &[Op], bm: usize, bb: usize) -> Result<Vec<Op>, String> {
    let mut out: Vec<Op> = Vec::with_capacity(ops.len() + 4);
    for o in ops {
        if o.name == OpName::Pipeline {
            let mut p = o.clone();
            p.inner = rewrite_ops(&o.inner, bm, bb)?;
            out.push(p);
            continue;
        }
        if o.channel_type != ChannelType::Port {
            out.push(o.clone());
            continue;
        }
        let mut seen = o.channels.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != o.channels.len() {
            return Err(format!("`{}` names a port channel twice", o.name.name()));
        }
        let mut m = o.clone();
        m.channel_type = ChannelType::Memory;
        m.channels = o.channels.iter().map(|&c| bm + c).collect();
        let slot = |c: &Chunk| match c.buf {
            BufRef::Remote { slot, ty, rank } => Chunk {
                buf: BufRef::Remote {
                    slot: bb + slot,
                    ty,
                    rank,
                },
                ..*c
            },
            _ => *c,
        };
        m.src = o.src.iter().map(slot).collect();
        m.dst = o.dst.iter().map(slot).collect();
        match o.name {
            OpName::Put | OpName::Pws | OpName::Pwsf => {
                if !is_nop_or_barrier(out.last()) {
                    out.push(nop());
                }
                let signal = matches!(o.name, OpName::Pws | OpName::Pwsf).then(|| Op {
                    name: OpName::Signal,
                    src: Vec::new(),
                    dst: Vec::new(),
                    ..m.clone()
                });
                m.name = OpName::Put;
                out.push(m);
                if let Some(s) = signal {
                    out.push(nop());
                    out.push(s);
                }
            }
            OpName::Signal | OpName::Rlxsignal => {
                m.name = OpName::Signal;
                out.push(m);
            }
            OpName::Wait | OpName::Rlxwait => {
                m.name = OpName::Wait;
                out.push(m);
            }
            OpName::Flush => out.push(nop()),
            other => {
                return Err(format!(
                    "`{}` through a port channel (packets the proxy copies as they are)",
                    other.name()
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::model::ConnKind;
    use crate::executor::validate;

    fn ranks(json: &str) -> Vec<RankPlan> {
        validate::resolve(&validate::parse(json).expect("parses")).expect("resolves")
    }

    fn all_ops(ops: &[Op]) -> Vec<&Op> {
        ops.iter()
            .flat_map(|o| std::iter::once(o).chain(all_ops(&o.inner)))
            .collect()
    }

    #[test]
    fn port_plan_becomes_memory_channels_in_connection_order() {
        for json in [
            include_str!("../../plans/allgather_port_n2.json"),
            include_str!("../../plans/allgather_port_n4.json"),
        ] {
            let before = ranks(json);
            let after = over_memory(&before).expect("one node: port channels as memory");
            for (b, a) in before.iter().zip(&after) {
                assert!(!a.uses_port());
                assert_eq!(a.memory_from_port, b.port_peers.len());
                assert_eq!(a.unpaired_memory_from_port, b.unpaired_port.len());
                // The old memory channels first, then the port channels in their order.
                let peers: Vec<usize> = b
                    .memory_peers
                    .iter()
                    .chain(&b.port_peers)
                    .copied()
                    .collect();
                assert_eq!(a.memory_peers, peers);
                assert!(a.remote_buffers.iter().all(|r| !r.port));
                for (bb, ab) in b.blocks.iter().zip(&a.blocks) {
                    assert!(ab.port_channels.is_empty() && ab.port_buffers.is_empty());
                    let ops = all_ops(&ab.ops);
                    assert!(ops.iter().all(|o| o.channel_type != ChannelType::Port));
                    assert!(ops
                        .iter()
                        .all(|o| !matches!(o.name, OpName::Pws | OpName::Pwsf | OpName::Flush)));
                    // Every put is preceded by a nop (or barrier); every put-with-signal of
                    // the plan became put, nop, signal on the same channels.
                    for (i, o) in ab.ops.iter().enumerate() {
                        if o.name == OpName::Put {
                            assert!(i > 0 && is_nop_or_barrier(ab.ops.get(i - 1)));
                        }
                    }
                    let signals = |ops: &[&Op]| {
                        ops.iter()
                            .filter(|o| {
                                matches!(o.name, OpName::Signal | OpName::Pws | OpName::Pwsf)
                            })
                            .count()
                    };
                    assert_eq!(signals(&ops), signals(&all_ops(&bb.ops)));
                    for (i, o) in ab.ops.iter().enumerate() {
                        if o.name == OpName::Put
                            && ab.ops.get(i + 2).is_some_and(|s| s.name == OpName::Signal)
                        {
                            assert_eq!(ab.ops[i + 1].name, OpName::Nop);
                            assert_eq!(ab.ops[i + 2].channels, o.channels);
                        }
                    }
                }
            }
        }
    }

    /// What each connection of `rp` is, per peer in the order they are made: a memory channel
    /// (its index), a port channel (its index) or an unpaired connection (port or not).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Conn {
        Memory(usize),
        Port(usize),
        Unpaired(bool),
    }

    fn conns(rp: &RankPlan, peer: usize) -> Vec<Conn> {
        // Channel indexes count on from one group of a kind to the next; an unpaired memory
        // connection past the first `unpaired_memory.len() - unpaired_memory_from_port` was a
        // port one.
        let (mut memory, mut port, mut spare) = (0, 0, 0);
        let spare_from_port = rp.unpaired_memory.len() - rp.unpaired_memory_from_port;
        let mut out = Vec::new();
        for (peers, kind) in rp.connection_groups() {
            for &p in peers {
                let c = match kind {
                    ConnKind::MemoryChannel => {
                        memory += 1;
                        Conn::Memory(memory - 1)
                    }
                    ConnKind::PortChannel => {
                        port += 1;
                        Conn::Port(port - 1)
                    }
                    ConnKind::UnpairedMemory => {
                        spare += 1;
                        Conn::Unpaired(spare > spare_from_port)
                    }
                    ConnKind::UnpairedPort => Conn::Unpaired(true),
                };
                if p == peer {
                    out.push(c);
                }
            }
        }
        out
    }

    #[test]
    fn connections_pair_as_before_with_unpaired_ones_of_both_types() {
        // Rank 0: two memory channels and one port channel to rank 1; rank 1: one memory
        // channel and two port channels back, so each has an unpaired connection of the type
        // it has fewer of (as validation adds them).
        let mut r0 = RankPlan {
            memory_peers: vec![1, 1],
            port_peers: vec![1],
            unpaired_port: vec![1],
            ..Default::default()
        };
        let mut r1 = RankPlan {
            memory_peers: vec![0],
            port_peers: vec![0, 0],
            unpaired_memory: vec![0],
            ..Default::default()
        };
        r0.blocks.push(Default::default());
        r1.blocks.push(Default::default());
        let before = [r0, r1];
        let after = over_memory(&before).expect("one node: port channels as memory");
        for (r, peer) in [(0, 1), (1, 0)] {
            let nm = before[r].memory_peers.len();
            // The k-th connection to the peer is the same one as before, a port channel j
            // now memory channel nm + j, an unpaired port connection an unpaired one after
            // the unpaired memory ones.
            let mapped: Vec<Conn> = conns(&before[r], peer)
                .into_iter()
                .map(|c| match c {
                    Conn::Port(j) => Conn::Memory(nm + j),
                    other => other,
                })
                .collect();
            assert_eq!(conns(&after[r], peer), mapped, "rank {r}");
            assert!(!after[r].uses_port());
        }
        // Both ends of each pair agree on what the k-th connection was made for.
        let kinds = |rp: &RankPlan, peer| -> Vec<bool> {
            conns(rp, peer)
                .into_iter()
                .map(|c| match c {
                    Conn::Memory(i) => i >= rp.memory_peers.len() - rp.memory_from_port,
                    Conn::Port(_) => true,
                    Conn::Unpaired(port) => port,
                })
                .collect()
        };
        assert_eq!(kinds(&after[0], 1), kinds(&after[1], 0));
        assert_eq!(kinds(&after[0], 1), vec![false, false, true, true]);
    }

    #[test]
    fn plans_without_ports_or_with_port_packets_keep_them() {
        let why = over_memory(&ranks(include_str!("../../plans/allreduce_ll_n2.json")))
            .expect_err("no port channels");
        assert!(why.contains("no port channels"), "{why}");
        let mut op = nop();
        op.name = OpName::Ppkt;
        op.channel_type = ChannelType::Port;
        op.channels = vec![0];
        let why = rewrite_ops(&[op.clone()], 0, 0).expect_err("port packets stay on the proxy");
        assert!(why.contains("`ppkt` through a port channel"), "{why}");
        op.name = OpName::Signal;
        op.channels = vec![1, 1];
        let why = rewrite_ops(&[op], 0, 0).expect_err("a channel named twice");
        assert!(why.contains("names a port channel twice"), "{why}");
    }
}
