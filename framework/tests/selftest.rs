//! Runs the `framework_fixture` binary as a subprocess with several argument sets and checks
//! exit codes, the printed report, failure locations and the fixture/environment event log.

use std::path::PathBuf;
use std::process::Command;

const FIXTURE_SOURCE: &str = include_str!("fixture/framework_fixture.rs");
const ALL_TESTS: [&str; 17] = [
    "Pass.Simple",
    "Pass.AllMacros",
    "Pass.Context",
    "Expect.TwoFailures",
    "Expect.EveryOperator",
    "Assert.StopsEarly",
    "Panic.Boom",
    "Skip.Reasoned",
    "Fail.Explicit",
    "Threaded.ExpectInThread",
    "Fx.Passes",
    "Fx.BodyFails",
    "Fx.BodyPanics",
    "Fx.BodySkips",
    "BadFx.SetupFails",
    "Perf.Latency",
    "Fx.PerfWithFixture",
];

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
    log: Vec<String>,
}

impl Outcome {
    fn last_line(&self) -> &str {
        self.stdout.lines().last().unwrap_or("")
    }
    fn ran(&self) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix("[ RUN      ] "))
            .map(str::to_owned)
            .collect()
    }
    /// Checks the exit code, the tests that ran (in order) and the summary line.
    fn assert_ran(&self, code: i32, ran: &[&str], summary: &str) {
        assert_eq!(self.code, code, "{}", self.stdout);
        assert_eq!(self.ran(), ran, "{}", self.stdout);
        assert_eq!(self.last_line(), summary);
    }
    fn log_has(&self, event: &str) -> bool {
        self.log.iter().any(|l| l == event)
    }
    fn log_pos(&self, event: &str) -> usize {
        self.log
            .iter()
            .position(|l| l == event)
            .unwrap_or_else(|| panic!("event '{event}' missing from log {:?}", self.log))
    }
}

/// Asserts that `text` contains every one of `parts`.
fn assert_contains(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} missing from:\n{text}");
    }
}

/// Runs the fixture with `args` and extra environment variables; `tag` names its log file.
fn run_fixture(tag: &str, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let log: PathBuf = std::env::temp_dir().join(format!(
        "mscclpp-fw-selftest-{}-{tag}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_framework_fixture"));
    cmd.args(args).env("FW_LOG", &log);
    for var in [
        "FW_ENV_FAIL",
        "FW_RANK",
        "FW_SIZE",
        "FW_PEER_FAILS",
        "FW_COMBINE_FAIL_AT",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawning framework_fixture");
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let o = Outcome {
        code: out.status.code().expect("fixture killed by a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        log: log_text.lines().map(str::to_owned).collect(),
    };
    eprintln!(
        "--- {tag}: exit {}\n{}\n--- stderr\n{}",
        o.code, o.stdout, o.stderr
    );
    o
}

/// The 1-based line of the fixture source carrying `// MARK:<name>`.
fn marker_line(name: &str) -> usize {
    let tag = format!("// MARK:{name}");
    let hits: Vec<usize> = FIXTURE_SOURCE
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_end().ends_with(&tag))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(hits.len(), 1, "marker {name} must occur once");
    hits[0]
}

/// Asserts that the report has a failure at `marker`'s line followed by `lines`.
fn assert_failure_at(stdout: &str, marker: &str, lines: &[&str]) {
    let head = format!(
        "tests/fixture/framework_fixture.rs:{}: Failure",
        marker_line(marker)
    );
    let all: Vec<&str> = stdout.lines().collect();
    let at = all
        .iter()
        .position(|l| l.ends_with(&head))
        .unwrap_or_else(|| panic!("no '{head}' in output"));
    for (k, want) in lines.iter().enumerate() {
        assert_eq!(all.get(at + 1 + k).copied(), Some(*want), "after '{head}'");
    }
}

#[test]
fn full_run_reports_every_outcome() {
    let o = run_fixture("full", &[], &[]);
    assert_eq!(o.code, 1);
    assert_eq!(o.last_line(), "6 passed, 9 failed, 2 skipped");
    assert_eq!(
        o.stdout.lines().next(),
        Some("[----------] Global test environment set-up.")
    );
    assert!(o.stdout.contains("[==========] Running 17 tests.\n"));
    // Same order as the source (sorted by file, line).
    assert_eq!(o.ran(), ALL_TESTS);

    // Two EXPECT failures in one test, both reported, and the test continued.
    assert_failure_at(
        &o.stdout,
        "expect_eq",
        &["Expected: x + 1 == 3", "Actual: 2 vs 3", "round 7"],
    );
    assert_failure_at(
        &o.stdout,
        "expect_true",
        &["Expected: x > 5 is true", "Actual: false"],
    );
    assert!(o.log_has("Expect.TwoFailures continued"));
    assert_failure_at(
        &o.stdout,
        "op_false",
        &["Expected: 1 < 2 is false", "Actual: true"],
    );
    assert_failure_at(&o.stdout, "op_ne", &["Expected: 4 != 4", "Actual: 4 vs 4"]);
    assert_failure_at(&o.stdout, "op_lt", &["Expected: 5 < 4", "Actual: 5 vs 4"]);
    assert_failure_at(&o.stdout, "op_le", &["Expected: 5 <= 4", "Actual: 5 vs 4"]);
    assert_failure_at(
        &o.stdout,
        "op_gt",
        &["Expected: \"a\" > \"b\"", "Actual: \"a\" vs \"b\""],
    );
    assert_failure_at(
        &o.stdout,
        "op_ge",
        &["Expected: 1.5 >= 2.5", "Actual: 1.5 vs 2.5"],
    );
    assert!(
        o.stdout.contains("Expected: v > 0\nActual: -3 vs 0\n"),
        "failure from a helper fn"
    );

    // ASSERT ends the test: the line after it never ran.
    assert_failure_at(
        &o.stdout,
        "assert_eq",
        &[
            "Expected: vec![1, 2] == vec![1, 3]",
            "Actual: [1, 2] vs [1, 3]",
        ],
    );
    assert!(o.log_has("Assert.StopsEarly before"));
    assert!(!o.log_has("Assert.StopsEarly after the assert"));

    // A panic is a failure with its message and location, and the hook kept quiet.
    assert_failure_at(&o.stdout, "panic", &["Unexpected panic: boom 42"]);
    assert!(!o.log_has("Panic.Boom after the panic"));
    assert!(
        !o.stderr.contains("panicked"),
        "panic hook must stay silent"
    );

    assert!(o
        .stdout
        .contains("[ RUN      ] Skip.Reasoned\n[  SKIPPED ] Skip.Reasoned: needs 2 GPUs\n"));
    assert!(!o.log_has("Skip.Reasoned after the skip"));
    assert_failure_at(&o.stdout, "fail", &["explicit failure here"]);
    assert_failure_at(
        &o.stdout,
        "thread",
        &["Expected: 10 == 11", "Actual: 10 vs 11"],
    );
    assert_failure_at(
        &o.stdout,
        "fx_assert",
        &["Expected: fx.name.is_empty() is true", "Actual: false"],
    );
    assert_failure_at(
        &o.stdout,
        "fx_panic",
        &["Unexpected panic: fixture body panic"],
    );
    assert!(o
        .stdout
        .contains("Fixture setup failed: no device\n[  FAILED  ] BadFx.SetupFails ("));

    // OK / FAILED lines with times, failure text before the FAILED line.
    assert!(o.stdout.contains("[       OK ] Pass.Simple ("));
    let fail_text = o.stdout.find("round 7").expect("round 7");
    let fail_line = o
        .stdout
        .find("[  FAILED  ] Expect.TwoFailures (")
        .expect("FAILED line");
    assert!(fail_text < fail_line);

    // Perf block, then the failed list, then the counts.
    assert_contains(
        &o.stdout,
        &[
            "[   PERF   ] Perf.Latency: signal_ping_pong = 1.32 us/iter\n",
            "[   PERF   ] Fx.PerfWithFixture: bandwidth = 350.00 GB/s\n",
        ],
    );
    let failed_list: Vec<&str> = o
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("[  FAILED  ] 9 tests, listed below:"))
        .skip(1)
        .filter_map(|l| l.strip_prefix("[  FAILED  ] "))
        .collect();
    assert_eq!(
        failed_list,
        [
            "Expect.TwoFailures",
            "Expect.EveryOperator",
            "Assert.StopsEarly",
            "Panic.Boom",
            "Fail.Explicit",
            "Threaded.ExpectInThread",
            "Fx.BodyFails",
            "Fx.BodyPanics",
            "BadFx.SetupFails"
        ]
    );
}

#[test]
fn fixture_teardown_runs_iff_setup_succeeded_once_per_test() {
    let o = run_fixture("fixture", &[], &[]);
    for test in [
        "Fx.Passes",
        "Fx.BodyFails",
        "Fx.BodyPanics",
        "Fx.BodySkips",
        "Fx.PerfWithFixture",
    ] {
        let setups = o
            .log
            .iter()
            .filter(|l| **l == format!("setup {test}"))
            .count();
        let teardown = format!("teardown {test} used=true");
        let teardowns = o
            .log
            .iter()
            .filter(|l| l.starts_with(&format!("teardown {test} ")))
            .count();
        assert_eq!((setups, teardowns), (1, 1), "{test}: {:?}", o.log);
        // The teardown saw what the body did, so it came after it.
        assert!(o.log_pos(&format!("setup {test}")) < o.log_pos(&teardown));
    }
    assert!(o.log_pos("Fx.Passes body") < o.log_pos("teardown Fx.Passes used=true"));
    assert!(!o.log_has("Fx.BodyFails after the assert"));
    // Setup failed: neither body nor teardown.
    assert_eq!(
        o.log
            .iter()
            .filter(|l| l.contains("BadFx"))
            .collect::<Vec<_>>(),
        ["setup-failed BadFx.SetupFails"]
    );
}

#[test]
fn environments_wrap_all_tests_in_order() {
    let o = run_fixture("env", &["--filter=Pass.Simple"], &[]);
    assert_eq!(o.code, 0);
    assert_eq!(
        o.log,
        [
            "env one setup",
            "env two setup",
            "Pass.Simple ran",
            "env two teardown",
            "env one teardown"
        ]
    );
    assert_eq!(o.last_line(), "1 passed, 0 failed, 0 skipped");
}

#[test]
fn failed_environment_setup_fails_the_run() {
    let o = run_fixture("envfail", &[], &[("FW_ENV_FAIL", "1")]);
    assert_eq!(o.code, 1);
    assert_eq!(
        o.log,
        ["env one setup", "env two setup", "env one teardown"]
    );
    assert!(o.ran().is_empty());
    assert!(o.stderr.contains("two refused to start"), "{}", o.stderr);
}

#[test]
fn positive_filters_select_substrings() {
    let o = run_fixture("filter1", &["--filter=Pass.,Skip."], &[]);
    o.assert_ran(
        0,
        &[
            "Pass.Simple",
            "Pass.AllMacros",
            "Pass.Context",
            "Skip.Reasoned",
        ],
        "3 passed, 0 failed, 1 skipped",
    );

    let o = run_fixture("filter2", &["--filter", "Fx."], &[]);
    o.assert_ran(
        1,
        &[
            "Fx.Passes",
            "Fx.BodyFails",
            "Fx.BodyPanics",
            "Fx.BodySkips",
            "BadFx.SetupFails",
            "Fx.PerfWithFixture",
        ],
        "2 passed, 3 failed, 1 skipped",
    );
}

#[test]
fn negative_filter_excludes_substrings() {
    let o = run_fixture(
        "filter3",
        &["--filter=-Expect,Assert,Panic,Fail,Threaded,Fx,Skip"],
        &[],
    );
    o.assert_ran(
        0,
        &[
            "Pass.Simple",
            "Pass.AllMacros",
            "Pass.Context",
            "Perf.Latency",
        ],
        "4 passed, 0 failed, 0 skipped",
    );
}

#[test]
fn list_prints_selected_tests_and_runs_nothing() {
    let o = run_fixture("list", &["--list"], &[]);
    assert_eq!(o.code, 0);
    let want: Vec<String> = ALL_TESTS.iter().map(|t| format!("{t}: test")).collect();
    assert_eq!(o.stdout.lines().collect::<Vec<_>>(), want);
    assert!(
        o.log.is_empty(),
        "--list must not set up environments or run tests"
    );

    let o = run_fixture("list2", &["--list", "--exclude-perf-tests"], &[]);
    let want: Vec<String> = ALL_TESTS[..15]
        .iter()
        .map(|t| format!("{t}: test"))
        .collect();
    assert_eq!(o.stdout.lines().collect::<Vec<_>>(), want);

    let o = run_fixture(
        "list3",
        &["--only-perf-tests", "--list", "--filter=-Fx"],
        &[],
    );
    assert_eq!(o.stdout, "Perf.Latency: test\n");
}

#[test]
fn perf_selection_flags() {
    let o = run_fixture("perfonly", &["--only-perf-tests"], &[]);
    o.assert_ran(
        0,
        &["Perf.Latency", "Fx.PerfWithFixture"],
        "2 passed, 0 failed, 0 skipped",
    );

    let o = run_fixture(
        "perfexcl",
        &["--exclude-perf-tests", "--filter=Pass.,Perf"],
        &[],
    );
    assert_eq!(o.ran(), ["Pass.Simple", "Pass.AllMacros", "Pass.Context"]);
    assert!(!o.stdout.contains("[   PERF   ]"));
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &["--bogus"][..],
        &["--filter"][..],
        &["--only-perf-tests", "--exclude-perf-tests"][..],
    ] {
        let o = run_fixture("badarg", args, &[]);
        assert_eq!(o.code, 2, "{args:?}");
        assert!(o.ran().is_empty());
        assert!(o.stderr.contains("error:"), "{args:?}: {}", o.stderr);
    }
    let o = run_fixture("help", &["--help"], &[]);
    assert_eq!(o.code, 0);
    assert_contains(&o.stdout, &["--filter", "--only-perf-tests"]);
}

#[test]
fn a_selection_matching_nothing_exits_2_with_a_message() {
    for (args, names) in [
        (&["--filter=NoSuchSuite"][..], "--filter=NoSuchSuite"),
        (&["--filter=NoSuch", "--list"][..], "--filter=NoSuch"),
        (
            &["--filter=Pass.", "--only-perf-tests"][..],
            "--filter=Pass. --only-perf-tests",
        ),
        (&["--filter=-."][..], "--filter=-."),
    ] {
        let o = run_fixture("nomatch", args, &[]);
        assert_eq!(
            o.code, 2,
            "{args:?}: a typo in --filter must not read as success"
        );
        assert!(o.ran().is_empty(), "{args:?}");
        assert!(
            o.stderr.contains(&format!(
                "error: no test matches {names} (0 of 17 registered"
            )),
            "{args:?}: {}",
            o.stderr
        );
    }
    // --help still answers whatever the filter.
    let o = run_fixture("nomatch-help", &["--filter=NoSuch", "--help"], &[]);
    assert_eq!(o.code, 0);
    assert_contains(&o.stdout, &["--filter", "--only-perf-tests"]);
}

#[test]
fn nonzero_rank_prints_failures_and_skips_on_stderr_only() {
    let env = [("FW_RANK", "1"), ("FW_SIZE", "2")];
    let o = run_fixture(
        "rank1",
        &["--filter=Expect.TwoFailures,Skip.Reasoned"],
        &env,
    );
    assert_eq!(o.code, 1);
    assert_eq!(o.stdout, "", "only rank 0 prints to stdout");
    let head = format!(
        "[rank 1] framework/tests/fixture/framework_fixture.rs:{}: Failure\n",
        marker_line("expect_eq")
    );
    assert_contains(
        &o.stderr,
        &[
            &head,
            "[rank 1] Actual: 2 vs 3\n[rank 1] round 7\n",
            "[rank 1] [  SKIPPED ] Skip.Reasoned: needs 2 GPUs\n",
        ],
    );
}

#[test]
fn a_failure_on_another_rank_fails_the_test_here() {
    let o = run_fixture(
        "peerfail",
        &["--filter=Pass.Simple"],
        &[("FW_PEER_FAILS", "1"), ("FW_SIZE", "2")],
    );
    o.assert_ran(1, &["Pass.Simple"], "0 passed, 1 failed, 0 skipped");
    assert_contains(
        &o.stdout,
        &["Failed on another rank", "[  FAILED  ] Pass.Simple ("],
    );
}

#[test]
fn a_combine_error_fails_the_test_and_stops_the_run() {
    let o = run_fixture(
        "lost",
        &["--filter=Pass."],
        &[("FW_COMBINE_FAIL_AT", "2"), ("FW_SIZE", "2")],
    );
    o.assert_ran(
        1,
        &["Pass.Simple", "Pass.AllMacros"],
        "1 passed, 1 failed, 0 skipped",
    );
    assert!(o.stdout.contains("[  FAILED  ] Pass.AllMacros ("));
    assert!(
        o.stderr.contains("peer 1 closed the connection"),
        "{}",
        o.stderr
    );
    assert_eq!(o.log.last().map(String::as_str), Some("env one teardown"));
}
