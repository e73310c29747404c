//! `coverage run`: instrumented unit tests and mp_unit_tests under mpirun, merged into lcov.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use mscclpp_coverage::ignore::default_ignore_regex;
use mscclpp_coverage::show_env::{parse_show_env, per_process_profile_pattern};

use crate::process::{self, find_on_path};
use crate::{report, Args, Usage, Workspace};

/// Variables a previous `source <(cargo llvm-cov show-env)` may have left in our environment;
/// children start without them so show-env's answer is the only one.
const INHERITED_LLVM_COV_VARS: &[&str] = &[
    "CARGO_LLVM_COV",
    "CARGO_LLVM_COV_SHOW_ENV",
    "CARGO_LLVM_COV_TARGET_DIR",
    "CARGO_LLVM_COV_BUILD_DIR",
    "LLVM_PROFILE_FILE",
    "RUSTC_WRAPPER",
    "__CARGO_LLVM_COV_RUSTC_WRAPPER",
    "__CARGO_LLVM_COV_RUSTC_WRAPPER_RUSTFLAGS",
    "__CARGO_LLVM_COV_RUSTC_WRAPPER_CRATE_NAMES",
];

struct Plan {
    np: u64,
    skip_mp: bool,
    out: PathBuf,
    config: Option<PathBuf>,
    packages: Vec<String>,
    features: Option<String>,
    target_dir: Option<PathBuf>,
    ignore_regex: Option<String>,
    timeout: Duration,
}

pub fn cmd_run(raw: &[String]) -> Result<ExitCode, Usage> {
    let args = Args::parse(
        raw,
        &["skip-mp"],
        &[
            "np",
            "out",
            "config",
            "package",
            "features",
            "target-dir",
            "ignore-filename-regex",
            "timeout-mins",
        ],
    )?;
    if let Some(extra) = args.positionals.first() {
        return Err(Usage(format!(
            "run takes no positional argument, got {extra:?}"
        )));
    }
    let plan = Plan {
        np: args.number("np", 4)?,
        skip_mp: args.flag("skip-mp"),
        out: PathBuf::from(args.value("out").unwrap_or("lcov.info")),
        config: args.value("config").map(PathBuf::from),
        packages: args.values("package"),
        features: args.value("features").map(str::to_string),
        target_dir: args.value("target-dir").map(PathBuf::from),
        ignore_regex: args.value("ignore-filename-regex").map(str::to_string),
        timeout: Duration::from_secs(args.number("timeout-mins", 60)? * 60),
    };
    Ok(match execute(&plan) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("coverage: error: {e}");
            ExitCode::FAILURE
        }
    })
}

/// A cargo command with the given environment changes applied (children only).
fn cargo(env: &[(String, String)], args: &[&str]) -> Command {
    let mut cmd = Command::new("cargo");
    for var in INHERITED_LLVM_COV_VARS {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.args(args);
    cmd
}

fn must_succeed(cmd: Command, timeout: Duration, capture: bool) -> Result<String, String> {
    let line = process::describe(&cmd);
    let done = process::run(cmd, timeout, capture)?;
    if !done.status.success() {
        return Err(format!("`{line}` failed ({})", done.status));
    }
    Ok(done.stdout)
}

/// `Ok(true)` when every step ran clean and the gate passed.
fn execute(plan: &Plan) -> Result<bool, String> {
    // Check the tools up front, before minutes of building.
    let mpirun = if plan.skip_mp {
        None
    } else {
        Some(find_on_path("mpirun").ok_or(
            "mpirun is not on PATH: install Open MPI (apt-get install -y openmpi-bin) or pass --skip-mp",
        )?)
    };
    let ws = Workspace::load()?;
    let config = plan.config.clone().unwrap_or_else(|| ws.default_config());
    if !config.is_file() {
        return Err(format!(
            "thresholds config {} does not exist",
            config.display()
        ));
    }
    let short = Duration::from_secs(300);

    // The instrumented build gets its own target dir so the normal build stays intact.
    let cov_target = plan
        .target_dir
        .clone()
        .unwrap_or_else(|| ws.target_dir.join("llvm-cov-target"));
    let base = vec![(
        "CARGO_TARGET_DIR".to_string(),
        cov_target.display().to_string(),
    )];
    must_succeed(
        cargo(&base, &["llvm-cov", "clean", "--workspace"]),
        short,
        false,
    )?;
    let exports = must_succeed(
        cargo(&base, &["llvm-cov", "show-env", "--export-prefix"]),
        short,
        true,
    )?;
    let mut env = parse_show_env(&exports).map_err(|e| e.to_string())?;
    if env.is_empty() {
        return Err(format!(
            "cargo llvm-cov show-env printed no export lines; it printed {exports:?}"
        ));
    }
    let target_dir = env
        .iter()
        .find(|(k, _)| k == "CARGO_LLVM_COV_TARGET_DIR")
        .map_or_else(|| cov_target.clone(), |(_, v)| PathBuf::from(v));
    let mut saw_profile = false;
    for (key, value) in env.iter_mut() {
        if key == "LLVM_PROFILE_FILE" {
            saw_profile = true;
            let fixed = per_process_profile_pattern(value);
            if fixed != *value {
                eprintln!("coverage: LLVM_PROFILE_FILE {value} has no %p; using {fixed}");
                *value = fixed;
            }
        }
    }
    if !saw_profile {
        return Err("cargo llvm-cov show-env set no LLVM_PROFILE_FILE".into());
    }
    env.retain(|(k, _)| k != "CARGO_TARGET_DIR");
    env.push((
        "CARGO_TARGET_DIR".to_string(),
        target_dir.display().to_string(),
    ));
    eprintln!(
        "coverage: instrumented build in {} ({} variables from show-env)",
        target_dir.display(),
        env.len() - 1
    );

    let mut failures = Vec::new();

    // Unit and integration tests.
    let mut test_args: Vec<String> = vec!["test".into()];
    if plan.packages.is_empty() {
        test_args.push("--workspace".into());
    } else {
        for p in &plan.packages {
            test_args.push("-p".into());
            test_args.push(p.clone());
        }
    }
    if let Some(f) = &plan.features {
        test_args.push("--features".into());
        test_args.push(f.clone());
    }
    test_args.push("--no-fail-fast".into());
    let test_refs: Vec<&str> = test_args.iter().map(String::as_str).collect();
    if let Err(e) = must_succeed(cargo(&env, &test_refs), plan.timeout, false) {
        failures.push(e);
    }

    // The multi-process suites, one profile per rank.
    if let Some(mpirun) = mpirun {
        // The verbs test provider too: `cargo test` does not leave its cdylib in the target dir.
        let mut build: Vec<&str> = vec![
            "build",
            "-p",
            "mp_tests",
            "--bin",
            "mp_unit_tests",
            "-p",
            "mscclpp-ibv-testprov",
            "--lib",
        ];
        if let Some(f) = &plan.features {
            build.push("--features");
            build.push(f);
        }
        must_succeed(cargo(&env, &build), plan.timeout, false)?;
        let binary = target_dir.join("debug").join("mp_unit_tests");
        if !binary.is_file() {
            return Err(format!(
                "mp_unit_tests was not found at {} after building it",
                binary.display()
            ));
        }
        // One mpirun of mp_unit_tests with the instrumentation env (plus `extra` variables,
        // forwarded to every rank); a failure is recorded, not fatal.
        let mut run_ranks = |np: u64, extra: &[(&str, &std::ffi::OsStr)], args: &[String]| {
            let mut cmd = Command::new(&mpirun);
            for var in INHERITED_LLVM_COV_VARS {
                cmd.env_remove(var);
            }
            cmd.envs(env.iter().map(|(k, v)| (k, v)));
            cmd.args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-x",
                "LLVM_PROFILE_FILE",
            ]);
            for (k, v) in extra {
                cmd.env(k, v).args(["-x", k]);
            }
            cmd.arg("-np").arg(np.to_string()).arg(&binary).args(args);
            let line = process::describe(&cmd);
            match process::run(cmd, plan.timeout, false) {
                Ok(done) if done.status.success() => {}
                Ok(done) => failures.push(format!("`{line}` failed ({})", done.status)),
                Err(e) => failures.push(e),
            }
        };
        // Rendezvous ports below the ephemeral range, so no port the kernel handed out is in
        // the way.
        run_ranks(
            plan.np,
            &[],
            &[
                "--exclude-perf-tests".into(),
                "--ip_port=127.0.0.1:29252".into(),
            ],
        );

        // The IB suites through the user-space verbs provider (built above),
        // in both signalling modes, so the IB transport's multi-process paths count too.
        let provider = target_dir.join("debug").join("libmscclpp_ibv_testprov.so");
        if provider.is_file() {
            for (mode, port) in [("host", 29253), ("host-no-atomic", 29254)] {
                run_ranks(
                    2,
                    &[
                        ("MSCCLPP_IBV_SO", provider.as_os_str()),
                        ("MSCCLPP_IBV_MODE", std::ffi::OsStr::new(mode)),
                    ],
                    &[
                        "--filter=Ib".into(),
                        "--exclude-perf-tests".into(),
                        format!("--ip_port=127.0.0.1:{port}"),
                    ],
                );
            }
        } else {
            eprintln!(
                "coverage: {} not built; the IB suites are not in this run",
                provider.display()
            );
        }
    }

    let profiles = count_profiles(&target_dir);
    eprintln!(
        "coverage: {profiles} .profraw files in {}",
        target_dir.display()
    );

    // Merge the profiles into lcov.
    let regex = plan
        .ignore_regex
        .clone()
        .unwrap_or_else(|| default_ignore_regex(ws.map.root()));
    let out = plan.out.display().to_string();
    must_succeed(
        cargo(
            &env,
            &[
                "llvm-cov",
                "report",
                "--lcov",
                "--output-path",
                &out,
                "--ignore-filename-regex",
                &regex,
            ],
        ),
        plan.timeout,
        false,
    )?;
    eprintln!("coverage: wrote {out}");

    let passed = report(&ws, std::slice::from_ref(&plan.out), &config)?;
    for failure in &failures {
        eprintln!("coverage: test step failed: {failure}");
    }
    Ok(passed && failures.is_empty())
}

fn count_profiles(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "profraw"))
                .count()
        })
        .unwrap_or(0)
}
