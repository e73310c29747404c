//! The ranks of `mp_unit_tests --np N` die with their launcher: killed by SIGKILL (the
//! children's parent-death signal) or stopped by SIGTERM (the launcher stops its ranks and
//! exits 128 + 15). Before, killing the launcher left its ranks running as orphans.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mp_unit_tests");

/// (pid, state, parent pid) of every process, from /proc.
fn processes() -> Vec<(u32, char, u32)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (Some(state), Some(ppid)) = (f.next(), f.next()) else {
            continue;
        };
        if let (Some(c), Ok(pp)) = (state.chars().next(), ppid.parse()) {
            out.push((pid, c, pp));
        }
    }
    out
}

fn children_of(parent: u32) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|&(_, st, pp)| pp == parent && st != 'Z')
        .map(|(p, _, _)| p)
        .collect()
}

/// Whether `pid` still runs (a zombie nobody reaped has ended).
fn running(pid: u32) -> bool {
    processes().iter().any(|&(p, st, _)| p == pid && st != 'Z')
}

/// Starts a 4-rank self-launch of the whole (non-perf) suite and waits for its 4 ranks.
#[allow(clippy::zombie_processes)] // the caller kills and waits for the returned launcher
fn launch() -> (Child, Vec<u32>) {
    let mut cmd = Command::new(BIN);
    cmd.args(["--np=4", "--exclude-perf-tests", "--timeout=60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for v in [
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "RANK",
        "WORLD_SIZE",
    ] {
        cmd.env_remove(v);
    }
    let mut launcher = cmd.spawn().expect("spawning the launcher");
    let start = Instant::now();
    loop {
        let kids = children_of(launcher.id());
        if kids.len() == 4 {
            return (launcher, kids);
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = launcher.kill();
            let _ = launcher.wait();
            panic!("the launcher started {} of 4 ranks in 30 s", kids.len());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_all_end(kids: &[u32], within: Duration, how: &str) {
    let start = Instant::now();
    while start.elapsed() < within {
        if kids.iter().all(|&k| !running(k)) {
            eprintln!(
                "{how}: all ranks ended {:?} after the launcher",
                start.elapsed()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = kids.iter().copied().filter(|&k| running(k)).collect();
    for &k in &left {
        // Clean up what the failed check left behind (these are our own grandchildren).
        let _ = Command::new("kill").args(["-9", &k.to_string()]).status();
    }
    panic!("{how}: ranks {left:?} still ran {within:?} after their launcher ended (orphans)");
}

#[test]
fn ranks_die_when_the_launcher_is_killed() {
    let (mut launcher, kids) = launch();
    launcher.kill().expect("SIGKILL to the launcher");
    let _ = launcher.wait();
    assert_all_end(&kids, Duration::from_secs(5), "SIGKILL");
}

#[test]
fn sigterm_stops_the_ranks_and_the_launcher() {
    let (mut launcher, kids) = launch();
    let status = Command::new("kill")
        .args(["-TERM", &launcher.id().to_string()])
        .status()
        .expect("running kill");
    assert!(status.success());
    let start = Instant::now();
    let code = loop {
        if let Some(st) = launcher.try_wait().expect("waiting for the launcher") {
            break st.code();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the launcher did not stop within 10 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(128 + 15), "the launcher exits 128 + SIGTERM");
    assert_all_end(&kids, Duration::from_secs(1), "SIGTERM");
}
