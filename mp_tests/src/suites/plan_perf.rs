//! PlanPerfTest.PlansNextToNative (PERF_TEST, issue 31): every shipped plan of this world size
//! (core/plans; NVLS plans only where switch channels run, so never on GPUs here) at 1 KiB,
//! 1 MiB and 16 MiB (host backend: 1 KiB and 64 KiB), each size rounded to the plan's chunking
//! and left out outside its range, first checked (f32, exact values through the executor's own
//! checker), then timed through the executor and through the collectives' native algorithm on
//! the same buffers, in the same placement (in or out of place). Rank 0 prints one line per
//! plan and size: plan time, native time, their ratio (target on the H200: <= 1.3), and a
//! summary line "N checked, N wrong"; the test fails on wrong results only (timings are
//! reported, not asserted: the GPU mode `.ci/gpu-check plan-speed` judges them).

use std::time::Instant;

use mscclpp::collectives::{DataType, ReduceOp};
use mscclpp::executor::{ExecutionPlan, PacketType};
use mscclpp_framework::*;

use super::coll_common::{agreed_seed, buffers, coll_env};
use super::executor::{check_plan, exec_env, in_message_range, SHIPPED};
use super::memory_channel::common::{is_gpu_build, ok};
use crate::world::mp_env;

/// Message sizes (all-reduce: the buffer; all-gather: the gathered buffer).
fn sizes() -> &'static [usize] {
    if is_gpu_build() {
        &[1 << 10, 1 << 20, 16 << 20]
    } else {
        &[1 << 10, 64 << 10]
    }
}

/// Timed calls per measurement (after as many warm-ups as a fifth of them, at least 2).
fn iters(bytes: usize) -> u32 {
    match (is_gpu_build(), bytes) {
        (false, _) => 5,
        (true, b) if b <= 1 << 20 => 200,
        _ => 50,
    }
}

/// Microseconds per call of `f` over `iters` calls after warm-ups, every rank starting
/// together; `sync` waits for the stream.
fn time_us(
    iters: u32,
    f: &dyn Fn() -> Result<(), String>,
    sync: &dyn Fn() -> Result<(), String>,
) -> Result<f64, String> {
    for _ in 0..(iters / 5).max(2) {
        f()?;
    }
    sync()?;
    mp_env().bootstrap.barrier().map_err(|e| e.to_string())?;
    let t = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    sync()?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(iters))
}

PERF_TEST!(PlanPerfTest, PlansNextToNative, |ctx| {
    let (rank, n) = (ctx.rank(), ctx.size());
    let idx = match n {
        2 => 0,
        4 => 1,
        8 => 2,
        _ => SKIP!("plans are shipped for 2, 4 and 8 ranks, this run has {n}"),
    };
    let ex = exec_env();
    let coll = coll_env();
    let seed = agreed_seed();
    let (mut checked, mut wrong) = (0usize, 0usize);
    let mut errors = Vec::new();
    if rank == 0 {
        println!(
            "# PlanPerfTest: {n} ranks ({} backend), f32, per-call us: plan, native, plan/native",
            if is_gpu_build() { "GPU" } else { "host" }
        );
        println!(
            "# {:<24} {:>10} {:>10} {:>10} {:>7}  native algorithm",
            "plan", "bytes", "plan_us", "native_us", "ratio"
        );
    }
    for (family, jsons) in SHIPPED {
        let plan = ok!(
            ExecutionPlan::from_json(jsons[idx], rank),
            "parsing {family}"
        );
        if plan.uses_switch_channels()
            && (is_gpu_build() || mscclpp::nvls_usable(ex.device).is_err())
        {
            continue;
        }
        let gather = plan.collective() == "allgather";
        let unit = plan.input_granularity().max(1) as usize;
        for &total in sizes() {
            // Send bytes per rank, in whole chunks of the plan.
            let send = if gather { total / n } else { total } / unit * unit;
            if send == 0 || !in_message_range(&plan, send) {
                continue;
            }
            let recv = if gather { send * n } else { send };
            // Checked first (exact f32 values, every rank's contribution).
            let bad = check_plan(
                &ex.exec,
                &plan,
                send,
                &[DataType::F32],
                &[PacketType::LL16],
                1,
                seed,
                &mut errors,
            );
            checked += 1;
            wrong += bad;
            // Timed on one pair of buffers, plan and native alike.
            let (a, b) = buffers(ex.device, recv.max(send));
            let (s_ptr, r_ptr) = match (plan.is_in_place(), gather) {
                (true, true) => (b.data() + (rank * send) as u64, b.data()),
                (true, false) => (b.data(), b.data()),
                (false, _) => (a.data(), b.data()),
            };
            let run_plan = || -> Result<(), String> {
                // SAFETY: both buffers hold `recv.max(send)` bytes and outlive the syncs below.
                unsafe {
                    ex.exec.execute(
                        rank,
                        s_ptr,
                        r_ptr,
                        send,
                        recv,
                        DataType::F32,
                        &plan,
                        ex.raw_stream(),
                        PacketType::LL16,
                    )
                }
                .map_err(|e| e.to_string())
            };
            let count = send / 4;
            let run_native = || -> Result<(), String> {
                // SAFETY: as above, on the collectives' stream.
                unsafe {
                    if gather {
                        coll.coll
                            .all_gather(s_ptr, r_ptr, count, DataType::F32, coll.raw_stream())
                    } else {
                        coll.coll.all_reduce(
                            s_ptr,
                            r_ptr,
                            count,
                            DataType::F32,
                            ReduceOp::Sum,
                            coll.raw_stream(),
                        )
                    }
                }
                .map_err(|e| e.to_string())
            };
            let it = iters(recv);
            let p_us = ok!(
                time_us(it, &run_plan, &|| ex.sync()),
                "timing {family} at {recv} bytes"
            );
            let n_us = ok!(
                time_us(it, &run_native, &|| coll.sync()),
                "timing the native algorithm at {recv} bytes"
            );
            let native = coll
                .coll
                .algorithm_for(
                    if gather {
                        mscclpp::collectives::CollectiveKind::AllGather
                    } else {
                        mscclpp::collectives::CollectiveKind::AllReduce
                    },
                    send,
                )
                .unwrap_or("?");
            if rank == 0 {
                println!(
                    "  {:<24} {:>10} {:>10.2} {:>10.2} {:>7.2}  {native}",
                    plan.name(),
                    recv,
                    p_us,
                    n_us,
                    p_us / n_us.max(1e-9)
                );
            }
        }
        ex.exec.reset();
    }
    if rank == 0 {
        println!("# PlanPerfTest: {checked} checked, {wrong} wrong");
    }
    EXPECT_EQ!(wrong, 0, "plan results: {:?}", errors);
});
