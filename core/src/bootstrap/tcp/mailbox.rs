//! The mailbox of an initialized bootstrap: one receive thread per peer connection reads
//! frames into queues keyed by `(peer, kind, tag)`; receives wait on them with a timeout and
//! fail promptly once the peer's connection is gone.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::wire::{rd_u64, FRAME_HEADER, KIND_COLLECTIVE, MAX_FRAME};
use crate::bootstrap::socket::{lock, Deadline};
use crate::error::{Error, Result};

pub(super) type MailKey = (usize, u8, u64);

#[derive(Default)]
pub(super) struct MailState {
    pub(super) queues: HashMap<MailKey, VecDeque<Vec<u8>>>,
    pub(super) dead: HashMap<usize, String>,
    pub(super) closing: bool,
}

#[derive(Default)]
pub(super) struct Mailbox {
    pub(super) state: Mutex<MailState>,
    pub(super) arrived: Condvar,
}

impl Mailbox {
    pub(super) fn push(&self, key: MailKey, msg: Vec<u8>) {
        lock(&self.state)
            .queues
            .entry(key)
            .or_default()
            .push_back(msg);
        self.arrived.notify_all();
    }

    pub(super) fn mark_dead(&self, peer: usize, reason: String) {
        let mut st = lock(&self.state);
        if st.closing {
            return;
        }
        st.dead.entry(peer).or_insert(reason);
        drop(st);
        self.arrived.notify_all();
    }

    pub(super) fn take(&self, key: MailKey, timeout: Duration) -> Result<Vec<u8>> {
        let (peer, _, tag) = key;
        let deadline = Deadline::after(timeout);
        let mut st = lock(&self.state);
        loop {
            if let Some(q) = st.queues.get_mut(&key) {
                if let Some(msg) = q.pop_front() {
                    if q.is_empty() {
                        st.queues.remove(&key);
                    }
                    return Ok(msg);
                }
            }
            if let Some(reason) = st.dead.get(&peer) {
                return Err(Error::remote(
                    peer,
                    format!("{reason}; no message with tag {tag} arrived before that"),
                ));
            }
            let Some(left) = deadline.remaining() else {
                return Err(deadline.timeout_error(format!(
                    "receiving a message with tag {tag} from rank {peer}"
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

pub(super) fn receive_loop(
    stream: TcpStream,
    peer: usize,
    addr: SocketAddr,
    mailbox: Arc<Mailbox>,
) {
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, stream);
    let fail = |e: std::io::Error| {
        if e.kind() == ErrorKind::UnexpectedEof || e.kind() == ErrorKind::ConnectionReset {
            format!("connection to rank {peer} at {addr} closed (EOF): the peer exited or dropped its bootstrap")
        } else {
            format!("reading from rank {peer} at {addr} failed: {e}")
        }
    };
    loop {
        let mut hdr = [0u8; FRAME_HEADER];
        if let Err(e) = reader.read_exact(&mut hdr) {
            mailbox.mark_dead(peer, fail(e));
            return;
        }
        let kind = hdr[0];
        let tag = rd_u64(&hdr, 1);
        let len = rd_u64(&hdr, 9);
        if kind > KIND_COLLECTIVE || len > MAX_FRAME {
            mailbox.mark_dead(
                peer,
                format!(
                    "rank {peer} at {addr} sent a corrupt frame header (kind {kind}, length {len}): \
                     expected kind 0 or 1 and a length up to {MAX_FRAME}"
                ),
            );
            return;
        }
        let mut payload = Vec::new();
        if payload.try_reserve_exact(len as usize).is_err() {
            mailbox.mark_dead(
                peer,
                format!("cannot allocate {len} bytes for a message from rank {peer} at {addr}"),
            );
            return;
        }
        payload.resize(len as usize, 0);
        if let Err(e) = reader.read_exact(&mut payload) {
            mailbox.mark_dead(peer, fail(e));
            return;
        }
        mailbox.push((peer, kind, tag), payload);
    }
}
