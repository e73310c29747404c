//! AllReduceTest: every all-reduce algorithm x data type x op x in/out of place x sizes that
//! are not multiples of the vector width or the rank count, against a host reference (exact
//! for integers); outputs poisoned with a guard zone; 1000 repeated calls with changing data
//! (100 above `coll_common::FULL_MATRIX_MAX_RANKS` ranks);
//! a CUDA-graph capture + replay test (GPU only); argument errors.

use mscclpp::collectives::{CollectiveKind, DataType, ReduceOp};
use mscclpp_framework::*;
use mscclpp_hal::{Gpu, StreamInterop};

use super::coll_common::*;
use super::coll_matrix::{matrix, one_call};
use super::memory_channel::common::{is_gpu_build, ok};
use crate::world::mp_env;

const AR: CollectiveKind = CollectiveKind::AllReduce;

/// One all-reduce (see `coll_matrix::one_call`).
fn one_ar(
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    count: usize,
    seed: u64,
    call: u32,
    errors: &mut Vec<String>,
) -> usize {
    one_call(AR, dtype, op, in_place, count, 0, seed, call, errors)
}

fn algo_test(_ctx: &TestContext, algo: &str) {
    matrix(AR, algo)
}

TEST!(AllReduceTest, Copy, |ctx| algo_test(ctx, "copy"));
TEST!(AllReduceTest, AllpairPacket, |ctx| algo_test(
    ctx,
    "allpair_packet"
));
TEST!(AllReduceTest, Packet, |ctx| algo_test(ctx, "packet"));
TEST!(AllReduceTest, Rsag, |ctx| algo_test(ctx, "rsag"));
TEST!(AllReduceTest, RsagPipeline, |ctx| algo_test(
    ctx,
    "rsag_pipeline"
));
TEST!(AllReduceTest, RsagPortChannel, |ctx| algo_test(
    ctx,
    "rsag_port_channel"
));
TEST!(AllReduceTest, RsagZeroCopy, |ctx| algo_test(
    ctx,
    "rsag_zero_copy"
));

TEST!(AllReduceTest, RepeatedCalls, |ctx| {
    let env = coll_env();
    let _ = ctx;
    let seed = agreed_seed();
    let algos: Vec<&str> = super::coll_common::single_node_algorithms(CollectiveKind::AllReduce)
        .into_iter()
        .filter(|a| (*a == "copy") == (env.coll.nranks() == 1))
        .filter(|a| !a.starts_with("nvls_") || mscclpp::nvls_usable(env.device).is_ok())
        .collect();
    let cases = [
        (DataType::I32, 1023usize),
        (DataType::F16, 7),
        (DataType::I32, 4099),
    ];
    let mut bad_total = 0;
    let mut errors = Vec::new();
    let calls = super::coll_common::repeated_calls(env.coll.nranks());
    for call in 0..calls {
        let algo = algos[call as usize % algos.len()];
        ok!(
            env.coll
                .force_algorithm(CollectiveKind::AllReduce, Some(algo)),
            "forcing {algo}"
        );
        let (dtype, count) = cases[(call as usize / algos.len()) % cases.len()];
        bad_total += one_ar(
            dtype,
            ReduceOp::Sum,
            call % 2 == 1,
            count,
            seed,
            call,
            &mut errors,
        );
    }
    ok!(
        env.coll.force_algorithm(CollectiveKind::AllReduce, None),
        "un-forcing"
    );
    EXPECT_EQ!(
        bad_total,
        0,
        "mismatches over {calls} calls ({:?}): {}",
        algos,
        errors.join("; ")
    );
});

TEST!(AllReduceTest, GraphReplay, |ctx| {
    let _ = ctx;
    if !is_gpu_build() {
        SKIP!("graph capture needs a GPU build: the host backend completes every call before it returns");
    }
    let env = coll_env();
    let Some(stream) = env.stream.as_ref() else {
        SKIP!("no stream")
    };
    let seed = agreed_seed();
    let (dtype, op) = (DataType::F16, ReduceOp::Sum);
    let algos: Vec<&str> = super::coll_common::single_node_algorithms(CollectiveKind::AllReduce)
        .into_iter()
        .filter(|a| (*a == "copy") == (env.coll.nranks() == 1))
        .filter(|a| !a.starts_with("nvls_") || mscclpp::nvls_usable(env.device).is_ok())
        .collect();
    for algo in algos {
        ok!(
            env.coll
                .force_algorithm(CollectiveKind::AllReduce, Some(algo)),
            "forcing {algo}"
        );
        let count = 1023;
        let bytes = count * dtype.size_in_bytes();
        let send = poisoned(env.device, bytes);
        let recv = poisoned(env.device, bytes);
        // Seen once outside capture (registration, kernels loaded), then captured.
        ok!(
            // SAFETY: buffers live until the end of this scope, after the final sync.
            unsafe {
                env.coll
                    .all_reduce(send.data(), recv.data(), count, dtype, op, env.raw_stream())
            },
            "warm-up"
        );
        ok!(env.sync(), "warm-up sync");
        ok!(Gpu::begin_capture(stream), "beginning the capture");
        // SAFETY: as above.
        let r = unsafe {
            env.coll
                .all_reduce(send.data(), recv.data(), count, dtype, op, env.raw_stream())
        };
        let graph = Gpu::end_capture(stream);
        ok!(r, "all_reduce under capture");
        let graph = ok!(graph, "ending the capture");
        let mut errors = Vec::new();
        let bad = replay_all_reduce(
            env,
            &graph,
            (&send, &recv),
            (dtype, op, count),
            seed,
            20,
            &mut errors,
        );
        EXPECT_EQ!(
            bad,
            0,
            "{algo}: mismatches over 20 replays: {}",
            errors.join("; ")
        );
    }
    ok!(
        env.coll.force_algorithm(CollectiveKind::AllReduce, None),
        "un-forcing"
    );
});

TEST!(AllReduceTest, BadArguments, |ctx| {
    let _ = ctx;
    let env = coll_env();
    let e = env
        .coll
        .force_algorithm(CollectiveKind::AllReduce, Some("no_such_algo"));
    match e {
        Err(e) => {
            let m = e.to_string();
            EXPECT_TRUE!(
                m.contains("no_such_algo") && m.contains("allpair_packet"),
                "message lists the valid names: {m}"
            );
        }
        Ok(()) => FAIL!("an unknown algorithm name was accepted"),
    }
    // SAFETY: null buffers are refused before anything touches them.
    let r = unsafe {
        env.coll
            .all_reduce(0, 0, 4, DataType::F32, ReduceOp::Sum, env.raw_stream())
    };
    EXPECT_TRUE!(r.is_err(), "null buffers are refused");
    // SAFETY: refused before any access (the count overflows).
    let r = unsafe {
        env.coll.all_reduce(
            8,
            8,
            usize::MAX / 2,
            DataType::F32,
            ReduceOp::Sum,
            env.raw_stream(),
        )
    };
    EXPECT_TRUE!(r.is_err(), "an overflowing count is refused");
    // SAFETY: refused before any access (bad root).
    let r = unsafe {
        env.coll
            .broadcast(8, 8, 1, DataType::U8, env.coll.nranks(), env.raw_stream())
    };
    EXPECT_TRUE!(r.is_err(), "a root outside the world is refused");
    // Count 0 is a no-op that touches nothing.
    // SAFETY: nothing is accessed for count 0.
    let r = unsafe {
        env.coll
            .all_reduce(8, 8, 0, DataType::F32, ReduceOp::Sum, env.raw_stream())
    };
    EXPECT_TRUE!(r.is_ok(), "count 0 is a no-op");
});

TEST!(AllReduceTest, UserBufferRegistration, |_ctx| {
    let env = coll_env();
    let res = env.coll.resources();
    let (rank, n) = (env.coll.rank(), env.coll.nranks());
    let cache = res.user_buffers();
    let buf: mscclpp::GpuBuffer<u64> = ok!(mscclpp::GpuBuffer::new(env.device, 16), "allocating");
    ok!(
        buf.copy_from_host(0, &[0xC0DE_0000 + rank as u64]),
        "writing"
    );
    let before = cache.len();
    let reg = ok!(
        cache.get_or_register(res.comm(), env.device, buf.data(), buf.bytes(), false),
        "registering a library allocation"
    );
    let Some(reg) = reg else {
        FAIL!("a GpuBuffer could not be registered for zero-copy")
    };
    EXPECT_EQ!(reg.bases.len(), n);
    EXPECT_EQ!(reg.bases[rank], buf.data());
    ok!(mp_env().bootstrap.barrier(), "barrier");
    if !is_gpu_build() {
        // Host backend: the peers' mappings are host addresses of the same memfd pages.
        for (p, base) in reg.bases.iter().enumerate() {
            // SAFETY: `base` maps rank p's live 16-element buffer (kept alive by the entry).
            let v = unsafe { (*base as usize as *const u64).read_volatile() };
            EXPECT_EQ!(
                v,
                0xC0DE_0000 + p as u64,
                "rank {p}'s buffer seen through its mapping"
            );
        }
    }
    // A second lookup hits the cache (no traffic, same entry).
    let again = ok!(
        cache.get_or_register(res.comm(), env.device, buf.data(), buf.bytes(), false),
        "looking up again"
    );
    EXPECT_TRUE!(again.is_some_and(|a| std::sync::Arc::ptr_eq(&a, &reg)));
    EXPECT_EQ!(cache.len(), before + 1);
    // A miss during capture registers nothing and talks to nobody.
    let other: mscclpp::GpuBuffer<u64> = ok!(mscclpp::GpuBuffer::new(env.device, 16), "allocating");
    let captured = ok!(
        cache.get_or_register(res.comm(), env.device, other.data(), other.bytes(), true),
        "lookup under capture"
    );
    EXPECT_TRUE!(captured.is_none(), "a miss under capture falls back");
    // Memory the library did not allocate cannot be registered: every rank falls back.
    let foreign = [0u64; 16];
    let r = ok!(
        cache.get_or_register(res.comm(), env.device, foreign.as_ptr() as u64, 128, false),
        "registering foreign memory"
    );
    EXPECT_TRUE!(
        r.is_none(),
        "foreign memory falls back to copying on every rank"
    );
    drop(reg);
    ok!(mp_env().bootstrap.barrier(), "barrier");
});
