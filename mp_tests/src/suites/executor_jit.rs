//! ExecutorJitTest: plans compiled at load time (`MSCCLPP_EXECUTOR_JIT`,
//! core/src/executor/run/jit.rs). Needs no GPU: every shipped plan (2 and 4 ranks, first and
//! last rank's part, NVLS plans left out: the GPU executor refuses switch operations) becomes a
//! kernel source at 1 unit, 64 KiB and 4 MiB (those in its range) for f16, launches of 256
//! threads (and of 1024 for the first rank) and, for LL plans, both packet
//! formats; one structure per plan (the sizes share a source); and, on a
//! CUDA build with libnvrtc, each distinct source compiles for sm_90. The work is split over the
//! ranks (job k on rank k % world size), so each source compiles once. Without a run-time
//! compiler (host or ROCm build, or no libnvrtc) the compile half skips, saying why.

use std::collections::BTreeMap;

use mscclpp::collectives::DataType;
use mscclpp::executor::{ExecutionPlan, Executor, PacketType};
use mscclpp_framework::*;

use super::executor::{in_message_range, SHIPPED};
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

TEST!(ExecutorJitTest, ShippedPlansCompile, |ctx| {
    let (rank, world) = (ctx.rank(), ctx.size());
    // (plan, rank, dtype, packet, threads) -> its source: one per structure.
    let mut sources: BTreeMap<String, String> = BTreeMap::new();
    let mut job = 0usize;
    for (family, jsons) in SHIPPED {
        if family.contains("nvls") {
            continue;
        }
        for json in &jsons[..2] {
            let probe = ok!(ExecutionPlan::from_json(json, 0), "parsing {family}");
            let n = probe.world_size();
            // Kernels for launches of up to 256 threads per block (small messages' one-lane
            // launches, Simple plans' lanes), and for the first rank also up to 1024 (LL plans'
            // wide lanes, MSCCLPP_EXECUTOR_THREADS above 256).
            for (r, threads) in [(0, 256), (0, 1024), (n - 1, 256)] {
                job += 1;
                if job % world != rank {
                    continue;
                }
                let plan = ok!(
                    ExecutionPlan::from_json(json, r),
                    "parsing {family} rank {r}"
                );
                let gather = plan.collective() == "allgather";
                let packets: &[PacketType] = if plan.is_packet() {
                    &[PacketType::LL16, PacketType::LL8]
                } else {
                    &[PacketType::LL16]
                };
                let sizes = source_sizes(&plan);
                EXPECT_TRUE!(!sizes.is_empty(), "{family} n{n}: no size in its range");
                let dtype = DataType::F16;
                for &packet in packets {
                    let mut seen: Vec<String> = Vec::new();
                    for &bytes in &sizes {
                        let recv = if gather { bytes * n } else { bytes };
                        let src = ok!(
                                Executor::kernel_source(&plan, bytes, recv, dtype, packet, threads),
                                "{family} n{n} rank {r}: kernel source of {bytes} bytes, {dtype:?}, {packet:?}, {threads} threads"
                            );
                        EXPECT_TRUE!(
                            src.contains("extern \"C\" __global__") && src.contains("step<"),
                            "{family} n{n} rank {r}: not a plan kernel:\n{src}"
                        );
                        if !seen.contains(&src) {
                            seen.push(src);
                        }
                    }
                    // The offsets and sizes are launch values: one kernel for every size.
                    EXPECT_EQ!(
                            seen.len(),
                            1,
                            "{family} n{n} rank {r} {dtype:?} {packet:?} {threads} threads: the sizes {sizes:?} gave {} structures",
                            seen.len()
                        );
                    for (i, s) in seen.into_iter().enumerate() {
                        sources.insert(
                            format!("{family}_n{n} rank {r} {dtype:?} {packet:?} {threads}t #{i}"),
                            s,
                        );
                    }
                }
            }
        }
    }
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
        "rank {rank}: {compiled} plan kernels compiled for sm_90 in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
});
