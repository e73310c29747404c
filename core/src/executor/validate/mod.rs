//! Turns the JSON of a plan into one [`RankPlan`] per rank and checks everything that does
//! not depend on the message size, for every rank: ids in range, chunk ranges inside their
//! buffers, operation shapes (`shape`: one table row per operation name), limits of the device
//! plan, every wait matched by a signal of the peer, barriers met by the blocks that name them,
//! device semaphores balanced. Errors are [`PlanError`]s naming the JSON path
//! (`gpus[1].threadblocks[3].ops[7].channel_ids[0]`), the operation and what was expected.
//!
//! Steps, each in its own file and each using only the ones before it: `chunk` (chunk
//! references of one thread block), `shape` (the operation table), `op` (one operation),
//! `gpu` (one rank: channels, remote buffers, thread blocks), `sync` (barriers, semaphores,
//! signals); this file runs them and pairs the ranks.

mod chunk;
mod gpu;
mod op;
mod progress;
mod shape;
mod sync;

use super::error::PlanError;
use super::json::{self, ChannelType, PlanJson};
use super::model::{BufferSend, RankPlan};

/// Parses `text`; an error names the JSON path of the offending value.
pub(crate) fn parse(text: &str) -> Result<PlanJson, PlanError> {
    json::parse_located(text).map_err(|(path, message)| PlanError::Json { path, message })
}

/// Resolves and validates every rank of `plan`.
pub(crate) fn resolve(plan: &PlanJson) -> Result<Vec<RankPlan>, PlanError> {
    check_top(plan)?;
    let mut ranks = plan
        .gpus
        .iter()
        .enumerate()
        .map(|(g, gpu)| gpu::resolve_gpu(plan, g, gpu))
        .collect::<Result<Vec<_>, _>>()?;
    add_sends(plan, &mut ranks);
    add_unpaired(&mut ranks);
    sync::check_signals(&ranks)?;
    progress::check_progress(&ranks)?;
    Ok(ranks)
}

/// Every remote buffer some rank names is sent to it by its owner.
fn add_sends(plan: &PlanJson, ranks: &mut [RankPlan]) {
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
}

/// Extra connections (no channel) so that a peer with more channels of a type to a rank than
/// the rank has back can pair all of its own.
fn add_unpaired(ranks: &mut [RankPlan]) {
    let n = ranks.len();
    for r in 0..n {
        for ty in [ChannelType::Memory, ChannelType::Port] {
            let mut extra = Vec::new();
            for p in 0..n {
                let mine = ranks[r].peers(ty).iter().filter(|&&x| x == p).count();
                let theirs = ranks[p].peers(ty).iter().filter(|&&x| x == r).count();
                extra.extend(std::iter::repeat_n(p, theirs.saturating_sub(mine)));
            }
            match ty {
                ChannelType::Memory => ranks[r].unpaired_memory = extra,
                _ => ranks[r].unpaired_port = extra,
            }
        }
    }
}

/// The plan-wide fields and the gpus' ids and chunk counts.
fn check_top(plan: &PlanJson) -> Result<(), PlanError> {
    let bad = |path: &str, message: String| Err(PlanError::field(path, message));
    if plan.gpus.is_empty() {
        return bad("gpus", "expected at least one gpu, got none".into());
    }
    if !(1..=1024).contains(&plan.num_threads_per_block) {
        return bad(
            "num_threads_per_block",
            format!("expected 1..=1024, got {}", plan.num_threads_per_block),
        );
    }
    if plan.buffer_alignment == 0 || !plan.buffer_alignment.is_multiple_of(4) {
        return bad(
            "buffer_alignment",
            format!(
                "expected a positive multiple of 4 bytes, got {}",
                plan.buffer_alignment
            ),
        );
    }
    if plan.min_message_size > plan.max_message_size {
        return bad(
            "min_message_size",
            format!(
                "expected at most max_message_size {}, got {}",
                plan.max_message_size, plan.min_message_size
            ),
        );
    }
    if plan.collective.is_empty() {
        return bad(
            "collective",
            "expected a collective name, got an empty string".into(),
        );
    }
    if plan.nranks_per_node == Some(0) {
        return bad("nranks_per_node", "expected at least 1, got 0".into());
    }
    for (g, gpu) in plan.gpus.iter().enumerate() {
        if gpu.id != g {
            return bad(
                &format!("gpus[{g}].id"),
                format!(
                    "expected {g} (gpus are listed in rank order), got {}",
                    gpu.id
                ),
            );
        }
        if gpu.input_chunks == 0 && gpu.output_chunks == 0 {
            return bad(
                &format!("gpus[{g}]"),
                "input_chunks and output_chunks are both 0: expected at least one above 0".into(),
            );
        }
    }
    Ok(())
}
