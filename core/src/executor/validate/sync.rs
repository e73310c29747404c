//! Synchronization that must balance: barriers met by the blocks that name them, device
//! semaphores acquired as often as released (inside one rank), and every wait on a channel
//! matched by one signal of the peer on the paired channel (across ranks).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::executor::error::{OpLocation, PlanError};
use crate::executor::json::{ChannelType, OpName};
use crate::executor::model::{Op, RankPlan};

type R<T> = Result<T, PlanError>;

/// Where counts are taken: top level (None) or inside pipelines of one iteration context
/// (both sides of a pipeline repeat the same number of times).
type Key = Option<(u32, u32)>;

/// Calls `f(op, key, location)` for every operation of every block of `rp`, inner ones
/// included.
fn walk(rank: usize, rp: &RankPlan, mut f: impl FnMut(&Op, Key, OpLocation)) {
    for (t, b) in rp.blocks.iter().enumerate() {
        for (o, op) in b.ops.iter().enumerate() {
            let at = OpLocation {
                rank,
                thread_block: t,
                op: o,
                inner: None,
                name: op.name,
            };
            if let Some(ic) = op.pipeline {
                for (i, inner) in op.inner.iter().enumerate() {
                    f(
                        inner,
                        Some((ic.unit_size, ic.num_chunks)),
                        at.inner(i, inner.name),
                    );
                }
            }
            f(op, None, at);
        }
    }
}

/// Barriers: every block naming a barrier id meets it as often as the others, and
/// num_threadblocks is the number of those blocks. Device semaphores: acquired as often as
/// released, so each execution leaves them at their initial values.
pub(super) fn check_block_sync(rank: usize, rp: &RankPlan) -> R<()> {
    // barrier id -> (key -> block -> count), and the declared sizes with their ops.
    let mut uses: BTreeMap<u32, HashMap<Key, BTreeMap<usize, usize>>> = BTreeMap::new();
    let mut sizes: BTreeMap<u32, Vec<(u32, OpLocation)>> = BTreeMap::new();
    let mut sems: BTreeMap<(usize, Key), (i64, OpLocation)> = BTreeMap::new();
    walk(rank, rp, |op, key, at| {
        if let Some((id, n)) = op.barrier {
            let per_block = uses.entry(id).or_default().entry(key).or_default();
            *per_block.entry(at.thread_block).or_default() += 1;
            sizes.entry(id).or_default().push((n, at));
        }
        let d = match op.name {
            OpName::SemAcquire => -1,
            OpName::SemRelease => 1,
            _ => 0,
        };
        for &s in &op.semaphores {
            sems.entry((s, key)).or_insert((0, at)).0 += d;
        }
    });
    for (id, per_key) in &uses {
        check_barrier(rank, *id, per_key, &sizes[id])?;
    }
    for ((s, _), (bal, at)) in &sems {
        if *bal != 0 {
            return Err(PlanError::Unbalanced {
                rank,
                op: Some(*at),
                message: format!(
                    "device semaphore {s} of rank {rank} is acquired and released unequally ({} more {}): each execution must leave it at its initial value",
                    bal.abs(),
                    if *bal < 0 { "acquires" } else { "releases" }
                ),
            });
        }
    }
    Ok(())
}

/// Barrier `id`: the blocks that use it (`per_key`: per pipeline context, how often each
/// block meets it) against the sizes the ops declare.
fn check_barrier(
    rank: usize,
    id: u32,
    per_key: &HashMap<Key, BTreeMap<usize, usize>>,
    sizes: &[(u32, OpLocation)],
) -> R<()> {
    let blocks: BTreeSet<usize> = per_key.values().flat_map(|m| m.keys().copied()).collect();
    for (n, at) in sizes {
        if *n as usize != blocks.len() {
            return Err(at.err(
                "num_threadblocks",
                format!(
                    "barrier {id} is used by {} thread blocks ({blocks:?}), got num_threadblocks {n}",
                    blocks.len()
                ),
            ));
        }
    }
    for m in per_key.values() {
        let counts: BTreeSet<usize> = blocks
            .iter()
            .map(|b| m.get(b).copied().unwrap_or(0))
            .collect();
        if counts.len() > 1 {
            return Err(PlanError::Unbalanced {
                rank,
                op: None,
                message: format!(
                    "barrier {id}: thread blocks {blocks:?} meet it different numbers of times ({m:?}): they would never all arrive"
                ),
            });
        }
    }
    Ok(())
}

/// Signals and waits of one channel, per pipeline context: (count, first op).
#[derive(Default, Clone)]
struct Tally {
    signals: HashMap<Key, (usize, OpLocation)>,
    waits: HashMap<Key, (usize, OpLocation)>,
}

/// Every wait on a channel is matched by one signal of the peer on the paired channel (the
/// peer's k-th channel of the same type back to this rank pairs with this rank's k-th).
pub(super) fn check_signals(ranks: &[RankPlan]) -> R<()> {
    for ty in [ChannelType::Memory, ChannelType::Port] {
        let tallies: Vec<Vec<Tally>> = ranks
            .iter()
            .enumerate()
            .map(|(r, rp)| tally(r, rp, ty))
            .collect();
        for (r, rp) in ranks.iter().enumerate() {
            for k in 0..rp.peers(ty).len() {
                check_channel(ranks, &tallies, ty, r, k)?;
            }
        }
    }
    Ok(())
}

/// The signals and waits of rank `r` on each of its channels of type `ty`.
fn tally(r: usize, rp: &RankPlan, ty: ChannelType) -> Vec<Tally> {
    let mut t = vec![Tally::default(); rp.peers(ty).len()];
    walk(r, rp, |op, key, at| {
        if op.channel_type != ty {
            return;
        }
        let signal = matches!(
            op.name,
            OpName::Signal | OpName::Rlxsignal | OpName::Pws | OpName::Pwsf
        );
        let wait = matches!(op.name, OpName::Wait | OpName::Rlxwait);
        let list = rp.blocks[at.thread_block].channels(ty);
        for &c in &op.channels {
            let g = list[c];
            let m = if signal {
                &mut t[g].signals
            } else if wait {
                &mut t[g].waits
            } else {
                continue;
            };
            m.entry(key).or_insert((0, at)).0 += 1;
        }
    });
    t
}

/// Rank `r`'s `k`-th channel of type `ty`: its waits against the peer's signals back.
fn check_channel(
    ranks: &[RankPlan],
    tallies: &[Vec<Tally>],
    ty: ChannelType,
    r: usize,
    k: usize,
) -> R<()> {
    let peers = ranks[r].peers(ty);
    let p = peers[k];
    let j = peers[..k].iter().filter(|&&x| x == p).count();
    let back = ranks[p]
        .peers(ty)
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
    let name = ty.name();
    for key in keys {
        let (w, wat) = mine
            .waits
            .get(&key)
            .map_or((0, None), |(n, a)| (*n, Some(*a)));
        let (s, sat) = theirs
            .signals
            .get(&key)
            .map_or((0, None), |(n, a)| (*n, Some(*a)));
        if w != s {
            let at = if w > 0 { wat } else { sat };
            let matching = match back {
                Some(b) => format!("its {name} channel {b} back to rank {r}"),
                None => format!("no {name} channel back to rank {r}"),
            };
            let inside = key.map_or(String::new(), |(u, c)| {
                format!(" (per iteration of pipelines with unit_size {u}, num_chunks {c})")
            });
            return Err(PlanError::Unbalanced {
                rank: at.map_or(r, |a| a.rank),
                op: at,
                message: format!(
                    "unmatched wait/signal: rank {r} waits {w} times on {name} channel {k} (to rank {p}), and rank {p} signals {s} times through {matching}{inside}: every wait needs exactly one signal"
                ),
            });
        }
    }
    if back.is_none() {
        if let Some((key, (n, at))) = mine.signals.iter().next() {
            let inside = key.map_or("", |_| " inside a pipeline");
            return Err(PlanError::Unbalanced {
                rank: r,
                op: Some(*at),
                message: format!(
                    "rank {r} signals {n} times{inside} through {name} channel {k} to rank {p}, which has no {name} channel back to rank {r} to wait on"
                ),
            });
        }
    }
    Ok(())
}
