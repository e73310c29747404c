//! CollPlanTest: the algorithm collection of a communicator. A shipped plan (core/plans, with
//! its size range narrowed to 4..=64 KiB) dropped into a temporary plan directory is taken by
//! `Collectives` for in-place all-reduces inside its range (checked through `choose` and the
//! results) and the native algorithm outside it and for out-of-place calls; an algorithm of
//! one's own (host code: all-gather over the bootstrap, then a sum) added through the builder
//! with its own selector runs where the selector says, forcing still coming first.

use std::sync::Arc;

use mscclpp::collectives::gpu::GpuCtx;
use mscclpp::collectives::{
    Algorithm, BuildContext, Call, CollectiveKind, Collectives, CollectivesConfig, DataType,
    ReduceOp, Resources, SelectContext,
};
use mscclpp::{Communicator, Context, Device, GpuBuffer};
use mscclpp_framework::*;

use super::executor::shipped_json;
use super::memory_channel::common::{is_gpu_build, ok};
use crate::world::mp_env;

/// The plan's narrowed range.
const PLAN_MIN: usize = 4 << 10;
const PLAN_MAX: usize = 64 << 10;
/// The plan's name in the collection.
const PLAN_NAME: &str = "coll_plan_test_allreduce_ll";

/// A host-backend collectives on a fresh communicator, built by `f` from its builder.
fn build(
    f: impl FnOnce(mscclpp::collectives::CollectivesBuilder) -> mscclpp::collectives::CollectivesBuilder,
) -> Result<Collectives, String> {
    let env = mp_env();
    let context = Context::new().map_err(|e| e.to_string())?;
    let comm = Arc::new(Communicator::new(env.bootstrap.clone(), context));
    let cfg = CollectivesConfig {
        device: Some(Device::CPU),
        host_timeout: env.timeout,
        ll_half_bytes: 1 << 20,
        plain_bytes: 4 << 20,
        ..CollectivesConfig::default()
    };
    f(Collectives::builder(comm).config(cfg))
        .build()
        .map_err(|e| e.to_string())
}

fn value(rank: usize, i: usize) -> i32 {
    ((rank * 7919 + i * 31) % 1000) as i32
}

/// Runs an all-reduce of `count` i32 (in place or not) and checks every element.
fn all_reduce_checked(coll: &Collectives, count: usize, in_place: bool) -> Result<(), String> {
    let (rank, n) = (coll.rank(), coll.nranks());
    let send = GpuBuffer::<i32>::new(Device::CPU, count).map_err(|e| e.to_string())?;
    let recv = GpuBuffer::<i32>::new(Device::CPU, count).map_err(|e| e.to_string())?;
    let mine: Vec<i32> = (0..count).map(|i| value(rank, i)).collect();
    send.copy_from_host(0, &mine).map_err(|e| e.to_string())?;
    let dst = if in_place { send.data() } else { recv.data() };
    // SAFETY: both buffers hold `count` i32 and live past the (synchronous, host) call.
    unsafe { coll.all_reduce(send.data(), dst, count, DataType::I32, ReduceOp::Sum, 0) }
        .map_err(|e| e.to_string())?;
    let got = if in_place {
        send.to_vec()
    } else {
        recv.to_vec()
    }
    .map_err(|e| e.to_string())?;
    for (i, g) in got.iter().enumerate() {
        let want: i32 = (0..n).map(|r| value(r, i)).sum();
        if *g != want {
            return Err(format!("{count} i32: element {i} is {g}, expected {want}"));
        }
    }
    Ok(())
}

/// An all-reduce of `count` i32 on `bufs` (send, recv) of this library's memory.
fn call(bufs: &(GpuBuffer<i32>, GpuBuffer<i32>), count: usize, in_place: bool) -> Call {
    let send = bufs.0.data();
    Call {
        kind: CollectiveKind::AllReduce,
        send,
        recv: if in_place { send } else { bufs.1.data() },
        count,
        dtype: DataType::I32,
        op: ReduceOp::Sum,
        root: 0,
    }
}

/// Send and receive buffers of `count` i32 (host backend).
fn buffers(count: usize) -> Result<(GpuBuffer<i32>, GpuBuffer<i32>), String> {
    let a = GpuBuffer::<i32>::new(Device::CPU, count).map_err(|e| e.to_string())?;
    let b = GpuBuffer::<i32>::new(Device::CPU, count).map_err(|e| e.to_string())?;
    Ok((a, b))
}

TEST!(CollPlanTest, PlanTakenForItsSizeRange, |ctx| {
    if is_gpu_build() {
        SKIP!("host-backend test (the plan directory works alike on GPUs)");
    }
    let n = ctx.size();
    let json = match shipped_json("allreduce_ll", n) {
        Ok(j) => j,
        Err(why) => SKIP!("{why}"),
    };
    let mut plan: serde_json::Value = ok!(serde_json::from_str(json), "parsing the plan");
    plan["name"] = PLAN_NAME.into();
    plan["min_message_size"] = PLAN_MIN.into();
    plan["max_message_size"] = PLAN_MAX.into();
    let dir = std::env::temp_dir().join(format!("mscclpp-coll-plans-{}", std::process::id()));
    ok!(std::fs::create_dir_all(&dir), "creating {}", dir.display());
    let file = dir.join("allreduce_ll_narrow.json");
    ok!(
        std::fs::write(&file, plan.to_string()),
        "writing {}",
        file.display()
    );
    let coll = ok!(
        build(|b| b.plan_dir(&dir)),
        "setting up collectives with the plan directory"
    );
    let _ = std::fs::remove_dir_all(&dir);
    ASSERT_EQ!(coll.plans().len(), 1);
    EXPECT_EQ!(coll.plans()[0].plan().path(), Some(file.as_path()));
    let bufs = ok!(buffers(256 << 8), "allocating");
    for bytes in [1 << 10, PLAN_MIN, 16 << 10, PLAN_MAX, 256 << 10] {
        let count = bytes / 4;
        let inside = (PLAN_MIN..=PLAN_MAX).contains(&bytes);
        let chosen = ok!(
            coll.choose(&call(&bufs, count, true)),
            "choosing for {bytes} bytes"
        );
        if inside {
            EXPECT_EQ!(chosen.name(), PLAN_NAME);
        } else {
            EXPECT_NE!(chosen.name(), PLAN_NAME);
            EXPECT_TRUE!(mscclpp::collectives::find_algorithm(
                CollectiveKind::AllReduce,
                chosen.name()
            )
            .is_ok());
        }
        // Out of place: the plan is an in-place one.
        let oop = ok!(
            coll.choose(&call(&bufs, count, false)),
            "choosing for {bytes} bytes"
        );
        EXPECT_NE!(oop.name(), PLAN_NAME);
        ok!(all_reduce_checked(&coll, count, true), "in place");
        ok!(all_reduce_checked(&coll, count, false), "out of place");
    }
    // Memory this library did not allocate: the native algorithm.
    let mut foreign = vec![0i32; 4096];
    let f = Call {
        send: foreign.as_mut_ptr() as u64,
        recv: foreign.as_mut_ptr() as u64,
        ..call(&bufs, 4096, true)
    };
    EXPECT_NE!(
        ok!(coll.choose(&f), "choosing for foreign memory").name(),
        PLAN_NAME
    );
    // Forcing may name the plan (and it still checks its range).
    ok!(
        coll.force_algorithm(CollectiveKind::AllReduce, Some(PLAN_NAME)),
        "forcing the plan"
    );
    EXPECT_TRUE!(coll.choose(&call(&bufs, 256 << 8, true)).is_err());
    ok!(
        coll.force_algorithm(CollectiveKind::AllReduce, None),
        "un-forcing"
    );
});

/// An all-reduce of one's own, host code only: every rank's buffer over the bootstrap, summed.
struct BootstrapSum {
    calls: std::sync::atomic::AtomicUsize,
}

impl Algorithm for BootstrapSum {
    fn name(&self) -> &'static str {
        "bootstrap_sum"
    }
    fn kind(&self) -> CollectiveKind {
        CollectiveKind::AllReduce
    }
    fn check(&self, _res: &Resources, call: &Call) -> mscclpp::Result<()> {
        if call.dtype != DataType::I32 || call.op != ReduceOp::Sum {
            return Err(mscclpp::Error::invalid("bootstrap_sum: expected i32 sum"));
        }
        Ok(())
    }
    fn launch_gpu(
        &self,
        _res: &Resources,
        _gpu: &GpuCtx,
        _call: &Call,
        _stream: u64,
    ) -> mscclpp::Result<()> {
        Err(mscclpp::Error::invalid("bootstrap_sum: host backend only"))
    }
    fn run_host(&self, res: &Resources, call: &Call) -> mscclpp::Result<()> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the collective's contract: `send` holds `count` i32 of host memory.
        let mine =
            unsafe { std::slice::from_raw_parts(call.send as usize as *const u8, call.bytes()) };
        let all = res.comm().bootstrap().all_gather(mine)?;
        let mut sum = vec![0i32; call.count];
        for blob in &all {
            for (s, c) in sum.iter_mut().zip(blob.chunks_exact(4)) {
                *s = s.wrapping_add(i32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        // SAFETY: `recv` holds `count` i32 of host memory (may alias `send`: read above).
        let out =
            unsafe { std::slice::from_raw_parts_mut(call.recv as usize as *mut i32, call.count) };
        out.copy_from_slice(&sum);
        Ok(())
    }
}

TEST!(CollPlanTest, OwnAlgorithmAndSelector, |ctx| {
    if is_gpu_build() {
        SKIP!("the test's algorithm is host code only");
    }
    if ctx.size() == 1 {
        SKIP!("world size 1 always copies");
    }
    let mine = Arc::new(BootstrapSum {
        calls: Default::default(),
    });
    let built = mine.clone();
    let bufs = ok!(buffers(4096), "allocating");
    let coll = ok!(
        build(|b| b
            .without_plans()
            .add_algorithm(move |_: &BuildContext<'_>| Ok::<_, mscclpp::Error>(
                built.clone() as Arc<dyn Algorithm>
            ))
            .selector(|s: &SelectContext<'_>| {
                // Mine up to 4 KiB, the default choice above.
                Ok::<_, mscclpp::Error>(
                    (s.call.bytes() <= 4096)
                        .then(|| s.find(CollectiveKind::AllReduce, "bootstrap_sum"))
                        .flatten(),
                )
            })),
        "setting up collectives with an own algorithm"
    );
    EXPECT_EQ!(
        ok!(coll.choose(&call(&bufs, 1024, false)), "choosing").name(),
        "bootstrap_sum"
    );
    EXPECT_NE!(
        ok!(coll.choose(&call(&bufs, 4096, false)), "choosing").name(),
        "bootstrap_sum"
    );
    ok!(all_reduce_checked(&coll, 1024, false), "own algorithm");
    ok!(
        all_reduce_checked(&coll, 1024, true),
        "own algorithm, in place"
    );
    EXPECT_EQ!(mine.calls.load(std::sync::atomic::Ordering::Relaxed), 2);
    ok!(all_reduce_checked(&coll, 4096, false), "default choice");
    EXPECT_EQ!(mine.calls.load(std::sync::atomic::Ordering::Relaxed), 2);
    // Forcing comes before the selector.
    ok!(
        coll.force_algorithm(CollectiveKind::AllReduce, Some("rsag")),
        "forcing rsag"
    );
    EXPECT_EQ!(
        ok!(coll.choose(&call(&bufs, 1024, false)), "choosing").name(),
        "rsag"
    );
    ok!(
        coll.force_algorithm(CollectiveKind::AllReduce, Some("bootstrap_sum")),
        "forcing mine"
    );
    ok!(
        all_reduce_checked(&coll, 8192, false),
        "forced own algorithm"
    );
    EXPECT_EQ!(mine.calls.load(std::sync::atomic::Ordering::Relaxed), 3);
    ok!(
        coll.force_algorithm(CollectiveKind::AllReduce, None),
        "un-forcing"
    );
});

/// A plan directory holding the shipped all-reduce LL plan for `n` ranks narrowed to
/// PLAN_MIN..=PLAN_MAX and named PLAN_NAME, or why there is none (`skip: ` first).
fn narrowed_plan_dir(n: usize, tag: &str) -> Result<std::path::PathBuf, String> {
    let json = shipped_json("allreduce_ll", n).map_err(|why| format!("skip: {why}"))?;
    let mut plan: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    plan["name"] = PLAN_NAME.into();
    plan["min_message_size"] = PLAN_MIN.into();
    plan["max_message_size"] = PLAN_MAX.into();
    let dir = std::env::temp_dir().join(format!("mscclpp-coll-plans-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let file = dir.join("allreduce_ll_narrow.json");
    std::fs::write(&file, plan.to_string())
        .map_err(|e| format!("writing {}: {e}", file.display()))?;
    Ok(dir)
}

/// Memory straight from the HAL (host backend: a shared memfd mapping), not through
/// `mscclpp`: the application's own, which the executor adopts.
fn app_memory(bytes: usize) -> Result<<mscclpp_hal::Gpu as mscclpp_hal::Api>::Memory, String> {
    use mscclpp_hal::prelude::*;
    let dev = mscclpp_hal::Gpu::open_device(0).map_err(|e| e.to_string())?;
    mscclpp_hal::Gpu::alloc(&dev, bytes, mscclpp_hal::MemoryKind::Device).map_err(|e| e.to_string())
}

/// An in-place all-reduce of `count` i32 at `ptr` (host-addressable memory) through `coll`:
/// the algorithm chosen after it ran (the ranks agreed on the buffers at its launch), or the
/// first wrong element.
fn all_reduce_at(coll: &Collectives, ptr: u64, count: usize) -> Result<&'static str, String> {
    let (rank, n) = (coll.rank(), coll.nranks());
    // SAFETY: the caller's memory holds `count` i32 and is host-addressable (host backend).
    let data = unsafe { std::slice::from_raw_parts_mut(ptr as usize as *mut i32, count) };
    for (i, d) in data.iter_mut().enumerate() {
        *d = value(rank, i);
    }
    let c = Call {
        kind: CollectiveKind::AllReduce,
        send: ptr,
        recv: ptr,
        count,
        dtype: DataType::I32,
        op: ReduceOp::Sum,
        root: 0,
    };
    let choice = coll.choose(&c).map_err(|e| e.to_string())?;
    // SAFETY: as above; the host backend completes the call on return.
    unsafe { coll.run_choice(&choice, 0) }.map_err(|e| e.to_string())?;
    let choice = coll.choose(&c).map_err(|e| e.to_string())?;
    for (i, g) in data.iter().enumerate() {
        let want: i32 = (0..n).map(|r| value(r, i)).sum();
        if *g != want {
            return Err(format!(
                "{} on {count} i32: element {i} is {g}, expected {want}",
                choice.name()
            ));
        }
    }
    Ok(choice.name())
}

TEST!(CollPlanUserTest, PlanRunsOnAdoptedUserMemory, |ctx| {
    use mscclpp_hal::Buffer;
    if is_gpu_build() {
        SKIP!("host-backend test (GPU builds: core/python/tests/gpu/dsl_plan_gpu.sh and `.ci/gpu-check plan-speed`)");
    }
    let dir = match narrowed_plan_dir(ctx.size(), "user") {
        Ok(d) => d,
        Err(msg) if msg.starts_with("skip: ") => SKIP!("{}", &msg[6..]),
        Err(msg) => FAIL!("{}", msg),
    };
    let coll = ok!(
        build(|b| b.plan_dir(&dir)),
        "setting up collectives with the plan directory"
    );
    let _ = std::fs::remove_dir_all(&dir);
    ASSERT_EQ!(coll.plans().len(), 1);
    // The application's memory (a memfd mapping straight from the HAL): adopted, the plan runs
    // for sizes in its range, and again on later calls and other sizes of the same buffer.
    let mem = ok!(app_memory(PLAN_MAX), "allocating application memory");
    for bytes in [PLAN_MIN, PLAN_MAX, 16 << 10] {
        let name = ok!(
            all_reduce_at(&coll, mem.device_ptr(), bytes / 4),
            "all-reduce of {bytes} bytes of application memory"
        );
        EXPECT_EQ!(name, PLAN_NAME, "{bytes} bytes of adopted memory");
    }
    // Outside the plan's range: the native algorithm, on the same memory.
    let small = ok!(
        all_reduce_at(&coll, mem.device_ptr(), 256),
        "all-reduce of 1 KiB of application memory"
    );
    EXPECT_NE!(small, PLAN_NAME);
    // Rank 0 offers private heap memory (nothing can adopt it), the others application memory:
    // every rank declines the plan alike and the native algorithm runs (exact results).
    let other = ok!(app_memory(PLAN_MAX), "allocating application memory");
    let mut private = vec![0i32; PLAN_MAX / 4];
    let ptr = if ctx.rank() == 0 {
        private.as_mut_ptr() as u64
    } else {
        other.device_ptr()
    };
    let name = ok!(
        all_reduce_at(&coll, ptr, PLAN_MIN / 4),
        "all-reduce where rank 0 cannot adopt"
    );
    EXPECT_NE!(
        name,
        PLAN_NAME,
        "one rank cannot adopt: declined on every rank"
    );
});
