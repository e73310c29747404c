//! A plan in the plan directory reaches `ncclAllReduce`, `ncclAllGather` and
//! `ncclReduceScatter` (host backend, two ranks driven by one thread through a group): a shipped
//! in-place LL all-reduce plan (core/plans, written by its DSL program), its size range
//! narrowed to 4..=64 KiB, is taken for in-place all-reduces inside that range (the INFO line
//! of the collectives names the plan and its file) and the native algorithm outside it; the
//! DSL's out-of-place all-gather and reduce-scatter programs
//! (`mscclpp.language.examples.collectives`, written by `python3 core/plans/plans.py example`)
//! for 8..=128 KiB messages likewise; correct results either way.
//!
//! The environment is read once per process, so this file is its own test binary with one
//! test that sets `MSCCLPP_CACHE_DIR` and the log variables before anything reads them.

mod common;

use std::ffi::{c_int, c_void};
use std::path::Path;
use std::ptr::null_mut;

use mscclpp_nccl::abi;
use mscclpp_nccl::exports::*;
use mscclpp_nccl::exports_ops::*;

type Comm = *mut c_void;
const FLOAT: c_int = 7;
const SUM: c_int = 0;
const PLAN: &str = "nccl_plan_dir_test_allreduce_ll";
const AG_PLAN: &str = "nccl_plan_dir_test_dsl_allgather";
const RS_PLAN: &str = "nccl_plan_dir_test_dsl_reducescatter";

fn ok(r: c_int, what: &str) {
    assert_eq!(r, abi::SUCCESS, "{what} -> {r}");
}

/// `count` f32 of library memory (ncclMemAlloc: plans run on memory the library allocated;
/// host memory on this backend), element i set to `value(i)`.
fn alloc(count: usize, value: impl Fn(usize) -> f32) -> *mut f32 {
    let mut p: *mut c_void = null_mut();
    // SAFETY: a valid out-pointer.
    ok(unsafe { ncclMemAlloc(&mut p, count * 4) }, "ncclMemAlloc");
    let p = p as *mut f32;
    for i in 0..count {
        // SAFETY: `count` f32 of host memory just allocated.
        unsafe { *p.add(i) = value(i) };
    }
    p
}

/// Checks the `count` f32 at `p` against `want(i)`, then frees them.
fn check_and_free(p: *mut f32, count: usize, what: &str, want: impl Fn(usize) -> f32) {
    // SAFETY: `count` f32 of host memory from `alloc`, complete after GroupEnd.
    let b = unsafe { std::slice::from_raw_parts(p, count) };
    for (i, v) in b.iter().enumerate() {
        assert_eq!(*v, want(i), "{what}, {count} f32: element {i}");
    }
    // SAFETY: from ncclMemAlloc, no longer used.
    ok(unsafe { ncclMemFree(p as *mut c_void) }, "ncclMemFree");
}

fn value(rank: usize, i: usize) -> f32 {
    (rank * 1000 + i % 1000) as f32
}

/// Every communicator's call (`call(comm, rank)`) in one group.
fn group(comms: &[Comm], call: impl Fn(Comm, usize) -> c_int, what: &str) {
    // SAFETY: no arguments.
    ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
    for (r, c) in comms.iter().enumerate() {
        ok(call(*c, r), what);
    }
    // SAFETY: the buffers the calls named are the caller's and outlive this (the host backend
    // completes the group here).
    ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
}

/// In-place all-reduces of `count` f32 on every communicator in one group; checks the sums.
fn all_reduce(comms: &[Comm], count: usize) {
    let n = comms.len();
    let bufs: Vec<*mut f32> = (0..n).map(|r| alloc(count, |i| value(r, i))).collect();
    group(
        comms,
        // SAFETY: `count` f32 of library memory, in place.
        |c, r| unsafe {
            ncclAllReduce(
                bufs[r] as _,
                bufs[r] as _,
                count,
                FLOAT,
                SUM,
                c as _,
                null_mut(),
            )
        },
        "ncclAllReduce",
    );
    for &p in &bufs {
        check_and_free(p, count, "all-reduce", |i| {
            (0..n).map(|r| value(r, i)).sum()
        });
    }
}

/// Out-of-place all-gathers of `count` f32 per rank; checks every block.
fn all_gather(comms: &[Comm], count: usize) {
    let n = comms.len();
    let send: Vec<*mut f32> = (0..n).map(|r| alloc(count, |i| value(r, i))).collect();
    let recv: Vec<*mut f32> = (0..n).map(|_| alloc(n * count, |_| -1.0)).collect();
    group(
        comms,
        // SAFETY: `count` and `n * count` f32 of library memory.
        |c, r| unsafe {
            ncclAllGather(send[r] as _, recv[r] as _, count, FLOAT, c as _, null_mut())
        },
        "ncclAllGather",
    );
    for (r, (&s, &p)) in send.iter().zip(&recv).enumerate() {
        check_and_free(p, n * count, "all-gather", |i| value(i / count, i % count));
        check_and_free(s, count, "all-gather input", |i| value(r, i));
    }
}

/// Out-of-place reduce-scatters of `count` f32 per rank; checks every rank's sums.
fn reduce_scatter(comms: &[Comm], count: usize) {
    let n = comms.len();
    let send: Vec<*mut f32> = (0..n).map(|r| alloc(n * count, |i| value(r, i))).collect();
    let recv: Vec<*mut f32> = (0..n).map(|_| alloc(count, |_| -1.0)).collect();
    group(
        comms,
        // SAFETY: `n * count` and `count` f32 of library memory.
        |c, r| unsafe {
            ncclReduceScatter(
                send[r] as _,
                recv[r] as _,
                count,
                FLOAT,
                SUM,
                c as _,
                null_mut(),
            )
        },
        "ncclReduceScatter",
    );
    for (r, &p) in recv.iter().enumerate() {
        check_and_free(p, count, "reduce-scatter", |i| {
            (0..n).map(|q| value(q, r * count + i)).sum()
        });
    }
    for (r, &s) in send.iter().enumerate() {
        check_and_free(s, n * count, "reduce-scatter input", |i| value(r, i));
    }
}

/// The plan `python3 core/plans/plans.py example ARGS...` writes (a DSL program).
fn dsl_plan(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../plans/plans.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.args([script, "example"]).args(args);
    let out = cmd
        .output()
        .expect("running python3 core/plans/plans.py (the DSL)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?}: {err}");
    String::from_utf8(out.stdout).expect("the plan is UTF-8")
}

/// Which algorithm the INFO lines say ran `kind` of `bytes` on `rank`: the plan's line must be
/// there inside the range, a native line outside it (the log names the algorithm whenever it
/// changes: the calls alternate between inside and outside).
fn expect_runs(text: &str, kind: &str, plan_line: &str, inside: u64, outside: &[u64]) {
    let runs: Vec<&str> = text.lines().filter(|l| l.contains(" runs ")).collect();
    for rank in 0..2 {
        let want = format!("rank {rank}: {kind} of {inside} bytes runs {plan_line}");
        assert!(
            runs.iter().any(|l| l.contains(&want)),
            "rank {rank}: expected `{want}`; log:\n{text}"
        );
        for bytes in outside {
            let line = runs
                .iter()
                .find(|l| l.contains(&format!("rank {rank}: {kind} of {bytes} bytes runs ")))
                .unwrap_or_else(|| {
                    panic!("rank {rank}: no INFO line for {kind} at {bytes} bytes; log:\n{text}")
                });
            assert!(!line.contains("plan `"), "rank {rank}: {line}");
        }
    }
}

#[test]
fn nccl_collectives_take_a_plan_of_the_plan_directory_for_its_size_range() {
    let dir = std::env::temp_dir().join(format!("mscclpp-nccl-plans-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the plan directory");
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../plans/allreduce_ll_n2.json");
    let text = std::fs::read_to_string(shipped).expect("reading the shipped plan");
    // Narrow the range and rename (plain text edits: the shipped file's fields are one per key).
    let mut plan = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        let comma = if t.ends_with(',') { "," } else { "" };
        if t.starts_with("\"name\":") && plan.len() < 200 {
            plan += &format!("{indent}\"name\": \"{PLAN}\"{comma}\n");
        } else if t.starts_with("\"min_message_size\":") {
            plan += &format!("{indent}\"min_message_size\": 4096{comma}\n");
        } else if t.starts_with("\"max_message_size\":") {
            plan += &format!("{indent}\"max_message_size\": 65536{comma}\n");
        } else {
            plan += line;
            plan.push('\n');
        }
    }
    let file = dir.join("allreduce_ll_narrow.json");
    std::fs::write(&file, plan).expect("writing the plan");
    // The DSL's out-of-place all-gather and reduce-scatter for 8..=128 KiB messages (the
    // all-gather's output, the reduce-scatter's input).
    for (kind, name) in [("allgather", AG_PLAN), ("reducescatter", RS_PLAN)] {
        let text = dsl_plan(&[
            kind, "2", "--min", "8192", "--max", "131072", "--name", name,
        ]);
        std::fs::write(dir.join(format!("{name}.json")), text).expect("writing the plan");
    }
    let log = dir.join("log");
    // The only test of this binary: no other thread reads the environment.
    std::env::set_var("MSCCLPP_CACHE_DIR", &dir);
    std::env::set_var("MSCCLPP_LOG_LEVEL", "INFO");
    std::env::set_var("MSCCLPP_LOG_SUBSYS", "COLL");
    std::env::set_var("MSCCLPP_LOG_FILE", &log);

    let comms = common::comms_in_group(2);
    // All-reduce: 1 KiB native; 16 KiB the plan; 256 KiB native again. All-gather and
    // reduce-scatter of 256, 4096, 65536 f32 per rank: messages of 2 KiB, 32 KiB, 512 KiB.
    for count in [256, 4096, 65536] {
        all_reduce(&comms, count);
        all_gather(&comms, count);
        reduce_scatter(&comms, count);
    }
    for c in comms {
        // SAFETY: live handles from init.
        ok(unsafe { ncclCommDestroy(c as *mut _) }, "ncclCommDestroy");
    }
    let text = std::fs::read_to_string(&log).expect("reading the log");
    let _ = std::fs::remove_dir_all(&dir);
    let at = |name: &str, file: &Path| format!("plan `{name}` ({})", file.display());
    expect_runs(&text, "allreduce", &at(PLAN, &file), 16384, &[1024, 262144]);
    for (kind, name) in [("allgather", AG_PLAN), ("reducescatter", RS_PLAN)] {
        let file = dir.join(format!("{name}.json"));
        expect_runs(&text, kind, &at(name, &file), 16384, &[1024, 262144]);
    }
}
