//! Faults through the C API, several ranks in one process (host backend): an abort from
//! another thread ends a blocked all-reduce within a second, a destroyed handle never names a
//! later communicator, and an absurd nranks is refused at once.

mod common;

use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use mscclpp_nccl::abi::{self, NcclUniqueId};
use mscclpp_nccl::exports::*;
use mscclpp_nccl::exports_ops::*;

const FLOAT: c_int = 7;
const SUM: c_int = 0;

/// `r` is a failure that came within `limit` of `t` and whose message contains `want`.
fn assert_fast_failure(r: c_int, t: Instant, limit: Duration, want: &str) {
    assert_ne!(r, abi::SUCCESS, "expected a failure containing {want:?}");
    assert!(t.elapsed() < limit, "took {:?}", t.elapsed());
    let msg = last_error();
    assert!(msg.contains(want) && msg.contains("expected"), "{msg}");
}

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string owned by the library.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn abort_from_another_thread_ends_a_blocked_all_reduce_within_a_second() {
    let comms = common::comms_in_group(2);
    let c0 = comms[0] as usize;
    // Rank 0 all-reduces alone: rank 1 never joins, so it waits (before: 60 s, its timeout).
    let waiter = std::thread::spawn(move || {
        let mut buf = vec![1f32; 4096];
        let p = buf.as_mut_ptr() as *mut c_void;
        // SAFETY: a live handle (until the abort) and a local buffer.
        let r = unsafe { ncclAllReduce(p, p, 4096, FLOAT, SUM, c0 as *mut _, null_mut()) };
        (r, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(500));
    let aborted_at = Instant::now();
    // SAFETY: a live handle.
    let r = unsafe { ncclCommAbort(comms[0] as *mut _) };
    assert_eq!(r, abi::SUCCESS, "ncclCommAbort");
    let (r, returned_at) = waiter.join().expect("the all-reducing thread");
    let after = returned_at.saturating_duration_since(aborted_at);
    assert_ne!(
        r,
        abi::SUCCESS,
        "the blocked all-reduce must fail after the abort"
    );
    assert!(
        after < Duration::from_secs(1),
        "the all-reduce returned {after:?} after the abort"
    );
    // SAFETY: a live handle.
    assert_eq!(unsafe { ncclCommDestroy(comms[1] as *mut _) }, abi::SUCCESS);
}

#[test]
fn a_destroyed_handle_never_names_a_later_communicator() {
    // Many rounds: the allocator would hand the freed address out again at once.
    let mut stale = Vec::new();
    for _ in 0..20 {
        let c = common::comms_in_group(1)[0];
        // SAFETY: a live handle.
        assert_eq!(unsafe { ncclCommDestroy(c as *mut _) }, abi::SUCCESS);
        stale.push(c);
    }
    let live = common::comms_in_group(1)[0];
    assert!(
        !stale.contains(&live),
        "a new communicator got a destroyed one's handle"
    );
    for &old in &stale {
        // SAFETY: stale handles are refused by lookup, never dereferenced as a communicator.
        let r = unsafe { ncclCommDestroy(old as *mut _) };
        assert_eq!(r, abi::INVALID_ARGUMENT, "destroy of a stale handle");
        let msg = last_error();
        assert!(msg.contains("destroyed or aborted already"), "{msg}");
    }
    // The live one is untouched by the stale destroys.
    let mut count: c_int = 0;
    // SAFETY: a live handle and a local.
    let r = unsafe { ncclCommCount(live as *mut _, &mut count) };
    assert_eq!(r, abi::SUCCESS);
    assert_eq!(count, 1);
    // SAFETY: a live handle.
    assert_eq!(unsafe { ncclCommDestroy(live as *mut _) }, abi::SUCCESS);
}

#[test]
fn nranks_int_max_is_refused_at_once_without_a_huge_allocation() {
    let mut id = NcclUniqueId { internal: [0; 128] };
    let mut comm: *mut c_void = null_mut();
    let t = Instant::now();
    // SAFETY: valid pointers to locals.
    let r = unsafe {
        assert_eq!(ncclGetUniqueId(&mut id), abi::SUCCESS);
        ncclCommInitRank(&mut comm as *mut _ as *mut _, c_int::MAX, id, 0)
    };
    assert_fast_failure(r, t, Duration::from_secs(2), "nranks 2147483647");
}

#[test]
fn mem_alloc_of_one_tib_fails_at_once_with_a_clear_error() {
    let mut p: *mut c_void = null_mut();
    let t = Instant::now();
    // SAFETY: a valid pointer to a local.
    let r = unsafe { ncclMemAlloc(&mut p, 1 << 40) };
    assert_fast_failure(
        r,
        t,
        Duration::from_secs(1),
        "1099511627776 bytes requested",
    );
    assert!(p.is_null());
    // A small allocation still works.
    // SAFETY: a valid pointer to a local; freed right after.
    unsafe {
        assert_eq!(ncclMemAlloc(&mut p, 1 << 20), abi::SUCCESS);
        assert_eq!(ncclMemFree(p), abi::SUCCESS);
    }
}
