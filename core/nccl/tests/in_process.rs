//! Several ranks in one process, as nccl-tests `-g N` and single-process multi-GPU programs
//! drive NCCL: grouped inits from one thread, grouped collectives and send/recv across the
//! communicators of one thread, `ncclCommInitAll`, non-blocking grouped init, and an abort
//! that stops a receive blocked in another thread (host backend).

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use mscclpp_nccl::abi::{self, NcclConfig, NcclUniqueId};
use mscclpp_nccl::exports::*;
use mscclpp_nccl::exports_ops::*;

type Comm = *mut c_void;
const FLOAT: c_int = 7;
const SUM: c_int = 0;

fn ok(r: c_int, what: &str) {
    assert_eq!(r, abi::SUCCESS, "{what} -> {r}");
}

/// `n` communicators of one clique created by this thread inside one group.
fn grouped_init(n: usize, config: Option<NcclConfig>) -> (Vec<Comm>, c_int) {
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: (all calls here) valid pointers to locals.
    unsafe {
        ok(ncclGetUniqueId(&mut id), "ncclGetUniqueId");
        ok(ncclGroupStart(), "ncclGroupStart");
        let mut comms: Vec<Comm> = vec![null_mut(); n];
        for (r, c) in comms.iter_mut().enumerate() {
            let mut cfg = config;
            let p = cfg.as_mut().map_or(null_mut(), |c| c as *mut NcclConfig);
            let rc =
                ncclCommInitRankConfig(c as *mut Comm as *mut _, n as c_int, id, r as c_int, p);
            ok(rc, "ncclCommInitRankConfig in a group");
            assert!(!c.is_null(), "a grouped init returns the handle at once");
        }
        let end = ncclGroupEnd();
        (comms, end)
    }
}

fn destroy(comms: &[Comm]) {
    for &c in comms {
        // SAFETY: live handles from init.
        ok(unsafe { ncclCommDestroy(c as *mut _) }, "ncclCommDestroy");
    }
}

#[test]
fn one_thread_drives_three_ranks_through_groups() {
    let (comms, end) = grouped_init(3, None);
    ok(end, "ncclGroupEnd of the inits");
    let n = 1000;
    let mut bufs: Vec<Vec<f32>> = (0..3).map(|r| vec![r as f32 + 1.0; n]).collect();
    // SAFETY: every buffer outlives the group (the host backend completes it in GroupEnd).
    unsafe {
        ok(ncclGroupStart(), "ncclGroupStart");
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            let p = b.as_mut_ptr() as *mut c_void;
            ok(
                ncclAllReduce(p, p, n, FLOAT, SUM, *c as *mut _, null_mut()),
                "ncclAllReduce",
            );
        }
        ok(ncclGroupEnd(), "ncclGroupEnd of the all-reduces");
    }
    assert!(
        bufs.iter().all(|b| b.iter().all(|&v| v == 6.0)),
        "sum of 1+2+3 everywhere"
    );
    // A ring of sends and receives across the three communicators, one group.
    let sends: Vec<Vec<f32>> = (0..3)
        .map(|r| (0..n).map(|i| (r * 10000 + i) as f32).collect())
        .collect();
    let mut recvs: Vec<Vec<f32>> = vec![vec![0.0; n]; 3];
    // SAFETY: as above.
    unsafe {
        ok(ncclGroupStart(), "ncclGroupStart");
        for r in 0..3 {
            let c = comms[r] as *mut _;
            let next = ((r + 1) % 3) as c_int;
            let prev = ((r + 2) % 3) as c_int;
            ok(
                ncclRecv(
                    recvs[r].as_mut_ptr() as *mut _,
                    n,
                    FLOAT,
                    prev,
                    c,
                    null_mut(),
                ),
                "ncclRecv",
            );
            ok(
                ncclSend(sends[r].as_ptr() as *const _, n, FLOAT, next, c, null_mut()),
                "ncclSend",
            );
        }
        ok(ncclGroupEnd(), "ncclGroupEnd of the ring");
    }
    for r in 0..3 {
        assert_eq!(
            recvs[r],
            sends[(r + 2) % 3],
            "rank {r} got its predecessor's data"
        );
    }
    // A simulated end issues nothing.
    let mut x = vec![5.0f32; 4];
    let mut sim = abi::NcclSimInfo {
        size: 24,
        magic: abi::SIM_INFO_MAGIC,
        version: 22803,
        estimated_time: -1.0,
    };
    // SAFETY: as above.
    unsafe {
        ok(ncclGroupStart(), "ncclGroupStart");
        ok(
            ncclAllReduce(
                x.as_ptr() as *const _,
                x.as_mut_ptr() as *mut _,
                4,
                FLOAT,
                SUM,
                comms[0] as *mut _,
                null_mut(),
            ),
            "queued",
        );
        ok(ncclGroupSimulateEnd(&mut sim), "ncclGroupSimulateEnd");
    }
    assert_eq!(x, vec![5.0; 4], "a simulated group must not run its calls");
    destroy(&comms);
}

#[test]
fn init_all_and_non_blocking_grouped_init() {
    let mut comms = vec![null_mut::<c_void>(); 2];
    let devs = [0, 0];
    // SAFETY: room for two handles and two device ordinals.
    ok(
        unsafe { ncclCommInitAll(comms.as_mut_ptr() as *mut _, 2, devs.as_ptr()) },
        "ncclCommInitAll",
    );
    let mut count = 0;
    // SAFETY: live handle, valid out pointer.
    ok(
        unsafe { ncclCommCount(comms[1] as *mut _, &mut count) },
        "ncclCommCount",
    );
    assert_eq!(count, 2);
    destroy(&comms);

    let mut cfg = NcclConfig::initializer();
    cfg.blocking = 0;
    let (comms, end) = grouped_init(2, Some(cfg));
    assert!(
        end == abi::IN_PROGRESS || end == abi::SUCCESS,
        "non-blocking grouped init -> {end}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    for &c in &comms {
        let mut st = abi::IN_PROGRESS;
        while st == abi::IN_PROGRESS && Instant::now() < deadline {
            // SAFETY: live handle, valid out pointer.
            ok(
                unsafe { ncclCommGetAsyncError(c as *mut _, &mut st) },
                "ncclCommGetAsyncError",
            );
        }
        assert_eq!(st, abi::SUCCESS, "non-blocking init finished");
    }
    destroy(&comms);
}

#[test]
fn abort_stops_a_blocked_receive_within_a_second() {
    let (comms, end) = grouped_init(2, None);
    ok(end, "ncclGroupEnd of the inits");
    let c0 = comms[0] as usize;
    let waiter = std::thread::spawn(move || {
        let mut buf = vec![0f32; 16];
        let t = Instant::now();
        // SAFETY: a live handle (until the abort) and a local buffer; rank 1 never sends.
        let r = unsafe {
            ncclRecv(
                buf.as_mut_ptr() as *mut _,
                16,
                FLOAT,
                1,
                c0 as *mut _,
                null_mut(),
            )
        };
        (r, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    // SAFETY: a live handle.
    ok(
        unsafe { ncclCommAbort(comms[0] as *mut _) },
        "ncclCommAbort",
    );
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "abort took {:?}",
        t.elapsed()
    );
    let (r, waited) = waiter.join().expect("the receiving thread");
    assert_ne!(
        r,
        abi::SUCCESS,
        "the blocked receive must fail after the abort"
    );
    assert!(
        waited < Duration::from_secs(3),
        "the receive returned after {waited:?}"
    );
    // SAFETY: the aborted handle is no longer a communicator: an error, not a crash.
    let again = unsafe { ncclCommDestroy(comms[0] as *mut _) };
    assert_eq!(again, abi::INVALID_ARGUMENT);
    destroy(&comms[1..]);
}
