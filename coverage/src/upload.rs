//! `coverage upload`: send lcov.info to Codecov with codecov-cli, only when CODECOV_TOKEN is set.
//! A failed install or upload is a warning: coverage numbers are gated by `report`, not here.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use crate::process::{self, find_on_path};
use crate::{Args, Usage};

/// codecov-cli from PyPI, pinned (checked with `pip index versions codecov-cli`).
pub const CODECOV_CLI_VERSION: &str = "11.3.1";

pub fn cmd_upload(raw: &[String]) -> Result<ExitCode, Usage> {
    let args = Args::parse(raw, &[], &["flag", "name", "slug"])?;
    if args.positionals.len() > 1 {
        return Err(Usage("upload takes at most one lcov file".into()));
    }
    let file = PathBuf::from(args.positionals.first().map_or("lcov.info", String::as_str));
    let token = std::env::var("CODECOV_TOKEN").unwrap_or_default();
    if token.trim().is_empty() {
        println!("coverage: CODECOV_TOKEN not set, skipping the Codecov upload");
        return Ok(ExitCode::SUCCESS);
    }
    if !file.is_file() {
        eprintln!(
            "coverage: error: {} does not exist; run `coverage run` first",
            file.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    if let Err(e) = upload(
        &file,
        token.trim(),
        args.value("flag").unwrap_or("rust"),
        args.value("name"),
        args.value("slug")
            .map(str::to_string)
            .or_else(|| std::env::var("CODECOV_SLUG").ok())
            .or_else(|| std::env::var("GITHUB_REPOSITORY").ok()),
    ) {
        eprintln!("coverage: warning: the Codecov upload failed: {e}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `codecovcli` on PATH, or one installed into a private folder with pip.
fn codecov_cli() -> Result<Command, String> {
    if let Some(path) = find_on_path("codecovcli") {
        return Ok(Command::new(path));
    }
    let base = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    let dir = base.join(format!("codecov-cli-{CODECOV_CLI_VERSION}"));
    let script = dir.join("bin").join("codecovcli");
    if !script.is_file() {
        let mut pip = Command::new("python3");
        pip.args(["-m", "pip", "install", "--quiet", "--target"])
            .arg(&dir)
            .arg(format!("codecov-cli=={CODECOV_CLI_VERSION}"));
        let done = process::run(pip, Duration::from_secs(600), false)?;
        if !done.status.success() || !script.is_file() {
            return Err(format!(
                "pip could not install codecov-cli=={CODECOV_CLI_VERSION} into {} ({})",
                dir.display(),
                done.status
            ));
        }
    }
    let mut cmd = Command::new("python3");
    cmd.arg(&script).env("PYTHONPATH", &dir);
    Ok(cmd)
}

fn commit_sha() -> Option<String> {
    if let Ok(sha) = std::env::var("GITHUB_SHA") {
        if sha.len() == 40 {
            return Some(sha);
        }
    }
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let sha = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && sha.len() == 40).then_some(sha)
}

/// `slug` (owner/repo) is needed where codecov-cli cannot tell it from CI variables or a git remote.
fn upload(
    file: &std::path::Path,
    token: &str,
    flag: &str,
    name: Option<&str>,
    slug: Option<String>,
) -> Result<(), String> {
    let mut cmd = codecov_cli()?;
    cmd.arg("upload-process")
        .arg("--token")
        .arg(token)
        .arg("--file")
        .arg(file)
        .arg("--disable-search")
        .args(["--git-service", "github"])
        .arg("--flag")
        .arg(flag)
        .arg("--fail-on-error");
    if let Some(name) = name {
        cmd.arg("--name").arg(name);
    }
    if let Some(slug) = slug.filter(|s| !s.trim().is_empty()) {
        cmd.arg("--slug").arg(slug);
    }
    if let Some(sha) = commit_sha() {
        cmd.arg("--sha").arg(sha);
    }
    // process::run echoes the command with the token shown as ***.
    let done = process::run(cmd, Duration::from_secs(600), false)?;
    if !done.status.success() {
        return Err(format!("codecovcli exited with {}", done.status));
    }
    println!(
        "coverage: uploaded {} to Codecov (flag {flag})",
        file.display()
    );
    Ok(())
}
