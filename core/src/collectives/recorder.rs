//! The flight recorder of a communicator's collectives: the last [`RECORDED_CALLS`] calls
//! (sequence number, collective, count, type, operation, root, algorithm, state), readable at
//! any time ([`crate::collectives::Collectives::recent_calls`], Python
//! `Collectives.recent_calls()`), like PyTorch's flight recorder.
//!
//! Always on: recording a call writes one fixed-size entry of a ring under a mutex of its own
//! (no allocation). When a host-side wait of a call reaches its bound (host backend), the error
//! says which call every peer last reached: the ranks whose wait timed out send each other
//! their last record over the bootstrap ([`peer_report`]) and wait up to [`REPORT_WAIT`] for
//! the others' (a peer that is busy elsewhere shows as "no answer").

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use super::algorithm::Call;
use super::check::{CallKey, KEY_BYTES};
use crate::bootstrap::Bootstrap;

/// How many calls each communicator remembers.
pub const RECORDED_CALLS: usize = 64;

/// How long a rank whose wait timed out waits for its peers' last records.
pub const REPORT_WAIT: Duration = Duration::from_secs(2);

/// The bootstrap tag of the hang reports.
const TAG_REPORT: u64 = 0xC4EC_0010;

/// Where a recorded call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallState {
    /// Started, not returned yet (on GPUs: being enqueued).
    Running,
    /// Returned `Ok` (on GPUs: enqueued).
    Done,
    /// Returned an error.
    Failed,
}

impl CallState {
    /// `running`, `done` or `failed`.
    pub fn name(self) -> &'static str {
        match self {
            CallState::Running => "running",
            CallState::Done => "done",
            CallState::Failed => "failed",
        }
    }
}

/// One recorded call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallRecord {
    /// The call.
    pub call: CallKey,
    /// The algorithm that ran it.
    pub algorithm: &'static str,
    /// Where it is.
    pub state: CallState,
}

impl std::fmt::Display for CallRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {})",
            self.call,
            self.algorithm,
            self.state.name()
        )
    }
}

struct Ring {
    entries: [Option<CallRecord>; RECORDED_CALLS],
    next: u64,
}

/// The recorder of one communicator (see the module doc).
pub struct Recorder {
    ring: Mutex<Ring>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            ring: Mutex::new(Ring {
                entries: [None; RECORDED_CALLS],
                next: 0,
            }),
        }
    }
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("calls", &self.next_seq())
            .finish()
    }
}

impl Recorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sequence number the next call gets.
    pub fn next_seq(&self) -> u64 {
        self.lock().next
    }

    /// Records the start of `call` (run by `algorithm`); returns its sequence number.
    pub fn start(&self, call: &Call, algorithm: &'static str) -> u64 {
        let mut r = self.lock();
        let seq = r.next;
        r.next += 1;
        r.entries[(seq % RECORDED_CALLS as u64) as usize] = Some(CallRecord {
            call: CallKey::of(call, seq),
            algorithm,
            state: CallState::Running,
        });
        seq
    }

    /// Records how call `seq` ended.
    pub fn finish(&self, seq: u64, ok: bool) {
        let mut r = self.lock();
        if let Some(e) = r.entries[(seq % RECORDED_CALLS as u64) as usize].as_mut() {
            if e.call.seq == seq {
                e.state = if ok {
                    CallState::Done
                } else {
                    CallState::Failed
                };
            }
        }
    }

    /// The recorded calls, oldest first (at most [`RECORDED_CALLS`]).
    pub fn recent(&self) -> Vec<CallRecord> {
        let r = self.lock();
        let first = r.next.saturating_sub(RECORDED_CALLS as u64);
        (first..r.next)
            .filter_map(|s| r.entries[(s % RECORDED_CALLS as u64) as usize])
            .collect()
    }

    /// The last recorded call.
    pub fn last(&self) -> Option<CallRecord> {
        let r = self.lock();
        r.next
            .checked_sub(1)
            .and_then(|s| r.entries[(s % RECORDED_CALLS as u64) as usize])
    }
}

/// A record as bytes (what [`peer_report`] sends): the call's key, its state, the algorithm.
fn encode(r: Option<CallRecord>) -> Vec<u8> {
    let Some(r) = r else { return Vec::new() };
    let mut v = Vec::with_capacity(KEY_BYTES + 1 + r.algorithm.len());
    r.call.encode_into(&mut v);
    v.push(match r.state {
        CallState::Running => 0,
        CallState::Done => 1,
        CallState::Failed => 2,
    });
    v.extend_from_slice(r.algorithm.as_bytes());
    v
}

/// What a peer's report says, in words.
fn describe(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "no call yet".into();
    }
    let (Some(key), Some(&state)) = (CallKey::decode(bytes), bytes.get(KEY_BYTES)) else {
        return "an unreadable report".into();
    };
    let state = match state {
        0 => "running",
        1 => "done",
        _ => "failed",
    };
    let algorithm = String::from_utf8_lossy(&bytes[KEY_BYTES + 1..]);
    format!("{key} ({algorithm}, {state})")
}

/// Sends this rank's last record to every peer and collects theirs for up to
/// [`REPORT_WAIT`]: "rank 0 reached call #7 all_reduce ...; rank 1 reached ...; rank 2: no
/// answer ...". Called when a host-side wait reached its bound.
pub fn peer_report(bootstrap: &Arc<dyn Bootstrap>, rec: &Recorder) -> String {
    let (me, n) = (bootstrap.rank(), bootstrap.nranks());
    let own = rec.last();
    let msg = encode(own);
    for p in (0..n).filter(|&p| p != me) {
        // A send to a dead peer fails; its line then says so below.
        let _ = bootstrap.send(&msg, p, TAG_REPORT);
    }
    let (tx, rx) = mpsc::channel();
    let b = bootstrap.clone();
    // The receives block up to the bootstrap's own timeout: a thread of its own, waited for
    // REPORT_WAIT at most (it ends with the bootstrap's timeout or the peers' answers).
    let spawned = std::thread::Builder::new()
        .name("mscclpp-hang-report".into())
        .spawn(move || {
            for p in (0..n).filter(|&p| p != me) {
                let r = b.recv(p, TAG_REPORT);
                if tx.send((p, r)).is_err() {
                    return;
                }
            }
        });
    let mut lines: Vec<Option<String>> = vec![None; n];
    lines[me] = Some(match own {
        Some(r) => format!("rank {me} (this rank) reached {r}"),
        None => format!("rank {me} (this rank) made no call yet"),
    });
    if spawned.is_ok() {
        let deadline = std::time::Instant::now() + REPORT_WAIT;
        while lines.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok((p, Ok(bytes))) => {
                    lines[p] = Some(format!("rank {p} reached {}", describe(&bytes)))
                }
                Ok((p, Err(e))) => lines[p] = Some(format!("rank {p}: no report ({e})")),
                Err(_) => break,
            }
        }
    }
    lines
        .into_iter()
        .enumerate()
        .map(|(p, l)| {
            l.unwrap_or_else(|| {
                format!(
                    "rank {p}: no answer within {} s (not waiting in a call of this \
                     communicator)",
                    REPORT_WAIT.as_secs()
                )
            })
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::types::{DataType, ReduceOp};

    #[test]
    fn ring_keeps_the_last_calls_in_order() {
        let rec = Recorder::default();
        assert!(rec.last().is_none());
        let call = Call::all_reduce(1, 2, 16, DataType::F32, ReduceOp::Sum);
        for i in 0..100u64 {
            let s = rec.start(&call, "rsag");
            assert_eq!(s, i);
            rec.finish(s, i != 99);
        }
        let r = rec.recent();
        assert_eq!(r.len(), RECORDED_CALLS);
        assert_eq!(r[0].call.seq, 100 - RECORDED_CALLS as u64);
        assert_eq!(r.last().unwrap().call.seq, 99);
        assert_eq!(r.last().unwrap().state, CallState::Failed);
        assert_eq!(r[0].state, CallState::Done);
        let text = rec.last().unwrap().to_string();
        assert!(text.contains("#99") && text.contains("rsag"), "{text}");
        let d = describe(&encode(rec.last()));
        assert!(
            d.contains("call #99") && d.contains("count 16") && d.contains("rsag"),
            "{d}"
        );
        assert_eq!(describe(&encode(None)), "no call yet");
    }
}
