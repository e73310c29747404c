//! ExecutorJitTest: plans compiled at load time (`MSCCLPP_EXECUTOR_JIT`,
//! core/src/executor/run/jit.rs). Needs no GPU. A plan's part for a rank becomes a kernel
//! source at 1 unit, 64 KiB and 4 MiB (those in its range) for f16, launches of up to 256
//! threads and (ShippedPlansCompile, rank 0's part) of 1024 (refused with a reason where
//! `MSCCLPP_EXECUTOR_JIT_THREADS` keeps them on the interpreter) and, for LL plans, both
//! packet formats; the sizes must share one source (one structure per plan); on a CUDA build
//! with libnvrtc each distinct source compiles for sm_90. The work is split over the ranks (unit
//! k on rank k % world size), so each source compiles once. Without a run-time compiler (host or
//! ROCm build, or no libnvrtc) the compile half skips, saying why.
//!
//! - ShippedPlansCompile: every shipped plan at 2 and 4 ranks, first and last rank's part (NVLS
//!   plans left out: the GPU executor refuses switch operations).
//! - UpstreamPlansCompile: every plan of the folder `MSCCLPP_EXECUTOR_UPSTREAM_PLANS` (upstream
//!   MSCCL++'s, as ExecutorTest.UpstreamPlans), every rank's part; skipped when unset.

use std::collections::BTreeMap;

use mscclpp::collectives::DataType;
use mscclpp::executor::{ExecutionPlan, Executor, PacketType};
use mscclpp_framework::*;

use super::executor::{in_message_range, upstream_plan_files, SHIPPED};
use super::memory_channel::common::ok;

/// Sizes per rank a plan is turned into a source at (those in its range).
fn source_sizes(plan: &ExecutionPlan) -> Vec<usize> {
    let unit = plan.input_granularity() as usize;
    let up = |x: usize| x.div_ceil(unit) * unit;
    let mut v = vec![unit, up(1 << 16), up(4 << 20)];
    v.retain(|&b| in_message_range(plan, b));
    v.dedup();
    v
}

/// The receive size of a call sending `bytes` per rank with `plan` (an all-gather's gathers
/// every rank's).
fn recv_of(plan: &ExecutionPlan, bytes: usize) -> usize {
    if plan.collective() == "allgather" {
        bytes * plan.world_size()
    } else {
        bytes
    }
}

/// One unit of work: plan `name` (JSON `json`), rank `rank`'s part, launches of up to
/// `threads` threads.
struct Unit<'a> {
    name: &'a str,
    json: &'a str,
    rank: usize,
    threads: u32,
}

/// The sources of this rank's share of `units` (see the module doc), by a name per (plan, rank,
/// packet, width); fails the test where a source cannot be made or the sizes disagree.
fn sources_of(ctx: &TestContext, units: &[Unit]) -> BTreeMap<String, String> {
    let mut sources = BTreeMap::new();
    for (k, u) in units.iter().enumerate() {
        if k % ctx.size() != ctx.rank() {
            continue;
        }
        let (name, r, threads) = (u.name, u.rank, u.threads);
        let plan = ok!(
            ExecutionPlan::from_json(u.json, r),
            "parsing {name} rank {r}"
        );
        let packets: &[PacketType] = if plan.is_packet() {
            &[PacketType::LL16, PacketType::LL8]
        } else {
            &[PacketType::LL16]
        };
        let sizes = source_sizes(&plan);
        EXPECT_TRUE!(!sizes.is_empty(), "{name}: no size in its range");
        let dtype = DataType::F16;
        for &packet in packets {
            let mut seen: Vec<String> = Vec::new();
            for &bytes in &sizes {
                let recv = recv_of(&plan, bytes);
                let src = ok!(
                    Executor::kernel_source(&plan, bytes, recv, dtype, packet, threads),
                    "{name} rank {r}: kernel source of {bytes} bytes, {dtype:?}, {packet:?}, {threads} threads"
                );
                EXPECT_TRUE!(
                    src.contains("extern \"C\" __global__") && src.contains("step<"),
                    "{name} rank {r}: not a plan kernel:\n{src}"
                );
                // Built for the launch's width: the 256-thread build up to 256, else 1024.
                let bound = if threads <= 256 { 256 } else { 1024 };
                EXPECT_TRUE!(
                    src.contains(&format!("__launch_bounds__({bound})")),
                    "{name} rank {r}: {threads} threads: not a {bound}-thread kernel:\n{src}"
                );
                if !seen.contains(&src) {
                    seen.push(src);
                }
            }
            // The offsets and sizes are launch values: one kernel for every size.
            EXPECT_EQ!(
                seen.len(),
                1,
                "{name} rank {r} {packet:?} {threads} threads: the sizes {sizes:?} gave {} structures",
                seen.len()
            );
            for (i, s) in seen.into_iter().enumerate() {
                sources.insert(format!("{name} rank {r} {packet:?} {threads}t #{i}"), s);
            }
        }
    }
    sources
}

/// Compiles each distinct source of `sources` for sm_90; skips (after the sources were checked)
/// where this build has no run-time compiler.
fn compile_all(ctx: &TestContext, sources: BTreeMap<String, String>) {
    // Distinct sources only (two plans of one structure are one kernel).
    let mut distinct: BTreeMap<String, String> = BTreeMap::new();
    for (name, src) in sources {
        distinct.entry(src).or_insert(name);
    }
    let mut compiled = 0usize;
    let t0 = std::time::Instant::now();
    for (src, name) in &distinct {
        match Executor::compile_kernel_source(src, (9, 0)) {
            Ok(code) => {
                EXPECT_TRUE!(code.starts_with(b"\x7fELF"), "{name}: not a cubin");
                compiled += 1;
            }
            Err(e) => {
                let msg = e.to_string();
                if compiled == 0
                    && (msg.contains("no run-time compiler") || msg.contains("libnvrtc"))
                {
                    SKIP!(
                        "{} plan sources made; compiling them needs a CUDA build with libnvrtc: {}",
                        distinct.len(),
                        msg
                    );
                }
                EXPECT_TRUE!(false, "{name}: does not compile: {msg}");
            }
        }
    }
    eprintln!(
        "rank {}: {compiled} plan kernels compiled for sm_90 in {:.1} s",
        ctx.rank(),
        t0.elapsed().as_secs_f64()
    );
}

TEST!(ExecutorJitTest, ShippedPlansCompile, |ctx| {
    let mut names = Vec::new();
    for (family, jsons) in SHIPPED {
        if family.contains("nvls") {
            continue;
        }
        for json in &jsons[..2] {
            let n = ok!(ExecutionPlan::from_json(json, 0), "parsing {family}").world_size();
            names.push((format!("{family}_n{n}"), *json, n));
        }
    }
    let mut units = Vec::new();
    let wide_compiled = mscclpp::env::env().executor_jit_threads() >= 1024;
    for (name, json, n) in &names {
        // Launches of up to 256 threads per block (the 256-thread build, gpu::jit_bound).
        for rank in [0, n - 1] {
            units.push(Unit {
                name,
                json,
                rank,
                threads: 256,
            });
        }
        // Wider launches (the 1024-thread build: no prefetch in reductions) are compiled
        // (sources_of checks their bound) unless MSCCLPP_EXECUTOR_JIT_THREADS keeps them on
        // the interpreter: then no source, an error saying so.
        if wide_compiled {
            units.push(Unit {
                name,
                json,
                rank: 0,
                threads: 1024,
            });
            continue;
        }
        let plan = ok!(ExecutionPlan::from_json(json, 0), "parsing {name}");
        let bytes = source_sizes(&plan)[0];
        let recv = recv_of(&plan, bytes);
        match Executor::kernel_source(&plan, bytes, recv, DataType::F16, PacketType::LL16, 1024) {
            Ok(_) => EXPECT_TRUE!(false, "{name}: a source for 1024 threads per block"),
            Err(e) => EXPECT_TRUE!(
                e.to_string().contains("run on the interpreter")
                    && e.to_string().contains("MSCCLPP_EXECUTOR_JIT_THREADS"),
                "{name}: 1024 threads refused with: {e}"
            ),
        }
    }
    let sources = sources_of(ctx, &units);
    compile_all(ctx, sources);
});

TEST!(ExecutorJitTest, UpstreamPlansCompile, |ctx| {
    let (dir, files) = upstream_plan_files();
    let mut plans = Vec::new();
    for f in &files {
        let json = ok!(std::fs::read_to_string(f), "reading {}", f.display());
        let probe = ok!(
            ExecutionPlan::from_json(&json, 0),
            "parsing {}",
            f.display()
        );
        if probe.uses_switch_channels() {
            continue;
        }
        let name = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        plans.push((name, json, probe.world_size()));
    }
    if plans.is_empty() {
        SKIP!("no plan without switch channels in {dir}");
    }
    let mut units = Vec::new();
    for (name, json, n) in &plans {
        for rank in 0..*n {
            units.push(Unit {
                name,
                json,
                rank,
                threads: 256,
            });
        }
    }
    let sources = sources_of(ctx, &units);
    compile_all(ctx, sources);
});
