//! The shared check of every collective: one call of any kind with fresh data, poisoned
//! outputs and a guard zone, checked against the host reference; and the matrix of one
//! algorithm over data types x ops x in/out of place x sizes (see `matrix` for the subset CI
//! runs; `MSCCLPP_COLL_TEST_EXHAUSTIVE=1` runs everything).

use mscclpp::collectives::{algorithm_names, find_algorithm, CollectiveKind, DataType, ReduceOp};
use mscclpp_framework::*;

use super::coll_common::*;
use super::memory_channel::common::ok;

/// Element counts every combination runs (not multiples of the vector width or rank count).
pub(crate) const SMALL: [usize; 4] = [1, 7, 1023, 4099];

/// Types that run every small size (one of each width, integer and float).
const REPRESENTATIVE: [DataType; 4] = [DataType::U8, DataType::F16, DataType::I32, DataType::F64];

/// Elements of the input and output of a `kind` call of `count` on `n` ranks.
fn extents(kind: CollectiveKind, count: usize, n: usize) -> (usize, usize) {
    match kind {
        CollectiveKind::AllReduce | CollectiveKind::Broadcast => (count, count),
        CollectiveKind::AllGather => (count, n * count),
        CollectiveKind::ReduceScatter => (n * count, count),
    }
}

/// One call of `kind` (`count` as the API means it; `root` for broadcast); returns the
/// mismatches (the guard zone counts as one).
#[allow(clippy::too_many_arguments)] // one call: kind, type, op, size, root, seed
pub(crate) fn one_call(
    kind: CollectiveKind,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    count: usize,
    root: usize,
    seed: u64,
    call: u32,
    errors: &mut Vec<String>,
) -> usize {
    one_call_on(
        coll_env(),
        kind,
        dtype,
        op,
        in_place,
        count,
        root,
        seed,
        call,
        errors,
    )
}

/// The next call of a test loop: counts it in `call`, takes root `call % nranks` and runs
/// [`one_call_on`]; returns the mismatches, the root and the errors joined by "; ".
#[allow(clippy::too_many_arguments)] // as one_call_on, with the call counter
pub(crate) fn next_call(
    env: &CollEnv,
    kind: CollectiveKind,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    count: usize,
    seed: u64,
    call: &mut u32,
) -> (usize, usize, String) {
    *call += 1;
    let root = *call as usize % env.coll.nranks();
    let mut errors = Vec::new();
    let bad = one_call_on(
        env,
        kind,
        dtype,
        op,
        in_place,
        count,
        root,
        seed,
        *call,
        &mut errors,
    );
    (bad, root, errors.join("; "))
}

/// [`one_call`] on the collectives of `env`.
#[allow(clippy::too_many_arguments)] // as one_call, plus the collectives it runs on
pub(crate) fn one_call_on(
    env: &CollEnv,
    kind: CollectiveKind,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    count: usize,
    root: usize,
    seed: u64,
    call: u32,
    errors: &mut Vec<String>,
) -> usize {
    let (rank, n) = (env.coll.rank(), env.coll.nranks());
    let size = dtype.size_in_bytes();
    let (ins, outs) = extents(kind, count, n);
    let (a, b) = buffers(env.device, ins.max(outs) * size);
    // `cols[r][i]`: rank r's input element i, for the elements this rank's output depends on
    // (a reduce-scatter rank's own window only).
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
    // Where the input goes and where the output is read.
    let (send, send_at, recv) = match (kind, in_place) {
        (_, false) => (&a, 0, &b),
        (CollectiveKind::AllGather, true) => (&a, rank * count, &a),
        (CollectiveKind::ReduceScatter, true) => (&a, 0, &a),
        (_, true) => (&a, 0, &a),
    };
    write_values(send, send_at, dtype, &mine);
    let s = send.data() + (send_at * size) as u64;
    let (r, recv_at) = match (kind, in_place) {
        (CollectiveKind::ReduceScatter, true) => {
            (recv.data() + (rank * count * size) as u64, rank * count)
        }
        _ => (recv.data(), 0),
    };
    let st = env.raw_stream();
    // SAFETY: the buffers hold every range used (+ guard) and live until after the sync.
    let res = unsafe {
        match kind {
            CollectiveKind::AllReduce => env.coll.all_reduce(s, r, count, dtype, op, st),
            CollectiveKind::AllGather => env.coll.all_gather(s, r, count, dtype, st),
            CollectiveKind::ReduceScatter => env.coll.reduce_scatter(s, r, count, dtype, op, st),
            CollectiveKind::Broadcast => env.coll.broadcast(s, r, count, dtype, root, st),
        }
    };
    ok!(res, "{kind} of {count} {dtype} ({op})");
    ok!(env.sync(), "waiting for the stream");
    let mut got = vec![0u8; outs * size];
    ok!(
        recv.copy_to_host(recv_at * size, &mut got),
        "reading the result"
    );
    let mut column = vec![0.0; n];
    let mut bad = compare(
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
    // The guard zone after the whole buffer that was written.
    let end = if in_place { ins.max(outs) } else { outs } * size;
    if !guard_intact(recv, end) {
        bad += 1;
        errors.push("the guard zone after the output was overwritten".into());
    }
    bad
}

/// The suite of a collective kind without its own tests (all-gather, reduce-scatter,
/// broadcast): the world-size-1 copy ([`matrix`]), [`every_registered`] algorithm and
/// [`repeated_calls_test`].
macro_rules! kind_suite {
    ($suite:ident, $kind:expr) => {
        use super::coll_matrix::{every_registered, matrix, repeated_calls_test};
        TEST!($suite, Copy, |_ctx| matrix($kind, "copy"));
        TEST!($suite, EveryRegisteredAlgorithm, |_ctx| every_registered(
            $kind
        ));
        TEST!($suite, RepeatedCalls, |_ctx| repeated_calls_test($kind));
    };
}
pub(crate) use kind_suite;

/// Every data type x op (reductions only) x in/out of place x size of `algo` for `kind`;
/// sizes beyond the algorithm's scratch (its `check` refuses them) are left out, and the
/// 1 MiB + 3 size runs for f32 and i32 sum only unless `MSCCLPP_COLL_TEST_EXHAUSTIVE=1`.
/// Above `FULL_MATRIX_MAX_RANKS` ranks a subset runs (see the loop).
pub(crate) fn matrix(kind: CollectiveKind, algo: &str) {
    let env = coll_env();
    let names = algorithm_names(kind);
    if !names.contains(&algo) {
        FAIL!("{kind} algorithm {algo} is not registered (registered: {names:?})");
    }
    if env.coll.nranks() == 1 && algo != "copy" {
        SKIP!("world size 1 always copies (the Copy test covers it)");
    }
    if env.coll.nranks() > 1 && algo == "copy" {
        SKIP!(
            "the copy is the world-size-1 algorithm; this world has {} ranks",
            env.coll.nranks()
        );
    }
    let a = ok!(find_algorithm(kind, algo), "finding {algo}");
    ok!(env.coll.force_algorithm(kind, Some(algo)), "forcing {algo}");
    let seed = agreed_seed();
    let reduces = matches!(
        kind,
        CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
    );
    let n = env.coll.nranks();
    // At scale (more than FULL_MATRIX_MAX_RANKS ranks, coll_common.rs) the representative
    // types with sum and avg (the one op that depends on the rank count) at 7 and 4099 elements.
    let scaled = at_scale(n);
    let ops: &[ReduceOp] = match (reduces, scaled) {
        (false, _) => &[ReduceOp::Sum],
        (true, false) => &ReduceOp::ALL,
        (true, true) => &[ReduceOp::Sum, ReduceOp::Avg],
    };
    let dtypes: &[DataType] = if scaled {
        &REPRESENTATIVE
    } else {
        &DataType::ALL
    };
    let mut call = 0u32;
    for &dtype in dtypes {
        for &op in ops {
            for in_place in [false, true] {
                // Every combination at 7 and 1023 elements; 1 and 4099 for a representative
                // set of types (all with MSCCLPP_COLL_TEST_EXHAUSTIVE=1), to keep CI short.
                let mut sizes = if scaled {
                    vec![7, 4099]
                } else if exhaustive() || REPRESENTATIVE.contains(&dtype) {
                    SMALL.to_vec()
                } else {
                    vec![7, 1023]
                };
                let big = (1usize << 20) / dtype.size_in_bytes() + 3;
                if exhaustive()
                    || (matches!(dtype, DataType::F32 | DataType::I32) && op == ReduceOp::Sum)
                {
                    // Per-rank counts for all-gather / reduce-scatter: the buffer is n times it.
                    sizes.push(
                        if matches!(kind, CollectiveKind::AllReduce | CollectiveKind::Broadcast) {
                            big
                        } else {
                            big / n.max(1) + 3
                        },
                    );
                }
                for count in sizes {
                    if n > 1 && !takes(env, a, kind, dtype, op, count) {
                        continue; // beyond this algorithm's scratch: the selector never picks it there
                    }
                    let (bad, root, errors) =
                        next_call(env, kind, dtype, op, in_place, count, seed, &mut call);
                    EXPECT_EQ!(
                        bad,
                        0,
                        "{kind} {algo} {dtype} {op} {} count {count}{}: {}",
                        if in_place { "in place" } else { "out of place" },
                        if kind == CollectiveKind::Broadcast {
                            format!(" root {root}")
                        } else {
                            String::new()
                        },
                        errors
                    );
                }
            }
        }
    }
    ok!(env.coll.force_algorithm(kind, None), "un-forcing {algo}");
}

/// Runs the matrix of every registered algorithm of `kind` but the copy (world size > 1) and
/// the multi-node ones (MultiNodeTest runs those); skips with the reason when none is
/// registered yet.
pub(crate) fn every_registered(kind: CollectiveKind) {
    let env = coll_env();
    if env.coll.nranks() == 1 {
        SKIP!("world size 1 always copies (the Copy test covers it)");
    }
    let names: Vec<&str> = algorithm_names(kind)
        .into_iter()
        .filter(|a| *a != "copy")
        .filter(|a| find_algorithm(kind, a).is_ok_and(|x| !x.multi_node()))
        .collect();
    if names.is_empty() {
        SKIP!("no {kind} algorithm for more than one rank is registered yet");
    }
    for name in names {
        matrix(kind, name);
    }
}

/// `calls` (coll_common::repeated_calls) calls of `kind` cycling through every single-node
/// algorithm, three (dtype, count) cases, in/out of place and the root, each with fresh data
/// checked against the host reference (the RepeatedCalls tests of all-gather,
/// reduce-scatter and broadcast).
pub(crate) fn repeated_calls_test(kind: CollectiveKind) {
    let env = coll_env();
    let n = env.coll.nranks();
    let algos: Vec<&str> = single_node_algorithms(kind)
        .into_iter()
        .filter(|a| (*a == "copy") == (n == 1))
        .collect();
    if algos.is_empty() {
        SKIP!("no {kind} algorithm for {n} ranks is registered yet");
    }
    let seed = agreed_seed();
    let cases = [
        (DataType::I32, 1023usize),
        (DataType::F16, 7),
        (DataType::U8, 4099),
    ];
    let (mut bad, mut errors) = (0, Vec::new());
    let calls = repeated_calls(n);
    for call in 0..calls {
        let algo = algos[call as usize % algos.len()];
        ok!(env.coll.force_algorithm(kind, Some(algo)), "forcing {algo}");
        let (dtype, count) = cases[(call as usize / algos.len()) % cases.len()];
        let root = call as usize % n;
        bad += one_call(
            kind,
            dtype,
            ReduceOp::Sum,
            call % 2 == 1,
            count,
            root,
            seed,
            call,
            &mut errors,
        );
    }
    ok!(env.coll.force_algorithm(kind, None), "un-forcing");
    EXPECT_EQ!(
        bad,
        0,
        "mismatches over {calls} calls ({algos:?}): {}",
        errors.join("; ")
    );
}
