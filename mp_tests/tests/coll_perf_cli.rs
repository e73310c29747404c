//! `coll_perf` as a user meets it: runs that would measure nothing are refused before any rank
//! starts, an error every rank hits alike is printed once for the job, and rows stream.

#[allow(dead_code)] // the shared helpers name mp_unit_tests too; this test runs coll_perf
mod common;

use std::process::{Command, Output};

use common::{output_without, LAUNCHER_VARS};

const COLL_PERF: &str = env!("CARGO_BIN_EXE_coll_perf");

fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(COLL_PERF);
    cmd.args(args);
    output_without(cmd, &LAUNCHER_VARS, envs)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn bad_sweeps_exit_2_before_any_rank_starts() {
    for (args, want) in [
        (
            &["--np", "2", "-b", "3", "-e", "3"][..],
            "-b 3: below one float element",
        ),
        (
            &["--np", "2", "-b", "0"][..],
            "-b 0: below one float element",
        ),
        (&["--np", "2", "-n", "0"][..], "-n 0: expected at least 1"),
        (&["--np", "2", "-c", "2"][..], "-c `2`: expected 0"),
        (
            &["--np", "2", "-b", "2M", "-e", "1M"][..],
            "must not exceed the largest",
        ),
        (
            &["--np", "2", "--trace"][..],
            "--trace: traces an execution plan",
        ),
    ] {
        let start = std::time::Instant::now();
        let o = run(args, &[]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {out}{err}");
        assert!(err.contains(want), "{args:?} must say {want:?}: {err}");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "{args:?}: refused at once"
        );
    }
}

#[test]
fn an_error_every_rank_hits_is_printed_once_for_the_job() {
    let port = 29_600 + (std::process::id() % 300) as u16;
    let ip_port = format!("--ip_port=127.0.0.1:{port}");
    let o = run(
        &[
            "--np", "2", &ip_port, "-b", "1K", "-e", "1K", "-n", "1", "-w", "0",
        ],
        &[("MSCCLPP_ALLREDUCE_ALGO", "bogus")],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert_eq!(
        err.matches("MSCCLPP_ALLREDUCE_ALGO=bogus").count(),
        1,
        "one line for the job: {err}"
    );
    assert!(
        err.contains("coll_perf: all 2 ranks: invalid usage: MSCCLPP_ALLREDUCE_ALGO=bogus: "),
        "{err}"
    );
    assert_eq!(err.matches("invalid usage").count(), 1, "one prefix: {err}");
}

#[test]
fn the_host_backend_says_what_it_measures_and_rows_have_digits() {
    let port = 29_600 + (std::process::id() % 300) as u16 + 1;
    let ip_port = format!("--ip_port=127.0.0.1:{port}");
    let o = run(
        &[
            "--np", "2", &ip_port, "-b", "1K", "-e", "4K", "-f", "4", "-d", "fp16", "-n", "2",
            "-w", "1",
        ],
        &[],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("# host backend: CPU threads play the GPU"),
        "{out}"
    );
    let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 2, "1K and 4K: {out}");
    for r in rows {
        let f: Vec<&str> = r.split_whitespace().collect();
        // algbw and busbw, out of place: not rounded away to 0.00.
        for cell in [f[6], f[7]] {
            let v: f64 = cell.parse().expect("a number");
            assert!(v > 0.0, "a GB/s cell printed as {cell}: {r}");
        }
    }
}

#[test]
fn trace_prints_the_time_of_every_op_of_the_plan() {
    let port = 29_600 + (std::process::id() % 300) as u16 + 2;
    let ip_port = format!("--ip_port=127.0.0.1:{port}");
    let plan = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../core/plans/allreduce_ll_n2.json"
    );
    let o = run(
        &[
            "--np", "2", &ip_port, "--plan", plan, "--trace", "-b", "1K", "-e", "1K", "-n", "2",
            "-w", "1",
        ],
        &[],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("#   trace of `allreduce_ll_n2`, send 1024 B, recv 1024 B"),
        "{out}"
    );
    // Warm-up, timed and checked launches of the traced run: 1 + 2 + 1.
    assert!(out.contains("block 0: 4 launch(es)"), "{out}");
    let ops: Vec<&str> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim_start_matches('#').split_whitespace().collect();
            (f.len() == 5 && f[0].parse::<usize>().is_ok()).then(|| f[1])
        })
        .collect();
    assert_eq!(ops, ["ppkt", "respkt", "upkt"], "{out}");
}
