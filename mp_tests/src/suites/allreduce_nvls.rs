//! AllReduceNvlsTest: the NVLS all-reduce variants (`nvls_packet`, `nvls_zero_copy`,
//! `nvls_warp_pipeline`, `nvls_block_pipeline`), each forced, over f32/f16/bf16 sum in and out of
//! place at several sizes (odd counts, one vector, many vectors, a size spanning several scratch
//! chunks) against the host reference, plus calls multimem cannot reduce (i32 sum, f32 max: the
//! copying fallback), a check that the switch path itself ran (the process's NVLS launch count
//! grew), and that the selector picks them only where allowed. On the host backend they run over
//! the multicast emulation; on GPU builds where `nvls_usable` refuses (NVLS disabled by the
//! environment, or no multicast) every one skips with that reason, before any multicast call.

use mscclpp::collectives::nvls::nvls_launches;
use mscclpp::collectives::{find_algorithm, CollectiveKind, DataType, ReduceOp};
use mscclpp_framework::*;

use super::coll_common::{agreed_seed, at_scale, coll_env, exhaustive, takes};
use super::coll_matrix::one_call;
use super::memory_channel::common::{is_gpu_build, ok};

const AR: CollectiveKind = CollectiveKind::AllReduce;

/// Skips (on every rank, with `nvls_usable`'s reason) where NVLS cannot run.
fn skip_unless_usable() {
    let env = coll_env();
    if let Err(e) = mscclpp::nvls_usable(env.device) {
        SKIP!("NVLS is not usable on {:?}: {}", env.device, e);
    }
    if env.coll.nranks() == 1 {
        SKIP!("world size 1 always copies (AllReduceTest.Copy covers it)");
    }
}

/// The cases of one variant on `n` ranks: (dtype, op, count). Above
/// `coll_common::FULL_MATRIX_MAX_RANKS` ranks (CI's -np 8 and 16 steps, where every rank shares
/// two cores) only f32 up to 64 Ki elements runs besides the fallback cases, to keep CI short;
/// `MSCCLPP_COLL_TEST_EXHAUSTIVE=1` runs everything.
fn cases(n: usize) -> Vec<(DataType, ReduceOp, usize)> {
    let mut v = Vec::new();
    let dtypes: &[DataType] = if !at_scale(n) {
        &[DataType::F32, DataType::F16, DataType::Bf16]
    } else {
        &[DataType::F32]
    };
    for &dtype in dtypes {
        let e = dtype.size_in_bytes();
        // 1 element, odd counts, exactly one 16-byte vector, many vectors, and 4 MiB + 12
        // bytes (more than one scratch chunk of the pipelines at the host's 2 blocks).
        let mut counts = vec![1usize, 7, 16 / e, 1023, 4099, 64 << 10];
        if (dtype == DataType::F32 && !at_scale(n)) || exhaustive() {
            counts.push((4 << 20) / e + 3);
        }
        v.extend(counts.into_iter().map(|c| (dtype, ReduceOp::Sum, c)));
    }
    // Multimem cannot reduce these: the load-reduce variants hand them to the copying fallback
    // (nvls_packet reduces locally and takes them itself).
    v.push((DataType::I32, ReduceOp::Sum, 1023));
    v.push((DataType::F32, ReduceOp::Max, 4099));
    v
}

fn nvls_test(algo: &str) {
    skip_unless_usable();
    let env = coll_env();
    let a = ok!(find_algorithm(AR, algo), "finding {algo}");
    ok!(env.coll.force_algorithm(AR, Some(algo)), "forcing {algo}");
    let seed = agreed_seed();
    let before = nvls_launches();
    let mut call = 0u32;
    let mut ran = 0usize;
    for (dtype, op, count) in cases(env.coll.nranks()) {
        if !takes(env, a, AR, dtype, op, count) {
            continue; // beyond the variant's scratch (nvls_packet): the selector never picks it there
        }
        for in_place in [false, true] {
            call += 1;
            ran += 1;
            let mut errors = Vec::new();
            let bad = one_call(AR, dtype, op, in_place, count, 0, seed, call, &mut errors);
            EXPECT_EQ!(
                bad,
                0,
                "{} {} {} {} count {}: {}",
                algo,
                dtype,
                op,
                if in_place { "in place" } else { "out of place" },
                count,
                errors.join("; ")
            );
        }
    }
    ok!(env.coll.force_algorithm(AR, None), "un-forcing {algo}");
    EXPECT_GT!(ran, 10usize, "{}: cases run", algo);
    let after = nvls_launches();
    EXPECT_GT!(
        after,
        before,
        "{}: no call went through the switch (all fell back)",
        algo
    );
}

TEST!(AllReduceNvlsTest, Packet, |_ctx| nvls_test("nvls_packet"));
TEST!(AllReduceNvlsTest, ZeroCopy, |_ctx| nvls_test(
    "nvls_zero_copy"
));
TEST!(AllReduceNvlsTest, WarpPipeline, |_ctx| nvls_test(
    "nvls_warp_pipeline"
));
TEST!(AllReduceNvlsTest, BlockPipeline, |_ctx| nvls_test(
    "nvls_block_pipeline"
));

TEST!(AllReduceNvlsTest, Selection, |_ctx| {
    // Without NVLS (a GPU build under the env switches, or a GPU without multicast) and on the
    // host backend without MSCCLPP_NVLS_EMULATION=1, the selector never picks an NVLS variant;
    // with the opt-in on the host backend (every rank on this node) it picks them by size.
    let env = coll_env();
    if env.coll.nranks() == 1 {
        SKIP!("world size 1 always copies");
    }
    let opt_in = std::env::var("MSCCLPP_NVLS_EMULATION").is_ok_and(|v| v.trim() == "1");
    let usable = mscclpp::nvls_usable(env.device).is_ok();
    let expect_nvls = if is_gpu_build() { usable } else { opt_in };
    for bytes in [4usize, 4 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20] {
        match env.coll.algorithm_for(AR, bytes) {
            Ok(name) => EXPECT_EQ!(
                name.starts_with("nvls_"),
                expect_nvls,
                "{} bytes: the selector picked {} (NVLS usable: {}, host opt-in: {})",
                bytes,
                name,
                usable,
                opt_in
            ),
            Err(e) => FAIL!("selecting for {} bytes: {}", bytes, e),
        }
    }
});
