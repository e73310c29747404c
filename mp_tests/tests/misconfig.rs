//! Misconfiguration must never read as success: each bad argument or environment value makes
//! `mp_unit_tests` exit non-zero with a message naming it (issue 20, item 10).

mod common;

use std::process::{Command, Output};

use common::{output_without, BIN, LAUNCHER_VARS};

/// Runs the binary as a lone process (no launcher variables, no `MSCCLPP_IBV_SO` inherited).
fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    let mut remove = LAUNCHER_VARS.to_vec();
    remove.push("MSCCLPP_IBV_SO");
    output_without(cmd, &remove, envs)
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn every_bad_argument_exits_2_naming_it() {
    for (args, want) in [
        (&["--timeout=0"][..], "--timeout=0: expected"),
        (&["--timeout", "-5"][..], "--timeout=-5: expected"),
        (&["--ip_port=1.2.3.4:99999"][..], "--ip_port=1.2.3.4:99999:"),
        (&["--ip_port=nocolon"][..], "--ip_port=nocolon:"),
        (&["--np=zero"][..], "--np=zero: expected"),
        (&["--np=0"][..], "--np=0: expected"),
        (&["--np"][..], "--np needs a value"),
        (&["--ib_gid_index=x"][..], "--ib_gid_index=x: expected"),
        (&["--no-such-flag"][..], "unknown argument '--no-such-flag'"),
        (
            &["--filter=NoSuchSuite"][..],
            "no test matches --filter=NoSuchSuite",
        ),
        // Self-launch checks everything before starting a rank.
        (&["--np=2", "--filter=NoSuchSuite"][..], "no test matches"),
        (
            &["--np=2", "--ip_port=1.2.3.4:99999"][..],
            "--ip_port=1.2.3.4:99999:",
        ),
    ] {
        let start = std::time::Instant::now();
        let o = run(args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains(want),
            "{args:?} must say {want:?}: {}",
            text(&o)
        );
        // Refused before any bootstrap: no timeout is waited.
        assert!(
            start.elapsed().as_secs() < 10,
            "{args:?} took {:?}",
            start.elapsed()
        );
    }
    // The same variables from a launcher.
    let o = run(&[], &[("RANK", "x"), ("WORLD_SIZE", "2")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn a_broken_ibv_so_fails_the_ib_tests_with_the_loaders_message() {
    let o = run(
        &[
            "--filter=IbPeerToPeerTest.SimpleSendRecv",
            "--exclude-perf-tests",
        ],
        &[("MSCCLPP_IBV_SO", "/nonexistent/libibverbs-broken.so")],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("MSCCLPP_IBV_SO=/nonexistent/libibverbs-broken.so is set"),
        "{t}"
    );
    // The loader's own words (dlopen's message) reach the report.
    assert!(t.contains("cannot open shared object file"), "{t}");
    assert!(t.contains("0 passed, 1 failed, 0 skipped"), "{t}");
    // Unset, the same test skips with its reason (no IB on this machine) or runs.
    let o = run(
        &[
            "--filter=IbPeerToPeerTest.SimpleSendRecv",
            "--exclude-perf-tests",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
