//! Collectives checks beyond the shared matrix (coll_matrix.rs):
//! * CollectivesSmallScratchTest: every scratch-based algorithm on a second communicator whose
//!   scratch is tiny (16 KiB plain, 3 host blocks), so each call spans many chunks, pipeline
//!   iterations and reused stages;
//! * BroadcastTest.EveryRoot: every broadcast algorithm from every root;
//! * CollectivesZeroCopyTest: buffers of this library are registered once and cached (the
//!   zero-copy path runs), buffers allocated outside it (straight from the HAL) are adopted
//!   and registered too (RegistrationTest covers the ones that fall back), and (GPU) unseen
//!   buffers under graph capture fall back;
//! * CollectivesGraphTest (GPU): capture + replay of every all-gather, reduce-scatter and
//!   broadcast algorithm.

use std::sync::OnceLock;

use mscclpp::collectives::{find_algorithm, CollectiveKind, CollectivesConfig, DataType, ReduceOp};
use mscclpp_framework::*;
use mscclpp_hal::{prelude::*, Buffer, Gpu, MemoryKind, StreamInterop};

use super::coll_common::*;
use super::coll_matrix::{next_call, one_call};
use super::memory_channel::common::{is_gpu_build, ok};

/// Bytes of the small communicator's plain scratch and of each LL half.
const SMALL_SCRATCH: usize = 16 << 10;

/// A second collectives object with a tiny scratch (collective: every rank builds it in the
/// same test).
fn small_env() -> &'static CollEnv {
    static ENV: OnceLock<Result<CollEnv, String>> = OnceLock::new();
    env_or_skip(ENV.get_or_init(|| {
        let cfg = CollectivesConfig {
            plain_bytes: SMALL_SCRATCH,
            ll_half_bytes: SMALL_SCRATCH,
            host_blocks: 3,
            ..Default::default()
        };
        new_coll_env(cfg, "the small collectives")
    }))
}

/// Every algorithm of `kind` but the copy over `cases` (dtype, op, count) in and out of place
/// on the small-scratch communicator; sizes an algorithm's `check` refuses are left out. Every
/// case moves more than the whole scratch per rank, so no algorithm fits it in one chunk.
fn small_scratch(kind: CollectiveKind, cases: &[(DataType, ReduceOp, usize)]) {
    let env = small_env();
    let n = env.coll.nranks();
    if n == 1 {
        SKIP!("world size 1 always copies");
    }
    // At scale (coll_common::FULL_MATRIX_MAX_RANKS) the first two cases only.
    let cases = if super::coll_common::at_scale(n) {
        &cases[..cases.len().min(2)]
    } else {
        cases
    };
    let seed = agreed_seed();
    let mut call = 0u32;
    // The NVLS variants use their own fixed scratch (nvls.rs), not the small one configured
    // here: AllReduceNvlsTest runs them across several of its chunks.
    for algo in super::coll_common::single_node_algorithms(kind)
        .into_iter()
        .filter(|a| *a != "copy" && !a.starts_with("nvls_"))
    {
        let a = ok!(find_algorithm(kind, algo), "finding {algo}");
        ok!(env.coll.force_algorithm(kind, Some(algo)), "forcing {algo}");
        for &(dtype, op, count) in cases {
            ASSERT_GT!(
                count * dtype.size_in_bytes(),
                SMALL_SCRATCH,
                "a case that spans chunks"
            );
            if !takes(env, a, kind, dtype, op, count) {
                continue;
            }
            for in_place in [false, true] {
                let (bad, _root, errors) =
                    next_call(env, kind, dtype, op, in_place, count, seed, &mut call);
                EXPECT_EQ!(
                    bad,
                    0,
                    "{kind} {algo} {dtype} {op} count {count} {} (scratch {SMALL_SCRATCH} bytes): {}",
                    if in_place { "in place" } else { "out of place" },
                    errors
                );
            }
        }
        ok!(env.coll.force_algorithm(kind, None), "un-forcing {algo}");
    }
}

TEST!(
    CollectivesSmallScratchTest,
    AllReduce,
    |_ctx| small_scratch(
        CollectiveKind::AllReduce,
        &[
            (DataType::F32, ReduceOp::Sum, 12_345),
            (DataType::I32, ReduceOp::Max, 7_777),
            (DataType::F16, ReduceOp::Avg, 20_001),
            (DataType::U8, ReduceOp::Sum, 33_333),
        ]
    )
);
TEST!(
    CollectivesSmallScratchTest,
    AllGather,
    |_ctx| small_scratch(
        CollectiveKind::AllGather,
        &[
            (DataType::F32, ReduceOp::Sum, 5_000),
            (DataType::U8, ReduceOp::Sum, 20_001),
            (DataType::I64, ReduceOp::Sum, 3_001),
        ]
    )
);
TEST!(CollectivesSmallScratchTest, ReduceScatter, |_ctx| {
    small_scratch(
        CollectiveKind::ReduceScatter,
        &[
            (DataType::F32, ReduceOp::Sum, 5_000),
            (DataType::I32, ReduceOp::Min, 4_099),
            (DataType::Bf16, ReduceOp::Max, 9_001),
        ],
    )
});
TEST!(
    CollectivesSmallScratchTest,
    Broadcast,
    |_ctx| small_scratch(
        CollectiveKind::Broadcast,
        &[
            (DataType::F32, ReduceOp::Sum, 5_000),
            (DataType::U8, ReduceOp::Sum, 40_001),
        ]
    )
);

TEST!(BroadcastTest, EveryRoot, |_ctx| {
    let env = coll_env();
    let n = env.coll.nranks();
    if n == 1 {
        SKIP!("world size 1 always copies (BroadcastTest.Copy covers it)");
    }
    let kind = CollectiveKind::Broadcast;
    let seed = agreed_seed();
    let mut call = 0u32;
    for algo in super::coll_common::single_node_algorithms(kind)
        .into_iter()
        .filter(|a| *a != "copy")
    {
        ok!(env.coll.force_algorithm(kind, Some(algo)), "forcing {algo}");
        for root in 0..n {
            for (dtype, count, in_place) in [
                (DataType::U8, 1023usize, true),
                (DataType::F32, 4099, false),
            ] {
                call += 1;
                let mut errors = Vec::new();
                let bad = one_call(
                    kind,
                    dtype,
                    ReduceOp::Sum,
                    in_place,
                    count,
                    root,
                    seed,
                    call,
                    &mut errors,
                );
                EXPECT_EQ!(
                    bad,
                    0,
                    "broadcast {algo} root {root} {dtype} count {count}: {}",
                    errors.join("; ")
                );
            }
        }
        ok!(env.coll.force_algorithm(kind, None), "un-forcing {algo}");
    }
});

/// Whether the cache holds a registration of `(ptr, size)` that every rank made (a query:
/// `capturing` = true never registers).
fn cached(env: &CollEnv, ptr: u64, size: usize) -> bool {
    let res = env.coll.resources();
    let e = ok!(
        res.user_buffers()
            .get_or_register(res.comm(), res.device(), ptr, size, true),
        "querying the registration cache"
    );
    e.is_some()
}

TEST!(CollectivesZeroCopyTest, RegistersOnceAndCaches, |_ctx| {
    let env = coll_env();
    if env.coll.nranks() == 1 {
        SKIP!("world size 1 always copies");
    }
    let ar = CollectiveKind::AllReduce;
    ok!(
        env.coll.force_algorithm(ar, Some("rsag_zero_copy")),
        "forcing"
    );
    let (dtype, op, count) = (DataType::F32, ReduceOp::Sum, 3001);
    let bytes = count * dtype.size_in_bytes();
    let send = poisoned(env.device, bytes);
    let recv = poisoned(env.device, bytes);
    let seed = agreed_seed();
    EXPECT_FALSE!(
        cached(env, send.data(), bytes),
        "not registered before the first call"
    );
    let before = env.coll.resources().user_buffers().len();
    let mut bad = 0;
    let mut errors = Vec::new();
    for call in 0..3u32 {
        let vals = all_values(dtype, op, seed, call, env.coll.nranks(), count);
        write_values(&send, 0, dtype, &vals[env.coll.rank()]);
        // SAFETY: both buffers hold `bytes` and live until after the sync.
        let r = unsafe {
            env.coll
                .all_reduce(send.data(), recv.data(), count, dtype, op, env.raw_stream())
        };
        ok!(r, "zero-copy all-reduce");
        ok!(env.sync(), "waiting");
        let mut got = vec![0u8; bytes];
        ok!(recv.copy_to_host(0, &mut got), "reading");
        bad += compare_all_reduce(dtype, op, &got, &vals, &mut errors);
    }
    ok!(env.coll.force_algorithm(ar, None), "un-forcing");
    EXPECT_EQ!(bad, 0, "zero-copy results: {}", errors.join("; "));
    EXPECT_TRUE!(cached(env, send.data(), bytes), "the input is registered");
    EXPECT_TRUE!(cached(env, recv.data(), bytes), "the output is registered");
    EXPECT_EQ!(
        env.coll.resources().user_buffers().len(),
        before + 2,
        "three calls register each buffer once"
    );
});

TEST!(CollectivesZeroCopyTest, ForeignBuffersAreAdopted, |_ctx| {
    let env = coll_env();
    if env.coll.nranks() == 1 {
        SKIP!("world size 1 always copies");
    }
    let ar = CollectiveKind::AllReduce;
    let (dtype, op, count) = (DataType::I32, ReduceOp::Sum, 4099);
    let bytes = count * dtype.size_in_bytes();
    // Memory straight from the HAL, not through mscclpp::LocalMemory: adopted (issue 28).
    let ordinal = if is_gpu_build() {
        env.device.id as usize
    } else {
        0
    };
    let dev = ok!(Gpu::open_device(ordinal), "opening the device");
    let buf = ok!(Gpu::alloc(&dev, bytes, MemoryKind::Device), "allocating");
    let seed = agreed_seed();
    let vals = all_values(dtype, op, seed, 0, env.coll.nranks(), count);
    ok!(
        Gpu::write(&dev, &buf, 0, &encode_all(dtype, &vals[env.coll.rank()])),
        "writing the input"
    );
    ok!(
        env.coll.force_algorithm(ar, Some("rsag_zero_copy")),
        "forcing"
    );
    // SAFETY: the buffer holds `bytes` and lives until after the sync (in place).
    let r = unsafe {
        env.coll.all_reduce(
            buf.device_ptr(),
            buf.device_ptr(),
            count,
            dtype,
            op,
            env.raw_stream(),
        )
    };
    ok!(env.coll.force_algorithm(ar, None), "un-forcing");
    ok!(r, "all-reduce of a foreign buffer");
    let adopted = cached(env, buf.device_ptr(), bytes);
    ok!(env.sync(), "waiting");
    let mut got = vec![0u8; bytes];
    ok!(Gpu::read(&dev, &buf, 0, &mut got), "reading");
    let mut errors = Vec::new();
    let bad = compare_all_reduce(dtype, op, &got, &vals, &mut errors);
    EXPECT_EQ!(bad, 0, "zero-copy results: {}", errors.join("; "));
    EXPECT_TRUE!(
        adopted,
        "a buffer allocated outside the library is registered on every rank"
    );
    env.coll
        .resources()
        .user_buffers()
        .forget(buf.device_ptr(), bytes);
});

TEST!(
    CollectivesZeroCopyTest,
    UnseenBuffersUnderCaptureFallBack,
    |_ctx| {
        if !is_gpu_build() {
            SKIP!("graph capture needs a GPU build: the host backend completes every call before it returns");
        }
        let env = coll_env();
        let Some(stream) = env.stream.as_ref() else {
            SKIP!("no stream")
        };
        if env.coll.nranks() == 1 {
            SKIP!("world size 1 always copies");
        }
        let ar = CollectiveKind::AllReduce;
        let (dtype, op, count) = (DataType::F16, ReduceOp::Sum, 5000);
        let bytes = count * dtype.size_in_bytes();
        let send = poisoned(env.device, bytes);
        let recv = poisoned(env.device, bytes);
        ok!(
            env.coll.force_algorithm(ar, Some("rsag_zero_copy")),
            "forcing"
        );
        ok!(Gpu::begin_capture(stream), "beginning the capture");
        // SAFETY: the buffers live until the end of this test, after the last sync.
        let r = unsafe {
            env.coll
                .all_reduce(send.data(), recv.data(), count, dtype, op, env.raw_stream())
        };
        let graph = Gpu::end_capture(stream);
        ok!(env.coll.force_algorithm(ar, None), "un-forcing");
        ok!(r, "all-reduce under capture");
        let graph = ok!(graph, "ending the capture");
        EXPECT_FALSE!(
            cached(env, send.data(), bytes),
            "nothing is registered under capture"
        );
        let seed = agreed_seed();
        let mut errors = Vec::new();
        let bad = replay_all_reduce(
            env,
            &graph,
            (&send, &recv),
            (dtype, op, count),
            seed,
            5,
            &mut errors,
        );
        EXPECT_EQ!(bad, 0, "replays of the fallback: {}", errors.join("; "));
    }
);

/// Capture one call of every algorithm of `kind` (after a warm-up call outside capture) and
/// replay it with fresh data.
fn graph_replay(kind: CollectiveKind) {
    if !is_gpu_build() {
        SKIP!("graph capture needs a GPU build: the host backend completes every call before it returns");
    }
    let env = coll_env();
    let Some(stream) = env.stream.as_ref() else {
        SKIP!("no stream")
    };
    let n = env.coll.nranks();
    let (dtype, op, count) = (DataType::F32, ReduceOp::Sum, 3003);
    let seed = agreed_seed();
    for algo in super::coll_common::single_node_algorithms(kind)
        .into_iter()
        .filter(|a| (*a == "copy") == (n == 1))
        .filter(|a| !a.starts_with("nvls_") || mscclpp::nvls_usable(env.device).is_ok())
    {
        ok!(env.coll.force_algorithm(kind, Some(algo)), "forcing {algo}");
        let (ins, outs) = match kind {
            CollectiveKind::AllGather => (count, n * count),
            CollectiveKind::ReduceScatter => (n * count, count),
            _ => (count, count),
        };
        let size = dtype.size_in_bytes();
        let send = poisoned(env.device, ins * size);
        let recv = poisoned(env.device, outs * size);
        let root = n - 1;
        let st = env.raw_stream();
        // SAFETY: the buffers live until the end of this iteration, after the last sync.
        let launch = || unsafe {
            let (s, r) = (send.data(), recv.data());
            match kind {
                CollectiveKind::AllGather => env.coll.all_gather(s, r, count, dtype, st),
                CollectiveKind::ReduceScatter => {
                    env.coll.reduce_scatter(s, r, count, dtype, op, st)
                }
                CollectiveKind::Broadcast => env.coll.broadcast(s, r, count, dtype, root, st),
                CollectiveKind::AllReduce => env.coll.all_reduce(s, r, count, dtype, op, st),
            }
        };
        ok!(launch(), "{algo} warm-up");
        ok!(env.sync(), "warm-up sync");
        ok!(Gpu::begin_capture(stream), "beginning the capture");
        let r = launch();
        let graph = Gpu::end_capture(stream);
        ok!(r, "{algo} under capture");
        let graph = ok!(graph, "ending the capture");
        let (rank, mut bad, mut errors) = (env.coll.rank(), 0, Vec::new());
        for replay in 0..10u32 {
            let vals = all_values(dtype, op, seed, replay, n, ins);
            write_values(&send, 0, dtype, &vals[rank]);
            ok!(Gpu::launch_graph(&graph, stream), "replaying");
            ok!(env.sync(), "waiting for the replay");
            let mut got = vec![0u8; outs * size];
            ok!(recv.copy_to_host(0, &mut got), "reading");
            bad += compare(
                dtype,
                &got,
                0,
                |i| match kind {
                    CollectiveKind::AllGather => vals[i / count][i % count],
                    CollectiveKind::Broadcast => vals[root][i],
                    _ => {
                        let at = if kind == CollectiveKind::ReduceScatter {
                            rank * count + i
                        } else {
                            i
                        };
                        let column: Vec<f64> = vals.iter().map(|v| v[at]).collect();
                        reference(dtype, op, &column)
                    }
                },
                &mut errors,
            );
        }
        EXPECT_EQ!(
            bad,
            0,
            "{kind} {algo}: mismatches over 10 replays: {}",
            errors.join("; ")
        );
    }
    ok!(env.coll.force_algorithm(kind, None), "un-forcing");
}

TEST!(CollectivesGraphTest, AllGather, |_ctx| graph_replay(
    CollectiveKind::AllGather
));
TEST!(CollectivesGraphTest, ReduceScatter, |_ctx| graph_replay(
    CollectiveKind::ReduceScatter
));
TEST!(CollectivesGraphTest, Broadcast, |_ctx| graph_replay(
    CollectiveKind::Broadcast
));

// Issue 28 (selector): the default choice takes the first preferred algorithm whose own check
// passes, so a size the first preference's scratch cannot hold runs the next one.
TEST!(
    CollectivesSmallScratchTest,
    DefaultChoiceFitsTheScratch,
    |_ctx| {
        let env = small_env();
        if env.coll.nranks() == 1 {
            SKIP!("world size 1 always copies");
        }
        let seed = agreed_seed();
        let mut call = 1000u32;
        let (dtype, op) = (DataType::I32, ReduceOp::Sum);
        // The 1 MiB case spans 64 chunks of the small scratch: not at scale (coll_common).
        let sizes: &[usize] = if super::coll_common::at_scale(env.coll.nranks()) {
            &[1 << 10, 8 << 10, 64 << 10]
        } else {
            &[1 << 10, 8 << 10, 16 << 10, 64 << 10, (1 << 20) + 16]
        };
        for kind in CollectiveKind::ALL {
            for &bytes in sizes {
                let count = bytes / dtype.size_in_bytes();
                let probe = mscclpp::collectives::Call {
                    kind,
                    send: 1,
                    recv: 1,
                    count,
                    dtype,
                    op,
                    root: 0,
                };
                let chosen = env.coll.choose(&probe);
                EXPECT_TRUE!(
                chosen.is_ok(),
                "{kind} of {bytes} bytes on a {SMALL_SCRATCH}-byte scratch: the default choice \
                 takes an algorithm that fits: {:?}",
                chosen.as_ref().err()
            );
                let (bad, _root, errors) =
                    next_call(env, kind, dtype, op, false, count, seed, &mut call);
                EXPECT_EQ!(
                    bad,
                    0,
                    "{kind} of {bytes} bytes ({}): {errors}",
                    chosen.map(|c| c.name()).unwrap_or("none")
                );
            }
        }
    }
);
