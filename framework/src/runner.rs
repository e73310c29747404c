//! The runner: command line, selection, environments, the per-test loop with the
//! cross-rank verdict exchange, and gtest-style reporting.

use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

use crate::state::{self, PerfRecord, TestCase, TestContext};
use crate::verdict::{SingleProcessWorld, Verdict, World};

/// Process-wide setup run once before all tests and torn down once after them.
pub trait Environment {
    /// Runs once before the first test; an error stops the run.
    fn setup(&mut self) -> Result<(), String>;
    /// Runs once after the last test.
    fn teardown(&mut self);
}

/// Which tests `--filter` keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// No filter (or an empty one).
    All,
    /// Keep names containing any of these substrings.
    Include(Vec<String>),
    /// Drop names containing any of these substrings (`--filter=-A,B`).
    Exclude(Vec<String>),
}

impl Filter {
    /// Parses `A,B` (include) or `-A,B` (exclude); empty pieces are ignored.
    pub fn parse(pattern: &str) -> Filter {
        let (exclude, list) = match pattern.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, pattern),
        };
        let parts: Vec<String> = list
            .split(',')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect();
        match (exclude, parts.is_empty()) {
            (_, true) => Filter::All,
            (false, false) => Filter::Include(parts),
            (true, false) => Filter::Exclude(parts),
        }
    }

    /// Whether the test `Suite.Name` is selected.
    pub fn matches(&self, full_name: &str) -> bool {
        match self {
            Filter::All => true,
            Filter::Include(parts) => parts.iter().any(|p| full_name.contains(p.as_str())),
            Filter::Exclude(parts) => !parts.iter().any(|p| full_name.contains(p.as_str())),
        }
    }
}

/// Which kinds of tests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerfSelection {
    /// Perf tests and the others.
    Both,
    /// Every test but the perf tests (`--exclude-perf-tests`).
    ExcludePerf,
    /// Only the perf tests (`--only-perf-tests`).
    OnlyPerf,
}

/// The parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Which tests run (`--filter`).
    pub filter: Filter,
    /// Whether perf tests run.
    pub perf: PerfSelection,
    /// `--list`: print the selected tests instead of running them.
    pub list: bool,
    /// `--help`: print [`USAGE`].
    pub help: bool,
}

/// The `--help` text.
pub const USAGE: &str = "\
Options:
  --filter=PAT, --filter PAT  run tests whose Suite.Name contains one of the comma-separated
                              substrings in PAT; a leading '-' (-A,B) excludes them instead
  --exclude-perf-tests        skip PERF_TEST tests
  --only-perf-tests           run only PERF_TEST tests
  --list                      print the selected tests ('Suite.Name: test') and exit
  --help                      print this help and exit
Exit status: 0 all passed or skipped, 1 a test failed, 2 bad arguments (also a --filter or
perf switch that selects no test).";

/// Parses the runner's arguments (without the program name).
pub fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        filter: Filter::All,
        perf: PerfSelection::Both,
        list: false,
        help: false,
    };
    let mut exclude_perf = false;
    let mut only_perf = false;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        if let Some(pat) = arg.strip_prefix("--filter=") {
            opts.filter = Filter::parse(pat);
        } else if arg == "--filter" {
            i += 1;
            let pat = args
                .get(i)
                .ok_or_else(|| "--filter expects a pattern after it, got nothing".to_owned())?;
            opts.filter = Filter::parse(pat);
        } else if arg == "--exclude-perf-tests" {
            exclude_perf = true;
        } else if arg == "--only-perf-tests" {
            only_perf = true;
        } else if arg == "--list" {
            opts.list = true;
        } else if arg == "--help" || arg == "-h" {
            opts.help = true;
        } else {
            return Err(format!("unknown argument '{arg}' (try --help)"));
        }
        i += 1;
    }
    opts.perf = match (exclude_perf, only_perf) {
        (true, true) => {
            return Err("--exclude-perf-tests and --only-perf-tests exclude each other".into())
        }
        (true, false) => PerfSelection::ExcludePerf,
        (false, true) => PerfSelection::OnlyPerf,
        (false, false) => PerfSelection::Both,
    };
    Ok(opts)
}

/// What a selection that matches nothing is told: the filter and perf switches that
/// emptied it and how many tests there are.
fn empty_selection_message(opts: &Options, registered: usize) -> String {
    let filter = match &opts.filter {
        Filter::All => None,
        Filter::Include(p) => Some(format!("--filter={}", p.join(","))),
        Filter::Exclude(p) => Some(format!("--filter=-{}", p.join(","))),
    };
    let perf = match opts.perf {
        PerfSelection::Both => None,
        PerfSelection::ExcludePerf => Some("--exclude-perf-tests".to_owned()),
        PerfSelection::OnlyPerf => Some("--only-perf-tests".to_owned()),
    };
    let given: Vec<String> = filter.into_iter().chain(perf).collect();
    format!(
        "no test matches {} (0 of {registered} registered tests selected; --list alone \
         lists them all)",
        given.join(" ")
    )
}

/// Parses the arguments and selects the tests, as [`run`] does before running anything:
/// bad arguments and a selection that matches none of the registered tests are errors
/// (exit status 2), so a typo in `--filter` never reads as a passing run. Binaries that start
/// expensive setup (a bootstrap) call this first.
pub fn checked_selection(args: &[String]) -> Result<(Options, Vec<TestCase>), String> {
    let opts = parse_args(args)?;
    let registered = state::registered_tests();
    let tests = select_tests(&registered, &opts);
    if tests.is_empty() && !registered.is_empty() && !opts.help {
        return Err(empty_selection_message(&opts, registered.len()));
    }
    Ok((opts, tests))
}

/// The registered tests that `opts` selects, in run order.
pub fn select_tests(all: &[TestCase], opts: &Options) -> Vec<TestCase> {
    all.iter()
        .filter(|t| match opts.perf {
            PerfSelection::Both => true,
            PerfSelection::ExcludePerf => !t.is_perf,
            PerfSelection::OnlyPerf => t.is_perf,
        })
        .filter(|t| opts.filter.matches(&t.full_name()))
        .copied()
        .collect()
}

/// Prints one line on stdout and flushes (mpirun interleaves ranks); errors are ignored.
fn say(rank: usize, line: &str) {
    if rank == 0 {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Prints to stderr with the rank prefix on every rank.
fn warn(rank: usize, text: &str) {
    let mut err = std::io::stderr().lock();
    for line in text.lines() {
        let _ = writeln!(err, "[rank {rank}] {line}");
    }
    let _ = err.flush();
}

fn format_value(value: f64) -> String {
    if value != 0.0 && value.abs() < 0.01 {
        format!("{value:.3e}")
    } else {
        format!("{value:.2}")
    }
}

/// Sets up environments in order; on failure tears down those already set up (in reverse)
/// and returns the error.
fn setup_environments(envs: &mut [Box<dyn Environment>]) -> Result<(), String> {
    for i in 0..envs.len() {
        let result = panic::catch_unwind(AssertUnwindSafe(|| envs[i].setup()))
            .unwrap_or_else(|_| Err("environment setup panicked".to_owned()));
        if let Err(e) = result {
            teardown_environments(&mut envs[..i]);
            return Err(format!(
                "environment {} of {} failed to set up: {e}",
                i + 1,
                envs.len()
            ));
        }
    }
    Ok(())
}

/// Tears environments down in reverse order; a panicking teardown is reported, not fatal.
fn teardown_environments(envs: &mut [Box<dyn Environment>]) -> bool {
    let mut ok = true;
    for env in envs.iter_mut().rev() {
        if panic::catch_unwind(AssertUnwindSafe(|| env.teardown())).is_err() {
            ok = false;
        }
    }
    ok
}

/// Runs one test locally and returns its local verdict and perf records.
fn run_one(case: &TestCase, ctx: &TestContext) -> (Verdict, Vec<PerfRecord>) {
    state::begin_test();
    state::set_in_test_body(true);
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| (case.body)(ctx)));
    state::set_in_test_body(false);
    if let Err(payload) = outcome {
        state::absorb_unwind(payload, ctx);
    }
    let record = state::finish_test();
    let verdict = if record.failures > 0 {
        Verdict::Failed
    } else if let Some(reason) = record.skip_reason {
        Verdict::Skipped(reason)
    } else {
        Verdict::Passed
    };
    (verdict, record.perf)
}

/// Runs the selected tests on this rank of `world` with `envs` around them and returns the
/// exit status. `args` excludes the program name.
pub fn run(args: &[String], world: &dyn World, mut envs: Vec<Box<dyn Environment>>) -> i32 {
    let rank = world.rank();
    let size = world.size();
    state::set_rank(rank);
    state::install_panic_hook();

    let (opts, tests) = match checked_selection(args) {
        Ok(o) => o,
        Err(e) => {
            warn(rank, &format!("error: {e}\n{USAGE}"));
            return 2;
        }
    };
    if opts.help {
        say(rank, USAGE);
        return 0;
    }
    if opts.list {
        for t in &tests {
            say(rank, &format!("{}: test", t.full_name()));
        }
        return 0;
    }

    if !envs.is_empty() {
        say(rank, "[----------] Global test environment set-up.");
    }
    if let Err(e) = setup_environments(&mut envs) {
        warn(rank, &format!("error: {e}"));
        say(rank, &format!("[  FAILED  ] {e}"));
        say(rank, "0 passed, 0 failed, 0 skipped");
        return 1;
    }

    let started = Instant::now();
    say(
        rank,
        &format!("[==========] Running {} tests.", tests.len()),
    );
    let (mut passed, mut skipped) = (0usize, 0usize);
    let mut failed_names: Vec<String> = Vec::new();
    let mut perf: Vec<PerfRecord> = Vec::new();
    let mut world_lost = false;

    for case in &tests {
        let ctx = TestContext::new(rank, size, case);
        let name = ctx.full_name().to_owned();
        say(rank, &format!("[ RUN      ] {name}"));
        let t0 = Instant::now();
        let (local, records) = run_one(case, &ctx);
        let ms = t0.elapsed().as_millis();
        perf.extend(records);
        if let (Verdict::Skipped(reason), true) = (&local, rank != 0) {
            warn(rank, &format!("[  SKIPPED ] {name}: {reason}"));
        }
        let combined = panic::catch_unwind(AssertUnwindSafe(|| world.combine(&local)))
            .unwrap_or_else(|_| Err("World::combine panicked".to_owned()));
        let combined = match combined {
            Ok(v) => v,
            Err(e) => {
                warn(
                    rank,
                    &format!("combining the verdicts of {name} failed: {e}; stopping"),
                );
                world_lost = true;
                Verdict::Failed
            }
        };
        match &combined {
            Verdict::Passed => {
                passed += 1;
                say(rank, &format!("[       OK ] {name} ({ms} ms)"));
            }
            Verdict::Skipped(reason) => {
                skipped += 1;
                say(rank, &format!("[  SKIPPED ] {name}: {reason}"));
            }
            Verdict::Failed => {
                if local != Verdict::Failed && !world_lost {
                    say(rank, "Failed on another rank (see that rank's stderr).");
                }
                failed_names.push(name.clone());
                say(rank, &format!("[  FAILED  ] {name} ({ms} ms)"));
            }
        }
        if world_lost {
            break;
        }
    }

    if !envs.is_empty() {
        say(rank, "[----------] Global test environment tear-down.");
    }
    let teardown_ok = teardown_environments(&mut envs);
    if !teardown_ok {
        warn(rank, "error: an environment teardown panicked");
    }

    for p in &perf {
        say(
            rank,
            &format!(
                "[   PERF   ] {}: {} = {} {}",
                p.test,
                p.label,
                format_value(p.value),
                p.unit
            ),
        );
    }
    let ran = passed + skipped + failed_names.len();
    say(
        rank,
        &format!(
            "[==========] {ran} tests ran. ({} ms total)",
            started.elapsed().as_millis()
        ),
    );
    if world_lost {
        say(
            rank,
            &format!(
                "[  FAILED  ] lost contact with the other ranks; {} tests not run",
                tests.len() - ran
            ),
        );
    }
    if !failed_names.is_empty() {
        say(
            rank,
            &format!("[  FAILED  ] {} tests, listed below:", failed_names.len()),
        );
        for n in &failed_names {
            say(rank, &format!("[  FAILED  ] {n}"));
        }
    }
    say(
        rank,
        &format!(
            "{passed} passed, {} failed, {skipped} skipped",
            failed_names.len()
        ),
    );
    if failed_names.is_empty() && !world_lost && teardown_ok {
        0
    } else {
        1
    }
}

/// `run` with `std::env::args` (lossily converted), a [`SingleProcessWorld`] and no
/// environments.
pub fn run_main() -> i32 {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    run(&args, &SingleProcessWorld, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn filter_include_exclude_and_empty() {
        let inc = Filter::parse("Foo,Bar.Baz");
        assert!(inc.matches("Foo.X") && inc.matches("Bar.Baz") && !inc.matches("Bar.Qux"));
        let exc = Filter::parse("-Foo,Baz");
        assert!(!exc.matches("Foo.X") && !exc.matches("Bar.Baz") && exc.matches("Bar.Qux"));
        assert_eq!(Filter::parse(""), Filter::All);
        assert_eq!(Filter::parse("-"), Filter::All);
        assert_eq!(Filter::parse(",A,"), Filter::Include(s(&["A"])));
    }

    #[test]
    fn parse_args_forms_and_errors() {
        let o = parse_args(&s(&["--filter", "A", "--exclude-perf-tests"])).expect("valid");
        assert_eq!(o.filter, Filter::Include(s(&["A"])));
        assert_eq!(o.perf, PerfSelection::ExcludePerf);
        let o = parse_args(&s(&["--filter=-B", "--only-perf-tests", "--list"])).expect("valid");
        assert_eq!(o.filter, Filter::Exclude(s(&["B"])));
        assert_eq!(o.perf, PerfSelection::OnlyPerf);
        assert!(o.list);
        assert!(parse_args(&s(&["--filter"])).is_err());
        assert!(parse_args(&s(&["--bogus"])).is_err());
        assert!(parse_args(&s(&["--only-perf-tests", "--exclude-perf-tests"])).is_err());
    }

    #[test]
    fn small_perf_values_keep_digits() {
        assert_eq!(format_value(1.3249), "1.32");
        assert_eq!(format_value(0.0), "0.00");
        assert_eq!(format_value(0.000123), "1.230e-4");
    }
}
