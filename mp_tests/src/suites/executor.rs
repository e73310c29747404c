//! ExecutorTest: every shipped execution plan (core/plans, embedded in this binary) at its
//! world size, on fresh data per call, outputs poisoned with a guard zone, results against a
//! host reference (exact for integers, tolerance for floats), both LL packet formats, the
//! host interpreter also with 3 threads per thread block (so a missing `nop` shows); plans
//! made by upstream's DSL from `MSCCLPP_EXECUTOR_UPSTREAM_PLANS`. Bad plans and refusals are
//! in executor_bad.rs. At a world size without a plan the test skips, saying why.

use std::sync::OnceLock;

use mscclpp::collectives::{DataType, ReduceOp};
use mscclpp::executor::{ExecutionPlan, Executor, ExecutorConfig, PacketType, PortChannels};
use mscclpp::{Device, GpuBuffer};
use mscclpp_framework::*;
use mscclpp_hal::prelude::*;
use mscclpp_hal::Gpu;

use super::coll_common::{
    agreed_seed, all_values, compare, guard_intact, poisoned, reference, write_values, GUARD,
    POISON,
};
use super::memory_channel::common::{is_gpu_build, ok};
use crate::world::mp_env;

/// The shipped plans: (family, [json for 2, 4, 8 ranks]).
macro_rules! shipped {
    ($($f:literal),* $(,)?) => {
        &[$(($f, [
            include_str!(concat!("../../../core/plans/", $f, "_n2.json")),
            include_str!(concat!("../../../core/plans/", $f, "_n4.json")),
            include_str!(concat!("../../../core/plans/", $f, "_n8.json")),
        ])),*]
    };
}
pub(crate) static SHIPPED: &[(&str, [&str; 3])] = shipped!(
    "allreduce_simple",
    "allreduce_oop",
    "allreduce_put",
    "allreduce_ll",
    "allreduce_ll_fwd",
    "allreduce_allpair_ll",
    "allgather_simple",
    "allgather_oop",
    "allgather_ll",
    "allgather_ll_fwd",
    "allgather_port",
    "allgather_pipeline",
    "allreduce_nvls",
    "allreduce_nvls_ls",
);

/// The JSON of shipped plan `family` for `n` ranks, or why there is none.
pub(crate) fn shipped_json(family: &str, n: usize) -> Result<&'static str, String> {
    let idx = match n {
        2 => 0,
        4 => 1,
        8 => 2,
        _ => {
            return Err(format!(
                "no shipped {family} plan for {n} ranks (plans exist for 2, 4 and 8)"
            ))
        }
    };
    SHIPPED
        .iter()
        .find(|(f, _)| *f == family)
        .map(|(_, j)| j[idx])
        .ok_or_else(|| format!("no shipped plan family {family}"))
}

/// One communicator, three executors (1 and 3 host threads per block; port channels through
/// the proxy) and a stream.
pub(crate) struct ExecEnv {
    pub exec: Executor,
    pub exec_mt: Executor,
    /// Port channels through the host proxy even when every rank is on one node
    /// ([`PortChannels::Proxy`]; `exec` takes the default, as memory channels then).
    pub exec_proxy: Executor,
    /// Ranks per node as the communicator's bootstrap sees them.
    pub per_node: usize,
    pub device: Device,
    pub stream: Option<<Gpu as Api>::Stream>,
    pub rank: usize,
    pub nranks: usize,
}

// SAFETY: the HAL's streams are usable from any thread.
unsafe impl Sync for ExecEnv {}

impl ExecEnv {
    pub fn raw_stream(&self) -> u64 {
        super::coll_common::raw_stream_of(&self.stream)
    }
    pub fn sync(&self) -> Result<(), String> {
        super::coll_common::sync_stream(&self.stream)
    }
}

/// The process's executors, set up by the first test that asks (collective).
pub(crate) fn exec_env() -> &'static ExecEnv {
    static ENV: OnceLock<Result<ExecEnv, String>> = OnceLock::new();
    let r = ENV.get_or_init(|| {
        let env = mp_env();
        let (device, comm) = super::coll_common::rank_device_and_comm()?;
        let cfg = ExecutorConfig {
            timeout: env.timeout,
            host_threads_per_block: 1,
            port_channels: PortChannels::Auto,
        };
        let exec = Executor::with_config(comm.clone(), cfg.clone()).map_err(|e| e.to_string())?;
        let exec_proxy = Executor::with_config(
            comm.clone(),
            ExecutorConfig {
                port_channels: PortChannels::Proxy,
                ..cfg.clone()
            },
        )
        .map_err(|e| e.to_string())?;
        let per_node = comm.bootstrap().nranks_per_node().max(1);
        let exec_mt = Executor::with_config(
            comm,
            ExecutorConfig {
                host_threads_per_block: 3,
                ..cfg
            },
        )
        .map_err(|e| e.to_string())?;
        let stream = super::coll_common::new_stream(device)?;
        Ok(ExecEnv {
            exec,
            exec_mt,
            exec_proxy,
            per_node,
            device,
            stream,
            rank: env.placement.rank,
            nranks: env.placement.size,
        })
    });
    match r {
        Ok(e) => e,
        Err(msg) if msg.starts_with("skip: ") => SKIP!("{}", &msg[6..]),
        Err(msg) => FAIL!("{}", msg),
    }
}

/// Buffers of one (plan, size), reused by every data type and call.
struct Bufs {
    send: Option<GpuBuffer<u8>>,
    recv: GpuBuffer<u8>,
}

/// Runs `plan` (an allreduce or allgather) with `bytes` per rank (allgather: the input of one
/// rank; allreduce: the whole buffer) for every data type in `dtypes`, `calls` times each
/// with fresh data, returning the mismatch count; errors are described in `errors`.
#[allow(clippy::too_many_arguments)] // one plan check: plan, sizes, types, calls
pub(crate) fn check_plan(
    ex: &Executor,
    plan: &ExecutionPlan,
    bytes: usize,
    dtypes: &[DataType],
    packets: &[PacketType],
    calls: u32,
    seed: u64,
    errors: &mut Vec<String>,
) -> usize {
    let env = exec_env();
    let (r, n) = (env.rank, env.nranks);
    let gather = plan.collective() == "allgather";
    let out_bytes = if gather { bytes * n } else { bytes };
    let b = Bufs {
        send: (!plan.is_in_place()).then(|| poisoned(env.device, bytes)),
        recv: poisoned(env.device, out_bytes),
    };
    let mut bad = 0;
    let mut call = 0u32;
    for &dtype in dtypes {
        let es = dtype.size_in_bytes();
        let m = bytes / es;
        for &pt in packets {
            if plan.is_packet() && pt.payload_bytes() % es != 0 {
                continue;
            }
            for _ in 0..calls {
                call += 1;
                ok!(
                    b.recv.copy_from_host(0, &vec![POISON; out_bytes + GUARD]),
                    "poisoning"
                );
                let vals = all_values(dtype, ReduceOp::Sum, seed, call, n, m);
                let (send, send_size) = match (&b.send, gather) {
                    (Some(s), _) => {
                        write_values(s, 0, dtype, &vals[r]);
                        (s.data(), bytes)
                    }
                    (None, true) => {
                        write_values(&b.recv, r * m, dtype, &vals[r]);
                        (b.recv.data() + (r * bytes) as u64, bytes)
                    }
                    (None, false) => {
                        write_values(&b.recv, 0, dtype, &vals[r]);
                        (b.recv.data(), bytes)
                    }
                };
                // SAFETY: both buffers hold their sizes (+ guard) and live past the sync.
                let res = unsafe {
                    ex.execute(
                        r,
                        send,
                        b.recv.data(),
                        send_size,
                        out_bytes,
                        dtype,
                        plan,
                        env.raw_stream(),
                        pt,
                    )
                };
                ok!(
                    res,
                    "executing {} ({bytes} bytes, {dtype}, {pt:?})",
                    plan.name()
                );
                ok!(env.sync(), "waiting for the stream");
                let mut got = vec![0u8; out_bytes];
                ok!(b.recv.copy_to_host(0, &mut got), "reading the output");
                let before = errors.len();
                let mut column = vec![0.0; n];
                bad += if gather {
                    compare(dtype, &got, 0, |i| vals[i / m][i % m], errors)
                } else {
                    compare(
                        dtype,
                        &got,
                        0,
                        |i| {
                            for (q, c) in column.iter_mut().enumerate() {
                                *c = vals[q][i];
                            }
                            reference(dtype, ReduceOp::Sum, &column)
                        },
                        errors,
                    )
                };
                if !guard_intact(&b.recv, out_bytes) {
                    bad += 1;
                    errors.push("the guard zone after the output was overwritten".into());
                }
                for e in &mut errors[before..] {
                    *e = format!(
                        "{} {bytes} bytes {dtype} {pt:?} call {call}: {e}",
                        plan.name()
                    );
                }
            }
        }
    }
    bad
}

/// Sizes (send bytes) a plan runs with: the smallest its chunking allows, an odd multiple of
/// it, and larger ones, those within the plan's message range.
pub(crate) fn sizes(plan: &ExecutionPlan) -> Vec<usize> {
    let unit = plan.input_granularity() as usize;
    let up = |x: usize| x.div_ceil(unit) * unit;
    let mut v = vec![unit, unit * 37, up(1 << 16)];
    if is_gpu_build() {
        v.push(up(4 << 20));
    }
    v.retain(|&b| in_message_range(plan, b));
    v
}

/// Whether a call of `send` bytes per rank lies within the plan's message range (the executor
/// refuses the others; an all-gather's range is of its output,
/// core/src/executor/lower/layout.rs).
pub(crate) fn in_message_range(plan: &ExecutionPlan, send: usize) -> bool {
    let per = if plan.collective() == "allgather" {
        plan.world_size()
    } else {
        1
    };
    (plan.min_message_size()..=plan.max_message_size()).contains(&((send * per) as u64))
}

/// Shipped plan `family` for this world size (its JSON and this rank's part); skips the test,
/// saying why, where there is none.
fn shipped_plan(ctx: &TestContext, family: &str) -> (&'static str, ExecutionPlan) {
    let json = match shipped_json(family, exec_env().nranks) {
        Ok(j) => j,
        Err(reason) => SKIP!("{}", reason),
    };
    let plan = ok!(
        ExecutionPlan::from_json(json, ctx.rank()),
        "parsing {family}"
    );
    (json, plan)
}

fn run_family(ctx: &TestContext, family: &str) {
    let env = exec_env();
    let n = env.nranks;
    let (_, plan) = shipped_plan(ctx, family);
    ASSERT_EQ!(plan.world_size(), n);
    let seed = agreed_seed();
    let gather = plan.collective() == "allgather";
    let nvls = plan.uses_switch_channels();
    if nvls {
        // Every rank decides alike (same build, same environment), so every rank skips.
        if let Err(e) = mscclpp::nvls_usable(env.device) {
            SKIP!("{family}: switch channels need NVLS: {}", e);
        }
        if is_gpu_build() {
            SKIP!("{family}: the GPU executor kernel has no switch-channel operations yet (host backend only)");
        }
    }
    let dtypes: &[DataType] = if nvls {
        // NVLS sums f32, f16 and bf16 only.
        &[DataType::F32, DataType::F16, DataType::Bf16]
    } else if gather {
        &[DataType::I32, DataType::F16]
    } else {
        &[
            DataType::F32,
            DataType::Bf16,
            DataType::I32,
            DataType::U8,
            DataType::F64,
        ]
    };
    let packets: &[PacketType] = if plan.is_packet() {
        &[PacketType::LL16, PacketType::LL8]
    } else {
        &[PacketType::LL16]
    };
    // At scale (coll_common::FULL_MATRIX_MAX_RANKS) the first two types only.
    let dtypes = if super::coll_common::at_scale(n) {
        &dtypes[..2]
    } else {
        dtypes
    };
    // Contexts left by a test that failed half way must not count below.
    env.exec.reset();
    env.exec_mt.reset();
    let mut runs: Vec<(&Executor, usize)> =
        sizes(&plan).into_iter().map(|b| (&env.exec, b)).collect();
    if !is_gpu_build() {
        // 3 host threads per block: the work is split as on a GPU and nop is a real barrier.
        runs.push((&env.exec_mt, sizes(&plan)[1]));
    }
    if plan.uses_port_channels() {
        // On one node the default runs port channels as memory channels; the proxy keeps them.
        let one_node = n <= env.per_node;
        EXPECT_EQ!(
            env.exec.runs_as(&plan).uses_port_channels(),
            !one_node,
            "{family}: port channels on the proxy by default ({n} ranks, {} per node)",
            env.per_node
        );
        EXPECT_TRUE!(env.exec_proxy.runs_as(&plan).uses_port_channels());
        env.exec_proxy.reset();
        runs.extend(sizes(&plan).into_iter().map(|b| (&env.exec_proxy, b)));
    }
    let mut errors = Vec::new();
    let mut bad = 0;
    for (exec, bytes) in runs {
        bad += check_plan(exec, &plan, bytes, dtypes, packets, 2, seed, &mut errors);
    }
    EXPECT_EQ!(bad, 0, "{family} on {n} ranks: {:?}", errors);
    // One context per (plan, buffers): the buffers above were reused for every call.
    EXPECT_EQ!(env.exec.cached_contexts(), sizes(&plan).len());
    env.exec.reset();
    env.exec_mt.reset();
    env.exec_proxy.reset();
}

TEST!(ExecutorTest, AllReduceSimple, |ctx| run_family(
    ctx,
    "allreduce_simple"
));
TEST!(ExecutorTest, AllReduceOutOfPlace, |ctx| run_family(
    ctx,
    "allreduce_oop"
));
TEST!(ExecutorTest, AllReducePut, |ctx| run_family(
    ctx,
    "allreduce_put"
));
TEST!(ExecutorTest, AllReduceLL, |ctx| run_family(
    ctx,
    "allreduce_ll"
));
TEST!(ExecutorTest, AllReduceLLForward, |ctx| run_family(
    ctx,
    "allreduce_ll_fwd"
));
TEST!(ExecutorTest, AllReduceAllpairLL, |ctx| run_family(
    ctx,
    "allreduce_allpair_ll"
));
TEST!(ExecutorTest, AllGatherSimple, |ctx| run_family(
    ctx,
    "allgather_simple"
));
TEST!(ExecutorTest, AllGatherOutOfPlace, |ctx| run_family(
    ctx,
    "allgather_oop"
));
TEST!(ExecutorTest, AllGatherLL, |ctx| run_family(
    ctx,
    "allgather_ll"
));
TEST!(ExecutorTest, AllGatherLLForward, |ctx| run_family(
    ctx,
    "allgather_ll_fwd"
));
TEST!(ExecutorTest, AllGatherPort, |ctx| run_family(
    ctx,
    "allgather_port"
));
TEST!(ExecutorTest, AllGatherPipeline, |ctx| run_family(
    ctx,
    "allgather_pipeline"
));
TEST!(ExecutorTest, AllReduceNvls, |ctx| run_family(
    ctx,
    "allreduce_nvls"
));
TEST!(ExecutorTest, AllReduceNvlsLoadStore, |ctx| run_family(
    ctx,
    "allreduce_nvls_ls"
));

// Plans made by upstream's DSL (a folder named by `MSCCLPP_EXECUTOR_UPSTREAM_PLANS`): each
// one for this world size runs unchanged; NVLS ones are refused with the reason.
/// The folder `MSCCLPP_EXECUTOR_UPSTREAM_PLANS` and its `*.json` plans in name order; skips the
/// test, saying how to set it, when it is unset (ExecutorTest and ExecutorJitTest).
pub(crate) fn upstream_plan_files() -> (String, Vec<std::path::PathBuf>) {
    let Ok(dir) = std::env::var("MSCCLPP_EXECUTOR_UPSTREAM_PLANS") else {
        SKIP!("set MSCCLPP_EXECUTOR_UPSTREAM_PLANS to a folder of plans made by upstream's DSL (docs/executor.md says how)");
    };
    let mut files: Vec<_> = ok!(std::fs::read_dir(&dir), "listing {dir}")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    (dir, files)
}

// A GPU call made again (same plan, buffers, size, data type, packet type and stream) repeats
// the last launch without the checks and lookups of the first (Executor::repeated_launches);
// its results stay exact, and another data type, new buffers or a traced call go the full way.
TEST!(ExecutorTest, RepeatedCallsRelaunch, |ctx| {
    if !is_gpu_build() {
        SKIP!("repeated launches are the GPU path's; the host interpreter runs every call the full way");
    }
    let env = exec_env();
    let (_, plan) = shipped_plan(ctx, "allreduce_ll");
    env.exec.reset();
    let seed = agreed_seed();
    let bytes = sizes(&plan)[1];
    let run = |dtypes: &[DataType], calls: u32| {
        let mut errors = Vec::new();
        let before = env.exec.repeated_launches();
        let bad = check_plan(
            &env.exec,
            &plan,
            bytes,
            dtypes,
            &[PacketType::LL16],
            calls,
            seed,
            &mut errors,
        );
        (bad, env.exec.repeated_launches() - before, errors)
    };
    // New buffers: the first call goes the full way, the next two repeat it.
    let (bad, repeats, errors) = run(&[DataType::F32], 3);
    EXPECT_EQ!(bad, 0, "three calls: {:?}", errors);
    EXPECT_EQ!(repeats, 2, "calls 2 and 3 repeat the first's launch");
    // Two data types: each one's first call goes the full way.
    let (bad, repeats, errors) = run(&[DataType::F32, DataType::I32], 2);
    EXPECT_EQ!(bad, 0, "two types: {:?}", errors);
    EXPECT_EQ!(repeats, 2, "one repeat per data type");
    // Traced calls count their ops: never a repeat of an untraced launch, nor repeated.
    env.exec.set_trace(true);
    let (bad, repeats, errors) = run(&[DataType::F32], 2);
    env.exec.set_trace(false);
    let _ = env.exec.take_trace();
    EXPECT_EQ!(bad, 0, "traced: {:?}", errors);
    EXPECT_EQ!(repeats, 0, "traced calls go the full way");
    env.exec.reset();
});

TEST!(ExecutorTest, UpstreamPlans, |ctx| {
    let (dir, files) = upstream_plan_files();
    let env = exec_env();
    let seed = agreed_seed();
    let (mut ran, mut refused) = (0, 0);
    for f in files {
        let probe = ok!(ExecutionPlan::from_file(&f, 0), "parsing {}", f.display());
        if probe.world_size() != env.nranks {
            continue;
        }
        let plan = ok!(
            ExecutionPlan::from_file(&f, ctx.rank()),
            "parsing {}",
            f.display()
        );
        if plan.uses_switch_channels() {
            if ctx.rank() == 0 {
                println!("[   INFO   ] upstream plan {}: needs NVLS (switch channels), refused while NVLS is off", f.display());
            }
            refused += 1;
            continue;
        }
        let gather = plan.collective() == "allgather";
        let mut errors = Vec::new();
        let mut bad = 0;
        for bytes in sizes(&plan) {
            let dtypes = [DataType::F32, DataType::I32];
            let packets: &[PacketType] = if plan.is_packet() {
                &[PacketType::LL16, PacketType::LL8]
            } else {
                &[PacketType::LL16]
            };
            bad += check_plan(
                &env.exec,
                &plan,
                bytes,
                &dtypes,
                packets,
                2,
                seed,
                &mut errors,
            );
        }
        if ctx.rank() == 0 {
            println!(
                "[   INFO   ] upstream plan {} ({} {}): {}",
                f.display(),
                if gather { "allgather" } else { "allreduce" },
                plan.protocol(),
                if bad == 0 { "ok" } else { "MISMATCH" }
            );
        }
        EXPECT_EQ!(bad, 0, "{}: {:?}", f.display(), errors);
        env.exec.reset();
        ran += 1;
    }
    if ran == 0 {
        SKIP!(
            "no plan for {} ranks in {dir} ({refused} NVLS plans refused)",
            env.nranks
        );
    }
});

/// The op names of rank `rank`'s thread block `b` in plan JSON `json`.
fn plan_op_names(json: &str, rank: usize, b: usize) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    v["gpus"]
        .as_array()
        .and_then(|g| g.iter().find(|x| x["id"].as_u64() == Some(rank as u64)))
        .and_then(|g| g["threadblocks"].as_array())
        .and_then(|t| t.iter().find(|x| x["id"].as_u64() == Some(b as u64)))
        .and_then(|t| t["ops"].as_array())
        .map(|ops| {
            ops.iter()
                .map(|o| o["name"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

// Executor::set_trace / take_trace: every launch of a traced size counts each GPU block's
// time and each op's time and runs; the ops are the plan's, in its order; a pipeline's body
// runs once per step; the counters are zeroed by reading them, and nothing is counted with
// tracing off. Results stay exact while tracing.
TEST!(ExecutorTest, TraceCountsEveryOp, |ctx| {
    let env = exec_env();
    let seed = agreed_seed();
    const CALLS: u64 = 3;
    for family in ["allreduce_simple", "allgather_pipeline"] {
        let (json, plan) = shipped_plan(ctx, family);
        let bytes = sizes(&plan)[1];
        // `calls` executions of f32 with LL16 packets: the mismatches and their descriptions.
        let run = |calls: u32| {
            let mut errors = Vec::new();
            let bad = check_plan(
                &env.exec,
                &plan,
                bytes,
                &[DataType::F32],
                &[PacketType::LL16],
                calls,
                seed,
                &mut errors,
            );
            (bad, errors)
        };
        env.exec.set_trace(true);
        EXPECT_TRUE!(env.exec.tracing());
        let (bad, errors) = run(CALLS as u32);
        EXPECT_EQ!(bad, 0, "{family} traced: {:?}", errors);
        let traces = ok!(env.exec.take_trace(), "reading the trace of {family}");
        ASSERT_EQ!(traces.len(), 1, "{family}: one traced size");
        let t = &traces[0];
        EXPECT_EQ!(t.plan, plan.name());
        EXPECT_EQ!(t.send_size, bytes as u64);
        let nblocks = plan.num_threadblocks();
        // Every GPU block of every launch (lanes > 1 only on a GPU).
        EXPECT_EQ!(t.blocks.len(), nblocks * t.lanes as usize, "{family}: {t}");
        for b in &t.blocks {
            EXPECT_EQ!(
                b.launches,
                CALLS,
                "{family} block {} lane {}",
                b.block,
                b.lane
            );
            EXPECT_GT!(b.cycles, 0);
            // Gaps between launches: one fewer than launches (those under 1 ms summed).
            EXPECT_LE!(b.idle_gaps, CALLS - 1);
            if b.ns > 0 {
                EXPECT_TRUE!(b.min_idle_ns.is_some(), "{family}: {t}");
            }
            let names: Vec<&str> = b.ops.iter().map(|o| o.name).collect();
            let want = plan_op_names(json, ctx.rank(), b.block as usize);
            let has_pipeline = want.iter().any(|w| w == "pipeline");
            if !has_pipeline {
                // One lowered op per plan op, in order, each run once per launch.
                EXPECT_EQ!(names, want, "{family} block {}", b.block);
                for o in &b.ops {
                    EXPECT_EQ!(o.runs, CALLS, "{family} op {} {}", o.index, o.name);
                }
                // Thread 0 runs the ops one after the other inside the launch.
                let ops: u64 = b.ops.iter().map(|o| o.cycles).sum();
                EXPECT_LE!(
                    ops,
                    b.cycles,
                    "{family} block {}: ops within the launch",
                    b.block
                );
            } else {
                // The pipeline runs once per launch, its body once per step of it.
                let p = b.ops.iter().find(|o| o.name == "pipeline");
                EXPECT_TRUE!(p.is_some(), "{family}: {names:?}");
                if let Some(p) = p {
                    EXPECT_EQ!(p.runs, CALLS);
                    let body: Vec<_> = b.ops.iter().filter(|o| o.index > p.index).collect();
                    let steps = body.first().map_or(0, |o| o.runs);
                    EXPECT_TRUE!(steps >= CALLS && steps % CALLS == 0, "{family}: {t}");
                }
            }
            if b.lane == 0 {
                // A wait lasts until the peer signalled: never no time at all.
                for o in b.ops.iter().filter(|o| o.name == "wait") {
                    EXPECT_GT!(o.cycles, 0, "{family} op {}", o.index);
                }
            }
        }
        if ctx.rank() == 0 {
            print!("{t}");
        }
        // Read counters start again from zero.
        EXPECT_TRUE!(ok!(env.exec.take_trace(), "reading again").is_empty());
        // Tracing off: nothing counted.
        env.exec.set_trace(false);
        let (bad, errors) = run(1);
        EXPECT_EQ!(bad, 0, "{family} untraced: {:?}", errors);
        EXPECT_TRUE!(ok!(env.exec.take_trace(), "reading untraced").is_empty());
        env.exec.reset();
    }
});
