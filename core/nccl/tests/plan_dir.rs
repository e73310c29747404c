//! A plan in the plan directory reaches `ncclAllReduce` (host backend, two ranks driven by one
//! thread through a group): a shipped in-place LL all-reduce plan (core/plans), its size range
//! narrowed to 4..=64 KiB, is taken for in-place all-reduces inside that range (the INFO line
//! of the collectives names the plan and its file) and the native algorithm outside it, with
//! correct results either way.
//!
//! The environment is read once per process, so this file is its own test binary with one
//! test that sets `MSCCLPP_CACHE_DIR` and the log variables before anything reads them.

mod common;

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use mscclpp_nccl::abi;
use mscclpp_nccl::exports::*;
use mscclpp_nccl::exports_ops::*;

type Comm = *mut c_void;
const FLOAT: c_int = 7;
const SUM: c_int = 0;
const PLAN: &str = "nccl_plan_dir_test_allreduce_ll";

fn ok(r: c_int, what: &str) {
    assert_eq!(r, abi::SUCCESS, "{what} -> {r}");
}

/// In-place all-reduces of `count` f32 on both communicators in one group; checks the sums.
fn all_reduce(comms: &[Comm], count: usize) {
    // ncclMemAlloc: plans run on memory the library allocated (host memory on this backend).
    let bufs: Vec<*mut f32> = (0..comms.len())
        .map(|r| {
            let mut p: *mut c_void = null_mut();
            // SAFETY: a valid out-pointer.
            ok(unsafe { ncclMemAlloc(&mut p, count * 4) }, "ncclMemAlloc");
            let p = p as *mut f32;
            for i in 0..count {
                // SAFETY: `count` f32 of host memory just allocated.
                unsafe { *p.add(i) = (r * 1000 + i % 1000) as f32 };
            }
            p
        })
        .collect();
    // SAFETY: every buffer outlives the group (the host backend completes it in GroupEnd).
    unsafe {
        ok(ncclGroupStart(), "ncclGroupStart");
        for (c, b) in comms.iter().zip(&bufs) {
            let p = *b as *mut c_void;
            ok(
                ncclAllReduce(p, p, count, FLOAT, SUM, *c as *mut _, null_mut()),
                "ncclAllReduce",
            );
        }
        ok(ncclGroupEnd(), "ncclGroupEnd");
    }
    for &p in &bufs {
        // SAFETY: `count` f32 of host memory, complete after GroupEnd.
        let b = unsafe { std::slice::from_raw_parts(p, count) };
        for (i, v) in b.iter().enumerate() {
            let want: f32 = (0..comms.len()).map(|r| (r * 1000 + i % 1000) as f32).sum();
            assert_eq!(*v, want, "{count} f32: element {i}");
        }
        // SAFETY: from ncclMemAlloc, no longer used.
        ok(unsafe { ncclMemFree(p as *mut c_void) }, "ncclMemFree");
    }
}

#[test]
fn nccl_all_reduce_takes_a_plan_of_the_plan_directory_for_its_size_range() {
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
    let log = dir.join("log");
    // The only test of this binary: no other thread reads the environment.
    std::env::set_var("MSCCLPP_CACHE_DIR", &dir);
    std::env::set_var("MSCCLPP_LOG_LEVEL", "INFO");
    std::env::set_var("MSCCLPP_LOG_SUBSYS", "COLL");
    std::env::set_var("MSCCLPP_LOG_FILE", &log);

    let comms = common::comms_in_group(2);
    // 1 KiB: native; 16 KiB: the plan; 256 KiB: native again.
    for count in [256, 4096, 65536] {
        all_reduce(&comms, count);
    }
    for c in comms {
        // SAFETY: live handles from init.
        ok(unsafe { ncclCommDestroy(c as *mut _) }, "ncclCommDestroy");
    }
    let text = std::fs::read_to_string(&log).expect("reading the log");
    let _ = std::fs::remove_dir_all(&dir);
    let runs: Vec<&str> = text.lines().filter(|l| l.contains(" runs ")).collect();
    let plan_line = format!(
        "allreduce of 16384 bytes runs plan `{PLAN}` ({})",
        file.display()
    );
    for rank in 0..2 {
        let of = |what: &str| {
            runs.iter()
                .any(|l| l.contains(&format!("rank {rank}: allreduce of {what}")))
        };
        assert!(
            of(&plan_line["allreduce of ".len()..]),
            "rank {rank}: expected the plan at 16 KiB; log:\n{text}"
        );
        for bytes in [1024, 262144] {
            let line = runs
                .iter()
                .find(|l| l.contains(&format!("rank {rank}: allreduce of {bytes} bytes runs ")))
                .unwrap_or_else(|| {
                    panic!("rank {rank}: no INFO line at {bytes} bytes; log:\n{text}")
                });
            assert!(!line.contains("plan `"), "rank {rank}: {line}");
        }
    }
}
