//! The C test program (tests/c/nccl_api_test.c), compiled against the shipped nccl.h and
//! linked to libmscclpp_nccl.so, run under `mpirun` on the host backend: -np 2 and 4 (every
//! collective with checked results, point-to-point and groups, bad arguments, split/shrink,
//! destroy), the point-to-point and group checks alone at -np 8, 2 emulated nodes of 2 ranks,
//! a dead peer (-np 3) and the fallback to a fake NCCL (-np 2).
//!
//! Emulated nodes as .ci/multinode-test makes them: every rank of node m runs with
//! `MSCCLPP_HOSTID=multinode-m` (set by a `sh -c` wrapper before the program starts), so the
//! host hashes split the world and ranks of different nodes talk over Ethernet.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::{compile_c, out_dir, run_with_limit};

/// Collectives that must run natively on the host backend (a "not supported here" for one of
/// these fails the test; for others it is a skip the program reports with its reason).
const REQUIRED_NATIVE: &str = "allreduce,allreduce_large,alltoall,gather,scatter,sendrecv";

fn programs() -> &'static (PathBuf, PathBuf) {
    static P: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    P.get_or_init(|| {
        let dir = out_dir();
        let exe = dir.join("nccl_api_test");
        compile_c(&["nccl_api_test.c", "modes.c"], &exe, false);
        let fake = dir.join("libfake_nccl.so");
        compile_c(&["fake_nccl.c"], &fake, true);
        (exe, fake)
    })
}

/// Runs the program on `np` ranks with `env`; returns every rank's summary line after checking
/// that mpirun succeeded and no rank failed.
fn run(np: usize, tag: &str, env: &[(&str, String)]) -> String {
    run_nodes(np, None, tag, env).0
}

/// [`run`] on emulated nodes of `per_node` ranks each (`None`: one node); returns stdout and
/// stderr.
fn run_nodes(
    np: usize,
    per_node: Option<usize>,
    tag: &str,
    env: &[(&str, String)],
) -> (String, String) {
    // One mpirun at a time: the ranks spin while they wait and the machine has few cores.
    static SERIAL: Mutex<()> = Mutex::new(());
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (exe, _) = programs();
    let id_file = out_dir().join(format!("id-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_file(&id_file);
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", &np.to_string(), "--oversubscribe"]);
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("NCCL_TEST_ID_FILE", &id_file)
        .env("NCCL_TEST_REQUIRE", REQUIRED_NATIVE);
    let mut names = vec!["NCCL_TEST_ID_FILE", "NCCL_TEST_REQUIRE"];
    for (k, v) in env {
        cmd.env(k, v);
        names.push(k);
    }
    for n in names {
        cmd.args(["-x", n]);
    }
    if let Some(k) = per_node {
        // Open MPI numbers the ranks in OMPI_COMM_WORLD_RANK; "$0" is the program.
        let set = format!("MSCCLPP_HOSTID=multinode-$((OMPI_COMM_WORLD_RANK / {k})) exec \"$0\"");
        cmd.args(["sh", "-c", &set]);
    }
    cmd.arg(exe);
    if let Err(e) = Command::new("mpirun").arg("--version").output() {
        panic!("mpirun is not runnable ({e}): install Open MPI (.ci/setup)");
    }
    let (out, timed_out) = run_with_limit(cmd, Duration::from_secs(300));
    let _ = std::fs::remove_file(&id_file);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = format!("--- stdout\n{stdout}--- stderr\n{stderr}");
    assert!(
        !timed_out,
        "mpirun -np {np} ({tag}) ran past 300 s\n{report}"
    );
    assert!(
        out.status.success(),
        "mpirun -np {np} ({tag}) failed: {}\n{report}",
        out.status
    );
    let summaries: Vec<&str> = stdout.lines().filter(|l| l.contains(" passed, ")).collect();
    assert_eq!(
        summaries.len(),
        np,
        "expected one summary per rank\n{report}"
    );
    for s in &summaries {
        assert!(s.contains(" 0 failed"), "a rank failed: {s}\n{report}");
    }
    println!("{report}");
    (stdout, stderr)
}

fn passed_of(stdout: &str) -> usize {
    stdout
        .lines()
        .filter_map(|l| {
            l.split(": ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .min()
        .unwrap_or(0)
}

#[test]
fn c_program_np2() {
    let out = run(2, "np2", &[]);
    assert!(passed_of(&out) > 200, "too few checks ran:\n{out}");
}

#[test]
fn c_program_np4() {
    let out = run(4, "np4", &[]);
    assert!(passed_of(&out) > 200, "too few checks ran:\n{out}");
}

/// The point-to-point and group checks alone at -np 8 (oversubscribed): every pattern with 8
/// peers, groups over two communicators, the open-group warning.
#[test]
fn c_program_p2p_np8() {
    let out = run(8, "p2p8", &[("NCCL_TEST_MODE", "p2p".into())]);
    assert!(passed_of(&out) > 100, "too few checks ran:\n{out}");
}

/// Two emulated nodes of 2 ranks (MSCCLPP_HOSTID per node, Ethernet between them): every
/// collective natively through the hierarchical algorithms (broadcast included), p2p across
/// nodes (every pattern and group of p2p_checks.h), and the split/shrunk communicators that
/// span nodes with one rank per node. Repeated: the ends of calls raced with the peer's
/// communicator teardown (a lost last ack).
#[test]
fn c_program_two_emulated_nodes_np4() {
    for round in 0..3 {
        let (out, err) = run_nodes(
            4,
            Some(2),
            &format!("twonodes{round}"),
            &[
                ("MSCCLPP_COLL_NET_TRANSPORT", "ethernet".into()),
                ("NCCL_TEST_REQUIRE", "all".into()),
                ("MSCCLPP_LOG_LEVEL", "INFO".into()),
                ("MSCCLPP_LOG_SUBSYS", "COLL,NCCL".into()),
            ],
        );
        assert!(
            passed_of(&out) > 200,
            "round {round}: too few checks ran:\n{out}"
        );
        // The world spans the emulated nodes: the hierarchical collectives ran.
        assert!(
            err.contains(" runs hier_"),
            "round {round}: no hierarchical collective ran (one node only?)"
        );
    }
}

#[test]
fn c_program_dead_peer_np3() {
    run(3, "deadpeer", &[("NCCL_TEST_MODE", "deadpeer".into())]);
}

/// The dead peer across nodes: 2 emulated nodes of 2 ranks (Ethernet between them), the last
/// rank (node 1) exits; the others, its rail peer on node 0 among them, must see
/// ncclRemoteError and abort fast.
#[test]
fn c_program_dead_peer_two_emulated_nodes_np4() {
    run_nodes(
        4,
        Some(2),
        "deadpeer2n",
        &[
            ("NCCL_TEST_MODE", "deadpeer".into()),
            ("MSCCLPP_COLL_NET_TRANSPORT", "ethernet".into()),
        ],
    );
}

#[test]
fn c_program_fallback_to_a_fake_nccl_np2() {
    let (_, fake) = programs();
    run(
        2,
        "fallback",
        &[
            ("NCCL_TEST_MODE", "fallback".into()),
            ("MSCCLPP_NCCL_LIB_PATH", fake.display().to_string()),
            ("MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION", "allreduce".into()),
        ],
    );
}
