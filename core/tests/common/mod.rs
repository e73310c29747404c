//! Helpers shared by the multi-process tests (bootstrap, connection faults, IB): each test
//! re-runs its own test binary as child ranks (`BOOT_MP_*` variables select the role) and
//! collects their exits.
#![allow(dead_code)] // each test file uses a different subset

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What a child process of test `name` was told.
pub struct ChildRole {
    pub rank: usize,
    pub nranks: usize,
    pub addr: String,
    /// `BOOT_MP_ROLE`, empty when unset.
    pub role: String,
}

/// `Some` when this process is a child of the test `name`.
pub fn child(name: &str) -> Option<ChildRole> {
    if std::env::var("BOOT_MP_TEST").ok()? != name {
        return None;
    }
    let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("child needs {k}"));
    Some(ChildRole {
        rank: get("BOOT_MP_RANK").parse().expect("BOOT_MP_RANK"),
        nranks: get("BOOT_MP_NRANKS").parse().expect("BOOT_MP_NRANKS"),
        addr: get("BOOT_MP_ADDR"),
        role: std::env::var("BOOT_MP_ROLE").unwrap_or_default(),
    })
}

/// One child to start.
pub struct Spec {
    pub rank: usize,
    pub nranks: usize,
    pub role: String,
    pub env: Vec<(String, String)>,
    /// Variables removed from the child's environment (before `env` is added).
    pub unset: Vec<String>,
}

impl Spec {
    pub fn rank(rank: usize, nranks: usize) -> Spec {
        Spec {
            rank,
            nranks,
            role: String::new(),
            env: Vec::new(),
            unset: Vec::new(),
        }
    }
    pub fn role(mut self, role: &str) -> Spec {
        self.role = role.into();
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Spec {
        self.env.push((k.into(), v.into()));
        self
    }
    pub fn unset(mut self, k: &str) -> Spec {
        self.unset.push(k.into());
        self
    }
}

/// A started child.
pub struct Kid {
    pub spec: Spec,
    pub proc: Child,
    pub started: Instant,
}

/// Starts child `spec` of test `name` with `addr`.
pub fn start(name: &str, addr: &str, spec: Spec) -> Kid {
    let exe = std::env::current_exe().expect("current_exe");
    let mut c = Command::new(exe);
    c.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("BOOT_MP_TEST", name)
        .env("BOOT_MP_RANK", spec.rank.to_string())
        .env("BOOT_MP_NRANKS", spec.nranks.to_string())
        .env("BOOT_MP_ADDR", addr)
        .env("BOOT_MP_ROLE", &spec.role)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for k in &spec.unset {
        c.env_remove(k);
    }
    for (k, v) in &spec.env {
        c.env(k, v);
    }
    let proc = c.spawn().expect("spawn child rank");
    Kid {
        spec,
        proc,
        started: Instant::now(),
    }
}

/// How a child ended: its status (None = killed at the limit), when, and its output.
pub struct Ended {
    pub rank: usize,
    pub role: String,
    pub status: Option<ExitStatus>,
    pub at: Instant,
    pub output: String,
}

/// Waits for every kid (killing those still running after `limit`) and returns how each ended.
pub fn wait_all(kids: Vec<Kid>, limit: Duration) -> Vec<Ended> {
    let ranks: Vec<usize> = kids.iter().map(|k| k.spec.rank).collect();
    wait_for(kids, &ranks, limit)
}

/// Waits until the kids of ranks `must` exited (at most `limit`), kills those still running
/// and returns how each ended.
pub fn wait_for(kids: Vec<Kid>, must: &[usize], limit: Duration) -> Vec<Ended> {
    let t0 = Instant::now();
    let mut kids: Vec<(Kid, Option<(ExitStatus, Instant)>)> =
        kids.into_iter().map(|k| (k, None)).collect();
    let waiting = |kids: &[(Kid, Option<_>)]| {
        kids.iter()
            .any(|(k, s)| s.is_none() && must.contains(&k.spec.rank))
    };
    while waiting(&kids) && t0.elapsed() < limit {
        for (k, s) in kids.iter_mut().filter(|(_, s)| s.is_none()) {
            if let Some(st) = k.proc.try_wait().expect("try_wait") {
                *s = Some((st, Instant::now()));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    kids.into_iter()
        .map(|(mut k, s)| {
            if s.is_none() {
                let _ = k.proc.kill();
            }
            let out = k.proc.wait_with_output().expect("child output");
            Ended {
                rank: k.spec.rank,
                role: k.spec.role.clone(),
                status: s.map(|(st, _)| st),
                at: s.map_or_else(Instant::now, |(_, at)| at),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            }
        })
        .collect()
}

/// Every child's status and output, for a failed assertion.
pub fn report<'a>(ended: impl IntoIterator<Item = &'a Ended>) -> String {
    ended
        .into_iter()
        .map(|e| {
            format!(
                "--- rank {} {} ({}) ---\n{}\n",
                e.rank,
                e.role,
                e.status
                    .map_or_else(|| "killed at the limit".to_string(), |s| s.to_string()),
                e.output
            )
        })
        .collect()
}

/// Whether the child exited with success.
pub fn passed(e: &Ended) -> bool {
    e.status.is_some_and(|s| s.success())
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// Threads of this process now (`/proc/self/status`).
pub fn threads() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("Threads line")
}
