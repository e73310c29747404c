//! The mailbox of an initialized bootstrap: queues of received messages keyed by
//! `(peer, kind, tag)`, and which peers are dead. A receive waits for its key by a deadline;
//! a collective waits for several keys at once, so a dead peer fails it at once even while
//! another peer is slow. A dead peer's messages that arrived before its death still count.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use super::wire::{KIND_COLLECTIVE, TAG_GOODBYE};
use crate::bootstrap::socket::{lock, Deadline};
use crate::error::{Error, Result};

pub(super) type MailKey = (usize, u8, u64);

#[derive(Default)]
struct MailState {
    queues: HashMap<MailKey, VecDeque<Vec<u8>>>,
    dead: HashMap<usize, String>,
    /// Peers that said goodbye ([`super::wire::TAG_GOODBYE`]): they closed their bootstrap on
    /// purpose, so their closed connection is not a failure.
    departed: HashSet<usize>,
    closing: bool,
    /// The process's abort word raised for the first failed peer (GPU builds: kernels waiting
    /// for it leave their waits), lowered when this mailbox (the bootstrap) is dropped.
    device_abort: Option<mscclpp_hal::abort::Hold>,
}

#[derive(Default)]
pub(super) struct Mailbox {
    state: Mutex<MailState>,
    arrived: Condvar,
    /// Whether any peer was ever marked dead: until then [`Mailbox::first_failure`] answers
    /// without the lock (every eager NCCL call asks it; the receiver threads take the lock).
    any_dead: AtomicBool,
}

/// `rank 1`, `rank 1, rank 3`: how errors name ranks.
pub(super) fn name_ranks(ranks: impl IntoIterator<Item = usize>) -> String {
    let names: Vec<String> = ranks.into_iter().map(|r| format!("rank {r}")).collect();
    names.join(", ")
}

/// A tag as errors show it: decimal when small, hex when it is one of the composed tags.
pub(super) fn show_tag(tag: u64) -> String {
    if tag < 1 << 32 {
        tag.to_string()
    } else {
        format!("{tag:#x}")
    }
}

impl Mailbox {
    pub(super) fn push(&self, key: MailKey, msg: Vec<u8>) {
        if key.1 == KIND_COLLECTIVE && key.2 == TAG_GOODBYE {
            lock(&self.state).departed.insert(key.0);
            return;
        }
        lock(&self.state)
            .queues
            .entry(key)
            .or_default()
            .push_back(msg);
        self.arrived.notify_all();
    }

    /// Records that `peer`'s connection is gone (the first reason wins) and wakes every waiter.
    pub(super) fn mark_dead(&self, peer: usize, reason: String) {
        let mut st = lock(&self.state);
        if st.closing {
            return;
        }
        let why = st.dead.entry(peer).or_insert(reason).clone();
        self.any_dead.store(true, Ordering::Release);
        if !st.departed.contains(&peer) && st.device_abort.is_none() {
            // A failure, not a goodbye: no kernel will ever see this peer's signals.
            st.device_abort = crate::communicator::raise_device_abort(Some(peer), why);
        }
        drop(st);
        self.arrived.notify_all();
    }

    /// Why `peer` is dead, if it is.
    pub(super) fn dead_reason(&self, peer: usize) -> Option<String> {
        lock(&self.state).dead.get(&peer).cloned()
    }

    /// Why `peer` failed: its connection is gone and it did not say goodbye first.
    pub(super) fn failure(&self, peer: usize) -> Option<String> {
        let st = lock(&self.state);
        if st.departed.contains(&peer) {
            return None;
        }
        st.dead.get(&peer).cloned()
    }

    /// The lowest rank that failed (see [`Mailbox::failure`]) and why.
    pub(super) fn first_failure(&self) -> Option<(usize, String)> {
        if !self.any_dead.load(Ordering::Acquire) {
            return None;
        }
        let st = lock(&self.state);
        st.dead
            .iter()
            .filter(|(p, _)| !st.departed.contains(p))
            .min_by_key(|(p, _)| **p)
            .map(|(p, r)| (*p, r.clone()))
    }

    /// From now on dead peers are expected (this side is closing): nothing is recorded.
    pub(super) fn close(&self) {
        lock(&self.state).closing = true;
    }

    /// The next message under `key`; `what` names the operation in errors.
    /// The next message under `key` if one has arrived; never waits.
    pub(super) fn try_take(&self, key: MailKey) -> Option<Vec<u8>> {
        let mut st = lock(&self.state);
        let q = st.queues.get_mut(&key)?;
        let msg = q.pop_front();
        if q.is_empty() {
            st.queues.remove(&key);
        }
        msg
    }

    pub(super) fn take(&self, key: MailKey, deadline: &Deadline, what: &str) -> Result<Vec<u8>> {
        let mut got = self.take_all(&[key], deadline, what)?;
        got.pop()
            .ok_or_else(|| Error::Internal(format!("{what}: no message taken")))
    }

    /// One message under each of `keys` (in that order), waiting for all of them at once until
    /// `deadline`. Fails at once, naming the rank, when a peer whose message is still missing is
    /// dead; at the deadline the error names every rank still missing. On failure the
    /// messages taken so far are dropped (the caller's operation has failed as a whole).
    pub(super) fn take_all(
        &self,
        keys: &[MailKey],
        deadline: &Deadline,
        what: &str,
    ) -> Result<Vec<Vec<u8>>> {
        let mut got: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let mut missing = keys.len();
        let mut st = lock(&self.state);
        loop {
            for (slot, key) in got.iter_mut().zip(keys) {
                if slot.is_some() {
                    continue;
                }
                if let Some(q) = st.queues.get_mut(key) {
                    if let Some(msg) = q.pop_front() {
                        if q.is_empty() {
                            st.queues.remove(key);
                        }
                        *slot = Some(msg);
                        missing -= 1;
                    }
                }
            }
            if missing == 0 {
                return Ok(got.into_iter().flatten().collect());
            }
            let waiting = || {
                got.iter()
                    .zip(keys)
                    .filter(|(g, _)| g.is_none())
                    .map(|(_, k)| k.0)
            };
            if let Some((peer, reason)) =
                waiting().find_map(|p| st.dead.get(&p).map(|r| (p, r.clone())))
            {
                return Err(Error::remote(
                    peer,
                    format!("{what}: {reason}; its message had not arrived"),
                ));
            }
            let Some(left) = deadline.remaining() else {
                return Err(deadline.timeout_error(format!(
                    "{what}: nothing arrived from {}",
                    name_ranks(waiting())
                )));
            };
            st = self
                .arrived
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn take_all_fails_at_once_on_a_dead_peer_whose_message_is_missing() {
        let mb = Arc::new(Mailbox::default());
        mb.push((2, 1, 7), vec![2]);
        mb.mark_dead(2, "rank 2 closed".into()); // its message came before: still delivered
        let d = Deadline::after(Duration::from_secs(1));
        let m2 = mb.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            m2.mark_dead(1, "rank 1 closed".into());
        });
        let t0 = Instant::now();
        let e = mb
            .take_all(&[(2, 1, 7), (1, 1, 7), (3, 1, 7)], &d, "all_gather")
            .expect_err("rank 1 is dead");
        t.join().expect("join");
        assert!(matches!(e, Error::Remote { peer: 1, .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_millis(500));
        let e = mb
            .take_all(
                &[(3, 1, 7)],
                &Deadline::after(Duration::from_millis(50)),
                "barrier",
            )
            .expect_err("rank 3 is silent");
        assert_eq!(e.code(), crate::ErrorCode::Timeout);
        assert!(
            e.to_string()
                .contains("barrier: nothing arrived from rank 3"),
            "{e}"
        );
    }

    #[test]
    fn names() {
        assert_eq!(name_ranks([1, 3]), "rank 1, rank 3");
        assert_eq!(show_tag(5), "5");
        assert_eq!(show_tag(1 << 40), "0x10000000000");
    }
}
