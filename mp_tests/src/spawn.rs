//! `--np N` self-launch: starts N copies of this binary as ranks 0..N (torchrun-style
//! variables) and waits for them. The ranks never outlive their launcher: each child asks the
//! kernel for SIGKILL when the launcher dies (`PR_SET_PDEATHSIG`, whatever kills it, even
//! SIGKILL), and the launcher itself stops its ranks on SIGINT, SIGTERM and SIGHUP.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::launcher::{free_loopback_port, MpOptions, LAUNCHERS};

/// How long ranks get to leave on their own after a launcher signal before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// The launcher's poll period while it waits for its ranks.
const POLL: Duration = Duration::from_millis(20);

/// Makes the process about to `exec` receive SIGKILL when `launcher` (its parent) dies.
///
/// Runs in the forked child before `exec`: only async-signal-safe calls (two raw syscalls).
fn die_with_parent(launcher: rustix::process::Pid) -> std::io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    // The launcher may have died between fork and prctl: then our parent is already another
    // process and no signal would ever come, so leave now.
    // (ESRCH, built without allocating: this runs between fork and exec.)
    if rustix::process::getppid() != Some(launcher) {
        return Err(rustix::io::Errno::SRCH.into());
    }
    Ok(())
}

/// The signals that stop a self-launched run, recorded by number as they arrive.
struct StopSignals {
    got: Arc<AtomicUsize>,
}

impl StopSignals {
    fn install() -> Result<StopSignals, String> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let got = Arc::new(AtomicUsize::new(0));
        for sig in [SIGINT, SIGTERM, SIGHUP] {
            signal_hook::flag::register_usize(sig, got.clone(), sig as usize)
                .map_err(|e| format!("installing the handler of signal {sig}: {e}"))?;
        }
        Ok(StopSignals { got })
    }

    /// The signal that arrived, if any.
    fn received(&self) -> Option<i32> {
        match self.got.load(Ordering::Relaxed) {
            0 => None,
            n => i32::try_from(n).ok(),
        }
    }
}

/// Sends SIGTERM to every rank still running, waits up to [`STOP_GRACE`], then SIGKILLs and
/// reaps what is left.
fn stop_all(children: &mut [Child], status: &mut [Option<i32>]) {
    for (c, st) in children.iter_mut().zip(status.iter()) {
        if st.is_none() {
            if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
    }
    let until = Instant::now() + STOP_GRACE;
    while Instant::now() < until && status.iter().any(Option::is_none) {
        reap(children, status, &mut None);
        std::thread::sleep(POLL);
    }
    for (c, st) in children.iter_mut().zip(status.iter_mut()) {
        if st.is_none() {
            let _ = c.kill();
            let _ = c.wait();
            *st = Some(128 + 9);
        }
    }
}

/// Records the exit status of every rank that has ended; notes the time of the first failure.
fn reap(children: &mut [Child], status: &mut [Option<i32>], first_failure: &mut Option<Instant>) {
    for (i, c) in children.iter_mut().enumerate() {
        if status[i].is_some() {
            continue;
        }
        match c.try_wait() {
            Ok(Some(st)) => {
                let code = st.code().unwrap_or_else(|| {
                    128 + std::os::unix::process::ExitStatusExt::signal(&st).unwrap_or(9)
                });
                if code != 0 && first_failure.is_none() {
                    *first_failure = Some(Instant::now());
                }
                status[i] = Some(code);
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("mp_unit_tests: waiting for rank {i}: {e}");
                status[i] = Some(1);
            }
        }
    }
}

/// `--np N`: starts N copies of this binary as ranks 0..N, waits for all of them and returns
/// the worst exit status. A rank that fails makes the others get `grace` and then be killed,
/// so a broken run never hangs; a stop signal stops every rank and returns 128 + its number.
pub fn self_launch(np: usize, opts: &MpOptions, grace: Duration) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own binary: {e}"))?;
    let ip_port = match &opts.ip_port {
        Some(a) => a.clone(),
        None => format!("127.0.0.1:{}", free_loopback_port()?),
    };
    let signals = StopSignals::install()?;
    let me = rustix::process::getpid();
    let mut children: Vec<Child> = Vec::with_capacity(np);
    for rank in 0..np {
        let mut cmd = Command::new(&exe);
        cmd.arg(format!("--ip_port={ip_port}"));
        cmd.arg(format!("--timeout={}", opts.timeout.as_secs()));
        if let Some(g) = opts.ib_gid_index {
            cmd.arg(format!("--ib_gid_index={g}"));
        }
        cmd.args(&opts.rest);
        // Remove any launcher variables we inherited so the child sees only ours.
        for &(_, r, s, lr, ls) in LAUNCHERS {
            for v in [r, s, lr, ls] {
                cmd.env_remove(v);
            }
        }
        cmd.env("WORLD_SIZE", np.to_string());
        cmd.env("LOCAL_WORLD_SIZE", np.to_string());
        cmd.env("RANK", rank.to_string());
        cmd.env("LOCAL_RANK", rank.to_string());
        // SAFETY: the closure runs in the forked child before exec and makes only
        // async-signal-safe raw syscalls (prctl, getppid); it allocates nothing on success.
        unsafe {
            cmd.pre_exec(move || die_with_parent(me));
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                let mut status = vec![None; children.len()];
                stop_all(&mut children, &mut status);
                return Err(format!(
                    "could not start rank {rank} ({}): {e}",
                    exe.display()
                ));
            }
        }
        if let Some(sig) = signals.received() {
            let mut status = vec![None; children.len()];
            stop_all(&mut children, &mut status);
            eprintln!("mp_unit_tests: signal {sig} while starting the ranks; stopped them");
            return Ok(128 + sig);
        }
    }
    let mut status: Vec<Option<i32>> = vec![None; np];
    let mut first_failure: Option<Instant> = None;
    loop {
        reap(&mut children, &mut status, &mut first_failure);
        if status.iter().all(Option::is_some) {
            break;
        }
        if let Some(sig) = signals.received() {
            let running: Vec<usize> = (0..np).filter(|&i| status[i].is_none()).collect();
            eprintln!("mp_unit_tests: signal {sig}: stopping ranks {running:?}");
            stop_all(&mut children, &mut status);
            return Ok(128 + sig);
        }
        if let Some(t) = first_failure {
            if t.elapsed() > grace {
                for (i, c) in children.iter_mut().enumerate() {
                    if status[i].is_none() {
                        eprintln!(
                            "mp_unit_tests: rank {i} still running {grace:?} after another rank failed; killing it"
                        );
                        let _ = c.kill();
                        let _ = c.wait();
                        status[i] = Some(1);
                    }
                }
                break;
            }
        }
        std::thread::sleep(POLL);
    }
    Ok(status.into_iter().flatten().max().unwrap_or(0))
}
