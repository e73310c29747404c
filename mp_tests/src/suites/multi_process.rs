//! MultiProcessTest: the ranks exist, see each other, and agree on where they run.

use mscclpp_framework::*;

use crate::world::mp_env;

/// This machine's host name, as the kernel reports it.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".to_string())
}

TEST!(MultiProcessTest, Prelim, |ctx| {
    let env = mp_env();
    EXPECT_EQ!(ctx.rank(), env.placement.rank);
    EXPECT_EQ!(ctx.size(), env.placement.size);
    EXPECT_EQ!(env.bootstrap.rank(), env.placement.rank);
    EXPECT_EQ!(env.bootstrap.nranks(), env.placement.size);
    let all = env.bootstrap.all_gather(&(ctx.rank() as u64).to_le_bytes());
    ASSERT_TRUE!(all.is_ok(), "all_gather failed: {:?}", all.as_ref().err());
    let all = all.unwrap_or_default();
    ASSERT_EQ!(all.len(), ctx.size());
    for (r, bytes) in all.iter().enumerate() {
        let got = <[u8; 8]>::try_from(bytes.as_slice())
            .map(u64::from_le_bytes)
            .ok();
        EXPECT_EQ!(got, Some(r as u64), "entry of rank {}", r);
    }
});

TEST!(MultiProcessTest, HostName, |ctx| {
    let env = mp_env();
    let mine = host_name();
    let names = env.bootstrap.all_gather(mine.as_bytes());
    ASSERT_TRUE!(
        names.is_ok(),
        "all_gather failed: {:?}",
        names.as_ref().err()
    );
    let hashes = env
        .bootstrap
        .all_gather(&mscclpp::bootstrap::host_hash().to_le_bytes());
    ASSERT_TRUE!(hashes.is_ok());
    let (names, hashes) = (names.unwrap_or_default(), hashes.unwrap_or_default());
    ASSERT_EQ!(names.len(), ctx.size());
    for r in 0..ctx.size() {
        // Ranks the bootstrap places on our host must report our host name.
        if hashes[r] == hashes[ctx.rank()] {
            EXPECT_EQ!(
                String::from_utf8_lossy(&names[r]),
                mine.as_str(),
                "rank {}",
                r
            );
        }
    }
});

TEST!(MultiProcessTest, HostHash, |ctx| {
    let env = mp_env();
    let mine = mscclpp::bootstrap::host_hash();
    // Stable within a process.
    EXPECT_EQ!(mine, mscclpp::bootstrap::host_hash());
    let all = env.bootstrap.all_gather(&mine.to_le_bytes());
    ASSERT_TRUE!(all.is_ok(), "all_gather failed: {:?}", all.as_ref().err());
    let all = all.unwrap_or_default();
    // The launcher says which ranks share our node: they must agree on the hash.
    let p = &env.placement;
    let first_local = p.rank - p.local_rank;
    let local_end = (first_local + p.local_size).min(ctx.size());
    for (r, hash) in all.iter().enumerate().take(local_end).skip(first_local) {
        EXPECT_EQ!(
            hash,
            &mine.to_le_bytes().to_vec(),
            "rank {} shares our node",
            r
        );
    }
    let same = all
        .iter()
        .filter(|h| h.as_slice() == mine.to_le_bytes())
        .count();
    EXPECT_EQ!(env.bootstrap.nranks_per_node(), same);
});

// A failure injected on one rank must fail the test on every rank. Driven by
// mp_tests/tests/verdicts.rs, which sets the variable; skipped otherwise.
TEST!(MultiProcessTest, InjectedFailure, |ctx| {
    let Ok(var) = std::env::var("MSCCLPP_TEST_INJECT_FAILURE_RANK") else {
        SKIP!("MSCCLPP_TEST_INJECT_FAILURE_RANK is not set (the verdict self-test sets it)");
    };
    let target: usize = var.parse().unwrap_or(usize::MAX);
    EXPECT_NE!(ctx.rank(), target, "failure injected on rank {}", target);
});

// A rank that freezes (SIGSTOP, as under a debugger or on a stalled host) inside a test: the
// others' wait there times out after --timeout, and the framework's own waits then know the
// rank is lost at once (no second and third --timeout). Driven by mp_tests/tests/frozen_peer.rs,
// which sets the variable; skipped otherwise.
TEST!(MultiProcessTest, FrozenRank, |ctx| {
    let Ok(var) = std::env::var("MSCCLPP_TEST_FREEZE_RANK") else {
        SKIP!("MSCCLPP_TEST_FREEZE_RANK is not set (the frozen-peer self-test sets it)");
    };
    let target: usize = var.parse().unwrap_or(usize::MAX);
    if ctx.rank() == target {
        // Stops the whole process until someone sends SIGCONT or SIGKILL.
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::STOP);
    }
    let r = mp_env().bootstrap.barrier();
    EXPECT_TRUE!(
        r.is_ok(),
        "barrier with rank {} frozen: {:?}",
        target,
        r.err()
    );
});
