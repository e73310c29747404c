//! Point-to-point waits that used to be long and silent (host backend, the ranks as threads of
//! this process, `MSCCLPP_CHECK_CALLS` off): a send meeting a receive of another size fails on
//! both ranks at once, naming the peer and both sizes (before: the receiver failed, the sender
//! waited 120 s); a receive whose send never comes warns, naming the peer and the size, and
//! fails at `MSCCLPP_P2P_TIMEOUT` (before: silent for 120 s).
//!
//! One test in its own binary: it sets the variables before the library reads them.

mod common;

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::time::Duration;

use mscclpp_nccl::abi;
use mscclpp_nccl::exports::*;
use mscclpp_nccl::exports_ops::*;

use common::per_rank;

const FLOAT: c_int = 7;

fn destroy(comms: Vec<*mut c_void>) {
    for c in comms {
        // SAFETY: a live handle, destroyed once.
        unsafe { ncclCommDestroy(c.cast()) };
    }
}

#[test]
fn mismatched_and_unmatched_point_to_point_fail_fast_and_say_why() {
    let log = std::env::temp_dir().join(format!("mscclpp_p2p_waits_{}.log", std::process::id()));
    // Read when the library starts (the log file) and when each communicator is created.
    std::env::set_var("MSCCLPP_P2P_TIMEOUT", "2");
    std::env::set_var("MSCCLPP_LOG_FILE", &log);
    std::env::remove_var("MSCCLPP_CHECK_CALLS");

    // A send of 1000 floats meets a receive of 999: the receiver finds it and tells the sender.
    let comms = common::comms_in_group(2);
    let res = per_rank(&comms, |r, c, p| {
        // SAFETY: a live communicator and a local buffer of 4096 floats.
        unsafe {
            match r {
                0 => ncclSend(p, 1000, FLOAT, 1, c.cast(), null_mut()),
                _ => ncclRecv(p, 999, FLOAT, 0, c.cast(), null_mut()),
            }
        }
    });
    for (r, (rc, took, msg)) in res.iter().enumerate() {
        println!("MEASURE p2p_mismatch_rank{r}_s {:.3}", took.as_secs_f64());
        assert_ne!(*rc, abi::SUCCESS, "rank {r}: the mismatched call succeeded");
        assert!(
            *took < Duration::from_secs(1),
            "rank {r} failed after {took:?}: {msg}"
        );
        let peer = format!("rank {}", 1 - r);
        for w in [peer.as_str(), "sends 4000 bytes", "expects 3996 bytes"] {
            assert!(msg.contains(w), "rank {r}: expected `{w}` in: {msg}");
        }
    }
    destroy(comms);

    // Rank 1 receives from rank 0, which never sends: a warning after a quarter of the 2 s
    // timeout, then the error at 2 s, both naming the peer and the size.
    let comms = common::comms_in_group(2);
    let res = per_rank(&comms, |r, c, p| match r {
        0 => abi::SUCCESS,
        // SAFETY: as above.
        _ => unsafe { ncclRecv(p, 1000, FLOAT, 0, c.cast(), null_mut()) },
    });
    let (rc, took, msg) = &res[1];
    println!("MEASURE p2p_unmatched_recv_s {:.3}", took.as_secs_f64());
    assert_ne!(*rc, abi::SUCCESS, "the unmatched receive succeeded");
    assert!(
        *took >= Duration::from_secs(2) && *took < Duration::from_millis(3500),
        "failed after {took:?}: {msg}"
    );
    for w in [
        "a receive of 4000 bytes from rank 0",
        "has not posted the matching send",
        "MSCCLPP_P2P_TIMEOUT",
    ] {
        assert!(msg.contains(w), "expected `{w}` in: {msg}");
    }
    destroy(comms);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let warned = text.lines().find(|l| {
        l.contains("WARN")
            && l.contains("no progress for")
            && l.contains("a receive of 4000 bytes from rank 0")
    });
    assert!(
        warned.is_some(),
        "expected a warning naming the receive in the log:\n{text}"
    );
}
