//! BroadcastTest: every registered broadcast algorithm x data type x in/out of place x sizes
//! that are not multiples of the vector width or the rank count, against the host reference
//! (exact for integers), with poisoned outputs and a guard zone (coll_matrix.rs), plus the
//! world-size-1 copy and 1000 repeated calls with changing data (100 above
//! `coll_common::FULL_MATRIX_MAX_RANKS` ranks).

use mscclpp::collectives::{CollectiveKind, DataType, ReduceOp};
use mscclpp_framework::*;

use super::coll_common::{agreed_seed, coll_env};
use super::coll_matrix::{every_registered, matrix, one_call};
use super::memory_channel::common::ok;

const KIND: CollectiveKind = CollectiveKind::Broadcast;

TEST!(BroadcastTest, Copy, |_ctx| matrix(KIND, "copy"));
TEST!(BroadcastTest, EveryRegisteredAlgorithm, |_ctx| {
    every_registered(KIND)
});

TEST!(BroadcastTest, RepeatedCalls, |_ctx| {
    let env = coll_env();
    let n = env.coll.nranks();
    let algos: Vec<&str> = super::coll_common::single_node_algorithms(KIND)
        .into_iter()
        .filter(|a| (*a == "copy") == (n == 1))
        .collect();
    if algos.is_empty() {
        SKIP!("no {KIND} algorithm for {n} ranks is registered yet");
    }
    let seed = agreed_seed();
    let cases = [
        (DataType::I32, 1023usize),
        (DataType::F16, 7),
        (DataType::U8, 4099),
    ];
    let (mut bad, mut errors) = (0, Vec::new());
    let calls = super::coll_common::repeated_calls(n);
    for call in 0..calls {
        let algo = algos[call as usize % algos.len()];
        ok!(env.coll.force_algorithm(KIND, Some(algo)), "forcing {algo}");
        let (dtype, count) = cases[(call as usize / algos.len()) % cases.len()];
        let root = call as usize % n;
        bad += one_call(
            KIND,
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
    ok!(env.coll.force_algorithm(KIND, None), "un-forcing");
    EXPECT_EQ!(
        bad,
        0,
        "mismatches over {calls} calls ({algos:?}): {}",
        errors.join("; ")
    );
});
