//! Progress: the plan cannot deadlock on its own synchronisation. The counts balance
//! (`sync`); this step runs the plan's synchronisation in order: every rank's thread blocks
//! advance op by op, a wait on a channel passes once the peer's paired channel has signalled
//! more often than the channel was waited on, `sem_acquire` once the device semaphore is
//! positive, a barrier once all its blocks stand at it. When nothing can advance and some block
//! has not finished, every schedule of the real kernels is stuck there too (signals only add,
//! so no order of the blocks gets further), and the plan is refused naming a stuck wait,
//! instead of timing out when it runs.
//!
//! What it does not see: packet operations (their flags are data, waited for per chunk) pass
//! at once, and a pipeline runs its operations once (each iteration repeats the same
//! synchronisation, which `sync` balances per iteration). So a plan refused here deadlocks
//! for certain; a plan accepted here may still wait on packets that never come.

use std::collections::HashMap;

use crate::executor::error::{OpLocation, PlanError};
use crate::executor::json::{ChannelType, OpName};
use crate::executor::model::{Op, RankPlan};

/// One operation as the simulation sees it.
struct Step<'a> {
    op: &'a Op,
    at: OpLocation,
}

/// Every block's operations in order, pipelines flattened into one iteration.
fn steps(rank: usize, rp: &RankPlan) -> Vec<Vec<Step<'_>>> {
    rp.blocks
        .iter()
        .enumerate()
        .map(|(t, b)| {
            let mut v = Vec::new();
            for (o, op) in b.ops.iter().enumerate() {
                let at = OpLocation {
                    rank,
                    thread_block: t,
                    op: o,
                    inner: None,
                    name: op.name,
                };
                if op.pipeline.is_some() {
                    for (i, inner) in op.inner.iter().enumerate() {
                        v.push(Step {
                            op: inner,
                            at: at.inner(i, inner.name),
                        });
                    }
                }
                v.push(Step { op, at });
            }
            v
        })
        .collect()
}

fn is_signal(n: OpName) -> bool {
    matches!(
        n,
        OpName::Signal | OpName::Rlxsignal | OpName::Pws | OpName::Pwsf
    )
}

fn is_wait(n: OpName) -> bool {
    matches!(n, OpName::Wait | OpName::Rlxwait)
}

/// A channel of one rank: (rank, type, index into the rank's channels of that type).
type Chan = (usize, ChannelType, usize);

/// The channel of rank `p`'s peer that `p`'s channel `g` of type `ty` signals into (the peer's
/// j-th channel back to `p` pairs with `p`'s j-th channel to the peer), if it has one.
fn paired(ranks: &[RankPlan], p: usize, ty: ChannelType, g: usize) -> Option<Chan> {
    let peers = ranks[p].peers(ty);
    let r = *peers.get(g)?;
    let j = peers[..g].iter().filter(|&&x| x == r).count();
    let k = ranks
        .get(r)?
        .peers(ty)
        .iter()
        .enumerate()
        .filter(|(_, &x)| x == p)
        .nth(j)
        .map(|(i, _)| i)?;
    Some((r, ty, k))
}

/// Refuses a plan whose synchronisation cannot finish (see the file comment).
pub(super) fn check_progress(ranks: &[RankPlan]) -> Result<(), PlanError> {
    let all: Vec<Vec<Vec<Step>>> = ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| steps(r, rp))
        .collect();
    let mut pc: Vec<Vec<usize>> = all.iter().map(|b| vec![0; b.len()]).collect();
    // Signals received minus waits passed, per channel.
    let mut credit: HashMap<Chan, i64> = HashMap::new();
    let mut sems: Vec<Vec<i64>> = ranks
        .iter()
        .map(|rp| rp.semaphores.iter().map(|&v| i64::from(v)).collect())
        .collect();
    loop {
        let mut progressed = false;
        for (r, blocks) in all.iter().enumerate() {
            for (t, ops) in blocks.iter().enumerate() {
                // Run this block as far as it goes (barriers are passed below, together).
                while let Some(s) = ops.get(pc[r][t]) {
                    if s.op.name == OpName::Barrier && s.op.barrier.is_some() {
                        break;
                    }
                    let list = ranks[r].blocks[t].channels(s.op.channel_type);
                    let chans: Vec<Chan> =
                        s.op.channels
                            .iter()
                            .filter_map(|&c| list.get(c).map(|&g| (r, s.op.channel_type, g)))
                            .collect();
                    if is_wait(s.op.name) {
                        let mut need: HashMap<Chan, i64> = HashMap::new();
                        for c in &chans {
                            *need.entry(*c).or_default() += 1;
                        }
                        if need
                            .iter()
                            .any(|(c, n)| credit.get(c).copied().unwrap_or(0) < *n)
                        {
                            break;
                        }
                        for (c, n) in need {
                            *credit.entry(c).or_default() -= n;
                        }
                    } else if is_signal(s.op.name) {
                        for &(_, ty, g) in &chans {
                            if let Some(c) = paired(ranks, r, ty, g) {
                                *credit.entry(c).or_default() += 1;
                            }
                        }
                    }
                    match s.op.name {
                        OpName::SemAcquire => {
                            let sv = &mut sems[r];
                            if s.op
                                .semaphores
                                .iter()
                                .any(|&i| sv.get(i).is_none_or(|&v| v <= 0))
                            {
                                break;
                            }
                            for &i in &s.op.semaphores {
                                sv[i] -= 1;
                            }
                        }
                        OpName::SemRelease => {
                            for &i in &s.op.semaphores {
                                if let Some(v) = sems[r].get_mut(i) {
                                    *v += 1;
                                }
                            }
                        }
                        _ => {}
                    }
                    pc[r][t] += 1;
                    progressed = true;
                }
            }
            // Barriers of this rank: all their blocks standing at them pass together.
            let mut standing: HashMap<u32, (u32, Vec<usize>)> = HashMap::new();
            for (t, ops) in blocks.iter().enumerate() {
                if let Some(s) = ops.get(pc[r][t]) {
                    if let (OpName::Barrier, Some((id, n))) = (s.op.name, s.op.barrier) {
                        let e = standing.entry(id).or_insert((n, Vec::new()));
                        e.1.push(t);
                    }
                }
            }
            for (_, (n, ts)) in standing {
                if ts.len() >= n as usize {
                    for t in ts {
                        pc[r][t] += 1;
                    }
                    progressed = true;
                }
            }
        }
        if !progressed {
            break;
        }
    }
    // The first stuck wait (a barrier only when no wait is stuck: it is a consequence).
    let mut stuck_barrier = None;
    for (r, blocks) in all.iter().enumerate() {
        for (t, ops) in blocks.iter().enumerate() {
            let Some(s) = ops.get(pc[r][t]) else { continue };
            let what = match s.op.name {
                OpName::Barrier => {
                    stuck_barrier.get_or_insert(s.at);
                    continue;
                }
                OpName::SemAcquire => format!("device semaphores {:?}", s.op.semaphores),
                _ => format!(
                    "a signal on {} channels {:?} of thread block {t}",
                    s.op.channel_type.name(),
                    s.op.channels
                ),
            };
            return Err(deadlock(r, s.at, &what));
        }
    }
    match stuck_barrier {
        Some(at) => Err(deadlock(
            at.rank,
            at,
            "the other thread blocks of its barrier",
        )),
        None => Ok(()),
    }
}

fn deadlock(rank: usize, at: OpLocation, what: &str) -> PlanError {
    PlanError::Unbalanced {
        rank,
        op: Some(at),
        message: format!(
            "deadlock: this operation waits for {what} that never comes (every rank's thread \
             blocks run up to their first wait nobody can satisfy any more): the waits and \
             signals balance in number but not in order"
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use crate::executor::error::PlanError;
    use crate::executor::ExecutionPlan;

    const SHIPPED: &str = include_str!("../../../plans/allgather_simple_n2.json");

    fn ops(v: &mut Value, gpu: usize) -> &mut Vec<Value> {
        v["gpus"][gpu]["threadblocks"][0]["ops"]
            .as_array_mut()
            .expect("the shipped plan has ops")
    }

    #[test]
    fn waits_before_the_matching_signals_on_every_rank_are_refused_as_a_deadlock() {
        let mut v: Value = serde_json::from_str(SHIPPED).expect("JSON");
        // Both ranks wait first, then signal: the counts balance, the order never finishes.
        for g in 0..2 {
            ops(&mut v, g).swap(0, 1);
        }
        let e = ExecutionPlan::parse(&v.to_string(), 0).expect_err("a deadlock");
        let PlanError::Unbalanced { op: Some(at), .. } = &e else {
            panic!("expected Unbalanced at an op, got {e:?}");
        };
        assert_eq!((at.rank, at.thread_block, at.op), (0, 0, 0), "{e}");
        let m = e.to_string();
        assert!(
            m.starts_with("gpus[0].threadblocks[0].ops[0]") && m.contains("deadlock"),
            "{m}"
        );
        // One rank in the other order is fine: its signal releases the peer's wait.
        let mut v: Value = serde_json::from_str(SHIPPED).expect("JSON");
        ops(&mut v, 1).swap(0, 1);
        ExecutionPlan::parse(&v.to_string(), 0).expect("one side waiting first still finishes");
    }

    #[test]
    fn every_shipped_plan_makes_progress() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("plans");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("core/plans") {
            let p = e.expect("a directory entry").path();
            if p.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let text = std::fs::read_to_string(&p).expect("readable");
            if let Err(e) = ExecutionPlan::parse(&text, 0) {
                panic!("{}: {e}", p.display());
            }
            n += 1;
        }
        assert!(n > 10, "only {n} plans in {}", dir.display());
    }
}
