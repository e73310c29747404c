//! Self-tests of the multi-rank verdicts: a failure on one rank fails the test on all of
//! them, only rank 0 prints the summary, and the self-launcher and mpirun both work.

mod common;

use std::process::{Command, Output};

use common::{output_without, BIN, LAUNCHER_VARS};

/// Runs the binary with a 60 s timeout, none of the launcher variables inherited.
fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).args(["--timeout=60"]);
    output_without(cmd, &LAUNCHER_VARS, envs)
}

/// [`run`], checking that it exits with `code`; returns its stdout and stderr.
fn run_exiting(args: &[&str], envs: &[(&str, &str)], code: i32) -> (String, String) {
    let out = run(args, envs);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}

fn summary_lines(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.ends_with(" skipped") && l.contains(" passed, ") && l.contains(" failed, "))
        .collect()
}

#[test]
fn failure_on_rank_2_fails_everywhere() {
    let (stdout, stderr) = run_exiting(
        &["--np=4", "--filter=MultiProcessTest.InjectedFailure"],
        &[("MSCCLPP_TEST_INJECT_FAILURE_RANK", "2")],
        1,
    );
    assert!(
        stdout.contains("[  FAILED  ] MultiProcessTest.InjectedFailure"),
        "rank 0 must report the failure of rank 2:\n{stdout}"
    );
    assert_eq!(
        summary_lines(&stdout),
        vec!["0 passed, 1 failed, 0 skipped"],
        "{stdout}"
    );
    // The failing rank prints its own failure text, with the location of the check.
    assert!(stderr.contains("[rank 2]"), "stderr:\n{stderr}");
    assert!(stderr.contains("multi_process.rs:"), "stderr:\n{stderr}");
    // Ranks that passed print no failure text of their own.
    for r in [1, 3] {
        let prefix = format!("[rank {r}]");
        assert!(
            !stderr
                .lines()
                .any(|l| l.starts_with(&prefix) && l.contains("Failure")),
            "rank {r} passed but printed a failure:\n{stderr}"
        );
    }
}

#[test]
fn passing_run_prints_one_summary() {
    let (stdout, _) = run_exiting(&["--np=4", "--filter=MultiProcessTest"], &[], 0);
    let lines = summary_lines(&stdout);
    assert_eq!(lines.len(), 1, "only rank 0 prints the summary:\n{stdout}");
    assert_eq!(lines[0], "3 passed, 0 failed, 2 skipped");
    // Every rank says why the injected-failure test skipped (rank 0 on stdout).
    assert!(
        stdout.contains("MSCCLPP_TEST_INJECT_FAILURE_RANK is not set"),
        "{stdout}"
    );
}

#[test]
fn under_mpirun_when_present() {
    let Ok(which) = Command::new("sh")
        .args(["-c", "command -v mpirun"])
        .output()
    else {
        return;
    };
    if !which.status.success() {
        eprintln!("SKIPPED: mpirun is not installed");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("reserving a port");
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4", BIN])
        .arg("--filter=MultiProcessTest.InjectedFailure")
        .arg(format!("--ip_port=127.0.0.1:{port}"))
        .env("MSCCLPP_TEST_INJECT_FAILURE_RANK", "2")
        .output()
        .expect("spawning mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_ne!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(
        summary_lines(&stdout),
        vec!["0 passed, 1 failed, 0 skipped"],
        "{stdout}"
    );
}

#[test]
fn bad_arguments_exit_2() {
    assert_eq!(run(&["--np=zero"], &[]).status.code(), Some(2));
    assert_eq!(run(&["--no-such-flag"], &[]).status.code(), Some(2));
}
