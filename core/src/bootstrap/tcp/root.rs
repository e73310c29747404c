//! The bootstrap root: rank 0's setup server. It serves connections concurrently (see
//! [`Acceptor`]), authenticates every hello by its nonce (the `UniqueId`'s, or the job key's
//! hash in `ip:port` mode), refuses bad hellos with an answer saying why, without touching the
//! job, and once every rank is in answers each with the table of listen addresses and host
//! hashes. At the deadline (or when rank 0 failed on its own, or it refused a rank of this
//! job: right nonce, wrong nranks or rank, or a rank twice) it answers everyone with an abort
//! naming the cause.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::accept::{Acceptor, Next};
use super::wire::*;
use crate::bootstrap::socket::{lock, random_u64, write_all_by, Deadline};
use crate::error::{Error, Result};

/// How the root authenticates joiners.
#[derive(Debug, Clone)]
pub(super) enum Auth {
    /// The group nonce of a `UniqueId`.
    UniqueId(u64),
    /// `ip:port` mode: the job key's hash (0 = no key on this rank) and where it came from.
    JobKey { hash: u64, source: String },
}

impl Auth {
    pub(super) fn nonce(&self) -> u64 {
        match self {
            Auth::UniqueId(n) => *n,
            Auth::JobKey { hash, .. } => *hash,
        }
    }

    fn refusal(&self, from: SocketAddr, hello: &Hello) -> String {
        match self {
            Auth::UniqueId(_) => format!(
                "rank {} at {from} joined with group nonce {:#x}, but this root serves another \
                 UniqueId: expected every rank to use the same UniqueId",
                hello.rank, hello.nonce
            ),
            Auth::JobKey { source, .. } => format!(
                "rank {} at {from} belongs to another job: its job key differs from the root's \
                 (root's key: {source}): expected the same MSCCLPP_BOOTSTRAP_KEY (or the same \
                 launcher job id) on every rank of a job",
                hello.rank
            ),
        }
    }
}

/// Set by rank 0's own join when it fails locally: the root stops and tells the others.
#[derive(Default)]
pub(super) struct RootStop(Mutex<Option<String>>);

impl RootStop {
    pub(super) fn stop(&self, why: String) {
        lock(&self.0).get_or_insert(why);
    }
    fn reason(&self) -> Option<String> {
        lock(&self.0).clone()
    }
}

struct Joined {
    stream: TcpStream,
    from: SocketAddr,
    hello: Hello,
}

/// Refusals kept for the timeout message (the rest are only counted).
const KEEP_REFUSALS: usize = 4;

struct Root {
    addr: SocketAddr,
    nranks: usize,
    auth: Auth,
    /// The ranks joined so far, by rank: memory grows only as ranks arrive.
    clients: std::collections::BTreeMap<usize, Joined>,
    joined: usize,
    refused: Vec<String>,
    refused_total: usize,
    /// A refused rank of this very job (its nonce is the job's): the job cannot complete.
    member_refused: Option<String>,
}

impl Root {
    fn abort_all(&mut self, code: u8, msg: &str, deadline: &Deadline) {
        let bytes = encode_abort(code, msg);
        // Give the aborts a moment even when the deadline has just passed.
        let grace = Deadline::after(Duration::from_millis(500));
        let d = if deadline.remaining().is_some() {
            deadline
        } else {
            &grace
        };
        for c in self.clients.values() {
            // Best effort: a rank that cannot be told times out on its own deadline.
            let _ = write_all_by(&c.stream, &bytes, d);
        }
    }

    fn refuse(&mut self, stream: TcpStream, msg: String, deadline: &Deadline) {
        crate::log_warn!("BOOTSTRAP", "root {}: {msg}; refused", self.addr);
        let d = deadline.capped(Duration::from_millis(500));
        let _ = write_all_by(&stream, &encode_abort(ABORT_INVALID, &msg), &d);
        self.refused_total += 1;
        if self.refused.len() < KEEP_REFUSALS {
            self.refused.push(msg);
        }
    }

    /// Refuses a hello that carried this job's nonce: besides answering it, the whole job is
    /// stopped (see [`ABORT_PEER_REFUSED`]). In `ip:port` mode without a job key, ranks of
    /// other jobs cannot be told apart from this one's, so there it is only refused.
    fn refuse_member(&mut self, stream: TcpStream, msg: String, deadline: &Deadline) {
        if !matches!(self.auth, Auth::JobKey { hash: 0, .. }) {
            self.member_refused.get_or_insert_with(|| msg.clone());
        }
        self.refuse(stream, msg, deadline);
    }

    /// Takes one hello: the rank joins, replaces its own earlier connection, or is refused.
    fn hello(&mut self, stream: TcpStream, from: SocketAddr, bytes: &[u8], deadline: &Deadline) {
        let hello = match Hello::decode(bytes) {
            Ok(h) => h,
            Err(HelloError::NotBootstrap(e)) => {
                crate::log_warn!("BOOTSTRAP", "root {}: from {from}: {e}; closed", self.addr);
                return;
            }
            Err(HelloError::Version(e)) => {
                return self.refuse(stream, format!("{from}: {e}"), deadline)
            }
        };
        let n = self.nranks;
        if hello.nonce != self.auth.nonce() {
            let msg = self.auth.refusal(from, &hello);
            return self.refuse(stream, msg, deadline);
        }
        let r = hello.rank as usize;
        if hello.nranks as usize != n {
            let msg = format!(
                "rank {r} at {from} says nranks = {}, but rank 0 says {n}: expected every rank \
                 to pass the same nranks",
                hello.nranks
            );
            return self.refuse_member(stream, msg, deadline);
        }
        if r >= n {
            let msg =
                format!("a rank at {from} says it is rank {r}: expected a rank below nranks {n}");
            return self.refuse_member(stream, msg, deadline);
        }
        if let Some(old) = self.clients.get(&r) {
            let same = old.hello == hello;
            if !same && peer_open(&old.stream) {
                let msg = format!(
                    "rank {r} joined twice (first from {}, again from {from}): expected each rank \
                     exactly once",
                    old.from
                );
                return self.refuse_member(stream, msg, deadline);
            }
            // The same rank again (it retried), or its first connection is gone: replace it.
            crate::log_info!(
                "BOOTSTRAP",
                "root {}: rank {r} rejoined from {from}",
                self.addr
            );
            self.joined -= 1;
        }
        // Tell the rank at once that a root took its hello (the table comes when everyone is
        // in); best effort: a rank that cannot be told retries or times out.
        let _ = write_all_by(
            &stream,
            &[REPLY_ACK],
            &deadline.capped(Duration::from_millis(500)),
        );
        self.clients.insert(
            r,
            Joined {
                stream,
                from,
                hello,
            },
        );
        self.joined += 1;
    }

    fn refusals(&self) -> String {
        if self.refused_total == 0 {
            return String::new();
        }
        format!(
            "; refused {} connection(s): {}",
            self.refused_total,
            self.refused.join("; ")
        )
    }
}

/// Whether the peer of `s` has not closed it (a closed one reads EOF at once).
fn peer_open(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let open = !matches!(s.peek(&mut b), Ok(0));
    let _ = s.set_nonblocking(false);
    open
}

/// Collects `nranks` hellos on `listener`, then answers everyone with the table.
pub(super) fn run_root(
    listener: TcpListener,
    nranks: usize,
    auth: Auth,
    deadline: Deadline,
    stop: Arc<RootStop>,
) -> Result<()> {
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("getsockname on the bootstrap root listener", e))?;
    if matches!(auth, Auth::JobKey { hash: 0, .. }) && nranks > 1 {
        crate::log_info!(
            "BOOTSTRAP",
            "root {addr}: ip:port mode without a job key: ranks of another job at this address \
             are not told apart (set MSCCLPP_BOOTSTRAP_KEY)"
        );
    }
    let mut acc = Acceptor::new(listener, HELLO_BYTES, format!("bootstrap root {addr}"))?;
    let mut root = Root {
        addr,
        nranks,
        auth,
        clients: std::collections::BTreeMap::new(),
        joined: 0,
        refused: Vec::new(),
        refused_total: 0,
        member_refused: None,
    };
    while root.joined < nranks {
        match acc.next(&deadline, &|| lock(&stop.0).is_some())? {
            Next::Conn(stream, from, bytes) => {
                root.hello(stream, from, &bytes, &deadline);
                if let Some(why) = root.member_refused.take() {
                    let msg = format!(
                        "a rank of this job was refused, so the job cannot complete: {why}"
                    );
                    root.abort_all(ABORT_PEER_REFUSED, &msg, &deadline);
                    return Err(Error::invalid(format!(
                        "the bootstrap root (rank 0) at {addr}: {msg}"
                    )));
                }
            }
            Next::Stopped => {
                let why = stop.reason().unwrap_or_default();
                let msg = format!("rank 0 failed during bootstrap setup: {why}");
                root.abort_all(ABORT_ROOT_FAILED, &msg, &deadline);
                return Err(Error::Aborted(msg));
            }
            Next::Deadline => {
                let missing = missing_ranks(&root.clients, nranks);
                let msg = format!(
                    "ranks {missing} of {nranks} did not connect to the bootstrap root at {addr} \
                     within {:?}{}",
                    deadline.timeout,
                    root.refusals()
                );
                root.abort_all(ABORT_TIMEOUT, &msg, &deadline);
                return Err(deadline.timeout_error(format!("bootstrap root (rank 0): {msg}")));
            }
        }
    }
    // Everyone is in: stop listening (and drop the strangers still waiting) before anyone can
    // start a new round on this port.
    drop(acc);
    let entries: Vec<(SocketAddr, u64)> = root
        .clients
        .values()
        .map(|c| (c.hello.listen, c.hello.host_hash))
        .collect();
    let reply = encode_table(random_u64(), &entries);
    let late = deadline.extended(ROOT_REPLY_GRACE);
    for (r, c) in &root.clients {
        if let Err(e) = write_all_by(&c.stream, &reply, &late) {
            crate::log_warn!(
                "BOOTSTRAP",
                "root {addr}: sending the address table to rank {r} failed: {e:?}"
            );
        }
    }
    Ok(())
}

/// The ranks below `nranks` that have not joined, as a timeout message lists them: the first
/// few, then how many more (a huge world must not make a huge message).
fn missing_ranks(joined: &std::collections::BTreeMap<usize, Joined>, nranks: usize) -> String {
    const SHOWN: usize = 16;
    let mut shown = Vec::new();
    for r in (0..nranks).filter(|r| !joined.contains_key(r)) {
        if shown.len() == SHOWN {
            break;
        }
        shown.push(r);
    }
    let total = nranks - joined.len();
    if total > shown.len() {
        format!("{shown:?} and {} more", total - shown.len())
    } else {
        format!("{shown:?}")
    }
}
