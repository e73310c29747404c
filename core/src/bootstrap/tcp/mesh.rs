//! A rank's second step of setup, the full mesh: connect to every lower rank while accepting
//! every higher one concurrently (a temporary thread serves the listener), then the
//! [`Session`] it leaves: one socket per peer, the mailbox and its one receive thread.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::accept::{Acceptor, Next};
use super::join::{Member, Table};
use super::mailbox::{name_ranks, Mailbox};
use super::receiver::{Receiver, Watched};
use super::wire::*;
use crate::bootstrap::socket::{connect_retry, write_all_by, Deadline};
use crate::error::{Error, Result};

pub(super) struct PeerConn {
    pub(super) addr: SocketAddr,
    /// Shared with the receive loop, which reads it; writers take `broken` first.
    pub(super) stream: Arc<TcpStream>,
    /// `Some` after a failed write: the stream may hold a partial frame, so it is unusable.
    pub(super) broken: Mutex<Option<String>>,
}

/// Whether the collectives may still run: after one failed on this rank, the ranks'
/// sequences of collective messages no longer match.
#[derive(Default)]
pub(super) struct CollectiveState {
    /// The failure: the rank at fault (when one is) and what happened.
    pub(super) failed: Option<(Option<usize>, String)>,
}

/// Everything an initialized `TcpBootstrap` owns; dropping it stops the receive thread and
/// closes every socket.
pub(super) struct Session {
    pub(super) timeout: Duration,
    pub(super) host_hashes: Vec<u64>,
    pub(super) nranks_per_node: usize,
    pub(super) peers: Vec<Option<PeerConn>>,
    pub(super) mailbox: Arc<Mailbox>,
    pub(super) receiver: Option<Receiver>,
    pub(super) collective: Mutex<CollectiveState>,
}

/// How long a closing session spends telling its peers goodbye, all of them together.
const GOODBYE_WAIT: Duration = Duration::from_millis(200);

impl Drop for Session {
    fn drop(&mut self) {
        // Goodbye first (best effort, bounded): peers then do not count this rank's closed
        // connection as a failure of a rank in the middle of their work.
        let deadline = Deadline::after(GOODBYE_WAIT);
        let header = encode_frame_header(KIND_COLLECTIVE, TAG_GOODBYE, 0);
        for conn in self.peers.iter().flatten() {
            let broken = conn.broken.lock().unwrap_or_else(|p| p.into_inner());
            if broken.is_none() && deadline.remaining().is_some() {
                let _ = write_all_by(&conn.stream, &header, &deadline);
            }
        }
        self.mailbox.close();
        // Stops and joins the receive thread; the sockets close when `peers` drops.
        self.receiver.take();
    }
}

impl Member {
    /// Connects to every lower rank and accepts every higher one (both at once), then starts
    /// the receive thread.
    pub(super) fn connect_mesh(
        &self,
        table: Table,
        deadline: &Deadline,
        timeout: Duration,
    ) -> Result<Session> {
        let Table {
            session,
            addrs,
            hashes,
            listener,
        } = table;
        let (me, n) = (self.rank, self.nranks);
        let give_up = AtomicBool::new(false);
        let (lower, higher) = std::thread::scope(|s| {
            let acceptor = std::thread::Builder::new()
                .name(format!("mscclpp-bootstrap-accept-{me}"))
                .spawn_scoped(s, || {
                    let r = self.accept_higher(listener, session, &addrs, deadline, &give_up);
                    if r.is_err() {
                        give_up.store(true, Ordering::Release);
                    }
                    r
                })
                .map_err(|e| Error::io("spawn the bootstrap accept thread", e));
            let lower = self.connect_lower(session, &addrs, deadline, &give_up);
            if lower.is_err() || acceptor.is_err() {
                give_up.store(true, Ordering::Release);
            }
            let higher = acceptor.and_then(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(Error::Internal("the accept thread panicked".into())))
            });
            (lower, higher)
        });
        let (lower, higher) = match (lower, higher) {
            (Ok(l), Ok(h)) => (l, h),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => return Err(e),
            // One side gave up because the other failed: report the cause.
            (Err(a), Err(b)) => {
                return Err(if a.code() == crate::ErrorCode::Aborted {
                    b
                } else {
                    a
                })
            }
        };

        let mailbox = Arc::new(Mailbox::default());
        let mut peers: Vec<Option<PeerConn>> = Vec::with_capacity(n);
        let mut watched = Vec::with_capacity(n.saturating_sub(1));
        let all = lower.into_iter().chain(std::iter::once(None)).chain(higher);
        for (peer, s) in all.enumerate() {
            let Some(s) = s else {
                peers.push(None);
                continue;
            };
            let stream = Arc::new(s);
            let addr = addrs[peer];
            watched.push(Watched {
                peer,
                addr,
                stream: stream.clone(),
            });
            peers.push(Some(PeerConn {
                addr,
                stream,
                broken: Mutex::new(None),
            }));
        }
        let receiver = Receiver::start(me, watched, mailbox.clone())?;
        Ok(Session {
            timeout,
            nranks_per_node: hashes.iter().filter(|&&h| h == hashes[me]).count(),
            host_hashes: hashes,
            peers,
            mailbox,
            receiver: Some(receiver),
            collective: Mutex::new(CollectiveState::default()),
        })
    }

    /// Streams to ranks `0..me` (index = rank).
    fn connect_lower(
        &self,
        session: u64,
        addrs: &[SocketAddr],
        deadline: &Deadline,
        give_up: &AtomicBool,
    ) -> Result<Vec<Option<TcpStream>>> {
        let me = self.rank;
        let hs = PeerHello {
            session,
            rank: me as u32,
        }
        .encode();
        let mut out = Vec::with_capacity(me);
        for (peer, addr) in addrs.iter().enumerate().take(me) {
            let s = connect_retry(*addr, deadline, &format!("rank {peer}"), give_up, None)?;
            write_all_by(&s, &hs, deadline).map_err(|e| match e {
                None => deadline.timeout_error(format!(
                    "rank {me} sending its handshake to rank {peer} ({addr})"
                )),
                Some(e) => {
                    Error::remote(peer, format!("sending the handshake to {addr} failed: {e}"))
                }
            })?;
            out.push(Some(s));
        }
        Ok(out)
    }

    /// Streams from ranks `me+1..n` (index = rank - me - 1), accepted concurrently: strangers
    /// and bad handshakes are logged and dropped without holding anyone up.
    fn accept_higher(
        &self,
        listener: TcpListener,
        session: u64,
        addrs: &[SocketAddr],
        deadline: &Deadline,
        give_up: &AtomicBool,
    ) -> Result<Vec<Option<TcpStream>>> {
        let (me, n) = (self.rank, self.nranks);
        let mut streams: Vec<Option<TcpStream>> = (me + 1..n).map(|_| None).collect();
        if streams.is_empty() {
            return Ok(streams); // the listener closes here: nobody is to come
        }
        let listen_addr = listener
            .local_addr()
            .map_err(|e| Error::io("getsockname on the peer listener", e))?;
        let mut acc = Acceptor::new(
            listener,
            PEER_HELLO_BYTES,
            format!("rank {me}'s listener {listen_addr}"),
        )?;
        let mut missing = streams.len();
        while missing > 0 {
            let (s, from, bytes) = match acc.next(deadline, &|| give_up.load(Ordering::Acquire))? {
                Next::Conn(s, from, bytes) => (s, from, bytes),
                Next::Stopped => {
                    // The connecting side failed; its error is the one reported.
                    return Err(Error::Aborted(format!("rank {me}: mesh setup abandoned")));
                }
                Next::Deadline => {
                    let late = (me + 1..n).filter(|&r| streams[r - me - 1].is_none());
                    return Err(deadline.timeout_error(format!(
                        "rank {me} waiting for {} to connect to it",
                        name_ranks(late)
                    )));
                }
            };
            let hello = match PeerHello::decode(&bytes) {
                Ok(h) if h.session == session => h,
                Ok(h) => {
                    crate::log_warn!(
                        "BOOTSTRAP",
                        "rank {me}: handshake from {from} (claims rank {}) of another session; ignored",
                        h.rank
                    );
                    continue;
                }
                Err(e) => {
                    crate::log_warn!("BOOTSTRAP", "rank {me}: from {from}: {e}; ignored");
                    continue;
                }
            };
            let peer = hello.rank as usize;
            if peer <= me || peer >= n || streams[peer - me - 1].is_some() {
                crate::log_warn!(
                    "BOOTSTRAP",
                    "rank {me}: handshake from {from} claims rank {peer}: expected a rank in {}..{n} not yet connected; ignored",
                    me + 1
                );
                continue;
            }
            s.set_nodelay(true).map_err(|e| {
                Error::io(
                    format!(
                        "set TCP_NODELAY on the connection from rank {peer} ({})",
                        addrs[peer]
                    ),
                    e,
                )
            })?;
            streams[peer - me - 1] = Some(s);
            missing -= 1;
        }
        Ok(streams)
    }
}
