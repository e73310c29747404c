//! Issue 28: zero-copy all-gather, reduce-scatter and broadcast, and the eager per-call cost.
//! * ZeroCopyTest.GatherScatterBroadcastByDefault: on buffers registered on every rank
//!   (`Collectives::choose_registered`) the default choice of all-gather, reduce-scatter and
//!   broadcast is `packet` up to each collective's `selector::packet_max_bytes`, then
//!   `zero_copy` above `ZERO_COPY_MIN_BYTES` per rank (`fullmesh` between), its
//!   buffers are mapped on every rank (the cache holds them), and the results are exact
//!   (integers), in and out of place, odd sizes, every root;
//! * ZeroCopyTest.SmallerCallAtTheSameAddressHitsTheCache: a call on the start of a buffer
//!   registered at a larger size before uses that registration, under graph capture too (the
//!   cause of nccl-tests `-R 1` copying at every size but its largest);
//! * ZeroCopyTest.CallsInsideARegistrationAreViews: all-reduce, all-gather and reduce-scatter
//!   further inside buffers registered at their start (as nccl-tests moves its buffers through
//!   the registered range call by call): at the same offset on every rank a view of the
//!   registration, also when first met under graph capture, exact; at offsets that differ
//!   between the ranks no view (copying under capture, a registration of its own outside);
//! * ZeroCopyTest.DeclaredBuffersAreRegisteredWhole: buffers declared with
//!   `Collectives::register_buffer` (as `ncclCommRegister` does) are registered whole at the
//!   first miss, so a reduce-scatter in place further inside the receive buffer (nccl-tests
//!   `-R 1`: its input lies in a range no out-of-place call registered) is a view when first met
//!   under graph capture, exact; ranks that declared different numbers of buffers drop them
//!   alike and register call by call, exact;
//! * ZeroCopyTest.UnexportableBuffersFallBackAlike (host backend): private memory cannot be
//!   mapped by the peers; every rank falls back to `fullmesh` inside `zero_copy`, exact;
//! * CollectivesEagerTest.DriverCallsPerCall (GPU builds): the GPU driver calls one eager
//!   all-reduce (1 KiB, not registered: at most 2) and one zero-copy all-gather (at most 4) make
//!   on the calling thread, once warmed up.

use mscclpp::collectives::selector::{packet_max_bytes, zero_copy_from_bytes, ZERO_COPY_MIN_BYTES};
use mscclpp::collectives::{Call, CollectiveKind, DataType, ReduceOp};
use mscclpp::GpuBuffer;
use mscclpp_framework::*;

use super::coll_common::*;
use super::memory_channel::common::{is_gpu_build, ok};

/// i32 per rank of `kind` on `n` ranks above which the registered default choice is
/// zero-copy (`selector::zero_copy_from_bytes`).
fn zero_copy_floor(kind: CollectiveKind, n: usize) -> usize {
    zero_copy_from_bytes(kind, n) / 4
}

/// Elements of `kind`'s input and output for a per-rank `count` on `n` ranks.
fn extents(kind: CollectiveKind, count: usize, n: usize) -> (usize, usize) {
    match kind {
        CollectiveKind::AllReduce | CollectiveKind::Broadcast => (count, count),
        CollectiveKind::AllGather => (count, n * count),
        CollectiveKind::ReduceScatter => (n * count, count),
    }
}

/// One call of `kind` on `count` i32 (per rank) through the registered choice on the buffers
/// `a` (input, and output in place) and `b` (output out of place), both used from element
/// `shift` on: the algorithm's name and the wrong elements (the first few described in
/// `errors`).
#[allow(clippy::too_many_arguments)] // one call: kind, buffers, placement, size, root, data
fn registered_call(
    kind: CollectiveKind,
    (a, b, shift): (&GpuBuffer<u8>, &GpuBuffer<u8>, usize),
    op: ReduceOp,
    in_place: bool,
    count: usize,
    root: usize,
    (seed, call): (u64, u32),
    errors: &mut Vec<String>,
) -> (&'static str, usize) {
    let env = coll_env();
    let dtype = DataType::I32;
    let (rank, n) = (env.coll.rank(), env.coll.nranks());
    let size = dtype.size_in_bytes();
    let (ins, outs) = extents(kind, count, n);
    let (mine, cols) = if kind == CollectiveKind::ReduceScatter {
        let window = rank * count;
        (
            rank_values(dtype, op, seed, call, rank, ins),
            values_in(dtype, op, seed, call, n, window..window + count),
        )
    } else {
        let all = all_values(dtype, op, seed, call, n, ins);
        (all[rank].clone(), all)
    };
    let recv = if in_place { a } else { b };
    let send_at = shift
        + match (kind, in_place) {
            (CollectiveKind::AllGather, true) => rank * count,
            _ => 0,
        };
    write_values(a, send_at, dtype, &mine);
    let recv_at = shift
        + match (kind, in_place) {
            (CollectiveKind::ReduceScatter, true) => rank * count,
            _ => 0,
        };
    let c = Call {
        kind,
        send: a.data() + (send_at * size) as u64,
        recv: recv.data() + (recv_at * size) as u64,
        count,
        dtype,
        op,
        root,
    };
    let choice = ok!(env.coll.choose_registered(&c), "choosing {kind}");
    // SAFETY: both buffers hold the call's extents and live until after the sync.
    let r = unsafe { env.coll.run_choice(&choice, env.raw_stream()) };
    ok!(r, "{kind} of {count} i32 ({op})");
    ok!(env.sync(), "waiting for the stream");
    let mut got = vec![0u8; outs * size];
    ok!(
        recv.copy_to_host(recv_at * size, &mut got),
        "reading the result"
    );
    let mut column = vec![0.0; n];
    let bad = compare(
        dtype,
        &got,
        0,
        |i| match kind {
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter => {
                for (r, c) in column.iter_mut().enumerate() {
                    *c = cols[r][i];
                }
                reference(dtype, op, &column)
            }
            CollectiveKind::AllGather => cols[i / count][i % count],
            CollectiveKind::Broadcast => cols[root][i],
        },
        errors,
    );
    (choice.name(), bad)
}

TEST!(ZeroCopyTest, GatherScatterBroadcastByDefault, |_ctx| {
    let env = coll_env();
    let n = env.coll.nranks();
    if n == 1 {
        SKIP!("world size 1 always copies");
    }
    let seed = agreed_seed();
    // i32 per rank: packet up to each collective's packet_max_bytes, then zero_copy above
    // ZERO_COPY_MIN_BYTES (256 KiB), fullmesh between.
    let counts: &[usize] = if at_scale(n) {
        &[7, 65_537]
    } else {
        &[1, 4099, 65_537, 100_003, (1 << 18) + 3]
    };
    let mut call = 0u32;
    for kind in [
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::Broadcast,
    ] {
        let (op, roots) = match kind {
            CollectiveKind::Broadcast => (ReduceOp::Sum, (0..n).collect::<Vec<_>>()),
            CollectiveKind::ReduceScatter => (ReduceOp::Max, vec![0]),
            _ => (ReduceOp::Sum, vec![0]),
        };
        for &count in counts {
            let (ins, outs) = extents(kind, count, n);
            let want = if count * 4 <= packet_max_bytes(kind, n) {
                "packet"
            } else if count * 4 > ZERO_COPY_MIN_BYTES {
                "zero_copy"
            } else {
                "fullmesh"
            };
            // One pair of buffers per size, reused: registered at the first call, hits after.
            let (a, b) = buffers(env.device, ins.max(outs) * 4);
            for in_place in [false, true] {
                for &root in &roots {
                    call += 1;
                    let mut errors = Vec::new();
                    let (name, bad) = registered_call(
                        kind,
                        (&a, &b, 0),
                        op,
                        in_place,
                        count,
                        root,
                        (seed, call),
                        &mut errors,
                    );
                    let what = format!(
                        "{kind} of {count} i32, {}, root {root}",
                        if in_place { "in place" } else { "out of place" }
                    );
                    EXPECT_EQ!(name, want, "{what}: the registered default choice");
                    EXPECT_EQ!(bad, 0, "{what}: {}", errors.join("; "));
                }
            }
            // The buffer the peers touch is mapped on every rank (zero-copy ran, no fallback).
            let res = env.coll.resources();
            if want != "zero_copy" {
                continue;
            }
            let shared = match kind {
                CollectiveKind::ReduceScatter => (a.data(), ins * 4),
                _ => (b.data(), outs * 4),
            };
            let cached = ok!(
                res.user_buffers().get_or_register(
                    res.comm(),
                    res.device(),
                    shared.0,
                    shared.1,
                    true
                ),
                "querying the cache"
            );
            EXPECT_TRUE!(
                cached.is_some(),
                "{kind} of {count}: the shared buffer is mapped on every rank"
            );
            res.user_buffers().forget(a.data(), a.bytes());
            res.user_buffers().forget(b.data(), b.bytes());
        }
    }
});

TEST!(
    ZeroCopyTest,
    SmallerCallAtTheSameAddressHitsTheCache,
    |_ctx| {
        let env = coll_env();
        let n = env.coll.nranks();
        if n == 1 {
            SKIP!("world size 1 always copies");
        }
        let seed = agreed_seed();
        // i32 per rank; the smaller call below still takes zero_copy.
        let floor = zero_copy_floor(CollectiveKind::AllGather, n);
        let big = 3 * floor;
        let (a, b) = buffers(env.device, n * big * 4);
        let res = env.coll.resources();
        let before = res.user_buffers().len();
        let mut errors = Vec::new();
        let kind = CollectiveKind::AllGather;
        let (_, bad) = registered_call(
            kind,
            (&a, &b, 0),
            ReduceOp::Sum,
            false,
            big,
            0,
            (seed, 1),
            &mut errors,
        );
        EXPECT_EQ!(bad, 0, "the large call: {}", errors.join("; "));
        EXPECT_EQ!(
            res.user_buffers().len(),
            before + 1,
            "the output is registered at the large call"
        );
        // A smaller size at the same address, as under capture (no collective registration
        // allowed): the larger registration is a hit.
        let small = floor + 5;
        let hit = ok!(
            res.user_buffers().get_or_register(
                res.comm(),
                res.device(),
                b.data(),
                n * small * 4,
                true
            ),
            "querying the cache as under capture"
        );
        EXPECT_TRUE!(
            hit.is_some(),
            "a smaller call at the same address uses the larger registration"
        );
        EXPECT_TRUE!(
            res.user_buffers().lookup(b.data(), n * small * 4).is_some(),
            "lookup finds it too"
        );
        EXPECT_TRUE!(
            res.user_buffers().lookup(b.data() + 64, 16).is_none(),
            "another start address is no hit"
        );
        let mut errors = Vec::new();
        let (name, bad) = registered_call(
            kind,
            (&a, &b, 0),
            ReduceOp::Sum,
            false,
            small,
            0,
            (seed, 2),
            &mut errors,
        );
        EXPECT_EQ!(name, "zero_copy");
        EXPECT_EQ!(bad, 0, "the smaller call: {}", errors.join("; "));
        EXPECT_EQ!(
            res.user_buffers().len(),
            before + 1,
            "no new registration for the smaller call"
        );
        res.user_buffers().forget(a.data(), a.bytes());
        res.user_buffers().forget(b.data(), b.bytes());
    }
);

TEST!(ZeroCopyTest, CallsInsideARegistrationAreViews, |_ctx| {
    let env = coll_env();
    let (rank, n) = (env.coll.rank(), env.coll.nranks());
    if n == 1 {
        SKIP!("world size 1 always copies");
    }
    let seed = agreed_seed();
    let res = env.coll.resources();
    let cache = res.user_buffers();
    let mut call = 0u32;
    // i32 per rank, each above its collective's zero-copy threshold (all-reduce: 1 MiB in all).
    // At scale the all-reduce alone (the all-gather's and reduce-scatter's ranges grow with the
    // ranks: 12 MiB per rank at 16 ranks).
    let kinds = if at_scale(n) { 1 } else { 3 };
    for (kind, count, want) in [
        (
            CollectiveKind::AllReduce,
            zero_copy_floor(CollectiveKind::AllReduce, n) + 3,
            "rsag_zero_copy",
        ),
        (
            CollectiveKind::AllGather,
            zero_copy_floor(CollectiveKind::AllGather, n) + 9,
            "zero_copy",
        ),
        (
            CollectiveKind::ReduceScatter,
            zero_copy_floor(CollectiveKind::ReduceScatter, n) + 9,
            "zero_copy",
        ),
    ]
    .into_iter()
    .take(kinds)
    {
        let (ins, outs) = extents(kind, count, n);
        let slot = ins.max(outs);
        // Room for three calls one after the other (nccl-tests moves its buffers through the
        // registered range call by call) and a small shift of odd ranks in the third.
        const ODD: usize = 16;
        let room = 3 * slot + 4 * ODD;
        let (a, b) = buffers(env.device, room * 4);
        // The buffer the peers touch (all-reduce: both; checked through the output).
        let peers_touch = |shift: usize| match kind {
            CollectiveKind::ReduceScatter => (a.data() + (shift * 4) as u64, ins * 4),
            _ => (b.data() + (shift * 4) as u64, outs * 4),
        };
        let mut run = |count: usize, shift: usize, what: &str| {
            call += 1;
            let mut errors = Vec::new();
            let (name, bad) = registered_call(
                kind,
                (&a, &b, shift),
                ReduceOp::Sum,
                false,
                count,
                0,
                (seed, call),
                &mut errors,
            );
            EXPECT_EQ!(name, want, "{kind} {what}: the registered choice");
            EXPECT_EQ!(bad, 0, "{kind} {what}: {}", errors.join("; "));
        };
        // The first call, over the whole range, registers the buffers (nccl-tests warms up
        // at its largest size).
        let whole = match kind {
            CollectiveKind::AllReduce => room,
            _ => room / n,
        };
        run(whole, 0, "over the whole range");
        let before = cache.len();
        // A call further in, at the same offset on every rank, first met under capture (no
        // registration allowed): a view of the registration, agreed by host traffic alone.
        let (p, len) = peers_touch(slot);
        let view = ok!(
            cache.get_or_register(res.comm(), res.device(), p, len, true),
            "querying the cache as under capture"
        );
        match &view {
            Some(v) => {
                EXPECT_EQ!(v.offset, (slot * 4) as u64, "{kind}: the view's offset");
                EXPECT_EQ!(v.bases[rank], p, "{kind}: the own address of the view");
            }
            None => FAIL!("{kind}: a call inside the registration at one offset is a view"),
        }
        run(count, slot, "one slot further in (a view)");
        EXPECT_TRUE!(
            cache.len() <= before + 2,
            "{kind}: the call further in adds views only (send and receive), got {} entries \
             after {before}",
            cache.len()
        );
        // At an offset that differs between the ranks (odd ranks ODD elements further): no
        // view (every rank alike), under capture the copying algorithm; outside capture a
        // registration of its own.
        let odd = 2 * slot + (rank % 2) * ODD;
        let (p, len) = peers_touch(odd);
        let miss = ok!(
            cache.get_or_register(res.comm(), res.device(), p, len, true),
            "querying the cache as under capture"
        );
        EXPECT_TRUE!(
            miss.is_none(),
            "{kind}: offsets that differ between the ranks make no view"
        );
        run(count, odd, "at offsets that differ between the ranks");
        res.user_buffers().forget(a.data(), a.bytes());
        res.user_buffers().forget(b.data(), b.bytes());
    }
});

TEST!(ZeroCopyTest, DeclaredBuffersAreRegisteredWhole, |_ctx| {
    let env = coll_env();
    let (rank, n) = (env.coll.rank(), env.coll.nranks());
    if n == 1 {
        SKIP!("world size 1 always copies");
    }
    let seed = agreed_seed();
    let res = env.coll.resources();
    let cache = res.user_buffers();
    let kind = CollectiveKind::ReduceScatter;
    let count = zero_copy_floor(kind, n) + 9;
    let (ins, _) = extents(kind, count, n);
    // Two slots each, as nccl-tests' send and receive ranges; fresh (no registration of an
    // earlier test inside them).
    let (send, recv) = (
        poisoned(env.device, 2 * ins * 4),
        poisoned(env.device, 2 * ins * 4),
    );
    let before = cache.pending();
    env.coll.register_buffer(send.data(), send.bytes());
    env.coll.register_buffer(recv.data(), recv.bytes());
    EXPECT_EQ!(cache.pending(), before + 2, "two declarations pending");
    let mut call = 0u32;
    let mut run = |bufs: (&GpuBuffer<u8>, &GpuBuffer<u8>, usize), in_place: bool, what: &str| {
        call += 1;
        let mut errors = Vec::new();
        let (name, bad) = registered_call(
            kind,
            bufs,
            ReduceOp::Sum,
            in_place,
            count,
            0,
            (seed, call),
            &mut errors,
        );
        EXPECT_EQ!(name, "zero_copy", "{what}: the registered choice");
        EXPECT_EQ!(bad, 0, "{what}: {}", errors.join("; "));
    };
    // Out of place at the start of both: the first miss registers both declared buffers whole.
    run((&send, &recv, 0), false, "out of place");
    EXPECT_EQ!(
        cache.pending(),
        0,
        "the declared buffers are registered at the first miss"
    );
    // In place one slot into the receive buffer: its input (every rank's whole input) lies
    // where no call read before. First met under capture: a view of the receive buffer's
    // registration.
    let p = recv.data() + (ins * 4) as u64;
    match ok!(
        cache.get_or_register(res.comm(), res.device(), p, ins * 4, true),
        "querying the cache as under capture"
    ) {
        Some(v) => {
            EXPECT_EQ!(v.offset, (ins * 4) as u64, "the view's offset");
            EXPECT_EQ!(v.bases[rank], p, "the own address of the view");
        }
        None => FAIL!("a call inside a declared buffer is a view of its registration"),
    }
    run(
        (&recv, &send, ins),
        true,
        "in place, one slot into the receive buffer",
    );
    // Ranks that declared different numbers of buffers (rank 0 one more) drop them alike at
    // the next miss; the call registers its own buffers and stays exact.
    let extra = poisoned(env.device, 4096);
    if rank == 0 {
        env.coll.register_buffer(extra.data(), extra.bytes());
    }
    // Fresh buffers (`buffers` hands out the same two every time).
    let (s2, r2) = (poisoned(env.device, ins * 4), poisoned(env.device, ins * 4));
    run(
        (&s2, &r2, 0),
        false,
        "after declarations that differ between the ranks",
    );
    EXPECT_EQ!(
        cache.pending(),
        0,
        "declarations that differ between the ranks are dropped on every rank"
    );
    for b in [&send, &recv, &s2, &r2] {
        env.coll.deregister_buffer(b.data(), b.bytes());
    }
});

TEST!(ZeroCopyTest, UnexportableBuffersFallBackAlike, |_ctx| {
    let env = coll_env();
    let n = env.coll.nranks();
    if n == 1 {
        SKIP!("world size 1 always copies");
    }
    if is_gpu_build() {
        SKIP!("private host memory is no device memory: the host backend's case");
    }
    let count = zero_copy_floor(CollectiveKind::AllGather, n) + 1001;
    let seed = agreed_seed();
    let rank = env.coll.rank();
    let all = all_values(DataType::I32, ReduceOp::Sum, seed, 7, n, count);
    let send: Vec<i32> = all[rank].iter().map(|&v| v as i32).collect();
    let mut recv = vec![0i32; n * count];
    let c = Call {
        kind: CollectiveKind::AllGather,
        send: send.as_ptr() as u64,
        recv: recv.as_mut_ptr() as u64,
        count,
        dtype: DataType::I32,
        op: ReduceOp::Sum,
        root: 0,
    };
    let choice = ok!(env.coll.choose_registered(&c), "choosing");
    EXPECT_EQ!(
        choice.name(),
        "zero_copy",
        "chosen, then falling back inside"
    );
    // SAFETY: both vectors hold the call's extents and outlive the (synchronous) call.
    let r = unsafe { env.coll.run_choice(&choice, 0) };
    ok!(r, "all-gather on private memory");
    let bad = (0..n * count)
        .filter(|&i| recv[i] != all[i / count][i % count] as i32)
        .count();
    EXPECT_EQ!(bad, 0, "the fallback's results");
    let res = env.coll.resources();
    let cached = ok!(
        res.user_buffers().get_or_register(
            res.comm(),
            res.device(),
            recv.as_ptr() as u64,
            n * count * 4,
            true
        ),
        "querying the cache"
    );
    EXPECT_TRUE!(cached.is_none(), "cached as not registrable on every rank");
});

TEST!(CollectivesEagerTest, DriverCallsPerCall, |_ctx| {
    if !is_gpu_build() {
        SKIP!("counts GPU driver calls; the host backend makes none");
    }
    let env = coll_env();
    let n = env.coll.nranks();
    let calls = 50u64;
    let count = 256; // 1 KiB of i32
                     // Room for the all-gather below (zero_copy): n blocks of its floor + 16 bytes.
    let ag_count = zero_copy_floor(CollectiveKind::AllGather, n) + 4;
    let (a, b) = buffers(env.device, n * ag_count * 4);
    let st = env.raw_stream();
    let all_reduce = || {
        // SAFETY: both buffers hold count i32 and live until after the sync below.
        let r = unsafe {
            env.coll
                .all_reduce(a.data(), b.data(), count, DataType::I32, ReduceOp::Sum, st)
        };
        ok!(r, "all-reduce");
    };
    all_reduce();
    ok!(env.sync(), "waiting");
    let before = mscclpp_hal::auxil::driver_calls_on_this_thread();
    for _ in 0..calls {
        all_reduce();
    }
    let per = (mscclpp_hal::auxil::driver_calls_on_this_thread() - before) as f64 / calls as f64;
    ok!(env.sync(), "waiting");
    println!(
        "[rank {}] eager all-reduce of 1 KiB at {n} ranks: {per} driver calls per call",
        env.coll.rank()
    );
    // Context bind + the launch (at world size 1 the copy kernel's, or the driver's copy).
    EXPECT_LE!(per, 2.0, "driver calls per eager all-reduce");
    if n == 1 {
        return;
    }
    let c = Call {
        kind: CollectiveKind::AllGather,
        send: a.data(),
        recv: b.data(),
        count: ag_count,
        dtype: DataType::I32,
        op: ReduceOp::Sum,
        root: 0,
    };
    let choice = ok!(env.coll.choose_registered(&c), "choosing");
    EXPECT_EQ!(choice.name(), "zero_copy");
    // SAFETY: as above (b holds n * ag_count i32).
    let r = unsafe { env.coll.run_choice(&choice, st) };
    ok!(r, "all-gather");
    ok!(env.sync(), "waiting");
    let before = mscclpp_hal::auxil::driver_calls_on_this_thread();
    for _ in 0..calls {
        // SAFETY: as above.
        let r = unsafe { env.coll.run_choice(&choice, st) };
        ok!(r, "all-gather");
    }
    let per = (mscclpp_hal::auxil::driver_calls_on_this_thread() - before) as f64 / calls as f64;
    ok!(env.sync(), "waiting");
    println!(
        "[rank {}] zero-copy all-gather of {} bytes per rank: {per} driver calls per call",
        env.coll.rank(),
        ag_count * 4
    );
    // Context bind and launch (the cache answers without the capture query).
    EXPECT_LE!(per, 4.0, "driver calls per registered all-gather");
    let res = env.coll.resources();
    res.user_buffers().forget(b.data(), b.bytes());
});
