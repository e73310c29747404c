//! Child processes for the `coverage` binary: run with a timeout, echo the command line, kill the
//! whole process group when the time is up.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// A printable form of a command line (program and arguments, environment left out); the value
/// after `--token` is shown as `***`.
pub fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    let mut after_token = false;
    parts.extend(cmd.get_args().map(|a| {
        let a = a.to_string_lossy();
        let secret = std::mem::replace(&mut after_token, a == "--token");
        if secret {
            "***".to_string()
        } else if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "|()$'\"".contains(c)) {
            format!("'{}'", a.replace('\'', "'\\''"))
        } else {
            a.into_owned()
        }
    }));
    parts.join(" ")
}

/// How a run ended.
pub struct Finished {
    pub status: ExitStatus,
    /// Captured stdout (empty unless captured).
    pub stdout: String,
}

/// Run `cmd` in its own process group; stdout is captured when `capture`, else inherited.
/// After `timeout` the group gets SIGTERM, then SIGKILL two seconds later, and this fails.
pub fn run(mut cmd: Command, timeout: Duration, capture: bool) -> Result<Finished, String> {
    let line = describe(&cmd);
    eprintln!("coverage: $ {line}");
    cmd.process_group(0).stdin(Stdio::null());
    if capture {
        cmd.stdout(Stdio::piped());
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("could not start `{line}`: {e}"))?;
    let reader = child.stdout.take().map(|mut out| {
        thread::spawn(move || {
            let mut text = String::new();
            let result = out.read_to_string(&mut text);
            result.map(|_| text)
        })
    });
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for `{line}` failed: {e}")),
        }
        if start.elapsed() >= timeout {
            kill_group(child.id(), "TERM");
            thread::sleep(Duration::from_secs(2));
            kill_group(child.id(), "KILL");
            // Reap it; the group is gone either way.
            let _ = child.wait();
            return Err(format!(
                "`{line}` did not finish within {} s and was killed",
                timeout.as_secs()
            ));
        }
        thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
    };
    let stdout = match reader {
        Some(handle) => match handle.join() {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => return Err(format!("reading the output of `{line}` failed: {e}")),
            Err(_) => return Err(format!("the reader of `{line}`'s output panicked")),
        },
        None => String::new(),
    };
    Ok(Finished { status, stdout })
}

/// Signal the process group we created for one child (its id is the group id).
fn kill_group(pgid: u32, signal: &str) {
    let result = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stderr(Stdio::null())
        .status();
    if let Err(e) = result {
        eprintln!("coverage: warning: could not run kill for process group {pgid}: {e}");
    }
}

/// The first executable file named `name` on PATH.
pub fn find_on_path(name: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}
