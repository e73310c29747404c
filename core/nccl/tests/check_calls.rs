//! `MSCCLPP_CHECK_CALLS=1` through the C ABI (host backend, the ranks as threads of this
//! process): one rank passes a different count, root or skips a call, or a send meets a receive
//! of another size; every rank's NCCL call fails within a second with an error naming the
//! diverging rank and both calls (without the check they wait until the timeout).

mod common;

use std::ffi::c_int;
use std::ptr::null_mut;
use std::time::Duration;

use mscclpp_nccl::abi;
use mscclpp_nccl::exports::*;
use mscclpp_nccl::exports_ops::*;

use common::per_rank;

const FLOAT: c_int = 7;
const SUM: c_int = 0;
const WITHIN: Duration = Duration::from_secs(1);

fn expect_all_fail(results: &[(c_int, Duration, String)], words: &[&str]) {
    for (r, (rc, took, msg)) in results.iter().enumerate() {
        assert_ne!(*rc, abi::SUCCESS, "rank {r}: the mismatched call succeeded");
        assert!(*took < WITHIN, "rank {r} failed after {took:?}: {msg}");
        for w in words {
            assert!(msg.contains(w), "rank {r}: expected `{w}` in: {msg}");
        }
    }
}

#[test]
fn mismatched_calls_fail_on_every_rank_within_a_second() {
    // Read when each communicator is created (this test binary's own process).
    std::env::set_var("MSCCLPP_CHECK_CALLS", "1");
    let comms = common::comms_in_group(3);
    // Matching calls run.
    let ok = per_rank(&comms, |_, c, p| {
        // SAFETY: a live communicator and a local buffer of 4096 floats.
        unsafe { ncclAllReduce(p, p, 1024, FLOAT, SUM, c.cast(), null_mut()) }
    });
    for (r, (rc, _, msg)) in ok.iter().enumerate() {
        assert_eq!(*rc, abi::SUCCESS, "rank {r}: {msg}");
    }
    // A different count on rank 2.
    let res = per_rank(&comms, |r, c, p| {
        let count = if r == 2 { 1000 } else { 1024 };
        // SAFETY: as above.
        unsafe { ncclAllReduce(p, p, count, FLOAT, SUM, c.cast(), null_mut()) }
    });
    expect_all_fail(&res, &["rank 2 diverged", "count 1000", "count 1024"]);
    // A different root on rank 2.
    let res = per_rank(&comms, |r, c, p| {
        let root = if r == 2 { 1 } else { 0 };
        // SAFETY: as above.
        unsafe { ncclBroadcast(p, p, 512, FLOAT, root, c.cast(), null_mut()) }
    });
    expect_all_fail(&res, &["rank 2 diverged", "root 1", "root 0"]);
    // Rank 2 skips the all-reduce and goes on to the next call, an all-gather.
    let res = per_rank(&comms, |r, c, p| {
        // SAFETY: as above (the all-gather's 3 x 256 floats fit).
        unsafe {
            if r == 2 {
                ncclAllGather(p, p, 256, FLOAT, c.cast(), null_mut())
            } else {
                ncclAllReduce(p, p, 1024, FLOAT, SUM, c.cast(), null_mut())
            }
        }
    });
    expect_all_fail(&res, &["rank 2 diverged", "allgather", "allreduce"]);
    // A send of 1000 floats from rank 0 meets a receive of 999 on rank 1; rank 2 takes no part.
    let res = per_rank(&comms, |r, c, p| {
        // SAFETY: as above.
        unsafe {
            match r {
                0 => ncclSend(p, 1000, FLOAT, 1, c.cast(), null_mut()),
                1 => ncclRecv(p, 999, FLOAT, 0, c.cast(), null_mut()),
                _ => abi::SUCCESS,
            }
        }
    });
    assert_eq!(res[2].0, abi::SUCCESS);
    expect_all_fail(
        &res[..2],
        &["point-to-point call mismatch", "send 4000 B", "recv 3996 B"],
    );
    for c in comms {
        // SAFETY: a live handle.
        assert_eq!(unsafe { ncclCommDestroy(c.cast()) }, abi::SUCCESS);
    }
}
