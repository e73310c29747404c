//! Issue 28 through the C API (host backend, ranks as communicators of one process driven by
//! one thread through groups): buffers from `ncclMemAlloc` registered with `ncclCommRegister`
//! make `ncclAllGather`, `ncclReduceScatter` and `ncclBroadcast` take the zero-copy algorithm
//! (`zero_copy`, named by the collectives' INFO log, written to a file here), exact, in and out
//! of place; the same calls at a smaller size on the start of the registered buffers too, and
//! calls moved through a registered range as nccl-tests `-R 1` does (views of the registration),
//! and a reduce-scatter in place inside a registered range no call used before (a view: the
//! ranges are registered whole at the first miss).

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

mod common;

use mscclpp::collectives::selector::zero_copy_from_bytes;
use mscclpp::collectives::CollectiveKind;
use mscclpp_nccl::abi;
use mscclpp_nccl::exports::*;
use mscclpp_nccl::exports_ops::*;

type Comm = *mut c_void;
const INT32: c_int = 2;
const SUM: c_int = 0;
const MAX: c_int = 2;

fn ok(r: c_int, what: &str) {
    assert_eq!(r, abi::SUCCESS, "{what} -> {r}");
}

/// A registered buffer of `len` i32 of one rank: memory of `ncclMemAlloc`, registered with
/// `ncclCommRegister` on its communicator.
struct Buf {
    ptr: *mut i32,
    len: usize,
    handle: *mut c_void,
    comm: Comm,
}

impl Buf {
    fn new(comm: Comm, len: usize) -> Buf {
        let mut p: *mut c_void = null_mut();
        let mut handle: *mut c_void = null_mut();
        // SAFETY: valid out pointers; a live communicator.
        unsafe {
            ok(ncclMemAlloc(&mut p, len * 4), "ncclMemAlloc");
            ok(
                ncclCommRegister(comm as *const _, p, len * 4, &mut handle),
                "ncclCommRegister",
            );
        }
        Buf {
            ptr: p.cast(),
            len,
            handle,
            comm,
        }
    }
    fn at(&self, i: usize) -> *mut c_void {
        assert!(i <= self.len);
        // SAFETY: inside the allocation.
        unsafe { self.ptr.add(i).cast() }
    }
    fn get(&self) -> Vec<i32> {
        // SAFETY: host memory of `len` i32 (the host backend), no call in flight.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len).to_vec() }
    }
    fn set(&self, from: usize, vals: &[i32]) {
        assert!(from + vals.len() <= self.len);
        // SAFETY: as in get.
        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), self.ptr.add(from), vals.len()) };
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: the handle and pointer of new().
        unsafe {
            ok(
                ncclCommDeregister(self.comm as *const _, self.handle),
                "ncclCommDeregister",
            );
            ok(ncclMemFree(self.ptr.cast()), "ncclMemFree");
        }
    }
}

/// Rank r's value at element i of call `k`.
fn v(k: usize, r: usize, i: usize) -> i32 {
    ((k * 7919 + r * 104_729 + i * 31) % 100_003) as i32 - 50_000
}

/// One grouped call per rank: `f(rank, comm)`.
fn grouped(comms: &[Comm], what: &str, f: impl Fn(usize, *mut c_void) -> c_int) {
    // SAFETY: the group calls; the buffers outlive the group (the host backend completes it in
    // ncclGroupEnd).
    unsafe { ok(ncclGroupStart(), "ncclGroupStart") };
    for (r, &c) in comms.iter().enumerate() {
        ok(f(r, c), what);
    }
    // SAFETY: as above.
    unsafe { ok(ncclGroupEnd(), &format!("ncclGroupEnd of {what}")) };
}

/// i32 per rank above which registered all-gathers, reduce-scatters and broadcasts on `n` ranks
/// all take `zero_copy` (`selector::zero_copy_from_bytes`, the largest of the three).
fn zero_copy_floor(n: usize) -> usize {
    [
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::Broadcast,
    ]
    .into_iter()
    .map(|k| zero_copy_from_bytes(k, n))
    .max()
    .unwrap_or(0)
        / 4
}

fn run(n: usize, log: &std::path::Path) {
    let comms = common::comms_in_group(n);
    // i32 per rank: both sizes above the floor from which registered buffers take zero_copy.
    let floor = zero_copy_floor(n);
    let big = floor + 34_463;
    let ins: Vec<Buf> = comms.iter().map(|&c| Buf::new(c, n * big)).collect();
    let outs: Vec<Buf> = comms.iter().map(|&c| Buf::new(c, n * big)).collect();
    let mut k = 0;
    for count in [big, floor + 1] {
        for in_place in [false, true] {
            // All-gather: rank r's `count` elements at block r of every output.
            k += 1;
            for r in 0..n {
                let vals: Vec<i32> = (0..count).map(|i| v(k, r, i)).collect();
                let dst = if in_place { &outs[r] } else { &ins[r] };
                dst.set(if in_place { r * count } else { 0 }, &vals);
            }
            grouped(&comms, "ncclAllGather", |r, c| {
                let send = if in_place {
                    outs[r].at(r * count)
                } else {
                    ins[r].at(0)
                };
                // SAFETY: registered host buffers of n * big i32.
                unsafe { ncclAllGather(send, outs[r].at(0), count, INT32, c.cast(), null_mut()) }
            });
            for (r, o) in outs.iter().enumerate() {
                let got = o.get();
                for (i, g) in got[..n * count].iter().enumerate() {
                    assert_eq!(
                        *g,
                        v(k, i / count, i % count),
                        "all-gather of {count} (in place: {in_place}) at {n} ranks: rank {r} element {i}"
                    );
                }
            }
            // Reduce-scatter (max): block r of every rank's input reduced into rank r's output.
            k += 1;
            for (r, b) in ins.iter().enumerate() {
                let vals: Vec<i32> = (0..n * count).map(|i| v(k, r, i)).collect();
                b.set(0, &vals);
            }
            grouped(&comms, "ncclReduceScatter", |r, c| {
                let recv = if in_place {
                    ins[r].at(r * count)
                } else {
                    outs[r].at(0)
                };
                // SAFETY: as above.
                unsafe {
                    ncclReduceScatter(ins[r].at(0), recv, count, INT32, MAX, c.cast(), null_mut())
                }
            });
            for r in 0..n {
                let got = if in_place {
                    ins[r].get()[r * count..(r + 1) * count].to_vec()
                } else {
                    outs[r].get()[..count].to_vec()
                };
                for (i, g) in got.iter().enumerate() {
                    let want = (0..n).map(|p| v(k, p, r * count + i)).max().unwrap();
                    assert_eq!(
                        *g, want,
                        "reduce-scatter of {count} (in place: {in_place}) at {n} ranks: rank {r} element {i}"
                    );
                }
            }
            // Broadcast from every root.
            for root in 0..n {
                k += 1;
                for (r, b) in ins.iter().enumerate() {
                    let vals: Vec<i32> = (0..count).map(|i| v(k, r, i)).collect();
                    b.set(0, &vals);
                    if in_place {
                        outs[r].set(0, &vals);
                    }
                }
                grouped(&comms, "ncclBroadcast", |r, c| {
                    let send = if in_place {
                        outs[r].at(0)
                    } else {
                        ins[r].at(0)
                    };
                    // SAFETY: as above.
                    unsafe {
                        ncclBroadcast(
                            send,
                            outs[r].at(0),
                            count,
                            INT32,
                            root as c_int,
                            c.cast(),
                            null_mut(),
                        )
                    }
                });
                for (r, o) in outs.iter().enumerate() {
                    let got = o.get();
                    for (i, g) in got[..count].iter().enumerate() {
                        assert_eq!(
                            *g,
                            v(k, root, i),
                            "broadcast of {count} from {root} (in place: {in_place}) at {n} ranks: rank {r} element {i}"
                        );
                    }
                }
            }
        }
    }
    // A registered all-reduce still checks out (sum).
    k += 1;
    for (r, b) in ins.iter().enumerate() {
        b.set(0, &(0..big).map(|i| v(k, r, i)).collect::<Vec<_>>());
    }
    grouped(&comms, "ncclAllReduce", |r, c| {
        // SAFETY: as above.
        unsafe {
            ncclAllReduce(
                ins[r].at(0),
                outs[r].at(0),
                big,
                INT32,
                SUM,
                c.cast(),
                null_mut(),
            )
        }
    });
    for (r, o) in outs.iter().enumerate() {
        let got = o.get();
        for (i, g) in got[..big].iter().enumerate() {
            let want = (0..n).fold(0i32, |s, p| s.wrapping_add(v(k, p, i)));
            assert_eq!(*g, want, "all-reduce at {n} ranks: rank {r} element {i}");
        }
    }
    drop(ins);
    drop(outs);
    moving_through_the_range(&comms);
    for &c in &comms {
        // SAFETY: live handles from init.
        ok(unsafe { ncclCommDestroy(c.cast()) }, "ncclCommDestroy");
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for kind in ["allgather", "reducescatter", "broadcast"] {
        let ran = text
            .lines()
            .filter(|l| l.contains(&format!("{kind} of ")) && l.contains(" runs "))
            .collect::<Vec<_>>();
        assert!(
            !ran.is_empty() && ran.iter().all(|l| l.ends_with("runs zero_copy")),
            "{kind} on registered buffers at {n} ranks runs zero_copy (log {}): {ran:?}",
            log.display()
        );
    }
}

/// nccl-tests' way with `-R 1`: one registration of the whole range (its largest size, at
/// the start), then calls of a smaller size moved through the range call by call, at the same
/// offset on every rank: each is a view of the registration (zero-copy, no registration of
/// its own; the INFO log says so), exact.
fn moving_through_the_range(comms: &[Comm]) {
    let n = comms.len();
    let (count, slots) = (zero_copy_floor(n) + 1, 3);
    // The inputs also hold a reduce-scatter's input of n * count one slot in (below).
    let ins: Vec<Buf> = comms
        .iter()
        .map(|&c| Buf::new(c, slots * n * count))
        .collect();
    let outs: Vec<Buf> = comms
        .iter()
        .map(|&c| Buf::new(c, slots * n * count))
        .collect();
    let mut k = 1000;
    for (shift, cnt) in [(0, slots * count), (1, count), (2, count)] {
        k += 1;
        for (r, b) in ins.iter().enumerate() {
            b.set(
                shift * count,
                &(0..cnt).map(|i| v(k, r, i)).collect::<Vec<_>>(),
            );
        }
        grouped(comms, "ncclAllGather", |r, c| {
            let (send, recv) = (ins[r].at(shift * count), outs[r].at(shift * n * count));
            // SAFETY: registered host buffers holding the call's extents.
            unsafe { ncclAllGather(send, recv, cnt, INT32, c.cast(), null_mut()) }
        });
        for (r, o) in outs.iter().enumerate() {
            let got = &o.get()[shift * n * count..][..n * cnt];
            for (i, g) in got.iter().enumerate() {
                assert_eq!(
                    *g,
                    v(k, i / cnt, i % cnt),
                    "all-gather of {cnt} at slot {shift} at {n} ranks: rank {r} element {i}"
                );
            }
        }
    }
    // A reduce-scatter in place one slot into the inputs: a range no call above registered
    // (the all-gathers register their outputs), so a view only because ncclCommRegister's
    // ranges are registered whole at the first miss (nccl-tests `-R 1` reduce-scatter in place
    // reads its input from the receive range).
    k += 1;
    let at = n * count;
    for (r, b) in ins.iter().enumerate() {
        b.set(at, &(0..n * count).map(|i| v(k, r, i)).collect::<Vec<_>>());
    }
    grouped(comms, "ncclReduceScatter", |r, c| {
        let (send, recv) = (ins[r].at(at), ins[r].at(at + r * count));
        // SAFETY: registered host buffers holding the call's extents.
        unsafe { ncclReduceScatter(send, recv, count, INT32, SUM, c.cast(), null_mut()) }
    });
    for (r, b) in ins.iter().enumerate() {
        let got = &b.get()[at + r * count..][..count];
        for (j, g) in got.iter().enumerate() {
            let want = (0..n).fold(0i32, |s, p| s.wrapping_add(v(k, p, r * count + j)));
            assert_eq!(
                *g, want,
                "reduce-scatter in place inside the inputs at {n} ranks: rank {r} element {j}"
            );
        }
    }
}

#[test]
fn registered_buffers_take_the_zero_copy_gather_scatter_and_broadcast() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mscclpp_nccl_registered");
    std::fs::create_dir_all(&dir).expect("the log folder");
    let log = dir.join(format!("coll-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    // SAFETY: set before the library reads its environment (its first call below); the only
    // test of this binary, so no other thread reads the environment meanwhile.
    unsafe {
        std::env::set_var("MSCCLPP_LOG_LEVEL", "INFO");
        std::env::set_var("MSCCLPP_LOG_SUBSYS", "COLL");
        std::env::set_var("MSCCLPP_LOG_FILE", &log);
    }
    // The log accumulates over both worlds; every gather/scatter/broadcast line names zero_copy.
    run(2, &log);
    run(4, &log);
    // The calls moved through the range were views: at 2 and 4 ranks, 3 calls (2 all-gathers,
    // 1 reduce-scatter), every rank.
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let views = text
        .lines()
        .filter(|l| l.contains("(zero-copy view)"))
        .count();
    assert_eq!(
        views,
        3 * (2 + 4),
        "calls moved through a registered range are views of it (log {})",
        log.display()
    );
}
