//! Liveness of the other ranks, for the waits of the framework itself (the verdict exchange
//! after each test and the final exchange before exit).
//!
//! Every rank's monitor thread sends a small heartbeat to every peer a few times per
//! `--timeout` and drains the peers' heartbeats, noting when each peer was last heard from.
//! The framework's waits then share one deadline per peer, "last heard + `--timeout`", instead
//! of each starting a fresh `--timeout`: a rank frozen during a test body (the test's own wait
//! times out after `--timeout`) is known lost at once by the verdict exchange and the exit,
//! so survivors report after ~1 x `--timeout` instead of 3 x. A long but live test keeps
//! its peers waiting as long as it needs, because its monitor keeps sending. A peer whose
//! connection closed is reported at once. Errors name the rank.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp::bootstrap::Bootstrap;
use mscclpp::{ErrorCode, TcpBootstrap};

/// Bootstrap tags of this module (far above the tags tests and the communicator use).
const TAG_BASE: u64 = 0x4D50_4C56_0000_0000; // "MPLV"
const TAG_HEARTBEAT: u64 = TAG_BASE;
/// Tags given to [`Liveness::exchange`] are offset by this.
const TAG_EXCHANGE: u64 = TAG_BASE + 0x100;
/// How often the monitor drains heartbeats (and how finely waits poll).
const POLL: Duration = Duration::from_millis(50);

/// What the monitor knows about each peer.
struct PeerState {
    last_heard: Instant,
    /// Why the connection to the peer is gone, once it is.
    gone: Option<String>,
}

struct Shared {
    peers: Mutex<Vec<PeerState>>,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only plain timestamps live behind the lock; a panic elsewhere cannot tear them.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The monitor of one rank: a heartbeat thread and the per-peer deadlines.
pub struct Liveness {
    boot: Arc<TcpBootstrap>,
    timeout: Duration,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// How often heartbeats go out: four per timeout, between [`POLL`] and one second.
pub fn heartbeat_interval(timeout: Duration) -> Duration {
    (timeout / 4).clamp(POLL, Duration::from_secs(1))
}

impl Liveness {
    /// Starts the monitor over `boot`; `timeout` is how long a peer may stay silent.
    pub fn start(boot: Arc<TcpBootstrap>, timeout: Duration) -> Result<Liveness, String> {
        let (rank, n) = (boot.rank(), boot.nranks());
        let now = Instant::now();
        let shared = Arc::new(Shared {
            peers: Mutex::new(
                (0..n)
                    .map(|_| PeerState {
                        last_heard: now,
                        gone: None,
                    })
                    .collect(),
            ),
            stop: AtomicBool::new(false),
        });
        let thread = if n > 1 {
            let (b, s) = (boot.clone(), shared.clone());
            let every = heartbeat_interval(timeout);
            Some(
                std::thread::Builder::new()
                    .name("mp-liveness".into())
                    .spawn(move || monitor(&b, &s, rank, n, every))
                    .map_err(|e| format!("starting the liveness thread: {e}"))?,
            )
        } else {
            None
        };
        Ok(Liveness {
            boot,
            timeout,
            shared,
            thread: Mutex::new(thread),
        })
    }

    /// Why `peer` counts as lost now (gone, or silent for the timeout), or `None`.
    fn lost(&self, peer: usize) -> Option<String> {
        let peers = lock(&self.shared.peers);
        let p = &peers[peer];
        if let Some(why) = &p.gone {
            return Some(format!("rank {peer} is gone: {why}"));
        }
        let silent = p.last_heard.elapsed();
        (silent >= self.timeout).then(|| {
            format!(
                "rank {peer} sent nothing (no message, no heartbeat) for {:.1} s, past --timeout={} s: it is frozen or gone",
                silent.as_secs_f64(),
                self.timeout.as_secs()
            )
        })
    }

    fn heard(&self, peer: usize) {
        lock(&self.shared.peers)[peer].last_heard = Instant::now();
    }

    /// Sends `payload` to every peer under `tag` and returns every rank's payload (this rank's
    /// own included), waiting for each peer as long as it is alive. A failure names every
    /// rank whose payload did not come and why (silent past the timeout, or gone).
    pub fn exchange(&self, tag: u64, payload: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        let (rank, n) = (self.boot.rank(), self.boot.nranks());
        let tag = TAG_EXCHANGE + tag;
        // A failed send is not the end: the peer may have sent its payload before it left.
        let mut send_failed: Vec<Option<String>> = vec![None; n];
        for peer in (0..n).filter(|&p| p != rank) {
            if let Err(e) = self.boot.send(payload, peer, tag) {
                send_failed[peer] = Some(e.to_string());
            }
        }
        let mut got: Vec<Option<Vec<u8>>> = vec![None; n];
        got[rank] = Some(payload.to_vec());
        let mut lost: Vec<Option<String>> = vec![None; n];
        loop {
            let pending: Vec<usize> = (0..n)
                .filter(|&p| got[p].is_none() && lost[p].is_none())
                .collect();
            let Some(&first) = pending.first() else { break };
            for &peer in &pending {
                // Block a little on the first peer still missing, only look at the others.
                let wait = if peer == first { POLL } else { Duration::ZERO };
                match self.boot.recv_timeout(peer, tag, wait) {
                    Ok(msg) => {
                        self.heard(peer);
                        got[peer] = Some(msg);
                    }
                    Err(e) if e.code() == ErrorCode::Timeout => lost[peer] = self.lost(peer),
                    Err(e) => lost[peer] = Some(format!("rank {peer} is gone: {e}")),
                }
            }
        }
        let mut why: Vec<String> = lost.into_iter().flatten().collect();
        if why.is_empty() {
            // Everything came; a send that failed still means a peer misses our payload.
            why = send_failed
                .into_iter()
                .enumerate()
                .filter_map(|(p, e)| e.map(|e| format!("sending to rank {p} failed: {e}")))
                .collect();
        }
        if why.is_empty() {
            Ok(got.into_iter().flatten().collect())
        } else {
            Err(why.join("; "))
        }
    }

    /// Stops the monitor thread (no more heartbeats go out).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

/// The monitor thread: drains heartbeats every [`POLL`], sends its own every `every`.
fn monitor(boot: &TcpBootstrap, shared: &Shared, rank: usize, n: usize, every: Duration) {
    let mut next_send = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        if Instant::now() >= next_send {
            for peer in (0..n).filter(|&p| p != rank) {
                // A failed send shows up as the peer's EOF on the receiving side; nothing to
                // do here (a frozen peer's socket buffer holds many tiny heartbeats).
                let _ = boot.send(&[], peer, TAG_HEARTBEAT);
            }
            next_send = Instant::now() + every;
        }
        for peer in (0..n).filter(|&p| p != rank) {
            let mut heard = false;
            let mut gone = None;
            loop {
                match boot.recv_timeout(peer, TAG_HEARTBEAT, Duration::ZERO) {
                    Ok(_) => heard = true,
                    Err(e) if e.code() == ErrorCode::Timeout => break,
                    Err(e) => {
                        gone = Some(e.to_string());
                        break;
                    }
                }
            }
            if heard || gone.is_some() {
                let mut peers = lock(&shared.peers);
                if heard {
                    peers[peer].last_heard = Instant::now();
                }
                if let Some(g) = gone {
                    peers[peer].gone.get_or_insert(g);
                }
            }
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_come_several_times_per_timeout() {
        assert_eq!(
            heartbeat_interval(Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        assert_eq!(
            heartbeat_interval(Duration::from_secs(2)),
            Duration::from_millis(500)
        );
        assert_eq!(heartbeat_interval(Duration::from_millis(100)), POLL);
        for t in [1, 2, 5, 60, 86_400] {
            let t = Duration::from_secs(t);
            assert!(heartbeat_interval(t) * 2 <= t, "{t:?}");
        }
    }
}
