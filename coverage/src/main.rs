//! `coverage`: instrumented runs (`run`), the lcov table and gate (`report`), Codecov (`upload`).
//!
//! ```text
//! coverage run    [--np N] [--skip-mp] [--out PATH] [--config PATH] [--package P]...
//!                 [--features F] [--target-dir DIR] [--ignore-filename-regex R] [--timeout-mins M]
//! coverage report [LCOV]... [--config PATH]
//! coverage upload [LCOV] [--flag F] [--name N] [--slug OWNER/REPO]
//! ```
//! Exit codes: 0 success (upload: also skipped or failed upload), 1 failure (tests, gate,
//! tools), 2 usage error.

mod process;
mod run;
mod upload;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use mscclpp_coverage::ignore::EXCLUDED_FOLDERS;
use mscclpp_coverage::{format_table, gate, lcov, summarise, CrateMap, Thresholds};

const USAGE: &str = "usage:
  coverage run    [--np N] [--skip-mp] [--out PATH] [--config PATH] [--package P]...
                  [--features F] [--target-dir DIR] [--ignore-filename-regex R] [--timeout-mins M]
  coverage report [LCOV]... [--config PATH]
  coverage upload [LCOV] [--flag F] [--name N] [--slug OWNER/REPO]

run:    cargo llvm-cov clean; cargo test (instrumented); mp_unit_tests under
        mpirun -np N (default 4) unless --skip-mp; cargo llvm-cov report --lcov
        into --out (default lcov.info); then report.
report: normalise and merge LCOV files (default lcov.info), print the per-crate
        table, exit 1 when under the thresholds in --config (default
        <workspace>/coverage/thresholds.json).
upload: upload LCOV (default lcov.info) to Codecov with codecov-cli when
        CODECOV_TOKEN is set; otherwise, or when the upload fails, warn and exit 0.
        --flag defaults to rust; --slug defaults to $CODECOV_SLUG, then
        $GITHUB_REPOSITORY.";

/// A command-line problem: print usage, exit 2.
pub struct Usage(pub String);

/// Arguments after the subcommand: positionals, and `--name value` / `--name=value` / flags.
pub struct Args {
    positionals: Vec<String>,
    options: Vec<(String, Option<String>)>,
}

impl Args {
    /// Split `raw`; `flags` are options that take no value.
    fn parse(raw: &[String], flags: &[&str], valued: &[&str]) -> Result<Args, Usage> {
        let mut args = Args {
            positionals: Vec::new(),
            options: Vec::new(),
        };
        let mut iter = raw.iter();
        while let Some(arg) = iter.next() {
            if let Some(option) = arg.strip_prefix("--") {
                let (name, inline) = match option.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (option, None),
                };
                if flags.contains(&name) {
                    if inline.is_some() {
                        return Err(Usage(format!("--{name} takes no value")));
                    }
                    args.options.push((name.to_string(), None));
                } else if valued.contains(&name) {
                    let value = match inline {
                        Some(v) => v,
                        None => iter
                            .next()
                            .cloned()
                            .ok_or_else(|| Usage(format!("--{name} needs a value")))?,
                    };
                    args.options.push((name.to_string(), Some(value)));
                } else {
                    return Err(Usage(format!("unknown option --{name}")));
                }
            } else {
                args.positionals.push(arg.clone());
            }
        }
        Ok(args)
    }

    fn flag(&self, name: &str) -> bool {
        self.options.iter().any(|(n, _)| n == name)
    }

    fn value(&self, name: &str) -> Option<&str> {
        self.options
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }

    fn values(&self, name: &str) -> Vec<String> {
        self.options
            .iter()
            .filter(|(n, _)| n == name)
            .filter_map(|(_, v)| v.clone())
            .collect()
    }

    fn number(&self, name: &str, default: u64) -> Result<u64, Usage> {
        match self.value(name) {
            None => Ok(default),
            Some(v) => v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                Usage(format!(
                    "--{name} expects a positive whole number, got {v:?}"
                ))
            }),
        }
    }
}

/// What `cargo metadata` says about the workspace.
pub struct Workspace {
    /// The workspace's crates and their folders.
    pub map: CrateMap,
    /// Cargo's target directory.
    pub target_dir: PathBuf,
}

impl Workspace {
    fn load() -> Result<Workspace, String> {
        let mut cmd = Command::new("cargo");
        cmd.args(["metadata", "--no-deps", "--format-version", "1"]);
        let done = process::run(cmd, Duration::from_secs(300), true)?;
        if !done.status.success() {
            return Err(format!("cargo metadata failed ({})", done.status));
        }
        let map = CrateMap::from_cargo_metadata(&done.stdout).map_err(|e| e.to_string())?;
        let value: serde_json::Value = serde_json::from_str(&done.stdout)
            .map_err(|e| format!("cargo metadata: expected JSON: {e}"))?;
        let target_dir = value
            .get("target_directory")
            .and_then(|v| v.as_str())
            .map(PathBuf::from)
            .ok_or_else(|| "cargo metadata: expected a string target_directory".to_string())?;
        Ok(Workspace { map, target_dir })
    }

    /// Crates that count (member folders not excluded from the report).
    pub fn counted_crates(&self) -> Vec<String> {
        self.map
            .folders()
            .iter()
            .filter(|f| !EXCLUDED_FOLDERS.contains(&f.as_str()))
            .cloned()
            .collect()
    }

    /// `coverage/thresholds.json` of this workspace.
    pub fn default_config(&self) -> PathBuf {
        self.map.root().join("coverage").join("thresholds.json")
    }
}

/// Normalise, merge, print the table, apply the gate. `Ok(true)` when the gate passes.
pub fn report(ws: &Workspace, inputs: &[PathBuf], config: &Path) -> Result<bool, String> {
    let config_text = std::fs::read_to_string(config)
        .map_err(|e| format!("reading thresholds config {}: {e}", config.display()))?;
    let thresholds = Thresholds::parse(
        &config.display().to_string(),
        &config_text,
        ws.map.folders(),
    )
    .map_err(|e| e.to_string())?;
    let (merged, notes) = lcov::load_report(inputs).map_err(|e| e.to_string())?;
    for (path, note) in inputs.iter().zip(&notes) {
        let mut changes = Vec::new();
        if note.added_trailing_newline {
            changes.push("added the missing trailing newline".to_string());
        }
        if note.added_test_name {
            changes.push("added a TN: line".to_string());
        }
        if note.clamped_counts > 0 {
            changes.push(format!("clamped {} counts to fit u32", note.clamped_counts));
        }
        if let Some((line, text)) = note.dropped_lines.first() {
            changes.push(format!(
                "dropped {} lines of unknown kinds (first: line {line}: {text:?})",
                note.dropped_lines.len()
            ));
        }
        if !changes.is_empty() {
            eprintln!("coverage: {}: {}", path.display(), changes.join("; "));
        }
        if note.records == 0 {
            eprintln!("coverage: warning: {} holds no records", path.display());
        }
    }
    let summary = summarise(&merged, &ws.map);
    println!("{}", format_table(&summary, &ws.counted_crates()));
    let failures = gate(&summary, &thresholds);
    if failures.is_empty() {
        println!(
            "coverage: gate passed (thresholds from {})",
            config.display()
        );
        return Ok(true);
    }
    for failure in &failures {
        eprintln!("coverage: under threshold: {failure}");
    }
    eprintln!(
        "coverage: gate FAILED: {} threshold(s) of {} not met",
        failures.len(),
        config.display()
    );
    Ok(false)
}

fn cmd_report(raw: &[String]) -> Result<ExitCode, Usage> {
    let args = Args::parse(raw, &[], &["config"])?;
    let inputs: Vec<PathBuf> = if args.positionals.is_empty() {
        vec![PathBuf::from("lcov.info")]
    } else {
        args.positionals.iter().map(PathBuf::from).collect()
    };
    let outcome = Workspace::load().and_then(|ws| {
        let config = args
            .value("config")
            .map_or_else(|| ws.default_config(), PathBuf::from);
        report(&ws, &inputs, &config)
    });
    Ok(match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("coverage: error: {e}");
            ExitCode::FAILURE
        }
    })
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = argv.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match command.as_str() {
        "run" => run::cmd_run(rest),
        "report" => cmd_report(rest),
        "upload" => upload::cmd_upload(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => Err(Usage(format!("unknown command {other:?}"))),
    };
    match result {
        Ok(code) => code,
        Err(Usage(message)) => {
            eprintln!("coverage: {message}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
